/*
 * MySQL/MariaDB store, mode=get_lock: GET_LOCK on a connection of its own per
 * hold, kept open for the hold's life (req->slot). The lock dies with the
 * connection; the session's wait_timeout is set to the lease. Waiters block
 * in the server (GET_LOCK with a timeout) and are woken by the release.
 */
#include "my.h"

/* ================= mode=get_lock ================= */

/*
 * The GET_LOCK key of a name given as SQL text (a hex literal, or the column
 * `name`): "<db>/<prefix>/<name>" with '%' and '/' of the prefix written %25
 * and %2F (so prefix=a/x + name y is not prefix=a + name x/y), or when that
 * is over 64 characters (MySQL's limit) its first 23 characters, '~' and
 * the first 40 hex digits of its
 * SHA-256. The server computes it, so an operator can run the same SQL to find
 * a lock in IS_USED_LOCK or the metadata lock views.
 */
void dlock__my_sb_key(sbuf *s, const mysql_store *b, const char *name_sql)
{
	sbuf k = { 0 };
	sb_add(&k, "CONCAT(CONVERT(");
	dlock__my_sb_hex(&k, b->db);
	sb_add(&k,
	       " USING utf8mb4), '/', REPLACE(REPLACE(CONVERT(%s USING utf8mb4), '%%', '%%25'), '/', '%%2F'), '/',"
	       " CONVERT(%s USING utf8mb4))",
	       b->ns_hex, name_sql);
	if (k.failed) {
		free(k.p);
		s->failed = 1;
		return;
	}
	sb_add(s, "IF(CHAR_LENGTH(%s) <= %d, %s, CONCAT(LEFT(%s, 23), '~', LEFT(SHA2(%s, 256), 40)))", k.p,
	       KEY_MAX_CHARS, k.p, k.p, k.p);
	free(k.p);
}

static void pool_put(mysql_store *b, MYSQL *c)
{
	if (b->npool < POOL_MAX)
		b->pool[b->npool++] = c;
	else
		mysql_close(c);
}

/* A held connection's socket is watched for a hang-up (dlock_backend_watch_fd):
 * a session the server ends (KILL, a restart) frees its GET_LOCKs at once,
 * and the holder hears of it then, not at its next renewal. */
static void hang_watch(mysql_store *b, MYSQL *c, int add)
{
	int fd = c ? (int)mysql_get_socket(c) : -1;
	if (add)
		(void)dlock_backend_watch_fd(&b->base, fd);
	else
		dlock_backend_unwatch_fd(&b->base, fd);
}

/* Give up a hold's connection (its lock ends with it), out of the hang-up
 * watch first: a socket the watch still polls stays open in the kernel. */
static void hold_conn_drop(mysql_store *b, gl_hold *h)
{
	hang_watch(b, h->conn, 0);
	dlock__my_conn_drop(&h->conn);
}

void dlock__my_hold_free(mysql_store *b, gl_hold *h, int reuse)
{
	hang_watch(b, h->conn, 0);
	for (gl_hold **p = &b->holds; *p; p = &(*p)->next)
		if (*p == h) {
			*p = h->next;
			break;
		}
	if (h->conn) {
		if (reuse)
			pool_put(b, h->conn);
		else
			mysql_close(h->conn);
	}
	free(h);
}

/* wait_timeout makes the server end a session idle for a whole lease: a client
 * cut off (not just crashed) then loses its GET_LOCK about one TTL after its
 * last renewal, like on every other store. Whole seconds, rounded up: the
 * server never ends it before the client's own deadline. */
static long wait_timeout_s(int64_t ttl_ms)
{
	long s = (long)((ttl_ms + 999) / 1000);
	return s < 1 ? 1 : s;
}

/* "(IS_USED_LOCK(key) <=> CONNECTION_ID())": 1 while this session holds the hold's key. */
static void sb_mine(sbuf *s, const gl_hold *h)
{
	sb_add(s, "(IS_USED_LOCK(CONVERT(X'%s' USING utf8mb4)) <=> CONNECTION_ID())", h->key_hex);
}

