-- get. Reply: {now, <record fields>} or nil when there is no live record.
local h = redis.call('HMGET', KEYS[1], 'st', 'fp', 'tok', 'fen', 'ca', 'ea', 'la', 'res', 'cp')
if not h[1] or h[1] == 'r' or tonumber(h[6]) <= now then return false end
return {now, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]}
