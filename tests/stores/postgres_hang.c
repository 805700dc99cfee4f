/*
 * PostgreSQL with a hung server (the backend processes of one store, or the
 * postmaster, stopped with SIGSTOP: the same as a black-holed TCP link, the
 * kernel still acknowledges everything), in both modes:
 *
 *   postgres_hang      (URI from $DLOCK_TEST_URI_FILE)
 *
 * 1. acquire with wait 1000 on a hung connection returns within 1050 ms;
 *    also when the server hangs while the caller waits (LISTEN, heartbeat).
 * 2. release and status with timeout=300ms return within 350 ms; in advisory
 *    mode the unconfirmed release closed the hold's connection (its backend
 *    exits as soon as it runs again, so the lock goes with the session).
 * 3. open with connect_timeout=500ms and the postmaster stopped: within 550 ms.
 * 4. a held lock (ttl 2000) whose backends hang: on_lost no later than its
 *    deadline + TU_SCHED_GRACE_MS, and before another client is granted the lock.
 *
 * A call that does not return in time is not left hanging: a watchdog
 * thread resumes every stopped process a few seconds later, so the test fails
 * on its time bound. Every stopped process is resumed at exit.
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define SLACK_MS (50 + TU_SCHED_GRACE_MS) /* the promise + scheduling grace */

static char base_uri[2048];
static const char *mode_name;
static PGconn *admin;

/* ------------------------------------------------------- stopped processes */

static pthread_mutex_t stop_mu = PTHREAD_MUTEX_INITIALIZER;
static int stopped[256];
static atomic_int nstopped;
static atomic_llong watchdog_at; /* tu_now_ms() at which to resume all; 0 = off */

static void cont_all(void)
{
	pthread_mutex_lock(&stop_mu);
	int n = atomic_load(&nstopped);
	for (int i = 0; i < n; i++)
		kill(stopped[i], SIGCONT);
	atomic_store(&nstopped, 0);
	atomic_store(&watchdog_at, 0);
	pthread_mutex_unlock(&stop_mu);
}

static void on_fatal(int sig)
{
	/* async-signal-safe enough: kill only */
	int n = atomic_load(&nstopped);
	for (int i = 0; i < n; i++)
		kill(stopped[i], SIGCONT);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void stop_pid(int pid)
{
	pthread_mutex_lock(&stop_mu);
	int n = atomic_load(&nstopped);
	if (n < (int)(sizeof stopped / sizeof stopped[0]) && tu_stop(pid) >= 0) {
		stopped[n] = pid;
		atomic_store(&nstopped, n + 1);
	}
	pthread_mutex_unlock(&stop_mu);
}

static void *watchdog(void *arg)
{
	(void)arg;
	for (;;) {
		long long at = atomic_load(&watchdog_at);
		if (at && tu_now_ms() >= at) {
			fprintf(stderr, "  watchdog: a call did not return in time; resuming the server\n");
			cont_all();
		}
		usleep(10000);
	}
	return NULL;
}

/* -------------------------------------------------------------- the server */

/* Backend pids of dlock sessions (every one but the admin's). */
static int dlock_pids(int *out, int max)
{
	PGresult *r = PQexec(admin,
			     "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'dlock%'"
			     " AND pid <> pg_backend_pid()");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "admin query failed: %s\n", PQerrorMessage(admin));
		PQclear(r);
		exit(1);
	}
	int n = 0;
	for (int i = 0; i < PQntuples(r) && n < max; i++)
		out[n++] = atoi(PQgetvalue(r, i, 0));
	PQclear(r);
	return n;
}

typedef struct pidset {
	int pid[256];
	int n;
} pidset;

static void snapshot(pidset *s)
{
	s->n = dlock_pids(s->pid, 256);
}

static int in_set(const pidset *s, int pid)
{
	for (int i = 0; i < s->n; i++)
		if (s->pid[i] == pid)
			return 1;
	return 0;
}

