/*
 * MySQL/MariaDB store: SQL text, errors, connections (every socket wait
 * bounded by the caller's deadline) and the schema (schema.sql).
 */
#include "my.h"
#include "mysql_sql.h"

#include <fcntl.h>

/* ---- small string builder ---- */

/* Append a hex literal X'..' of a byte string: nothing from a caller is ever quoted or escaped. */
void dlock__my_sb_hex(sbuf *s, const char *bytes)
{
	size_t n = strlen(bytes);
	char *h = malloc(2 * n + 1);
	if (!h) {
		s->failed = 1;
		return;
	}
	dlock_sys_hex(h, bytes, n);
	dlock_sys_sb_put(s, "X'", 2);
	dlock_sys_sb_put(s, h, 2 * n);
	dlock_sys_sb_put(s, "'", 1);
	free(h);
}

int dlock__my_sb_check(sbuf *s)
{
	if (s->failed) {
		free(s->p);
		s->p = NULL;
		return dlock_sys_oom();
	}
	return 0;
}

/* ---- errors ---- */

/* MySQL 8's "disconnected by the server because of inactivity": the same
 * number is another error in MariaDB's header (which we build against), so
 * it has a name of our own. */
#define MYSQL8_ER_CLIENT_INTERACTION_TIMEOUT 4031

/* The connection is unusable: a client-side CR_* error, or the server ended the
 * session (KILL, or MySQL 8's idle timeout). */
int dlock__my_is_conn_error(unsigned int e)
{
	return (e >= CR_MIN_ERROR && e <= CR_MAX_ERROR) || e == ER_CONNECTION_KILLED ||
	       e == MYSQL8_ER_CLIENT_INTERACTION_TIMEOUT;
}

static int map_errno(unsigned int e)
{
	switch (e) {
	case ER_ACCESS_DENIED_ERROR:
	case ER_DBACCESS_DENIED_ERROR:
	case ER_TABLEACCESS_DENIED_ERROR:
	case ER_COLUMNACCESS_DENIED_ERROR:
	case ER_SPECIFIC_ACCESS_DENIED_ERROR:
	case ER_PASSWORD_NO_MATCH:
	case ER_ACCESS_DENIED_NO_PASSWORD_ERROR:
	case ER_MUST_CHANGE_PASSWORD_LOGIN:
		return DLOCK_EAUTH;
	case ER_BAD_DB_ERROR:
		return DLOCK_EINVAL;
	case ER_LOCK_DEADLOCK:
	case ER_LOCK_WAIT_TIMEOUT:
	case ER_CON_COUNT_ERROR:
	case ER_SERVER_SHUTDOWN:
		return DLOCK_EUNAVAILABLE;
	}
	return dlock__my_is_conn_error(e) ? DLOCK_EUNAVAILABLE : DLOCK_ESTORE;
}

/* Record the error of connection c (what: which step failed) and return its code. */
static int sql_fail(const mysql_store *b, MYSQL *c, const char *what)
{
	unsigned int e = mysql_errno(c);
	char msg[512], code[32];
	snprintf(msg, sizeof(msg), "%s", mysql_error(c));
	dlock_sys_scrub(msg, sizeof(msg), b->password);
	snprintf(code, sizeof(code), "%u/%s", e, mysql_sqlstate(c));
	int rc = map_errno(e);
	if (e == ER_BAD_DB_ERROR)
		return dlock_error_set(rc, KIND, code, "mysql: %s (create the database first: CREATE DATABASE ...)",
				       msg);
	return dlock_error_set(rc, KIND, code, "mysql %s: %s", what, msg);
}

/* ---- connections: every socket wait bounded by the caller's deadline ---- */

/*
 * Every connection runs in MariaDB's non-blocking mode (MYSQL_OPT_NONBLOCK):
 * each call is started with its _start function and continued with _cont
 * while we poll the socket, never past the deadline the core gave. A call
 * that runs out of time leaves its connection unusable (a late reply must
 * never be read as the answer to the next statement): the socket is shut
 * down at once (mariadb_cancel), dlock__my_tl_timed_out is set, and the caller closes
 * the connection; the next call opens a new one, bounded by its own deadline.
 */
