-- complete (after finish_check). ARGV: token, fence, nonce, response, retention_us, grace_ms.
-- Reply: 1 or nil. Retention restarts from the completion.
local ea = now + ARGV[5]
local refused = out_of_range('retention', ea)
if refused then return refused end
redis.call('HSET', KEYS[1], 'st', 'c', 'res', ARGV[4], 'ea', ea, 'op', ARGV[3])
redis.call('HDEL', KEYS[1], 'la')
redis.call('PEXPIREAT', KEYS[1], math.ceil(ea / 1000) + ARGV[6])
redis.call('PUBLISH', KEYS[1], 'c')
return 1
