-- release (after finish_check). ARGV: token, fence, nonce. Reply: 1 or nil.
-- The hash stays as a tombstone (with its fence) until the key expires, so the next
-- acquisition gets a higher fence than any lease handed out.
redis.call('HSET', KEYS[1], 'st', 'r', 'op', ARGV[3])
redis.call('HDEL', KEYS[1], 'la', 'cp')
redis.call('PUBLISH', KEYS[1], 'r')
return 1
