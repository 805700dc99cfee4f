/*
 * Redlock under failures, on five real masters with fsync'd AOF:
 *  - 2 of 5 killed: locks still granted, exclusive, with increasing fences;
 *  - 3 of 5 killed: acquire fails with DLOCK_EUNAVAILABLE within its wait and
 *    nothing is left held on the survivors;
 *  - 2 masters hung (SIGSTOP): no acquire takes longer than one per-master
 *    timeout (they are asked in parallel, not one after the other);
 *  - masters killed and restarted one at a time during many rounds: fences
 *    never go backwards;
 *  - a held lock whose quorum dies is reported lost (on_lost) within its TTL.
 * Usage: redlock_faults SERVER_SCRIPT SERVER_DIR
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <time.h>

static const char *script, *dir;
static char uri[4096];
static uint64_t last_fence;
static int fence_back;

static void server(const char *verb, int i)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "bash '%s' %s '%s' %d", script, verb, dir, i);
	if (system(cmd) != 0) {
		fprintf(stderr, "'%s' failed\n", cmd);
		tu_failures++;
	}
}

static redisContext *master(int i)
{
	char path[1024], u[64];
	snprintf(path, sizeof(path), "%s/%d/port", dir, i);
	FILE *f = fopen(path, "r");
	int port = 0;
	if (!f || fscanf(f, "%d", &port) != 1)
		exit(1);
	fclose(f);
	snprintf(u, sizeof(u), "redis://127.0.0.1:%d", port);
	return rt_raw(u);
}

static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lost_cv = PTHREAD_COND_INITIALIZER;
static long long lost_at;

static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	pthread_mutex_lock(&lost_mu);
	lost_at = tu_now_ms();
	pthread_cond_broadcast(&lost_cv);
	pthread_mutex_unlock(&lost_mu);
}

/* One acquire+release on a; b must be refused meanwhile; fences must rise. */
static void round_trip(dlock_lock *a, dlock_lock *b)
{
	if (dlock_acquire(a, 2000) != 0) {
		CHECK_RC(dlock_acquire(a, 2000), 0);
		return;
	}
	uint64_t f = dlock_fence(a);
	if (f <= last_fence) {
		fprintf(stderr, "fence went back: %llu after %llu\n", (unsigned long long)f,
			(unsigned long long)last_fence);
		fence_back++;
	}
	last_fence = f;
	/* never granted; a try-once (40 ms) may also run out of time on a loaded machine */
	int rb = dlock_acquire(b, 0);
	CHECK(rb == DLOCK_ELOCKED || rb == DLOCK_EUNAVAILABLE);
	if (rb == 0)
		dlock_release(b);
	CHECK_RC(dlock_release(a), 0);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	script = argv[1];
	dir = argv[2];
	rt_read_uri(uri, sizeof(uri));
	dlock_store *s1 = NULL, *s2 = NULL;
	CHECK_RC(dlock_store_open(&s1, uri), 0);
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 3000; /* per-master timeout: ttl/10 = 300 ms */
	dlock_lock *a = NULL, *b = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "faults", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s2, "faults", &o), 0);

	/* 2 of 5 down: still a quorum of 3 */
	server("kill", 0);
	server("kill", 1);
	for (int r = 0; r < 20; r++)
		round_trip(a, b);
	printf("2 of 5 killed: 20 grants, exclusive, fences up to %llu\n", (unsigned long long)last_fence);

	/* 3 of 5 down: no quorum, fail within the wait, leave nothing behind */
	server("kill", 2);
	long long t = tu_now_ms();
	int rc = dlock_acquire(a, 1000);
	long long took = tu_now_ms() - t;
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(took <= 1000 + 400);
	printf("3 of 5 killed: %s after %lld ms (wait 1000 ms): %s\n", dlock_error_name(rc), took,
	       dlock_error_last()->message);
	for (int i = 3; i < 5; i++) {
		redisContext *c = master(i);
		redisReply *r = redisCommand(c, "EXISTS {dlock:faults}");
		CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
		if (r)
			freeReplyObject(r);
		redisFree(c);
	}
	for (int i = 0; i < 3; i++)
		server("restart", i);

	/* two masters hung: each acquire bounded by one per-master timeout (300 ms) —
	 * asked one after the other, the first acquire would take two (600 ms) */
	server("pause", 3);
	server("pause", 4);
	long long worst = 0;
	for (int r = 0; r < 10; r++) {
		t = tu_now_ms();
		/* a wait: its first try has the whole request time (a try-once gets 40 ms) */
		CHECK_RC(dlock_acquire(a, 1000), 0);
		long long d = tu_now_ms() - t;
		worst = d > worst ? d : worst;
		if (dlock_fence(a) <= last_fence)
			fence_back++;
		last_fence = dlock_fence(a);
		CHECK_RC(dlock_release(a), 0);
	}
	server("resume", 3);
	server("resume", 4);
	printf("2 of 5 hung: slowest of 10 acquires took %lld ms (per-master timeout 300 ms)\n", worst);
	CHECK(worst <= 300 + 150);

	/* masters restarted one at a time (with persistence): fences keep rising */
	for (int m = 0; m < 5; m++) {
		server("kill", m);
		for (int r = 0; r < 10; r++)
			round_trip(a, b);
		server("restart", m);
		for (int r = 0; r < 10; r++)
			round_trip(a, b);
	}
	printf("rolling restarts: 100 more grants, last fence %llu, %d went back\n", (unsigned long long)last_fence,
	       fence_back);
	CHECK(fence_back == 0);

	/* the quorum dies under a held lock: lost within the TTL */
	dlock_lock *c = NULL;
	dlock_lock_options lo = o;
	lo.on_lost = on_lost;
	CHECK_RC(dlock_lock_new(&c, s1, "faults-lost", &lo), 0);
	long long t_acq = tu_now_ms();
	CHECK_RC(dlock_acquire(c, 0), 0);
	for (int i = 0; i < 3; i++)
		server("kill", i);
	/* renewals may still have reached a quorum while the kills were going on:
	 * the lease counts from the last confirmed one, at most from now */
	long long t_gone = tu_now_ms();
	pthread_mutex_lock(&lost_mu);
	while (!lost_at && tu_now_ms() < t_gone + 6000) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&lost_cv, &lost_mu, &ts);
	}
	long long lost = lost_at;
	pthread_mutex_unlock(&lost_mu);
	printf("quorum killed under a held lock (%lld ms after the acquire): lost signal %lld ms later "
	       "(ttl 3000 ms)\n",
	       t_gone - t_acq, lost ? lost - t_gone : -1);
	CHECK(lost && lost - t_gone <= 3000);
	CHECK(!dlock_held(c));
	for (int i = 0; i < 3; i++)
		server("restart", i);
	dlock_release(c);
	dlock_lock_free(c);

	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s1);
	dlock_store_close(s2);
	return tu_done("redlock_faults");
}