/* Stop every dlock backend that was not in `before` (the store under test's). */
static int stop_new(const pidset *before, pidset *which)
{
	pidset now;
	snapshot(&now);
	int n = 0;
	if (which)
		which->n = 0;
	for (int i = 0; i < now.n; i++) {
		if (in_set(before, now.pid[i]))
			continue;
		stop_pid(now.pid[i]);
		if (which)
			which->pid[which->n++] = now.pid[i];
		n++;
	}
	return n;
}

static int backend_alive(int pid)
{
	char sql[128];
	snprintf(sql, sizeof sql, "SELECT 1 FROM pg_stat_activity WHERE pid = %d", pid);
	PGresult *r = PQexec(admin, sql);
	int alive = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
	PQclear(r);
	return alive;
}

static int postmaster_pid(void)
{
	PGresult *r = PQexec(admin, "SELECT current_setting('data_directory')");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		PQclear(r);
		return -1;
	}
	char path[1024];
	snprintf(path, sizeof path, "%s/postmaster.pid", PQgetvalue(r, 0, 0));
	PQclear(r);
	FILE *f = fopen(path, "r");
	int pid = -1;
	if (f) {
		if (fscanf(f, "%d", &pid) != 1)
			pid = -1;
		fclose(f);
	}
	return pid;
}

/* ------------------------------------------------------------------ helpers */

static void uri_with(char *buf, size_t n, const char *extra)
{
	snprintf(buf, n, "%s?mode=%s%s%s", base_uri, mode_name, extra && *extra ? "&" : "", extra ? extra : "");
}

static dlock_store *open_store(const char *extra)
{
	char uri[2300];
	uri_with(uri, sizeof uri, extra);
	return nu_open(uri);
}

static void name_of(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "pghang-%d-%s-%s", (int)getpid(), mode_name, what);
}

/* A store whose connections exist before the snapshot: its backends are
 * never stopped (the "other client"). */
static dlock_store *other_client(void)
{
	dlock_store *s = open_store(NULL);
	char name[128];
	name_of(name, sizeof name, "other-warm");
	dlock_lock *l = nu_lock(s, name, 5000, NU_LOST);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	return s;
}

/* Make the store's connection exist (an acquire and a release). */
static void warm(dlock_store *s)
{
	char name[128];
	name_of(name, sizeof name, "warm");
	dlock_lock *l = nu_lock(s, name, 5000, NU_LOST);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
}

/* ------------------------------------------------------------------- tests */

/* 1a. A hung connection: acquire(wait 1000) returns within 1050 ms. */
static void test_acquire_hung(void)
{
	char name[128], name2[128];
	name_of(name, sizeof name, "acq");
	name_of(name2, sizeof name2, "acq-after");
	pidset before;
	snapshot(&before);
	dlock_store *s = open_store(NULL);
	warm(s);
	CHECK(stop_new(&before, NULL) >= 1);
	atomic_store(&watchdog_at, tu_now_ms() + 4000);
	dlock_lock *l = nu_lock(s, name, 5000, NU_LOST);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 1000);
	long long took = tu_now_ms() - t0;
	printf("  [%s] hung backend: acquire(wait 1000) returned %s after %lld ms\n", mode_name, dlock_error_name(rc),
	       took);
	CHECK(took <= 1000 + SLACK_MS);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	if (rc == DLOCK_EUNAVAILABLE)
		CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	cont_all();
	/* The store reconnects on the next call. */
	dlock_lock *l2 = nu_lock(s, name2, 5000, NU_LOST);
	CHECK_RC(dlock_acquire(l2, 3000), 0);
	CHECK_RC(dlock_release(l2), 0);
	dlock_lock_free(l2);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* 1b. The server hangs while the caller waits for a held lock. */
