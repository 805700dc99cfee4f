-- KEYS H1..Hn; ARGV owner1 ttl1 ... -> per key the hold's fence (>= 1) when
-- the owner's hold was live here and is renewed (to the later of its expiry
-- and now + ttl), else 0. (Redlock writes the
-- fence back when it repairs a copy a master lost.)
--! include repl.lua
--! include now.lua
local out = {}
for i = 1, #KEYS do
  local H, owner, ttl = KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local v = redis.call('HGET', H, owner)
  out[i] = 0
  if v then
    local e, f, rest = string.match(v, '^(%d+) ((%d+) .*)$')
    e = tonumber(e)
    if e > now then
      -- Keep the later expiry: a renewal that lands after an extend (or any
      -- request that lands late) never cuts the lease (sys/backend.h).
      if now + ttl > e then e = now + ttl end
      redis.call('HSET', H, owner, string.format('%d ', e) .. f)
      if redis.call('PTTL', H) < e - now then redis.call('PEXPIRE', H, e - now) end
      out[i] = tonumber(rest)
    end
  end
end
return out