_Thread_local int dlock__my_tl_timed_out;
/* An acquire's answer (its SELECT) comes before its COMMIT's OK. When only the
 * OK is missing at the deadline, a refusal is still known for sure (a refused
 * try grants nothing, committed or not): dlock__my_read_all keeps the last result set
 * here for a caller that set dlock__my_tl_want_partial, which takes and frees it. */
_Thread_local int dlock__my_tl_want_partial;
_Thread_local MYSQL_RES *dlock__my_tl_partial;

/* The events libmariadb asked for (status), once they happen; 0 when the deadline passed first. */
static int nb_wait(MYSQL *c, int status, int64_t deadline)
{
	struct pollfd p = { .fd = (int)mysql_get_socket(c), .events = 0 };
	if (status & MYSQL_WAIT_READ)
		p.events |= POLLIN;
	if (status & MYSQL_WAIT_WRITE)
		p.events |= POLLOUT;
	if (status & MYSQL_WAIT_EXCEPT)
		p.events |= POLLPRI;
	for (;;) {
		int64_t left = deadline - dlock_clock_ms();
		int tmo = left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left, lib = 0;
		if (status & MYSQL_WAIT_TIMEOUT) {
			unsigned int t = mysql_get_timeout_value_ms(c);
			if (t <= (unsigned)tmo) {
				tmo = (int)t;
				lib = 1;
			}
		}
		int n = poll(&p, 1, tmo);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE); /* let the library see the error */
		if (n == 0) {
			if (lib)
				return MYSQL_WAIT_TIMEOUT; /* the library's own timer (connect_timeout) */
			if (left <= 0)
				return 0;
			continue;
		}
		int ev = 0;
		if (p.revents & POLLIN)
			ev |= MYSQL_WAIT_READ;
		if (p.revents & POLLOUT)
			ev |= MYSQL_WAIT_WRITE;
		if (p.revents & POLLPRI)
			ev |= MYSQL_WAIT_EXCEPT;
		if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
			ev |= status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);
		return ev ? ev : status & ~MYSQL_WAIT_TIMEOUT;
	}
}

/* Out of time in the middle of a call: no byte of this connection is read again. */
int dlock__my_timed_out(MYSQL *c, const char *what)
{
	dlock__my_tl_timed_out = 1;
	mariadb_cancel(c); /* shutdown(): the late reply is refused, mysql_close cannot block */
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout",
			       "mysql %s: timed out (no answer by the deadline); the connection was closed", what);
}

/* The connection cannot be used again: it timed out, or the server or the network ended it. */
int dlock__my_conn_dead(MYSQL *c)
{
	return dlock__my_tl_timed_out || dlock__my_is_conn_error(mysql_errno(c));
}

/* Drive one non-blocking call to its end: `st` from its _start, `cont` its _cont. */
#define NB_RUN(c, deadline, st, cont)                            \
	while (st) {                                             \
		int ev_ = nb_wait((c), (st), (deadline));        \
		if (!ev_)                                        \
			return -1;                               \
		st = (cont);                                     \
	}

/* 0 ok, 1 failed (mysql_errno), -1 out of time. */
static int nb_query(MYSQL *c, const char *sql, size_t len, int64_t deadline)
{
	int ret = 0, st = mysql_real_query_start(&ret, c, sql, (unsigned long)len);
	NB_RUN(c, deadline, st, mysql_real_query_cont(&ret, c, ev_));
	return ret ? 1 : 0;
}

int dlock__my_nb_send(MYSQL *c, const char *sql, size_t len, int64_t deadline)
{
	int ret = 0, st = mysql_send_query_start(&ret, c, sql, (unsigned long)len);
	NB_RUN(c, deadline, st, mysql_send_query_cont(&ret, c, ev_));
	return ret ? 1 : 0;
}

