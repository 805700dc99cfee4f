/*
 * The MySQL / MariaDB store (libmariadb).
 *
 *   mysql://user:pass@host:port/db[?mode=table|get_lock][&socket=PATH][&ssl=...]
 *
 * mode=table (default): leases in InnoDB tables, judged only by the server's
 * clock (UTC_TIMESTAMP(6)); no client time ever reaches the server. Every
 * change to the holders of a name happens in a transaction that first takes
 * the X row lock of that name's counter row in dlock_lock, so decisions about
 * one name are serialised on the server. An acquire is one round trip: the
 * whole transaction goes as one multi-statement batch.
 *
 * mode=get_lock: GET_LOCK on a connection of its own per hold, kept open for
 * the hold's life (req->slot). The lock dies with the connection; the
 * session's wait_timeout is set to the lease so a client cut off from the
 * server loses it after its TTL, like every other store. Waiters block in the
 * server (GET_LOCK with a timeout) and are woken by the release.
 *
 * docs/stores/mysql.md has the guarantees and the failure model.
 */
#include "support.h"

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KIND "mysql"
#define SCHEMA_VERSION 1
#define POOL_MAX 4
#define RENEW_CHUNK 200
/* GET_LOCK names: MySQL 5.7+ refuses names over 64 characters. */
#define KEY_MAX_CHARS 64

enum { MODE_TABLE, MODE_GET_LOCK };

/* One GET_LOCK hold: its own connection (req->slot). */
typedef struct gl_hold {
	struct gl_hold *next;
	MYSQL *conn;           /* NULL once the connection failed: the lock is gone */
	unsigned long conn_id; /* CONNECTION_ID() of conn */
	int waited;            /* taken by g_wait; g_acquire completes the grant */
	char key_hex[2 * 4 * KEY_MAX_CHARS + 1];
} gl_hold;

typedef struct mysql_be {
	dlock_backend base;
	int mode;
	char *host, *user, *password, *db, *socket;
	int port;
	unsigned int timeout_s;     /* connect timeout, whole seconds (keepalive, backstop timers) */
	unsigned int lock_wait_s;   /* innodb_lock_wait_timeout: under one request's bound */
	int64_t connect_timeout_ms; /* bound of the whole open */
	int64_t request_timeout_ms; /* bound of status */
	char *ssl_ca, *ssl_capath, *ssl_cert, *ssl_key;
	int ssl_enforce, ssl_verify;
	char *ns_hex; /* X'..' literal of the prefix */
	MYSQL *conn;  /* table ops, status, schema */
	MYSQL *pool[POOL_MAX];
	size_t npool;
	gl_hold *holds;
	/* g_wait runs without the store mutex: its connections have their own. */
	pthread_mutex_t wait_mu;
	MYSQL *wait_pool[POOL_MAX];
	size_t nwait_pool;
} mysql_be;

/* ---- small string builder ---- */

/* The store's SQL text: support.h's growable string. */
typedef dlock__sbuf sbuf;
#define sb_add dlock__sb_add

/* Append a hex literal X'..' of a byte string: nothing from a caller is ever quoted or escaped. */
static void sb_hex(sbuf *s, const char *bytes)
{
	size_t n = strlen(bytes);
	char *h = malloc(2 * n + 1);
	if (!h) {
		s->failed = 1;
		return;
	}
	dlock__hex(h, bytes, n);
	dlock__sb_put(s, "X'", 2);
	dlock__sb_put(s, h, 2 * n);
	dlock__sb_put(s, "'", 1);
	free(h);
}

static int sb_check(sbuf *s)
{
	if (s->failed) {
		free(s->p);
		s->p = NULL;
		return dlock__oom();
	}
	return 0;
}

/* ---- errors ---- */

/* The connection is unusable: a client-side CR_* error, or the server ended the
 * session (KILL: 1927 ER_CONNECTION_KILLED; MySQL 8's idle timeout: 4031). */
static int is_conn_error(unsigned int e)
{
	return (e >= 2000 && e < 3000) || e == 1927 || e == 4031;
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
	case 1698: /* ER_ACCESS_DENIED_NO_PASSWORD_ERROR */
	case 1862: /* ER_MUST_CHANGE_PASSWORD_LOGIN */
		return DLOCK_EAUTH;
	case ER_BAD_DB_ERROR:
		return DLOCK_EINVAL;
	case ER_LOCK_DEADLOCK:
	case ER_LOCK_WAIT_TIMEOUT:
	case ER_CON_COUNT_ERROR:
	case ER_SERVER_SHUTDOWN:
		return DLOCK_EUNAVAILABLE;
	}
	return is_conn_error(e) ? DLOCK_EUNAVAILABLE : DLOCK_ESTORE;
}

/* Record the error of connection c (what: which step failed) and return its code. */
static int sql_fail(const mysql_be *b, MYSQL *c, const char *what)
{
	unsigned int e = mysql_errno(c);
	char msg[512], code[32];
	snprintf(msg, sizeof(msg), "%s", mysql_error(c));
	dlock__scrub(msg, sizeof(msg), b->password);
	snprintf(code, sizeof(code), "%u/%s", e, mysql_sqlstate(c));
	int rc = map_errno(e);
	if (e == ER_BAD_DB_ERROR)
		return dlock_error_set(rc, KIND, code, "mysql: %s (create the database first: CREATE DATABASE ...)", msg);
	return dlock_error_set(rc, KIND, code, "mysql %s: %s", what, msg);
}

/* ---- connections: every socket wait bounded by the caller's deadline ---- */

/*
 * Every connection runs in MariaDB's non-blocking mode (MYSQL_OPT_NONBLOCK):
 * each call is started with its _start function and continued with _cont
 * while we poll the socket, never past the deadline the core gave. A call
 * that runs out of time leaves its connection unusable (a late reply must
 * never be read as the answer to the next statement): the socket is shut
 * down at once (mariadb_cancel), tl_timed_out is set, and the caller closes
 * the connection; the next call opens a new one, bounded by its own deadline.
 */
static _Thread_local int tl_timed_out;
/* An acquire's answer (its SELECT) comes before its COMMIT's OK. When only the
 * OK is missing at the deadline, a refusal is still known for sure (a refused
 * try grants nothing, committed or not): read_all keeps the last result set
 * here for a caller that set tl_want_partial, which takes and frees it. */
static _Thread_local int tl_want_partial;
static _Thread_local MYSQL_RES *tl_partial;

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
static int timed_out(MYSQL *c, const char *what)
{
	tl_timed_out = 1;
	mariadb_cancel(c); /* shutdown(): the late reply is refused, mysql_close cannot block */
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout",
			       "mysql %s: timed out (no answer by the deadline); the connection was closed", what);
}

