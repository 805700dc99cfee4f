/*
 * PostgreSQL store: errors, connections and statements, each bounded by the
 * caller's deadline; the schema of table mode (schema.sql); keys and buckets.
 */
#include "pg.h"
#include "postgres_sql.h"

/* ---------------------------------------------------------------- errors */

/* SQLSTATE codes and classes (PostgreSQL's errcodes; libpq has no header
 * for them). */
#define SQLSTATE_CLASS_CONNECTION_EXCEPTION "08"
#define SQLSTATE_CLASS_TRANSACTION_ROLLBACK "40" /* deadlock detected, serialization failure */
#define SQLSTATE_CLASS_INVALID_AUTHORIZATION "28"
#define SQLSTATE_ADMIN_CRASH_SHUTDOWN_PREFIX "57P" /* admin/crash shutdown, cannot connect now */
#define SQLSTATE_TOO_MANY_CONNECTIONS "53300"
#define SQLSTATE_INSUFFICIENT_PRIVILEGE "42501"

static bool sqlstate_in(const char *st, const char *class_or_prefix)
{
	return strncmp(st, class_or_prefix, strlen(class_or_prefix)) == 0;
}

static int code_for_sqlstate(const char *st)
{
	if (!st)
		return DLOCK_ESTORE;
	/* Connection trouble, shutdown, too many connections, and transaction
	 * rollbacks are transient: the core retries them. */
	if (sqlstate_in(st, SQLSTATE_CLASS_CONNECTION_EXCEPTION) ||
	    sqlstate_in(st, SQLSTATE_ADMIN_CRASH_SHUTDOWN_PREFIX) || strcmp(st, SQLSTATE_TOO_MANY_CONNECTIONS) == 0 ||
	    sqlstate_in(st, SQLSTATE_CLASS_TRANSACTION_ROLLBACK))
		return DLOCK_EUNAVAILABLE;
	if (sqlstate_in(st, SQLSTATE_CLASS_INVALID_AUTHORIZATION) || strcmp(st, SQLSTATE_INSUFFICIENT_PRIVILEGE) == 0)
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
	snprintf(msg, sizeof msg, "%s",
		 res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res) : PQerrorMessage(c));
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
void dlock__pg_drop_conn(PGconn **cp, int cancel)
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

int dlock__pg_poll_ms(int64_t deadline)
{
	int64_t left = deadline - dlock_clock_ms();
	return left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
}

/*
 * Connect, bounded by `deadline` (CLOCK_MONOTONIC ms) in total: the name is
 * resolved by the deadline (dlock_sys_resolve), and every step after it (TCP,
 * TLS, authentication) is driven by PQconnectPoll and poll,
 * so the bound holds in milliseconds; libpq's own connect_timeout (whole
 * seconds, at least 2) is only a second line, cut to the time left.
 */
