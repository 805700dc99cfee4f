/*
 * MySQL/MariaDB store tests beyond the conformance suite, against the real
 * server started by tests/servers/mysql.sh (URI in $DLOCK_TEST_URI_FILE; the
 * same directory has the server's socket, used here as root for KILL and
 * for looking at the tables directly).
 */
#include "testutil/testutil.h"

#include <mysql.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char uri[1024], dir[1024];

static void read_uri(void)
{
	tu_uri_from_env(uri, sizeof uri, "mysql_store");
	tu_server_dir(dir, sizeof dir);
}

/* uri with extra query text appended ("?mode=get_lock"). */
static const char *uri_with(const char *query)
{
	static char buf[2048];
	snprintf(buf, sizeof(buf), "%s%s", uri, query);
	return buf;
}

static MYSQL *admin(void)
{
	char sock[1100];
	snprintf(sock, sizeof(sock), "%s/sock", dir);
	MYSQL *c = mysql_init(NULL);
	if (!mysql_real_connect(c, NULL, "root", NULL, "dlock_test", 0, sock, 0)) {
		fprintf(stderr, "admin connect: %s\n", mysql_error(c));
		exit(1);
	}
	return c;
}

/* First column of the first row as an integer; -1 for NULL or no row; -2 on error. */
static long long q1(MYSQL *c, const char *sql)
{
	if (mysql_query(c, sql) != 0) {
		fprintf(stderr, "admin query failed: %s: %s\n", sql, mysql_error(c));
		return -2;
	}
	MYSQL_RES *r = mysql_store_result(c);
	MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
	long long v = row && row[0] ? atoll(row[0]) : -1;
	mysql_free_result(r);
	return v;
}

static dlock_store *open_store(const char *u)
{
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc) {
		fprintf(stderr, "open %s: %s\n", u, dlock_error_last()->message);
		exit(1);
	}
	return s;
}

static dlock_lock *new_lock(dlock_store *s, const char *name, int64_t ttl, int no_renew)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.no_renew = no_renew;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, name, &o), 0);
	return l;
}

/* The password of the test URI, to prove it never shows up. */
static void uri_password(char *out, size_t size)
{
	const char *at = strrchr(uri, '@');
	const char *colon = strchr(uri + strlen("mysql://"), ':');
	size_t n = (size_t)(at - colon - 1);
	snprintf(out, size, "%.*s", (int)n, colon + 1);
}

static void test_bad_input(void)
{
	dlock_store *s = NULL;
	char pw[256], bad[2048];
	uri_password(pw, sizeof(pw));
	/* Wrong password: DLOCK_EAUTH, and neither password appears anywhere. */
	const char *at = strrchr(uri, '@');
	snprintf(bad, sizeof(bad), "mysql://dlock:Wr0ngSecretPass%s", at);
	CHECK_RC(dlock_store_open(&s, bad), DLOCK_EAUTH);
	CHECK(strstr(dlock_error_last()->message, "Wr0ngSecretPass") == NULL);
	CHECK(strstr(dlock_error_last()->message, pw) == NULL);
	CHECK(strstr(dlock_error_last()->message, "refused") != NULL);
	CHECK(strcmp(dlock_error_last()->store_code, "1045/28000") == 0);
	/* The mariadb:// spelling works too. */
	snprintf(bad, sizeof(bad), "mariadb%s", strchr(uri, ':'));
	CHECK_RC(dlock_store_open(&s, bad), 0);
	CHECK(s && strcmp(dlock_store_kind(s), "mysql") == 0);
	CHECK(s && strstr(dlock_store_uri(s), pw) == NULL);
	dlock_store_close(s);
	s = NULL;
	/* Malformed: no database, unknown mode, bad ssl, unknown option. */
	CHECK_RC(dlock_store_open(&s, "mysql://u:p@127.0.0.1:1/"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, uri_with("?mode=advisory")), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "get_lock") != NULL);
	CHECK_RC(dlock_store_open(&s, uri_with("?ssl=maybe")), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, uri_with("?colour=blue")), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "mysql://u:p@127.0.0.1:1,127.0.0.1:2/db"), DLOCK_EINVAL);
	/* Nobody listens on port 1. */
	CHECK_RC(dlock_store_open(&s, "mysql://u:SecretPw99@127.0.0.1:1/db?connect_timeout=2s"), DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "SecretPw99") == NULL);
}

