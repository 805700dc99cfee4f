/*
 * PostgreSQL connection-held locks (mode=advisory), against a real server:
 *
 *   postgres_advisory      (URI from $DLOCK_TEST_URI_FILE)
 *
 * 1. pg_terminate_backend() of the holder's connection: the holder gets the
 *    lost signal (on_lost, held() false) and another client gets the lock.
 * 2. A SIGKILLed holder process: its connection closes, the lock is free at once.
 * 3. A stopped (hung) holder: the server ends its session after the lease
 *    (idle_session_timeout), not earlier, and frees the lock.
 * 4. The advisory key is FNV-1a 64 of prefix NUL name, as documented.
 * 5. Contrast, mode=table: terminating the holder's connection loses nothing
 *    (the lease is in a table; the store reconnects and renews).
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char base_uri[2048], adv_uri[2100];
static PGconn *admin;
/* Rows of a query on the admin connection, or -1 on error. */
static int admin_rows(const char *sql, char *first, size_t n)
{
	PGresult *r = PQexec(admin, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "admin query failed: %s\n", PQerrorMessage(admin));
		PQclear(r);
		return -1;
	}
	int rows = PQntuples(r);
	if (first && n) {
		first[0] = 0;
		if (rows > 0)
			snprintf(first, n, "%s", PQgetvalue(r, 0, 0));
	}
	PQclear(r);
	return rows;
}

static void name_of(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "pgadv-%d-%s", (int)getpid(), what);
}

