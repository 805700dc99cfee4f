/*
 * PostgreSQL store (libpq): postgres://user:pass@host:port/db[?mode=table|advisory]
 *
 * mode=table (default): leases in tables, judged only by the server's clock
 * (clock_timestamp()); the client's clock never appears in SQL. Waiters are
 * woken by LISTEN/NOTIFY on one dedicated connection.
 * mode=advisory: pg_try_advisory_lock on a connection held for the lock's
 * life (req->slot), with idle_session_timeout as a server-side lease.
 * See docs/stores/postgres.md for the failure model.
 */
#include "support.h"

#include <libpq-fe.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KIND "postgres"
#define SCHEMA_VERSION 2 /* 2: dlock_acquire_v1 applies the permits rule */
#define STR_(x) #x
#define STR(x) STR_(x)
#define CHANNEL "dlock_wake"
#define NBUCKETS 256
#define NMARKS 64
#define POOL_MAX 8
/* TCP settings of every connection (see connect_db). */
#define KEEPALIVE_IDLE_S 5
#define KEEPALIVE_INTERVAL_S 2
#define KEEPALIVE_COUNT 3
#define TCP_USER_TIMEOUT_MS 10000
/* pg_advisory_xact_lock key that serialises schema creation ("dlockSCH"). */
#define SCHEMA_LOCK_KEY "7236281174070608712"

typedef struct mark {
	char owner[64];
	uint64_t gen;
	uint64_t used;
} mark;

typedef struct pg_backend {
	dlock_backend base;
	char *host, *port, *user, *password, *dbname, *sslmode;
	char *sslrootcert, *sslcert, *sslkey; /* TLS files, passed to libpq as they are */
	char *ns;
	int advisory;
	int64_t connect_timeout_ms; /* bound of one connect (and of the open) */
	int64_t request_timeout_ms; /* bound of status, and of a call without a deadline */
	PGconn *conn; /* under the store mutex */
	unsigned prepared; /* bits of stmts[] prepared on conn */

	/* LISTEN connection and its thread; everything below under lmu */
	pthread_mutex_t lmu;
	pthread_cond_t lcv;
	PGconn *lconn;
	int lthread_on, lstop;
	pthread_t lthread;
	int wakefd[2];
	uint64_t gen;
	uint64_t bucket_gen[NBUCKETS];
	mark marks[NMARKS];
	uint64_t mark_clock;

	/* advisory mode: idle connections, and waiting writers' intent connections */
	PGconn *pool[POOL_MAX];
	int npool;
	struct intent *intents;
} pg_backend;

/* A waiting writer in advisory mode holds the name's "writer intent" key on
 * its own connection so that new readers back off (writer preference). */
typedef struct intent {
	struct intent *next;
	char owner[64];
	PGconn *conn;
} intent;

/* Per-hold state in advisory mode (req->slot). */
typedef struct adv_hold {
	PGconn *conn;
	int64_t key;
	int shared;
	int32_t sem_class;  /* a semaphore hold: its (class, permits) key, shared; else 0 */
	unsigned sem_permits;
} adv_hold;

/* ---------------------------------------------------------------- errors */

static int code_for_sqlstate(const char *st)
{
	if (!st)
		return DLOCK_ESTORE;
	/* Connection trouble, shutdown, too many connections, and transaction
	 * rollbacks (deadlock detected, serialization failure) are transient:
	 * the core retries them. */
	if (strncmp(st, "08", 2) == 0 || strncmp(st, "57P", 3) == 0 || strcmp(st, "53300") == 0 ||
	    strncmp(st, "40", 2) == 0)
		return DLOCK_EUNAVAILABLE;
	if (strncmp(st, "28", 2) == 0 || strcmp(st, "42501") == 0)
		return DLOCK_EAUTH;
	return DLOCK_ESTORE;
}

static void chomp(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
		s[--n] = 0;
}

/* Record the error of a failed query (res may be NULL) and return its code. */
static int query_error(PGconn *c, PGresult *res, const char *what)
{
	const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	int code = code_for_sqlstate(st);
	char msg[512];
	snprintf(msg, sizeof msg, "%s", res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res)
									  : PQerrorMessage(c));
	chomp(msg);
	if (PQstatus(c) == CONNECTION_BAD)
		code = DLOCK_EUNAVAILABLE;
	return dlock_error_set(code, KIND, st ? st : "", "%s: %s", what, msg);
}

/* ------------------------------------------------------------ connections */

/* A timed-out statement may still run on the server (or a stopped backend
 * may run it when it wakes): ask the server to cancel it. libpq 15's
 * PQcancel blocks (connect, send, wait for the close) with no time limit, so
 * it runs on a detached thread of its own that owns nothing but the PGcancel;
 * the caller never waits for it. A few at most at a time (a black-holed
 * server would keep each one until the connection dies). */
#define CANCELS_MAX 4
static atomic_int cancels_running;

static void *cancel_main(void *arg)
{
	PGcancel *k = arg;
	char err[256];
	PQcancel(k, err, sizeof err);
	PQfreeCancel(k);
	atomic_fetch_sub(&cancels_running, 1);
	return NULL;
}

static void cancel_async(PGconn *c)
{
	if (atomic_fetch_add(&cancels_running, 1) >= CANCELS_MAX) {
		atomic_fetch_sub(&cancels_running, 1);
		return;
	}
	PGcancel *k = PQgetCancel(c);
	pthread_attr_t a;
	pthread_t t;
	int ok = k && pthread_attr_init(&a) == 0;
	if (ok) {
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&t, &a, cancel_main, k) == 0;
		pthread_attr_destroy(&a);
	}
	if (!ok) {
		PQfreeCancel(k);
		atomic_fetch_sub(&cancels_running, 1);
	}
}

/* Close *cp and forget it, cancelling the statement in flight if asked:
 * nothing it sends later can be read as the answer to another request. */
static void drop_conn(PGconn **cp, int cancel)
{
	PGconn *c = *cp;
	*cp = NULL;
	if (!c)
		return;
	if (cancel && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_ACTIVE)
		cancel_async(c);
	PQfinish(c);
}

static int timed_out(const char *what, const char *detail)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout", "%s: timed out %s", what, detail);
}

/* The deadline of an acquire: the core's; a waiting try with too little of
 * it left sends nothing and says "not acquired" (see "Time" in sys/backend.h). */
static int acquire_deadline(const pg_backend *be, const dlock_request *req, int64_t *deadline)
{
	*deadline = req->deadline_ms;
	if (!dlock_try_too_late(req, be->request_timeout_ms))
		return 0;
	return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "acquire: no time left for another try");
}

static int poll_ms(int64_t deadline)
{
	int64_t left = deadline - dlock_clock_ms();
	return left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
}

/*
 * Connect, bounded by `deadline` (CLOCK_MONOTONIC ms) in total: the name is
 * resolved by the deadline (dlock__resolve), and every step after it (TCP,
 * TLS, authentication) is driven by PQconnectPoll and poll,
 * so the bound holds in milliseconds; libpq's own connect_timeout (whole
 * seconds, at least 2) is only a second line, cut to the time left.
 */
