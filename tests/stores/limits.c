/*
 * Limits of one process against one store (functional, not a benchmark):
 *
 *   limits URI many N TTL_MS [reverse]
 *     N distinct locks held by one store handle: acquire all (try once
 *     each), keep them through renewal (wait until the first lock's lease
 *     has been pushed forward, then one more full TTL: a lock the renewal
 *     thread missed would have run out), check every one is still held,
 *     release all. Twice: the second round's RSS must not grow past the
 *     first's (+25% + 32 MiB slack; 288 MiB under ASan, for its quarantine), so
 *     memory is bounded by what is held, not by what was ever held.
 *     Prints the time of each phase and RSS (VmRSS) per lock. Locks are
 *     released oldest first ("reverse": newest first, for comparison).
 *
 *   limits URI waiters PROCS THREADS
 *     PROCS processes x THREADS threads, each with its own handle, all
 *     waiting (no time limit) on one lock; each holder checks nobody else
 *     is inside (a counter in shared memory), bumps the grant count and
 *     releases. Every waiter must be granted exactly once, never two at once.
 *
 * URI "-" reads it from $DLOCK_TEST_URI_FILE. Exit 0 when every check passed.
 */
#include "testutil/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* AddressSanitizer keeps freed memory in quarantine (256 MiB by default), so
 * RSS after a second round says little there; LeakSanitizer checks leaks. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_SLACK_KIB (288 * 1024)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_SLACK_KIB (288 * 1024)
#endif
#endif
#ifndef RSS_SLACK_KIB
#define RSS_SLACK_KIB (32 * 1024)
#endif

static char uri[4096];
static int release_reverse; /* "reverse": release newest first (diagnostics) */

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ many locks */

static int many_round(dlock_store *s, long n, int64_t ttl_ms, int round, long *rss_held)
{
	dlock_lock **locks = calloc((size_t)n, sizeof *locks);
	if (!locks)
		return 1;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl_ms;
	long rss0 = rss_kib();
	long long t0 = tu_now_ms();
	long failed = 0;
	for (long i = 0; i < n; i++) {
		char name[64];
		snprintf(name, sizeof name, "limits-many-%d-%ld", getpid(), i);
		int rc = dlock_lock_new(&locks[i], s, name, &o);
		if (rc == 0)
			rc = dlock_acquire(locks[i], 0);
		if (rc != 0 && failed++ < 5)
			fprintf(stderr, "lock %ld: %s: %s\n", i, dlock_error_name(rc), dlock_error_last()->message);
	}
	CHECK(failed == 0);
	long long t1 = tu_now_ms();
	*rss_held = rss_kib();

	/* Renewal: the first lock's lease is pushed forward (an event we poll
	 * for), then one more whole TTL passes: any lock the renewal thread
	 * failed to renew would have run out by then. */
	int64_t left0 = dlock_ttl_left(locks[0]);
	long long until = tu_now_ms() + 4 * ttl_ms + (long long)n / 10;
	int renewed = 0;
	while (!renewed && tu_now_ms() < until) {
		nap_ms(20);
		int64_t now_left = dlock_ttl_left(locks[0]);
		renewed = now_left > left0 + 50; /* lease moved forward, not just ticking down */
		left0 = now_left < left0 ? now_left : left0;
	}
	CHECK(renewed);
	long long t2 = tu_now_ms();
	nap_ms((long)ttl_ms);
	long lost = 0;
	for (long i = 0; i < n; i++)
		if (!dlock_held(locks[i]) || dlock_ttl_left(locks[i]) <= 0)
			lost++;
	if (lost)
		fprintf(stderr, "limits: %ld of %ld locks not held after renewal\n", lost, n);
	CHECK(lost == 0);
	long long t3 = tu_now_ms();
	long bad_release = 0;
	for (long j = 0; j < n; j++) {
		long i = release_reverse ? n - 1 - j : j;
		if (dlock_release(locks[i]) != 0)
			bad_release++;
		dlock_lock_free(locks[i]);
	}
	if (bad_release)
		fprintf(stderr, "limits: %ld of %ld releases failed\n", bad_release, n);
	CHECK(bad_release == 0);
	long long t4 = tu_now_ms();
	free(locks);
	printf("round %d: %ld locks (ttl %lld ms): acquire %.2f s (%.0f/s), first renewal seen after %.2f s, "
	       "all held %.1f s later, release+free %.2f s; RSS %ld -> %ld KiB (%.0f B/lock held)\n",
	       round, n, (long long)ttl_ms, (t1 - t0) / 1000.0, n * 1000.0 / (double)(t1 - t0 + 1), (t2 - t1) / 1000.0,
	       (t3 - t2) / 1000.0, (t4 - t3) / 1000.0, rss0, *rss_held,
	       (double)(*rss_held - rss0) * 1024.0 / (double)n);
	fflush(stdout);
	return 0;
}

