/*
 * The redis store when the network lies (issue 15), through the fault proxy
 * (src/tools/faultproxy.c) between one client and the real server; other
 * clients talk to the server directly.
 *
 *  - lost_reply: a waiter's try is applied but its reply lost (proxy "drop");
 *    the retry is answered from the "owner already holds" branch, which must
 *    set the server's expiry to the full TTL from the retry (PTTL checked
 *    right after the grant), and no other client is granted before the
 *    first's deadline; fences increase.
 *  - bounds: with the proxy a black hole and a long timeout= (5 s), an
 *    acquire that waits 1000 ms returns within 1000 + 50 ms, an open with
 *    connect_timeout=500ms within 550 ms; with timeout=300ms a try-once and a
 *    release within 350 ms, and a pipelined release's pending reply does not
 *    make the next call wait past its own bound.
 *  - lost_signal: a held lock (ttl 1500) cut off gets on_lost no later than
 *    its deadline + TU_SCHED_GRACE_MS, before a direct client is granted.
 *  - sockets: every connection has keepalive and TCP_USER_TIMEOUT.
 * Usage: redis_faults (DLOCK_TEST_URI_FILE names the server)
 */
#include "stores/redis_common_test.h"
#include "testutil/netutil.h"
#include "testutil/faultproxy.h"
#include "stores/redis/redis.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static char uri[4096];

static void with(char *out, size_t n, const char *base, const char *opts)
{
	snprintf(out, n, "%s%s%s", base, strchr(base, '?') ? "&" : "?", opts);
}

static long long pttl(redisContext *raw, const char *name)
{
	redisReply *r = redisCommand(raw, "PTTL {dlock:%s}", name);
	long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
	if (r)
		freeReplyObject(r);
	return v;
}

static int holders(redisContext *raw, const char *name)
{
	redisReply *r = redisCommand(raw, "HLEN {dlock:%s}", name);
	int v = r && r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -1;
	if (r)
		freeReplyObject(r);
	return v;
}

typedef struct bg {
	dlock_lock *l;
	long wait;
	int rc;
	long long t_end, ttl_left;
	uint64_t fence;
	pthread_t t;
} bg;

static void *bg_acquire(void *arg)
{
	bg *b = arg;
	b->rc = dlock_acquire(b->l, b->wait);
	b->t_end = tu_now_ms();
	b->ttl_left = b->rc == 0 ? dlock_ttl_left(b->l) : 0;
	b->fence = dlock_fence(b->l);
	return NULL;
}

static void case_lost_reply(void)
{
	const char *name = "faults-lost-reply";
	const long ttl = 3000;
	char *proxied = NULL, u[4200];
	tu_proxy *px = tu_proxy_start(uri, &proxied);
	if (!px) {
		CHECK(!"fault proxy did not start");
		return;
	}
	with(u, sizeof(u), proxied, "timeout=300ms");
	redisContext *raw = rt_raw(uri);
	dlock_store *direct = nu_open(uri), *faulty = nu_open(u);
	dlock_lock *c = nu_lock(direct, name, 10000, 0);
	dlock_lock *a = nu_lock(faulty, name, ttl, NU_NO_RENEW);
	CHECK_RC(dlock_acquire(c, 0), 0);
	uint64_t fc = dlock_fence(c);
	bg b = { a, 20000, -100, 0, 0, 0, 0 };
	pthread_create(&b.t, NULL, bg_acquire, &b);
	/* the waiter is registered (its first try answered): then replies get lost */
	long long until = tu_now_ms() + 5000;
	struct timespec ms5 = { 0, 5000000 };
	for (;;) {
		redisReply *r = redisCommand(raw, "ZCARD {dlock:%s}:w", name);
		long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
		if (r)
			freeReplyObject(r);
		if (n > 0 || tu_now_ms() > until)
			break;
		nanosleep(&ms5, NULL);
	}
	CHECK(tu_proxy_set(px, 0, "drop") == 0);
	CHECK_RC(dlock_release(c), 0);
	/* the waiter's try lands (its hold appears) but the answer is dropped */
	until = tu_now_ms() + 8000;
	while (holders(raw, name) < 1 && tu_now_ms() < until)
		nanosleep(&ms5, NULL);
	long long applied = tu_now_ms();
	CHECK(holders(raw, name) == 1);
	/* let that try time out (timeout=300ms) before the network comes back */
	struct timespec ms400 = { 0, 400000000 };
	nanosleep(&ms400, NULL);
	CHECK(tu_proxy_set(px, 0, "pass") == 0);
	pthread_join(b.t, NULL);
	CHECK_RC(b.rc, 0);
	long long left = pttl(raw, name);
	long long deadline = b.t_end + b.ttl_left;
	printf("lost reply: granted %lld ms after the lost try landed; server PTTL %lld ms, client lease %lld ms "
	       "(ttl %ld)\n",
	       b.t_end - applied, left, b.ttl_left, ttl);
	/* the retry refreshed the server's expiry: a full ttl from the retry, never
	 * the first try's (which would be ttl minus the >= 400 ms since) */
	CHECK(left >= ttl - (tu_now_ms() - b.t_end) - 100);
	CHECK(left >= b.ttl_left);
	/* nobody else before the first's deadline */
	dlock_lock *d = nu_lock(direct, name, 10000, 0);
	int rc;
	while ((rc = dlock_acquire(d, 0)) == DLOCK_ELOCKED)
		nanosleep(&ms5, NULL);
	long long got = tu_now_ms();
	CHECK_RC(rc, 0);
	printf("lost reply: the next client granted %lld ms after the first's deadline; fences %llu %llu %llu\n",
	       got - deadline, (unsigned long long)fc, (unsigned long long)b.fence, (unsigned long long)dlock_fence(d));
	CHECK(got >= deadline);
	CHECK(b.fence > fc && dlock_fence(d) > b.fence);
	dlock_release(d);
	dlock_lock_free(d);
	dlock_lock_free(a);
	dlock_lock_free(c);
	dlock_store_close(faulty);
	dlock_store_close(direct);
	redisFree(raw);
	tu_proxy_stop(px);
	free(proxied);
}

