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
 */
#include "testutil/testutil.h"

#include <pthread.h>
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
	printf("  %s: %d waiters handed the lock on in %lld ms (each held %d ms)\n", mode, THREADS,
	       chain, HOLD_MS);
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

int main(void)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_wake");
	run("table");
	run("advisory");
	return tu_done("postgres_wake");
}