static void test_wait_hung(void)
{
	char name[128];
	name_of(name, sizeof name, "wait");
	dlock_store *o = other_client();
	dlock_lock *held = nu_lock(o, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(held, 0), 0);
	pidset before;
	snapshot(&before);
	dlock_store *s = open_store(NULL);
	nu_bg w = { .lock = nu_lock(s, name, 5000, NU_LOST), .wait = 1500 };
	nu_bg_start(&w);
	usleep(400 * 1000); /* waiting now: refused once, LISTEN in place */
	CHECK(stop_new(&before, NULL) >= 2);
	atomic_store(&watchdog_at, tu_now_ms() + 4000);
	nu_bg_join(&w);
	long long took = w.ended - w.started;
	printf("  [%s] server hung mid-wait: acquire(wait 1500) returned %s after %lld ms\n", mode_name,
	       dlock_error_name(w.rc), took);
	CHECK(took <= 1500 + SLACK_MS);
	CHECK(w.rc == DLOCK_ETIMEOUT || w.rc == DLOCK_EUNAVAILABLE);
	cont_all();
	CHECK_RC(dlock_release(held), 0);
	dlock_lock_free(w.lock);
	dlock_store_close(s);
	dlock_lock_free(held);
	dlock_store_close(o);
}

/* 2. release and status within timeout= + 50 ms; advisory: the session is closed. */
static void test_release_hung(void)
{
	char name[128];
	name_of(name, sizeof name, "rel");
	dlock_store *o = other_client();
	pidset before;
	snapshot(&before);
	dlock_store *s = open_store("timeout=300ms");
	dlock_store *s2 = open_store("timeout=300ms"); /* for status: its own connection */
	dlock_lock *l = nu_lock(s, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(l, 0), 0);
	/* advisory: the hold's backend names itself "dlock <pid> <fence> ..." */
	int hold_pid = 0;
	{
		char sql[256];
		snprintf(sql, sizeof sql,
			 "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'dlock %d %llu %%'",
			 (int)getpid(), (unsigned long long)dlock_fence(l));
		PGresult *r = PQexec(admin, sql);
		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
			hold_pid = atoi(PQgetvalue(r, 0, 0));
		PQclear(r);
	}
	CHECK(stop_new(&before, NULL) >= 1);
	/* and the postmaster: a reconnect after a dropped connection hangs too */
	int pm = postmaster_pid();
	CHECK(pm > 0);
	if (pm > 0)
		stop_pid(pm);
	atomic_store(&watchdog_at, tu_now_ms() + 4000);

	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	long long t0 = tu_now_ms();
	int rc = dlock_store_status(s2, names, 1, &st, &cnt);
	long long took = tu_now_ms() - t0;
	printf("  [%s] hung server: status returned %s after %lld ms (timeout=300ms)\n", mode_name,
	       dlock_error_name(rc), took);
	CHECK(took <= 300 + SLACK_MS);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	if (rc == 0)
		dlock_status_free(st, cnt);
	t0 = tu_now_ms();
	rc = dlock_release(l);
	took = tu_now_ms() - t0;
	printf("  [%s] hung backend: release returned %s after %lld ms (timeout=300ms)\n", mode_name,
	       dlock_error_name(rc), took);
	CHECK(took <= 300 + SLACK_MS);
	CHECK(rc != 0);

	cont_all();
	if (strcmp(mode_name, "advisory") == 0) {
		/* The hold's connection was closed: its backend ends as soon as it runs,
		 * and the lock with it (the lease is 30 s). */
		CHECK(hold_pid > 0);
		long long t1 = tu_now_ms();
		int alive;
		while ((alive = hold_pid > 0 && backend_alive(hold_pid)) && tu_now_ms() - t1 < 2000)
			usleep(10000);
		CHECK(alive == 0);
		dlock_lock *ol = nu_lock(o, name, 5000, NU_LOST);
		t1 = tu_now_ms();
		CHECK_RC(dlock_acquire(ol, 2000), 0);
		printf("  [%s] unconfirmed release: another client got the lock %lld ms after resume\n", mode_name,
		       tu_now_ms() - t1);
		CHECK_RC(dlock_release(ol), 0);
		dlock_lock_free(ol);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	dlock_store_close(s2);
	dlock_store_close(o);
}

/* 3. open with connect_timeout=500ms while the postmaster is stopped. */
static void test_open_hung(void)
{
	int pm = postmaster_pid();
	CHECK(pm > 0);
	if (pm <= 0)
		return;
	char uri[2300];
	uri_with(uri, sizeof uri, "connect_timeout=500ms");
	stop_pid(pm);
	atomic_store(&watchdog_at, tu_now_ms() + 4000);
	dlock_store *s = NULL;
	long long t0 = tu_now_ms();
	int rc = dlock_store_open(&s, uri);
	long long took = tu_now_ms() - t0;
	cont_all();
	printf("  [%s] postmaster stopped: open(connect_timeout=500ms) returned %s after %lld ms\n", mode_name,
	       dlock_error_name(rc), took);
	CHECK(took <= 500 + SLACK_MS);
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	dlock_store_close(s);
}

/* 4. A held lock whose backends hang: on_lost by its deadline, before anyone else gets it. */
static void test_lost_hung(void)
{
	char name[128];
	name_of(name, sizeof name, "lost");
	dlock_store *o = other_client();
	pidset before;
	snapshot(&before);
	dlock_store *s = open_store(NULL);
	const int64_t ttl = 2000;
	dlock_lock *l = nu_lock(s, name, ttl, NU_LOST);
	atomic_store(&nu_lost_at, 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	long long deadline = tu_now_ms() + dlock_ttl_left(l);
	CHECK(stop_new(&before, NULL) >= 1);
	atomic_store(&watchdog_at, deadline + 4000);
	dlock_lock *ol = nu_lock(o, name, 5000, NU_LOST);
	long long granted_at = 0;
	int resumed = 0;
	while (tu_now_ms() < deadline + 6000) {
		int rc = dlock_acquire(ol, 0);
		if (rc == 0) {
			granted_at = tu_now_ms();
			break;
		}
		/* Advisory: nobody else can get a key a stopped backend holds; resume it
		 * once the holder has been told (its connection is given up: the
		 * session ends). */
		if (!resumed && (atomic_load(&nu_lost_at) || tu_now_ms() > deadline + 2000)) {
			cont_all();
			resumed = 1;
		}
		usleep(5000);
	}
	cont_all();
	long long lost = atomic_load(&nu_lost_at);
	printf("  [%s] hung backends, ttl %lld: on_lost %+lld ms from the deadline, other client "
	       "granted %+lld ms from it\n",
	       mode_name, (long long)ttl, lost ? lost - deadline : 99999, granted_at ? granted_at - deadline : 99999);
	CHECK(lost != 0);
	CHECK(lost <= deadline + TU_SCHED_GRACE_MS);
	CHECK(granted_at != 0);
	CHECK(lost != 0 && granted_at >= lost);
	CHECK(!dlock_held(l));
	if (granted_at)
		CHECK_RC(dlock_release(ol), 0);
	dlock_release(l);
	dlock_lock_free(ol);
	dlock_lock_free(l);
	dlock_store_close(s);
	dlock_store_close(o);
}

int main(int argc, char **argv)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_hang");
	admin = PQconnectdb(base_uri);
	if (PQstatus(admin) != CONNECTION_OK) {
		fprintf(stderr, "admin connection: %s\n", PQerrorMessage(admin));
		return 1;
	}
	PQclear(PQexec(admin, "SET application_name = 'test-admin'"));
	atexit(cont_all);
	signal(SIGABRT, on_fatal);
	signal(SIGSEGV, on_fatal);
	signal(SIGTERM, on_fatal);
	signal(SIGINT, on_fatal);
	pthread_t wd;
	pthread_create(&wd, NULL, watchdog, NULL);
	pthread_detach(wd);
	const char *only = argc > 1 ? argv[1] : NULL;
	static const char *const modes[] = { "table", "advisory" };
	for (int m = 0; m < 2; m++) {
		mode_name = modes[m];
		if (only && strcmp(only, mode_name) != 0)
			continue;
		test_acquire_hung();
		test_wait_hung();
		test_release_hung();
		test_open_hung();
		test_lost_hung();
	}
	PQfinish(admin);
	return tu_done("postgres_hang");
}
