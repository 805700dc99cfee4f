-- The tables and the acquire function of the PostgreSQL store's table mode
-- (postgres://…?mode=table), and advisory mode's fence sequence. Embedded in the library at build time and run
-- by the first client of a database, under an advisory transaction lock;
-- the client then records the schema version in dlock_schema.
--
-- Why a function and not one bare INSERT … ON CONFLICT: in READ COMMITTED a
-- single statement re-reads only the conflicting row at its latest version;
-- anything else it reads (other holders, waiters) comes from its start
-- snapshot, so two concurrent shared/semaphore acquires could both count a
-- stale holder set. The function first locks the name's counter row (never
-- deleted), and each later statement in it takes a fresh snapshot, so the
-- check-then-insert is serialised per name. The client still sends one
-- statement per acquire. Expiry is always clock_timestamp() on the server.

CREATE TABLE IF NOT EXISTS dlock_schema (component text PRIMARY KEY, version int NOT NULL);

CREATE TABLE IF NOT EXISTS dlock_locks (
 ns text NOT NULL, name text NOT NULL, fence bigint NOT NULL DEFAULT 0,
 by_table boolean NOT NULL DEFAULT false,
 PRIMARY KEY (ns, name));

-- Schema version 4: advisory mode takes its fences from one sequence for all
-- names (nextval writes nothing to commit 31 times in 32; a per-name counter
-- row cost a committed write per grant). Table mode keeps its counter rows,
-- which it marks by_table. A row that is not (one of advisory mode's counter
-- rows, bumped by a library older than version 4 that may still be running)
-- takes its next fence from the same sequence: an older client's fence of a
-- name is then above every fence the sequence handed out before it, and the
-- sequence starts above every counter, so fences keep increasing while old
-- and new advisory clients share a name.
ALTER TABLE dlock_locks ADD COLUMN IF NOT EXISTS by_table boolean NOT NULL DEFAULT false;
CREATE SEQUENCE IF NOT EXISTS dlock_fences;
CREATE OR REPLACE FUNCTION dlock_fence_from_sequence() RETURNS trigger LANGUAGE plpgsql AS $t$
BEGIN
 NEW.fence := greatest(NEW.fence, nextval('dlock_fences'));
 RETURN NEW;
END
$t$;
-- Creating the trigger locks out writers of dlock_locks until this script
-- commits, so the highest counter read below is final.
DROP TRIGGER IF EXISTS dlock_advisory_fence ON dlock_locks;
CREATE TRIGGER dlock_advisory_fence BEFORE INSERT OR UPDATE ON dlock_locks
 FOR EACH ROW WHEN (NOT NEW.by_table) EXECUTE PROCEDURE dlock_fence_from_sequence();
SELECT setval('dlock_fences', greatest((SELECT last_value FROM dlock_fences),
 (SELECT coalesce(max(fence), 0) FROM dlock_locks), 1));

CREATE TABLE IF NOT EXISTS dlock_holders (
 ns text NOT NULL, name text NOT NULL, owner text NOT NULL, mode smallint NOT NULL,
 permits int NOT NULL, fence bigint NOT NULL, expires timestamptz NOT NULL,
 host text NOT NULL DEFAULT '', pid int NOT NULL DEFAULT 0,
 waited boolean NOT NULL DEFAULT false,
 PRIMARY KEY (ns, name, owner));

-- Schema version 3: a hold that a waiter queued behind is marked, and only
-- its release notifies (a release nobody waits for wakes no listener).
ALTER TABLE dlock_holders ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;

CREATE TABLE IF NOT EXISTS dlock_waiters (
 ns text NOT NULL, name text NOT NULL, owner text NOT NULL, mode smallint NOT NULL,
 fair boolean NOT NULL, seq bigserial, expires timestamptz NOT NULL,
 PRIMARY KEY (ns, name, owner));

CREATE OR REPLACE FUNCTION dlock_acquire_v1(p_ns text, p_name text, p_owner text,
 p_mode int, p_permits int, p_ttl_ms bigint, p_waiting boolean, p_fair boolean,
 p_queue_ttl_ms bigint, p_host text, p_pid int, OUT o_fence bigint, OUT o_retry_ms bigint)
 LANGUAGE plpgsql AS $f$
DECLARE
 t timestamptz; f bigint; n int; bad int; lim int; exp_min timestamptz; my_seq bigint;
 writers_ahead int; fair_ahead int; wexp timestamptz; ok boolean; others boolean;
