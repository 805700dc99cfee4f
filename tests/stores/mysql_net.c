/*
 * Network faults between one client and its store, through the fault proxy
 * (tests/testutil/faultproxy.h), on a real server. Run for MySQL (both modes) and for
 * Memcached; nothing here is specific to one store:
 *
 *   mysql_net URI [session]
 *
 * URI is the server's own (a "direct" client uses it); the client under test
 * goes through the proxy with timeout=500ms. "session" marks a store whose
 * holds live on a connection (GET_LOCK).
 *
 * 1. wait:    acquire(wait 1000) returns within 1050 ms when the link is
 *             black-holed before the call, and when it is black-holed while
 *             the call waits for a holder.
 * 2. release: returns within timeout + 50 ms on a black-holed link; for a
 *             session store the connection is closed, so the server frees
 *             the lock once it sees the close.
 * 3. lost:    a held lock (ttl 2 s, renewed) on a link black-holed after the
 *             grant: on_lost comes no later than the lease deadline + TU_SCHED_GRACE_MS,
 *             and before a direct client is granted.
 * 4. unknown: the grant of a waiting try is applied but its reply is
 *             dropped (dropmatch on the granting request; a blanket drop for
 *             GET_LOCK, whose waiter is blocked in the server); the retry is
 *             granted: one holder, and its fence is greater than the
 *             previous holder's.
 */
#include "testutil/netutil.h"
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define TIMEOUT_MS 500
#define TTL_MS 2000

static char direct[1024], proxied[1200];
static int session;
static tu_proxy *proxy;
static void name_of(char *out, size_t n, const char *what)
{
	snprintf(out, n, "net-%d-%s%s", (int)getpid(), what, session ? "-s" : "");
}

struct later {
	int delay_ms;
	const char *mode;
};

static void *set_later(void *arg)
{
	struct later *x = arg;
	usleep((useconds_t)x->delay_ms * 1000);
	CHECK(tu_proxy_set(proxy, -1, x->mode) == 0);
	return NULL;
}

