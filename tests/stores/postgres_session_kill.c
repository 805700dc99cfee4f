/*
 * PostgreSQL mode=advisory: a session the server ends while its holder runs
 * (pg_terminate_backend) frees the key at once, so the holder must hear of
 * it at once too, not at its next renewal (TTL/3 later: 10 s here).
 *
 *   postgres_session_kill      (URI from $DLOCK_TEST_URI_FILE)
 *
 * The bound allows for what this run measures: the kill itself (until the
 * backend is gone), the admin round trip (the renewal that finds the
 * connection dead is one) and the scheduling delay
 * (oversleep of 1 ms naps), each taken several times (the store's watching
 * thread, the renewer, the on_lost thread wake in turn).
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <string.h>
#include <time.h>
#include <unistd.h>

static char base_uri[2048], adv_uri[2100];
static PGconn *admin;

static long long rtt_ms(void)
{
	long long worst = 0;
	for (int i = 0; i < 5; i++) {
		long long t0 = tu_now_ms();
		PQclear(PQexec(admin, "SELECT 1"));
		long long t = tu_now_ms() - t0;
		worst = t > worst ? t : worst;
	}
	return worst;
}

static long long sched_ms(void)
{
	long long worst = 0;
	for (int i = 0; i < 20; i++) {
		long long t0 = tu_now_ms();
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
		long long t = tu_now_ms() - t0 - 1;
		worst = t > worst ? t : worst;
	}
	return worst;
}

static void kill_one(int nholds)
{
	const int64_t ttl = 30000;
	char name[4][96];
	dlock_store *s = nu_open(adv_uri);
	dlock_lock *l[4];
	for (int i = 0; i < nholds; i++) {
		snprintf(name[i], sizeof name[i], "pgkill-%d-%d-%d", (int)getpid(), nholds, i);
		l[i] = nu_lock(s, name[i], ttl, i == nholds - 1 ? NU_LOST : 0);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	atomic_store(&nu_lost_at, 0);
	long long rtt = rtt_ms(), sched = sched_ms();
	/* The last hold's session names itself "dlock <pid> <fence> ...". */
	char sql[512];
	/* PostgreSQL 14+: wait (up to 5 s) until the backend is gone, so that
	 * `killed` covers the server's part and the bound only ours. */
	snprintf(sql, sizeof sql,
		 "SELECT pg_terminate_backend(pid%s) FROM pg_stat_activity"
		 " WHERE application_name LIKE 'dlock %d %llu %%'",
		 PQserverVersion(admin) >= 140000 ? ", 5000" : "", (int)getpid(),
		 (unsigned long long)dlock_fence(l[nholds - 1]));
	long long t0 = tu_now_ms();
	PGresult *r = PQexec(admin, sql);
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0);
	PQclear(r);
	long long killed = tu_now_ms() - t0;
	long long bound = killed + 3 * rtt + 10 * sched + 100;
	long long lost = nu_wait_lost(ttl);
	long long took = lost ? lost - t0 : -1;
	printf("  %d hold(s), session of one killed: on_lost after %lld ms (bound %lld: kill %lld, "
	       "rtt %lld, sched %lld; next renewal was due in ~%lld ms)\n",
	       nholds, took, bound, killed, rtt, sched, (long long)(ttl / 3));
	CHECK(lost != 0);
	CHECK(took <= bound);
	CHECK(!dlock_held(l[nholds - 1]));
	/* The other holds (sessions of their own) are still held. */
	for (int i = 0; i < nholds - 1; i++)
		CHECK(dlock_held(l[i]));
	for (int i = 0; i < nholds; i++) {
		int rc = dlock_release(l[i]);
		CHECK(i == nholds - 1 ? (rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD) : rc == 0);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s);
}

int main(void)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_session_kill");
	snprintf(adv_uri, sizeof adv_uri, "%s?mode=advisory", base_uri);
	admin = PQconnectdb(base_uri);
	if (PQstatus(admin) != CONNECTION_OK) {
		fprintf(stderr, "admin connection: %s\n", PQerrorMessage(admin));
		return 1;
	}
	PQclear(PQexec(admin, "SET application_name = 'dlock-test-admin'"));
	kill_one(1);
	kill_one(3);
	PQfinish(admin);
	return tu_done("postgres_session_kill");
}
