-- reserve. ARGV: fingerprint, token, lease_us, retention_us, ttl_ms.
-- retention_us is already at least lease_us: a live lease keeps its record.
-- Reply: now (an integer: acquired a key nothing was left under, fence 1, no takeover),
-- {'a', now, fence, takeover, lease_deadline, checkpoints} or {outcome, now, <record fields>}.
local ea = now + ARGV[4]
local la = now + ARGV[3]
local refused = out_of_range('retention', ea) or out_of_range('lease_ttl', la)
if refused then return refused end
-- Most reserves are first executions: nothing to read, and the shortest reply (a table
-- costs the server more to build and send than the rest of this branch).
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'st', 'p', 'fp', ARGV[1], 'tok', ARGV[2], 'fen', '1',
    'ca', string.format('%d', now), 'ea', string.format('%d', ea), 'la', string.format('%d', la))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return now
end
local h = redis.call('HMGET', KEYS[1], 'st', 'fp', 'tok', 'fen', 'ca', 'ea', 'la', 'res', 'tk',
  'cp')
local st = h[1]
local fence = tonumber(h[4]) or 0
local takeover = 0
-- Live means neither a released tombstone nor past retention (the key may outlive ea).
if st and st ~= 'r' and tonumber(h[6]) > now then
  if h[3] == ARGV[2] then
    -- Our own token: this is redis-py retrying a reserve whose reply was lost. Answer as the
    -- first attempt did instead of making the caller wait on its own lease.
    return {'a', now, fence, tonumber(h[9]) or 0, tonumber(h[7]), h[10]}
  end
  local found = {'?', now, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[10]}
  -- A different fingerprint never takes a key over, whatever its state.
  if h[2] ~= ARGV[1] then found[1] = 'm' return found end
  if st == 'c' then found[1] = 'c' return found end
  -- A live lease holds the key; only one past its deadline may be taken over.
  if tonumber(h[7]) > now then found[1] = 'p' return found end
  takeover = 1
end
-- The fence continues from whatever trace is left (tombstone, expired record), so it rises
-- strictly with every acquisition for as long as the key exists.
fence = fence + 1
if h[8] then redis.call('HDEL', KEYS[1], 'res') end
-- Checkpoints (cp) survive only a takeover: any other acquisition starts the work afresh.
local kept = false
if takeover == 1 then kept = h[10] elseif h[10] then redis.call('HDEL', KEYS[1], 'cp') end
redis.call('HSET', KEYS[1], 'st', 'p', 'fp', ARGV[1], 'tok', ARGV[2], 'fen', fence,
  'ca', string.format('%d', now), 'ea', string.format('%d', ea), 'la', string.format('%d', la),
  'tk', takeover)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'a', now, fence, takeover, la, kept}
