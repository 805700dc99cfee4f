/*
 * MySQL/MariaDB store, mode=table (the default): leases in InnoDB tables,
 * judged only by the server's clock (UTC_TIMESTAMP(6)). Every change to the
 * holders of a name happens in a transaction that first takes the X row lock
 * of that name's counter row in dlock_lock; an acquire is one round trip (one
 * multi-statement batch).
 */
#include "my.h"

/* ================= mode=table ================= */

static int t_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	mysql_store *b = (mysql_store *)be;
	sbuf s = { 0 };
	int mode = req->mode == DLOCK_SHARED ? 1 : 0;
	unsigned permits = req->permits;

	/* The X lock on the counter row (taken by the upsert, kept until COMMIT)
	 * serialises every acquire of this name: holder rows of a name are only ever
	 * inserted by a transaction holding it, so the checks below cannot race. */
	sb_add(&s,
	       "START TRANSACTION;"
	       "INSERT INTO dlock_lock (ns, name, fence) VALUES (%s, ",
	       b->ns_hex);
	dlock__my_sb_hex(&s, req->name);
	sb_add(&s,
	       ", 0) ON DUPLICATE KEY UPDATE fence = fence;"
	       "SELECT fence FROM dlock_lock WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s,
	       " FOR UPDATE;"
	       "SET @dl_now = UTC_TIMESTAMP(6);"
		   /* Expired holds go; so does an earlier grant to this very owner token
		    * (a retry whose first reply was lost). */
	       "DELETE FROM dlock_holder WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND (expires <= @dl_now OR owner = ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, ");DELETE FROM dlock_waiter WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND expires <= @dl_now;SET @dl_ok = (1");
	if (mode == 1) {
		/* Readers: no writer holds it ... */
		sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_holder WHERE ");
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 0)");
		/* ... and (writer preference) no writer is waiting. */
		if (!req->fair) {
			sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_waiter WHERE ");
			dlock__my_where_name(&s, b, req->name);
			sb_add(&s, " AND mode = 0)");
		}
	} else {
		/* A writer (or one of N semaphore permits), none a reader, and the
		 * permits rule (dlock/lock.h): holders + 1 <= the smallest permits
		 * among the holders and us (a mutex holder, 1, admits nobody). */
		sb_add(&s, " AND (SELECT COUNT(*) FROM dlock_holder WHERE ");
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, ") < LEAST(%u, COALESCE((SELECT MIN(permits) FROM dlock_holder WHERE ", permits);
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 0), %u)) AND NOT EXISTS (SELECT 1 FROM dlock_holder WHERE ", permits);
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 1)");
	}
	if (req->fair) {
		/* FIFO: nobody registered before us is still waiting (a newcomer is behind everyone). */
		sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_waiter w WHERE w.ns = %s AND w.name = ", b->ns_hex);
		dlock__my_sb_hex(&s, req->name);
		sb_add(&s, " AND w.owner <> ");
		dlock__my_sb_hex(&s, req->owner);
		sb_add(&s, " AND w.seq < COALESCE((SELECT seq FROM dlock_waiter WHERE ");
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, " AND owner = ");
		dlock__my_sb_hex(&s, req->owner);
		sb_add(&s, "), 18446744073709551615))");
	}
	sb_add(&s, ");UPDATE dlock_lock SET fence = LAST_INSERT_ID(fence + 1) WHERE @dl_ok AND ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s,
	       ";SET @dl_f = IF(@dl_ok, LAST_INSERT_ID(), 0);"
	       "INSERT INTO dlock_holder (ns, name, owner, mode, permits, fence, expires, host, pid) "
	       "SELECT %s, ",
	       b->ns_hex);
	dlock__my_sb_hex(&s, req->name);
	sb_add(&s, ", ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, ", %d, %u, @dl_f, @dl_now + INTERVAL %lld MICROSECOND, ", mode, permits, dlock__my_us(req->ttl_ms));
	dlock__my_sb_hex(&s, req->host ? req->host : "");
	sb_add(&s, ", %d FROM DUAL WHERE @dl_ok;", req->pid);
	/* Granted: leave the queue. Refused and waiting: join it, or refresh our place. */
	sb_add(&s, "DELETE FROM dlock_waiter WHERE @dl_ok AND ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, ";");
	if (req->waiting) {
		sb_add(&s, "INSERT INTO dlock_waiter (ns, name, owner, mode, expires) SELECT %s, ", b->ns_hex);
		dlock__my_sb_hex(&s, req->name);
		sb_add(&s, ", ");
		dlock__my_sb_hex(&s, req->owner);
		/* a refresh only once half the registration has passed: most
		 * refused tries then change no row (and commit nothing to the log) */
		sb_add(&s,
		       ", %d, @dl_now + INTERVAL %lld MICROSECOND FROM DUAL WHERE NOT @dl_ok "
		       "ON DUPLICATE KEY UPDATE expires = IF(expires < VALUES(expires) - INTERVAL %lld MICROSECOND, "
		       "VALUES(expires), expires);",
		       mode, dlock__my_us(req->queue_ttl_ms), dlock__my_us(req->queue_ttl_ms / 2));
	}
	/* a fair waiter: how many are ahead of it (how soon it should look again) */
	sb_add(&s, "SET @dl_ahead = ");
	if (req->fair && req->waiting) {
		sb_add(&s, "(SELECT COUNT(*) FROM dlock_waiter w WHERE w.ns = %s AND w.name = ", b->ns_hex);
		dlock__my_sb_hex(&s, req->name);
		sb_add(&s, " AND w.seq < COALESCE((SELECT seq FROM dlock_waiter WHERE ");
		dlock__my_where_name(&s, b, req->name);
		sb_add(&s, " AND owner = ");
		dlock__my_sb_hex(&s, req->owner);
		sb_add(&s, "), 0));");
	} else {
		sb_add(&s, "-1;");
	}
	sb_add(&s, "SET @dl_left = (SELECT TIMESTAMPDIFF(MICROSECOND, @dl_now, MIN(expires)) FROM dlock_holder WHERE ");
	dlock__my_where_name(&s, b, req->name);
	/* The answer before COMMIT: once the grant or the waiter row is visible to
	 * others, only the COMMIT's OK is still on its way to us. */
	sb_add(&s, ");SELECT @dl_ok, @dl_f, @dl_left, @dl_ahead;COMMIT");

	MYSQL_RES *res;
	int64_t deadline = req->deadline_ms;
	dlock__my_tl_want_partial = 1;
	int rc = dlock__my_run(b, &s, &res, "acquire", 1, deadline);
	dlock__my_tl_want_partial = 0;
	free(s.p);
	if (rc && dlock__my_tl_timed_out && dlock__my_refused_before_timeout("@dl_ok"))
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL,
				       "lock '%s' is held (the answer came, its commit's did not)", req->name);
	mysql_free_result(dlock__my_tl_partial); /* a partial answer that says nothing for sure */
	dlock__my_tl_partial = NULL;
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row) {
		mysql_free_result(res);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "mysql acquire: no result row");
	}
	int ok = dlock__my_row_i64(row, 0, 0) != 0;
	uint64_t f = dlock__my_row_u64(row, 1);
	int64_t left = dlock__my_row_i64(row, 2, -1);
	int64_t ahead = dlock__my_row_i64(row, 3, -1);
	mysql_free_result(res);
	if (ok) {
		out->fence = f;
		return 0;
	}
	if (left >= 0)
		out->retry_ms = left / 1000;
	/* Nothing tells a waiter of a release in this mode: a fair one looks again
	 * by its place — the head soon, the others when it may have moved up
	 * (dlock_sys_poll_hint). */
	if (ahead >= 0) {
		int64_t hint = dlock_sys_poll_hint(ahead, 4); /* a look takes the name's row lock */
		out->retry_ms = left >= 0 && left / 1000 < hint ? left / 1000 : hint;
	}
	return DLOCK_ELOCKED;
}

