/*
 * PostgreSQL store, mode=advisory: pg_try_advisory_lock on a connection held
 * for the lock's life (req->slot), with idle_session_timeout as a server-side
 * lease.
 */
#include "pg.h"

/* ---------------------------------------------------------- advisory mode */

static intent **intent_find(postgres_store *be, const char *owner)
{
	intent **p = &be->intents;
	while (*p && strcmp((*p)->owner, owner) != 0)
		p = &(*p)->next;
	return p;
}

static char *ms_setting(int64_t ms, char *buf, size_t n)
{
	/* idle_session_timeout is an int of milliseconds */
	snprintf(buf, n, "%" PRId64, ms > INT32_MAX ? (int64_t)INT32_MAX : ms);
	return buf;
}

/* SQL that turns a pooled session's lease off again (PostgreSQL 14+ has one). */
static const char *no_lease(PGconn *c)
{
	return PQserverVersion(c) >= 140000 ? ", set_config('idle_session_timeout', '0', false)" : "";
}

/*
 * A hold names its owner ("<hex client id>-<serial>") in two places that
 * status can read from another session: every statement of the hold's
 * session starts with "/\* dlock-hold <client id> *\/" (pg_stat_activity.query
 * keeps a session's last statement), and its application_name carries the
 * serial (application_name has no room for the whole owner). The client id
 * is the same for every hold of a store handle, so the try's text stays the
 * same and is prepared once per session. An owner of any other shape is
 * left out (buf and serial "").
 */
static void hold_tag(char *buf, size_t n, char serial[24], const char *owner)
{
	buf[0] = serial[0] = 0;
	const char *dash = owner ? strrchr(owner, '-') : NULL;
	if (!dash || dash == owner || !dash[1] || strlen(dash + 1) > 20 ||
	    strspn(dash + 1, "0123456789") != strlen(dash + 1) || dash - owner > 64 ||
	    strspn(owner, "0123456789abcdefABCDEF") != (size_t)(dash - owner))
		return;
	snprintf(buf, n, "/* dlock-hold %.*s */ ", (int)(dash - owner), owner);
	snprintf(serial, 24, "%s", dash + 1);
}

/*
 * A hold's statements (its try and its release) are prepared on each session
 * once: parsing and planning them on every call was most of a try's server
 * time. SQL PREPARE, not the protocol's Parse, so that the first use on a
 * session prepares and executes in one round trip. The try's text starts
 * with the client's tag (hold_tag), which pg_stat_activity.query shows for
 * a prepared statement too; a session that serves another store handle
 * prepares it again. What a session has prepared is libpq instance data: it
 * goes with the connection (pool, hold, intent) and is freed with it.
 */
enum { A_TRY, A_RELEASE };

/* A waiter whose registration met a release's check tries again this soon. */
#define REG_RETRY_MS 5

typedef struct adv_sess {
	unsigned ready;   /* bits of A_* prepared on the session */
	int64_t wait_key; /* the name's "waiting" key, held shared by a waiter: 0 none */
	char tag[128];  /* the prepared try's client tag (hold_tag) */
} adv_sess;

static int sess_event(PGEventId id, void *info, void *pass)
{
	(void)pass;
	if (id == PGEVT_REGISTER) {
		PGconn *c = ((PGEventRegister *)info)->conn;
		adv_sess *s = calloc(1, sizeof *s);
		return s && PQsetInstanceData(c, sess_event, s) ? 1 : (free(s), 0);
	}
	if (id == PGEVT_CONNDESTROY)
		free(PQinstanceData(((PGEventConnDestroy *)info)->conn, sess_event));
	return 1;
}

static int64_t sess_wait_key(PGconn *c)
{
	adv_sess *s = PQinstanceData(c, sess_event);
	return s ? s->wait_key : 0;
}

/* The session state of c; NULL when out of memory. */
static adv_sess *sess_of(PGconn *c)
{
	adv_sess *s = PQinstanceData(c, sess_event);
	if (!s && PQregisterEventProc(c, sess_event, "dlock", NULL))
		s = PQinstanceData(c, sess_event);
	return s;
}

/* Pool an idle session; one that still holds a waiter's registration is closed. */
static void pool_put(postgres_store *be, PGconn *c)
{
	if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE && be->npool < POOL_MAX &&
	    sess_wait_key(c) == 0)
		be->pool[be->npool++] = c;
	else
		PQfinish(c);
}

