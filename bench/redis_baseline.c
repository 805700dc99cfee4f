/*
 * Uncontended acquire+release pairs per second on the redis store, against
 * the raw round-trip rate of the same server: 2 x PING per iteration on a
 * hiredis blocking connection (the kind the store uses), measured in the
 * same run, interleaved in short rounds (default 51 x 200) so that load
 * from elsewhere hits both alike; the median of the per-round ratios is reported.
 *
 *   cc -O2 -o redis_baseline bench/redis_baseline.c -Iinclude -LBUILD -ldlock -lhiredis -lpthread
 *   LD_LIBRARY_PATH=BUILD ./redis_baseline redis://127.0.0.1:6379 [pairs-per-round=200] [rounds=51]
 *
 * Prints both rates and their ratio (target: >= 0.9).
 */
#include <dlock/dlock.h>
#include <hiredis/hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s redis://HOST:PORT [pairs-per-round] [rounds]\n", argv[0]);
		return 64;
	}
	int n = argc > 2 ? atoi(argv[2]) : 200, rounds = argc > 3 ? atoi(argv[3]) : 51;
	char host[256];
	int port;
	if (sscanf(argv[1], "redis://%255[^:]:%d", host, &port) != 2) {
		fprintf(stderr, "want redis://HOST:PORT\n");
		return 64;
	}
	dlock_store *s;
	dlock_lock *l;
	if (dlock_store_open(&s, argv[1]) || dlock_lock_new(&l, s, "bench-baseline", NULL)) {
		fprintf(stderr, "%s\n", dlock_error_last()->message);
		return 69;
	}
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout(host, port, tv);
	if (!c || c->err) {
		fprintf(stderr, "cannot connect\n");
		return 69;
	}
	double *lock_rate = calloc((size_t)rounds, sizeof(double)), *ping_rate = calloc((size_t)rounds, sizeof(double));
	double *ratio = calloc((size_t)rounds, sizeof(double));
	for (int r = 0; r < rounds; r++) {
		double t0 = now_s();
		for (int i = 0; i < n; i++) {
			if (dlock_acquire(l, 0) || dlock_release(l)) {
				fprintf(stderr, "lock: %s\n", dlock_error_last()->message);
				return 1;
			}
		}
		double t1 = now_s();
		for (int i = 0; i < n; i++) {
			for (int k = 0; k < 2; k++) {
				redisReply *rep = redisCommand(c, "PING");
				if (!rep) {
					fprintf(stderr, "ping failed\n");
					return 1;
				}
				freeReplyObject(rep);
			}
		}
		double t2 = now_s();
		lock_rate[r] = n / (t1 - t0);
		ping_rate[r] = n / (t2 - t1);
		ratio[r] = lock_rate[r] / ping_rate[r];
	}
	qsort(lock_rate, (size_t)rounds, sizeof(double), cmp_d);
	qsort(ping_rate, (size_t)rounds, sizeof(double), cmp_d);
	qsort(ratio, (size_t)rounds, sizeof(double), cmp_d);
	printf("acquire+release: %.0f pairs/s   2xPING: %.0f iterations/s   ratio %.3f "
	       "(medians of %d rounds x %d; ratio range %.3f-%.3f)\n",
	       lock_rate[rounds / 2], ping_rate[rounds / 2], ratio[rounds / 2], rounds, n, ratio[0], ratio[rounds - 1]);
	redisFree(c);
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}