/* The connection cannot be used again: it timed out, or the server or the network ended it. */
static int conn_dead(MYSQL *c)
{
	return tl_timed_out || is_conn_error(mysql_errno(c));
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

static int nb_send(MYSQL *c, const char *sql, size_t len, int64_t deadline)
{
	int ret = 0, st = mysql_send_query_start(&ret, c, sql, (unsigned long)len);
	NB_RUN(c, deadline, st, mysql_send_query_cont(&ret, c, ev_));
	return ret ? 1 : 0;
}

static int nb_read_result(MYSQL *c, int64_t deadline)
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

static int nb_connect(MYSQL *c, const mysql_be *b, const char *host, int64_t deadline)
{
	MYSQL *ret = NULL;
	/* FOUND_ROWS: an UPDATE that sets the same expiry still counts as "ours".
	 * MULTI_STATEMENTS: a whole transaction in one round trip; safe because every
	 * value we send is a number or a hex literal. */
	int st = mysql_real_connect_start(&ret, c, b->socket ? NULL : host, b->user, b->password, b->db,
					  (unsigned)b->port, b->socket, CLIENT_FOUND_ROWS | CLIENT_MULTI_STATEMENTS);
	NB_RUN(c, deadline, st, mysql_real_connect_cont(&ret, c, ev_));
	return ret ? 0 : 1;
}

/*
 * Read every result of a batch already sent on c. *out (if given) receives
 * the last result set, or NULL. On error the remaining statements did not
 * run; the caller rolls back if a transaction was open.
 */
static int read_all(mysql_be *b, MYSQL *c, MYSQL_RES **out, const char *what, int64_t deadline)
{
	MYSQL_RES *last = NULL;
	for (;;) {
		MYSQL_RES *r = NULL;
		if (nb_store(c, &r, deadline) < 0) {
			if (tl_want_partial && !tl_partial)
				tl_partial = last, last = NULL;
			mysql_free_result(last);
			return timed_out(c, what);
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
			if (tl_want_partial && !tl_partial)
				tl_partial = last, last = NULL;
			mysql_free_result(last);
			return timed_out(c, what);
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

/* Run a batch of statements on c (see read_all). */
static int exec(mysql_be *b, MYSQL *c, const char *sql, size_t len, MYSQL_RES **out, const char *what,
		int64_t deadline)
{
	tl_timed_out = 0;
	if (out)
		*out = NULL;
	int st = nb_query(c, sql, len, deadline);
	if (st < 0)
		return timed_out(c, what);
	if (st > 0)
		return sql_fail(b, c, what);
	return read_all(b, c, out, what, deadline);
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
static void tcp_tune(MYSQL *c, const mysql_be *b)
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

/* conn_open to one address (host: what libmariadb connects to). */
static int conn_open_at(mysql_be *b, MYSQL **out, const char *host, int64_t deadline)
{
	*out = NULL;
	pthread_once(&lib_once, lib_init);
	if (lib_rc)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "mysql: mysql_library_init failed");
	MYSQL *c = mysql_init(NULL);
	if (!c)
		return dlock__oom();
	my_bool off = 0, on = 1;
	/* The library's own timers are a backstop; the deadline is what bounds a call. */
	int64_t left = deadline - dlock_clock_ms();
	unsigned int conn_s = left <= 1000 ? 1 : (unsigned)((left + 999) / 1000);
	unsigned int io_s = b->timeout_s + 1;
	if (mysql_options(c, MYSQL_OPT_NONBLOCK, 0) != 0) {
		mysql_close(c);
		return dlock__oom();
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
		dlock__scrub(msg, sizeof(msg), b->password);
		snprintf(code, sizeof(code), "%u/%s", e, mysql_sqlstate(c));
		mysql_close(c);
		int rc = map_errno(e);
		if (rc == DLOCK_EAUTH)
			return dlock_error_set(rc, KIND, code, "mysql: login to %s as '%s' refused: %s",
					       b->socket ? b->socket : b->host, b->user ? b->user : "", msg);
		if (rc == DLOCK_EINVAL)
			return dlock_error_set(rc, KIND, code, "mysql: %s (create database '%s' first)", msg, b->db);
		return dlock_error_set(rc == DLOCK_ESTORE ? DLOCK_EUNAVAILABLE : rc, KIND, code,
				       "mysql: cannot connect to %s:%d: %s", b->socket ? b->socket : b->host,
				       b->port, msg);
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
	int rc = exec(b, c, sql, strlen(sql), NULL, "session setup", deadline);
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
static int conn_open(mysql_be *b, MYSQL **out, int64_t deadline)
{
	dlock__addrs ad = { 0 };
	if (!b->socket && b->host && strcasecmp(b->host, "localhost") != 0) {
		int rc = dlock__resolve(&ad, b->host, deadline, KIND);
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

static void conn_drop(MYSQL **c)
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
static int run(mysql_be *b, sbuf *sql, MYSQL_RES **out, const char *what, int txn, int64_t deadline)
{
	int rc = sb_check(sql);
	if (rc)
		return rc;
	for (int attempt = 0; attempt < 4; attempt++) {
		if (!b->conn && (rc = conn_open(b, &b->conn, deadline)) != 0)
			return rc;
		rc = exec(b, b->conn, sql->p, sql->len, out, what, deadline);
		if (rc == 0)
			return 0;
		unsigned int e = mysql_errno(b->conn);
		if (conn_dead(b->conn)) {
			int late = tl_timed_out;
			conn_drop(&b->conn);
			if (late || attempt >= 1 || dlock_clock_ms() >= deadline)
				return rc;
			continue;
		}
		if (txn) {
			/* Deadlock rolled back the whole transaction; anything else left it open. */
			if (exec(b, b->conn, "ROLLBACK", 8, NULL, "rollback", deadline) != 0)
				conn_drop(&b->conn);
		}
		if (e != ER_LOCK_DEADLOCK || dlock_clock_ms() >= deadline)
			return rc;
	}
	return rc;
}

/* ---- schema ---- */

static const char schema_sql[] =
	"CREATE TABLE IF NOT EXISTS dlock_meta ("
	" k VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,"
	" v VARCHAR(255) CHARACTER SET ascii NOT NULL"
	") ENGINE=InnoDB;"
	/* One row per name ever locked: the fence counter. Never deleted. */
	"CREATE TABLE IF NOT EXISTS dlock_lock ("
	" ns VARBINARY(255) NOT NULL,"
	" name VARBINARY(512) NOT NULL,"
	" fence BIGINT UNSIGNED NOT NULL DEFAULT 0,"
	" PRIMARY KEY (ns, name)"
	") ENGINE=InnoDB;"
	"CREATE TABLE IF NOT EXISTS dlock_holder ("
	" ns VARBINARY(255) NOT NULL,"
	" name VARBINARY(512) NOT NULL,"
	" owner VARBINARY(128) NOT NULL,"
	" mode TINYINT NOT NULL,"
	" permits INT UNSIGNED NOT NULL,"
	" fence BIGINT UNSIGNED NOT NULL,"
	" expires DATETIME(6) NOT NULL,"
	" host VARBINARY(255) NOT NULL DEFAULT '',"
	" pid INT NOT NULL DEFAULT 0,"
	/* mode=get_lock: the session holding the GET_LOCK (the row is only a
	 * record for status; the lock itself is the server's). 0 in mode=table. */
	" conn_id BIGINT UNSIGNED NOT NULL DEFAULT 0,"
	" PRIMARY KEY (ns, name, owner)"
	") ENGINE=InnoDB;"
	"CREATE TABLE IF NOT EXISTS dlock_waiter ("
	" seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
	" ns VARBINARY(255) NOT NULL,"
	" name VARBINARY(512) NOT NULL,"
	" owner VARBINARY(128) NOT NULL,"
	" mode TINYINT NOT NULL,"
	" expires DATETIME(6) NOT NULL,"
	" UNIQUE KEY name_owner (ns, name, owner)"
	") ENGINE=InnoDB;"
	"INSERT IGNORE INTO dlock_meta (k, v) VALUES ('schema_version', '1');"
	"SELECT v FROM dlock_meta WHERE k = 'schema_version'";

/* Create the tables if missing (and record the version); refuse a newer schema. */
static int schema_ensure(mysql_be *b, int64_t deadline)
{
	static const char probe[] = "SELECT v FROM dlock_meta WHERE k = 'schema_version'";
	MYSQL_RES *res = NULL;
	int rc = exec(b, b->conn, probe, sizeof(probe) - 1, &res, "schema check", deadline);
	if (rc && mysql_errno(b->conn) != ER_NO_SUCH_TABLE)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row) {
		/* Only now DDL: a user without CREATE can run on tables an admin made. */
		mysql_free_result(res);
		res = NULL;
		if ((rc = exec(b, b->conn, schema_sql, sizeof(schema_sql) - 1, &res, "creating the schema", deadline)) != 0)
			return rc;
		row = res ? mysql_fetch_row(res) : NULL;
	}
	long v = row && row[0] ? strtol(row[0], NULL, 10) : 0;
	mysql_free_result(res);
	if (v != SCHEMA_VERSION)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "mysql: table dlock_meta in database '%s' says schema version %ld; this "
				       "dlock knows version %d", b->db, v, SCHEMA_VERSION);
	return 0;
}

/* ---- helpers ---- */

static int64_t row_i64(MYSQL_ROW row, int i, int64_t dflt)
{
	return row[i] ? strtoll(row[i], NULL, 10) : dflt;
}

static uint64_t row_u64(MYSQL_ROW row, int i)
{
	return row[i] ? strtoull(row[i], NULL, 10) : 0;
}

/* "ns = X'..' AND name = X'..'" */
static void where_name(sbuf *s, const mysql_be *b, const char *name)
{
	sb_add(s, "ns = %s AND name = ", b->ns_hex);
	sb_hex(s, name);
}

/* The server computes expiries: UTC_TIMESTAMP(6) plus a lease, never a client time. */
static long long us(int64_t ms)
{
	return (long long)ms * 1000;
}

static int too_late(const dlock_request *req)
{
	return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' not acquired by the end of the wait",
			       req->name);
}

/* After a try that timed out: 1 if its answer (the result set whose first
 * column is `flag`, not an earlier one of the batch) had arrived and said
 * "refused" — then nothing was granted, whatever became of the COMMIT. */
static int refused_before_timeout(const char *flag)
{
	MYSQL_RES *res = tl_partial;
	tl_partial = NULL;
	MYSQL_FIELD *f = res && mysql_num_fields(res) > 0 ? mysql_fetch_field_direct(res, 0) : NULL;
	MYSQL_ROW row = f && f->name && strcmp(f->name, flag) == 0 ? mysql_fetch_row(res) : NULL;
	int refused = row && row[0] && strcmp(row[0], "1") != 0;
	mysql_free_result(res);
	return refused;
}

/* ================= mode=table ================= */

static int t_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	mysql_be *b = (mysql_be *)be;
	sbuf s = { 0 };
	int mode = req->mode == DLOCK_SHARED ? 1 : 0;
	unsigned permits = req->permits;

	/* The X lock on the counter row (taken by the upsert, kept until COMMIT)
	 * serialises every acquire of this name: holder rows of a name are only ever
	 * inserted by a transaction holding it, so the checks below cannot race. */
	sb_add(&s, "START TRANSACTION;"
		   "INSERT INTO dlock_lock (ns, name, fence) VALUES (%s, ", b->ns_hex);
	sb_hex(&s, req->name);
	sb_add(&s, ", 0) ON DUPLICATE KEY UPDATE fence = fence;"
		   "SELECT fence FROM dlock_lock WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " FOR UPDATE;"
		   "SET @dl_now = UTC_TIMESTAMP(6);"
		   /* Expired holds go; so does an earlier grant to this very owner token
		    * (a retry whose first reply was lost). */
		   "DELETE FROM dlock_holder WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND (expires <= @dl_now OR owner = ");
	sb_hex(&s, req->owner);
	sb_add(&s, ");DELETE FROM dlock_waiter WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND expires <= @dl_now;SET @dl_ok = (1");
	if (mode == 1) {
		/* Readers: no writer holds it ... */
		sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_holder WHERE ");
		where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 0)");
		/* ... and (writer preference) no writer is waiting. */
		if (!req->fair) {
			sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_waiter WHERE ");
			where_name(&s, b, req->name);
			sb_add(&s, " AND mode = 0)");
		}
	} else {
		/* A writer (or one of N semaphore permits), none a reader, and the
		 * permits rule (dlock/lock.h): holders + 1 <= the smallest permits
		 * among the holders and us (a mutex holder, 1, admits nobody). */
		sb_add(&s, " AND (SELECT COUNT(*) FROM dlock_holder WHERE ");
		where_name(&s, b, req->name);
		sb_add(&s, ") < LEAST(%u, COALESCE((SELECT MIN(permits) FROM dlock_holder WHERE ", permits);
		where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 0), %u)) AND NOT EXISTS (SELECT 1 FROM dlock_holder WHERE ", permits);
		where_name(&s, b, req->name);
		sb_add(&s, " AND mode = 1)");
	}
	if (req->fair) {
		/* FIFO: nobody registered before us is still waiting (a newcomer is behind everyone). */
		sb_add(&s, " AND NOT EXISTS (SELECT 1 FROM dlock_waiter w WHERE w.ns = %s AND w.name = ", b->ns_hex);
		sb_hex(&s, req->name);
		sb_add(&s, " AND w.owner <> ");
		sb_hex(&s, req->owner);
		sb_add(&s, " AND w.seq < COALESCE((SELECT seq FROM dlock_waiter WHERE ");
		where_name(&s, b, req->name);
		sb_add(&s, " AND owner = ");
		sb_hex(&s, req->owner);
		sb_add(&s, "), 18446744073709551615))");
	}
	sb_add(&s, ");UPDATE dlock_lock SET fence = LAST_INSERT_ID(fence + 1) WHERE @dl_ok AND ");
	where_name(&s, b, req->name);
	sb_add(&s, ";SET @dl_f = IF(@dl_ok, LAST_INSERT_ID(), 0);"
		   "INSERT INTO dlock_holder (ns, name, owner, mode, permits, fence, expires, host, pid) "
		   "SELECT %s, ", b->ns_hex);
	sb_hex(&s, req->name);
	sb_add(&s, ", ");
	sb_hex(&s, req->owner);
	sb_add(&s, ", %d, %u, @dl_f, @dl_now + INTERVAL %lld MICROSECOND, ", mode, permits, us(req->ttl_ms));
	sb_hex(&s, req->host ? req->host : "");
	sb_add(&s, ", %d FROM DUAL WHERE @dl_ok;", req->pid);
	/* Granted: leave the queue. Refused and waiting: join it, or refresh our place. */
	sb_add(&s, "DELETE FROM dlock_waiter WHERE @dl_ok AND ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	sb_add(&s, ";");
	if (req->waiting) {
		sb_add(&s, "INSERT INTO dlock_waiter (ns, name, owner, mode, expires) SELECT %s, ", b->ns_hex);
		sb_hex(&s, req->name);
		sb_add(&s, ", ");
		sb_hex(&s, req->owner);
		sb_add(&s, ", %d, @dl_now + INTERVAL %lld MICROSECOND FROM DUAL WHERE NOT @dl_ok "
			   "ON DUPLICATE KEY UPDATE expires = VALUES(expires);",
		       mode, us(req->queue_ttl_ms));
	}
	sb_add(&s, "SET @dl_left = (SELECT TIMESTAMPDIFF(MICROSECOND, @dl_now, MIN(expires)) FROM dlock_holder WHERE ");
	where_name(&s, b, req->name);
	/* The answer before COMMIT: once the grant or the waiter row is visible to
	 * others, only the COMMIT's OK is still on its way to us. */
	sb_add(&s, ");SELECT @dl_ok, @dl_f, @dl_left;COMMIT");

	MYSQL_RES *res;
	int64_t deadline = req->deadline_ms;
	if (dlock_try_too_late(req, b->request_timeout_ms)) { /* see "Time" in sys/backend.h */
		free(s.p);
		return too_late(req);
	}
	tl_want_partial = 1;
	int rc = run(b, &s, &res, "acquire", 1, deadline);
	tl_want_partial = 0;
	free(s.p);
	if (rc && tl_timed_out && refused_before_timeout("@dl_ok"))
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' is held (the answer came, its commit's did not)",
				       req->name);
	mysql_free_result(tl_partial); /* a partial answer that says nothing for sure */
	tl_partial = NULL;
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row) {
		mysql_free_result(res);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "mysql acquire: no result row");
	}
	int ok = row_i64(row, 0, 0) != 0;
	uint64_t f = row_u64(row, 1);
	int64_t left = row_i64(row, 2, -1);
	mysql_free_result(res);
	if (ok) {
		*fence = f;
		return 0;
	}
	if (left >= 0 && retry_ms)
		*retry_ms = left / 1000;
	return DLOCK_ELOCKED;
}