static PGconn *connect_db(pg_backend *be, int64_t deadline, int *code)
{
	const char *keys[24], *vals[24];
	int n = 0;
	int64_t left = deadline - dlock_clock_ms();
	if (left <= 0) {
		*code = timed_out("connect", "before the connection could start");
		return NULL;
	}
	char cts[24];
	snprintf(cts, sizeof cts, "%" PRId64, (left + 999) / 1000 < 2 ? 2 : (left + 999) / 1000);
#define KV(k, v)                  \
	do {                      \
		if (v) {          \
			keys[n] = k; \
			vals[n++] = v; \
		}                 \
	} while (0)
	/* libpq resolves with a blocking getaddrinfo: resolve by the deadline and
	 * give it `hostaddr`, keeping `host` for TLS verification (verify-full)
	 * and .pgpass; one host entry per address, tried in order */
	dlock__addrs ad = { 0 };
	char hostaddr[DLOCK__ADDRS_MAX * DLOCK__ADDR_LEN], hosts[DLOCK__ADDRS_MAX * 257];
	if (be->host) {
		int rc = dlock__resolve(&ad, be->host, deadline, KIND);
		if (rc) {
			*code = rc;
			return NULL;
		}
		dlock__addrs_join(hostaddr, sizeof hostaddr, &ad, ",");
		size_t len = 0;
		hosts[0] = '\0';
		for (size_t i = 0; i < ad.n && len < sizeof hosts; i++)
			len += (size_t)snprintf(hosts + len, sizeof hosts - len, "%s%s", i ? "," : "", be->host);
	}
	if (be->host && ad.n) {
		keys[n] = "host";
		vals[n++] = hosts;
		keys[n] = "hostaddr";
		vals[n++] = hostaddr;
	} else {
		KV("host", be->host);
	}
	KV("port", be->port);
	KV("user", be->user);
	KV("password", be->password);
	KV("dbname", be->dbname);
	KV("sslmode", be->sslmode);
	KV("sslrootcert", be->sslrootcert);
	KV("sslcert", be->sslcert);
	KV("sslkey", be->sslkey);
	keys[n] = "connect_timeout";
	vals[n++] = cts;
	KV("application_name", "dlock");
	/* A dead peer must not keep a connection (and its advisory locks):
	 * keepalives, and unacknowledged data given up after TCP_USER_TIMEOUT. */
	KV("keepalives", "1");
	KV("keepalives_idle", STR(KEEPALIVE_IDLE_S));
	KV("keepalives_interval", STR(KEEPALIVE_INTERVAL_S));
	KV("keepalives_count", STR(KEEPALIVE_COUNT));
	KV("tcp_user_timeout", STR(TCP_USER_TIMEOUT_MS));
	keys[n] = NULL;
	vals[n] = NULL;
#undef KV
	PGconn *c = PQconnectStartParams(keys, vals, 0);
	if (!c) {
		*code = dlock__oom();
		return NULL;
	}
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;
	while (PQstatus(c) != CONNECTION_BAD && st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
		int ms = poll_ms(deadline);
		if (ms == 0) {
			*code = timed_out("connect", "(connect_timeout or the call's deadline)");
			PQfinish(c);
			return NULL;
		}
		struct pollfd p = { PQsocket(c), st == PGRES_POLLING_READING ? POLLIN : POLLOUT, 0 };
		int pn = poll(&p, 1, ms);
		if (pn < 0 && errno != EINTR)
			break;
		if (pn > 0)
			st = PQconnectPoll(c);
	}
	if (PQstatus(c) != CONNECTION_OK) {
		char msg[512];
		snprintf(msg, sizeof msg, "%s", PQerrorMessage(c));
		chomp(msg);
		int auth = strstr(msg, "authentication failed") || strstr(msg, "no password supplied") ||
			   strstr(msg, "role") || strstr(msg, "permission denied") ||
			   strstr(msg, "pg_hba.conf");
		int nodb = strstr(msg, "database") && strstr(msg, "does not exist");
		*code = dlock_error_set(nodb ? DLOCK_EINVAL : auth ? DLOCK_EAUTH : DLOCK_EUNAVAILABLE, KIND, "",
					"connect to %s:%s: %s", be->host ? be->host : "localhost",
					be->port ? be->port : "5432", msg);
		PQfinish(c);
		return NULL;
	}
	/* Every wait is ours (poll with a deadline); libpq never blocks. */
	PQsetnonblocking(c, 1);
	return c;
}

/* An idle session has nothing to say; anything readable is most likely the
 * server closing it (restart, pg_terminate_backend, a timeout). */
static int idle_ok(PGconn *c)
{
	struct pollfd p = { PQsocket(c), POLLIN, 0 };
	return PQstatus(c) == CONNECTION_OK && p.fd >= 0 && poll(&p, 1, 0) == 0;
}

/* The main connection, reconnected (by `deadline`) if it broke or was dropped. */
static int main_conn(pg_backend *be, int64_t deadline, PGconn **out)
{
	if (be->conn && !idle_ok(be->conn))
		drop_conn(&be->conn, 0);
	if (!be->conn) {
		int code = 0;
		be->conn = connect_db(be, deadline, &code);
		be->prepared = 0;
		if (!be->conn)
			return code;
	}
	*out = be->conn;
	return 0;
}

/* Take what the server sent so far: 1 when the command is complete (*last
 * is its last result, *code its first error), 0 when more is to come, -1
 * when the connection failed. Never blocks. */
static int q_step(PGconn *c, const char *what, PGresult **last, int *code)
{
	if (!PQconsumeInput(c))
		return -1;
	while (!PQisBusy(c)) {
		PGresult *r = PQgetResult(c);
		if (!r)
			return 1;
		ExecStatusType s = PQresultStatus(r);
		if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK) {
			PQclear(*last);
			*last = r;
		} else {
			if (!*code)
				*code = query_error(c, r, what);
			PQclear(r);
		}
	}
	return 0;
}

/*
 * Finish the command just sent on *cp (sent = what PQsend* returned) by
 * `deadline`: 0 and *out (its last result, or cleared if out is NULL), or an
 * error. When the deadline passes, the statement is cancelled and the
 * connection dropped (*cp = NULL): its late reply must never be read as the
 * answer to a later request. A broken connection is dropped too.
 */
static int q_finish(PGconn **cp, int64_t deadline, const char *what, int sent, PGresult **out)
{
	PGconn *c = *cp;
	PGresult *last = NULL;
	int code = 0, s = -1;
	if (out)
		*out = NULL;
	if (sent) {
		for (;;) {
			int f = PQflush(c);
			if (f < 0)
				break;
			if ((s = q_step(c, what, &last, &code)) != 0)
				break;
			int ms = poll_ms(deadline);
			if (ms == 0)
				break;
			struct pollfd p = { PQsocket(c), (short)(POLLIN | (f ? POLLOUT : 0)), 0 };
			if (p.fd < 0 || (poll(&p, 1, ms) < 0 && errno != EINTR)) {
				s = -1;
				break;
			}
		}
	}
	if (s == 1 && !code) {
		if (out)
			*out = last;
		else
			PQclear(last);
		return 0;
	}
	PQclear(last);
	if (s == 0) {
		code = timed_out(what, "waiting for the server's reply (connection dropped)");
		drop_conn(cp, 1);
		return code;
	}
	if (s < 0 || PQstatus(c) != CONNECTION_OK) {
		/* The connection broke (its error result, if any, is the message). */
		if (!code)
			code = query_error(c, NULL, what);
		if (code != DLOCK_EUNAVAILABLE) {
			char msg[512];
			snprintf(msg, sizeof msg, "%s", dlock_error_last()->message);
			code = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "", "%s", msg);
		}
		drop_conn(cp, 0);
	}
	return code;
}

/* Run one statement with parameters on *cp by `deadline`; *out gets the result. */
static int run(PGconn **cp, int64_t deadline, const char *what, const char *sql, int n,
	       const char *const *vals, PGresult **out)
{
	int sent = PQsendQueryParams(*cp, sql, n, NULL, vals, NULL, NULL, 0);
	return q_finish(cp, deadline, what, sent, out);
}

/*
 * The statements of every acquire and release, prepared once per main
 * connection: an unnamed PQexecParams is parsed, analysed and planned by the
 * server on every call (base_yyparse and the planner were the top server
 * symbols in `perf record` of an uncontended run).
 */
enum { S_ACQUIRE, S_RELEASE, S_COUNT };
static const struct {
	const char *name, *sql;
	int nparams;
} stmts[S_COUNT] = {
	[S_ACQUIRE] = { "dlock_acquire",
			"SELECT o_fence, o_retry_ms FROM dlock_acquire_v1($1, $2, $3, $4::int, $5::int,"
			" $6::bigint, $7::boolean, $8::boolean, $9::bigint, $10, $11::int)", 11 },
	/* Delete our row even if it expired (tidy), but only a live one counts.
	 * The NOTIFY is sent at commit, after the row is gone. */
	[S_RELEASE] = { "dlock_release",
			"WITH d AS (DELETE FROM dlock_holders WHERE ns = $1 AND name = $2 AND owner = $3"
			" RETURNING expires > clock_timestamp() AS live)"
			" SELECT d.live, pg_notify('" CHANNEL "', $1 || chr(31) || $2) FROM d", 3 },
};

/* Run stmts[which] on the main connection by `deadline`, preparing it there first if needed. */
static int run_stmt(pg_backend *be, int64_t deadline, int which, const char *what,
		    const char *const *vals, PGresult **out)
{
	*out = NULL;
	if (!(be->prepared & (1u << which))) {
		int sent = PQsendPrepare(be->conn, stmts[which].name, stmts[which].sql,
					 stmts[which].nparams, NULL);
		int code = q_finish(&be->conn, deadline, what, sent, NULL);
		if (code)
			return code;
		be->prepared |= 1u << which;
	}
	int sent = PQsendQueryPrepared(be->conn, stmts[which].name, stmts[which].nparams, vals, NULL,
				       NULL, 0);
	return q_finish(&be->conn, deadline, what, sent, out);
}

