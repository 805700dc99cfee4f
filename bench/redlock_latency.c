/*
 * Acquire+release latency on Redlock (N masters, requests in parallel)
 * against a single Redis master, measured in the same run with interleaved
 * rounds. Target: Redlock with 5 masters <= 1.5x one master (parallel, not 5x).
 *
 *   cc -O2 -o redlock_latency bench/redlock_latency.c -Iinclude -LBUILD -ldlock -lpthread
 *   LD_LIBRARY_PATH=BUILD ./redlock_latency redlock://h:p1,...,h:p5 redis://h:p1 [pairs] [rounds]
 */
#include <dlock/dlock.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double run(dlock_lock *l, int n)
{
	double t0 = now_us();
	for (int i = 0; i < n; i++)
		if (dlock_acquire(l, 0) || dlock_release(l)) {
			fprintf(stderr, "%s\n", dlock_error_last()->message);
			exit(1);
		}
	return (now_us() - t0) / n;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s REDLOCK_URI REDIS_URI [pairs] [rounds]\n", argv[0]);
		return 64;
	}
	int n = argc > 3 ? atoi(argv[3]) : 200, rounds = argc > 4 ? atoi(argv[4]) : 51;
	dlock_store *rl, *one;
	dlock_lock *a, *b;
	if (dlock_store_open(&rl, argv[1]) || dlock_store_open(&one, argv[2]) ||
	    dlock_lock_new(&a, rl, "bench-redlock", NULL) || dlock_lock_new(&b, one, "bench-one", NULL)) {
		fprintf(stderr, "%s\n", dlock_error_last()->message);
		return 69;
	}
	double *x = calloc((size_t)rounds, sizeof(double)), *y = calloc((size_t)rounds, sizeof(double));
	double *q = calloc((size_t)rounds, sizeof(double));
	for (int r = 0; r < rounds; r++) {
		x[r] = run(a, n);
		y[r] = run(b, n);
		q[r] = x[r] / y[r];
	}
	qsort(x, (size_t)rounds, sizeof(double), cmp_d);
	qsort(y, (size_t)rounds, sizeof(double), cmp_d);
	qsort(q, (size_t)rounds, sizeof(double), cmp_d);
	printf("acquire+release: redlock %.1f us, one master %.1f us, ratio %.2f (medians of %d rounds x %d; "
	       "ratio range %.2f-%.2f)\n",
	       x[rounds / 2], y[rounds / 2], q[rounds / 2], rounds, n, q[0], q[rounds - 1]);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(rl);
	dlock_store_close(one);
	return 0;
}