PGconn *dlock__pg_connect_db(postgres_store *be, int64_t deadline, int *code)
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
	dlock_sys_addrs ad = { 0 };
	char hostaddr[DLOCK_SYS_ADDRS_MAX * DLOCK_SYS_ADDR_LEN], hosts[DLOCK_SYS_ADDRS_MAX * 257];
	if (be->host) {
		int rc = dlock_sys_resolve(&ad, be->host, deadline, KIND);
		if (rc) {
			*code = rc;
			return NULL;
		}
		dlock_sys_addrs_join(hostaddr, sizeof hostaddr, &ad, ",");
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
		*code = dlock_sys_oom();
		return NULL;
	}
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;
	while (PQstatus(c) != CONNECTION_BAD && st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
		int ms = dlock__pg_poll_ms(deadline);
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
			   strstr(msg, "role") || strstr(msg, "permission denied") || strstr(msg, "pg_hba.conf");
		int nodb = strstr(msg, "database") && strstr(msg, "does not exist");
		*code = dlock_error_set(nodb   ? DLOCK_EINVAL
					: auth ? DLOCK_EAUTH
					       : DLOCK_EUNAVAILABLE,
					KIND, "", "connect to %s:%s: %s", be->host ? be->host : "localhost",
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
int dlock__pg_idle_ok(PGconn *c)
{
	int fd = PQsocket(c), st;
	dlock_sys_sock_states(&fd, 1, &st);
	return PQstatus(c) == CONNECTION_OK && st == 0;
}

/* The main connection, reconnected (by `deadline`) if it broke or was dropped. */
int dlock__pg_main_conn(postgres_store *be, int64_t deadline, PGconn **out)
{
	if (be->conn && !dlock__pg_idle_ok(be->conn))
		dlock__pg_drop_conn(&be->conn, 0);
	if (!be->conn) {
		int code = 0;
		be->conn = dlock__pg_connect_db(be, deadline, &code);
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
int dlock__pg_q_step(PGconn *c, const char *what, PGresult **last, int *code)
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
int dlock__pg_finish(PGconn **cp, int64_t deadline, const char *what, int sent, PGresult **out)
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
			if ((s = dlock__pg_q_step(c, what, &last, &code)) != 0)
				break;
			int ms = dlock__pg_poll_ms(deadline);
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
		dlock__pg_drop_conn(cp, 1);
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
		dlock__pg_drop_conn(cp, 0);
	}
	return code;
}

/* Run one statement with parameters on *cp by `deadline`; *out gets the result. */
int dlock__pg_run(PGconn **cp, int64_t deadline, const char *what, const char *sql, int n, const char *const *vals,
		  PGresult **out)
{
	int sent = PQsendQueryParams(*cp, sql, n, NULL, vals, NULL, NULL, 0);
	return dlock__pg_finish(cp, deadline, what, sent, out);
}

/*
 * The statements of every acquire and release, prepared once per main
 * connection: an unnamed PQexecParams is parsed, analysed and planned by the
 * server on every call (base_yyparse and the planner were the top server
 * symbols in `perf record` of an uncontended dlock__pg_run).
 */
static const struct {
	const char *name, *sql;
	int nparams;
/* clang-format off */
} stmts[S_COUNT] = {
	[S_ACQUIRE] = { "dlock_acquire",
			"SELECT o_fence, o_retry_ms FROM dlock_acquire_v1($1, $2, $3, $4::int, $5::int,"
			" $6::bigint, $7::boolean, $8::boolean, $9::bigint, $10, $11::int)", 11 },
	/* Delete our row even if it expired (tidy), but only a live one counts.
	 * Only a hold that a waiter marked notifies (schema.sql); the NOTIFY is
	 * sent at commit, after the row is gone. */
	[S_RELEASE] = { "dlock_release",
			"WITH d AS (DELETE FROM dlock_holders WHERE ns = $1 AND name = $2 AND owner = $3"
			" RETURNING expires > clock_timestamp() AS live, waited)"
			" SELECT d.live, CASE WHEN d.waited THEN pg_notify('" CHANNEL "', $1 || chr(31) || $2) END"
			" FROM d", 3 },
};
/* clang-format on */

/* Run stmts[which] on the main connection by `deadline`, preparing it there first if needed. */
int dlock__pg_run_stmt(postgres_store *be, int64_t deadline, int which, const char *what, const char *const *vals,
		       PGresult **out)
{
	*out = NULL;
	if (!(be->prepared & (1u << which))) {
		int sent = PQsendPrepare(be->conn, stmts[which].name, stmts[which].sql, stmts[which].nparams, NULL);
		int code = dlock__pg_finish(&be->conn, deadline, what, sent, NULL);
		if (code)
			return code;
		be->prepared |= 1u << which;
	}
	int sent = PQsendQueryPrepared(be->conn, stmts[which].name, stmts[which].nparams, vals, NULL, NULL, 0);
	return dlock__pg_finish(&be->conn, deadline, what, sent, out);
}

/* Several statements without parameters (the simple query protocol). */
static int run_script(PGconn **cp, int64_t deadline, const char *what, const char *sql)
{
	return dlock__pg_finish(cp, deadline, what, PQsendQuery(*cp, sql), NULL);
}

/* ----------------------------------------------------------------- schema */

/* The tables and the acquire function: schema.sql, embedded at build time
 * (its notices, such as "already exists, skipping", are not printed). */
static const char schema_sql[] = "SET LOCAL client_min_messages = warning;" DLOCK__SQL_SCHEMA
	"INSERT INTO dlock_schema VALUES ('dlock', " STR(SCHEMA_VERSION) ")"
	" ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version;";

int dlock__pg_ensure_schema(postgres_store *be, int64_t deadline)
{
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	PGresult *r = NULL;
	rc = dlock__pg_run(&be->conn, deadline, "read schema version",
			   "SELECT version FROM dlock_schema WHERE component = 'dlock'", 0, NULL, &r);
	if (rc == 0 && PQntuples(r) == 1) {
		int v = atoi(PQgetvalue(r, 0, 0));
		PQclear(r);
		if (v == SCHEMA_VERSION)
			return 0;
		if (v > SCHEMA_VERSION)
			return dlock_error_set(DLOCK_ESTORE, KIND, "",
					       "dlock schema version %d in the database is newer than "
					       "this library's (%d)",
					       v, SCHEMA_VERSION);
	} else {
		PQclear(r);
	}
	/* No table yet is an error of the statement; a dead connection is not. */
	if (!be->conn)
		return rc;
	/* Serialise concurrent creators; CREATE … IF NOT EXISTS alone can race. */
	if ((rc = dlock__pg_run(&be->conn, deadline, "create schema", "BEGIN", 0, NULL, NULL)))
		return rc;
	if ((rc = dlock__pg_run(&be->conn, deadline, "create schema",
				"SELECT pg_advisory_xact_lock(" SCHEMA_LOCK_KEY ")", 0, NULL, NULL)) ||
	    (rc = run_script(&be->conn, deadline, "create schema", schema_sql)) ||
	    (rc = dlock__pg_run(&be->conn, deadline, "create schema", "COMMIT", 0, NULL, NULL))) {
		if (be->conn) {
			dlock_sys_saved_error saved;
			dlock_sys_error_save(&saved);
			dlock__pg_run(&be->conn, deadline, "create schema", "ROLLBACK", 0, NULL, NULL);
			dlock_sys_error_restore(&saved);
		}
		return rc;
	}
	return 0;
}

/* ------------------------------------------------------------------- keys */

/* The advisory key of (prefix, name, slot): FNV-1a 64 over
 * prefix NUL name [NUL "slot"] — stable across versions, platforms and
 * servers (unlike hashtext). */
int64_t dlock__pg_adv_key(const char *ns, const char *name, const char *slot)
{
	uint64_t h = dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, ns, strlen(ns) + 1);
	h = dlock_sys_fnv1a64(h, name, strlen(name));
	if (slot) {
		h = dlock_sys_fnv1a64(h, "", 1);
		h = dlock_sys_fnv1a64(h, slot, strlen(slot));
	}
	return (int64_t)h;
}
