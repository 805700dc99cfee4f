-- ARGV: owner [, '0' = do not wake anyone (Redlock undoing a failed try)].
-- The wake-up names the releaser after '*', so a client subscribed to
-- several masters (Redlock) can tell one release from another.
local H, owner = KEYS[1], ARGV[1]
--! include repl.lua
--! include wake.lua
-- Redis deletes the hash with its last field
local held = redis.call('HDEL', H, owner)
-- every waiter is registered in :w (re-registered each try), so no :w, no one to wake
local W = H .. ':w'
if ARGV[2] == '0' or redis.call('EXISTS', W) == 0 then return held end
local msg, Q, X = '*' .. owner, H .. ':q', H .. ':x'
-- Not held here but still queued: a Redlock holder this master refused
-- (it won a quorum elsewhere). It waits no more: leave the queue, or it
-- stays the head here and refuses the next waiter until it lapses.
if held == 0 then
  if redis.call('ZREM', W, owner) == 0 then return 0 end
  redis.call('ZREM', Q, owner) redis.call('ZREM', X, owner)
end
--! include now.lua
if redis.call('EXISTS', Q) == 1 then
--! include head.lua
  local h = head()
  if h then msg = h end
-- unfair, only writers waiting: wake one, the longest-registered live
-- one (one winner anyway; waking all makes a herd). Readers may all go
-- together, so they are all woken.
elseif redis.call('ZCARD', W) == redis.call('ZCARD', X) then
  local h = redis.call('ZRANGEBYSCORE', W, now, '+inf', 'LIMIT', 0, 1)[1]
  if h then msg = h end
end
if string.sub(msg, 1, 1) == '*' then redis.call('PUBLISH', H .. ':c', msg) else wake(msg) end
return held