static int pool_get(postgres_store *be, int64_t deadline, PGconn **out)
{
	while (be->npool > 0) {
		PGconn *c = be->pool[--be->npool];
		if (dlock__pg_idle_ok(c)) {
			*out = c;
			return 0;
		}
		PQfinish(c);
	}
	int code = 0;
	*out = dlock__pg_connect_db(be, deadline, &code);
	return *out ? 0 : code;
}

/*
 * Run statement `which` (its parameters: decl; its text: body) on *cp by
 * `deadline`, preceded by `tag` (the try's owner tag, else ""), as
 * dlock__pg_run does. A failed call leaves the session's state unknown: the
 * callers close the session on any error.
 */
static int sess_run(PGconn **cp, int64_t deadline, const char *what, int which, const char *decl, const char *body,
		    const char *tag, int n, const char *const *vals, PGresult **out)
{
	static const char *const names[] = { [A_TRY] = "dlock_try", [A_RELEASE] = "dlock_release" };
	const char *name = names[which];
	adv_sess *s = sess_of(*cp);
	unsigned bit = 1u << which;
	if (s && (s->ready & bit) && (which != A_TRY || strcmp(s->tag, tag) == 0))
		return dlock__pg_finish(cp, deadline, what, PQsendQueryPrepared(*cp, name, n, vals, NULL, NULL, 0),
					out);
	if (!s || n > 12)
		return dlock_sys_oom(); /* (n: the callers pass 7 to 10) */
	/* "<tag>[DEALLOCATE name; ]PREPARE name(decl) AS body; EXECUTE name('v1', ...)" */
	size_t len = strlen(tag) + 3 * strlen(name) + strlen(decl) + strlen(body) + 64;
	char *lit[12] = { 0 };
	int ok = 1;
	for (int i = 0; ok && i < n; i++)
		if (!(lit[i] = PQescapeLiteral(*cp, vals[i], strlen(vals[i]))))
			ok = 0;
		else
			len += strlen(lit[i]) + 2;
	char *sql = ok ? malloc(len) : NULL;
	if (sql) {
		int again = (s->ready & bit) != 0; /* prepared for another tag: replace it */
		size_t at = (size_t)snprintf(sql, len, "%s%s%s%sPREPARE %s(%s) AS %s; EXECUTE %s(", tag,
					     again ? "DEALLOCATE " : "", again ? name : "", again ? "; " : "", name,
					     decl, body, name);
		for (int i = 0; i < n; i++)
			at += (size_t)snprintf(sql + at, len - at, "%s%s", i ? ", " : "", lit[i]);
		snprintf(sql + at, len - at, ")");
	}
	for (int i = 0; i < n; i++)
		PQfreemem(lit[i]);
	if (!sql)
		return dlock_sys_oom();
	s->ready &= ~bit;
	int rc = dlock__pg_finish(cp, deadline, what, PQsendQuery(*cp, sql), out);
	free(sql);
	if (rc == 0) {
		s->ready |= bit;
		if (which == A_TRY)
			snprintf(s->tag, sizeof s->tag, "%s", tag);
	}
	return rc;
}

/* A statement about one key ($1; $2 = arg when given) on *cp by `deadline`:
 * *yes is its first column. On an error the session is closed, as it may
 * hold the key now. */
static int key_query(PGconn **cp, int64_t deadline, const char *sql, int64_t key, const char *arg, int *yes)
{
	char k[24];
	dlock__pg_i64s(k, sizeof k, key);
	const char *v[] = { k, arg };
	PGresult *r;
	int rc = dlock__pg_run(cp, deadline, "acquire", sql, arg ? 2 : 1, v, &r);
	if (rc) {
		dlock__pg_drop_conn(cp, 0);
		return rc;
	}
	*yes = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return 0;
}

/* Try one advisory key on *cp by `deadline`; on success *fence is the next
 * fence. On an error the connection may hold the key: the caller closes it
 * (a timeout has already dropped it: *cp == NULL). */