int dlock__my_nb_read_result(MYSQL *c, int64_t deadline)
{
	my_bool ret = 0;
	int st = mysql_read_query_result_start(&ret, c);
	NB_RUN(c, deadline, st, mysql_read_query_result_cont(&ret, c, ev_));
	return ret ? 1 : 0;
}

static int nb_store(MYSQL *c, MYSQL_RES **res, int64_t deadline)
{
	*res = NULL;
	int st = mysql_store_result_start(res, c);
	NB_RUN(c, deadline, st, mysql_store_result_cont(res, c, ev_));
	return 0;
}

/* mysql_next_result's values: 0 another result, -1 no more, >0 error; -2 out of time. */
static int nb_next(MYSQL *c, int64_t deadline)
{
	int ret = 0, st = mysql_next_result_start(&ret, c);
	while (st) {
		int ev = nb_wait(c, st, deadline);
		if (!ev)
			return -2;
		st = mysql_next_result_cont(&ret, c, ev);
	}
	return ret;
}

static int nb_connect(MYSQL *c, const mysql_store *b, const char *host, int64_t deadline)
{
	MYSQL *ret = NULL;
	/* FOUND_ROWS: an UPDATE that sets the same expiry still counts as "ours".
	 * MULTI_STATEMENTS: a whole transaction in one round trip; safe because every
	 * value we send is a number or a hex literal. */
	int st = mysql_real_connect_start(&ret, c, b->socket ? NULL : host, b->user, b->password, b->db,
					  (unsigned)b->port, b->socket, CLIENT_FOUND_ROWS | CLIENT_MULTI_STATEMENTS);
	NB_RUN(c, deadline, st, mysql_real_connect_cont(&ret, c, ev_));
	/* The client library makes its socket without close-on-exec: no program
	 * the caller starts (dlock run's COMMAND) may inherit the session. */
	int fd = ret ? (int)mysql_get_socket(c) : -1, fl = fd >= 0 ? fcntl(fd, F_GETFD) : -1;
	if (fl >= 0)
		(void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	return ret ? 0 : 1;
}

/*
 * Read every result of a batch already sent on c. *out (if given) receives
 * the last result set, or NULL. On error the remaining statements did not
 * dlock__my_run; the caller rolls back if a transaction was open.
 */
int dlock__my_read_all(mysql_store *b, MYSQL *c, MYSQL_RES **out, const char *what, int64_t deadline)
{
	MYSQL_RES *last = NULL;
	for (;;) {
		MYSQL_RES *r = NULL;
		if (nb_store(c, &r, deadline) < 0) {
			if (dlock__my_tl_want_partial && !dlock__my_tl_partial)
				dlock__my_tl_partial = last, last = NULL;
			mysql_free_result(last);
			return dlock__my_timed_out(c, what);
		}
		if (r) {
			mysql_free_result(last);
			last = r;
		} else if (mysql_field_count(c) != 0) {
			mysql_free_result(last);
			return sql_fail(b, c, what);
		}
		int st = nb_next(c, deadline);
		if (st == -1)
			break;
		if (st == -2) {
			if (dlock__my_tl_want_partial && !dlock__my_tl_partial)
				dlock__my_tl_partial = last, last = NULL;
			mysql_free_result(last);
			return dlock__my_timed_out(c, what);
		}
		if (st > 0) {
			mysql_free_result(last);
			return sql_fail(b, c, what);
		}
	}
	if (out)
		*out = last;
	else
		mysql_free_result(last);
	return 0;
}

/* Run a batch of statements on c (see dlock__my_read_all). */
int dlock__my_exec(mysql_store *b, MYSQL *c, const char *sql, size_t len, MYSQL_RES **out, const char *what,
		   int64_t deadline)
{
	dlock__my_tl_timed_out = 0;
	if (out)
		*out = NULL;
	int st = nb_query(c, sql, len, deadline);
	if (st < 0)
		return dlock__my_timed_out(c, what);
	if (st > 0)
		return sql_fail(b, c, what);
	return dlock__my_read_all(b, c, out, what, deadline);
}

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static int lib_rc;

static void lib_init(void)
{
	lib_rc = mysql_library_init(0, NULL, NULL);
}

/* Keepalive probes and TCP_USER_TIMEOUT: a connection to a host that went away
 * (a held GET_LOCK connection sits idle between renewals) is ended by the
 * kernel within about the connect timeout, not the system's two hours. */
static void tcp_tune(MYSQL *c, const mysql_store *b)
{
	int fd = (int)mysql_get_socket(c);
	if (fd < 0 || b->socket)
		return;
	int on = 1, idle = (int)b->timeout_s, intvl = 1, cnt = 3;
	unsigned int user_ms = b->timeout_s * 1000u;
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

/* dlock__my_conn_open to one address (host: what libmariadb connects to). */
static int conn_open_at(mysql_store *b, MYSQL **out, const char *host, int64_t deadline)
{
	*out = NULL;
	pthread_once(&lib_once, lib_init);
	if (lib_rc)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "mysql: mysql_library_init failed");
	MYSQL *c = mysql_init(NULL);
	if (!c)
		return dlock_sys_oom();
	my_bool off = 0, on = 1;
	/* The library's own timers are a backstop; the deadline is what bounds a call. */
	int64_t left = deadline - dlock_clock_ms();
	unsigned int conn_s = left <= 1000 ? 1 : (unsigned)((left + 999) / 1000);
	unsigned int io_s = b->timeout_s + 1;
	if (mysql_options(c, MYSQL_OPT_NONBLOCK, 0) != 0) {
		mysql_close(c);
		return dlock_sys_oom();
	}
	mysql_options(c, MYSQL_OPT_CONNECT_TIMEOUT, &conn_s);
	mysql_options(c, MYSQL_OPT_READ_TIMEOUT, &io_s);
	mysql_options(c, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
	/* A silent reconnect would lose GET_LOCK holds and session settings. */
	mysql_options(c, MYSQL_OPT_RECONNECT, &off);
	mysql_options(c, MYSQL_SET_CHARSET_NAME, "utf8mb4");
	if (b->ssl_enforce)
		mysql_options(c, MYSQL_OPT_SSL_ENFORCE, &on);
	if (b->ssl_verify)
		mysql_options(c, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &on);
	if (b->ssl_ca)
		mysql_options(c, MYSQL_OPT_SSL_CA, b->ssl_ca);
	if (b->ssl_capath)
		mysql_options(c, MYSQL_OPT_SSL_CAPATH, b->ssl_capath);
	if (b->ssl_cert)
		mysql_options(c, MYSQL_OPT_SSL_CERT, b->ssl_cert);
	if (b->ssl_key)
		mysql_options(c, MYSQL_OPT_SSL_KEY, b->ssl_key);
	int st = nb_connect(c, b, host, deadline);
	if (st < 0) {
		mariadb_cancel(c);
		mysql_close(c);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout",
				       "mysql: connecting to %s:%d timed out (no answer by the deadline)",
				       b->socket ? b->socket : b->host, b->port);
	}
	if (st > 0) {
		unsigned int e = mysql_errno(c);
		char msg[512], code[32];
		snprintf(msg, sizeof(msg), "%s", mysql_error(c));
		dlock_sys_scrub(msg, sizeof(msg), b->password);
		snprintf(code, sizeof(code), "%u/%s", e, mysql_sqlstate(c));
		mysql_close(c);
		int rc = map_errno(e);
		if (rc == DLOCK_EAUTH)
			return dlock_error_set(rc, KIND, code, "mysql: login to %s as '%s' refused: %s",
					       b->socket ? b->socket : b->host, b->user ? b->user : "", msg);
		if (rc == DLOCK_EINVAL)
			return dlock_error_set(rc, KIND, code, "mysql: %s (create database '%s' first)", msg, b->db);
		return dlock_error_set(rc == DLOCK_ESTORE ? DLOCK_EUNAVAILABLE : rc, KIND, code,
				       "mysql: cannot connect to %s:%d: %s", b->socket ? b->socket : b->host, b->port,
				       msg);
	}
	/* libmariadb 3.3 treats MYSQL_OPT_SSL_ENFORCE as "try TLS": refuse plain text ourselves. */
	if (b->ssl_enforce && !mysql_get_ssl_cipher(c)) {
		mysql_close(c);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "2026",
				       "mysql: TLS is required (ssl=...) but %s:%d did not set up TLS",
				       b->socket ? b->socket : b->host, b->port);
	}
	tcp_tune(c, b);
	/* READ COMMITTED: each statement sees the latest committed holders (no stale
	 * snapshot); the per-name row lock is what serialises decisions. A row lock
	 * wait ends in the server before a request's own deadline. */
	char sql[160];
	snprintf(sql, sizeof(sql),
		 "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; SET SESSION innodb_lock_wait_timeout = %u",
		 b->lock_wait_s);
	int rc = dlock__my_exec(b, c, sql, strlen(sql), NULL, "session setup", deadline);
	if (rc) {
		mysql_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

/*
 * Open a session (connect, TLS, login, session setup), all by `deadline`.
 * libmariadb resolves with a blocking getaddrinfo: the name is resolved here
 * by the deadline and each address tried in turn while time is left. With
 * ssl_verify the library checks the certificate against the host it was
 * given, so it gets the name (after ours answered, its own lookup is not
 * bounded by the deadline: a DNS that stops answering between the two can
 * overrun it). "localhost" is the library's unix socket: left as it is.
 */
int dlock__my_conn_open(mysql_store *b, MYSQL **out, int64_t deadline)
{
	dlock_sys_addrs ad = { 0 };
	if (!b->socket && b->host && strcasecmp(b->host, "localhost") != 0) {
		int rc = dlock_sys_resolve(&ad, b->host, deadline, KIND);
		if (rc)
			return rc;
	}
	if (!ad.n || b->ssl_verify)
		return conn_open_at(b, out, b->host, deadline);
	int rc = 0;
	for (size_t i = 0; i < ad.n; i++) {
		rc = conn_open_at(b, out, ad.addr[i], deadline);
		const char *code = dlock_error_last()->store_code;
		/* another address only when this one could not be reached (2002/2003) */
		if (rc != DLOCK_EUNAVAILABLE || !code || (strncmp(code, "2003/", 5) && strncmp(code, "2002/", 5)) ||
		    deadline - dlock_clock_ms() <= 0)
			break;
	}
	return rc;
}

void dlock__my_conn_drop(MYSQL **c)
{
	if (*c) {
		mysql_close(*c);
		*c = NULL;
	}
}

/*
 * Run a batch on the main connection, connecting first if needed. A batch that
 * met a dead connection (the server restarted, or killed an idle session) is
 * sent once more on a new one if time is left: every batch here is safe to
 * repeat, because it acts only on rows of this hold's own owner token or of
 * expired holds. A batch that ran out of time is not repeated: its connection
 * is closed (so a late reply is never taken for another answer) and the
 * caller hears "timed out"; its effect is unknown (see sys/backend.h).
 */
int dlock__my_run(mysql_store *b, sbuf *sql, MYSQL_RES **out, const char *what, int txn, int64_t deadline)
{
	int rc = dlock__my_sb_check(sql);
	if (rc)
		return rc;
	for (int attempt = 0; attempt < 4; attempt++) {
		if (!b->conn && (rc = dlock__my_conn_open(b, &b->conn, deadline)) != 0)
			return rc;
		rc = dlock__my_exec(b, b->conn, sql->p, sql->len, out, what, deadline);
		if (rc == 0)
			return 0;
		unsigned int e = mysql_errno(b->conn);
		if (dlock__my_conn_dead(b->conn)) {
			int late = dlock__my_tl_timed_out;
			dlock__my_conn_drop(&b->conn);
			if (late || attempt >= 1 || dlock_clock_ms() >= deadline)
				return rc;
			continue;
		}
		if (txn) {
			/* Deadlock rolled back the whole transaction; anything else left it open. */
			if (dlock__my_exec(b, b->conn, "ROLLBACK", 8, NULL, "rollback", deadline) != 0)
				dlock__my_conn_drop(&b->conn);
		}
		if (e != ER_LOCK_DEADLOCK || dlock_clock_ms() >= deadline)
			return rc;
	}
	return rc;
}

/* ---- schema ---- */

/* The tables: schema.sql, embedded at build time; then the version, read back. */
#define STR_(x) #x
#define STR(x) STR_(x)
static const char schema_sql[] = DLOCK__SQL_SCHEMA
	"INSERT IGNORE INTO dlock_meta (k, v) VALUES ('schema_version', '" STR(SCHEMA_VERSION) "');"
	"SELECT v FROM dlock_meta WHERE k = 'schema_version'";

/* Create the tables if missing (and record the version); refuse a newer schema. */
int dlock__my_schema_ensure(mysql_store *b, int64_t deadline)
{
	static const char probe[] = "SELECT v FROM dlock_meta WHERE k = 'schema_version'";
	MYSQL_RES *res = NULL;
	int rc = dlock__my_exec(b, b->conn, probe, sizeof(probe) - 1, &res, "schema check", deadline);
	if (rc && mysql_errno(b->conn) != ER_NO_SUCH_TABLE)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row) {
		/* Only now DDL: a user without CREATE can run on tables an admin made. */
		mysql_free_result(res);
		res = NULL;
		if ((rc = dlock__my_exec(b, b->conn, schema_sql, sizeof(schema_sql) - 1, &res, "creating the schema",
					 deadline)) != 0)
			return rc;
		row = res ? mysql_fetch_row(res) : NULL;
	}
	long v = row && row[0] ? strtol(row[0], NULL, 10) : 0;
	mysql_free_result(res);
	if (v != SCHEMA_VERSION)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "mysql: table dlock_meta in database '%s' says schema version %ld; this "
				       "dlock knows version %d",
				       b->db, v, SCHEMA_VERSION);
	return 0;
}