static int affected_one(mysql_be *b, sbuf *s, const char *what, int *hit, int64_t deadline)
{
	MYSQL_RES *res;
	int rc = run(b, s, &res, what, 0, deadline);
	free(s->p);
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	*hit = row && row_i64(row, 0, 0) > 0;
	mysql_free_result(res);
	return 0;
}

static int t_release(dlock_backend *be, dlock_request *req)
{
	mysql_be *b = (mysql_be *)be;
	sbuf s = { 0 };
	/* Ours only while unexpired; an expired row of ours is cleaned up either way. */
	sb_add(&s, "DELETE FROM dlock_holder WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	sb_add(&s, " AND expires > UTC_TIMESTAMP(6);SET @dl_n = ROW_COUNT();DELETE FROM dlock_holder WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	sb_add(&s, ";SELECT @dl_n");
	int hit = 0, rc = affected_one(b, &s, "release", &hit, req->deadline_ms);
	if (rc)
		return rc;
	return hit ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by this owner", req->name);
}

static int t_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	mysql_be *b = (mysql_be *)be;
	sbuf s = { 0 };
	sb_add(&s, "UPDATE dlock_holder SET expires = UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND WHERE ",
	       us(ttl_ms));
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	sb_add(&s, " AND expires > UTC_TIMESTAMP(6);SELECT ROW_COUNT()");
	int hit = 0, rc = affected_one(b, &s, "extend", &hit, req->deadline_ms);
	if (rc)
		return rc;
	return hit ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by this owner", req->name);
}

