-- sweep one key. Reply: 1 when the key was past retention and is now gone. Checked again here
-- because the record may have been re-reserved since the sweep looked at it.
local ea = redis.call('HGET', KEYS[1], 'ea')
if ea and tonumber(ea) <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
