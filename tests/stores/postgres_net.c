/*
 * PostgreSQL behind the fault proxy (tests/testutil/faultproxy.h), in both modes:
 *
 *   postgres_net       (URI from $DLOCK_TEST_URI_FILE)
 *
 * The proxied client has timeout=300ms and connect_timeout=500ms; the other
 * clients talk to the server directly.
 * 1. blackhole: acquire(wait 1000) within 1050 ms, from the start and when
 *    the link goes dark mid-wait; open within 550 ms; release within 350 ms.
 * 2. blackhole: a held lock (ttl 2000) gets on_lost no later than its
 *    deadline + TU_SCHED_GRACE_MS, before a direct client is granted it.
 * 3. advisory: a release that cannot be confirmed closes the hold's
 *    connection, so the lock goes with the session as soon as the server
 *    hears of it (long before the 30 s lease).
 * 4. table: a try applied by the server whose reply is lost ("drop"), then
 *    retried: a direct client probing all along is never granted while the
 *    proxied one holds, and fences increase.
 *
 * A call that would hang is not left hanging: a watchdog puts the proxy back
 * to "pass" a few seconds later, so the test fails on its time bound.
 */
#include "testutil/netutil.h"
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define SLACK_MS (50 + TU_SCHED_GRACE_MS) /* the promise + scheduling grace */
#define TIMEOUT_MS 300
#define CONNECT_MS 500

static char base_uri[2048];
static const char *mode_name;

static tu_proxy *px;
static char px_uri[2400];            /* proxied, with timeout= and connect_timeout= */
static atomic_llong watchdog_at;     /* tu_now_ms() at which to set "pass"; 0 = off */

static void *watchdog(void *arg)
{
	(void)arg;
	for (;;) {
		long long at = atomic_load(&watchdog_at);
		if (at && tu_now_ms() >= at) {
			fprintf(stderr, "  watchdog: a call did not return in time; link back to pass\n");
			atomic_store(&watchdog_at, 0);
			tu_proxy_set(px, -1, "pass");
		}
		usleep(10000);
	}
	return NULL;
}

static void net(const char *mode, long long watchdog_ms)
{
	if (tu_proxy_set(px, -1, mode) != 0) {
		fprintf(stderr, "proxy: cannot set %s\n", mode);
		exit(1);
	}
	atomic_store(&watchdog_at, watchdog_ms ? tu_now_ms() + watchdog_ms : 0);
}

static dlock_store *open_direct(void)
{
	char uri[2300];
	snprintf(uri, sizeof uri, "%s?mode=%s", base_uri, mode_name);
	return nu_open(uri);
}

static dlock_store *open_proxied(void)
{
	return nu_open(px_uri);
}

static void name_of(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "pgnet-%d-%s-%s", (int)getpid(), mode_name, what);
}

/* ------------------------------------------------------------------ tests */

