-- The owner check of complete and release. ARGV[1], ARGV[2], ARGV[3]: token, fence, nonce.
--
-- Only the holder may finish: same token AND fence, still in progress (not completed or
-- released), and not past retention. The lease deadline is deliberately not checked: a lapsed
-- lease that nobody took over may still complete. The call's nonce is stored in 'op':
-- redis-py resends a script whose reply was lost with the connection; that second run fails
-- the check because the first one already finished the lease. Finding our own nonce means it
-- was us: answer as it did. The nonce alone decides (128 random bits, one per call): a
-- release's tombstone may already have been acquired again, with a new token and fence,
-- before the resend arrives, and that release still happened.
local h = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fen', 'ea', 'la', 'op')
if h[1] ~= 'p' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[4]) <= now then
  if h[6] == ARGV[3] then return 1 end
  return false
end