/* TLS against the test server's throw-away CA; a user that REQUIRE SSL proves it is used. */
static void test_tls(void)
{
	MYSQL *a = admin();
	q1(a, "DROP USER IF EXISTS 'dlock_tls'@'127.0.0.1'");
	q1(a, "CREATE USER 'dlock_tls'@'127.0.0.1' IDENTIFIED BY 'tls-Pw-123' REQUIRE SSL");
	q1(a, "GRANT ALL ON dlock_test.* TO 'dlock_tls'@'127.0.0.1'");
	const char *at = strrchr(uri, '@');
	char u[2048];
	dlock_store *s = NULL;
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s", at);
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EAUTH); /* plain text: refused by the server */
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl=required", at);
	CHECK_RC(dlock_store_open(&s, u), 0);
	dlock_store_close(s);
	s = NULL;
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl_ca=%s/ca.pem&mode=get_lock", at, dir);
	CHECK_RC(dlock_store_open(&s, u), 0); /* certificate and host name verified */
	if (s) {
		dlock_lock *l = new_lock(s, "tls-lock", 5000, 0);
		CHECK_RC(dlock_acquire(l, 0), 0); /* the hold's own connection uses TLS too */
		CHECK_RC(dlock_release(l), 0);
		dlock_lock_free(l);
	}
	dlock_store_close(s);
	s = NULL;
	/* Unknown CA (system CAs only) or the wrong CA file: refused. */
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl=verify", at);
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "tls-Pw-123") == NULL);
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl_ca=%s/server.pem", at, dir);
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EUNAVAILABLE);
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl_ca=", at);
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EINVAL);
	snprintf(u, sizeof(u), "mysql://dlock_tls:tls-Pw-123%s?ssl=off&ssl_ca=%s/ca.pem", at, dir);
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EINVAL);
	CHECK(s == NULL);
	q1(a, "DROP USER 'dlock_tls'@'127.0.0.1'");
	mysql_close(a);
}

static void test_schema(void)
{
	MYSQL *a = admin();
	dlock_store *s = open_store(uri);
	CHECK(q1(a, "SELECT v FROM dlock_meta WHERE k = 'schema_version'") == 1);
	CHECK(q1(a,
		 "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'dlock_test' "
		 "AND TABLE_NAME IN ('dlock_meta','dlock_lock','dlock_holder','dlock_waiter') "
		 "AND ENGINE = 'InnoDB'") == 4);
	dlock_store_close(s);
	/* A schema from a newer dlock is refused, not misread. */
	CHECK(q1(a, "UPDATE dlock_meta SET v = '99' WHERE k = 'schema_version'") == -1);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_ENOTSUPPORTED);
	CHECK(strstr(dlock_error_last()->message, "99") != NULL);
	q1(a, "UPDATE dlock_meta SET v = '1' WHERE k = 'schema_version'");

	/* Once the tables exist, plain DML privileges are enough (no CREATE). */
	q1(a, "DROP USER IF EXISTS 'dlock_dml'@'127.0.0.1'");
	q1(a, "DROP DATABASE IF EXISTS dlock_fresh");
	q1(a, "CREATE DATABASE dlock_fresh");
	q1(a, "CREATE USER 'dlock_dml'@'127.0.0.1' IDENTIFIED BY 'dml-Pw-1'");
	q1(a, "GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_test.* TO 'dlock_dml'@'127.0.0.1'");
	q1(a, "GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_fresh.* TO 'dlock_dml'@'127.0.0.1'");
	const char *at = strrchr(uri, '@');
	char u[2048];
	for (int mode = 0; mode < 2; mode++) {
		snprintf(u, sizeof(u), "mysql://dlock_dml:dml-Pw-1%s%s", at, mode ? "?mode=get_lock" : "");
		s = NULL;
		CHECK_RC(dlock_store_open(&s, u), 0);
		if (s) {
			dlock_lock *l = NULL;
			CHECK_RC(dlock_lock_new(&l, s, "dml-only", NULL), 0);
			CHECK_RC(dlock_acquire(l, 0), 0);
			CHECK(dlock_fence(l) > 0);
			CHECK_RC(dlock_release(l), 0);
			dlock_lock_free(l);
		}
		dlock_store_close(s);
	}
	/* Without the tables and without CREATE: a permission error, clearly. */
	const char *slash = strrchr(at, '/');
	snprintf(u, sizeof(u), "mysql://dlock_dml:dml-Pw-1%.*s/dlock_fresh", (int)(slash - at), at);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, u), DLOCK_EAUTH);
	CHECK(strstr(dlock_error_last()->message, "CREATE") != NULL);
	CHECK(strstr(dlock_error_last()->message, "dml-Pw-1") == NULL);
	q1(a, "DROP USER 'dlock_dml'@'127.0.0.1'");
	q1(a, "DROP DATABASE dlock_fresh");
	mysql_close(a);
}