static int adv_try(PGconn **cp, int64_t deadline, const dlock_request *req, int64_t key, int shared,
		   int64_t unlock_intent, int64_t reg_key, int64_t unreg_key, int *got, int *reg, uint64_t *fence)
{
	char rk[24], uk[24];
	dlock__pg_i64s(rk, sizeof rk, reg_key);
	dlock__pg_i64s(uk, sizeof uk, unreg_key);
	char k[24], ik[24], ttl[24];
	dlock__pg_i64s(k, sizeof k, key);
	dlock__pg_i64s(ik, sizeof ik, unlock_intent);
	ms_setting(req->ttl_ms, ttl, sizeof ttl);
	int lease = PQserverVersion(*cp) >= 140000;
	char app[96], pid[16], tag[128], serial[24];
	snprintf(pid, sizeof pid, "%d", req->pid);
	snprintf(app, sizeof app, "%s", req->host ? req->host : "");
	hold_tag(tag, sizeof tag, serial, req->owner);
	/* The whole owner is a parameter too: every try carries it on the wire. */
	const char *v[] = {
		k, shared ? "t" : "f", lease ? ttl : "0", ik, pid, app, req->owner ? req->owner : "", serial, rk, uk
	};
	/*
	 * One round trip: take the key, then (only if taken) the next fence from
	 * the sequence (schema.sql), the session's idle timeout set to the lease
	 * (a hung or cut-off client loses the lock on the server once a TTL passes
	 * without renewal), a waiting writer's intent key let go, and what status
	 * shows of this holder in application_name (visible to all). Refused, a
	 * waiter registers ($9); granted, it lets its registration go ($10).
	 */
	PGresult *r;
	int rc = sess_run(
		cp, deadline, "acquire", A_TRY, "bigint, boolean, text, bigint, text, text, text, text, bigint, bigint",
		"SELECT ok, fence, CASE WHEN ok AND $3 <> '0' THEN set_config('idle_session_timeout', $3, false) END,"
		" CASE WHEN ok AND $4 <> 0 THEN pg_advisory_unlock($4) END,"
		" CASE WHEN ok THEN set_config('application_name',"
		"  'dlock ' || $5 || ' ' || fence || ' ' || $3 || ' ' || $8 || ' ' || $6, false) END, $7,"
		" CASE WHEN NOT ok AND $9 <> 0 THEN pg_try_advisory_lock_shared($9) END,"
		" CASE WHEN ok AND $10 <> 0 THEN pg_advisory_unlock_shared($10) END"
		" FROM (SELECT ok, CASE WHEN ok THEN nextval('dlock_fences') END AS fence FROM"
		"  (SELECT CASE WHEN $2 THEN pg_try_advisory_lock_shared($1) ELSE pg_try_advisory_lock($1) END"
		"   AS ok OFFSET 0) l OFFSET 0) f",
		tag, 10, v, &r);
	if (rc)
		return rc;
	*got = PQgetvalue(r, 0, 0)[0] == 't';
	*reg = PQgetvalue(r, 0, 6)[0] == 't';
	if (*got)
		*fence = strtoull(PQgetvalue(r, 0, 1), NULL, 10);
	PQclear(r);
	return 0;
}

/*
 * Advisory semaphores and the permits rule (dlock/lock.h): every semaphore
 * holder keeps, on its session, a shared two-int key (class of the name,
 * its permits), so pg_locks tells how many hold and the smallest permits
 * among them. A caller takes its own key first, then counts: the last of
 * any two callers to count sees the other, so no set of holders outgrows
 * the smallest limit among them (two that count at once may both step back;
 * the core tries again). The class is 31 bits of a hash of the name: two
 * names that share one only count each other's holders (more refusals,
 * never a holder too many). Then the name's key shared, which a mutex takes
 * exclusively: a mutex and a semaphore exclude each other.
 * @return 0 (*ok: within the rule, key kept; else key let go); an error.
 */
static int sem_enter(PGconn **cp, int64_t deadline, int32_t cls, unsigned permits, int *ok)
{
	char cs[16], ps[16];
	snprintf(cs, sizeof cs, "%" PRId32, cls);
	snprintf(ps, sizeof ps, "%u", permits);
	const char *v[] = { cs, ps };
	PGresult *r;
	/* clang-format off */
	int rc = dlock__pg_run(cp, deadline, "acquire",
		     /* the count is a subquery of t's row: pg_locks is read after our key is taken */
		     "WITH t AS MATERIALIZED (SELECT pg_try_advisory_lock_shared($1::int, $2::int) AS ok),"
		     " c AS MATERIALIZED (SELECT t.ok, t.ok AND (SELECT count(*) <= least($2::bigint,"
		     "  min(l.objid::bigint)) FROM pg_locks l WHERE t.ok AND l.locktype = 'advisory'"
		     "  AND l.granted AND l.objsubid = 2 AND l.classid = $1::int::oid AND l.database ="
		     "  (SELECT oid FROM pg_database WHERE datname = current_database())) AS within FROM t)"
		     " SELECT c.within, CASE WHEN c.ok AND NOT c.within"
		     "  THEN pg_advisory_unlock_shared($1::int, $2::int) END FROM c",
		     2, v, &r);
	/* clang-format on */
	if (rc)
		return rc;
	*ok = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return 0;
}

