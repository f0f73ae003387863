-- extend. ARGV: token, fence, lease_us, retention_us, ttl_ms. Reply: the new lease
-- deadline or nil.
--
-- The holder check of complete without the nonce (extending twice is harmless), plus: a lease
-- already past its deadline is lost even if nobody took it over yet (others are entitled to
-- the key). Retention restarts with the heartbeat; retention_us is at least lease_us, so a
-- live lease keeps its record (and the key's expiry follows).
local la = now + ARGV[3]
local ea = now + ARGV[4]
local refused = out_of_range('lease_ttl', la) or out_of_range('retention', ea)
if refused then return refused end
local h = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fen', 'ea', 'la')
if h[1] ~= 'p' or h[2] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[4]) <= now then
  return false
end
if tonumber(h[5]) <= now then return false end
redis.call('HSET', KEYS[1], 'la', string.format('%d', la), 'ea', string.format('%d', ea))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return la