/* Statements that refresh the status record of a hold, if the session still holds it. */
static void sb_touch(sbuf *s, const mysql_store *b, const gl_hold *h, const dlock_request *req, int64_t ttl_ms)
{
	sb_add(s, "SET @dl_ok = ");
	sb_mine(s, h);
	sb_add(s, ";UPDATE dlock_holder SET expires = UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND WHERE @dl_ok AND ",
	       dlock__my_us(ttl_ms));
	dlock__my_where_name(s, b, req->name);
	sb_add(s, " AND owner = ");
	dlock__my_sb_hex(s, req->owner);
	sb_add(s, ";SELECT @dl_ok");
}

/*
 * The statements after "SET @dl_got = GET_LOCK(...)" (1 when this session now
 * holds the key): count the fence and write the holder record if got, and
 * keep the waiter record. Ends with the transaction open: the caller adds
 * COMMIT and its SELECT. nm: the name as a hex literal.
 */
static void sb_grant(sbuf *s, const mysql_store *b, const dlock_request *req, const char *nm, int waiting)
{
	/* The fence is counted while the lock is already ours, so fences grow in
	 * grant order. The holder row is a record for status; older rows of this
	 * name are of sessions that no longer hold it (we do). */
	sb_add(s,
	       "START TRANSACTION;"
	       "INSERT INTO dlock_lock (ns, name, fence) SELECT %s, %s, LAST_INSERT_ID(1) FROM DUAL "
	       "WHERE @dl_got = 1 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(dlock_lock.fence + 1);"
	       "SET @dl_f = IF(@dl_got = 1, LAST_INSERT_ID(), 0);"
	       "DELETE FROM dlock_holder WHERE @dl_got = 1 AND ns = %s AND name = %s AND conn_id <> 0;"
	       "INSERT INTO dlock_holder (ns, name, owner, mode, permits, fence, expires, host, pid, conn_id) "
	       "SELECT %s, %s, ",
	       b->ns_hex, nm, b->ns_hex, nm, b->ns_hex, nm);
	dlock__my_sb_hex(s, req->owner);
	sb_add(s, ", 0, 1, @dl_f, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND, ", dlock__my_us(req->ttl_ms));
	dlock__my_sb_hex(s, req->host ? req->host : "");
	sb_add(s, ", %d, CONNECTION_ID() FROM DUAL WHERE @dl_got = 1;", req->pid);
	/* A waiter is a record for status (the queue itself is the server's
	 * GET_LOCK wait): refused and waiting, register or refresh; granted, leave. */
	sb_add(s, "DELETE FROM dlock_waiter WHERE @dl_got = 1 AND ns = %s AND name = %s AND owner = ", b->ns_hex, nm);
	dlock__my_sb_hex(s, req->owner);
	sb_add(s, ";");
	if (waiting) {
		sb_add(s, "INSERT INTO dlock_waiter (ns, name, owner, mode, expires) SELECT %s, %s, ", b->ns_hex, nm);
		dlock__my_sb_hex(s, req->owner);
		sb_add(s,
		       ", 0, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND FROM DUAL WHERE @dl_got <> 1 "
		       "ON DUPLICATE KEY UPDATE expires = VALUES(expires);",
		       dlock__my_us(req->queue_ttl_ms));
	}
}