static int adv_acquire(dlock_backend *base, const dlock_request *req, dlock_grant *out)
{
	postgres_store *be = (postgres_store *)base;
	if (req->fair)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "fair locks need mode=table: advisory try-locks have no queue");
	int64_t deadline = req->deadline_ms;
	int rc;
	int shared = req->mode == DLOCK_SHARED;
	unsigned permits = req->permits;
	int64_t intent_key = dlock__pg_adv_key(be->ns, req->name, "writer-intent");

	/*
	 * Unknown outcomes: any statement that fails here may have taken a key
	 * on its session, so the session is closed (the key goes with it), never
	 * pooled; a timeout has dropped it already. Nothing survives a failed try.
	 */
	PGconn *c = NULL;
	intent **ip = intent_find(be, req->owner), *in = *ip;
	int had_intent = 0;
	if (in) {
		/* a waiter retries on the session it keeps (registration, intent) */
		c = in->conn;
		had_intent = in->writer;
		*ip = in->next;
		free(in);
	} else if ((rc = pool_get(be, deadline, &c))) {
		return rc;
	}
	adv_sess *ss = sess_of(c);
	if (!ss) {
		pool_put(be, c);
		return dlock_sys_oom();
	}
	/* A waiter registers on its session once it is refused (see adv_release). */
	int64_t wait_key = req->waiting ? dlock__pg_adv_key(be->ns, req->name, "waiting") : 0;
	int tried_reg = 0, reg = 0;
	int got = 0;
	uint64_t f = 0;
	int64_t key = dlock__pg_adv_key(be->ns, req->name, NULL);
	int32_t sem_class = permits > 1 ? (int32_t)(dlock__pg_adv_key(be->ns, req->name, "permits") & 0x7fffffff) : 0;
	int within = 1;
	if (shared) {
		/* Writer preference: back off while a writer announced it waits. */
		if ((rc = key_query(&c, deadline,
				    "SELECT CASE WHEN pg_try_advisory_lock_shared($1::bigint)"
				    " THEN pg_advisory_unlock_shared($1::bigint) ELSE false END",
				    intent_key, NULL, &within)))
			return rc;
	}
	if (within && sem_class && (rc = sem_enter(&c, deadline, sem_class, permits, &within))) {
		dlock__pg_drop_conn(&c, 0);
		return rc;
	}
	if (within) {
		/* a semaphore holder takes the name's key shared: a mutex excludes it */
		tried_reg = wait_key && !ss->wait_key;
		rc = adv_try(&c, deadline, req, key, shared || sem_class, had_intent ? intent_key : 0,
			     tried_reg ? wait_key : 0, ss->wait_key, &got, &reg, &f);
		if (rc) {
			dlock__pg_drop_conn(&c, 0);
			return rc;
		}
		if (!got && sem_class) {
			char cs[16], ps[16];
			snprintf(cs, sizeof cs, "%" PRId32, sem_class);
			snprintf(ps, sizeof ps, "%u", permits);
			const char *v[] = { cs, ps };
			if ((rc = dlock__pg_run(&c, deadline, "acquire",
						"SELECT pg_advisory_unlock_shared($1::int, $2::int)", 2, v, NULL))) {
				dlock__pg_drop_conn(&c, 0);
				return rc;
			}
		}
	}
	if (got) {
		ss->wait_key = 0; /* the try let the registration go */
		adv_hold *h = calloc(1, sizeof *h);
		if (!h) {
			dlock__pg_drop_conn(&c, 0); /* closing the session frees the lock */
			return dlock_sys_oom();
		}
		h->conn = c;
		h->key = key;
		h->shared = shared || sem_class;
		h->sem_class = sem_class;
		h->sem_permits = permits;
		out->slot = h;
		out->fence = f;
		(void)dlock_backend_watch_fd(base, PQsocket(c)); /* a killed session is reported at once */
		return 0;
	}
	if (wait_key && !ss->wait_key) {
		/* Refused before the try (writer intent, permits): register now. */
		if (!tried_reg && (rc = key_query(&c, deadline, "SELECT pg_try_advisory_lock_shared($1::bigint)",
						  wait_key, NULL, &reg)))
			return rc;
		/* What refused us was seen before the registration was in place:
		 * try again now rather than miss its release's notification. Not
		 * registered, a release was checking for waiters just then (it
		 * holds the key for a moment): try again soon. */
		if (reg)
			ss->wait_key = wait_key;
		out->retry_ms = reg ? 0 : REG_RETRY_MS;
	}
	int mine = had_intent;
	if (!mine && !shared && permits == 1 && req->waiting) {
		/* Announce the waiting writer: hold the intent key on this connection
		 * (a waiter that already holds it keeps it). */
		char qttl[24];
		ms_setting(req->queue_ttl_ms, qttl, sizeof qttl);
		/* A writer that stops retrying (hung) must not block readers for
		 * ever: its session ends after a queue TTL without a statement. */
		if (key_query(&c, deadline,
			      PQserverVersion(c) >= 140000
				      ? "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock($1::bigint) AS ok)"
					" SELECT ok, CASE WHEN ok THEN"
					" set_config('idle_session_timeout', $2, false) END FROM l"
				      : "SELECT pg_try_advisory_lock($1::bigint), $2",
			      intent_key, qttl, &mine))
			return DLOCK_ELOCKED;
	}
	if (mine || ss->wait_key) {
		/* Keep the session for this waiter's next try. */
		intent *ni = calloc(1, sizeof *ni);
		if (!ni) {
			dlock__pg_drop_conn(&c, 0); /* its keys go with it */
			return DLOCK_ELOCKED;
		}
		snprintf(ni->owner, sizeof ni->owner, "%s", req->owner);
		ni->conn = c;
		ni->writer = mine;
		ni->next = be->intents;
		be->intents = ni;
		return DLOCK_ELOCKED;
	}
	pool_put(be, c);
	return DLOCK_ELOCKED;
}