static int affected_one(mysql_store *b, sbuf *s, const char *what, int *hit, int64_t deadline)
{
	MYSQL_RES *res;
	int rc = dlock__my_run(b, s, &res, what, 0, deadline);
	free(s->p);
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	*hit = row && dlock__my_row_i64(row, 0, 0) > 0;
	mysql_free_result(res);
	return 0;
}

static int t_release(dlock_backend *be, const dlock_request *req)
{
	mysql_store *b = (mysql_store *)be;
	sbuf s = { 0 };
	/* Ours only while unexpired; an expired row of ours is cleaned up either way. */
	sb_add(&s, "DELETE FROM dlock_holder WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, " AND expires > UTC_TIMESTAMP(6);SET @dl_n = ROW_COUNT();DELETE FROM dlock_holder WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, ";SELECT @dl_n");
	int hit = 0, rc = affected_one(b, &s, "release", &hit, req->deadline_ms);
	if (rc)
		return rc;
	return hit ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by this owner", req->name);
}

static int t_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	mysql_store *b = (mysql_store *)be;
	sbuf s = { 0 };
	/* The later expiry is kept (sys/backend.h, "Extend and renewal"). */
	sb_add(&s,
	       "UPDATE dlock_holder SET expires = GREATEST(expires, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND) WHERE ",
	       dlock__my_us(ttl_ms));
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	sb_add(&s, " AND expires > UTC_TIMESTAMP(6);SELECT ROW_COUNT()");
	int hit = 0, rc = affected_one(b, &s, "extend", &hit, req->deadline_ms);
	if (rc)
		return rc;
	return hit ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by this owner", req->name);
}