/* Renew up to RENEW_CHUNK holds in one round trip: one UPDATE, then read back which are ours. */
static int t_renew_chunk(mysql_be *b, dlock_request *const *reqs, size_t n, int *results)
{
	sbuf s = { 0 }, in = { 0 };
	for (size_t i = 0; i < n; i++) {
		sb_add(&in, "%s(", i ? "," : "");
		sb_hex(&in, reqs[i]->name);
		sb_add(&in, ",");
		sb_hex(&in, reqs[i]->owner);
		sb_add(&in, ")");
	}
	int rc = sb_check(&in);
	if (rc)
		return rc;
	sb_add(&s, "UPDATE dlock_holder SET expires = CASE owner");
	for (size_t i = 0; i < n; i++) {
		sb_add(&s, " WHEN ");
		sb_hex(&s, reqs[i]->owner);
		sb_add(&s, " THEN UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND", us(reqs[i]->ttl_ms));
	}
	/* Owner tokens are unique per hold, so (name, owner) names exactly one row. */
	sb_add(&s, " ELSE expires END WHERE ns = %s AND (name, owner) IN (%s) AND expires > UTC_TIMESTAMP(6);"
		   "SELECT owner FROM dlock_holder WHERE ns = %s AND (name, owner) IN (%s) AND expires > UTC_TIMESTAMP(6)",
	       b->ns_hex, in.p ? in.p : "", b->ns_hex, in.p ? in.p : "");
	free(in.p);
	MYSQL_RES *res;
	rc = run(b, &s, &res, "renew", 0, reqs[0]->deadline_ms);
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
static int t_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	return t_renew_chunk((mysql_be *)be, reqs, n, results);
}