static void case_bounds(void)
{
	const char *name = "faults-bounds";
	char *proxied = NULL, slow[4200], quick[4200], piped[4200];
	tu_proxy *px = tu_proxy_start(uri, &proxied);
	if (!px) {
		CHECK(!"fault proxy did not start");
		return;
	}
	/* a long per-request timeout: only the call's own bound may cut it short */
	with(slow, sizeof(slow), proxied, "timeout=5s&connect_timeout=500ms");
	with(quick, sizeof(quick), proxied, "timeout=300ms&connect_timeout=500ms");
	with(piped, sizeof(piped), proxied, "timeout=300ms&connect_timeout=500ms&release=pipelined");
	dlock_store *direct = nu_open(uri), *faulty = nu_open(slow);
	dlock_lock *b = nu_lock(direct, name, 30000, 0);
	dlock_lock *a = nu_lock(faulty, name, 30000, 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	CHECK_RC(dlock_acquire(a, 0), DLOCK_ELOCKED); /* connected, scripts loaded */
	/* a store of its own for the try-once: the undo of the wait's try is
	 * retried in the background, and the core runs one call of a store at a time */
	dlock_store *f2 = nu_open(quick);
	dlock_lock *a2 = nu_lock(f2, name, 30000, 0);
	CHECK_RC(dlock_acquire(a2, 0), DLOCK_ELOCKED);
	CHECK(tu_proxy_set(px, 0, "blackhole") == 0);

	long long t0 = tu_now_ms();
	int rc = dlock_acquire(a, 1000);
	long long took = tu_now_ms() - t0;
	printf("bounds: acquire wait 1000 ms, timeout=5s, dark: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	CHECK(took <= 1000 + 50 + TU_SCHED_GRACE_MS);

	t0 = tu_now_ms();
	rc = dlock_acquire(a2, 0);
	took = tu_now_ms() - t0;
	printf("bounds: try-once, timeout=300ms, dark: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	CHECK(took <= 300 + 50 + TU_SCHED_GRACE_MS); /* the core gives a try-once one request timeout */
	dlock_lock_free(a2);

	dlock_store *o = NULL;
	t0 = tu_now_ms();
	rc = dlock_store_open(&o, slow);
	took = tu_now_ms() - t0;
	printf("bounds: open with connect_timeout=500ms, timeout=5s, dark: %s after %lld ms\n", dlock_error_name(rc),
	       took);
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(took <= 550);
	dlock_store_close(o);
	CHECK(tu_proxy_set(px, 0, "pass") == 0);
	CHECK_RC(dlock_release(b), 0);
	dlock_store_close(f2);

	/* release with timeout=300ms (no renewal in the way) */
	for (int pipe = 0; pipe < 2; pipe++) {
		dlock_store *q = nu_open(pipe ? piped : quick);
		dlock_lock *h = nu_lock(q, name, 30000, NU_NO_RENEW);
		dlock_lock *h2 = nu_lock(q, "faults-bounds-2", 30000, NU_NO_RENEW);
		dlock_lock *h3 = nu_lock(q, "faults-bounds-3", 30000, NU_NO_RENEW);
		CHECK_RC(dlock_acquire(h, 0), 0);
		CHECK_RC(dlock_acquire(h2, 0), 0);
		if (pipe)
			CHECK_RC(dlock_release(h2), 0); /* sent; its reply still to read */
		CHECK(tu_proxy_set(px, 0, "blackhole") == 0);
		t0 = tu_now_ms();
		rc = dlock_release(h);
		took = tu_now_ms() - t0;
		printf("bounds: %s release, timeout=300ms, dark: %s after %lld ms\n", pipe ? "pipelined" : "confirmed",
		       dlock_error_name(rc), took);
		CHECK(took <= 300 + 50 + TU_SCHED_GRACE_MS);
		t0 = tu_now_ms();
		rc = dlock_acquire(h3, 0);
		took = tu_now_ms() - t0;
		printf("bounds: then a try-once on that store: %s after %lld ms\n", dlock_error_name(rc), took);
		CHECK(rc != 0);
		/* pipelined: the pending reply is read within this call's bound. (After
		 * the confirmed release failed, the core retries it in the background
		 * and this call may first wait for that retry's own bound.) */
		if (pipe)
			CHECK(took <= 300 + 50 + TU_SCHED_GRACE_MS);
		CHECK(tu_proxy_set(px, 0, "pass") == 0);
		dlock_release(h);
		dlock_lock_free(h);
		dlock_lock_free(h2);
		dlock_lock_free(h3);
		dlock_store_close(q);
	}
	/* the name is free again for others within a TTL (the undo / release retries) */
	redisContext *raw = rt_raw(uri);
	redisReply *r = redisCommand(raw, "DEL {dlock:%s} {dlock:faults-bounds-2} {dlock:faults-bounds-3}", name);
	if (r)
		freeReplyObject(r);
	redisFree(raw);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(faulty);
	dlock_store_close(direct);
	tu_proxy_stop(px);
	free(proxied);
}

static void case_lost_signal(void)
{
	const char *name = "faults-lost-signal";
	char *proxied = NULL, u[4200];
	tu_proxy *px = tu_proxy_start(uri, &proxied);
	if (!px) {
		CHECK(!"fault proxy did not start");
		return;
	}
	with(u, sizeof(u), proxied, "timeout=5s");
	dlock_store *direct = nu_open(uri), *faulty = nu_open(u);
	dlock_lock *a = nu_lock(faulty, name, 1500, NU_LOST);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK(tu_proxy_set(px, 0, "blackhole") == 0);
	long long deadline = tu_now_ms() + dlock_ttl_left(a);
	dlock_lock *b = nu_lock(direct, name, 10000, 0);
	bg g = { b, 10000, -100, 0, 0, 0, 0 };
	pthread_create(&g.t, NULL, bg_acquire, &g);
	pthread_join(g.t, NULL);
	long long lost = atomic_load(&nu_lost_at);
	printf("lost signal: on_lost %lld ms after the deadline; the direct client granted %lld ms after on_lost\n",
	       lost ? lost - deadline : -1, lost ? g.t_end - lost : -1);
	CHECK_RC(g.rc, 0);
	CHECK(lost != 0 && lost <= deadline + TU_SCHED_GRACE_MS);
	CHECK(lost != 0 && lost <= g.t_end);
	CHECK(!dlock_held(a));
	CHECK(tu_proxy_set(px, 0, "pass") == 0);
	dlock_release(b);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(faulty);
	dlock_store_close(direct);
	tu_proxy_stop(px);
	free(proxied);
}

static void case_sockets(void)
{
	dlock__rserver srv;
	memset(&srv, 0, sizeof(srv));
	if (sscanf(uri, "redis://%255[^:]:%d", srv.host, &srv.port) != 2)
		exit(1);
	srv.connect_timeout_ms = 1000;
	srv.timeout_ms = 2000;
	redisContext *c = NULL;
	CHECK_RC(dlock__rconnect_by(&c, &srv, "redis", dlock_clock_ms() + 1000), 0);
	if (!c)
		return;
	int ka = 0;
	unsigned int ut = 0;
	socklen_t len = sizeof(ka);
	getsockopt(c->fd, SOL_SOCKET, SO_KEEPALIVE, &ka, &len);
	len = sizeof(ut);
	getsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, &len);
	printf("sockets: keepalive %d, TCP_USER_TIMEOUT %u ms\n", ka, ut);
	CHECK(ka == 1);
	CHECK(ut > 0);
	redisFree(c);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	rt_read_uri(uri, sizeof(uri));
	case_lost_reply();
	case_bounds();
	case_lost_signal();
	case_sockets();
	return tu_done("redis_faults");
}
