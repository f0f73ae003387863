-- delete. Reply: 1 when a live record was deleted. Waiters are woken whatever was there.
local h = redis.call('HMGET', KEYS[1], 'st', 'ea')
if not h[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'd')
if h[1] ~= 'r' and tonumber(h[2]) > now then return 1 end
return 0
