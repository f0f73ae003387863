-- checkpoint. ARGV: token, fence, nonce, entry. Reply: 1 or nil.
--
-- The owner check of complete (same token AND fence, in progress, within retention), so a
-- fenced-out owner records nothing. Entries are self-delimiting: appending is concatenation.
-- The nonce of the last append is kept in 'cn': redis-py resends a script whose reply was
-- lost with the connection, and that resend must not append the step a second time.
local h = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fen', 'ea', 'cp', 'cn')
if h[1] ~= 'p' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[4]) <= now then
  return false
end
if h[6] == ARGV[3] then return 1 end
redis.call('HSET', KEYS[1], 'cp', (h[5] or '') .. ARGV[4], 'cn', ARGV[3])
return 1
