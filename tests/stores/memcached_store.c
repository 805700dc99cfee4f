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
 * 5. Renewal batches (one buffered round trip for many locks): of 20 locks
 *    renewed together, the one whose lease key vanished (deleted here, as an
 *    eviction would) is reported lost, and the 19 others stay held over
 *    further rounds — the batch tells each lock's fate apart.
 * 6. The batch through the fault proxy: its replies lost for 1.2 s (the
 *    requests applied) cost no lock; the link dead past the TTL reports all
 *    20 locks lost before another client can take any of them.
 */
#include "testutil/faultproxy.h"
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libmemcached/memcached.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
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
	printf("  ttl %lld ms: holder's held() false at +%lld ms, next holder at +%lld ms\n", (long long)ttl,
	       unheld_at ? unheld_at - t0 : -1, got - t0);
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
	printf("  fence before flush %llu, after %llu\n", (unsigned long long)f1, (unsigned long long)dlock_fence(l));
	CHECK(dlock_fence(l) > f1);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* The lease keys of `name` ("dlock:<name>/o/<owner>"), from the server's
 * own key dump (lru_crawler metadump), deleted. @return how many. */
static int delete_leases(memcached_st *mc, const char *host, int port, const char *name)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	const char *cmd = "lru_crawler metadump all\r\n";
	if (write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
		close(fd);
		return -1;
	}
	static char buf[1 << 20];
	size_t n = 0;
	while (n < sizeof(buf) - 1) {
		ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
		buf[n] = 0;
		if (strstr(buf, "END\r\n"))
			break;
	}
	close(fd);
	/* the dump writes keys URL-encoded: ':' %3A, '/' %2F */
	char want[200];
	snprintf(want, sizeof want, "key=dlock%%3A%s%%2Fo%%2F", name);
	int deleted = 0;
	for (char *p = buf; (p = strstr(p, want)) != NULL; p++) {
		char key[300];
		size_t len = strcspn(p + 4, " \r\n"), k = 0;
		for (size_t i = 0; i < len && k < sizeof key - 1; i++) {
			unsigned v;
			if (p[4 + i] == '%' && i + 2 < len && sscanf(p + 5 + i, "%2x", &v) == 1) {
				key[k++] = (char)v;
				i += 2;
			} else {
				key[k++] = p[4 + i];
			}
		}
		key[k] = 0;
		if (memcached_delete(mc, key, strlen(key), 0) == MEMCACHED_SUCCESS)
			deleted++;
	}
	return deleted;
}

static void test_batch_renewal(memcached_st *mc, const char *host, int port)
{
	enum { N = 20, VICTIM = 7 };
	dlock_store *s = nu_open(uri);
	dlock_lock *l[N];
	char names[N][64];
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof names[i], "mcs-%d-batch-%d", (int)getpid(), i);
		l[i] = nu_lock(s, names[i], 3000, NU_LOST);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	nu_lost_at = 0;
	long long t0 = tu_now_ms();
	CHECK(delete_leases(mc, host, port, names[VICTIM]) == 1);
	while (!nu_lost_at && tu_now_ms() - t0 < 5000)
		usleep(10000);
	/* two more renewal rounds (every ttl/3) for the others */
	usleep(2200 * 1000);
	int held = 0;
	for (int i = 0; i < N; i++)
		held += i != VICTIM && dlock_held(l[i]);
	printf("  batch of %d: the lease deleted was reported lost after %lld ms; %d of %d others held 2.2 s later\n",
	       N, nu_lost_at ? nu_lost_at - t0 : -1, held, N - 1);
	CHECK(nu_lost_at != 0);
	CHECK(!dlock_held(l[VICTIM]));
	CHECK(held == N - 1);
	for (int i = 0; i < N; i++) {
		if (i != VICTIM)
			CHECK_RC(dlock_release(l[i]), 0);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s);
}

static atomic_int batch_lost;
static atomic_llong batch_last_lost;

static void batch_on_lost(dlock_lock *l, void *payload)
{
	(void)l;
	(void)payload;
	batch_last_lost = tu_now_ms();
	batch_lost++;
}

static void test_batch_faults(void)
{
	enum { N = 20 };
	char *proxied = NULL;
	tu_proxy *p = tu_proxy_start(uri, &proxied);
	CHECK(p != NULL);
	if (!p)
		return;
	dlock_store *s = nu_open(proxied), *o = nu_open(uri);
	dlock_lock *l[N], *x[N];
	char names[N][64];
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof names[i], "mcs-%d-fault-%d", (int)getpid(), i);
		l[i] = nu_lock_cb(s, names[i], 3000, batch_on_lost);
		x[i] = nu_lock(o, names[i], 3000, 0);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	/* replies lost, requests applied, for 1.2 s: the batches in it time out */
	CHECK(tu_proxy_set(p, 0, "drop") == 0);
	usleep(1200 * 1000);
	long long dropped = 0;
	CHECK(tu_proxy_stats(p, 0, NULL, NULL, NULL, NULL, &dropped) == 0 && dropped > 0);
	CHECK(tu_proxy_set(p, 0, "pass") == 0);
	usleep(3000 * 1000); /* a TTL later: only renewals that got through hold them */
	int held = 0, refused = 0;
	for (int i = 0; i < N; i++) {
		held += dlock_held(l[i]) != 0;
		refused += dlock_acquire(x[i], 0) == DLOCK_ELOCKED;
	}
	printf("  renewal replies lost for 1.2 s (%lld bytes dropped): %d of %d held a TTL later, %d refused to "
	       "another client, %d lost\n",
	       dropped, held, N, refused, (int)batch_lost);
	CHECK(held == N && refused == N && batch_lost == 0);
	/* the link dead: every lease ends, each lock's on_lost before anyone gets one */
	CHECK(tu_proxy_set(p, 0, "blackhole") == 0);
	long long t0 = tu_now_ms(), first_free = 0;
	int got = -1;
	while (got < 0 && tu_now_ms() - t0 < 10000) {
		for (int i = 0; i < N && got < 0; i++)
			if (dlock_acquire(x[i], 0) == 0)
				got = i, first_free = tu_now_ms();
		if (got < 0)
			usleep(20000);
	}
	int lost_then = batch_lost;
	printf("  link dead: %d of %d lost by %lld ms (the last at %lld ms), the first taken by another client "
	       "at %lld ms\n",
	       lost_then, N, first_free ? first_free - t0 : -1,
	       (long long)(batch_last_lost ? batch_last_lost - t0 : -1), first_free ? first_free - t0 : -1);
	CHECK(got >= 0);
	CHECK(lost_then == N);
	CHECK(batch_last_lost <= first_free);
	if (got >= 0)
		CHECK_RC(dlock_release(x[got]), 0);
	CHECK(tu_proxy_set(p, 0, "pass") == 0);
	for (int i = 0; i < N; i++) {
		dlock_lock_free(l[i]);
		dlock_lock_free(x[i]);
	}
	dlock_store_close(s);
	dlock_store_close(o);
	tu_proxy_stop(p);
	free(proxied);
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
	test_batch_renewal(mc, host, port);
	test_batch_faults();
	test_flush_all(mc);
	memcached_free(mc);
	return tu_done("memcached_store");
}