/* 1. Bounds with the link dark. */
static void test_bounds(void)
{
	char name[128];
	name_of(name, sizeof name, "bounds");

	/* From the start: a fresh store whose only connection goes dark. */
	dlock_store *a = open_proxied();
	dlock_lock *l = nu_lock(a, name, 5000, NU_LOST);
	net("blackhole", 4000);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 1000);
	long long took = tu_now_ms() - t0;
	printf("  [%s] dark link: acquire(wait 1000) %s after %lld ms\n", mode_name, dlock_error_name(rc), took);
	CHECK(took <= 1000 + SLACK_MS);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);

	/* Open while dark. */
	dlock_store *o = NULL;
	t0 = tu_now_ms();
	rc = dlock_store_open(&o, px_uri);
	took = tu_now_ms() - t0;
	printf("  [%s] dark link: open(connect_timeout=%d ms) %s after %lld ms\n", mode_name, CONNECT_MS,
	       dlock_error_name(rc), took);
	CHECK(took <= CONNECT_MS + SLACK_MS);
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	dlock_store_close(o);
	net("pass", 0);
	dlock_lock_free(l);
	dlock_store_close(a);

	/* Dark mid-wait: a direct client holds, the proxied one waits. */
	dlock_store *d = open_direct();
	dlock_lock *held = nu_lock(d, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(held, 0), 0);
	a = open_proxied();
	nu_bg w = { .lock = nu_lock(a, name, 5000, NU_LOST), .wait = 1000 };
	nu_bg_start(&w);
	long long until = tu_now_ms() + 3000;
	while (nu_waiters(d, name) < 1 && tu_now_ms() < until)
		usleep(2000);
	net("blackhole", 4000);
	nu_bg_join(&w);
	took = w.ended - w.started;
	printf("  [%s] link dark mid-wait: acquire(wait 1000) %s after %lld ms\n", mode_name, dlock_error_name(w.rc),
	       took);
	CHECK(took <= 1000 + SLACK_MS);
	CHECK(w.rc == DLOCK_EUNAVAILABLE || w.rc == DLOCK_ETIMEOUT);
	net("pass", 0);
	CHECK_RC(dlock_release(held), 0);
	dlock_lock_free(w.lock);
	dlock_store_close(a);

	/* Release while dark (a fresh store: nothing else of it is pending). */
	a = open_proxied();
	l = nu_lock(a, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(l, 2000), 0);
	net("blackhole", 4000);
	t0 = tu_now_ms();
	rc = dlock_release(l);
	took = tu_now_ms() - t0;
	printf("  [%s] dark link: release %s after %lld ms (timeout=%d ms)\n", mode_name, dlock_error_name(rc), took,
	       TIMEOUT_MS);
	CHECK(took <= TIMEOUT_MS + SLACK_MS);
	CHECK(rc != 0);
	net("pass", 0);
	/* Advisory: the closed session takes the lock with it once the server hears
	 * the close; table: the core's retry of the release, or the lease. */
	dlock_lock *other = nu_lock(d, name, 5000, NU_LOST);
	t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(other, 35000), 0);
	took = tu_now_ms() - t0;
	printf("  [%s] after the unconfirmed release, a direct client got the lock %lld ms after the link "
	       "came back\n",
	       mode_name, took);
	if (strcmp(mode_name, "advisory") == 0)
		CHECK(took < 1000); /* 3. the session was closed: not the 30 s lease */
	CHECK_RC(dlock_release(other), 0);
	dlock_lock_free(other);
	dlock_lock_free(l);
	dlock_store_close(a);
	dlock_lock_free(held);
	dlock_store_close(d);
}

/* 2. A held lock cut off: on_lost by its deadline, before a direct client gets it. */
static void test_lost(void)
{
	char name[128];
	name_of(name, sizeof name, "lost");
	dlock_store *d = open_direct();
	dlock_store *a = open_proxied();
	const int64_t ttl = 2000;
	dlock_lock *l = nu_lock(a, name, ttl, NU_LOST);
	atomic_store(&nu_lost_at, 0);
	CHECK_RC(dlock_acquire(l, 2000), 0);
	net("blackhole", 0);
	long long deadline = tu_now_ms() + dlock_ttl_left(l);
	dlock_lock *b = nu_lock(d, name, 5000, NU_LOST);
	long long granted = 0;
	while (tu_now_ms() < deadline + 35000) {
		if (dlock_acquire(b, 0) == 0) {
			granted = tu_now_ms();
			break;
		}
		usleep(2000);
	}
	net("pass", 0);
	long long lost = atomic_load(&nu_lost_at);
	printf("  [%s] link dark, ttl %lld: on_lost %+lld ms from the deadline; direct client granted "
	       "%+lld ms from it\n",
	       mode_name, (long long)ttl, lost ? lost - deadline : 99999, granted ? granted - deadline : 99999);
	CHECK(lost != 0);
	CHECK(lost <= deadline + TU_SCHED_GRACE_MS);
	CHECK(granted != 0);
	CHECK(lost != 0 && lost <= granted);
	CHECK(!dlock_held(l));
	if (granted)
		CHECK_RC(dlock_release(b), 0);
	dlock_release(l);
	dlock_lock_free(b);
	dlock_lock_free(l);
	dlock_store_close(a);
	dlock_store_close(d);
}

/* 4. A lost reply, then a retry: never two holders, fences increase. */
static atomic_int a_holds, probe_stop, overlaps;
static atomic_ullong probe_max_fence;
static atomic_long probe_grants;

static void *probe_main(void *arg)
{
	dlock_lock *p = arg;
	while (!atomic_load(&probe_stop)) {
		if (dlock_acquire(p, 0) == 0) {
			if (atomic_load(&a_holds))
				atomic_fetch_add(&overlaps, 1);
			uint64_t f = dlock_fence(p);
			if (f > atomic_load(&probe_max_fence))
				atomic_store(&probe_max_fence, f);
			atomic_fetch_add(&probe_grants, 1);
			dlock_release(p);
		}
		usleep(3000);
	}
	return NULL;
}

/* The proxied client: acquire (through the lost reply), hold for 1.5 leases
 * (renewals carry it), release. A handle belongs to its thread. */
typedef struct holder {
	dlock_lock *l;
	int rc, held_through, release_rc;
	uint64_t fence;
	pthread_t t;
} holder;

