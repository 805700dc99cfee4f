-- ARGV: owner, ttl, flags (mode 'x'|'s', fair '0'|'1', reg: '0' not
-- waiting, '1' waiting, '2' waiting and registered by an earlier try),
-- permits, queue ttl, "pid host", queue ticket ('' = the server's TIME in
-- microseconds; Redlock sends one client ticket to every master so that
-- all masters order their queues alike)
local H, owner, ttl, fl = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local mode, fair, reg = string.sub(fl, 1, 1), string.sub(fl, 2, 2) == '1', string.sub(fl, 3, 3)
local permits = tonumber(ARGV[4])
--! include repl.lua
--! include now.lua
--! include fence.lua
-- the common case first, with nothing else to look at: a free mutex or
-- semaphore, not fair, no registration of ours to clean up
if mode == 'x' and not fair and reg ~= '2' and redis.call('EXISTS', H) == 0 then
  local f, r = fence()
  redis.call('HSET', H, owner, string.format('%d %d x %d ', now + ttl, f, permits) .. ARGV[6])
  redis.call('PEXPIRE', H, ttl)
  return r and {1, f, r} or {1, f}
end
local W, Q, X = H .. ':w', H .. ':q', H .. ':x'
--! include head.lua
--! include wake.lua
-- prune expired holders; an owner that already holds gets its grant back,
-- its expiry refreshed to ttl from now (makes a retried acquire after a
-- lost reply idempotent, and never shorter than the client's lease)
local live, lmode, limit, soonest, latest = 0, nil, permits, nil, now
if redis.call('EXISTS', H) == 1 then
  local all = redis.call('HGETALL', H)
  for i = 1, #all, 2 do
    local k, v = all[i], all[i + 1]
    local e, f, m, p = string.match(v, '^(%d+) (%d+) (%a) (%d+)')
    e = tonumber(e)
    if e <= now then redis.call('HDEL', H, k)
-- ours already (a retry after a lost reply): the lease counts from now,
-- so the server must not expire it earlier than the client's deadline
    elseif k == owner then
      redis.call('HSET', H, owner, string.format('%d ', now + ttl) .. string.match(v, '^%d+ (.*)$'))
      if redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end
-- its fence may be one whose reservation was never confirmed (the
-- reply carrying it was lost): the client must wait for it again
      local e = ARGV[8] and ARGV[8] ~= '' and redis.call('HMGET', H .. ':e', 'r', 'c')
      if e and tonumber(f) > tonumber(e[2] or '0') then
        return {1, tonumber(f), math.max(tonumber(f), tonumber(e[1] or '0'))}
      end
      return {1, tonumber(f)}
    else
      live, lmode, limit = live + 1, m, math.min(limit, tonumber(p))
      if not soonest or e < soonest then soonest = e end
      if e > latest then latest = e end
    end
  end
end
local ok, till = true, nil
if live > 0 then
  if mode == 's' then ok = lmode == 's'
  elseif permits > 1 then ok = lmode == 'x' and live < math.min(limit, permits)
  else ok = false end
  if not ok then till = (mode == 'x' and permits > 1) and soonest or latest end
end
-- writer preference: a live waiting writer blocks new readers
if ok and mode == 's' then
  redis.call('ZREMRANGEBYSCORE', X, '-inf', now)
  local wr = redis.call('ZRANGE', X, 0, 0, 'WITHSCORES')
  if wr[1] then ok = false till = tonumber(wr[2]) end
end
if ok and fair then
  local h = head()
  if h and h ~= owner then ok = false till = tonumber(redis.call('ZSCORE', W, h)) end
end
if ok then
  local f, r = fence()
  redis.call('HSET', H, owner, string.format('%d %d %s %d ', now + ttl, f, mode, permits) .. ARGV[6])
  if live == 0 then redis.call('PEXPIRE', H, ttl)
  elseif redis.call('PTTL', H) < ttl then redis.call('PEXPIRE', H, ttl) end
  if reg == '2' then
    redis.call('ZREM', W, owner) redis.call('ZREM', X, owner)
    if fair then
      redis.call('ZREM', Q, owner)
-- readers queued behind a reader may go too: wake the new head
      if mode == 's' then local h = head() if h then wake(h) end end
    end
  end
  return r and {1, f, r} or {1, f}
end
local qttl = tonumber(ARGV[5])
if reg ~= '0' then
  redis.call('ZREMRANGEBYSCORE', W, '-inf', now)
-- new, or a registration that lapsed: (re)join at the tail
  if fair and not redis.call('ZSCORE', W, owner) then
    local tk = ARGV[7] ~= '' and tonumber(ARGV[7]) or tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('ZADD', Q, tk, owner)
  end
  redis.call('ZADD', W, now + qttl, owner)
  if mode == 'x' then redis.call('ZADD', X, now + qttl, owner) end
  for _, k in ipairs({W, Q, X}) do
    if redis.call('PTTL', k) < qttl then redis.call('PEXPIRE', k, qttl) end
  end
end
return {0, math.max(1, (till or (now + qttl)) - now)}