/* Several statements without parameters (the simple query protocol). */
static int run_script(PGconn **cp, int64_t deadline, const char *what, const char *sql)
{
	return q_finish(cp, deadline, what, PQsendQuery(*cp, sql), NULL);
}

/* ----------------------------------------------------------------- schema */

/*
 * Why a function and not one bare INSERT … ON CONFLICT: in READ COMMITTED a
 * single statement re-reads only the conflicting row at its latest version;
 * anything else it reads (other holders, waiters) comes from its start
 * snapshot, so two concurrent shared/semaphore acquires could both count a
 * stale holder set. The function first locks the name's counter row (never
 * deleted), and each later statement in it takes a fresh snapshot, so the
 * check-then-insert is serialised per name. The client still sends one
 * statement per acquire. Expiry is always clock_timestamp() on the server.
 */
static const char schema_sql[] =
	"CREATE TABLE IF NOT EXISTS dlock_schema (component text PRIMARY KEY, version int NOT NULL);"
	"CREATE TABLE IF NOT EXISTS dlock_locks ("
	" ns text NOT NULL, name text NOT NULL, fence bigint NOT NULL DEFAULT 0,"
	" PRIMARY KEY (ns, name));"
	"CREATE TABLE IF NOT EXISTS dlock_holders ("
	" ns text NOT NULL, name text NOT NULL, owner text NOT NULL, mode smallint NOT NULL,"
	" permits int NOT NULL, fence bigint NOT NULL, expires timestamptz NOT NULL,"
	" host text NOT NULL DEFAULT '', pid int NOT NULL DEFAULT 0,"
	" PRIMARY KEY (ns, name, owner));"
	"CREATE TABLE IF NOT EXISTS dlock_waiters ("
	" ns text NOT NULL, name text NOT NULL, owner text NOT NULL, mode smallint NOT NULL,"
	" fair boolean NOT NULL, seq bigserial, expires timestamptz NOT NULL,"
	" PRIMARY KEY (ns, name, owner));"
	"CREATE OR REPLACE FUNCTION dlock_acquire_v1(p_ns text, p_name text, p_owner text,"
	" p_mode int, p_permits int, p_ttl_ms bigint, p_waiting boolean, p_fair boolean,"
	" p_queue_ttl_ms bigint, p_host text, p_pid int, OUT o_fence bigint, OUT o_retry_ms bigint)"
	" LANGUAGE plpgsql AS $f$\n"
	"DECLARE\n"
	" t timestamptz; f bigint; n int; bad int; lim int; exp_min timestamptz; my_seq bigint;\n"
	" writers_ahead int; fair_ahead int; wexp timestamptz; ok boolean;\n"
	"BEGIN\n"
	" INSERT INTO dlock_locks (ns, name) VALUES (p_ns, p_name) ON CONFLICT DO NOTHING;\n"
	" SELECT l.fence INTO f FROM dlock_locks l WHERE l.ns = p_ns AND l.name = p_name FOR UPDATE;\n"
	" t := clock_timestamp();\n"
	" DELETE FROM dlock_holders h WHERE h.ns = p_ns AND h.name = p_name AND h.expires <= t;\n"
	" DELETE FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name AND w.expires <= t;\n"
	/* A repeated request of a live holder (a retry after a lost reply) keeps its grant. */
	" UPDATE dlock_holders h SET expires = t + p_ttl_ms * interval '1 millisecond'\n"
	"  WHERE h.ns = p_ns AND h.name = p_name AND h.owner = p_owner RETURNING h.fence INTO o_fence;\n"
	" IF FOUND THEN o_retry_ms := 0; RETURN; END IF;\n"
	" SELECT count(*), count(*) FILTER (WHERE h.mode <> p_mode),\n"
	"  least(p_permits, min(h.permits) FILTER (WHERE h.mode = 0)), min(h.expires)\n"
	"  INTO n, bad, lim, exp_min\n"
	"  FROM dlock_holders h WHERE h.ns = p_ns AND h.name = p_name;\n"
	" SELECT w.seq INTO my_seq FROM dlock_waiters w\n"
	"  WHERE w.ns = p_ns AND w.name = p_name AND w.owner = p_owner;\n"
	/* Waiters registered before us (all of them if we are not registered). */
	" SELECT count(*) FILTER (WHERE w.mode = 0), count(*) FILTER (WHERE w.fair), min(w.expires)\n"
	"  INTO writers_ahead, fair_ahead, wexp FROM dlock_waiters w\n"
	"  WHERE w.ns = p_ns AND w.name = p_name AND w.owner <> p_owner\n"
	"  AND (my_seq IS NULL OR w.seq < my_seq);\n"
	" IF p_mode = 1 THEN\n"
	/* shared: no exclusive holder, no writer waiting ahead (writer preference) */
	"  ok := bad = 0 AND writers_ahead = 0;\n"
	" ELSE\n"
	/* exclusive/semaphore: the permits rule (holders + 1 <= the smallest
	 * permits among the holders and the caller; a mutex holder admits
	 * nobody), and a free permit that no earlier fair waiter is owed */
	"  ok := bad = 0 AND n < lim AND fair_ahead < lim - n;\n"
	" END IF;\n"
	" IF ok THEN\n"
	"  f := f + 1;\n"
	"  UPDATE dlock_locks l SET fence = f WHERE l.ns = p_ns AND l.name = p_name;\n"
	"  INSERT INTO dlock_holders (ns, name, owner, mode, permits, fence, expires, host, pid)\n"
	"   VALUES (p_ns, p_name, p_owner, p_mode, p_permits, f,\n"
	"           t + p_ttl_ms * interval '1 millisecond', p_host, p_pid);\n"
	"  DELETE FROM dlock_waiters w WHERE w.ns = p_ns AND w.name = p_name AND w.owner = p_owner;\n"
	"  o_fence := f; o_retry_ms := 0; RETURN;\n"
	" END IF;\n"
	" IF p_waiting THEN\n"
	"  INSERT INTO dlock_waiters AS w (ns, name, owner, mode, fair, expires)\n"
	"   VALUES (p_ns, p_name, p_owner, p_mode, p_fair, t + p_queue_ttl_ms * interval '1 millisecond')\n"
	"   ON CONFLICT (ns, name, owner) DO UPDATE\n"
	"   SET expires = EXCLUDED.expires, mode = EXCLUDED.mode, fair = EXCLUDED.fair;\n"
	" END IF;\n"
	" o_fence := 0;\n"
	" o_retry_ms := ceil(extract(epoch FROM (coalesce(exp_min, wexp, t) - t)) * 1000)::bigint;\n"
	"END\n$f$;"
	"INSERT INTO dlock_schema VALUES ('dlock', " STR(SCHEMA_VERSION) ")"
	" ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version;";

static int ensure_schema(pg_backend *be, int64_t deadline)
{
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	PGresult *r = NULL;
	rc = run(&be->conn, deadline, "read schema version",
		 "SELECT version FROM dlock_schema WHERE component = 'dlock'", 0, NULL, &r);
	if (rc == 0 && PQntuples(r) == 1) {
		int v = atoi(PQgetvalue(r, 0, 0));
		PQclear(r);
		if (v == SCHEMA_VERSION)
			return 0;
		if (v > SCHEMA_VERSION)
			return dlock_error_set(DLOCK_ESTORE, KIND, "",
					       "dlock schema version %d in the database is newer than "
					       "this library's (%d)", v, SCHEMA_VERSION);
	} else {
		PQclear(r);
	}
	/* No table yet is an error of the statement; a dead connection is not. */
	if (!be->conn)
		return rc;
	/* Serialise concurrent creators; CREATE … IF NOT EXISTS alone can race. */
	if ((rc = run(&be->conn, deadline, "create schema", "BEGIN", 0, NULL, NULL)))
		return rc;
	if ((rc = run(&be->conn, deadline, "create schema",
		      "SELECT pg_advisory_xact_lock(" SCHEMA_LOCK_KEY ")", 0, NULL, NULL)) ||
	    (rc = run_script(&be->conn, deadline, "create schema", schema_sql)) ||
	    (rc = run(&be->conn, deadline, "create schema", "COMMIT", 0, NULL, NULL))) {
		if (be->conn) {
			dlock__saved_error saved;
			dlock__error_save(&saved);
			run(&be->conn, deadline, "create schema", "ROLLBACK", 0, NULL, NULL);
			dlock__error_restore(&saved);
		}
		return rc;
	}
	return 0;
}