/* ---- helpers ---- */

int64_t dlock__my_row_i64(MYSQL_ROW row, int i, int64_t dflt)
{
	return row[i] ? strtoll(row[i], NULL, 10) : dflt;
}

uint64_t dlock__my_row_u64(MYSQL_ROW row, int i)
{
	return row[i] ? strtoull(row[i], NULL, 10) : 0;
}

/* "ns = X'..' AND name = X'..'" */
void dlock__my_where_name(sbuf *s, const mysql_store *b, const char *name)
{
	sb_add(s, "ns = %s AND name = ", b->ns_hex);
	dlock__my_sb_hex(s, name);
}

/* The server computes expiries: UTC_TIMESTAMP(6) plus a lease, never a client time. */
long long dlock__my_us(int64_t ms)
{
	return (long long)ms * 1000;
}

int dlock__my_too_late(const dlock_request *req)
{
	return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' not acquired by the end of the wait", req->name);
}

/* After a try that timed out: 1 if its answer (the result set whose first
 * column is `flag`, not an earlier one of the batch) had arrived and said
 * "refused" — then nothing was granted, whatever became of the COMMIT. */
int dlock__my_refused_before_timeout(const char *flag)
{
	MYSQL_RES *res = dlock__my_tl_partial;
	dlock__my_tl_partial = NULL;
	MYSQL_FIELD *f = res && mysql_num_fields(res) > 0 ? mysql_fetch_field_direct(res, 0) : NULL;
	MYSQL_ROW row = f && f->name && strcmp(f->name, flag) == 0 ? mysql_fetch_row(res) : NULL;
	int refused = row && row[0] && strcmp(row[0], "1") != 0;
	mysql_free_result(res);
	return refused;
}
