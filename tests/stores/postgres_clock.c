/*
 * Table-mode leases are judged by the PostgreSQL server's clock only:
 *
 *   postgres_clock FAKETIME                     the test (URI from $DLOCK_TEST_URI_FILE)
 *   postgres_clock --child WHAT URI NAME WALL   run under `faketime -f ±10d`
 *
 * ahead:  a client whose clock is 10 days ahead cannot take a lock held (and
 *         renewed) by a normal client, and the lease it writes itself is
 *         ~its TTL on the server, not 10 days off.
 * behind: a client 10 days behind takes a lock with a 1.5 s lease and exits;
 *         a normal client is refused at once and gets it after ~1.5 s.
 * Each child first checks that libfaketime really moved its clock, so the
 * test cannot pass vacuously.
 */
#include "testutil/testutil.h"

#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char uri[2048];

static long long wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static const char *self;

static dlock_lock *new_lock(dlock_store *s, const char *name, int64_t ttl, int no_renew)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.no_renew = no_renew;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0)
		exit(20);
	return l;
}

static int child(const char *what, const char *name, long long parent_wall)
{
	long long skew = wall_ms() - parent_wall;
	long long nine_days = 9LL * 24 * 3600 * 1000;
	if (strcmp(what, "ahead") == 0 ? skew < nine_days : skew > -nine_days) {
		fprintf(stderr, "child: clock not moved by faketime (skew %lld ms)\n", skew);
		return 10;
	}
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0)
		return 11;
	if (strcmp(what, "ahead") == 0) {
		/* The lock the parent holds looks long expired by this clock. */
		dlock_lock *l = new_lock(s, name, 5000, 0);
		int rc = dlock_acquire(l, 0);
		if (rc != DLOCK_ELOCKED) {
			fprintf(stderr, "child ahead: acquire returned %s\n", dlock_error_name(rc));
			return 1;
		}
		dlock_lock_free(l);
		/* And a lease it writes: 60 s as the server counts. */
		char other[300];
		snprintf(other, sizeof other, "%s-mine", name);
		l = new_lock(s, other, 60000, 1);
		if (dlock_acquire(l, 0) != 0)
			return 2;
		char *h = NULL;
		dlock_lock_detach(l, &h); /* leave it held in the store */
		dlock_free(h);
		dlock_lock_free(l);
	} else {
		dlock_lock *l = new_lock(s, name, 1500, 1);
		if (dlock_acquire(l, 0) != 0)
			return 3;
		char *h = NULL;
		dlock_lock_detach(l, &h);
		dlock_free(h);
		dlock_lock_free(l);
	}
	dlock_store_close(s);
	return 0;
}

static int run_child(const char *faketime, const char *what, const char *name)
{
	char cmd[4096];
	/* ASan wants to be first in the library list; libfaketime is preloaded
	 * before it, and clang's allocator must not call clock_gettime while it
	 * holds its lock (libfaketime's lazy dlsym would malloc there and
	 * deadlock). Only the wall clock is faked: the core's deadlines use
	 * CLOCK_MONOTONIC on purpose. */
	snprintf(cmd, sizeof cmd,
		 "ASAN_OPTIONS=verify_asan_link_order=0:allocator_release_to_os_interval_ms=-1 "
		 "FAKETIME_DONT_FAKE_MONOTONIC=1 '%s' -f '%s' "
		 "'%s' --child %s '%s' '%s' %lld",
		 faketime, strcmp(what, "ahead") == 0 ? "+10d" : "-10d", self, what, uri, name, wall_ms());
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

static int64_t ttl_left(dlock_store *s, const char *name)
{
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int64_t left = -2;
	if (dlock_store_status(s, names, 1, &st, &n) == 0 && n == 1 && st[0].nholders == 1)
		left = st[0].holders[0].ttl_left_ms;
	dlock_status_free(st, n);
	return left;
}

int main(int argc, char **argv)
{
	self = argv[0];
	if (argc == 6 && strcmp(argv[1], "--child") == 0) {
		snprintf(uri, sizeof uri, "%s", argv[3]);
		return child(argv[2], argv[4], atoll(argv[5]));
	}
	if (argc < 2 || !argv[1][0] || strstr(argv[1], "NOTFOUND")) {
		fprintf(stderr, "usage: postgres_clock FAKETIME (got '%s': install faketime)\n",
			argc > 1 ? argv[1] : "");
		return 1;
	}
	tu_uri_from_env(uri, sizeof uri, "postgres_clock");

	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		return 1;
	}
	char name[128], mine[300];
	snprintf(name, sizeof name, "pgclock-%d-ahead", (int)getpid());
	snprintf(mine, sizeof mine, "%s-mine", name);

	/* ahead */
	dlock_lock *l = new_lock(s, name, 3000, 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(run_child(argv[1], "ahead", name), 0);
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	int64_t left = ttl_left(s, mine);
	printf("  lease written by a client 10 days ahead: %lld ms left by the server's clock\n", (long long)left);
	CHECK(left > 50000 && left <= 60000);

	/* behind */
	snprintf(name, sizeof name, "pgclock-%d-behind", (int)getpid());
	CHECK_RC(run_child(argv[1], "behind", name), 0);
	long long t0 = tu_now_ms();
	l = new_lock(s, name, 5000, 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(l, 10000), 0);
	long long took = tu_now_ms() - t0;
	printf("  lease of 1.5 s written by a client 10 days behind: free after %lld ms\n", took);
	CHECK(took >= 700 && took < 5000);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	return tu_done("postgres_clock");
}