static int g_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	mysql_store *b = (mysql_store *)be; /* (GET_LOCK says nothing about when it frees up: no retry_ms) */
	if (req->mode == DLOCK_SHARED || req->permits > 1 || req->fair)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "mysql mode=get_lock has only exclusive locks: GET_LOCK has no shared mode, "
				       "no permits and no FIFO queue (use mode=table for %s)",
				       req->mode == DLOCK_SHARED ? "shared locks"
				       : req->permits > 1        ? "semaphores"
								 : "fair locks");
	MYSQL *waited = NULL;
	if (req->slot) {
		gl_hold *old = req->slot;
		out->slot = NULL;
		if (old->waited) { /* g_wait already got GET_LOCK on this connection */
			waited = old->conn;
			free(old);
		} else { /* left over from a hold that was lost: its connection is useless */
			dlock__my_hold_free(b, old, 0);
		}
	}
	sbuf s = { 0 }, nm = { 0 };
	dlock__my_sb_hex(&nm, req->name);
	int rc = dlock__my_sb_check(&nm);
	if (rc)
		return rc;
	sb_add(&s, "SET SESSION wait_timeout = %ld;SET @dl_k = ", wait_timeout_s(req->ttl_ms));
	dlock__my_sb_key(&s, b, nm.p);
	/* GET_LOCK nests: a session that already holds the key (from g_wait) must not take it twice. */
	sb_add(&s, ";SET @dl_got = IF(IS_USED_LOCK(@dl_k) <=> CONNECTION_ID(), 1, GET_LOCK(@dl_k, 0));");
	sb_grant(&s, b, req, nm.p, req->waiting);
	sb_add(&s, "SELECT @dl_got, @dl_f, HEX(@dl_k), CONNECTION_ID();COMMIT");
	free(nm.p);
	if ((rc = dlock__my_sb_check(&s)) != 0) {
		if (waited)
			mysql_close(waited);
		return rc;
	}
	MYSQL *c = NULL;
	MYSQL_RES *res = NULL;
	/* A grant g_wait got is completed with whatever time is left (one batch
	 * on its open connection); with none left, closing the connection gives
	 * GET_LOCK back: not acquired in time. (The core sends no waiting try
	 * with too little time left: sys/backend.h, "Time".) */
	int64_t deadline = req->deadline_ms;
	if (waited && deadline <= dlock_clock_ms()) {
		mysql_close(waited);
		free(s.p);
		return dlock__my_too_late(req);
	}
	for (int attempt = 0; attempt < 2; attempt++) {
		int pooled = !waited && (b->npool > 0 || b->conn);
		if (waited)
			c = waited, waited = NULL;
		else if (b->npool > 0)
			c = b->pool[--b->npool];
		else if (b->conn) /* the open's session: status reconnects when it needs one */
			c = b->conn, b->conn = NULL;
		else if ((rc = dlock__my_conn_open(b, &c, deadline)) != 0)
			break;
		dlock__my_tl_want_partial = 1;
		rc = dlock__my_exec(b, c, s.p, s.len, &res, "GET_LOCK", deadline);
		dlock__my_tl_want_partial = 0;
		if (rc == 0)
			break;
		/* A pooled session the server ended meanwhile (wait_timeout): use a new one. */
		int retry = pooled && !dlock__my_tl_timed_out && dlock__my_is_conn_error(mysql_errno(c)) &&
			    dlock_clock_ms() < deadline;
		/* Closing also drops a GET_LOCK the failed batch may have taken (a batch
		 * that timed out may have been applied: its session ends with it). */
		mysql_close(c);
		c = NULL;
		if (!retry)
			break;
	}
	free(s.p);
	/* Refused, and only the COMMIT's OK missing: refused (the connection, which
	 * holds nothing, is closed already). */
	if (rc && dlock__my_tl_timed_out && dlock__my_refused_before_timeout("@dl_got"))
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL,
				       "lock '%s' is held (the answer came, its commit's did not)", req->name);
	mysql_free_result(dlock__my_tl_partial);
	dlock__my_tl_partial = NULL;
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row || !row[0] || !row[2]) {
		mysql_free_result(res);
		mysql_close(c);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL,
				       "mysql GET_LOCK returned NULL (an error in the server)");
	}
	if (dlock__my_row_i64(row, 0, 0) != 1) {
		mysql_free_result(res);
		pool_put(b, c);
		return DLOCK_ELOCKED;
	}
	gl_hold *h = dlock_sys_calloc(1, sizeof(*h));
	if (!h) {
		mysql_free_result(res);
		mysql_close(c);
		return DLOCK_ENOMEM;
	}
	h->conn = c;
	out->fence = dlock__my_row_u64(row, 1);
	snprintf(h->key_hex, sizeof(h->key_hex), "%s", row[2]);
	h->conn_id = (unsigned long)dlock__my_row_u64(row, 3);
	mysql_free_result(res);
	h->next = b->holds;
	b->holds = h;
	out->slot = h;
	hang_watch(b, c, 1);
	return 0;
}