static void test_wait(void)
{
	char name[128];
	name_of(name, sizeof name, "wait");
	dlock_store *d = nu_open(direct), *a = nu_open(proxied);
	dlock_lock *ld = nu_lock(d, name, 30000, NU_LOST), *la = nu_lock(a, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(ld, 0), 0);

	/* Black-holed before the call. */
	CHECK(tu_proxy_set(proxy, -1, "blackhole") == 0);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(la, 1000);
	long long took = tu_now_ms() - t0;
	printf("  wait 1000 ms, link already black-holed: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 1050);
	CHECK(tu_proxy_set(proxy, -1, "pass") == 0);

	/* Black-holed while the call waits for the holder. */
	struct later x = { 300, "blackhole" };
	pthread_t th;
	pthread_create(&th, NULL, set_later, &x);
	t0 = tu_now_ms();
	rc = dlock_acquire(la, 1000);
	took = tu_now_ms() - t0;
	pthread_join(th, NULL);
	printf("  wait 1000 ms, link black-holed after 300 ms: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 1050);
	CHECK(tu_proxy_set(proxy, -1, "pass") == 0);

	/* And the store works again once the link does. */
	CHECK_RC(dlock_release(ld), 0);
	CHECK_RC(dlock_acquire(la, 2000), 0);
	CHECK_RC(dlock_release(la), 0);
	dlock_lock_free(la);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(d);
}

static void test_release(void)
{
	char name[128];
	name_of(name, sizeof name, "release");
	dlock_store *d = nu_open(direct), *a = nu_open(proxied);
	dlock_lock *ld = nu_lock(d, name, 30000, NU_LOST), *la = nu_lock(a, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(la, 0), 0);
	CHECK(tu_proxy_set(proxy, -1, "blackhole") == 0);
	long long t0 = tu_now_ms();
	int rc = dlock_release(la);
	long long took = tu_now_ms() - t0;
	printf("  release on a black-holed link: %s after %lld ms (timeout %d ms)\n", dlock_error_name(rc), took,
	       TIMEOUT_MS);
	CHECK(rc != 0);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	CHECK(took <= TIMEOUT_MS + 50 + TU_SCHED_GRACE_MS);
	CHECK(tu_proxy_set(proxy, -1, "pass") == 0);
	if (session) {
		/* The unconfirmed release closed the hold's connection: once the server
		 * sees the close, the lock is free (long before its 30 s lease). */
		t0 = tu_now_ms();
		rc = dlock_acquire(ld, 3000);
		printf("  session store: direct client granted %lld ms after the link came back\n", tu_now_ms() - t0);
		CHECK_RC(rc, 0);
		CHECK_RC(dlock_release(ld), 0);
	}
	dlock_lock_free(la);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(d);
}

static void test_lost(void)
{
	char name[128];
	name_of(name, sizeof name, "lost");
	dlock_store *d = nu_open(direct), *a = nu_open(proxied);
	dlock_lock *ld = nu_lock(d, name, 30000, NU_LOST), *la = nu_lock(a, name, TTL_MS, NU_LOST);
	nu_lost_at = 0;
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(la, 0), 0);
	long long deadline = tu_now_ms() +
			     dlock_ttl_left(la); /* the client's own deadline (ttl_left counts from now) */
	CHECK(tu_proxy_set(proxy, -1, "blackhole") == 0);
	long long granted = 0;
	while (tu_now_ms() - t0 < TTL_MS + 6000) {
		int rc = dlock_acquire(ld, 0);
		if (rc == 0) {
			granted = tu_now_ms();
			break;
		}
		usleep(20000);
	}
	if (!granted) { /* say who holds it */
		const char *names[1] = { name };
		dlock_lock_status *st = NULL;
		size_t n = 0;
		if (dlock_store_status(d, names, 1, &st, &n) == 0 && n == 1)
			for (size_t i = 0; i < st[0].nholders; i++)
				printf("  still held by %s (pid %d, fence %llu, ttl left %lld ms; ours: %s)\n",
				       st[0].holders[i].owner, st[0].holders[i].pid,
				       (unsigned long long)st[0].holders[i].fence,
				       (long long)st[0].holders[i].ttl_left_ms, dlock_store_client_id(a));
		dlock_status_free(st, n);
	}
	CHECK(tu_proxy_set(proxy, -1, "pass") == 0);
	printf("  lease deadline +%lld ms; on_lost at +%lld ms; direct client granted at +%lld ms\n", deadline - t0,
	       nu_lost_at ? nu_lost_at - t0 : -1, granted ? granted - t0 : -1);
	CHECK(nu_lost_at != 0);
	CHECK(nu_lost_at <= deadline + TU_SCHED_GRACE_MS);
	CHECK(granted != 0 && nu_lost_at < granted);
	CHECK(!dlock_held(la));
	if (granted)
		CHECK_RC(dlock_release(ld), 0);
	dlock_lock_free(la);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(d);
}

struct waiter {
	dlock_lock *l;
	int rc, release_rc;
	atomic_llong done;
	atomic_int go; /* release now (a handle is released by the thread that holds it) */
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	w->rc = dlock_acquire(w->l, 8000);
	w->done = tu_now_ms();
	while (!w->go)
		usleep(1000);
	w->release_rc = w->rc == 0 ? dlock_release(w->l) : 0;
	return NULL;
}

/* How far the fault has gone: dropmatch firings, or for a blanket drop the
 * reply bytes it discarded. */
static long long dropped_so_far(const char *needle)
{
	long long v = -1;
	if (*needle)
		tu_proxy_fired(proxy, 0, &v);
	else
		tu_proxy_stats(proxy, 0, NULL, NULL, NULL, NULL, &v);
	return v;
}

static void arm(const char *needle)
{
	if (*needle)
		CHECK(tu_proxy_dropmatch(proxy, -1, needle, strlen(needle)) == 0);
	else
		CHECK(tu_proxy_set(proxy, -1, "drop") == 0);
}

/*
 * needle: the request whose reply is dropped (the proxy swallows every reply
 * of its connection from it on); "": every reply (drop). arm_after: arm the
 * proxy only once the holder has released, for a store whose refused tries
 * send the same request (MySQL table mode), with the link reset over the
 * release (a try already in the server may be waiting for the release's row
 * locks: its grant must not be answered before the arming); else before (a
 * waiter blocked in the server's GET_LOCK is granted at once).
 */
static int unknown_once(const char *needle_fmt, int arm_after, int round)
{
	char name[128], what[32];
	snprintf(what, sizeof what, "unknown%d", round);
	name_of(name, sizeof name, what);
	dlock_store *d = nu_open(direct), *a = nu_open(proxied), *c = nu_open(direct);
	char needle[128];
	snprintf(needle, sizeof needle, needle_fmt, dlock_store_client_id(a));
	dlock_lock *ld = nu_lock(d, name, 30000, NU_LOST), *la = nu_lock(a, name, 30000, NU_LOST);
	dlock_lock *lc = nu_lock(c, name, 30000, NU_LOST);
	CHECK_RC(dlock_acquire(ld, 0), 0);
	uint64_t f_before = dlock_fence(ld);
	struct waiter w = { la, -1, -1, 0, 0 };
	pthread_t th;
	pthread_create(&th, NULL, wait_thread, &w);
	usleep(300000); /* the waiter has tried, found it held and queued */
	long long dropped0 = dropped_so_far(needle);
	if (!arm_after)
		arm(needle);
	else
		CHECK(tu_proxy_set(proxy, -1, "reset") == 0);
	CHECK_RC(dlock_release(ld), 0);
	if (arm_after)
		arm(needle);
	long long t0 = tu_now_ms();
	/* The waiter's next try reaches the server and is applied; its reply is swallowed. */
	while (dropped_so_far(needle) == dropped0 && !(w.done && w.rc == 0) && tu_now_ms() - t0 < 5000)
		usleep(2000);
	if (dropped_so_far(needle) == dropped0 && w.done && w.rc == 0) {
		/* The waiter's try came between the release and the arming: granted
		 * normally, no fault injected. Not a failure of the store: again. */
		printf("  (round %d: the waiter was granted before the fault was armed; again)\n", round);
		CHECK(tu_proxy_set(proxy, -1, "pass") == 0);
		w.go = 1;
		pthread_join(th, NULL);
		CHECK_RC(w.release_rc, 0);
		dlock_lock_free(la);
		dlock_lock_free(lc);
		dlock_lock_free(ld);
		dlock_store_close(a);
		dlock_store_close(c);
		dlock_store_close(d);
		return 0;
	}
	CHECK(dropped_so_far(needle) > dropped0);
	usleep(50000);
	/* Nobody else gets it meanwhile: the applied try holds it on the server. */
	int rc_c = dlock_acquire(lc, 0);
	CHECK(tu_proxy_set(proxy, -1, "pass") == 0);
	while (!w.done && tu_now_ms() - t0 < 10000)
		usleep(1000);
	printf("  reply of a granting try dropped: direct client %s; the waiter %s %lld ms later; fences %llu -> %llu\n",
	       dlock_error_name(rc_c), dlock_error_name(w.rc), (long long)w.done - t0, (unsigned long long)f_before,
	       (unsigned long long)dlock_fence(la));
	CHECK_RC(rc_c, DLOCK_ELOCKED);
	CHECK_RC(w.rc, 0);
	CHECK(dlock_fence(la) > f_before);
	/* One holder: the direct client is refused, and the status shows one. */
	CHECK_RC(dlock_acquire(lc, 0), DLOCK_ELOCKED);
	const char *names[1] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(c, names, 1, &st, &n), 0);
	CHECK(n == 1 && st[0].nholders == 1);
	dlock_status_free(st, n);
	uint64_t f_a = dlock_fence(la);
	w.go = 1;
	pthread_join(th, NULL);
	CHECK_RC(w.release_rc, 0);
	CHECK_RC(dlock_acquire(lc, 0), 0);
	CHECK(dlock_fence(lc) > f_a);
	CHECK_RC(dlock_release(lc), 0);
	dlock_lock_free(la);
	dlock_lock_free(lc);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(c);
	dlock_store_close(d);
	return 1;
}