static void *holder_main(void *arg)
{
	holder *h = arg;
	h->rc = dlock_acquire(h->l, 20000);
	if (h->rc != 0)
		return NULL;
	atomic_store(&a_holds, 1);
	h->fence = dlock_fence(h->l);
	long long t0 = tu_now_ms();
	while (tu_now_ms() - t0 < 4500 && dlock_held(h->l))
		usleep(5000);
	h->held_through = dlock_held(h->l);
	atomic_store(&a_holds, 0);
	h->release_rc = dlock_release(h->l);
	return NULL;
}

static void test_lost_reply(void)
{
	char name[128];
	name_of(name, sizeof name, "reply");
	dlock_store *d = open_direct();
	dlock_store *pd = open_direct();
	dlock_store *a = open_proxied();
	dlock_lock *c = nu_lock(d, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(c, 0), 0);
	uint64_t fc = dlock_fence(c);
	holder h = { nu_lock(a, name, 3000, NU_LOST), 0, 0, 0, 0, 0 };
	atomic_store(&a_holds, 0);
	pthread_create(&h.t, NULL, holder_main, &h);
	long long until = tu_now_ms() + 3000;
	while (nu_waiters(d, name) < 1 && tu_now_ms() < until)
		usleep(2000);
	net("drop", 0);
	atomic_store(&probe_stop, 0);
	atomic_store(&overlaps, 0);
	atomic_store(&probe_grants, 0);
	atomic_store(&probe_max_fence, 0);
	dlock_lock *p = nu_lock(pd, name, 5000, NU_LOST);
	CHECK_RC(dlock_release(c), 0);
	/* The server grants the proxied client; it never hears the answer. */
	int seen = 0;
	until = tu_now_ms() + 10000;
	while (!(seen = nu_held_by(d, name, dlock_store_client_id(a))) && tu_now_ms() < until)
		usleep(2000);
	CHECK(seen);
	/* From here on another client probes all the time: the unanswered grant,
	 * the retry that finds it, and the hold must keep it out. */
	pthread_t pt;
	pthread_create(&pt, NULL, probe_main, p);
	usleep(300 * 1000); /* the proxied client retries, unanswered, meanwhile */
	long long dropped = 0;
	tu_proxy_stats(px, 0, NULL, NULL, NULL, NULL, &dropped);
	net("pass", 0);
	pthread_join(h.t, NULL);
	/* The probe gets it after the release. */
	long grants_before = atomic_load(&probe_grants);
	until = tu_now_ms() + 5000;
	while (atomic_load(&probe_grants) == grants_before && tu_now_ms() < until)
		usleep(2000);
	atomic_store(&probe_stop, 1);
	pthread_join(pt, NULL);
	uint64_t fp = atomic_load(&probe_max_fence);
	printf("  [%s] reply lost (%lld bytes dropped), retried: acquire %s, held through 1.5 leases: %s; "
	       "fences %llu (before), %llu (proxied), %llu (last probe); %d overlap(s)\n",
	       mode_name, dropped, dlock_error_name(h.rc), h.held_through ? "yes" : "no", (unsigned long long)fc,
	       (unsigned long long)h.fence, (unsigned long long)fp, atomic_load(&overlaps));
	CHECK_RC(h.rc, 0);
	CHECK(h.held_through);
	CHECK_RC(h.release_rc, 0);
	CHECK(atomic_load(&overlaps) == 0);
	CHECK(h.fence > fc);
	CHECK(fp > h.fence);
	dlock_lock_free(p);
	dlock_lock_free(h.l);
	dlock_lock_free(c);
	dlock_store_close(a);
	dlock_store_close(pd);
	dlock_store_close(d);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_net");
	char *proxied = NULL;
	px = tu_proxy_start(base_uri, &proxied);
	if (!px)
		return 1;
	pthread_t wd;
	pthread_create(&wd, NULL, watchdog, NULL);
	pthread_detach(wd);
	const char *only = argc > 1 ? argv[1] : NULL;
	static const char *const modes[] = { "table", "advisory" };
	for (int m = 0; m < 2; m++) {
		mode_name = modes[m];
		if (only && strcmp(only, mode_name) != 0)
			continue;
		snprintf(px_uri, sizeof px_uri, "%s?mode=%s&timeout=%dms&connect_timeout=%dms", proxied, mode_name,
			 TIMEOUT_MS, CONNECT_MS);
		test_bounds();
		test_lost();
		if (m == 0)
			test_lost_reply();
	}
	free(proxied);
	tu_proxy_stop(px);
	return tu_done("postgres_net");
}