static int t_cancel(dlock_backend *be, dlock_request *req)
{
	mysql_be *b = (mysql_be *)be;
	/* The core cancels when a wait ends. If the last try lost the connection
	 * (it timed out), a reconnect now would overrun the caller's wait on a
	 * link that just failed: leave the registration to expire by itself
	 * (queue_ttl_ms, as a crashed waiter's does). */
	if (!b->conn)
		return 0;
	sbuf s = { 0 };
	sb_add(&s, "DELETE FROM dlock_waiter WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	int rc = run(b, &s, NULL, "cancel", 0, req->deadline_ms);
	free(s.p);
	return rc;
}

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
static void sb_key(sbuf *s, const mysql_be *b, const char *name_sql)
{
	sbuf k = { 0 };
	sb_add(&k, "CONCAT(CONVERT(");
	sb_hex(&k, b->db);
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

static void pool_put(mysql_be *b, MYSQL *c)
{
	if (b->npool < POOL_MAX)
		b->pool[b->npool++] = c;
	else
		mysql_close(c);
}

static void hold_free(mysql_be *b, gl_hold *h, int reuse)
{
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
static void sb_touch(sbuf *s, const mysql_be *b, const gl_hold *h, const dlock_request *req, int64_t ttl_ms)
{
	sb_add(s, "SET @dl_ok = ");
	sb_mine(s, h);
	sb_add(s, ";UPDATE dlock_holder SET expires = UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND WHERE @dl_ok AND ",
	       us(ttl_ms));
	where_name(s, b, req->name);
	sb_add(s, " AND owner = ");
	sb_hex(s, req->owner);
	sb_add(s, ";SELECT @dl_ok");
}

/*
 * The statements after "SET @dl_got = GET_LOCK(...)" (1 when this session now
 * holds the key): count the fence and write the holder record if got, and
 * keep the waiter record. Ends with the transaction open: the caller adds
 * COMMIT and its SELECT. nm: the name as a hex literal.
 */
static void sb_grant(sbuf *s, const mysql_be *b, const dlock_request *req, const char *nm, int waiting)
{
	/* The fence is counted while the lock is already ours, so fences grow in
	 * grant order. The holder row is a record for status; older rows of this
	 * name are of sessions that no longer hold it (we do). */
	sb_add(s, "START TRANSACTION;"
		  "INSERT INTO dlock_lock (ns, name, fence) SELECT %s, %s, LAST_INSERT_ID(1) FROM DUAL "
		  "WHERE @dl_got = 1 ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(dlock_lock.fence + 1);"
		  "SET @dl_f = IF(@dl_got = 1, LAST_INSERT_ID(), 0);"
		  "DELETE FROM dlock_holder WHERE @dl_got = 1 AND ns = %s AND name = %s AND conn_id <> 0;"
		  "INSERT INTO dlock_holder (ns, name, owner, mode, permits, fence, expires, host, pid, conn_id) "
		  "SELECT %s, %s, ",
	       b->ns_hex, nm, b->ns_hex, nm, b->ns_hex, nm);
	sb_hex(s, req->owner);
	sb_add(s, ", 0, 1, @dl_f, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND, ", us(req->ttl_ms));
	sb_hex(s, req->host ? req->host : "");
	sb_add(s, ", %d, CONNECTION_ID() FROM DUAL WHERE @dl_got = 1;", req->pid);
	/* A waiter is a record for status (the queue itself is the server's
	 * GET_LOCK wait): refused and waiting, register or refresh; granted, leave. */
	sb_add(s, "DELETE FROM dlock_waiter WHERE @dl_got = 1 AND ns = %s AND name = %s AND owner = ", b->ns_hex, nm);
	sb_hex(s, req->owner);
	sb_add(s, ";");
	if (waiting) {
		sb_add(s, "INSERT INTO dlock_waiter (ns, name, owner, mode, expires) SELECT %s, %s, ", b->ns_hex, nm);
		sb_hex(s, req->owner);
		sb_add(s, ", 0, UTC_TIMESTAMP(6) + INTERVAL %lld MICROSECOND FROM DUAL WHERE @dl_got <> 1 "
			  "ON DUPLICATE KEY UPDATE expires = VALUES(expires);",
		       us(req->queue_ttl_ms));
	}
}

static int g_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	mysql_be *b = (mysql_be *)be;
	(void)retry_ms; /* GET_LOCK says nothing about when it frees up */
	if (req->mode == DLOCK_SHARED || req->permits > 1 || req->fair)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "mysql mode=get_lock has only exclusive locks: GET_LOCK has no shared mode, "
				       "no permits and no FIFO queue (use mode=table for %s)",
				       req->mode == DLOCK_SHARED ? "shared locks" :
				       req->permits > 1 ? "semaphores" : "fair locks");
	MYSQL *waited = NULL;
	if (req->slot) {
		gl_hold *old = req->slot;
		req->slot = NULL;
		if (old->waited) { /* g_wait already got GET_LOCK on this connection */
			waited = old->conn;
			free(old);
		} else { /* left over from a hold that was lost: its connection is useless */
			hold_free(b, old, 0);
		}
	}
	sbuf s = { 0 }, nm = { 0 };
	sb_hex(&nm, req->name);
	int rc = sb_check(&nm);
	if (rc)
		return rc;
	sb_add(&s, "SET SESSION wait_timeout = %ld;SET @dl_k = ", wait_timeout_s(req->ttl_ms));
	sb_key(&s, b, nm.p);
	/* GET_LOCK nests: a session that already holds the key (from g_wait) must not take it twice. */
	sb_add(&s, ";SET @dl_got = IF(IS_USED_LOCK(@dl_k) <=> CONNECTION_ID(), 1, GET_LOCK(@dl_k, 0));");
	sb_grant(&s, b, req, nm.p, req->waiting);
	sb_add(&s, "SELECT @dl_got, @dl_f, HEX(@dl_k), CONNECTION_ID();COMMIT");
	free(nm.p);
	if ((rc = sb_check(&s)) != 0) {
		if (waited)
			mysql_close(waited);
		return rc;
	}
	MYSQL *c = NULL;
	MYSQL_RES *res = NULL;
	/* A grant g_wait got is completed with whatever time is left (one batch
	 * on its open connection); with none left, closing the connection gives
	 * GET_LOCK back: not acquired in time. */
	int64_t deadline = req->deadline_ms;
	if (waited ? deadline <= dlock_clock_ms() : dlock_try_too_late(req, b->request_timeout_ms)) {
		if (waited)
			mysql_close(waited);
		free(s.p);
		return too_late(req);
	}
	for (int attempt = 0; attempt < 2; attempt++) {
		int pooled = !waited && (b->npool > 0 || b->conn);
		if (waited)
			c = waited, waited = NULL;
		else if (b->npool > 0)
			c = b->pool[--b->npool];
		else if (b->conn) /* the open's session: status reconnects when it needs one */
			c = b->conn, b->conn = NULL;
		else if ((rc = conn_open(b, &c, deadline)) != 0)
			break;
		tl_want_partial = 1;
		rc = exec(b, c, s.p, s.len, &res, "GET_LOCK", deadline);
		tl_want_partial = 0;
		if (rc == 0)
			break;
		/* A pooled session the server ended meanwhile (wait_timeout): use a new one. */
		int retry = pooled && !tl_timed_out && is_conn_error(mysql_errno(c)) && dlock_clock_ms() < deadline;
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
	if (rc && tl_timed_out && refused_before_timeout("@dl_got"))
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' is held (the answer came, its commit's did not)",
				       req->name);
	mysql_free_result(tl_partial);
	tl_partial = NULL;
	if (rc)
		return rc;
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	if (!row || !row[0] || !row[2]) {
		mysql_free_result(res);
		mysql_close(c);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "mysql GET_LOCK returned NULL (an error in the server)");
	}
	if (row_i64(row, 0, 0) != 1) {
		mysql_free_result(res);
		pool_put(b, c);
		return DLOCK_ELOCKED;
	}
	gl_hold *h = dlock__calloc(1, sizeof(*h));
	if (!h) {
		mysql_free_result(res);
		mysql_close(c);
		return DLOCK_ENOMEM;
	}
	h->conn = c;
	*fence = row_u64(row, 1);
	snprintf(h->key_hex, sizeof(h->key_hex), "%s", row[2]);
	h->conn_id = (unsigned long)row_u64(row, 3);
	mysql_free_result(res);
	h->next = b->holds;
	b->holds = h;
	req->slot = h;
	return 0;
}

/*
 * Block in the server until the key is free (GET_LOCK with a timeout: MariaDB
 * wakes the waiter the moment the holder releases or its session ends), on a
 * connection of its own. If it granted, the hold is left in req->slot and the
 * core's next g_acquire (the core always tries again after a wait) completes
 * it there. Runs without the store mutex; only this request's thread touches
 * req->slot before the grant.
 */
