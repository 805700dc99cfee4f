/*
 * Memcached-specific behaviour, against a real memcached:
 *
 *   memcached_store      (URI from $DLOCK_TEST_URI_FILE)
 *
 * 1. Leases are whole seconds on the server, rounded up: a lock left to
 *    expire is never free before its TTL, the holder's lost signal comes
 *    before anyone else gets it, and it is free within TTL + 2 s.
 * 2. flush_all (or a restart) wipes every lease: holders get the lost signal
 *    at their next renewal, and fences keep growing (the counter restarts
 *    from the wall clock in microseconds).
 * 3. Long names and names with spaces map to distinct, valid keys.
 * 4. URIs memcached cannot serve safely are refused with DLOCK_EINVAL; an
 *    unreachable server is DLOCK_EUNAVAILABLE at open.
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libmemcached/memcached.h>

#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

static char uri[1024];
static void test_lease_rounding(void)
{
	char name[128];
	snprintf(name, sizeof name, "mcs-%d-lease", (int)getpid());
	const int64_t ttl = 1200;
	dlock_store *a = nu_open(uri), *b = nu_open(uri);
	dlock_lock *la = nu_lock(a, name, ttl, NU_LOST | NU_NO_RENEW), *lb = nu_lock(b, name, 5000, NU_LOST);
	nu_lost_at = 0;
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(la, 0), 0);
	int rc;
	long long unheld_at = 0; /* no renewal: the signal is dlock_held() turning false */
	while (1) {
		if (!unheld_at && !dlock_held(la))
			unheld_at = tu_now_ms();
		rc = dlock_acquire(lb, 0);
		if (rc != DLOCK_ELOCKED || tu_now_ms() - t0 > 10000)
			break;
		usleep(20000);
	}
	long long got = tu_now_ms();
	CHECK_RC(rc, 0);
	printf("  ttl %lld ms: holder's held() false at +%lld ms, next holder at +%lld ms\n",
	       (long long)ttl, unheld_at ? unheld_at - t0 : -1, got - t0);
	CHECK(got - t0 >= ttl);
	CHECK(got - t0 < ttl + 2000 + 1000);
	CHECK(unheld_at != 0 && unheld_at < got);
	CHECK(!dlock_held(la));
	CHECK_RC(dlock_release(lb), 0);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_store_close(a);
	dlock_store_close(b);
}

static void test_flush_all(memcached_st *mc)
{
	char name[128];
	snprintf(name, sizeof name, "mcs-%d-flush", (int)getpid());
	dlock_store *s = nu_open(uri);
	dlock_lock *l = nu_lock(s, name, 3000, NU_LOST);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t f1 = dlock_fence(l);
	long long t0 = tu_now_ms();
	CHECK(memcached_flush(mc, 0) == MEMCACHED_SUCCESS);
	while (!nu_lost_at && tu_now_ms() - t0 < 5000)
		usleep(10000);
	printf("  flush_all: holder told after %lld ms\n", nu_lost_at ? nu_lost_at - t0 : -1);
	CHECK(nu_lost_at != 0 && nu_lost_at - t0 <= 3000);
	CHECK(!dlock_held(l));
	dlock_release(l);
	CHECK_RC(dlock_acquire(l, 0), 0);
	printf("  fence before flush %llu, after %llu\n", (unsigned long long)f1,
	       (unsigned long long)dlock_fence(l));
	CHECK(dlock_fence(l) > f1);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void test_names(void)
{
	char n1[520], n2[520];
	memset(n1, 'x', 500);
	n1[500] = 0;
	memcpy(n2, n1, sizeof n1);
	n1[499] = 'a';
	n2[499] = 'b';
	const char *spaced = "with spaces, %, ünïcødé";
	dlock_store *s = nu_open(uri);
	dlock_lock *a = nu_lock(s, n1, 5000, NU_LOST), *b = nu_lock(s, n2, 5000, NU_LOST);
	dlock_lock *c = nu_lock(s, spaced, 5000, NU_LOST);
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK_RC(dlock_acquire(b, 0), 0); /* distinct keys despite hashing */
	CHECK_RC(dlock_acquire(c, 0), 0);
	dlock_store *s2 = nu_open(uri);
	dlock_lock *a2 = nu_lock(s2, n1, 5000, NU_LOST);
	CHECK_RC(dlock_acquire(a2, 0), DLOCK_ELOCKED); /* same key for the same name */
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_release(b), 0);
	CHECK_RC(dlock_release(c), 0);
	CHECK_RC(dlock_acquire(a2, 0), 0);
	CHECK_RC(dlock_release(a2), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_lock_free(c);
	dlock_lock_free(a2);
	dlock_store_close(s2);
	dlock_store_close(s);
}

static void test_bad_uris(void)
{
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, "memcached://127.0.0.1:1,127.0.0.1:2"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "memcached://u:p@127.0.0.1:11211"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "memcached://127.0.0.1:11211/x"), DLOCK_EINVAL);
	CHECK(s == NULL);
	/* Nothing listens on port 1: unavailable, said at open. */
	CHECK_RC(dlock_store_open(&s, "memcached://127.0.0.1:1?connect_timeout=1s"), DLOCK_EUNAVAILABLE);
	CHECK(s == NULL);
}

int main(void)
{
	tu_uri_from_env(uri, sizeof uri, "memcached_store");
	char host[256];
	int port = 0;
	if (sscanf(uri, "memcached://%255[^:]:%d", host, &port) != 2) {
		fprintf(stderr, "memcached_store: unexpected URI %s\n", uri);
		return 2;
	}
	memcached_st *mc = memcached_create(NULL);
	memcached_server_add(mc, host, (in_port_t)port);

	test_bad_uris();
	test_names();
	test_lease_rounding();
	test_flush_all(mc);
	memcached_free(mc);
	return tu_done("memcached_store");
}
