/*
 * Memcached under memory pressure (issue 30 row 4), against a real memcached
 * 1.6 started small and evicting (tests/servers/memcached.sh start DIR 2:
 * -m 2, no -M, otherwise as packaged):
 *
 *   memcached_evict      (URI from $DLOCK_TEST_URI_FILE)
 *
 * Three holders of a semaphore of 3 renew while another client fills
 * memcached far past its memory with items of the holder list's size
 * (memcached evicts within a size class; the list of three is bigger than a
 * lease key, so the lease keys' class is left alone). Memcached evicts; it must never
 * evict a hold silently: either the hold's keys stay (no one else is
 * granted), or, where its holder list went, the holder is told (on_lost) at
 * its next renewal — never a second holder granted while the first renews on
 * as if it still held (a 4th holder of the semaphore of 3). It also prints memcached's own settings and eviction
 * counters (the facts docs/stores/memcached.md states).
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libmemcached/memcached.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>

static char uri[1024];

/* The reply to one command up to "END\r\n" (malloc'd, NUL-ended; NULL on error). */
static char *raw_cmd(const char *host, int port, const char *cmd)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	size_t cap = 1 << 16, got = 0;
	char *buf = malloc(cap);
	if (buf && write(fd, cmd, strlen(cmd)) == (ssize_t)strlen(cmd)) {
		for (;;) {
			if (got + 1 >= cap) {
				char *nb = realloc(buf, cap *= 2);
				if (!nb)
					break;
				buf = nb;
			}
			ssize_t r = read(fd, buf + got, cap - 1 - got);
			if (r <= 0)
				break;
			got += (size_t)r;
			buf[got] = 0;
			if (got >= 5 && !strcmp(buf + got - 5, "END\r\n"))
				break;
		}
	}
	close(fd);
	if (buf)
		buf[got] = 0;
	return buf;
}

/* The slab class of the first key starting with `prefix` (as metadump
 * writes keys: ':' is %3A, '/' is %2F), or -1. */
static int slab_class(const char *host, int port, const char *prefix)
{
	char *dump = raw_cmd(host, port, "lru_crawler metadump all\r\n");
	int cls = -1;
	char pat[300];
	snprintf(pat, sizeof pat, "key=%s", prefix);
	char *p = dump ? strstr(dump, pat) : NULL;
	char *c = p ? strstr(p, " cls=") : NULL;
	if (c)
		cls = atoi(c + 5);
	free(dump);
	return cls;
}

/* One value of "stats[ group]" from a raw connection, or "" (into out). */
static void stat_of(const char *host, int port, const char *group, const char *key, char *out, size_t n)
{
	char cmd[64], pat[80];
	snprintf(cmd, sizeof cmd, "stats%s%s\r\n", group ? " " : "", group ? group : "");
	snprintf(pat, sizeof pat, "STAT %s ", key);
	char *buf = raw_cmd(host, port, cmd);
	char *p = buf ? strstr(buf, pat) : NULL;
	out[0] = 0;
	if (p)
		snprintf(out, n, "%.*s", (int)strcspn(p + strlen(pat), "\r\n"), p + strlen(pat));
	free(buf);
}

static dlock_lock *sem_lock(dlock_store *s, const char *name, int64_t ttl, dlock_lost_fn lost)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.permits = 3;
	o.on_lost = lost;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0) {
		fprintf(stderr, "dlock_lock_new: %s\n", dlock_error_last()->message);
		exit(1);
	}
	return l;
}

