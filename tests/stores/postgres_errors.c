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

/* The fence of an advisory acquire of `nm` on `s` (released at once). */
static uint64_t adv_fence(dlock_store *s, const char *nm)
{
	dlock_lock *l = NULL;
	uint64_t f = 0;
	CHECK_RC(dlock_lock_new(&l, s, nm, NULL), 0);
	if (l && dlock_acquire(l, 0) == 0) {
		f = dlock_fence(l);
		CHECK_RC(dlock_release(l), 0);
	}
	dlock_lock_free(l);
	return f;
}

/* What a library older than schema version 4 sends for an advisory grant of
 * `nm` (its fence counter row); the fence it would hand out. */
static uint64_t old_adv_fence(PGconn *c, const char *nm)
{
	const char *v[] = { "dlock", nm };
	PGresult *r = PQexecParams(c,
				   "INSERT INTO dlock_locks AS d (ns, name, fence) SELECT $1, $2, 1"
				   " ON CONFLICT (ns, name) DO UPDATE SET fence = d.fence + 1 RETURNING d.fence",
				   2, NULL, v, NULL, NULL, 0);
	uint64_t f = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? strtoull(PQgetvalue(r, 0, 0), NULL, 10)
									       : 0;
	if (!f)
		fprintf(stderr, "old advisory statement: %s\n", PQerrorMessage(c));
	PQclear(r);
	return f;
}

/*
 * A version 3 database whose advisory names have counter rows is brought to
 * 4: fences then come from one sequence, started above every counter, and an
 * older library still running (its counter upsert) keeps handing out fences
 * above the new ones, and the new ones above its. Table mode keeps its own
 * counter per name (no sequence: fences go up by one).
 */
static void advisory_upgrade(PGconn *fc, const char *u)
{
	PQclear(PQexec(fc,
		       "DROP TRIGGER dlock_advisory_fence ON dlock_locks;"
		       " DROP FUNCTION dlock_fence_from_sequence(); DROP SEQUENCE dlock_fences;"
		       " ALTER TABLE dlock_locks DROP COLUMN by_table;"
		       " INSERT INTO dlock_locks (ns, name, fence) VALUES ('dlock', 'adv-old', 500);"
		       " UPDATE dlock_schema SET version = 3"));
	char au[4200];
	snprintf(au, sizeof au, "%s?mode=advisory", u);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, au), 0);
	if (!s)
		return;
	uint64_t f1 = adv_fence(s, "adv-old");
	uint64_t f2 = old_adv_fence(fc, "adv-old");
	uint64_t f3 = adv_fence(s, "adv-old");
	uint64_t f4 = old_adv_fence(fc, "adv-old");
	uint64_t f5 = adv_fence(s, "adv-new");
	printf("advisory fences across the upgrade (counter was 500): new %llu, old %llu, new %llu,"
	       " old %llu; another name %llu\n",
	       (unsigned long long)f1, (unsigned long long)f2, (unsigned long long)f3, (unsigned long long)f4,
	       (unsigned long long)f5);
	CHECK(f1 > 500 && f2 > f1 && f3 > f2 && f4 > f3 && f5 > f4);
	dlock_store_close(s);
	dlock_store *t = NULL;
	CHECK_RC(dlock_store_open(&t, u), 0);
	if (t) {
		uint64_t a = adv_fence(t, "table-counter"), b = adv_fence(t, "table-counter");
		printf("table mode fences: %llu, %llu\n", (unsigned long long)a, (unsigned long long)b);
		CHECK(a > 0 && b == a + 1);
		dlock_store_close(t);
	}
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
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "4") == 0);
	PQclear(r);
	/* A version 2 database (no `waited` column) is brought to 4 by the next
	 * open, and a lock with a waiter works in it. */
	PQclear(PQexec(fc,
		       "ALTER TABLE dlock_holders DROP COLUMN waited;"
		       " UPDATE dlock_schema SET version = 2"));
	dlock_store *up = NULL;
	CHECK_RC(dlock_store_open(&up, u), 0);
	r = PQexec(fc,
		   "SELECT (SELECT version FROM dlock_schema WHERE component = 'dlock'),"
		   " (SELECT count(*) FROM information_schema.columns"
		   "  WHERE table_name = 'dlock_holders' AND column_name = 'waited')");
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "4") == 0 &&
	      strcmp(PQgetvalue(r, 0, 1), "1") == 0);
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
	advisory_upgrade(fc, u);
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
