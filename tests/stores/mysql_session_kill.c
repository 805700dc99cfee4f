/*
 * MySQL/MariaDB mode=get_lock: a session the server ends while its holder
 * runs (KILL) frees its GET_LOCK at once, so the holder must hear of it at
 * once too, not at its next renewal (TTL/3 later: 10 s here).
 *
 *   mysql_session_kill      (URI from $DLOCK_TEST_URI_FILE; KILL as root
 *                            over the server's socket in the same directory)
 *
 * The bound allows for what this run measures: the time until the server
 * shows the lock free, the admin round trip (the renewal that finds the
 * connection dead is one) and the scheduling delay (oversleep of 1 ms naps),
 * each taken several times (the watching thread, the renewer and the on_lost
 * thread wake in turn).
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <mysql.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char uri[2048], dir[1024], gl_uri[2100];
static MYSQL *admin;

/* First column of the first row as an integer; -1 for NULL or no row; -2 on error. */
static long long q1(const char *sql)
{
	if (mysql_query(admin, sql) != 0) {
		fprintf(stderr, "admin query failed: %s: %s\n", sql, mysql_error(admin));
		return -2;
	}
	MYSQL_RES *r = mysql_store_result(admin);
	MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
	long long v = row && row[0] ? atoll(row[0]) : -1;
	mysql_free_result(r);
	return v;
}

static long long rtt_ms(void)
{
	long long worst = 0;
	for (int i = 0; i < 5; i++) {
		long long t0 = tu_now_ms();
		q1("SELECT 1");
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
	char name[4][96], sql[256];
	dlock_store *s = nu_open(gl_uri);
	dlock_lock *l[4];
	for (int i = 0; i < nholds; i++) {
		snprintf(name[i], sizeof name[i], "mykill-%d-%d-%d", (int)getpid(), nholds, i);
		l[i] = nu_lock(s, name[i], ttl, i == nholds - 1 ? NU_LOST : 0);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	atomic_store(&nu_lost_at, 0);
	long long rtt = rtt_ms(), sched = sched_ms();
	char used[256];
	snprintf(used, sizeof used, "SELECT IS_USED_LOCK('dlock_test/dlock/%s')", name[nholds - 1]);
	long long id = q1(used);
	CHECK(id > 0);
	snprintf(sql, sizeof sql, "KILL %lld", id);
	long long t0 = tu_now_ms();
	CHECK(q1(sql) == -1);
	/* KILL only asks the session to end: until the server shows the lock free. */
	while (q1(used) > 0 && tu_now_ms() - t0 < 5000)
		;
	long long freed = tu_now_ms() - t0;
	long long bound = freed + 3 * rtt + 10 * sched + 100;
	long long lost = nu_wait_lost(ttl);
	long long took = lost ? lost - t0 : -1;
	printf("  %d hold(s), session of one killed: on_lost after %lld ms (bound %lld: free %lld, "
	       "rtt %lld, sched %lld; next renewal was due in ~%lld ms)\n",
	       nholds, took, bound, freed, rtt, sched, (long long)(ttl / 3));
	CHECK(lost != 0);
	CHECK(took <= bound);
	CHECK(!dlock_held(l[nholds - 1]));
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
	tu_uri_from_env(uri, sizeof uri, "mysql_session_kill");
	tu_server_dir(dir, sizeof dir);
	snprintf(gl_uri, sizeof gl_uri, "%s?mode=get_lock", uri);
	char sock[1100];
	snprintf(sock, sizeof sock, "%s/sock", dir);
	admin = mysql_init(NULL);
	if (!mysql_real_connect(admin, NULL, "root", NULL, "dlock_test", 0, sock, 0)) {
		fprintf(stderr, "admin connect: %s\n", mysql_error(admin));
		return 1;
	}
	kill_one(1);
	kill_one(3);
	mysql_close(admin);
	return tu_done("mysql_session_kill");
}
