-- ARGV: fence. Raise the counter to at least fence (Redlock's second round).
local F = KEYS[1] .. ':f'
local c = tonumber(redis.call('GET', F) or '0')
local t = tonumber(ARGV[1])
if c < t then redis.call('SET', F, ARGV[1]) return t end
return c
