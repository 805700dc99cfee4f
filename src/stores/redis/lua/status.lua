-- KEYS[1] = H -> {server now, fence counter, HGETALL H, live waiters}
local H = KEYS[1]
--! include now.lua
return {now, redis.call('GET', H .. ':f') or '0', redis.call('HGETALL', H),
        redis.call('ZCOUNT', H .. ':w', '(' .. now, '+inf')}
