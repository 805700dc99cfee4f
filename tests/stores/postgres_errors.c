/*
 * PostgreSQL: bad input and unreachable or refusing servers give clear codes.
 *
 *   postgres_errors      (URI from $DLOCK_TEST_URI_FILE)
 *
 * wrong password or unknown user -> DLOCK_EAUTH; unknown database -> DLOCK_EINVAL; nothing listening -> DLOCK_EUNAVAILABLE;
 * unknown mode / sslmode / option, two hosts -> DLOCK_EINVAL; sslmode=disable
 * is passed through and works; the password never appears in messages.
 * Six processes opening a store on a fresh database at the same moment all
 * succeed (schema creation is serialised) and the schema version is recorded;
 * a version 2 database is brought to version 3 by the next open.
 */
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char uri[2048];

static void expect_open(const char *u, int want)
{
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc != want)
		fprintf(stderr, "open %s\n", u);
	CHECK_RC(rc, want);
	if (rc == 0)
		dlock_store_close(s);
	else
		CHECK(s == NULL);
}

int main(void)
{
	tu_uri_from_env(uri, sizeof uri, "postgres_errors");
	char user[64], pass[128], hostport[128], db[64];
	if (sscanf(uri, "postgres://%63[^:]:%127[^@]@%127[^/]/%63s", user, pass, hostport, db) != 4) {
		fprintf(stderr, "postgres_errors: unexpected URI\n");
		return 2;
	}
	char u[4096];

	snprintf(u, sizeof u, "postgres://%s:wrong-%s@%s/%s", user, pass, hostport, db);
	expect_open(u, DLOCK_EAUTH);
	CHECK(strstr(dlock_error_last()->message, pass) == NULL);
	CHECK(strcmp(dlock_error_last()->store, "postgres") == 0);

	snprintf(u, sizeof u, "postgres://%s:%s@127.0.0.1:1/%s?connect_timeout=2s", user, pass, db);
	expect_open(u, DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, pass) == NULL);

	snprintf(u, sizeof u, "postgres://%s:%s@%s/no_such_db", user, pass, hostport);
	expect_open(u, DLOCK_EINVAL);
	snprintf(u, sizeof u, "postgres://nobody_here:%s@%s/%s", pass, hostport, db);
	expect_open(u, DLOCK_EAUTH);

	snprintf(u, sizeof u, "%s?mode=fast", uri);
	expect_open(u, DLOCK_EINVAL);
	snprintf(u, sizeof u, "%s?sslmode=sometimes", uri);
	expect_open(u, DLOCK_EINVAL);
	snprintf(u, sizeof u, "%s?colour=blue", uri);
	expect_open(u, DLOCK_EINVAL);
	snprintf(u, sizeof u, "postgres://%s:%s@%s,%s/%s", user, pass, hostport, hostport, db);
	expect_open(u, DLOCK_EINVAL);

	/* A fresh database, six first users at once. */
	PGconn *admin = PQconnectdb(uri);
	CHECK(PQstatus(admin) == CONNECTION_OK);
	char fresh[64], sql[256];
	snprintf(fresh, sizeof fresh, "dlock_fresh_%d", (int)getpid());
	snprintf(sql, sizeof sql, "CREATE DATABASE %s", fresh);
	PQclear(PQexec(admin, sql));
	snprintf(u, sizeof u, "postgres://%s:%s@%s/%s", user, pass, hostport, fresh);
	int go[2];
	CHECK(pipe(go) == 0);
	pid_t kids[6];
	for (int i = 0; i < 6; i++) {
		fflush(NULL);
		kids[i] = fork();
		if (kids[i] == 0) {
			char c;
			close(go[1]);
			if (read(go[0], &c, 1) != 0) /* EOF = go */
				_exit(3);
			dlock_store *s = NULL;
			int rc = dlock_store_open(&s, i % 2 ? u : strcat(u, "?mode=advisory"));
			if (rc)
				fprintf(stderr, "child %d: %s\n", i, dlock_error_last()->message);
			dlock_store_close(s);
			_exit(rc ? 1 : 0);
		}
	}
	close(go[0]);
	close(go[1]);
	for (int i = 0; i < 6; i++) {
		int st = 0;
		waitpid(kids[i], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	PGconn *fc = PQconnectdb(u);
	PGresult *r = PQexec(fc, "SELECT version FROM dlock_schema WHERE component = 'dlock'");
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
	      strcmp(PQgetvalue(r, 0, 0), "3") == 0);
	PQclear(r);
	/* A version 2 database (no `waited` column) is brought to 3 by the next
	 * open, and a lock with a waiter works in it. */
	PQclear(PQexec(fc, "ALTER TABLE dlock_holders DROP COLUMN waited;"
			   " UPDATE dlock_schema SET version = 2"));
	dlock_store *up = NULL;
	CHECK_RC(dlock_store_open(&up, u), 0);
	r = PQexec(fc, "SELECT (SELECT version FROM dlock_schema WHERE component = 'dlock'),"
		   " (SELECT count(*) FROM information_schema.columns"
		   "  WHERE table_name = 'dlock_holders' AND column_name = 'waited')");
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
	      strcmp(PQgetvalue(r, 0, 0), "3") == 0 && strcmp(PQgetvalue(r, 0, 1), "1") == 0);
	PQclear(r);
	if (up) {
		dlock_lock *a = NULL, *b = NULL;
		CHECK_RC(dlock_lock_new(&a, up, "upgraded", NULL), 0);
		CHECK_RC(dlock_lock_new(&b, up, "upgraded", NULL), 0);
		CHECK_RC(dlock_acquire(a, 0), 0);
		CHECK_RC(dlock_acquire(b, 200), DLOCK_ETIMEOUT); /* queued: marks a's hold */
		r = PQexec(fc, "SELECT count(*) FROM dlock_holders WHERE name = 'upgraded' AND waited");
		CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "1") == 0);
		PQclear(r);
		CHECK_RC(dlock_release(a), 0);
		CHECK_RC(dlock_acquire(b, 0), 0);
		CHECK_RC(dlock_release(b), 0);
		dlock_lock_free(a);
		dlock_lock_free(b);
		dlock_store_close(up);
	}
	PQfinish(fc);
	snprintf(sql, sizeof sql, "DROP DATABASE %s WITH (FORCE)", fresh);
	PQclear(PQexec(admin, sql));
	PQfinish(admin);

	snprintf(u, sizeof u, "%s?sslmode=disable&mode=table", uri);
	expect_open(u, 0);
	snprintf(u, sizeof u, "%s?sslmode=disable&mode=advisory", uri);
	expect_open(u, 0);
	return tu_done("postgres_errors");
}