/* Expiry is the server's: a holder that stops renewing loses the lock after its TTL. */
static void test_lease_expiry(const char *u)
{
	dlock_store *a = open_store(u), *b = open_store(u);
	dlock_lock *la = new_lock(a, "lease-expiry", 1500, 1), *lb = new_lock(b, "lease-expiry", 10000, 0);
	CHECK_RC(dlock_acquire(la, 0), 0);
	uint64_t fa = dlock_fence(la);
	CHECK_RC(dlock_acquire(lb, 0), DLOCK_ELOCKED);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(lb, 15000), 0);
	long long waited = tu_now_ms() - t0;
	CHECK(waited >= 1000 && waited < 10000);
	CHECK(dlock_fence(lb) > fa);
	printf("  %s: lease of 1.5 s ended after %lld ms of waiting\n", strstr(u, "get_lock") ? "get_lock" : "table",
	       waited);
	CHECK_RC(dlock_release(lb), 0);
	CHECK_RC(dlock_release(la), DLOCK_ELOST);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_store_close(a);
	dlock_store_close(b);
}

/* Table mode: a killed connection is not a lost lock (the lease lives in a table). */
static void test_table_kill_connection(void)
{
	MYSQL *a = admin();
	dlock_store *s = open_store(uri), *other = open_store(uri);
	dlock_lock *l = new_lock(s, "kill-table", 1500, 0), *lo = new_lock(other, "kill-table", 1500, 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	char sql[256];
	snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'dlock'");
	long long n = q1(a, sql);
	CHECK(n >= 2);
	/* Kill every session of the test user; the store reconnects on its next statement. */
	MYSQL_RES *r;
	mysql_query(a, "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'dlock'");
	r = mysql_store_result(a);
	MYSQL_ROW row;
	while (r && (row = mysql_fetch_row(r)) != NULL) {
		snprintf(sql, sizeof(sql), "KILL %s", row[0]);
		mysql_query(a, sql);
	}
	mysql_free_result(r);
	long long t0 = tu_now_ms();
	/* Three leases later it is still ours, renewed over a new connection. */
	while (tu_now_ms() - t0 < 4500) {
		CHECK_RC(dlock_acquire(lo, 0), DLOCK_ELOCKED);
		struct timespec ts = { 0, 300 * 1000000L };
		nanosleep(&ts, NULL);
	}
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_acquire(lo, 0), 0);
	CHECK_RC(dlock_release(lo), 0);
	dlock_lock_free(l);
	dlock_lock_free(lo);
	dlock_store_close(s);
	dlock_store_close(other);
	mysql_close(a);
}

static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lost_cv = PTHREAD_COND_INITIALIZER;
static int lost_count;

static void on_lost(dlock_lock *l, void *payload)
{
	(void)l;
	(void)payload;
	pthread_mutex_lock(&lost_mu);
	lost_count++;
	pthread_cond_broadcast(&lost_cv);
	pthread_mutex_unlock(&lost_mu);
}