static int g_wait(dlock_backend *be, dlock_request *req, int64_t timeout_ms)
{
	mysql_be *b = (mysql_be *)be;
	if (req->slot || timeout_ms <= 0 || req->mode == DLOCK_SHARED || req->permits > 1 || req->fair)
		return 0;
	MYSQL *c = NULL;
	pthread_mutex_lock(&b->wait_mu);
	if (b->nwait_pool > 0)
		c = b->wait_pool[--b->nwait_pool];
	pthread_mutex_unlock(&b->wait_mu);
	/* The server answers GET_LOCK a little before our own limit, so that a wait
	 * that simply ran out keeps its connection. */
	int64_t start = dlock_clock_ms(), deadline = start + timeout_ms;
	int64_t margin = timeout_ms / 5 < 100 ? timeout_ms / 5 : 100;
	if (!c && conn_open(b, &c, deadline) != 0) {
		int64_t left = deadline - dlock_clock_ms();
		if (left > 0) /* not a busy loop while the server is away */
			dlock__sleep_ms(left < 50 ? left : 50);
		return 0;
	}
	int64_t server_ms = deadline - margin - dlock_clock_ms();
	if (server_ms < 0)
		server_ms = 0;
	sbuf s = { 0 }, nm = { 0 };
	sb_hex(&nm, req->name);
	if (!nm.failed) {
		/* If ever nobody completes the grant, the server frees it after a lease. */
		sb_add(&s, "SET SESSION wait_timeout = %ld;SET @dl_k = ", wait_timeout_s(req->ttl_ms));
		sb_key(&s, b, nm.p);
		/* A grant is recorded (fence, holder record) in the same batch, so that
		 * a grant whose reply is lost is seen in status like any other. */
		sb_add(&s, ";SET @dl_got = GET_LOCK(@dl_k, %.3f);", (double)server_ms / 1000.0);
		sb_grant(&s, b, req, nm.p, 0);
		sb_add(&s, "SELECT @dl_got, HEX(@dl_k);COMMIT");
	}
	free(nm.p);
	MYSQL_RES *res = NULL;
	if (nm.failed || sb_check(&s) || exec(b, c, s.p, s.len, &res, "GET_LOCK wait", deadline) != 0) {
		free(s.p);
		mysql_close(c);
		return 0;
	}
	free(s.p);
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	gl_hold *h = NULL;
	if (row && row[0] && row[1] && row_i64(row, 0, 0) == 1 && (h = calloc(1, sizeof(*h))) != NULL) {
		h->conn = c;
		h->waited = 1;
		snprintf(h->key_hex, sizeof(h->key_hex), "%s", row[1]);
		req->slot = h;
	} else if (row && row[0] && row_i64(row, 0, 0) == 1) {
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
			       "process) that took it", req->name);
}

static int conn_lost(const dlock_request *req)
{
	return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL,
			       "lock '%s' is gone with its connection (killed, timed out, or the server restarted)",
			       req->name);
}

static int g_release(dlock_backend *be, dlock_request *req)
{
	mysql_be *b = (mysql_be *)be;
	gl_hold *h = req->slot;
	if (!h)
		return no_slot(req);
	req->slot = NULL;
	if (!h->conn) {
		hold_free(b, h, 0);
		return conn_lost(req);
	}
	/* Only RELEASE_LOCK: no InnoDB write, so no commit and no log flush. The
	 * holder row stays behind as a stale record: status shows a get_lock row
	 * only while IS_USED_LOCK names its session, and the next grant of the
	 * name deletes it. */
	sbuf s = { 0 };
	sb_add(&s, "SELECT RELEASE_LOCK(CONVERT(X'%s' USING utf8mb4))", h->key_hex);
	int rc = sb_check(&s);
	if (rc) {
		hold_free(b, h, 0); /* closing the connection frees the lock */
		return rc;
	}
	MYSQL_RES *res;
	rc = exec(b, h->conn, s.p, s.len, &res, "RELEASE_LOCK", req->deadline_ms);
	free(s.p);
	if (rc) {
		/* A release that cannot be confirmed ends the session: closing the
		 * connection frees the lock in the server (at once if the server sees
		 * the close, else when its wait_timeout — the lease — runs out). */
		int late = tl_timed_out, dead = is_conn_error(mysql_errno(h->conn));
		hold_free(b, h, 0);
		return late || !dead ? rc : conn_lost(req);
	}
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	int ok = row && row_i64(row, 0, 0) == 1;
	mysql_free_result(res);
	hold_free(b, h, ok);
	return ok ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' was no longer held by our connection",
					req->name);
}

/* Leave the waiters' record (status) of a wait that ended without a grant. */
static int g_cancel(dlock_backend *be, dlock_request *req)
{
	mysql_be *b = (mysql_be *)be;
	MYSQL *c = NULL;
	if (b->npool > 0)
		c = b->pool[--b->npool];
	else if (b->conn)
		c = b->conn, b->conn = NULL;
	else
		return 0; /* no session at hand: the record expires by itself (queue_ttl_ms) */
	sbuf s = { 0 };
	sb_add(&s, "DELETE FROM dlock_waiter WHERE ");
	where_name(&s, b, req->name);
	sb_add(&s, " AND owner = ");
	sb_hex(&s, req->owner);
	int rc = sb_check(&s);
	if (rc == 0)
		rc = exec(b, c, s.p, s.len, NULL, "cancel", req->deadline_ms);
	free(s.p);
	if (rc)
		mysql_close(c);
	else
		pool_put(b, c);
	return rc;
}

static int g_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	mysql_be *b = (mysql_be *)be;
	gl_hold *h = req->slot;
	if (!h)
		return no_slot(req);
	if (!h->conn)
		return conn_lost(req);
	sbuf s = { 0 };
	sb_add(&s, "SET SESSION wait_timeout = %ld;", wait_timeout_s(ttl_ms));
	sb_touch(&s, b, h, req, ttl_ms);
	int rc = sb_check(&s);
	if (rc)
		return rc;
	MYSQL_RES *res;
	rc = exec(b, h->conn, s.p, s.len, &res, "extend", req->deadline_ms);
	free(s.p);
	if (rc) {
		if (conn_dead(h->conn)) {
			/* Out of time, or the session ended: either way no reply can be
			 * trusted on it, and the lock ends with it. */
			conn_drop(&h->conn);
			return conn_lost(req);
		}
		return rc;
	}
	MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
	int ok = row && row_i64(row, 0, 0) == 1;
	mysql_free_result(res);
	return ok ? 0 : dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is no longer held by our connection",
					req->name);
}

/* One check per hold, each on its own connection: send them all, then read them
 * all, so a batch costs about one round trip however many locks are held. */
