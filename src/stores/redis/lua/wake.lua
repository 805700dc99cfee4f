-- Wake one waiter, by its owner token, on its client's own channel
-- ":c:<client id>" (only that store handle listens there); an owner of
-- another shape is told on the lock's channel.
local function wake(h)
  local cid = string.match(h, '^(%x+)%-')
  redis.call('PUBLISH', cid and (H .. ':c:' .. cid) or (H .. ':c'), h)
end
