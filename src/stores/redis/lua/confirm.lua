-- KEYS[1] = H; ARGV: reservation, the server's run_id. The fence guard's
-- reservation is on the replicas: confirm it (c := r) unless the server's
-- epoch changed (a failover, a restart) or another server granted since.
local H = KEYS[1]
--! include fence.lua
local E = H .. ':e'
if redis.call('HGET', E, 'id') == epoch(ARGV[2]) and tonumber(redis.call('HGET', E, 'c') or '0') < tonumber(ARGV[1]) then
  redis.call('HSET', E, 'c', ARGV[1])
end
return 1
