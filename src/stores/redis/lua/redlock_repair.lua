-- Redlock's repair of a copy a master lost. KEYS H1..Hn; ARGV owner1 ttl1
-- tail1 ... with tail = "fence mode permits pid host" (the hold's value after
-- its expiry) -> per key 1 (the hold is here after all: renewed), 2 (it was
-- missing and nobody else holds here: written back, and the fence counter
-- raised to at least its fence) or 0 (another holder is in the way: nothing
-- changed).
--! include repl.lua
--! include now.lua
local out = {}
for i = 1, #KEYS do
  local H, owner, ttl, tail = KEYS[i], ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  local fence, mode = string.match(tail, '^(%d+) (%a)')
  local free, mine = true, false
  local all = redis.call('HGETALL', H)
  for k = 1, #all, 2 do
    local e, m = string.match(all[k + 1], '^(%d+) %d+ (%a)')
    if tonumber(e) <= now then redis.call('HDEL', H, all[k])
    elseif all[k] == owner then mine = true
    elseif mode == 'x' or m == 'x' then free = false end
  end
  out[i] = 0
  if mine or free then
    if not mine then
      local F = H .. ':f'
      if tonumber(redis.call('GET', F) or '0') < tonumber(fence) then redis.call('SET', F, fence) end
    end
    redis.call('HSET', H, owner, string.format('%d ', now + ttl) .. tail)
    if redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end
    out[i] = mine and 1 or 2
  end
end
return out
