-- The live head of the fair queue Q; dead heads (no live registration in W) are pruned.
local function head()
  while true do
    local h = redis.call('ZRANGE', Q, 0, 0)[1]
    if not h then return nil end
    local d = redis.call('ZSCORE', W, h)
    if d and tonumber(d) > now then return h end
    redis.call('ZREM', Q, h) redis.call('ZREM', W, h) redis.call('ZREM', X, h)
  end
end
