/*
 * A redis-server that dies while a lock is held:
 *  - the holder hears the lost signal (on_lost) within its TTL, and
 *    dlock_held() turns false;
 *  - a try while the server is down fails fast with DLOCK_EUNAVAILABLE;
 *  - once the server is back on the same port, the same store handle
 *    reconnects by itself and grants locks again.
 * Usage: redis_crash SERVER_SCRIPT SERVER_DIR   (the fixture's redis.sh and dir)
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <time.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static long long lost_at;

static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	pthread_mutex_lock(&mu);
	lost_at = tu_now_ms();
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static int server(const char *script, const char *verb, const char *dir)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "bash '%s' %s '%s'", script, verb, dir);
	return system(cmd);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: redis_crash SERVER_SCRIPT SERVER_DIR\n");
		return 64;
	}
	char uri[4096];
	rt_read_uri(uri, sizeof(uri));
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &ca);

	const int64_t ttl = 2000;
	dlock_store *s = NULL;
	dlock_lock *l = NULL, *l2 = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = on_lost;
	CHECK_RC(dlock_lock_new(&l, s, "crash-test", &o), 0);
	CHECK_RC(dlock_lock_new(&l2, s, "crash-test-2", NULL), 0);
	long long t_acq = tu_now_ms();
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t fence1 = dlock_fence(l);

	CHECK(server(argv[1], "kill", argv[2]) == 0);
	long long t_kill = tu_now_ms();

	pthread_mutex_lock(&mu);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (ttl + 2000) / 1000;
	while (!lost_at && pthread_cond_timedwait(&cv, &mu, &ts) == 0)
		;
	long long lost = lost_at;
	pthread_mutex_unlock(&mu);
	CHECK(lost != 0);
	printf("killed %lld ms after acquire; lost signal %lld ms after the kill (ttl %lld ms)\n", t_kill - t_acq,
	       lost ? lost - t_kill : -1, (long long)ttl);
	CHECK(lost && lost - t_acq <= ttl); /* before the lease could have ended anywhere */
	CHECK(!dlock_held(l));
	CHECK_RC(dlock_release(l), DLOCK_ELOST);

	long long t = tu_now_ms();
	CHECK_RC(dlock_acquire(l2, 0), DLOCK_EUNAVAILABLE);
	CHECK(tu_now_ms() - t < 1000);
	CHECK(strstr(dlock_error_last()->message, "127.0.0.1") != NULL);

	CHECK(server(argv[1], "restart", argv[2]) == 0);
	/* the same handle reconnects; the server lost its data (no persistence) */
	CHECK_RC(dlock_acquire(l2, 5000), 0);
	CHECK(dlock_fence(l2) >= 1);
	CHECK_RC(dlock_acquire(l, 0), 0);
	printf("after restart: fence %llu (was %llu before the crash: counters without persistence restart)\n",
	       (unsigned long long)dlock_fence(l), (unsigned long long)fence1);
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, NULL, 0, &st, &n), 0);
	CHECK(n == 2);
	dlock_status_free(st, n);
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_release(l2), 0);
	dlock_lock_free(l);
	dlock_lock_free(l2);
	dlock_store_close(s);
	return tu_done("redis_crash");
}