static void test_unknown(const char *needle, int arm_after)
{
	int done = 0;
	for (int round = 0; round < 5 && !done; round++)
		done = unknown_once(needle, arm_after, round);
	CHECK(done);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: mysql_net URI [session]\n");
		return 64;
	}
	snprintf(direct, sizeof direct, "%s", argv[1]);
	session = argc > 2 && strcmp(argv[2], "session") == 0;
	/* The request whose reply is dropped (%s: the proxied client's id):
	 * memcached's grant ends with the write of the holder list with our line
	 * "H <owner> ..." (a waiter's own writes only add a "Q" line); a MySQL
	 * table-mode try is one transaction in one batch, the same text granted
	 * or refused; a GET_LOCK waiter is blocked in the server until the release. */
	const char *needle = strncmp(direct, "memcached:", 10) == 0 ? "\nH %s-" : session ? "" : "START TRANSACTION";
	int arm_after = !session && *needle == 'S';
	char *via = NULL;
	if (!(proxy = tu_proxy_start(direct, &via)) || strlen(via) + 40 > sizeof proxied) {
		fprintf(stderr, "mysql_net: cannot proxy %s\n", direct);
		free(via);
		tu_proxy_stop(proxy);
		return 2;
	}
	snprintf(proxied, sizeof proxied, "%s", via);
	free(via);
	snprintf(proxied + strlen(proxied), 40, "%stimeout=%dms", strchr(proxied, '?') ? "&" : "?", TIMEOUT_MS);
	test_wait();
	test_release();
	test_lost();
	test_unknown(needle, arm_after);
	tu_proxy_stop(proxy);
	return tu_done("mysql_net");
}