static int g_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	mysql_be *b = (mysql_be *)be;
	enum { SENT = 1 };
	for (size_t i = 0; i < n; i++) {
		gl_hold *h = reqs[i]->slot;
		results[i] = DLOCK_ENOTHELD;
		if (!h || !h->conn)
			continue;
		sbuf s = { 0 };
		sb_touch(&s, b, h, reqs[i], reqs[i]->ttl_ms);
		if (sb_check(&s)) {
			results[i] = DLOCK_ENOMEM; /* transient: retried until the deadline */
			continue;
		}
		int64_t deadline = reqs[i]->deadline_ms;
		int st = nb_send(h->conn, s.p, s.len, deadline);
		if (st == 0) {
			results[i] = SENT;
		} else {
			if (st < 0)
				mariadb_cancel(h->conn);
			conn_drop(&h->conn);
		}
		free(s.p);
	}
	for (size_t i = 0; i < n; i++) {
		gl_hold *h = reqs[i]->slot;
		if (results[i] != SENT)
			continue;
		results[i] = DLOCK_ENOTHELD;
		MYSQL_RES *res = NULL;
		tl_timed_out = 0;
		int st = nb_read_result(h->conn, reqs[i]->deadline_ms);
		if (st < 0)
			timed_out(h->conn, "renew");
		if (st != 0 || read_all(b, h->conn, &res, "renew", reqs[i]->deadline_ms) != 0) {
			/* The connection is gone (killed, server restart), or gave no answer
			 * in time and was closed: the lock ends with it. */
			if (conn_dead(h->conn))
				conn_drop(&h->conn);
			else
				results[i] = DLOCK_ESTORE;
			continue;
		}
		MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
		if (row && row_i64(row, 0, 0) == 1)
			results[i] = 0;
		mysql_free_result(res);
	}
	return 0;
}

/* ================= both modes ================= */

static dlock_lock_status *status_find(dlock_lock_status *arr, size_t n, const char *name, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strlen(arr[i].name) == len && memcmp(arr[i].name, name, len) == 0)
			return &arr[i];
	return NULL;
}

static dlock_lock_status *status_get(dlock_lock_status **arr, size_t *n, const char *name, size_t len,
				     int create)
{
	dlock_lock_status *st = status_find(*arr, *n, name, len);
	if (st || !create)
		return st;
	if (!(st = dlock__status_add(arr, n)))
		return NULL;
	if (!(st->name = dlock__strndup(name, len))) {
		(*n)--;
		return NULL;
	}
	return st;
}

static int be_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		    size_t *count)
{
	mysql_be *b = (mysql_be *)be;
	int64_t deadline = dlock_clock_ms() + b->request_timeout_ms;
	sbuf filter = { 0 };
	sb_add(&filter, " AND name IN (");
	for (size_t i = 0; i < nnames; i++) {
		sb_add(&filter, "%s", i ? "," : "");
		sb_hex(&filter, names[i]);
	}
	sb_add(&filter, ")");
	int rc = sb_check(&filter);
	if (rc)
		return rc;
	for (size_t i = 0; i < nnames; i++)
		if (!status_get(out, count, names[i], strlen(names[i]), 1)) {
			free(filter.p);
			return DLOCK_ENOMEM;
		}
	const char *f = filter.p;
	for (int step = 0; step < 3 && rc == 0; step++) {
		sbuf s = { 0 };
		if (step == 0) {
			sb_add(&s, "SELECT name, owner, mode, permits, fence, "
				   "GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires) DIV 1000), host, pid "
				   "FROM dlock_holder WHERE ns = %s%s AND ", b->ns_hex, f);
			if (b->mode == MODE_TABLE) {
				sb_add(&s, "conn_id = 0 AND expires > UTC_TIMESTAMP(6)");
			} else {
				/* A record counts only while its session really holds the GET_LOCK. */
				sb_add(&s, "conn_id <> 0 AND conn_id = IS_USED_LOCK(");
				sb_key(&s, b, "name");
				sb_add(&s, ")");
			}
			sb_add(&s, " ORDER BY name, fence");
		} else if (step == 1)
			sb_add(&s, "SELECT name, COUNT(*) FROM dlock_waiter WHERE ns = %s%s AND expires > UTC_TIMESTAMP(6) "
				   "GROUP BY name", b->ns_hex, f);
		else
			sb_add(&s, "SELECT name, fence FROM dlock_lock WHERE ns = %s%s", b->ns_hex, f);
		MYSQL_RES *res;
		rc = run(b, &s, &res, "status", 0, deadline);
		free(s.p);
		if (rc)
			break;
		MYSQL_ROW row;
		while (rc == 0 && res && (row = mysql_fetch_row(res)) != NULL) {
			unsigned long *len = mysql_fetch_lengths(res);
			/* Fences are reported only for names already listed (holders or waiters, or asked for). */
			dlock_lock_status *st = status_get(out, count, row[0], len[0], step < 2);
			if (!st) {
				rc = step < 2 ? DLOCK_ENOMEM : 0;
				continue;
			}
			if (step == 0) {
				dlock_holder *h = dlock__status_add_holder(st);
				if (!h) {
					rc = DLOCK_ENOMEM;
					break;
				}
				h->owner = dlock__strndup(row[1], len[1]);
				h->host = dlock__strndup(row[6] ? row[6] : "", row[6] ? len[6] : 0);
				h->mode = row_i64(row, 2, 0) ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
				st->permits = (unsigned)row_i64(row, 3, 1);
				h->fence = row_u64(row, 4);
				h->ttl_left_ms = row_i64(row, 5, -1);
				h->pid = (int)row_i64(row, 7, 0);
				if (!h->owner || !h->host)
					rc = DLOCK_ENOMEM;
			} else if (step == 1) {
				st->waiters = (size_t)row_i64(row, 1, 0);
			} else {
				st->last_fence = row_u64(row, 1);
			}
		}
		mysql_free_result(res);
	}
	free(filter.p);
	return rc;
}

/* The names that have a holder or waiter record (the core then asks status
 * for them, which checks each one's liveness). */
static int be_list(dlock_backend *be, char ***names, size_t *count)
{
	mysql_be *b = (mysql_be *)be;
	int64_t deadline = dlock_clock_ms() + b->request_timeout_ms;
	*names = NULL;
	*count = 0;
	sbuf s = { 0 };
	sb_add(&s, "SELECT name FROM dlock_holder WHERE ns = %s UNION SELECT name FROM dlock_waiter WHERE ns = %s",
	       b->ns_hex, b->ns_hex);
	int rc = sb_check(&s);
	MYSQL_RES *res = NULL;
	if (rc == 0)
		rc = run(b, &s, &res, "list", 0, deadline);
	free(s.p);
	if (rc)
		return rc;
	size_t n = res ? (size_t)mysql_num_rows(res) : 0;
	if (n && !(*names = dlock__calloc(n, sizeof(char *))))
		rc = DLOCK_ENOMEM;
	MYSQL_ROW row;
	while (rc == 0 && res && *count < n && (row = mysql_fetch_row(res)) != NULL) {
		unsigned long *len = mysql_fetch_lengths(res);
		if (!((*names)[*count] = dlock__strndup(row[0], len[0])))
			rc = DLOCK_ENOMEM;
		else
			(*count)++;
	}
	if (res)
		mysql_free_result(res);
	return rc;
}

/* ================= open / close ================= */

static void be_close(dlock_backend *be)
{
	mysql_be *b = (mysql_be *)be;
	if (!b)
		return;
	while (b->holds)
		hold_free(b, b->holds, 0);
	for (size_t i = 0; i < b->nwait_pool; i++)
		mysql_close(b->wait_pool[i]);
	pthread_mutex_destroy(&b->wait_mu);
	for (size_t i = 0; i < b->npool; i++)
		mysql_close(b->pool[i]);
	conn_drop(&b->conn);
	free(b->host);
	free(b->user);
	if (b->password) {
		memset(b->password, 0, strlen(b->password));
		free(b->password);
	}
	free(b->db);
	free(b->socket);
	free(b->ssl_ca);
	free(b->ssl_capath);
	free(b->ssl_cert);
	free(b->ssl_key);
	free(b->ns_hex);
	free(b);
}