/*
 * Block in the server until the key is free (GET_LOCK with a timeout: MariaDB
 * wakes the waiter the moment the holder releases or its session ends), on a
 * connection of its own. If it granted, the hold is left in out->slot (the
 * request's slot from then on) and the core's next g_acquire (the core
 * always tries again after a wait) completes it there. Runs without the
 * store mutex; only this request's thread touches its slot before the grant.
 */
#define WAIT_MARGIN_MIN_MS 50
#define WAIT_SERVER_MIN_MS 10

static int g_wait(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out)
{
	mysql_store *b = (mysql_store *)be;
	if (req->slot || timeout_ms <= 0 || req->mode == DLOCK_SHARED || req->permits > 1 || req->fair)
		return 0;
	/* The server answers GET_LOCK a little before our own limit, so that a wait
	 * that simply ran out keeps its connection. The margin is never below
	 * WAIT_MARGIN_MIN_MS: a wait we give up on while its GET_LOCK still waits
	 * in the server would take the lock when it is released, for a session
	 * nobody listens to any more (until the server notices the closed
	 * connection) — a phantom holder. Too little time left for that: sleep
	 * it out here (at most WAIT_MARGIN_MIN_MS + WAIT_SERVER_MIN_MS), not a
	 * try per millisecond. */
	int64_t start = dlock_clock_ms(), deadline = start + timeout_ms;
	int64_t margin = timeout_ms / 5 < 100 ? timeout_ms / 5 : 100;
	if (margin < WAIT_MARGIN_MIN_MS)
		margin = WAIT_MARGIN_MIN_MS;
	if (timeout_ms - margin < WAIT_SERVER_MIN_MS) {
		dlock_sys_sleep_ms(timeout_ms);
		return 0;
	}
	MYSQL *c = NULL;
	pthread_mutex_lock(&b->wait_mu);
	if (b->nwait_pool > 0)
		c = b->wait_pool[--b->nwait_pool];
	pthread_mutex_unlock(&b->wait_mu);
	if (!c && dlock__my_conn_open(b, &c, deadline) != 0) {
		int64_t left = deadline - dlock_clock_ms();
		if (left > 0) /* not a busy loop while the server is away */
			dlock_sys_sleep_ms(left < 50 ? left : 50);
		return 0;
	}
	int64_t server_ms = deadline - margin - dlock_clock_ms();
	if (server_ms < 0)
		server_ms = 0;
	sbuf s = { 0 }, nm = { 0 };
	dlock__my_sb_hex(&nm, req->name);
	if (!nm.failed) {
		/* If ever nobody completes the grant, the server frees it after a lease. */
		sb_add(&s, "SET SESSION wait_timeout = %ld;SET @dl_k = ", wait_timeout_s(req->ttl_ms));
		dlock__my_sb_key(&s, b, nm.p);
		/* A grant is recorded (fence, holder record) in the same batch, so that
		 * a grant whose reply is lost is seen in status like any other. */
		sb_add(&s, ";SET @dl_got = GET_LOCK(@dl_k, %.3f);", (double)server_ms / 1000.0);
		sb_grant(&s, b, req, nm.p, 0);
		sb_add(&s, "SELECT @dl_got, HEX(@dl_k);COMMIT");
	}
	free(nm.p);
	MYSQL_RES *res = NULL;
	if (nm.failed || dlock__my_sb_check(&s) ||
	    dlock__my_exec(b, c, s.p, s.len, &res, "GET_LOCK wait", deadline) != 0) {
		free(s.p);
		mysql_close(c);
		return 0;
	}
	free(s.p);
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	gl_hold *h = NULL;
	if (row && row[0] && row[1] && dlock__my_row_i64(row, 0, 0) == 1 && (h = calloc(1, sizeof(*h))) != NULL) {
		h->conn = c;
		h->waited = 1;
		snprintf(h->key_hex, sizeof(h->key_hex), "%s", row[1]);
		out->slot = h;
	} else if (row && row[0] && dlock__my_row_i64(row, 0, 0) == 1) {
		mysql_close(c); /* out of memory: closing frees the lock again */
	} else {
		pthread_mutex_lock(&b->wait_mu);
		if (b->nwait_pool < POOL_MAX)
			b->wait_pool[b->nwait_pool++] = c, c = NULL;
		pthread_mutex_unlock(&b->wait_mu);
		if (c)
			mysql_close(c);
	}
	mysql_free_result(res);
	return 0;
}