static int many(long n, int64_t ttl_ms)
{
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("limits many");
	long rss1 = 0, rss2 = 0;
	many_round(s, n, ttl_ms, 1, &rss1);
	many_round(s, n, ttl_ms, 2, &rss2);
	/* Bounded: holding n locks a second time costs no more than the first. */
	CHECK(rss2 <= rss1 + rss1 / 4 + RSS_SLACK_KIB);
	/* The store is empty of our locks again. */
	dlock_lock_status *st = NULL;
	size_t ns = 0;
	char name[64];
	snprintf(name, sizeof name, "limits-many-%d-0", getpid());
	const char *names[] = { name };
	CHECK_RC(dlock_store_status(s, names, 1, &st, &ns), 0);
	CHECK(ns == 0 || st[0].nholders == 0);
	dlock_status_free(st, ns);
	dlock_store_close(s);
	printf("RSS after close: %ld KiB\n", rss_kib());
	return tu_done("limits many");
}

/* ------------------------------------------------------------ waiters */

typedef struct shared {
	atomic_int inside;   /* holders in the critical section now */
	atomic_int overlap;  /* times a holder found another inside */
	atomic_long granted; /* grants so far */
	atomic_int errors;   /* acquire/release failures */
	atomic_int ready;    /* threads that are about to wait */
	atomic_int go;       /* start signal */
} shared;

static shared *sh;
static dlock_store *wstore;

static void *waiter(void *arg)
{
	(void)arg;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, wstore, "limits-waiters", NULL) != 0) {
		atomic_fetch_add(&sh->errors, 1);
		return NULL;
	}
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		nap_ms(5);
	int rc = dlock_acquire(l, -1);
	if (rc != 0) {
		if (atomic_fetch_add(&sh->errors, 1) < 5)
			fprintf(stderr, "acquire: %s: %s\n", dlock_error_name(rc), dlock_error_last()->message);
	} else {
		if (atomic_fetch_add(&sh->inside, 1) != 0)
			atomic_fetch_add(&sh->overlap, 1);
		atomic_fetch_add(&sh->granted, 1);
		atomic_fetch_sub(&sh->inside, 1);
		if ((rc = dlock_release(l)) != 0 && atomic_fetch_add(&sh->errors, 1) < 5)
			fprintf(stderr, "release: %s: %s\n", dlock_error_name(rc), dlock_error_last()->message);
	}
	dlock_lock_free(l);
	return NULL;
}

static int run_threads(int threads)
{
	if (dlock_store_open(&wstore, uri) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		atomic_fetch_add(&sh->errors, threads);
		atomic_fetch_add(&sh->ready, threads);
		return 1;
	}
	pthread_t *t = calloc((size_t)threads, sizeof *t);
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setstacksize(&a, 256 * 1024);
	int started = 0;
	for (int i = 0; t && i < threads; i++) {
		if (pthread_create(&t[i], &a, waiter, NULL) != 0) {
			fprintf(stderr, "pthread_create failed after %d threads\n", i);
			atomic_fetch_add(&sh->errors, threads - i);
			atomic_fetch_add(&sh->ready, threads - i);
			break;
		}
		started++;
	}
	pthread_attr_destroy(&a);
	for (int i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	free(t);
	dlock_store_close(wstore);
	return 0;
}

static int waiters(int procs, int threads)
{
	sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 2;
	memset(sh, 0, sizeof *sh);
	long total = (long)procs * threads;
	long long t0 = tu_now_ms();
	pid_t *pids = calloc((size_t)procs, sizeof *pids);
	for (int p = 0; pids && p < procs; p++) {
		pids[p] = fork();
		if (pids[p] == 0)
			_exit(run_threads(threads));
	}
	/* Everyone is about to wait before the first acquire: a real crowd. */
	long long until = tu_now_ms() + 120000;
	while (atomic_load(&sh->ready) < total && tu_now_ms() < until)
		nap_ms(10);
	CHECK(atomic_load(&sh->ready) == total);
	long long t1 = tu_now_ms();
	atomic_store(&sh->go, 1);
	int crashed = 0;
	for (int p = 0; pids && p < procs; p++) {
		int st = 0;
		waitpid(pids[p], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			crashed++;
	}
	long long t2 = tu_now_ms();
	free(pids);
	CHECK(crashed == 0);
	CHECK(atomic_load(&sh->errors) == 0);
	CHECK(atomic_load(&sh->overlap) == 0);
	CHECK(atomic_load(&sh->granted) == total);
	printf("waiters: %d processes x %d threads = %ld waiters on one lock: set-up %.2f s, all granted "
	       "in turn in %.2f s (%.0f grants/s); overlaps %d, errors %d, granted %ld\n",
	       procs, threads, total, (t1 - t0) / 1000.0, (t2 - t1) / 1000.0, total * 1000.0 / (double)(t2 - t1 + 1),
	       atomic_load(&sh->overlap), atomic_load(&sh->errors), atomic_load(&sh->granted));
	return tu_done("limits waiters");
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: limits URI|- many N TTL_MS | waiters PROCS THREADS\n");
		return 2;
	}
	if (strcmp(argv[1], "-") == 0) {
		tu_uri_from_env(uri, sizeof uri, "limits");
	} else {
		snprintf(uri, sizeof uri, "%s", argv[1]);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(argv[2], "many") == 0 && (argc == 5 || argc == 6)) {
		release_reverse = argc == 6 && strcmp(argv[5], "reverse") == 0;
		return many(atol(argv[3]), atol(argv[4]));
	}
	if (strcmp(argv[2], "waiters") == 0 && argc == 5)
		return waiters(atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: limits URI|- many N TTL_MS | waiters PROCS THREADS\n");
	return 2;
}
