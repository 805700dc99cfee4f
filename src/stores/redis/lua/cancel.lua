-- ARGV: owner
local H, owner = KEYS[1], ARGV[1]
local W, Q, X = H .. ':w', H .. ':q', H .. ':x'
--! include repl.lua
--! include now.lua
--! include head.lua
--! include wake.lua
redis.call('ZREM', W, owner)
local wasx = redis.call('ZREM', X, owner)
if redis.call('ZREM', Q, owner) > 0 then
  local h = head()
  if h then wake(h) end
elseif wasx == 1 and redis.call('ZCARD', X) == 0 then
  redis.call('PUBLISH', H .. ':c', '*')
end
return 1
