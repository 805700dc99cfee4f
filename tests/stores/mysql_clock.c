/*
 * A client clock far ahead cannot steal a table-mode MySQL lock.
 *
 *   mysql_clock FAKETIME          (the test; URI from $DLOCK_TEST_URI_FILE)
 *   mysql_clock --child CMD URI   (run by the test under `faketime -f +10d`)
 *
 * The parent holds a lock with a 20 s lease. A second process whose wall
 * clock libfaketime sets 10 days ahead tries to take it: if any expiry were
 * judged on a client clock it would find the lease long over. It must get
 * DLOCK_ELOCKED (and DLOCK_ETIMEOUT when it waits). After the parent releases,
 * the skewed client takes the lock with a 20 s lease, and the server reports
 * about 20 s left, not 10 days: the lease is the server's.
 */
#include "testutil/testutil.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static char uri[1024];

static long long wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void read_uri(void)
{
	tu_uri_from_env(uri, sizeof uri, "mysql_clock");
}

/* The child: one command, one line of output "wall=<ms> rc=<code> fence=<n> handle=<h>". */
static int child(const char *cmd, const char *u)
{
	dlock_store *s;
	if (dlock_store_open(&s, u) != 0) {
		printf("wall=%lld rc=%d fence=0 handle=-\n", wall_ms(), dlock_error_last()->code);
		return 0;
	}
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	dlock_lock *l;
	dlock_lock_new(&l, s, "clock-skew", &o);
	int rc = dlock_acquire(l, strcmp(cmd, "wait") == 0 ? 2000 : 0);
	char *handle = NULL;
	uint64_t fence = dlock_fence(l);
	if (rc == 0 && strcmp(cmd, "take") == 0)
		dlock_lock_detach(l, &handle); /* leave it held for the parent to inspect */
	printf("wall=%lld rc=%d fence=%llu handle=%s\n", wall_ms(), rc, (unsigned long long)fence,
	       handle ? handle : "-");
	dlock_free(handle);
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

typedef struct result {
	long long wall;
	int rc;
	unsigned long long fence;
	char handle[256];
} result;

static int run_child(const char *faketime, const char *cmd, result *r)
{
	char self[1024], line[1024], shell[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -1;
	self[n] = '\0';
	/* For sanitizer builds: libfaketime is preloaded ahead of a shared ASan runtime
	 * (gcc), and clang's allocator must not call clock_gettime while it holds its
	 * lock (libfaketime's lazy dlsym would malloc there and deadlock). */
	snprintf(shell, sizeof(shell),
		 "ASAN_OPTIONS=verify_asan_link_order=0:allocator_release_to_os_interval_ms=-1 "
		 "FAKETIME_DONT_FAKE_MONOTONIC=1 '%s' -f +10d '%s' --child %s '%s'",
		 faketime, self, cmd, uri);
	FILE *p = popen(shell, "r");
	if (!p)
		return -1;
	int got = fgets(line, sizeof(line), p) != NULL;
	int st = pclose(p);
	if (!got || st != 0) {
		fprintf(stderr, "child '%s' failed (status %d)\n", cmd, st);
		return -1;
	}
	if (sscanf(line, "wall=%lld rc=%d fence=%llu handle=%255s", &r->wall, &r->rc, &r->fence, r->handle) != 4) {
		fprintf(stderr, "child '%s' printed: %s", cmd, line);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "--child") == 0)
		return child(argv[2], argv[3]);
	if (argc != 2 || access(argv[1], X_OK) != 0) {
		fprintf(stderr, "usage: mysql_clock FAKETIME (got '%s': install faketime)\n", argc > 1 ? argv[1] : "");
		return 1;
	}
	read_uri();
	const long long ten_days = 10LL * 24 * 3600 * 1000;

	dlock_store *s;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("mysql_clock");
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "clock-skew", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t f1 = dlock_fence(l);

	result r;
	CHECK(run_child(argv[1], "try", &r) == 0);
	/* The child's clock really is 10 days ahead ... */
	CHECK(r.wall - wall_ms() > ten_days - 60000);
	/* ... and still it cannot take the lock. */
	CHECK(r.rc == DLOCK_ELOCKED);
	printf("  client 10 days ahead, try once: %s\n", dlock_error_name(r.rc));
	CHECK(run_child(argv[1], "wait", &r) == 0);
	CHECK(r.rc == DLOCK_ETIMEOUT);
	printf("  client 10 days ahead, wait 2 s: %s\n", dlock_error_name(r.rc));
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);

	/* Now the skewed client takes it; the lease it gets is 20 s of server time. */
	CHECK(run_child(argv[1], "take", &r) == 0);
	CHECK(r.rc == 0 && r.fence > f1);
	const char *names[] = { "clock-skew" };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, names, 1, &st, &n), 0);
	CHECK(n == 1 && st[0].nholders == 1);
	if (n == 1 && st[0].nholders == 1) {
		int64_t left = st[0].holders[0].ttl_left_ms;
		printf("  lease taken by the skewed client: %lld ms left on the server's clock\n", (long long)left);
		CHECK(left > 10000 && left <= 20000);
	}
	dlock_status_free(st, n);
	/* Owner-checked: the parent ends that hold only through the child's handle. */
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	dlock_lock *l2;
	CHECK_RC(dlock_lock_new(&l2, s, "clock-skew", &o), 0);
	CHECK_RC(dlock_lock_attach(l2, r.handle), 0);
	CHECK_RC(dlock_release(l2), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l2);
	dlock_lock_free(l);
	dlock_store_close(s);
	return tu_done("mysql_clock");
}