/* get_lock: KILL of the holder's connection → the holder hears it is lost. */
static void test_get_lock_kill(void)
{
	MYSQL *a = admin();
	dlock_store *s = open_store(uri_with("?mode=get_lock")), *other = open_store(uri_with("?mode=get_lock"));
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 3000;
	o.on_lost = on_lost;
	dlock_lock *l = NULL, *lo = new_lock(other, "kill-me", 3000, 0);
	CHECK_RC(dlock_lock_new(&l, s, "kill-me", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_acquire(lo, 0), DLOCK_ELOCKED);
	long long id = q1(a, "SELECT IS_USED_LOCK('dlock_test/dlock/kill-me')");
	CHECK(id > 0);
	char sql[64];
	snprintf(sql, sizeof(sql), "KILL %lld", id);
	long long t0 = tu_now_ms();
	CHECK(q1(a, sql) == -1);
	/* Another client can take it as soon as the killed session has ended (KILL only
	 * asks it to end): the server dropped the lock with the session, no TTL to wait. */
	CHECK_RC(dlock_acquire(lo, 2000), 0);
	CHECK(tu_now_ms() - t0 < 1500);
	pthread_mutex_lock(&lost_mu);
	while (lost_count == 0 && tu_now_ms() - t0 < 10000) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&lost_cv, &lost_mu, &ts);
	}
	int lost = lost_count;
	pthread_mutex_unlock(&lost_mu);
	CHECK(lost == 1);
	printf("  get_lock: lost signal %lld ms after KILL (ttl 3 s, renewal every 1 s)\n", tu_now_ms() - t0);
	CHECK(!dlock_held(l));
	CHECK(dlock_held(lo));
	/* Status shows the new holder only (the killed session's record is gone). */
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(other, NULL, 0, &st, &n), 0);
	int seen = 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(st[i].name, "kill-me") != 0)
			continue;
		seen++;
		CHECK(st[i].nholders == 1);
		CHECK(st[i].nholders == 1 && st[i].holders[0].fence == dlock_fence(lo));
		CHECK(st[i].nholders == 1 && st[i].holders[0].pid == (int)getpid());
		CHECK(st[i].nholders == 1 && st[i].holders[0].ttl_left_ms > 0);
		CHECK(st[i].last_fence == dlock_fence(lo));
	}
	CHECK(seen == 1);
	dlock_status_free(st, n);
	CHECK_RC(dlock_release(l), DLOCK_ELOST);
	CHECK_RC(dlock_release(lo), 0);
	dlock_lock_free(l);
	dlock_lock_free(lo);
	dlock_store_close(s);
	dlock_store_close(other);
	mysql_close(a);
}

/* get_lock: names whose key is over 64 characters are hashed by the documented formula. */
static void test_get_lock_long_names(void)
{
	MYSQL *a = admin();
	dlock_store *s = open_store(uri_with("?mode=get_lock"));
	char n1[200], n2[200];
	memset(n1, 'n', 150);
	n1[150] = '\0';
	memcpy(n2, n1, sizeof(n1));
	n2[149] = 'm'; /* same first 23 characters, different hash */
	dlock_lock *l1 = new_lock(s, n1, 5000, 0), *l2 = new_lock(s, n2, 5000, 0);
	CHECK_RC(dlock_acquire(l1, 0), 0);
	CHECK_RC(dlock_acquire(l2, 0), 0);
	char sql[1024];
	snprintf(sql, sizeof(sql),
		 "SELECT IS_USED_LOCK(CONCAT(LEFT(k, 23), '~', LEFT(SHA2(k, 256), 40))) "
		 "FROM (SELECT CONCAT('dlock_test/dlock/', '%s') AS k) t",
		 n1);
	CHECK(q1(a, sql) > 0);
	snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK('dlock_test/dlock/%s')", n1);
	CHECK(q1(a, sql) == -1);
	/* A name of 64 characters exactly is used as it is (no hash). */
	char n3[80];
	memset(n3, 'x', 64 - strlen("dlock_test/dlock/"));
	n3[64 - strlen("dlock_test/dlock/")] = '\0';
	dlock_lock *l3 = new_lock(s, n3, 5000, 0);
	CHECK_RC(dlock_acquire(l3, 0), 0);
	snprintf(sql, sizeof(sql), "SELECT IS_USED_LOCK('dlock_test/dlock/%s')", n3);
	CHECK(q1(a, sql) > 0);
	/* Non-ASCII names: the limit counts characters, as the server does. */
	dlock_lock *l4 = new_lock(s, "ключ-замок-🔒", 5000, 0);
	CHECK_RC(dlock_acquire(l4, 0), 0);
	CHECK(q1(a, "SELECT IS_USED_LOCK('dlock_test/dlock/ключ-замок-🔒')") > 0);
	dlock_lock_free(l1);
	dlock_lock_free(l2);
	dlock_lock_free(l3);
	dlock_lock_free(l4);
	CHECK(q1(a, sql) == -1);
	dlock_store_close(s);
	mysql_close(a);
}

struct waiter {
	dlock_lock *l;
	int rc, release_rc;
	long long done;
};

/* A handle belongs to the thread that acquired it: this thread also releases. */
static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	w->rc = dlock_acquire(w->l, 10000);
	w->done = tu_now_ms();
	w->release_rc = dlock_release(w->l);
	return NULL;
}