static int opt_dup(char **dst, const char *v)
{
	if (!v)
		return 0;
	if (!*v)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: an ssl_* option needs a file name");
	return dlock__opt_dup(dst, v);
}

static int parse(mysql_be *b, dlock_uri *uri)
{
	const char *v = dlock_uri_param(uri, "mode");
	if (!v || strcmp(v, "table") == 0)
		b->mode = MODE_TABLE;
	else if (strcmp(v, "get_lock") == 0)
		b->mode = MODE_GET_LOCK;
	else
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: unknown mode '%s' (table or get_lock)", v);

	const char *path = uri->path ? uri->path : "";
	if (*path == '/')
		path++;
	if (!*path || strchr(path, '/'))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "mysql URI needs one database name: mysql://user:pass@host:port/DATABASE");
	if (strlen(path) > 64)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: database name longer than 64 characters");
	if (!(b->db = dlock__strdup(path)))
		return DLOCK_ENOMEM;

	const char *sock = dlock_uri_param(uri, "socket");
	if (sock && !(b->socket = dlock__strdup(sock)))
		return DLOCK_ENOMEM;
	if (!uri->hosts || !*uri->hosts) {
		if (!b->socket)
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "mysql URI needs a host (mysql://user:pass@host:port/db) or ?socket=PATH");
		b->host = dlock__strdup("localhost");
		b->port = 0;
	} else {
		dlock_hostport *hp = NULL;
		size_t nh = 0;
		int rc = dlock_uri_hosts(uri, 3306, &hp, &nh);
		if (rc)
			return rc;
		if (nh != 1) {
			dlock_free(hp);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql URI takes exactly one host, got %zu", nh);
		}
		b->host = dlock__strdup(hp[0].host);
		b->port = hp[0].port;
		dlock_free(hp);
	}
	if (!b->host)
		return DLOCK_ENOMEM;
	if (uri->user && !(b->user = dlock__strdup(uri->user)))
		return DLOCK_ENOMEM;
	if (uri->password && !(b->password = dlock__strdup(uri->password)))
		return DLOCK_ENOMEM;

	int64_t t = uri->connect_timeout_ms;
	b->connect_timeout_ms = t;
	b->timeout_s = (unsigned)((t + 999) / 1000);
	b->request_timeout_ms = uri->request_timeout_ms;
	/* Whole seconds (the variable is an integer), under the request bound
	 * where it can be: the server's "lock wait timeout" then comes first. */
	b->lock_wait_s = b->request_timeout_ms <= 2000 ? 1 : (unsigned)((b->request_timeout_ms - 1) / 1000);

	int rc;
	if ((rc = opt_dup(&b->ssl_ca, dlock_uri_param(uri, "ssl_ca"))) ||
	    (rc = opt_dup(&b->ssl_capath, dlock_uri_param(uri, "ssl_capath"))) ||
	    (rc = opt_dup(&b->ssl_cert, dlock_uri_param(uri, "ssl_cert"))) ||
	    (rc = opt_dup(&b->ssl_key, dlock_uri_param(uri, "ssl_key"))))
		return rc;
	const char *ssl = dlock_uri_param(uri, "ssl");
	int any_file = b->ssl_ca || b->ssl_capath || b->ssl_cert || b->ssl_key;
	if (!ssl) {
		b->ssl_enforce = any_file;
		b->ssl_verify = b->ssl_ca || b->ssl_capath;
	} else if (strcmp(ssl, "off") == 0 || strcmp(ssl, "0") == 0 || strcmp(ssl, "false") == 0) {
		if (any_file)
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: ssl=off contradicts the ssl_* options");
	} else if (strcmp(ssl, "required") == 0 || strcmp(ssl, "on") == 0 || strcmp(ssl, "1") == 0 ||
		   strcmp(ssl, "true") == 0) {
		b->ssl_enforce = 1;
		b->ssl_verify = b->ssl_ca || b->ssl_capath;
	} else if (strcmp(ssl, "verify") == 0) {
		b->ssl_enforce = 1;
		b->ssl_verify = 1;
	} else {
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: ssl=%s: expected off, required or verify", ssl);
	}

	if (!b->ssl_verify && !b->socket && !dlock__host_is_local(b->host))
		dlock__open_warning("mysql: %s: on the way to %s a man in the middle could read the password and "
				    "the lock traffic; use ssl=verify&ssl_ca=CA.pem",
				    b->ssl_enforce ? "ssl=required encrypts but does not verify the server"
						   : "no TLS (the default)",
				    b->host);
	const char *prefix = uri->prefix ? uri->prefix : "dlock";
	if (strlen(prefix) > 255)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: prefix longer than 255 bytes");
	sbuf s = { 0 };
	sb_hex(&s, prefix);
	if ((rc = sb_check(&s)) != 0)
		return rc;
	b->ns_hex = s.p;
	return 0;
}

/* mode=table: holds are rows (any connection may renew them). */
static const dlock_backend_methods my_table_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.renew_max = RENEW_CHUNK,
	.acquire = t_acquire,
	.release = t_release,
	.renew = t_renew,
	.extend = t_extend,
	.cancel = t_cancel,
	.status = be_status,
	.list = be_list,
	.close = be_close,
};

/* mode=get_lock: a hold lives with its connection. MariaDB takes fractional
 * GET_LOCK timeouts, so waiters block on the server there; MySQL is not
 * known to (its manual says seconds), and a rounded-up wait could overrun
 * the caller's deadline: there waiters back off and retry. */
#define GET_LOCK_METHODS                                                                              \
	DLOCK_BACKEND_METHODS_INIT(KIND), .flags = DLOCK_BACKEND_F_SESSION, .acquire = g_acquire,       \
	.release = g_release, .renew = g_renew, .extend = g_extend, .cancel = g_cancel,                \
	.status = be_status, .list = be_list, .close = be_close
static const dlock_backend_methods my_get_lock_methods = { GET_LOCK_METHODS };
static const dlock_backend_methods my_get_lock_wait_methods = { GET_LOCK_METHODS, .wait = g_wait };
#undef GET_LOCK_METHODS

int dlock__mysql_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	mysql_be *b = dlock__calloc(1, sizeof(*b));
	if (!b)
		return DLOCK_ENOMEM;
	pthread_mutex_init(&b->wait_mu, NULL);
	int rc = parse(b, uri);
	int64_t deadline = dlock_clock_ms() + b->connect_timeout_ms;
	if (rc == 0) {
		dlock_backend_init(&b->base, b->mode == MODE_TABLE ? &my_table_methods : &my_get_lock_methods);
		rc = conn_open(b, &b->conn, deadline);
	}
	/* Both modes need the counter table (get_lock takes its fences there). */
	if (rc == 0)
		rc = schema_ensure(b, deadline);
	if (rc == 0 && b->mode == MODE_GET_LOCK && strstr(mysql_get_server_info(b->conn), "MariaDB"))
		b->base.methods = &my_get_lock_wait_methods;
	if (rc) {
		be_close(&b->base);
		return rc;
	}
	*out = &b->base;
	return 0;
}