static int no_slot(const dlock_request *req)
{
	return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
			       "lock '%s' is not held here: a GET_LOCK hold belongs to the connection (and "
			       "process) that took it",
			       req->name);
}

static int conn_lost(const dlock_request *req)
{
	return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
			       "lock '%s' is gone with its connection (killed, timed out, or the server restarted)",
			       req->name);
}

static int g_release(dlock_backend *be, const dlock_request *req)
{
	mysql_store *b = (mysql_store *)be;
	gl_hold *h = req->slot;
	if (!h)
		return no_slot(req);
	if (!h->conn) {
		dlock__my_hold_free(b, h, 0);
		return conn_lost(req);
	}
	/* Only RELEASE_LOCK: no InnoDB write, so no commit and no log flush. The
	 * holder row stays behind as a stale record: status shows a get_lock row
	 * only while IS_USED_LOCK names its session, and the next grant of the
	 * name deletes it. */
	sbuf s = { 0 };
	sb_add(&s, "SELECT RELEASE_LOCK(CONVERT(X'%s' USING utf8mb4))", h->key_hex);
	int rc = dlock__my_sb_check(&s);
	if (rc) {
		dlock__my_hold_free(b, h, 0); /* closing the connection frees the lock */
		return rc;
	}
	MYSQL_RES *res;
	rc = dlock__my_exec(b, h->conn, s.p, s.len, &res, "RELEASE_LOCK", req->deadline_ms);
	free(s.p);
	if (rc) {
		/* A release that cannot be confirmed ends the session: closing the
		 * connection frees the lock in the server (at once if the server sees
		 * the close, else when its wait_timeout — the lease — runs out). */
		int late = dlock__my_tl_timed_out, dead = dlock__my_is_conn_error(mysql_errno(h->conn));
		dlock__my_hold_free(b, h, 0);
		return late || !dead ? rc : conn_lost(req);
	}
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	int ok = row && dlock__my_row_i64(row, 0, 0) == 1;
	mysql_free_result(res);
	dlock__my_hold_free(b, h, ok);
	return ok ? 0
		  : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' was no longer held by our connection",
				    req->name);
}

/* Leave the waiters' record (status) of a wait that ended without a grant;
 * a GET_LOCK that g_wait got and no g_acquire completed (the wait gave up
 * first) is given back by closing its connection, as g_acquire does when it
 * finds no time left to complete it. */
static int g_cancel(dlock_backend *be, const dlock_request *req)
{
	mysql_store *b = (mysql_store *)be;
	gl_hold *w = req->slot;
	if (w && w->waited) {
		mysql_close(w->conn);
		free(w);
	}
	MYSQL *c = NULL;
	if (b->npool > 0)
		c = b->pool[--b->npool];
	else if (b->conn)
		c = b->conn, b->conn = NULL;
	else
		return 0; /* no session at hand: the record expires by itself (queue_ttl_ms) */
	sbuf s = { 0 };
	sb_add(&s, "DELETE FROM dlock_waiter WHERE ");
	dlock__my_where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	dlock__my_sb_hex(&s, req->owner);
	int rc = dlock__my_sb_check(&s);
	if (rc == 0)
		rc = dlock__my_exec(b, c, s.p, s.len, NULL, "cancel", req->deadline_ms);
	free(s.p);
	if (rc)
		mysql_close(c);
	else
		pool_put(b, c);
	return rc;
}