static long long com_select(MYSQL *a)
{
	return q1(a, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'COM_SELECT'");
}

/* get_lock on MariaDB: a waiter blocks in the server (GET_LOCK with a timeout) instead
 * of polling, and is woken by the release. */
static void test_get_lock_wait(void)
{
	MYSQL *a = admin();
	dlock_store *s1 = open_store(uri_with("?mode=get_lock")), *s2 = open_store(uri_with("?mode=get_lock"));
	dlock_lock *l1 = new_lock(s1, "wake-me", 10000, 0);
	struct waiter w = { new_lock(s2, "wake-me", 10000, 0), -100, -100, 0 };
	CHECK_RC(dlock_acquire(l1, 0), 0);
	pthread_t t;
	pthread_create(&t, NULL, waiter_main, &w);
	/* A 2 s window while the waiter waits: polling with the 50 ms back-off would
	 * send 40+ statements, a waiter blocked in the server about 2 per second. */
	struct timespec ts = { 0, 200 * 1000000L };
	nanosleep(&ts, NULL);
	long long before = com_select(a), t0 = tu_now_ms();
	while (tu_now_ms() - t0 < 2000)
		nanosleep(&ts, NULL);
	long long selects = com_select(a) - before - 1;
	long long released = tu_now_ms();
	CHECK_RC(dlock_release(l1), 0);
	pthread_join(t, NULL);
	CHECK_RC(w.rc, 0);
	printf("  get_lock: waiter sent %lld SELECTs in 2 s, got the lock %lld ms after the release\n", selects,
	       w.done - released);
	CHECK(selects <= 12);
	CHECK(w.done - released < 1000);
	CHECK_RC(w.release_rc, 0);
	dlock_lock_free(l1);
	dlock_lock_free(w.l);
	dlock_store_close(s1);
	dlock_store_close(s2);
	mysql_close(a);
}

static void test_get_lock_unsupported(void)
{
	dlock_store *s = open_store(uri_with("?mode=get_lock"));
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	dlock_lock *l = NULL;
	o.mode = DLOCK_SHARED;
	CHECK_RC(dlock_lock_new(&l, s, "unsupported", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ENOTSUPPORTED);
	CHECK(strstr(dlock_error_last()->message, "mode=table") != NULL);
	dlock_lock_free(l);
	o.mode = DLOCK_EXCLUSIVE;
	o.permits = 3;
	CHECK_RC(dlock_lock_new(&l, s, "unsupported", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ENOTSUPPORTED);
	dlock_lock_free(l);
	o.permits = 1;
	o.fair = 1;
	CHECK_RC(dlock_lock_new(&l, s, "unsupported", &o), 0);
	CHECK_RC(dlock_acquire(l, 1000), DLOCK_ENOTSUPPORTED);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* Many holds are renewed in a few statements, not one per lock. */
static void test_batch_renew(void)
{
	enum { N = 300 };
	MYSQL *a = admin();
	dlock_store *s = open_store(uri);
	static dlock_lock *locks[N];
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "batch-%d", i);
		locks[i] = new_lock(s, name, 1500, 0);
		CHECK_RC(dlock_acquire(locks[i], 0), 0);
	}
	long long before = q1(a,
			      "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
			      "WHERE VARIABLE_NAME = 'COM_UPDATE'");
	long long t0 = tu_now_ms();
	while (tu_now_ms() - t0 < 3200) {
		struct timespec ts = { 0, 200 * 1000000L };
		nanosleep(&ts, NULL);
	}
	long long after = q1(a,
			     "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
			     "WHERE VARIABLE_NAME = 'COM_UPDATE'");
	int held = 0;
	for (int i = 0; i < N; i++)
		held += dlock_held(locks[i]) != 0;
	CHECK(held == N);
	/* 300 locks over ~6 renewal rounds: a statement per lock would be ~1800 UPDATEs. */
	printf("  table: %d locks held over 2 leases with %lld UPDATE statements\n", N, after - before);
	CHECK(after - before > 0 && after - before <= 60);
	CHECK(q1(a, "SELECT COUNT(*) FROM dlock_holder WHERE name LIKE 'batch-%' AND expires > UTC_TIMESTAMP(6)") == N);
	for (int i = 0; i < N; i++)
		dlock_lock_free(locks[i]);
	CHECK(q1(a, "SELECT COUNT(*) FROM dlock_holder WHERE name LIKE 'batch-%'") == 0);
	dlock_store_close(s);
	mysql_close(a);
}

/* A status shows holders as the server sees them (server-side TTL). */
static void test_status(void)
{
	dlock_store *s = open_store(uri);
	dlock_lock *l = new_lock(s, "status-me", 20000, 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	const char *names[] = { "status-me", "never-used" };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, names, 2, &st, &n), 0);
	CHECK(n == 2);
	if (n == 2) {
		CHECK(strcmp(st[0].name, "status-me") == 0 && st[0].nholders == 1);
		CHECK(st[0].last_fence == dlock_fence(l));
		CHECK(st[0].nholders == 1 && st[0].holders[0].ttl_left_ms > 15000 &&
		      st[0].holders[0].ttl_left_ms <= 20000);
		CHECK(st[0].nholders == 1 && st[0].holders[0].pid > 0);
		CHECK(strcmp(st[1].name, "never-used") == 0 && st[1].nholders == 0 && st[1].last_fence == 0);
	}
	dlock_status_free(st, n);
	CHECK_RC(dlock_store_status(s, NULL, 0, &st, &n), 0);
	bool found = false;
	for (size_t i = 0; i < n; i++)
		found |= strcmp(st[i].name, "status-me") == 0 && st[i].nholders == 1;
	CHECK(found);
	dlock_status_free(st, n);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/*
 * A server restart: table-mode holds are rows and survive it (the holder
 * reconnects and renews; nobody else gets in); get_lock holds die with their
 * sessions and their holders get the lost signal.
 */
static void test_restart(const char *script)
{
	dlock_store *t = open_store(uri), *g = open_store(uri_with("?mode=get_lock"));
	dlock_store *t2 = open_store(uri);
	dlock_lock *lt = new_lock(t, "restart-table", 10000, 0), *lt2 = new_lock(t2, "restart-table", 10000, 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 3000;
	o.on_lost = on_lost;
	dlock_lock *lg = NULL;
	CHECK_RC(dlock_lock_new(&lg, g, "restart-get-lock", &o), 0);
	CHECK_RC(dlock_acquire(lt, 0), 0);
	CHECK_RC(dlock_acquire(lg, 0), 0);
	uint64_t f1 = dlock_fence(lt);
	pthread_mutex_lock(&lost_mu);
	int lost_before = lost_count;
	pthread_mutex_unlock(&lost_mu);

	char cmd[2300];
	snprintf(cmd, sizeof(cmd), "bash '%s' restart '%s'", script, dir);
	long long t0 = tu_now_ms();
	CHECK(system(cmd) == 0);
	printf("  server restarted in %lld ms\n", tu_now_ms() - t0);

	/* get_lock: the lost signal, within a lease. */
	pthread_mutex_lock(&lost_mu);
	while (lost_count == lost_before && tu_now_ms() - t0 < 15000) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&lost_cv, &lost_mu, &ts);
	}
	int lost = lost_count - lost_before;
	pthread_mutex_unlock(&lost_mu);
	CHECK(lost == 1);
	CHECK(!dlock_held(lg));
	/* table: still ours one whole lease after the restart began. */
	while (tu_now_ms() - t0 < 11000) {
		CHECK_RC(dlock_acquire(lt2, 0), DLOCK_ELOCKED);
		struct timespec ts = { 0, 500 * 1000000L };
		nanosleep(&ts, NULL);
	}
	CHECK(dlock_held(lt));
	CHECK_RC(dlock_release(lt), 0);
	CHECK_RC(dlock_acquire(lt2, 0), 0);
	CHECK(dlock_fence(lt2) > f1); /* the counter survived too */
	dlock_lock_free(lt);
	dlock_lock_free(lt2);
	dlock_lock_free(lg);
	dlock_store_close(t);
	dlock_store_close(t2);
	dlock_store_close(g);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mysql_store tests/servers/mysql.sh\n");
		return 1;
	}
	read_uri();
	test_bad_input();
	test_tls();
	test_schema();
	test_status();
	test_lease_expiry(uri);
	test_lease_expiry(uri_with("?mode=get_lock"));
	test_table_kill_connection();
	test_get_lock_kill();
	test_get_lock_long_names();
	test_get_lock_unsupported();
	test_get_lock_wait();
	test_batch_renew();
	test_restart(argv[1]);
	return tu_done("mysql_store");
}