/* Give up a hold's connection (its keys end with it), out of the hang-up
 * watch first: a socket the watch still polls stays open in the kernel. */
static void hold_drop(dlock_backend *base, adv_hold *h, int cancel)
{
	dlock_backend_unwatch_fd(base, PQsocket(h->conn));
	dlock__pg_drop_conn(&h->conn, cancel);
}

/*
 * A release that cannot be confirmed (timeout, broken connection, any error)
 * closes the hold's session: the server then frees every key it held, so
 * nothing outlives the release. A timeout says so (DLOCK_EUNAVAILABLE, "timed
 * out"); a session that was already gone held nothing (DLOCK_ENOTHELD).
 */
static int adv_release(dlock_backend *base, const dlock_request *req)
{
	postgres_store *be = (postgres_store *)base;
	adv_hold *h = req->slot;
	if (!h)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
				       "advisory locks live on their connection: this handle holds none");
	if (!h->conn) {
		free(h);
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
				       "the lock's connection was closed earlier (and the lock with it)");
	}
	dlock_backend_unwatch_fd(base, PQsocket(h->conn));
	int64_t deadline = req->deadline_ms;
	char k[24];
	dlock__pg_i64s(k, sizeof k, h->key);
	char cls[16], per[16];
	snprintf(cls, sizeof cls, "%" PRId32, h->sem_class);
	snprintf(per, sizeof per, "%u", h->sem_permits);
	char wk[24];
	dlock__pg_i64s(wk, sizeof wk, dlock__pg_adv_key(be->ns, req->name, "waiting"));
	const char *v[] = { k, h->shared ? "t" : "f", cls, per, be->ns, req->name, wk };
	PGresult *r;
	char body[768];
	/*
	 * Let the keys go, then notify only if a waiter holds the name's
	 * "waiting" key (taking it exclusively fails). A waiter registers before
	 * the try that precedes its wait (adv_acquire: a try refused unregistered
	 * is repeated at once), so either this check sees it or its try comes
	 * after the key was let go. A release nobody waits for writes nothing:
	 * NOTIFY costs a transaction id and a commit record, and woke the LISTEN
	 * thread of every waiting process.
	 */
	snprintf(body, sizeof body,
		 "SELECT was, CASE WHEN free THEN pg_advisory_unlock($7) END,"
		 " CASE WHEN NOT free THEN pg_notify('" CHANNEL
		 "', $5 || chr(31) || $6) END"
		 " FROM (SELECT was, pg_try_advisory_lock($7) AS free FROM"
		 "  (SELECT CASE WHEN $2 THEN pg_advisory_unlock_shared($1) ELSE pg_advisory_unlock($1) END AS was,"
		 "   CASE WHEN $3 <> 0 THEN pg_advisory_unlock_shared($3, $4) END%s,"
		 "   set_config('application_name', 'dlock', false) OFFSET 0) u OFFSET 0) w",
		 no_lease(h->conn));
	int rc = sess_run(&h->conn, deadline, "release", A_RELEASE, "bigint, boolean, int, int, text, text, bigint",
			  body, "", 7, v, &r);
	if (rc) {
		int gone = !h->conn || PQstatus(h->conn) != CONNECTION_OK;
		int tmo = rc == DLOCK_EUNAVAILABLE && strcmp(dlock_error_last()->store_code, "timeout") == 0;
		dlock__pg_drop_conn(&h->conn, 0);
		free(h);
		if (tmo)
			return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout",
					       "release: timed out; the lock's connection was closed, "
					       "so the server ends the lock with its session");
		return gone && rc == DLOCK_EUNAVAILABLE
			       ? dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
						 "the lock's connection was lost (and the lock with it)")
			       : rc;
	}
	int was = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	pool_put(be, h->conn);
	free(h);
	return was ? 0 : DLOCK_ENOTHELD;
}