int main(void)
{
	tu_uri_from_env(uri, sizeof uri, "memcached_evict");
	char host[256];
	int port = 0;
	if (sscanf(uri, "memcached://%255[^:]:%d", host, &port) != 2) {
		fprintf(stderr, "cannot parse %s\n", uri);
		return 1;
	}
	memcached_st *mc = memcached_create(NULL);
	memcached_server_add(mc, host, (in_port_t)port);
	char v[64], lru[64], ttl[64], mem[64];
	stat_of(host, port, "settings", "temp_lru", lru, sizeof lru);
	stat_of(host, port, "settings", "temporary_ttl", ttl, sizeof ttl);
	stat_of(host, port, "settings", "maxbytes", mem, sizeof mem);
	stat_of(host, port, NULL, "version", v, sizeof v);
	printf("  memcached %s: maxbytes %s, temp_lru %s, temporary_ttl %s\n", v, mem, lru, ttl);

	const int64_t lease = 3000;
	char name[128];
	snprintf(name, sizeof name, "mce-%d", (int)getpid());
	/* A semaphore of 3, full: its holder list (three entries) is bigger than
	 * a lease key, so the two sit in different size classes. */
	dlock_store *a = nu_open(uri), *b = nu_open(uri), *c = nu_open(uri);
	dlock_lock *la = sem_lock(a, name, lease, nu_on_lost), *lb = sem_lock(b, name, lease, NULL);
	dlock_lock *lc1 = sem_lock(c, name, lease, NULL), *lc2 = sem_lock(c, name, lease, NULL);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(la, 0), 0);
	CHECK_RC(dlock_acquire(lc1, 0), 0);
	CHECK_RC(dlock_acquire(lc2, 0), 0);
	CHECK_RC(dlock_acquire(lb, 0), DLOCK_ELOCKED);

	/* The holder list's size (memcached evicts within a size class: the
	 * filler is made of items of that size, as a busy cache would have). */
	char lk[200];
	snprintf(lk, sizeof lk, "dlock:%s", name);
	size_t list_len = 0;
	uint32_t lf;
	memcached_return_t lrc;
	char *lv = memcached_get(mc, lk, strlen(lk), &list_len, &lf, &lrc);
	CHECK(lv != NULL);
	free(lv);
	/* The filler goes into the list's size class; the lease key is in
	 * another (it is smaller), where nothing is written: the eviction
	 * takes the list and leaves the lease, as in the issue. */
	char kp_[160], lp_[200];
	snprintf(kp_, sizeof kp_, "dlock%%3A%s ", name);
	snprintf(lp_, sizeof lp_, "dlock%%3A%s%%2Fo%%2F", name);
	int list_cls = slab_class(host, port, kp_), lease_cls = slab_class(host, port, lp_);
	printf("  holder list: %zu bytes, slab class %d; lease key: slab class %d\n", list_len, list_cls, lease_cls);
	CHECK(list_cls > 0 && lease_cls > 0 && list_cls != lease_cls);
	/* A plain key of that size with a short TTL (30 s, like a lease), never read again. */
	char probe[200];
	snprintf(probe, sizeof probe, "%s", lk);
	probe[0] = 'P'; /* another key of the list's length */
	char *pval = calloc(1, list_len + 1);
	memset(pval, 'p', list_len);
	CHECK(memcached_set(mc, probe, strlen(probe), pval, list_len, 30, 0) == MEMCACHED_SUCCESS);
	free(pval);
	/* Fill: values around the list's size, no expiry, for 2 lease periods
	 * (the holder renews 6 times meanwhile); nobody else looks at the lock,
	 * as when it is rarely contended. */
	char *val = malloc(list_len + 1);
	memset(val, 'x', list_len + 1);
	long long t0 = tu_now_ms(), granted_at = 0;
	long sets = 0, refused = 0;
	while (tu_now_ms() - t0 < 2 * lease) {
		char k[64];
		/* a key as long as the list's, a value as long: its item size */
		int kl = snprintf(k, sizeof k, "%0*ld", (int)strlen(lk), sets);
		size_t vl = list_len;
		if (memcached_set(mc, k, (size_t)kl, val, vl, 0, 0) != MEMCACHED_SUCCESS)
			refused++;
		sets++;
	}
	long long fill_ms = tu_now_ms() - t0;
	size_t pl;
	uint32_t pf;
	memcached_return_t prc;
	char *pv = memcached_get(mc, probe, strlen(probe), &pl, &pf, &prc);
	printf("  a cold key with a 30 s TTL after the fill: %s\n", pv ? "kept" : "evicted");
	free(pv);
	/* Then another client tries, for one lease period. */
	int tries = 0;
	long long t1 = tu_now_ms();
	while (!granted_at && tu_now_ms() - t1 < lease) {
		tries++;
		int rc = dlock_acquire(lb, 0);
		if (rc == 0)
			granted_at = tu_now_ms();
		else
			CHECK(rc == DLOCK_ELOCKED);
		usleep(20000);
	}
	/* The holder's next renewal comes within lease/3 of the grant. */
	long long told = granted_at ? nu_wait_lost(lease / 3 + 1000) : nu_lost_at;
	char ev[64], evi[64];
	stat_of(host, port, NULL, "evictions", ev, sizeof ev);
	stat_of(host, port, NULL, "curr_items", evi, sizeof evi);
	printf("  %ld sets over %lld ms (%ld refused), evictions %s, items left %s\n", sets, fill_ms, refused, ev, evi);
	printf("  a 4th client of the semaphore of 3: %d tries, %s; the first holder %s\n", tries,
	       granted_at ? "granted" : "never granted",
	       told ? (told <= granted_at || !granted_at ? "was told it lost the lock before that"
							 : "was told it lost the lock at its next renewal")
		    : "was never told");
	CHECK(atoll(ev) > 0); /* the test made memcached evict */
	if (granted_at) {
		/* a second holder: the first must hear it at its next renewal */
		CHECK(told != 0);
		CHECK(told - granted_at <= lease / 3 + 1000);
		CHECK(!dlock_held(la));
		dlock_release(lb);
	} else {
		/* nobody else granted: the first holds on, or was told */
		CHECK(dlock_held(la) || told != 0);
	}
	dlock_release(la);
	dlock_release(lc1);
	dlock_release(lc2);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_lock_free(lc1);
	dlock_lock_free(lc2);
	dlock_store_close(a);
	dlock_store_close(b);
	dlock_store_close(c);
	free(val);
	memcached_free(mc);
	return tu_done("memcached_evict");
}