/* ------------------------------------------------------- keys and buckets */


/* The advisory key of (prefix, name, slot): FNV-1a 64 over
 * prefix NUL name [NUL "slot"] — stable across versions, platforms and
 * servers (unlike hashtext). */
static int64_t adv_key(const char *ns, const char *name, const char *slot)
{
	uint64_t h = dlock__fnv1a64(DLOCK__FNV64_OFFSET, ns, strlen(ns) + 1);
	h = dlock__fnv1a64(h, name, strlen(name));
	if (slot) {
		h = dlock__fnv1a64(h, "", 1);
		h = dlock__fnv1a64(h, slot, strlen(slot));
	}
	return (int64_t)h;
}

static unsigned bucket_of(const char *payload, size_t len)
{
	return (unsigned)(dlock__fnv1a64(DLOCK__FNV64_OFFSET, payload, len) % NBUCKETS);
}

static unsigned bucket_for(pg_backend *be, const char *name)
{
	/* The NOTIFY payload is ns || chr(31) || name. */
	uint64_t h = dlock__fnv1a64(DLOCK__FNV64_OFFSET, be->ns, strlen(be->ns));
	h = dlock__fnv1a64(h, "\x1f", 1);
	h = dlock__fnv1a64(h, name, strlen(name));
	return (unsigned)(h % NBUCKETS);
}

/* -------------------------------------------------------- LISTEN / NOTIFY */

static void drain_notifies(pg_backend *be)
{
	PGnotify *n;
	while ((n = PQnotifies(be->lconn))) {
		be->bucket_gen[bucket_of(n->extra, strlen(n->extra))] = ++be->gen;
		PQfreemem(n);
	}
}

/* Missed notifications (a broken LISTEN connection): wake everyone. */
static void wake_all(pg_backend *be)
{
	be->gen++;
	for (int i = 0; i < NBUCKETS; i++)
		be->bucket_gen[i] = be->gen;
}

/* A new LISTEN connection in *out, by `deadline`. */
static int listen_connect(pg_backend *be, int64_t deadline, PGconn **out)
{
	int code = 0;
	PGconn *c = connect_db(be, deadline, &code);
	if (!c)
		return code;
	if ((code = run(&c, deadline, "LISTEN", "LISTEN " CHANNEL, 0, NULL, NULL))) {
		drop_conn(&c, 0);
		return code;
	}
	*out = c;
	return 0;
}

/* The LISTEN thread. It reconnects without lmu (waiters keep their own
 * timeouts meanwhile), each connect bounded by connect_timeout. */
static void *listener(void *arg)
{
	pg_backend *be = arg;
	pthread_mutex_lock(&be->lmu);
	while (!be->lstop) {
		struct pollfd p[2] = { { be->wakefd[0], POLLIN, 0 }, { -1, POLLIN, 0 } };
		PGconn *lc = be->lconn;
		if (lc)
			p[1].fd = PQsocket(lc);
		pthread_mutex_unlock(&be->lmu);
		if (!lc) {
			PGconn *c = NULL;
			int rc = listen_connect(be, dlock_clock_ms() + be->connect_timeout_ms, &c);
			pthread_mutex_lock(&be->lmu);
			if (rc == 0) {
				be->lconn = c;
				wake_all(be);
				pthread_cond_broadcast(&be->lcv);
				continue;
			}
			pthread_mutex_unlock(&be->lmu);
		}
		/* Without a connection, try again in a second (or when closed). */
		int n = poll(p, 2, lc ? -1 : 1000);
		pthread_mutex_lock(&be->lmu);
		if (be->lstop)
			break;
		if (n < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			char buf[16];
			while (read(be->wakefd[0], buf, sizeof buf) > 0) {
			}
		}
		if (lc && p[1].revents) {
			if (!PQconsumeInput(be->lconn) || PQstatus(be->lconn) != CONNECTION_OK) {
				drop_conn(&be->lconn, 0);
				wake_all(be);
			} else {
				drain_notifies(be);
			}
		}
		pthread_cond_broadcast(&be->lcv);
	}
	pthread_mutex_unlock(&be->lmu);
	return NULL;
}

/*
 * Make sure the LISTEN thread runs (before an acquire whose refusal we may
 * wait on). It connects on its own, so no call waits for that connect: a
 * notification sent before its LISTEN is in place is covered by the
 * wake-up of every waiter that follows each (re)connect.
 */
static int listen_ensure(pg_backend *be)
{
	int rc = 0;
	pthread_mutex_lock(&be->lmu);
	if (!be->lthread_on && !be->lstop) {
		if (pthread_create(&be->lthread, NULL, listener, be) == 0)
			be->lthread_on = 1;
		else
			rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "cannot start the LISTEN thread");
	}
	pthread_mutex_unlock(&be->lmu);
	return rc;
}

static mark *mark_find(pg_backend *be, const char *owner, int create)
{
	mark *old = &be->marks[0];
	for (int i = 0; i < NMARKS; i++) {
		if (be->marks[i].used && strcmp(be->marks[i].owner, owner) == 0)
			return &be->marks[i];
		if (be->marks[i].used < old->used)
			old = &be->marks[i];
	}
	if (!create)
		return NULL;
	snprintf(old->owner, sizeof old->owner, "%s", owner);
	return old;
}

/*
 * Remember the notification generation of req's bucket from before the
 * acquire is sent: a release after the acquire's check notifies after this
 * point, so wait() sees it even if it arrived before wait() was called.
 */
static void mark_before_try(pg_backend *be, const dlock_request *req)
{
	/* Without a LISTEN thread the waiter falls back to its timeout. */
	dlock__saved_error saved;
	dlock__error_save(&saved);
	int rc = listen_ensure(be);
	dlock__error_restore(&saved);
	if (rc)
		return;
	pthread_mutex_lock(&be->lmu);
	mark *m = mark_find(be, req->owner, 1);
	m->gen = be->bucket_gen[bucket_for(be, req->name)];
	m->used = ++be->mark_clock;
	pthread_mutex_unlock(&be->lmu);
}

static void mark_forget(pg_backend *be, const dlock_request *req)
{
	pthread_mutex_lock(&be->lmu);
	mark *m = mark_find(be, req->owner, 0);
	if (m)
		m->used = 0;
	pthread_mutex_unlock(&be->lmu);
}

static int pg_wait(dlock_backend *base, dlock_request *req, int64_t timeout_ms)
{
	pg_backend *be = (pg_backend *)base;
	int64_t end = dlock_clock_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
	if (listen_ensure(be) != 0) {
		/* No LISTEN thread: the core backs off by timeout alone. */
		int64_t left = end - dlock_clock_ms();
		dlock__sleep_ms(left < 0 ? 0 : left < 100 ? left : 100);
		return 0;
	}
	pthread_mutex_lock(&be->lmu);
	unsigned b = bucket_for(be, req->name);
	mark *m = mark_find(be, req->owner, 0);
	uint64_t g0 = m ? m->gen : be->bucket_gen[b];
	while (be->bucket_gen[b] <= g0 && !be->lstop) {
		int64_t left = end - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&be->lcv, &be->lmu, &ts);
	}
	pthread_mutex_unlock(&be->lmu);
	return 0;
}

/* ------------------------------------------------------------- table mode */

static void i64s(char *buf, size_t n, int64_t v)
{
	snprintf(buf, n, "%" PRId64, v);
}

static int tbl_acquire(dlock_backend *base, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline;
	int rc = acquire_deadline(be, req, &deadline);
	PGconn *c = NULL;
	if (rc || (rc = main_conn(be, deadline, &c)))
		return rc;
	if (req->waiting)
		mark_before_try(be, req);
	char mode[4], permits[16], ttl[24], qttl[24], pid[16];
	snprintf(mode, sizeof mode, "%d", req->mode == DLOCK_SHARED ? 1 : 0);
	snprintf(permits, sizeof permits, "%u", req->permits);
	i64s(ttl, sizeof ttl, req->ttl_ms);
	i64s(qttl, sizeof qttl, req->queue_ttl_ms);
	snprintf(pid, sizeof pid, "%d", req->pid);
	const char *v[] = { be->ns, req->name, req->owner, mode, permits, ttl,
			    req->waiting ? "t" : "f", req->fair ? "t" : "f", qttl,
			    req->host ? req->host : "", pid };
	PGresult *r;
	rc = run_stmt(be, deadline, S_ACQUIRE, "acquire", v, &r);
	if (rc)
		return rc;
	uint64_t f = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
	int64_t retry = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
	PQclear(r);
	if (f == 0) {
		if (retry_ms && retry > 0)
			*retry_ms = retry;
		return DLOCK_ELOCKED;
	}
	*fence = f;
	if (req->waiting)
		mark_forget(be, req);
	return 0;
}