static const char held_sql[] =
	"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
	" AND granted AND objsubid = 1 AND classid = $1::oid AND objid = $2::oid";

static void key_oids(int64_t key, char *hi, char *lo)
{
	uint64_t u = (uint64_t)key;
	snprintf(hi, 16, "%" PRIu32, (uint32_t)(u >> 32));
	snprintf(lo, 16, "%" PRIu32, (uint32_t)u);
}

/* A hold whose statement timed out has lost its connection (the late answer
 * must not be read later) and with it the lock: DLOCK_ENOTHELD. */
static int adv_extend(dlock_backend *base, const dlock_request *req, int64_t ttl_ms)
{
	(void)base;
	adv_hold *h = req->slot;
	if (!h || !h->conn)
		return DLOCK_ENOTHELD;
	int64_t deadline = req->deadline_ms;
	char hi[16], lo[16], ttl[24];
	key_oids(h->key, hi, lo);
	ms_setting(ttl_ms, ttl, sizeof ttl);
	int lease = PQserverVersion(h->conn) >= 140000;
	const char *v[] = { hi, lo, ttl };
	PGresult *r;
	char sql[768], tag[128], serial[24];
	hold_tag(tag, sizeof tag, serial, req->owner);
	/* Field 4 of application_name is the lease that status reports. */
	snprintf(sql, sizeof sql,
		 "%sSELECT (%s) > 0%s, set_config('application_name', regexp_replace("
		 "current_setting('application_name'), '^(dlock \\S+ \\S+) \\S+', '\\1 ' || $3), false)",
		 tag, held_sql, lease ? ", set_config('idle_session_timeout', $3, false)" : ", $3");
	int rc = dlock__pg_run(&h->conn, deadline, "extend", sql, 3, v, &r);
	if (rc)
		return h->conn && PQstatus(h->conn) == CONNECTION_OK ? rc : DLOCK_ENOTHELD;
	int ok = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return ok ? 0 : DLOCK_ENOTHELD;
}

/*
 * All holds at once: send every check, then collect the answers as they come
 * (one round trip overall), all by one deadline. A hold whose answer does not
 * come in time loses its connection (so no late answer is read later) and the
 * lock with it: DLOCK_ENOTHELD, which the core reports as lost.
 */