BEGIN
 SELECT l.fence INTO f FROM dlock_locks l WHERE l.ns = p_ns AND l.name = p_name FOR UPDATE;
 IF NOT FOUND THEN
  INSERT INTO dlock_locks (ns, name, by_table) VALUES (p_ns, p_name, true) ON CONFLICT DO NOTHING;
  SELECT l.fence INTO f FROM dlock_locks l WHERE l.ns = p_ns AND l.name = p_name FOR UPDATE;
 END IF;
 -- Fast path: no row at all holds or waits for the name (not even an expired
 -- one), so any mode and any permits may have it.
 INSERT INTO dlock_holders (ns, name, owner, mode, permits, fence, expires, host, pid)
  SELECT p_ns, p_name, p_owner, p_mode, p_permits, f + 1,
         clock_timestamp() + p_ttl_ms * interval '1 millisecond', p_host, p_pid
  WHERE NOT EXISTS (SELECT 1 FROM dlock_holders h WHERE h.ns = p_ns AND h.name = p_name)
    AND NOT EXISTS (SELECT 1 FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name);
 IF FOUND THEN
  UPDATE dlock_locks l SET fence = f + 1, by_table = true WHERE l.ns = p_ns AND l.name = p_name;
  o_fence := f + 1; o_retry_ms := 0; RETURN;
 END IF;
 t := clock_timestamp();
 DELETE FROM dlock_holders h WHERE h.ns = p_ns AND h.name = p_name AND h.expires <= t;
 DELETE FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name AND w.expires <= t;
 -- A repeated request of a live holder (a retry after a lost reply) keeps its grant.
 UPDATE dlock_holders h SET expires = t + p_ttl_ms * interval '1 millisecond'
  WHERE h.ns = p_ns AND h.name = p_name AND h.owner = p_owner RETURNING h.fence INTO o_fence;
 IF FOUND THEN o_retry_ms := 0; RETURN; END IF;
 -- Holders only leave while we hold the counter row (releases do not take
 -- it); so the decision is taken again if one left while we marked them.
 LOOP
  SELECT count(*), count(*) FILTER (WHERE h.mode <> p_mode),
   least(p_permits, min(h.permits) FILTER (WHERE h.mode = 0)), min(h.expires)
   INTO n, bad, lim, exp_min
   FROM dlock_holders h WHERE h.ns = p_ns AND h.name = p_name;
  SELECT w.seq INTO my_seq FROM dlock_waiters w
   WHERE w.ns = p_ns AND w.name = p_name AND w.owner = p_owner;
  -- Waiters registered before us (all of them if we are not registered).
  SELECT count(*) FILTER (WHERE w.mode = 0), count(*) FILTER (WHERE w.fair), min(w.expires)
   INTO writers_ahead, fair_ahead, wexp FROM dlock_waiters w
   WHERE w.ns = p_ns AND w.name = p_name AND w.owner <> p_owner
   AND (my_seq IS NULL OR w.seq < my_seq);
  IF p_mode = 1 THEN
   -- shared: no exclusive holder, no writer waiting ahead (writer preference)
   ok := bad = 0 AND writers_ahead = 0;
  ELSE
   -- exclusive/semaphore: the permits rule (holders + 1 <= the smallest
   -- permits among the holders and the caller; a mutex holder admits
   -- nobody), and a free permit that no earlier fair waiter is owed
   ok := bad = 0 AND n < lim AND fair_ahead < lim - n;
  END IF;
  IF ok THEN
   f := f + 1;
   UPDATE dlock_locks l SET fence = f, by_table = true WHERE l.ns = p_ns AND l.name = p_name;
   -- Waiters still queued behind this grant: its release must wake them.
   others := EXISTS (SELECT 1 FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name
                     AND w.owner <> p_owner);
   INSERT INTO dlock_holders (ns, name, owner, mode, permits, fence, expires, host, pid, waited)
    VALUES (p_ns, p_name, p_owner, p_mode, p_permits, f,
            t + p_ttl_ms * interval '1 millisecond', p_host, p_pid, others);
   DELETE FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name AND w.owner = p_owner;
   o_fence := f; o_retry_ms := 0; RETURN;
  END IF;
  EXIT WHEN NOT p_waiting;
  -- Mark every hold we wait behind, so that its release notifies. A release
  -- running now either commits first (its row is gone: the count below
  -- drops and we decide again) or waits for our row lock and sees the mark.
  UPDATE dlock_holders h SET waited = true
   WHERE h.ns = p_ns AND h.name = p_name AND NOT h.waited;
  EXIT WHEN (SELECT count(*) FROM dlock_holders h
             WHERE h.ns = p_ns AND h.name = p_name) >= n;
 END LOOP;
 IF p_waiting THEN
  INSERT INTO dlock_waiters AS w (ns, name, owner, mode, fair, expires)
   VALUES (p_ns, p_name, p_owner, p_mode, p_fair, t + p_queue_ttl_ms * interval '1 millisecond')
   ON CONFLICT (ns, name, owner) DO UPDATE
   SET expires = EXCLUDED.expires, mode = EXCLUDED.mode, fair = EXCLUDED.fair;
 END IF;
 o_fence := 0;
 o_retry_ms := ceil(extract(epoch FROM (coalesce(exp_min, wexp, t) - t)) * 1000)::bigint;
END
$f$;