/* Renew up to RENEW_CHUNK holds in one round trip: one UPDATE, then read back which are ours. */
static int t_renew_chunk(mysql_store *b, const dlock_request *const *reqs, size_t n, int *results)
{
	sbuf s = { 0 }, in = { 0 };
	for (size_t i = 0; i < n; i++) {
		sb_add(&in, "%s(", i ? "," : "");
		dlock__my_sb_hex(&in, reqs[i]->name);
		sb_add(&in, ",");
		dlock__my_sb_hex(&in, reqs[i]->owner);
		sb_add(&in, ")");
	}
	int rc = dlock__my_sb_check(&in);
	if (rc)
		return rc;
	sb_add(&s, "UPDATE dlock_holder SET expires = CASE owner");
	for (size_t i = 0; i < n; i++) {
		sb_add(&s, " WHEN ");
		dlock__my_sb_hex(&s, reqs[i]->owner);
		sb_add(&s, " THEN GREATEST(expires, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND)",
		       dlock__my_us(reqs[i]->ttl_ms));
	}
	/* Owner tokens are unique per hold, so (name, owner) names exactly one row. */
	sb_add(&s,
	       " ELSE expires END WHERE ns = %s AND (name, owner) IN (%s) AND expires > UTC_TIMESTAMP(6);"
	       "SELECT owner FROM dlock_holder WHERE ns = %s AND (name, owner) IN (%s) AND expires > UTC_TIMESTAMP(6)",
	       b->ns_hex, in.p ? in.p : "", b->ns_hex, in.p ? in.p : "");
	free(in.p);
	MYSQL_RES *res;
	rc = dlock__my_run(b, &s, &res, "renew", 0, reqs[0]->deadline_ms);
	free(s.p);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		results[i] = DLOCK_ENOTHELD;
	MYSQL_ROW row;
	while (res && (row = mysql_fetch_row(res)) != NULL) {
		unsigned long *len = mysql_fetch_lengths(res);
		for (size_t i = 0; i < n; i++)
			if (row[0] && strlen(reqs[i]->owner) == len[0] && memcmp(reqs[i]->owner, row[0], len[0]) == 0)
				results[i] = 0;
	}
	mysql_free_result(res);
	return 0;
}

/* At most RENEW_CHUNK at a time (the methods' renew_max: the core splits a
 * bigger batch). */
static int t_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	return t_renew_chunk((mysql_store *)be, reqs, n, results);
}

static int t_cancel(dlock_backend *be, const dlock_request *req)
{
	mysql_store *b = (mysql_store *)be;
	/* The core cancels when a wait ends. If the last try lost the connection
	 * (it timed out), a reconnect now would overrun the caller's wait on a
	 * link that just failed: leave the registration to expire by itself
	 * (queue_ttl_ms, as a crashed waiter's does). */
	if (!b->conn)
		return 0;
	sbuf s = { 0 };
	sb_add(&s, "DELETE FROM dlock_waiter WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	int rc = dlock__my_run(b, &s, NULL, "cancel", 0, req->deadline_ms);
	free(s.p);
	return rc;
}

/* mode=table: holds are rows (any connection may renew them). */
const dlock_backend_methods dlock__my_table_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.renew_max = RENEW_CHUNK,
	.acquire = t_acquire,
	.release = t_release,
	.renew = t_renew,
	.extend = t_extend,
	.cancel = t_cancel,
	.status = dlock__my_be_status,
	.list = dlock__my_be_list,
	.close = dlock__my_be_close,
};