static int adv_renew(dlock_backend *base, const dlock_request *const *reqs, size_t n, int *results)
{
	(void)base;
	int64_t deadline = n ? reqs[0]->deadline_ms : dlock_clock_ms();
	struct pend {
		PGresult *last;
		int code;
		int state; /* 1 sent, 2 done, 0 nothing to do */
	} *pd = calloc(n ? n : 1, sizeof *pd);
	struct pollfd *pf = calloc(n ? n : 1, sizeof *pf);
	if (!pd || !pf) {
		free(pd);
		free(pf);
		return dlock_sys_oom();
	}
	for (size_t i = 0; i < n; i++) {
		adv_hold *h = reqs[i]->slot;
		results[i] = DLOCK_ENOTHELD;
		if (!h || !h->conn || PQstatus(h->conn) != CONNECTION_OK)
			continue;
		char hi[16], lo[16];
		key_oids(h->key, hi, lo);
		const char *v[] = { hi, lo };
		char sql[512], tag[128], serial[24];
		hold_tag(tag, sizeof tag, serial, reqs[i]->owner);
		snprintf(sql, sizeof sql, "%s%s", tag, held_sql);
		if (PQsendQueryParams(h->conn, sql, 2, NULL, v, NULL, NULL, 0))
			pd[i].state = 1;
		else
			hold_drop(base, h, 0);
	}
	for (;;) {
		nfds_t np = 0;
		for (size_t i = 0; i < n; i++) {
			adv_hold *h = reqs[i]->slot;
			pf[i].fd = -1;
			if (pd[i].state != 1)
				continue;
			int f = PQflush(h->conn);
			int s = f < 0 ? -1 : dlock__pg_q_step(h->conn, "renew", &pd[i].last, &pd[i].code);
			if (s == 0) {
				pf[i].fd = PQsocket(h->conn);
				pf[i].events = (short)(POLLIN | (f ? POLLOUT : 0));
				np++;
			} else {
				pd[i].state = s == 1 ? 2 : 0;
				if (s < 0)
					hold_drop(base, h, 0);
			}
		}
		int ms = dlock__pg_poll_ms(deadline);
		if (np == 0 || ms == 0)
			break;
		if (poll(pf, (nfds_t)n, ms) < 0 && errno != EINTR)
			break;
	}
	for (size_t i = 0; i < n; i++) {
		adv_hold *h = reqs[i]->slot;
		PGresult *last = pd[i].last;
		if (pd[i].state == 1) {
			/* No answer in time: the session is given up, and the lock with it. */
			hold_drop(base, h, 1);
			results[i] = DLOCK_ENOTHELD;
		} else if (pd[i].state == 2 && !pd[i].code && last && PQntuples(last) == 1) {
			results[i] = atoi(PQgetvalue(last, 0, 0)) > 0 ? 0 : DLOCK_ENOTHELD;
		} else if (pd[i].state == 2 && h->conn && PQstatus(h->conn) == CONNECTION_OK) {
			results[i] = pd[i].code ? pd[i].code : DLOCK_ESTORE;
		} else {
			results[i] = DLOCK_ENOTHELD; /* the session died: its locks died with it */
		}
		PQclear(last);
	}
	free(pd);
	free(pf);
	return 0;
}

static int adv_cancel(dlock_backend *base, const dlock_request *req)
{
	postgres_store *be = (postgres_store *)base;
	intent **ip = intent_find(be, req->owner), *in = *ip;
	if (!in)
		return 0;
	*ip = in->next;
	int64_t deadline = req->deadline_ms;
	char ik[24], wk[24];
	dlock__pg_i64s(ik, sizeof ik, dlock__pg_adv_key(be->ns, req->name, "writer-intent"));
	dlock__pg_i64s(wk, sizeof wk, sess_wait_key(in->conn));
	const char *v[] = { ik, be->ns, req->name, in->writer ? "t" : "f", wk };
	char sql[512];
	/* The waiter's keys go; readers that backed off for a writer's intent wake. */
	snprintf(sql, sizeof sql,
		 "SELECT CASE WHEN $4::boolean THEN pg_advisory_unlock($1::bigint) END,"
		 " CASE WHEN $5::bigint <> 0 THEN pg_advisory_unlock_shared($5::bigint) END%s,"
		 " CASE WHEN $4::boolean THEN pg_notify('" CHANNEL "', $2 || chr(31) || $3) END",
		 no_lease(in->conn));
	int rc = dlock__pg_run(&in->conn, deadline, "cancel", sql, 5, v, NULL);
	if (rc) {
		dlock__pg_drop_conn(&in->conn, 0); /* its keys go with the session */
	} else {
		adv_sess *ss = sess_of(in->conn);
		if (ss)
			ss->wait_key = 0;
		pool_put(be, in->conn);
	}
	free(in);
	return 0;
}

