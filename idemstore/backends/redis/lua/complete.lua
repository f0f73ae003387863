-- complete (after finish_check). ARGV: token, fence, nonce, response, retention_us, ttl_ms.
-- Reply: 1 or nil. Retention restarts from the completion.
local ea = now + ARGV[5]
local refused = out_of_range('retention', ea)
if refused then return refused end
redis.call('HSET', KEYS[1], 'st', 'c', 'res', ARGV[4], 'ea', string.format('%d', ea),
  'op', ARGV[3])
redis.call('HDEL', KEYS[1], 'la')
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PUBLISH', KEYS[1], 'c')
return 1