static int tbl_release(dlock_backend *base, dlock_request *req)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	const char *v[] = { be->ns, req->name, req->owner };
	PGresult *r;
	rc = run_stmt(be, deadline, S_RELEASE, "release", v, &r);
	if (rc)
		return rc;
	int live = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return live ? 0 : DLOCK_ENOTHELD;
}

static int tbl_extend(dlock_backend *base, dlock_request *req, int64_t ttl_ms)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	char ttl[24];
	i64s(ttl, sizeof ttl, ttl_ms);
	const char *v[] = { be->ns, req->name, req->owner, ttl };
	PGresult *r;
	rc = run(&be->conn, deadline, "extend",
		 "UPDATE dlock_holders SET expires = clock_timestamp() + $4::bigint * interval '1 millisecond'"
		 " WHERE ns = $1 AND name = $2 AND owner = $3 AND expires > clock_timestamp() RETURNING 1",
		 4, v, &r);
	if (rc)
		return rc;
	int ok = PQntuples(r) == 1;
	PQclear(r);
	return ok ? 0 : DLOCK_ENOTHELD;
}

/* Append s as one element of a PostgreSQL array literal. */
static int arr_add(char **buf, size_t *len, size_t *cap, const char *s)
{
	size_t need = *len + 2 * strlen(s) + 4;
	if (need > *cap) {
		size_t nc = need * 2 + 64;
		char *nb = realloc(*buf, nc);
		if (!nb)
			return dlock__oom();
		*buf = nb;
		*cap = nc;
	}
	char *p = *buf + *len;
	if (*len > 1)
		*p++ = ',';
	*p++ = '"';
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			*p++ = '\\';
		*p++ = *s;
	}
	*p++ = '"';
	*p = 0;
	*len = (size_t)(p - *buf);
	return 0;
}

typedef struct arr {
	char *buf;
	size_t len, cap;
} arr;

static int arr_init(arr *a)
{
	a->buf = malloc(64);
	if (!a->buf)
		return dlock__oom();
	strcpy(a->buf, "{");
	a->len = 1;
	a->cap = 64;
	return 0;
}

static int arr_push(arr *a, const char *s)
{
	return arr_add(&a->buf, &a->len, &a->cap, s);
}

static int arr_close(arr *a)
{
	if (a->len + 2 > a->cap) {
		char *nb = realloc(a->buf, a->len + 2);
		if (!nb)
			return dlock__oom();
		a->buf = nb;
	}
	strcpy(a->buf + a->len, "}");
	a->len++;
	return 0;
}

static int tbl_renew(dlock_backend *base, dlock_request *const *reqs, size_t n, int *results)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline = n ? reqs[0]->deadline_ms : dlock_clock_ms();
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	arr names = { 0 }, owners = { 0 }, ttls = { 0 }, idx = { 0 };
	if ((rc = arr_init(&names)) || (rc = arr_init(&owners)) || (rc = arr_init(&ttls)) ||
	    (rc = arr_init(&idx)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		char t[24], k[24];
		i64s(t, sizeof t, reqs[i]->ttl_ms);
		snprintf(k, sizeof k, "%zu", i);
		if ((rc = arr_push(&names, reqs[i]->name)) || (rc = arr_push(&owners, reqs[i]->owner)) ||
		    (rc = arr_push(&ttls, t)) || (rc = arr_push(&idx, k)))
			goto out;
	}
	if ((rc = arr_close(&names)) || (rc = arr_close(&owners)) || (rc = arr_close(&ttls)) ||
	    (rc = arr_close(&idx)))
		goto out;
	const char *v[] = { be->ns, names.buf, owners.buf, ttls.buf, idx.buf };
	PGresult *r;
	/* One statement for the whole batch; only live rows of their owners move. */
	rc = run(&be->conn, deadline, "renew",
		 "UPDATE dlock_holders h SET expires = clock_timestamp() + r.ttl * interval '1 millisecond'"
		 " FROM unnest($2::text[], $3::text[], $4::bigint[], $5::int[]) AS r(name, owner, ttl, i)"
		 " WHERE h.ns = $1 AND h.name = r.name AND h.owner = r.owner"
		 " AND h.expires > clock_timestamp() RETURNING r.i",
		 5, v, &r);
	if (rc)
		goto out;
	for (size_t i = 0; i < n; i++)
		results[i] = DLOCK_ENOTHELD;
	for (int row = 0; row < PQntuples(r); row++) {
		long i = strtol(PQgetvalue(r, row, 0), NULL, 10);
		if (i >= 0 && (size_t)i < n)
			results[i] = 0;
	}
	PQclear(r);
out:
	free(names.buf);
	free(owners.buf);
	free(ttls.buf);
	free(idx.buf);
	return rc;
}

static int tbl_cancel(dlock_backend *base, dlock_request *req)
{
	pg_backend *be = (pg_backend *)base;
	mark_forget(be, req);
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	const char *v[] = { be->ns, req->name, req->owner };
	/* The queue head may have changed: wake the others. */
	return run(&be->conn, deadline, "cancel",
		   "WITH d AS (DELETE FROM dlock_waiters WHERE ns = $1 AND name = $2 AND owner = $3"
		   " RETURNING 1) SELECT pg_notify('" CHANNEL "', $1 || chr(31) || $2) FROM d",
		   3, v, NULL);
}

static char *dupval(PGresult *r, int row, int col)
{
	return dlock__strdup(PQgetvalue(r, row, col));
}

static int names_array(arr *a, const char *const *names, size_t nnames)
{
	int rc = arr_init(a);
	for (size_t i = 0; !rc && i < nnames; i++)
		rc = arr_push(a, names[i]);
	return rc ? rc : arr_close(a);
}

