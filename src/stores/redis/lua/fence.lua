-- The fence guard's epoch of the server running this script: the run_id the
-- client sent (new for every server process) and the server's master_replid
-- (INFO replication), read here, atomically with the grant. Redis draws a
-- new random master_replid whenever a server becomes a master (REPLICAOF NO
-- ONE, a Sentinel or Cluster promotion: shiftReplicationId), and a replica's
-- follows its master's; so the epoch changes on every restart and every
-- promotion, also when a demoted master that resynced from its replica is
-- promoted again with its old run_id (issue 30 row 5). Needs Redis 4.0+.
local function epoch(run_id)
  local rid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  if not rid then error('fence guard: INFO replication has no master_replid (needs Redis 4.0+, or fence_replicas=0)') end
  return run_id .. ' ' .. rid
end
-- The next fence. With ARGV[8] (the fence guard: the run_id of the server
-- the client talks to) fences never go back after a failover that loses
-- grants: a fence is handed out only when it is at most a reservation r
-- (key ":e") that is on the replicas. The client waits (WAIT) for the
-- replicas when a grant returns a third element (a new reservation) and then
-- confirms it (c := r); a server that has not granted in its epoch (above;
-- ":e"'s id differs) first lifts the counter to r, above every fence handed
-- out before the failover. Reservations are made 1000 fences at a time (one
-- WAIT per 1000 grants of a name). Returns f[, r].
local function fence()
  local F = H .. ':f'
  local id = ARGV[8]
  if not id or id == '' then return redis.call('INCR', F) end
  id = epoch(id)
  local E = H .. ':e'
  local e = redis.call('HMGET', E, 'id', 'r', 'c')
  if e[1] ~= id then
    local r = tonumber(e[2] or '0')
    if tonumber(redis.call('GET', F) or '0') < r then redis.call('SET', F, r) end
    redis.call('HSET', E, 'id', id)
  end
  local f = redis.call('INCR', F)
  if f <= tonumber(e[3] or '0') then return f end
  local r = math.max(f + 1000 - 1, tonumber(e[2] or '0'))
  redis.call('HSET', E, 'r', r)
  return f, r
end
