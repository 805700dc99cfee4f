/*
 * PostgreSQL waiters are woken by LISTEN/NOTIFY, from several threads at once:
 *
 *   postgres_wake      (URI from $DLOCK_TEST_URI_FILE; runs table and advisory mode)
 *
 * One store, THREADS threads each waiting on the same name with their own
 * handle (so be->wait runs concurrently in all of them). After the holder
 * releases, each waiter holds for HOLD_MS and releases. Without a wake-up a
 * waiter only retries every second (the queue heartbeat; the holder's lease
 * is 20 s), so the hand-over chain would take about THREADS seconds; with
 * NOTIFY it takes about THREADS * HOLD_MS.
 *
 * Table mode also: a release notifies only when a waiter queued behind it
 * (the holds a refused waiter marks; notifications counted on a LISTEN
 * connection of the test's own), and a release that commits while a waiter
 * marks it (held open by the test on its own connection) gives that waiter
 * the lock in the same try, with no notification.
 *
 * Advisory mode also: a release notifies only when a waiter holds the name's
 * "waiting" key (it takes it when refused), counted the same way.
 */
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define THREADS 4
#define HOLD_MS 50

static char base_uri[2048];
static dlock_store *store;
static char name[128];
static atomic_int granted, failures, inside;
static long long last_grant;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *waiter(void *arg)
{
	(void)arg;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, store, name, &o) != 0) {
		failures++;
		return NULL;
	}
	if (dlock_acquire(l, 30000) != 0) {
		fprintf(stderr, "waiter: %s\n", dlock_error_last()->message);
		failures++;
	} else {
		if (++inside != 1)
			failures++; /* two holders at once */
		pthread_mutex_lock(&mu);
		last_grant = tu_now_ms();
		pthread_mutex_unlock(&mu);
		granted++;
		usleep(HOLD_MS * 1000);
		inside--;
		if (dlock_release(l) != 0)
			failures++;
	}
	dlock_lock_free(l);
	return NULL;
}

static void run(const char *mode)
{
	char uri[2200];
	snprintf(uri, sizeof uri, "%s?mode=%s", base_uri, mode);
	snprintf(name, sizeof name, "pgwake-%d-%s", (int)getpid(), mode);
	if (dlock_store_open(&store, uri) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		exit(1);
	}
	dlock_store *hs;
	if (dlock_store_open(&hs, uri) != 0)
		exit(1);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	dlock_lock *h;
	CHECK_RC(dlock_lock_new(&h, hs, name, &o), 0);
	CHECK_RC(dlock_acquire(h, 0), 0);
	granted = failures = inside = 0;
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, waiter, NULL);
	usleep(1500000); /* all of them tried, failed and sit in wait() */
	CHECK(granted == 0);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(h), 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	long long chain = last_grant - t0;
	printf("  %s: %d waiters handed the lock on in %lld ms (each held %d ms)\n", mode, THREADS, chain, HOLD_MS);
	CHECK(granted == THREADS);
	CHECK(failures == 0);
	/* Without the NOTIFY each hand-over waits for the next 1 s heartbeat
	 * (measured: 3.5 s for this chain); with it, ~THREADS * HOLD_MS. The
	 * margin is for loaded CI machines. */
	CHECK(chain < THREADS * HOLD_MS + 1500);
	dlock_lock_free(h);
	dlock_store_close(hs);
	dlock_store_close(store);
}

/* A plain libpq connection (the test's own), or exit. */
static PGconn *raw_conn(void)
{
	PGconn *c = PQconnectdb(base_uri);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "libpq: %s", PQerrorMessage(c));
		exit(1);
	}
	return c;
}

static int exec_ok(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
	if (!ok)
		fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return ok;
}

/* One integer a query returns, or -1. */
static long query_long(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	long v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? strtol(PQgetvalue(r, 0, 0), NULL, 10) : -1;
	PQclear(r);
	return v;
}

/* Notifications for `name` that `listener` gets before a marker notification
 * sent after everything so far (NOTIFYs are delivered in commit order). */
static int count_notifies(PGconn *listener, PGconn *other, const char *nm)
{
	char marker[160], sql[256];
	snprintf(marker, sizeof marker, "marker-%s", nm);
	snprintf(sql, sizeof sql, "NOTIFY dlock_wake, '%s'", marker);
	if (!exec_ok(other, sql))
		return -1;
	int n = 0;
	long long end = tu_now_ms() + 10000;
	while (tu_now_ms() < end) {
		if (!PQconsumeInput(listener))
			return -1;
		PGnotify *no;
		while ((no = PQnotifies(listener))) {
			int mine = strcmp(no->extra, marker) == 0;
			const char *sep = strchr(no->extra, '\x1f');
			if (!mine && sep && strcmp(sep + 1, nm) == 0)
				n++;
			PQfreemem(no);
			if (mine)
				return n;
		}
		struct pollfd p = { PQsocket(listener), POLLIN, 0 };
		poll(&p, 1, 100);
	}
	return -1;
}

static dlock_store *w_store;
static dlock_lock *w_lock;
static int w_rc, w_release_rc;

/* The waiter: a waiting acquire, then its release (a lock belongs to the
 * thread that took it). */
static void *try_wait(void *arg)
{
	(void)arg;
	w_rc = dlock_acquire(w_lock, 10000);
	w_release_rc = w_rc == 0 ? dlock_release(w_lock) : w_rc;
	return NULL;
}

/* Poll `sql` (one integer) until it returns `want`, for up to 10 s; there is
 * no event for "a backend is blocked" or "a waiter registered". */
static int wait_for(PGconn *c, const char *sql, long want)
{
	for (long long end = tu_now_ms() + 10000; tu_now_ms() < end; usleep(2000))
		if (query_long(c, sql) == want)
			return 1;
	fprintf(stderr, "never true: %s\n", sql);
	return 0;
}