static int adv_status(dlock_backend *base, const char *const *names, size_t nnames, dlock_lock_status **out,
		      size_t *count)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	for (size_t i = 0; i < nnames; i++) {
		dlock_lock_status *s = dlock_sys_status_add(&st, &cnt);
		if (!s || !(s->name = dlock_sys_strdup(names[i]))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		s->permits = 1;
		char hi[16], lo[16];
		key_oids(dlock__pg_adv_key(be->ns, names[i], NULL), hi, lo);
		char ihi[16], ilo[16];
		key_oids(dlock__pg_adv_key(be->ns, names[i], "writer-intent"), ihi, ilo);
		const char *v[] = { hi, lo, be->ns, names[i], ihi, ilo };
		PGresult *r;
		/* application_name of a holder: "dlock <pid> <fence> <lease ms> <serial> <host>";
		 * the lease counts from the session's last statement (idle_session_timeout),
		 * whose text names the client (hold_tag; visible to the same role). A
		 * library older than schema version 4 wrote "dlock <pid> <fence> <lease>
		 * <host>" and named the whole owner in the statement. */
		rc = dlock__pg_run(&be->conn, deadline, "status",
				   "SELECT l.pid, l.mode, a.application_name,"
				   " floor(extract(epoch FROM (clock_timestamp() - a.state_change)) * 1000)::bigint,"
				   " (SELECT fence FROM dlock_locks WHERE ns = $3 AND name = $4),"
				   " (SELECT count(*) FROM pg_locks w WHERE w.locktype = 'advisory' AND w.granted"
				   "  AND w.objsubid = 1 AND w.classid = $5::oid AND w.objid = $6::oid),"
				   " substring(a.query FROM '^/\\* dlock-hold ([0-9a-fA-F-]+) \\*/')"
				   " FROM (SELECT 1) one LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted"
				   " AND l.objsubid = 1 AND l.classid = $1::oid AND l.objid = $2::oid"
				   " LEFT JOIN pg_stat_activity a ON a.pid = l.pid",
				   6, v, &r);
		if (rc)
			goto fail;
		for (int row = 0; row < PQntuples(r); row++) {
			if (!PQgetisnull(r, row, 4))
				s->last_fence = strtoull(PQgetvalue(r, row, 4), NULL, 10);
			s->waiters = (size_t)strtoul(PQgetvalue(r, row, 5), NULL, 10);
			if (PQgetisnull(r, row, 0))
				continue;
			dlock_holder *h = dlock_sys_status_add_holder(s);
			if (!h) {
				PQclear(r);
				rc = DLOCK_ENOMEM;
				goto fail;
			}
			h->mode = strcmp(PQgetvalue(r, row, 1), "ShareLock") == 0 ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
			h->ttl_left_ms = -1;
			int pid = 0, n = 0;
			unsigned long long fence = 0;
			long long lease = 0;
			const char *app = PQgetvalue(r, row, 2), *host = "";
			const char *tag = PQgetisnull(r, row, 6) ? NULL : PQgetvalue(r, row, 6);
			char serial[24] = "";
			if (sscanf(app, "dlock %d %llu %lld %n", &pid, &fence, &lease, &n) == 3) {
				h->pid = pid;
				h->fence = fence;
				/* fences come from one sequence, not from the name's row */
				if (fence > s->last_fence)
					s->last_fence = fence;
				if (lease > 0 && !PQgetisnull(r, row, 3))
					h->ttl_left_ms = lease - strtoll(PQgetvalue(r, row, 3), NULL, 10);
				host = app + n;
				size_t sl = strspn(host, "0123456789");
				if (tag && !strchr(tag, '-') && sl && sl < sizeof serial &&
				    (!host[sl] || host[sl] == ' ')) {
					memcpy(serial, host, sl);
					serial[sl] = 0;
					host += sl + (host[sl] == ' ');
				}
			}
			h->owner = !tag        ? dlock_sys_sprintf("backend-%s", PQgetvalue(r, row, 0))
				   : serial[0] ? dlock_sys_sprintf("%s-%s", tag, serial)
					       : dlock_sys_strdup(tag);
			if (!h->owner || !(h->host = dlock_sys_strdup(host))) {
				PQclear(r);
				rc = DLOCK_ENOMEM;
				goto fail;
			}
		}
		PQclear(r);
	}
	*out = st;
	*count = cnt;
	return 0;
fail:
	dlock_status_free(st, cnt);
	return rc;
}

/* mode=advisory: holds are session advisory locks of our connection. */
const dlock_backend_methods dlock__pg_advisory_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_SESSION,
	.acquire = adv_acquire,
	.release = adv_release,
	.renew = adv_renew,
	.extend = adv_extend,
	.watch = dlock__pg_watch,
	.unwatch = dlock__pg_unwatch,
	.cancel = adv_cancel,
	.status = adv_status,
	.close = dlock__pg_close,
};
