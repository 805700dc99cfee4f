-- KEYS[1] = H; ARGV: reservation, server id. The fence guard's reservation
-- is on the replicas: confirm it (c := r) unless a newer server granted since.
local E = KEYS[1] .. ':e'
if redis.call('HGET', E, 'id') == ARGV[2] and tonumber(redis.call('HGET', E, 'c') or '0') < tonumber(ARGV[1]) then
  redis.call('HSET', E, 'c', ARGV[1])
end
return 1