static void test_terminate_gives_lost_signal(void)
{
	char name[128], sql[512];
	name_of(name, sizeof name, "terminate");
	dlock_store *s = nu_open(adv_uri);
	const int64_t ttl = 3000;
	dlock_lock *l = nu_lock(s, name, ttl, NU_LOST);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	/* The holder's session names itself "dlock <pid> <fence> <lease ms> <host>". */
	snprintf(sql, sizeof sql,
		 "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
		 " WHERE application_name LIKE 'dlock %d %llu %%'",
		 (int)getpid(), (unsigned long long)dlock_fence(l));
	long long t0 = tu_now_ms();
	char ok[8];
	CHECK(admin_rows(sql, ok, sizeof ok) == 1);
	CHECK(strcmp(ok, "t") == 0);
	while (!nu_lost_at && tu_now_ms() - t0 < ttl + 2000)
		usleep(5000);
	long long took = tu_now_ms() - t0;
	printf("  terminated backend: on_lost after %lld ms (ttl %lld ms)\n", took, (long long)ttl);
	CHECK(nu_lost_at != 0);
	/* Found by the renewal (every ttl/3 = 1 s), not by the lease deadline
	 * running out (~3 s after the acquire). */
	CHECK(took < ttl * 2 / 3 + 200);
	CHECK(!dlock_held(l));
	int rc = dlock_release(l);
	CHECK(rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD);
	/* Someone else can take it at once. */
	dlock_store *s2 = nu_open(adv_uri);
	dlock_lock *o = nu_lock(s2, name, ttl, 0);
	CHECK_RC(dlock_acquire(o, 0), 0);
	CHECK_RC(dlock_release(o), 0);
	dlock_lock_free(o);
	dlock_store_close(s2);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* Child: take the lock, say so on fd, then hang until killed or stopped. */
static pid_t spawn_holder(const char *name, int64_t ttl, int fd[2])
{
	if (pipe(fd) != 0)
		exit(1);
	fflush(NULL);
	pid_t p = fork();
	if (p == 0) {
		dlock_store *s = nu_open(adv_uri);
		dlock_lock *l = nu_lock(s, name, ttl, 0);
		if (dlock_acquire(l, 0) != 0)
			_exit(3);
		char c = 1;
		if (write(fd[1], &c, 1) != 1)
			_exit(4);
		for (;;)
			pause();
	}
	char c;
	CHECK(read(fd[0], &c, 1) == 1);
	return p;
}

static void test_killed_holder_frees_at_once(void)
{
	char name[128];
	name_of(name, sizeof name, "killed");
	int fd[2];
	pid_t p = spawn_holder(name, 30000, fd);
	dlock_store *s = nu_open(adv_uri);
	dlock_lock *l = nu_lock(s, name, 5000, 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	long long t0 = tu_now_ms();
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	CHECK_RC(dlock_acquire(l, 10000), 0);
	long long took = tu_now_ms() - t0;
	printf("  killed holder (ttl 30 s): lock free after %lld ms\n", took);
	CHECK(took < 5000);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	close(fd[0]);
	close(fd[1]);
}

static void test_hung_holder_session_ends(void)
{
	char name[128];
	name_of(name, sizeof name, "hung");
	const int64_t ttl = 1500;
	int fd[2];
	pid_t p = spawn_holder(name, ttl, fd);
	long long t0 = tu_now_ms();
	tu_stop(p);
	dlock_store *s = nu_open(adv_uri);
	dlock_lock *l = nu_lock(s, name, 5000, 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(l, ttl + 5000), 0);
	long long took = tu_now_ms() - t0;
	printf("  stopped holder (ttl %lld ms): lock free after %lld ms\n", (long long)ttl, took);
	/* Not before the lease: the renewer may have run up to ttl/3 before the stop. */
	CHECK(took >= ttl - ttl / 3 - 100);
	CHECK_RC(dlock_release(l), 0);
	kill(p, SIGKILL);
	kill(p, SIGCONT);
	waitpid(p, NULL, 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	close(fd[0]);
	close(fd[1]);
}

static void test_key_is_fnv1a(void)
{
	char name[128], sql[512];
	name_of(name, sizeof name, "key");
	uint64_t h = 14695981039346656037ULL;
	const char *prefix = "dlock";
	for (size_t i = 0; i <= strlen(prefix); i++) /* includes the NUL */
		h = (h ^ (unsigned char)prefix[i]) * 1099511628211ULL;
	for (const char *c = name; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ULL;
	dlock_store *s = nu_open(adv_uri);
	dlock_lock *l = nu_lock(s, name, 5000, 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	snprintf(sql, sizeof sql,
		 "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
		 " AND classid = %u AND objid = %u AND mode = 'ExclusiveLock'",
		 (unsigned)(h >> 32), (unsigned)(h & 0xffffffffu));
	CHECK(admin_rows(sql, NULL, 0) == 1);
	CHECK_RC(dlock_release(l), 0);
	CHECK(admin_rows(sql, NULL, 0) == 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void test_table_mode_survives_reconnect(void)
{
	char name[128];
	name_of(name, sizeof name, "table");
	dlock_store *s = nu_open(base_uri);
	const int64_t ttl = 1500;
	dlock_lock *l = nu_lock(s, name, ttl, NU_LOST);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t fence = dlock_fence(l);
	/* Every dlock session of ours except the admin one. */
	CHECK(admin_rows("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
			 " WHERE application_name = 'dlock' AND pid <> pg_backend_pid()",
			 NULL, 0) >= 1);
	usleep((useconds_t)(ttl * 2 * 1000)); /* two full leases: renewal must have reconnected */
	CHECK(nu_lost_at == 0);
	CHECK(dlock_held(l));
	CHECK(dlock_fence(l) == fence);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

int main(void)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_advisory");
	snprintf(adv_uri, sizeof adv_uri, "%s?mode=advisory", base_uri);
	admin = PQconnectdb(base_uri);
	if (PQstatus(admin) != CONNECTION_OK) {
		fprintf(stderr, "admin connection: %s\n", PQerrorMessage(admin));
		return 1;
	}
	PQclear(PQexec(admin, "SET application_name = 'dlock-test-admin'"));
	test_key_is_fnv1a();
	test_terminate_gives_lost_signal();
	test_killed_holder_frees_at_once();
	test_hung_holder_session_ends();
	test_table_mode_survives_reconnect();
	PQfinish(admin);
	return tu_done("postgres_advisory");
}
