-- Every script starts here: the server's clock in microseconds, and the guard on deadlines.
--
-- Lua numbers passed to redis.call are written with 17 significant digits, so microsecond
-- timestamps (16 digits) are stored exactly. That holds only below 2^53 us (the year 2255):
-- past it a double skips integers, and from 1e17 on it is written in scientific notation,
-- which PEXPIREAT refuses (after an HSET already ran: a script is not rolled back). So every
-- script computes its deadlines first and refuses one out of range before it writes anything.
--
-- Writing a Lua number costs Redis a snprintf('%.17g') per argument, the largest part of a
-- first reserve's server time after the script call itself: the hot paths write deadlines
-- as string.format('%d') (the same digits below 2^53) and give the key's expiry as
-- PEXPIRE with a TTL the client computed (ttl_ms: retention + grace + 2 ms for the rounding
-- of both clocks to milliseconds), never shorter than what PEXPIREAT of the deadline set.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local function out_of_range(name, deadline)
  if deadline >= 9007199254740992 then
    return redis.error_reply('IDEMSTORE_RANGE ' .. name)
  end
end