/* Stores and locks for the notification counts in `mode` (a holder's h on
 * *hs, the waiter's w_lock on w_store), a LISTEN connection *lc and another
 * *oc; then 20 waiting acquires and releases nobody waits behind, which must
 * notify nothing. */
static void quiet_start(const char *mode, const char *nm, PGconn **lc, PGconn **oc, dlock_store **hs, dlock_lock **h)
{
	char uri[2200];
	snprintf(uri, sizeof uri, "%s?mode=%s", base_uri, mode);
	*lc = raw_conn();
	*oc = raw_conn();
	CHECK(exec_ok(*lc, "LISTEN dlock_wake"));
	CHECK_RC(dlock_store_open(hs, uri), 0);
	CHECK_RC(dlock_store_open(&w_store, uri), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	CHECK_RC(dlock_lock_new(h, *hs, nm, &o), 0);
	CHECK_RC(dlock_lock_new(&w_lock, w_store, nm, &o), 0);
	for (int i = 0; i < 20; i++) {
		CHECK_RC(dlock_acquire(*h, 1000), 0);
		CHECK_RC(dlock_release(*h), 0);
	}
	int quiet = count_notifies(*lc, *oc, nm);
	printf("  %s: 20 releases nobody waited for: %d notifications\n", mode, quiet);
	CHECK(quiet == 0);
}

static void quiet_release(void)
{
	char nm[128], sql[512];
	snprintf(nm, sizeof nm, "pgquiet-%d", (int)getpid());
	PGconn *lc, *oc;
	dlock_store *hs;
	dlock_lock *h;
	quiet_start("table", nm, &lc, &oc, &hs, &h);
	/* A waiter queued: the release notifies, and the waiter gets the lock. */
	CHECK_RC(dlock_acquire(h, 0), 0);
	pthread_t t;
	pthread_create(&t, NULL, try_wait, NULL);
	snprintf(sql, sizeof sql, "SELECT count(*) FROM dlock_holders WHERE name = '%s' AND waited", nm);
	CHECK(wait_for(oc, sql, 1));
	CHECK_RC(dlock_release(h), 0);
	pthread_join(t, NULL);
	CHECK_RC(w_rc, 0);
	CHECK_RC(w_release_rc, 0);
	int woke = count_notifies(lc, oc, nm);
	printf("  a release a waiter queued behind: %d notification(s)\n", woke);
	CHECK(woke == 1);

	/* A release in flight (the test's own DELETE, not committed) while the
	 * waiter marks the hold: the waiter blocks on the row, the release
	 * commits, and the waiter decides again in the same try — granted by its
	 * first request, with no notification sent. */
	CHECK_RC(dlock_acquire(h, 0), 0);
	CHECK(exec_ok(oc, "BEGIN"));
	snprintf(sql, sizeof sql, "DELETE FROM dlock_holders WHERE name = '%s'", nm);
	CHECK(exec_ok(oc, sql));
	uint64_t before = dlock_store_requests(w_store);
	pthread_create(&t, NULL, try_wait, NULL);
	PGconn *mc = raw_conn();
	CHECK(wait_for(mc,
		       "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
		       " AND query LIKE '%dlock_acquire_v1%'",
		       1));
	CHECK(exec_ok(oc, "COMMIT"));
	pthread_join(t, NULL);
	CHECK_RC(w_rc, 0);
	uint64_t tries = dlock_store_requests(w_store) - before - (w_release_rc == 0);
	int raced = count_notifies(lc, oc, nm);
	printf("  a release committed while the waiter marked it: granted in %llu request(s), "
	       "%d notification(s)\n",
	       (unsigned long long)tries, raced);
	CHECK(tries == 1);
	CHECK(raced == 0);
	CHECK_RC(w_release_rc, 0);
	dlock_lock_free(w_lock);
	dlock_lock_free(h);
	dlock_store_close(w_store);
	dlock_store_close(hs);
	PQfinish(mc);
	PQfinish(oc);
	PQfinish(lc);
}

static void quiet_release_advisory(void)
{
	char nm[128];
	snprintf(nm, sizeof nm, "pgquiet-adv-%d", (int)getpid());
	PGconn *lc, *oc;
	dlock_store *hs;
	dlock_lock *h;
	quiet_start("advisory", nm, &lc, &oc, &hs, &h);
	/* A waiter: refused, it holds the "waiting" key shared (the only shared
	 * advisory key of this serial test); the release notifies once and the
	 * waiter gets the lock long before its 1 s refresh. */
	CHECK_RC(dlock_acquire(h, 0), 0);
	pthread_t t;
	pthread_create(&t, NULL, try_wait, NULL);
	CHECK(wait_for(oc,
		       "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
		       " AND mode = 'ShareLock' AND objsubid = 1",
		       1));
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(h), 0);
	pthread_join(t, NULL);
	long long took = tu_now_ms() - t0;
	CHECK_RC(w_rc, 0);
	CHECK_RC(w_release_rc, 0);
	int woke = count_notifies(lc, oc, nm);
	printf("  advisory: a release a waiter registered for: %d notification(s), granted after %lld ms\n", woke,
	       took);
	CHECK(woke == 1);
	/* Nothing is left registered: the waiter let its key go with the grant. */
	CHECK(query_long(oc,
			 "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
			 " AND mode = 'ShareLock' AND objsubid = 1") == 0);
	dlock_lock_free(w_lock);
	dlock_lock_free(h);
	dlock_store_close(w_store);
	dlock_store_close(hs);
	PQfinish(oc);
	PQfinish(lc);
}

int main(void)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_wake");
	run("table");
	run("advisory");
	quiet_release();
	quiet_release_advisory();
	return tu_done("postgres_wake");
}
