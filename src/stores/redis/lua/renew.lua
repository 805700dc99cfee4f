-- KEYS H1..Hn; ARGV owner1 ttl1 ... -> per key the hold's fence (>= 1) when
-- the owner's hold was live here and is renewed, else 0. (Redlock writes the
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
    if tonumber(e) > now then
      redis.call('HSET', H, owner, string.format('%d ', now + ttl) .. f)
      if redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end
      out[i] = tonumber(rest)
    end
  end
end
return out