/* Index of name in out[0..count), or -1. */
static long find_status(dlock_lock_status *out, size_t count, const char *name)
{
	for (size_t i = 0; i < count; i++)
		if (strcmp(out[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* The names with a live holder or waiter (the core then asks status for them). */
static int tbl_list(dlock_backend *base, char ***names, size_t *count)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	*names = NULL;
	*count = 0;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	PGresult *r = NULL;
	const char *v[] = { be->ns };
	rc = run(&be->conn, deadline, "list",
		 "SELECT name FROM dlock_holders WHERE ns = $1 AND expires > clock_timestamp()"
		 " UNION SELECT name FROM dlock_waiters WHERE ns = $1 AND expires > clock_timestamp()",
		 1, v, &r);
	if (rc)
		return rc;
	int n = PQntuples(r);
	if (n > 0 && !(*names = dlock__calloc((size_t)n, sizeof(char *))))
		rc = DLOCK_ENOMEM;
	for (int row = 0; rc == 0 && row < n; row++) {
		if (!((*names)[row] = dupval(r, row, 0)))
			rc = DLOCK_ENOMEM;
		else
			*count = (size_t)row + 1;
	}
	PQclear(r);
	return rc;
}

static int tbl_status(dlock_backend *base, const char *const *names, size_t nnames,
		      dlock_lock_status **out, size_t *count)
{
	pg_backend *be = (pg_backend *)base;
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	arr a = { 0 };
	PGresult *r = NULL;
	if ((rc = names_array(&a, names, nnames)))
		goto fail;
	for (size_t i = 0; i < nnames; i++) {
		dlock_lock_status *s = dlock__status_add(&st, &cnt);
		if (!s || !(s->name = dlock__strdup(names[i]))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		s->permits = 1;
	}
	const char *v[] = { be->ns, a.buf };
	rc = run(&be->conn, deadline, "status",
		 "SELECT l.name, l.fence, h.owner, h.host, h.pid, h.mode, h.permits, h.fence,"
		 " floor(extract(epoch FROM (h.expires - clock_timestamp())) * 1000)::bigint,"
		 " (SELECT count(*) FROM dlock_waiters w WHERE w.ns = l.ns AND w.name = l.name"
		 "   AND w.expires > clock_timestamp())"
		 " FROM dlock_locks l LEFT JOIN dlock_holders h ON h.ns = l.ns AND h.name = l.name"
		 "  AND h.expires > clock_timestamp()"
		 " WHERE l.ns = $1 AND l.name = ANY($2::text[])"
		 " ORDER BY l.name, h.fence",
		 2, v, &r);
	if (rc)
		goto fail;
	for (int row = 0; row < PQntuples(r); row++) {
		const char *name = PQgetvalue(r, row, 0);
		int has_holder = !PQgetisnull(r, row, 2);
		long waiters = strtol(PQgetvalue(r, row, 9), NULL, 10);
		long i = find_status(st, cnt, name);
		if (i < 0)
			continue;
		dlock_lock_status *s = &st[i];
		s->last_fence = strtoull(PQgetvalue(r, row, 1), NULL, 10);
		s->waiters = (size_t)waiters;
		if (!has_holder)
			continue;
		dlock_holder *h = dlock__status_add_holder(s);
		if (!h || !(h->owner = dupval(r, row, 2)) || !(h->host = dupval(r, row, 3))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		h->pid = atoi(PQgetvalue(r, row, 4));
		h->mode = atoi(PQgetvalue(r, row, 5)) ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		unsigned p = (unsigned)strtoul(PQgetvalue(r, row, 6), NULL, 10);
		if (h->mode == DLOCK_EXCLUSIVE && p > 1)
			s->permits = p;
		h->fence = strtoull(PQgetvalue(r, row, 7), NULL, 10);
		h->ttl_left_ms = strtoll(PQgetvalue(r, row, 8), NULL, 10);
	}
	PQclear(r);
	free(a.buf);
	*out = st;
	*count = cnt;
	return 0;
fail:
	PQclear(r);
	free(a.buf);
	dlock_status_free(st, cnt);
	return rc;
}

/* ---------------------------------------------------------- advisory mode */

static void pool_put(pg_backend *be, PGconn *c)
{
	if (c && PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE &&
	    be->npool < POOL_MAX)
		be->pool[be->npool++] = c;
	else
		PQfinish(c);
}

static int pool_get(pg_backend *be, int64_t deadline, PGconn **out)
{
	while (be->npool > 0) {
		PGconn *c = be->pool[--be->npool];
		if (idle_ok(c)) {
			*out = c;
			return 0;
		}
		PQfinish(c);
	}
	int code = 0;
	*out = connect_db(be, deadline, &code);
	return *out ? 0 : code;
}

static intent **intent_find(pg_backend *be, const char *owner)
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
 * Every statement of a hold's session starts with "/\* dlock-hold <owner> *\/":
 * pg_stat_activity.query keeps a session's last statement, so status can
 * name the holder's owner (application_name has no room for it). Owners are
 * "<hex client id>-<serial>"; anything else is left out.
 */
static void hold_tag(char *buf, size_t n, const char *owner)
{
	buf[0] = 0;
	if (!owner || !*owner || strspn(owner, "0123456789abcdefABCDEF-") != strlen(owner) ||
	    strlen(owner) > 96)
		return;
	snprintf(buf, n, "/* dlock-hold %s */ ", owner);
}

/* Try one advisory key on *cp by `deadline`; on success *fence is the name's
 * next fence. On an error the connection may hold the key: the caller
 * closes it (a timeout has already dropped it: *cp == NULL). */
static int adv_try(pg_backend *be, PGconn **cp, int64_t deadline, dlock_request *req, int64_t key,
		   int shared, int64_t unlock_intent, int *got, uint64_t *fence)
{
	char k[24], ik[24], ttl[24];
	i64s(k, sizeof k, key);
	i64s(ik, sizeof ik, unlock_intent);
	ms_setting(req->ttl_ms, ttl, sizeof ttl);
	int lease = PQserverVersion(*cp) >= 140000;
	char app[96], pid[16];
	snprintf(pid, sizeof pid, "%d", req->pid);
	snprintf(app, sizeof app, "%s", req->host ? req->host : "");
	const char *v[] = { k, be->ns, req->name, lease ? ttl : "0", ik, pid, app };
	/*
	 * One round trip: take the key, then (only if taken) count the fence and
	 * set the session's idle timeout to the lease, so that a hung or cut-off
	 * client loses the lock on the server once a TTL passes without renewal.
	 */
	char sql[1280], tag[128];
	hold_tag(tag, sizeof tag, req->owner);
	snprintf(sql, sizeof sql,
		 "%sWITH l AS MATERIALIZED (SELECT %s($1::bigint) AS ok),"
		 " f AS (INSERT INTO dlock_locks AS d (ns, name, fence) SELECT $2, $3, 1 FROM l WHERE l.ok"
		 "  ON CONFLICT (ns, name) DO UPDATE SET fence = d.fence + 1 RETURNING d.fence)"
		 " SELECT l.ok, (SELECT fence FROM f),"
		 " CASE WHEN l.ok AND %s THEN set_config('idle_session_timeout', $4, false) END,"
		 " CASE WHEN l.ok AND $5::bigint <> 0 THEN pg_advisory_unlock($5::bigint) END,"
		 /* what status shows of this holder (application_name is visible to all) */
		 " CASE WHEN l.ok THEN set_config('application_name', 'dlock ' || $6 || ' ' ||"
		 "  (SELECT fence FROM f) || ' ' || $4 || ' ' || $7, false) END FROM l",
		 tag, shared ? "pg_try_advisory_lock_shared" : "pg_try_advisory_lock",
		 lease ? "true" : "false");
	PGresult *r;
	int rc = run(cp, deadline, "acquire", sql, 7, v, &r);
	if (rc)
		return rc;
	*got = PQgetvalue(r, 0, 0)[0] == 't';
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
	int rc = run(cp, deadline, "acquire",
		     /* the count is a subquery of t's row: pg_locks is read after our key is taken */
		     "WITH t AS MATERIALIZED (SELECT pg_try_advisory_lock_shared($1::int, $2::int) AS ok),"
		     " c AS MATERIALIZED (SELECT t.ok, t.ok AND (SELECT count(*) <= least($2::bigint,"
		     "  min(l.objid::bigint)) FROM pg_locks l WHERE t.ok AND l.locktype = 'advisory'"
		     "  AND l.granted AND l.objsubid = 2 AND l.classid = $1::int::oid AND l.database ="
		     "  (SELECT oid FROM pg_database WHERE datname = current_database())) AS within FROM t)"
		     " SELECT c.within, CASE WHEN c.ok AND NOT c.within"
		     "  THEN pg_advisory_unlock_shared($1::int, $2::int) END FROM c",
		     2, v, &r);
	if (rc)
		return rc;
	*ok = PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return 0;
}

static int adv_acquire(dlock_backend *base, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	pg_backend *be = (pg_backend *)base;
	if (req->fair)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "fair locks need mode=table: advisory try-locks have no queue");
	int64_t deadline;
	int rc = acquire_deadline(be, req, &deadline);
	if (rc)
		return rc;
	int shared = req->mode == DLOCK_SHARED;
	unsigned permits = req->permits;
	int64_t intent_key = adv_key(be->ns, req->name, "writer-intent");
	if (req->waiting)
		mark_before_try(be, req);

	/*
	 * Unknown outcomes: any statement that fails here may have taken a key
	 * on its session, so the session is closed (the key goes with it), never
	 * pooled; a timeout has dropped it already. Nothing survives a failed try.
	 */
	PGconn *c = NULL;
	intent **ip = intent_find(be, req->owner), *in = *ip;
	if (in) {
		c = in->conn; /* a waiting writer retries on the connection holding its intent */
		in->conn = NULL;
		*ip = in->next;
		free(in);
	} else if ((rc = pool_get(be, deadline, &c))) {
		return rc;
	}
	int had_intent = in != NULL;
	if (shared) {
		/* Writer preference: back off while a writer announced it waits. */
		char ik[24];
		i64s(ik, sizeof ik, intent_key);
		const char *v[] = { ik };
		PGresult *r;
		rc = run(&c, deadline, "acquire",
			 "SELECT CASE WHEN pg_try_advisory_lock_shared($1::bigint)"
			 " THEN pg_advisory_unlock_shared($1::bigint) ELSE false END",
			 1, v, &r);
		if (rc) {
			drop_conn(&c, 0);
			return rc;
		}
		int free_ = PQgetvalue(r, 0, 0)[0] == 't';
		PQclear(r);
		if (!free_) {
			pool_put(be, c);
			return DLOCK_ELOCKED;
		}
	}
	int got = 0;
	uint64_t f = 0;
	int64_t key = adv_key(be->ns, req->name, NULL);
	int32_t sem_class = permits > 1 ? (int32_t)(adv_key(be->ns, req->name, "permits") & 0x7fffffff) : 0;
	int within = 1;
	if (sem_class && (rc = sem_enter(&c, deadline, sem_class, permits, &within))) {
		drop_conn(&c, 0);
		return rc;
	}
	if (within) {
		/* a semaphore holder takes the name's key shared: a mutex excludes it */
		rc = adv_try(be, &c, deadline, req, key, shared || sem_class, had_intent ? intent_key : 0, &got, &f);
		if (rc) {
			drop_conn(&c, 0);
			return rc;
		}
		if (!got && sem_class) {
			char cs[16], ps[16];
			snprintf(cs, sizeof cs, "%" PRId32, sem_class);
			snprintf(ps, sizeof ps, "%u", permits);
			const char *v[] = { cs, ps };
			if ((rc = run(&c, deadline, "acquire", "SELECT pg_advisory_unlock_shared($1::int, $2::int)", 2,
				      v, NULL))) {
				drop_conn(&c, 0);
				return rc;
			}
		}
	}
	if (!got) {
		if (had_intent || (!shared && permits == 1 && req->waiting)) {
			/* Announce the waiting writer: hold the intent key on this connection
			 * (a waiter that already holds it keeps it). */
			int mine = had_intent;
			if (!mine) {
				char ik[24], qttl[24];
				i64s(ik, sizeof ik, intent_key);
				ms_setting(req->queue_ttl_ms, qttl,
					   sizeof qttl);
				const char *v[] = { ik, qttl };
				PGresult *r;
				/* A writer that stops retrying (hung) must not block readers for
				 * ever: its session ends after a queue TTL without a statement. */
				int irc = run(&c, deadline, "acquire",
					      PQserverVersion(c) >= 140000
						      ? "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock($1::bigint) AS ok)"
							" SELECT ok, CASE WHEN ok THEN"
							" set_config('idle_session_timeout', $2, false) END FROM l"
						      : "SELECT pg_try_advisory_lock($1::bigint), $2",
					      2, v, &r);
				if (irc) {
					/* It may hold the intent key now: drop the session, not pool it. */
					drop_conn(&c, 0);
					return DLOCK_ELOCKED;
				}
				mine = PQgetvalue(r, 0, 0)[0] == 't';
				PQclear(r);
			}
			intent *ni = mine ? calloc(1, sizeof *ni) : NULL;
			if (ni) {
				snprintf(ni->owner, sizeof ni->owner, "%s", req->owner);
				ni->conn = c;
				ni->next = be->intents;
				be->intents = ni;
				return DLOCK_ELOCKED;
			}
			if (mine) {
				drop_conn(&c, 0);
				return DLOCK_ELOCKED;
			}
		}
		pool_put(be, c);
		return DLOCK_ELOCKED;
	}
	adv_hold *h = calloc(1, sizeof *h);
	if (!h) {
		drop_conn(&c, 0); /* closing the session frees the lock */
		return dlock__oom();
	}
	h->conn = c;
	h->key = key;
	h->shared = shared || sem_class;
	h->sem_class = sem_class;
	h->sem_permits = permits;
	req->slot = h;
	*fence = f;
	if (req->waiting)
		mark_forget(be, req);
	(void)retry_ms;
	return 0;
}

/*
 * A release that cannot be confirmed (timeout, broken connection, any error)
 * closes the hold's session: the server then frees every key it held, so
 * nothing outlives the release. A timeout says so (DLOCK_EUNAVAILABLE, "timed
 * out"); a session that was already gone held nothing (DLOCK_ENOTHELD).
 */
static int adv_release(dlock_backend *base, dlock_request *req)
{
	pg_backend *be = (pg_backend *)base;
	adv_hold *h = req->slot;
	if (!h)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
				       "advisory locks live on their connection: this handle holds none");
	req->slot = NULL;
	if (!h->conn) {
		free(h);
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
				       "the lock's connection was closed earlier (and the lock with it)");
	}
	int64_t deadline = req->deadline_ms;
	char k[24];
	i64s(k, sizeof k, h->key);
	const char *v[] = { k, be->ns, req->name };
	PGresult *r;
	char sql[400], sem[96] = "";
	if (h->sem_class)
		snprintf(sem, sizeof sem, ", pg_advisory_unlock_shared(%" PRId32 ", %u)", h->sem_class,
			 h->sem_permits);
	snprintf(sql, sizeof sql,
		 "SELECT %s($1::bigint)%s%s, set_config('application_name', 'dlock', false),"
		 " pg_notify('" CHANNEL "', $2 || chr(31) || $3)",
		 h->shared ? "pg_advisory_unlock_shared" : "pg_advisory_unlock", sem, no_lease(h->conn));
	int rc = run(&h->conn, deadline, "release", sql, 3, v, &r);
	if (rc) {
		int gone = !h->conn || PQstatus(h->conn) != CONNECTION_OK;
		int tmo = rc == DLOCK_EUNAVAILABLE && strcmp(dlock_error_last()->store_code, "timeout") == 0;
		drop_conn(&h->conn, 0);
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
static int adv_extend(dlock_backend *base, dlock_request *req, int64_t ttl_ms)
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
	char sql[768], tag[128];
	hold_tag(tag, sizeof tag, req->owner);
	/* Field 4 of application_name is the lease that status reports. */
	snprintf(sql, sizeof sql,
		 "%sSELECT (%s) > 0%s, set_config('application_name', regexp_replace("
		 "current_setting('application_name'), '^(dlock \\S+ \\S+) \\S+', '\\1 ' || $3), false)",
		 tag, held_sql, lease ? ", set_config('idle_session_timeout', $3, false)" : ", $3");
	int rc = run(&h->conn, deadline, "extend", sql, 3, v, &r);
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
static int adv_renew(dlock_backend *base, dlock_request *const *reqs, size_t n, int *results)
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
		return dlock__oom();
	}
	for (size_t i = 0; i < n; i++) {
		adv_hold *h = reqs[i]->slot;
		results[i] = DLOCK_ENOTHELD;
		if (!h || !h->conn || PQstatus(h->conn) != CONNECTION_OK)
			continue;
		char hi[16], lo[16];
		key_oids(h->key, hi, lo);
		const char *v[] = { hi, lo };
		char sql[512], tag[128];
		hold_tag(tag, sizeof tag, reqs[i]->owner);
		snprintf(sql, sizeof sql, "%s%s", tag, held_sql);
		if (PQsendQueryParams(h->conn, sql, 2, NULL, v, NULL, NULL, 0))
			pd[i].state = 1;
		else
			drop_conn(&h->conn, 0);
	}
	for (;;) {
		nfds_t np = 0;
		for (size_t i = 0; i < n; i++) {
			adv_hold *h = reqs[i]->slot;
			pf[i].fd = -1;
			if (pd[i].state != 1)
				continue;
			int f = PQflush(h->conn);
			int s = f < 0 ? -1 : q_step(h->conn, "renew", &pd[i].last, &pd[i].code);
			if (s == 0) {
				pf[i].fd = PQsocket(h->conn);
				pf[i].events = (short)(POLLIN | (f ? POLLOUT : 0));
				np++;
			} else {
				pd[i].state = s == 1 ? 2 : 0;
				if (s < 0)
					drop_conn(&h->conn, 0);
			}
		}
		int ms = poll_ms(deadline);
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
			drop_conn(&h->conn, 1);
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

static int adv_cancel(dlock_backend *base, dlock_request *req)
{
	pg_backend *be = (pg_backend *)base;
	mark_forget(be, req);
	intent **ip = intent_find(be, req->owner), *in = *ip;
	if (!in)
		return 0;
	*ip = in->next;
	int64_t deadline = req->deadline_ms;
	char ik[24];
	i64s(ik, sizeof ik, adv_key(be->ns, req->name, "writer-intent"));
	const char *v[] = { ik, be->ns, req->name };
	char sql[256];
	snprintf(sql, sizeof sql,
		 "SELECT pg_advisory_unlock($1::bigint)%s, pg_notify('" CHANNEL "', $2 || chr(31) || $3)",
		 no_lease(in->conn));
	int rc = run(&in->conn, deadline, "cancel", sql, 3, v, NULL);
	if (rc)
		drop_conn(&in->conn, 0); /* the intent key goes with the session */
	else
		pool_put(be, in->conn);
	free(in);
	return 0;
}

static int adv_status(dlock_backend *base, const char *const *names, size_t nnames,
		      dlock_lock_status **out, size_t *count)
{
	pg_backend *be = (pg_backend *)base;
	if (!names || !nnames)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "advisory mode cannot list lock names (keys are hashes); "
				       "ask for names");
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	PGconn *c = NULL;
	int rc = main_conn(be, deadline, &c);
	if (rc)
		return rc;
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	for (size_t i = 0; i < nnames; i++) {
		dlock_lock_status *s = dlock__status_add(&st, &cnt);
		if (!s || !(s->name = dlock__strdup(names[i]))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		s->permits = 1;
		char hi[16], lo[16];
		key_oids(adv_key(be->ns, names[i], NULL), hi, lo);
		char ihi[16], ilo[16];
		key_oids(adv_key(be->ns, names[i], "writer-intent"), ihi, ilo);
		const char *v[] = { hi, lo, be->ns, names[i], ihi, ilo };
		PGresult *r;
		/* application_name of a holder: "dlock <pid> <fence> <lease ms> <host>";
		 * the lease counts from the session's last statement (idle_session_timeout),
		 * whose text names the owner (hold_tag; visible to the same role). */
		rc = run(&be->conn, deadline, "status",
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
			dlock_holder *h = dlock__status_add_holder(s);
			if (!h || !(h->owner = PQgetisnull(r, row, 6)
						       ? dlock__sprintf("backend-%s", PQgetvalue(r, row, 0))
						       : dlock__strdup(PQgetvalue(r, row, 6)))) {
				PQclear(r);
				rc = DLOCK_ENOMEM;
				goto fail;
			}
			h->mode = strcmp(PQgetvalue(r, row, 1), "ShareLock") == 0 ? DLOCK_SHARED
										   : DLOCK_EXCLUSIVE;
			h->ttl_left_ms = -1;
			int pid = 0, n = 0;
			unsigned long long fence = 0;
			long long lease = 0;
			const char *app = PQgetvalue(r, row, 2);
			if (sscanf(app, "dlock %d %llu %lld %n", &pid, &fence, &lease, &n) == 3) {
				h->pid = pid;
				h->fence = fence;
				if (lease > 0 && !PQgetisnull(r, row, 3))
					h->ttl_left_ms = lease - strtoll(PQgetvalue(r, row, 3), NULL, 10);
			}
			if (!(h->host = dlock__strdup(n > 0 ? app + n : ""))) {
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

/* ------------------------------------------------------------ open/close */

static void pg_close(dlock_backend *base)
{
	pg_backend *be = (pg_backend *)base;
	if (!be)
		return;
	if (be->lthread_on) {
		pthread_mutex_lock(&be->lmu);
		be->lstop = 1;
		pthread_cond_broadcast(&be->lcv);
		pthread_mutex_unlock(&be->lmu);
		ssize_t w = write(be->wakefd[1], "x", 1);
		(void)w;
		pthread_join(be->lthread, NULL);
	}
	if (be->lconn)
		PQfinish(be->lconn);
	if (be->wakefd[0] >= 0)
		close(be->wakefd[0]);
	if (be->wakefd[1] >= 0)
		close(be->wakefd[1]);
	pthread_mutex_destroy(&be->lmu);
	pthread_cond_destroy(&be->lcv);
	while (be->intents) {
		intent *in = be->intents;
		be->intents = in->next;
		PQfinish(in->conn);
		free(in);
	}
	for (int i = 0; i < be->npool; i++)
		PQfinish(be->pool[i]);
	if (be->conn)
		PQfinish(be->conn);
	free(be->host);
	free(be->port);
	free(be->user);
	free(be->password);
	free(be->dbname);
	free(be->sslmode);
	free(be->sslrootcert);
	free(be->sslcert);
	free(be->sslkey);
	free(be->ns);
	free(be);
}

/* mode=table: holds are rows (any connection may renew them). */
static const dlock_backend_methods pg_table_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.acquire = tbl_acquire,
	.release = tbl_release,
	.renew = tbl_renew,
	.extend = tbl_extend,
	.wait = pg_wait,
	.cancel = tbl_cancel,
	.status = tbl_status,
	.list = tbl_list,
	.close = pg_close,
};

/* mode=advisory: holds are session advisory locks of our connection. */
static const dlock_backend_methods pg_advisory_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_SESSION,
	.acquire = adv_acquire,
	.release = adv_release,
	.renew = adv_renew,
	.extend = adv_extend,
	.wait = pg_wait,
	.cancel = adv_cancel,
	.status = adv_status,
	.close = pg_close,
};

int dlock__postgres_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	const char *mode = dlock_uri_param(uri, "mode");
	const char *sslmode = dlock_uri_param(uri, "sslmode");
	static const char *const sslmodes[] = { "disable", "allow", "prefer", "require", "verify-ca",
						"verify-full" };
	int ssl_ok = !sslmode;
	for (size_t i = 0; !ssl_ok && i < sizeof sslmodes / sizeof sslmodes[0]; i++)
		ssl_ok = strcmp(sslmode, sslmodes[i]) == 0;
	if (!ssl_ok)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "postgres: unknown sslmode '%s' (disable, allow, prefer, require, "
				       "verify-ca or verify-full)", sslmode);
	int advisory = 0;
	if (mode && strcmp(mode, "advisory") == 0)
		advisory = 1;
	else if (mode && strcmp(mode, "table") != 0)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "postgres: unknown mode '%s' (expected table or advisory)", mode);

	dlock_hostport *hp = NULL;
	size_t nh = 0;
	if (uri->hosts && *uri->hosts) {
		int rc = dlock_uri_hosts(uri, 5432, &hp, &nh);
		if (rc)
			return rc;
		if (nh != 1) {
			dlock_free(hp);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "postgres: give exactly one host:port");
		}
	}
	const char *db = uri->path && uri->path[0] == '/' ? uri->path + 1 : uri->path;
	if (!dlock__host_is_local(hp ? hp[0].host : NULL) &&
	    (!sslmode || (strcmp(sslmode, "verify-ca") != 0 && strcmp(sslmode, "verify-full") != 0)))
		dlock__open_warning("postgres: sslmode=%s does not verify the server: on the way to %s a man in "
				    "the middle could read the password and the lock traffic; use "
				    "sslmode=verify-full&sslrootcert=CA.pem",
				    sslmode ? sslmode : "prefer (the default)", hp[0].host);

	pg_backend *be = calloc(1, sizeof *be);
	if (!be) {
		dlock_free(hp);
		return dlock__oom();
	}
	dlock_backend_init(&be->base, advisory ? &pg_advisory_methods : &pg_table_methods);
	be->advisory = advisory;
	be->wakefd[0] = be->wakefd[1] = -1;
	pthread_mutex_init(&be->lmu, NULL);
	dlock__cond_init_monotonic(&be->lcv);
	int rc = 0;
	/* The whole open (connect, TLS, authentication, schema) is bounded by connect_timeout. */
	int64_t open_deadline = dlock_clock_ms() + uri->connect_timeout_ms;
	be->connect_timeout_ms = uri->connect_timeout_ms;
	be->request_timeout_ms = uri->request_timeout_ms;
	if (!rc && hp && !(be->host = dlock__strdup(hp[0].host)))
		rc = DLOCK_ENOMEM;
	if (!rc && hp && !(be->port = dlock__sprintf("%d", hp[0].port)))
		rc = DLOCK_ENOMEM;
	if (!rc)
		rc = dlock__opt_dup(&be->user, uri->user);
	if (!rc)
		rc = dlock__opt_dup(&be->password, uri->password);
	if (!rc && db && *db)
		rc = dlock__opt_dup(&be->dbname, db);
	if (!rc)
		rc = dlock__opt_dup(&be->sslmode, sslmode);
	if (!rc)
		rc = dlock__opt_dup(&be->sslrootcert, dlock_uri_param(uri, "sslrootcert"));
	if (!rc)
		rc = dlock__opt_dup(&be->sslcert, dlock_uri_param(uri, "sslcert"));
	if (!rc)
		rc = dlock__opt_dup(&be->sslkey, dlock_uri_param(uri, "sslkey"));
	if (!rc)
		rc = dlock__opt_dup(&be->ns, uri->prefix ? uri->prefix : "dlock");
	dlock_free(hp);
	if (!rc && pipe(be->wakefd) != 0)
		rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "pipe: %s", strerror(errno));
	for (int i = 0; !rc && i < 2; i++)
		fcntl(be->wakefd[i], F_SETFL, fcntl(be->wakefd[i], F_GETFL) | O_NONBLOCK);
	if (!rc)
		rc = ensure_schema(be, open_deadline);
	if (rc) {
		pg_close(&be->base);
		return rc;
	}
	/* Advisory: the first acquire takes the open's connection from the pool
	 * (no second connect inside a short wait); status connects when asked. */
	if (advisory && be->conn && PQtransactionStatus(be->conn) == PQTRANS_IDLE) {
		be->pool[be->npool++] = be->conn;
		be->conn = NULL;
	}
	*out = &be->base;
	return 0;
}
