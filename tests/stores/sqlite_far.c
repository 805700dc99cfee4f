/* Fair waiters far back in an SQLite queue (docs/stores/sqlite.md, "Waiting"):
 *  - a waiter with two or more ahead is registered for longer (10 × the
 *    queue TTL, read from the file) and makes no request while it waits
 *    there (counted: its first try and its cancel, where a waiter that
 *    refreshed every second would make four in 2.5 s);
 *  - one that died far back leaves the queue when it comes to the front
 *    (its presence, the lock on its own bell, is gone: issue 31), so the
 *    queue waits out neither its long registration nor a front waiter's
 *    3 s: the waiter behind it is granted at the release before, within
 *    one queue TTL (it had looked every second until the dead one's 3 s,
 *    cut at its turn, ran out; and without the cut the dead one's 30 s
 *    would outlast its 20 s wait).
 * Counts, the file's own registrations, and one bound: the grant behind the
 * dead within 3 s plus the scheduling delay measured in this run.
 * Usage: sqlite_far DIR */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char path[600], uri[700];

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A fair waiter in a thread with a store handle of its own: waits up to
 * wait_ms; when granted, holds until `go` is written, then releases. */
typedef struct waiter {
	dlock_store *s;
	dlock_lock *l;
	int64_t wait_ms;
	int go[2];
	int rc;
	long long granted;
	uint64_t requests; /* of its handle during the acquire */
	uint64_t total;    /* of its handle when the acquire returned */
	pthread_t t;
} waiter;

static void *waiter_main(void *arg)
{
	waiter *w = arg;
	uint64_t before = dlock_store_requests(w->s);
	w->rc = dlock_acquire(w->l, w->wait_ms);
	w->total = dlock_store_requests(w->s);
	w->requests = w->total - before;
	__atomic_store_n(&w->granted, mono_ms(), __ATOMIC_RELEASE);
	char c;
	if (w->rc == 0 && read(w->go[0], &c, 1) == 1)
		w->rc = dlock_release(w->l);
	return NULL;
}

static bool waiter_start(waiter *w, int64_t wait_ms)
{
	*w = (waiter){ .wait_ms = wait_ms, .rc = -1 };
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.fair = true;
	o.ttl_ms = 30000;
	CHECK_RC(dlock_store_open(&w->s, uri), 0);
	CHECK_RC(w->s ? dlock_lock_new(&w->l, w->s, "far", &o) : -1, 0);
	CHECK(pipe(w->go) == 0);
	return w->l && pthread_create(&w->t, NULL, waiter_main, w) == 0;
}

static void waiter_end(waiter *w)
{
	pthread_join(w->t, NULL);
	close(w->go[0]);
	close(w->go[1]);
	dlock_lock_free(w->l);
	dlock_store_close(w->s);
}

/* Wait (bounded) for w's grant. */
static bool granted_by(waiter *w, int ms)
{
	for (long long until = mono_ms() + ms; mono_ms() < until;) {
		if (__atomic_load_n(&w->granted, __ATOMIC_ACQUIRE))
			return true;
		usleep(1000);
	}
	return false;
}

int main(int argc, char **argv)
{
	int code = sp_main(argc, argv);
	if (code >= 0)
		return code;
	snprintf(path, sizeof(path), "%s/far.db", argv[1]);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	dlock_lock *h = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(s ? dlock_lock_new(&h, s, "far", &o) : -1, 0);
	if (!h)
		return tu_done("sqlite.far");
	CHECK_RC(dlock_acquire(h, 0), 0);
	waiter w[3]; /* w[2]: the one behind the dead waiter */
	for (int i = 0; i < 2; i++) {
		CHECK(waiter_start(&w[i], 20000));
		CHECK(tu_await_waiters(s, "far", (size_t)i + 1, 10000));
	}
	long long front_left = sp_queue_left(path, "far", 0);

	/* A third waits 2.5 s with two ahead: its first try and its cancel. */
	waiter far;
	CHECK(waiter_start(&far, 2500));
	CHECK(tu_await_waiters(s, "far", 3, 10000));
	long long far_left = sp_queue_left(path, "far", 2);
	waiter_end(&far);
	printf("registrations: the front's %lld ms left, the third's %lld ms\n", front_left, far_left);
	printf("a waiter two places back, 2.5 s: %s after %llu requests\n", dlock_strerror(far.rc),
	       (unsigned long long)far.requests);
	CHECK(front_left > 0 && front_left <= 3000);
	CHECK(far_left > 15000 && far_left <= 30000);
	CHECK_RC(far.rc, DLOCK_ETIMEOUT);
	CHECK(far.requests >= 2 && far.requests <= 3);
	CHECK(tu_await_waiters(s, "far", 2, 10000));

	/* A waiter that dies third in line, and one behind it. */
	sp_child dead;
	CHECK_RC(sp_start(&dead, "fairwait", uri, "far"), 0);
	CHECK(tu_await_waiters(s, "far", 3, 10000));
	CHECK(waiter_start(&w[2], 20000));
	CHECK(tu_await_waiters(s, "far", 4, 10000));
	long long dead_left = sp_queue_left(path, "far", 2);
	kill(dead.pid, SIGKILL);
	CHECK(sp_finish(&dead) == 128 + SIGKILL);
	CHECK(dead_left > 15000);

	CHECK_RC(dlock_release(h), 0);
	CHECK(granted_by(&w[0], 10000) && w[0].rc == 0);
	CHECK(write(w[0].go[1], "r", 1) == 1);
	CHECK(granted_by(&w[1], 10000) && w[1].rc == 0);
	uint64_t behind_before = dlock_store_requests(w[2].s);
	/* the dead one reached the front: it has left the queue */
	CHECK(tu_await_waiters(s, "far", 1, 10000));
	long long released = mono_ms();
	CHECK(write(w[1].go[1], "r", 1) == 1);
	CHECK(granted_by(&w[2], 20000));
	uint64_t looks = w[2].total - behind_before;
	long long grace = TU_SCHED_GRACE_MS;
	printf("the dead waiter (%lld ms left when killed) left at its turn; the one behind it made %llu "
	       "requests from then to its grant, %lld ms after the release before (bound 3000 + %lld)\n",
	       dead_left, (unsigned long long)looks, w[2].granted - released, grace);
	CHECK_RC(w[2].rc, 0); /* within its 20 s wait: not the dead one's 30 s */
	CHECK(w[2].granted - released <= 3000 + grace);
	CHECK(write(w[2].go[1], "r", 1) == 1);
	for (int i = 0; i < 3; i++) {
		waiter_end(&w[i]);
		CHECK_RC(w[i].rc, 0);
	}
	dlock_lock_free(h);
	dlock_store_close(s);
	sp_remove_db(path);
	return tu_done("sqlite.far");
}