static int g_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	mysql_store *b = (mysql_store *)be;
	gl_hold *h = req->slot;
	if (!h)
		return no_slot(req);
	if (!h->conn)
		return conn_lost(req);
	sbuf s = { 0 };
	sb_add(&s, "SET SESSION wait_timeout = %ld;", wait_timeout_s(ttl_ms));
	sb_touch(&s, b, h, req, ttl_ms);
	int rc = dlock__my_sb_check(&s);
	if (rc)
		return rc;
	MYSQL_RES *res;
	rc = dlock__my_exec(b, h->conn, s.p, s.len, &res, "extend", req->deadline_ms);
	free(s.p);
	if (rc) {
		if (dlock__my_conn_dead(h->conn)) {
			/* Out of time, or the session ended: either way no reply can be
			 * trusted on it, and the lock ends with it. */
			hold_conn_drop(b, h);
			return conn_lost(req);
		}
		return rc;
	}
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	int ok = row && dlock__my_row_i64(row, 0, 0) == 1;
	mysql_free_result(res);
	return ok ? 0
		  : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is no longer held by our connection",
				    req->name);
}

/* One check per hold, each on its own connection: send them all, then read them
 * all, so a batch costs about one round trip however many locks are held. */
static int g_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	mysql_store *b = (mysql_store *)be;
	enum { SENT = 1 };
	for (size_t i = 0; i < n; i++) {
		gl_hold *h = reqs[i]->slot;
		results[i] = DLOCK_ENOTHELD;
		if (!h || !h->conn)
			continue;
		sbuf s = { 0 };
		sb_touch(&s, b, h, reqs[i], reqs[i]->ttl_ms);
		if (dlock__my_sb_check(&s)) {
			results[i] = DLOCK_ENOMEM; /* transient: retried until the deadline */
			continue;
		}
		int64_t deadline = reqs[i]->deadline_ms;
		int st = dlock__my_nb_send(h->conn, s.p, s.len, deadline);
		if (st == 0) {
			results[i] = SENT;
		} else {
			if (st < 0)
				mariadb_cancel(h->conn);
			hold_conn_drop(b, h);
		}
		free(s.p);
	}
	for (size_t i = 0; i < n; i++) {
		gl_hold *h = reqs[i]->slot;
		if (results[i] != SENT)
			continue;
		results[i] = DLOCK_ENOTHELD;
		MYSQL_RES *res = NULL;
		dlock__my_tl_timed_out = 0;
		int st = dlock__my_nb_read_result(h->conn, reqs[i]->deadline_ms);
		if (st < 0)
			dlock__my_timed_out(h->conn, "renew");
		if (st != 0 || dlock__my_read_all(b, h->conn, &res, "renew", reqs[i]->deadline_ms) != 0) {
			/* The connection is gone (killed, server restart), or gave no answer
			 * in time and was closed: the lock ends with it. */
			if (dlock__my_conn_dead(h->conn))
				hold_conn_drop(b, h);
			else
				results[i] = DLOCK_ESTORE;
			continue;
		}
		MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
		if (row && dlock__my_row_i64(row, 0, 0) == 1)
			results[i] = 0;
		mysql_free_result(res);
	}
	return 0;
}

/* mode=get_lock: a hold lives with its connection. MariaDB takes fractional
 * GET_LOCK timeouts, so waiters block on the server there; MySQL is not
 * known to (its manual says seconds), and a rounded-up wait could overrun
 * the caller's deadline: there waiters back off and retry. */
#define GET_LOCK_METHODS                                                                              \
	DLOCK_BACKEND_METHODS_INIT(KIND), .flags = DLOCK_BACKEND_F_SESSION, .acquire = g_acquire,       \
	.release = g_release, .renew = g_renew, .extend = g_extend, .cancel = g_cancel,                \
	.status = dlock__my_be_status, .list = dlock__my_be_list, .close = dlock__my_be_close
const dlock_backend_methods dlock__my_get_lock_methods = { GET_LOCK_METHODS };
const dlock_backend_methods dlock__my_get_lock_wait_methods = { GET_LOCK_METHODS, .wait = g_wait };
#undef GET_LOCK_METHODS
