/*
 * The store conformance suite: the guarantees of include/dlock/lock.h, checked
 * against a real store given by URI:
 *
 *   conformance [URI [CASE...]]     (URI defaults to the contents of the
 *                                    file named by $DLOCK_TEST_URI_FILE)
 *
 * Every contender is a separate process with its own store handle. A store
 * that cannot offer a feature returns DLOCK_ENOTSUPPORTED; the suite prints
 * "UNSUPPORTED <case>: <the store's reason>" and goes on. Anything else that
 * goes wrong is a failure.
 */
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <dlock/sys/backend.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef DLOCK_TEST_SQLITE3
#include <sqlite3.h>
#endif

static char uri[4096];
static char tmpdir[256];
static char run_id[32];
static int unsupported;

typedef struct {
	int rd, wr;
} event;

/* ---------------------------------------------------------------- helpers */

static void chaos_resume(void);

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (last error: %s: %s)\n", dlock_error_name(dlock_error_last()->code),
		dlock_error_last()->message);
	chaos_resume();
	_exit(99);
}

static dlock_store *open_store(void)
{
	dlock_store *s = NULL;
	if (dlock_store_open(&s, uri) != 0)
		die("cannot open store");
	return s;
}

static void lock_name(char *buf, size_t n, const char *c)
{
	snprintf(buf, n, "conf-%s-%s", run_id, c);
}

static dlock_lock *new_lock(dlock_store *s, const char *name, dlock_mode mode, unsigned permits, int fair, int64_t ttl)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.mode = mode;
	o.permits = permits;
	o.fair = fair;
	o.ttl_ms = ttl;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0)
		die("dlock_lock_new(%s)", name);
	return l;
}

static char *path(const char *file)
{
	static char buf[4][512];
	static int i;
	i = (i + 1) % 4;
	snprintf(buf[i], sizeof(buf[i]), "%s/%s", tmpdir, file);
	return buf[i];
}

static long read_long(const char *file)
{
	FILE *f = fopen(path(file), "r");
	long v = 0;
	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static void write_long(const char *file, long v)
{
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s.w%d", path(file), (int)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		die("write %s", tmp);
	fprintf(f, "%ld\n", v);
	fclose(f);
	rename(tmp, path(file));
}

static void append_line(const char *file, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	int fd = open(path(file), O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (fd < 0 || write(fd, line, (size_t)n) != n)
		die("append %s", file);
	close(fd);
}

static event ev_a, ev_b;
static char self_exe[4096];

/* Contenders are fresh processes (fork + exec of this program), so none
 * inherits a store, a renewal thread or a connection from the parent. */
struct child_entry {
	const char *name;
	int (*fn)(long);
};

static pid_t spawn_named(const char *fname, long arg)
{
	char a[32], fds[4][16];
	snprintf(a, sizeof(a), "%ld", arg);
	snprintf(fds[0], 16, "%d", ev_a.rd);
	snprintf(fds[1], 16, "%d", ev_a.wr);
	snprintf(fds[2], 16, "%d", ev_b.rd);
	snprintf(fds[3], 16, "%d", ev_b.wr);
	char *argv[] = { self_exe, "--child", uri,    tmpdir, run_id, (char *)fname,
			 a,        fds[0],    fds[1], fds[2], fds[3], NULL };
	pid_t p = tu_spawn_self(argv, NULL, NULL);
	if (p < 0)
		die("fork");
	/* Only the child writes ev_a: if it dies, our read of ev_a sees EOF instead of hanging. */
	if (ev_a.wr >= 0) {
		close(ev_a.wr);
		ev_a.wr = -1;
	}
	return p;
}

#define spawn(fn, arg) spawn_named(#fn, arg)

#define reap tu_reap

static int reap_all(pid_t *p, int n)
{
	int bad = 0;
	for (int i = 0; i < n; i++) {
		int rc = reap(p[i]);
		if (rc) {
			fprintf(stderr, "contender %d exited with %d\n", i, rc);
			bad++;
		}
	}
	return bad;
}

/* A pipe used as an event: the child writes one byte when something happened. */

static event event_new(void)
{
	int fd[2];
	if (pipe(fd) != 0)
		die("pipe");
	return (event){ fd[0], fd[1] };
}

static void event_signal(event e)
{
	char c = 1;
	if (write(e.wr, &c, 1) != 1)
		die("event write");
}

static void event_close(event *e)
{
	if (e->rd >= 0)
		close(e->rd);
	if (e->wr >= 0)
		close(e->wr);
	e->rd = e->wr = -1;
}

static int event_wait(event e)
{
	char c;
	return read(e.rd, &c, 1) == 1;
}

/* Wait until status shows `want` waiters on name; returns 0 if the store cannot say. */
static int wait_waiters(dlock_store *s, const char *name, size_t want, int ms)
{
	long long until = tu_now_ms() + ms;
	const char *names[] = { name };
	while (tu_now_ms() < until) {
		dlock_lock_status *st;
		size_t n;
		int rc = dlock_store_status(s, names, 1, &st, &n);
		if (rc == DLOCK_ENOTSUPPORTED)
			return 0;
		size_t w = rc == 0 && n == 1 ? st[0].waiters : 0;
		dlock_status_free(st, n);
		if (w >= want)
			return 1;
		usleep(5000);
	}
	return -1;
}

static int is_unsupported(int rc, const char *what)
{
	if (rc != DLOCK_ENOTSUPPORTED)
		return 0;
	printf("UNSUPPORTED %s: %s\n", what, dlock_error_last()->message);
	unsupported++;
	return 1;
}

/* ---------------------------------------------------------------- cases */

/* 16 processes x 100 increments of a plain file under the lock: exactly 1600, and the
 * fence of every increment is higher than the one before it. (It was 200
 * rounds; the case runs alone on every store, so its time is the suite's,
 * and 1600 hand-offs among 16 processes still make every one a race.) */
#define MUTEX_PROCS 16
#define MUTEX_ROUNDS 100

static int mutex_child(long i)
{
	char name[128];
	lock_name(name, sizeof(name), "mutex");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	/* A store that does not answer in time (a loaded machine, a cluster's
	 * election) is not what this case is about: such a try is made again,
	 * within two minutes in all, and a release whose outcome is unknown is
	 * left to the core's retries (the lock is then free by its TTL at the
	 * latest). Two holders would still show in the counter and the fences. */
	long long give_up = tu_now_ms() + 120000;
	for (int r = 0; r < MUTEX_ROUNDS; r++) {
		int rc;
		while ((rc = dlock_acquire(l, 60000)) == DLOCK_EUNAVAILABLE && tu_now_ms() < give_up)
			;
		if (rc != 0)
			die("mutex child %ld: acquire", i);
		long v = read_long("counter");
		sched_yield();
		write_long("counter", v + 1);
		append_line("fences", "%llu\n", (unsigned long long)dlock_fence(l));
		rc = dlock_release(l);
		if (rc != 0 && rc != DLOCK_EUNAVAILABLE)
			die("mutex child %ld: release", i);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

static void case_mutual_exclusion(void)
{
	write_long("counter", 0);
	unlink(path("fences"));
	pid_t p[MUTEX_PROCS];
	for (int i = 0; i < MUTEX_PROCS; i++)
		p[i] = spawn(mutex_child, i);
	CHECK(reap_all(p, MUTEX_PROCS) == 0);
	long total = read_long("counter");
	if (total != MUTEX_PROCS * MUTEX_ROUNDS)
		fprintf(stderr, "counter is %ld, wanted %d\n", total, MUTEX_PROCS * MUTEX_ROUNDS);
	CHECK(total == MUTEX_PROCS * MUTEX_ROUNDS);
	FILE *f = fopen(path("fences"), "r");
	unsigned long long prev = 0, cur;
	long n = 0, bad = 0;
	while (f && fscanf(f, "%llu", &cur) == 1) {
		if (cur <= prev)
			bad++;
		prev = cur;
		n++;
	}
	if (f)
		fclose(f);
	CHECK(n == MUTEX_PROCS * MUTEX_ROUNDS);
	CHECK(bad == 0);
}

static void case_owner_only(void)
{
	char name[128];
	lock_name(name, sizeof(name), "owner");
	dlock_store *s = open_store();
	dlock_lock *a = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	dlock_lock *b = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fence = dlock_fence(a);
	/* Not held by b: release and extend refuse and change nothing. */
	CHECK_RC(dlock_release(b), DLOCK_ENOTHELD);
	CHECK_RC(dlock_extend(b, 0), DLOCK_ENOTHELD);
	/* A forged handle naming another owner: the store refuses. */
	char forged[128];
	snprintf(forged, sizeof(forged), "dl1.x.1.%llu.5000.%s-999999", (unsigned long long)fence,
		 dlock_store_client_id(s));
	CHECK_RC(dlock_lock_attach(b, forged), 0);
	CHECK_RC(dlock_extend(b, 0), DLOCK_ENOTHELD);
	CHECK_RC(dlock_lock_attach(b, forged), 0);
	CHECK_RC(dlock_release(b), DLOCK_ENOTHELD);
	/* From another process as well. */
	dlock_store *s2 = open_store();
	dlock_lock *c = new_lock(s2, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	CHECK_RC(dlock_acquire(c, 0), DLOCK_ELOCKED);
	CHECK(dlock_held(a) && dlock_fence(a) == fence);
	CHECK_RC(dlock_extend(a, 6000), 0);
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(c, 0), 0);
	CHECK(dlock_fence(c) > fence);
	CHECK_RC(dlock_release(c), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_lock_free(c);
	dlock_store_close(s2);
	dlock_store_close(s);
}

static void case_reentrancy_and_fences(void)
{
	char name[128];
	lock_name(name, sizeof(name), "reenter");
	dlock_store *s = open_store();
	dlock_lock *a = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	dlock_lock *b = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	uint64_t last = 0;
	for (int i = 0; i < 10; i++) {
		dlock_lock *l = i % 2 ? a : b;
		CHECK_RC(dlock_acquire(l, 5000), 0);
		uint64_t f = dlock_fence(l);
		CHECK(f > last);
		CHECK_RC(dlock_acquire(l, 0), 0); /* reentrant: same fence */
		CHECK(dlock_fence(l) == f);
		CHECK_RC(dlock_release(l), 0);
		CHECK(dlock_held(l));
		CHECK_RC(dlock_acquire(i % 2 ? b : a, 0), DLOCK_ELOCKED);
		CHECK_RC(dlock_release(l), 0);
		CHECK(!dlock_held(l));
		last = f;
	}
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s);
}

static int holder_then_hang(long ttl)
{
	char name[128];
	lock_name(name, sizeof(name), "killed");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	if (dlock_acquire(l, 0) != 0)
		die("killed holder: acquire");
	event_signal(ev_a);
	for (;;)
		pause();
	return 0;
}

static void case_killed_holder(void)
{
	const long ttl = 2000;
	char name[128];
	lock_name(name, sizeof(name), "killed");
	ev_a = event_new();
	pid_t p = spawn(holder_then_hang, ttl);
	CHECK(event_wait(ev_a));
	long long t0 = tu_now_ms();
	kill(p, SIGKILL);
	reap(p);
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	if (dlock_store_session_bound(s)) {
		/* The hold dies with the holder's session: at once if the server sees the
		 * connection close (advisory locks), else when the session times out. */
		CHECK_RC(dlock_acquire(l, ttl + 4000), 0);
	} else {
		CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED); /* still leased */
		CHECK_RC(dlock_acquire(l, ttl + 4000), 0);
	}
	long long took = tu_now_ms() - t0;
	printf("  killed holder replaced after %lld ms (ttl %ld ms)\n", took, ttl);
	CHECK(took <= ttl + 4000);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	event_close(&ev_a);
}

static atomic_int lost_fired;

static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	lost_fired = 1;
}

/* Holds with a short TTL, gets stopped past it by the parent, then reports:
 * exit 0 if on_lost fired, held() is false and release fails. */
static int paused_holder(long ttl)
{
	char name[128];
	lock_name(name, sizeof(name), "paused");
	dlock_store *s = open_store();
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = on_lost;
	dlock_lock *l;
	if (dlock_lock_new(&l, s, name, &o) != 0 || dlock_acquire(l, 0) != 0)
		die("paused holder: acquire");
	event_signal(ev_a);
	event_wait(ev_b); /* the parent stops us before writing this, continues us after */
	long long until = tu_now_ms() + 5000;
	while (!lost_fired && tu_now_ms() < until)
		usleep(1000);
	int rc = dlock_release(l);
	int ok = lost_fired && !dlock_held(l) && (rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD);
	if (!ok)
		fprintf(stderr, "paused holder: lost_fired=%d held=%d release=%s\n", (int)lost_fired, dlock_held(l),
			dlock_error_name(rc));
	dlock_lock_free(l);
	dlock_store_close(s);
	return ok ? 0 : 1;
}

static void case_paused_holder(void)
{
	const long ttl = 1000;
	char name[128];
	lock_name(name, sizeof(name), "paused");
	ev_a = event_new();
	ev_b = event_new();
	pid_t p = spawn(paused_holder, ttl);
	CHECK(event_wait(ev_a));
	tu_stop(p);
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
	CHECK_RC(dlock_acquire(l, ttl + 4000), 0); /* granted once the stopped holder's lease ends */
	event_signal(ev_b);
	kill(p, SIGCONT);
	CHECK(reap(p) == 0);
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	event_close(&ev_a);
	event_close(&ev_b);
}

static void case_try_and_timeout(void)
{
	char name[128];
	lock_name(name, sizeof(name), "timeout");
	dlock_store *s = open_store();
	dlock_lock *a = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	dlock_lock *b = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
	long long try_ms = tu_now_ms() - t0;
	CHECK(try_ms < 1000);
	t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(b, 700), DLOCK_ETIMEOUT);
	long long waited = tu_now_ms() - t0;
	printf("  try-once answered in %lld ms; a 700 ms wait returned after %lld ms\n", try_ms, waited);
	CHECK(waited >= 700 && waited < 700 + 1500);
	CHECK(dlock_held(a));
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s);
}

/* Waiting costs nothing while nothing changes: a waiter on a held lock makes
 * one try per refresh of its registration (every second), counted with
 * dlock_store_requests, on every store that wakes waiters; a store that
 * polls says so and is only measured. Unfair and fair waiters both. */
static void case_quiet_wait(void)
{
	char name[128];
	lock_name(name, sizeof(name), "quiet");
	dlock_store *s = open_store();
	dlock_store *w = open_store();
	CHECK(dlock_store_requests(NULL) == 0);
	dlock_lock *h = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 30000);
	CHECK_RC(dlock_acquire(h, 0), 0);
	const int64_t wait_ms = 2500;
	for (int fair = 0; fair <= 1; fair++) {
		dlock_lock *b = new_lock(w, name, DLOCK_EXCLUSIVE, 1, fair, 30000);
		uint64_t before = dlock_store_requests(w);
		uint64_t holder_before = dlock_store_requests(s);
		int rc = dlock_acquire(b, wait_ms);
		uint64_t made = dlock_store_requests(w) - before;
		dlock_lock_free(b);
		if (fair && is_unsupported(rc, "fair"))
			break;
		CHECK_RC(rc, DLOCK_ETIMEOUT);
		/* the holder's handle made no request either (its renewal is due at 10 s) */
		CHECK(dlock_store_requests(s) == holder_before);
		printf("  %s waiter, %lld ms on a held lock: %llu requests (%s)\n", fair ? "fair" : "unfair",
		       (long long)wait_ms, (unsigned long long)made,
		       dlock_store_wakes_waiters(w) ? "the store wakes waiters" : "the store polls");
		CHECK(made >= 2); /* a first try and the cancel of its registration at least */
		/* One cycle a second (a try, and a blocking wait where the store has
		 * one: MySQL's GET_LOCK ends a little early, so the wait's last
		 * fraction of a second may take up to three short cycles), plus the
		 * cancel. Polling stores back off to a look every 25-50 ms: at most
		 * one per 10 ms on average (a fair head's early looks included). */
		if (dlock_store_wakes_waiters(w))
			CHECK(made <= 2 * (uint64_t)(wait_ms / 1000 + 1) + 6 + 1);
		else
			CHECK(made <= (uint64_t)wait_ms / 10);
	}
	CHECK_RC(dlock_release(h), 0);
	dlock_lock_free(h);
	dlock_store_close(w);
	dlock_store_close(s);
}

/* Fair mode: waiters queued one after another are granted in that order. */
#define FAIR_WAITERS 5

static int fair_waiter(long i)
{
	char name[128];
	lock_name(name, sizeof(name), "fair");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 1, 10000);
	int rc = dlock_acquire(l, 30000);
	if (rc == DLOCK_ENOTSUPPORTED)
		return 42;
	if (rc != 0)
		die("fair waiter %ld: acquire", i);
	append_line("fair-order", "%ld\n", i);
	usleep(20000);
	if (dlock_release(l) != 0)
		die("fair waiter %ld: release", i);
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

static void case_fair_order(void)
{
	char name[128];
	lock_name(name, sizeof(name), "fair");
	dlock_store *s = open_store();
	dlock_lock *h = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 1, 10000);
	int rc = dlock_acquire(h, 0);
	if (is_unsupported(rc, "fair")) {
		dlock_lock_free(h);
		dlock_store_close(s);
		return;
	}
	CHECK_RC(rc, 0);
	unlink(path("fair-order"));
	pid_t p[FAIR_WAITERS];
	for (int i = 0; i < FAIR_WAITERS; i++) {
		p[i] = spawn(fair_waiter, i);
		/* queue them one at a time: the next starts once this one is registered */
		int w = wait_waiters(s, name, (size_t)i + 1, 10000);
		CHECK(w != -1);
		if (w == 0)
			usleep(300000); /* the store cannot report waiters: give it time to queue */
	}
	CHECK_RC(dlock_release(h), 0);
	CHECK(reap_all(p, FAIR_WAITERS) == 0);
	FILE *f = fopen(path("fair-order"), "r");
	long v, want = 0;
	int bad = 0, n = 0;
	while (f && fscanf(f, "%ld", &v) == 1) {
		if (v != want)
			bad++;
		want++;
		n++;
	}
	if (f)
		fclose(f);
	if (bad)
		fprintf(stderr, "fair mode granted out of request order\n");
	CHECK(n == FAIR_WAITERS && bad == 0);
	dlock_lock_free(h);
	dlock_store_close(s);
}

static int shared_writer(long unused)
{
	(void)unused;
	char name[128];
	lock_name(name, sizeof(name), "rw");
	dlock_store *s = open_store();
	dlock_lock *w = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	if (dlock_acquire(w, 30000) != 0)
		die("writer: acquire");
	append_line("rw-log", "writer\n");
	event_signal(ev_a);
	event_wait(ev_b);
	dlock_release(w);
	dlock_lock_free(w);
	dlock_store_close(s);
	return 0;
}

static void case_shared(void)
{
	char name[128];
	lock_name(name, sizeof(name), "rw");
	dlock_store *s = open_store();
	dlock_lock *r[3];
	for (int i = 0; i < 3; i++)
		r[i] = new_lock(s, name, DLOCK_SHARED, 1, 0, 10000);
	int rc = dlock_acquire(r[0], 0);
	if (is_unsupported(rc, "shared")) {
		for (int i = 0; i < 3; i++)
			dlock_lock_free(r[i]);
		dlock_store_close(s);
		return;
	}
	CHECK_RC(rc, 0);
	CHECK_RC(dlock_acquire(r[1], 0), 0); /* readers together */
	uint64_t f0 = dlock_fence(r[0]), f1 = dlock_fence(r[1]);
	CHECK(f1 > f0);
	dlock_store *s2 = open_store();
	dlock_lock *w = new_lock(s2, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	CHECK_RC(dlock_acquire(w, 0), DLOCK_ELOCKED); /* writer excluded by readers */

	/* A writer starts waiting: new readers must now queue behind it. */
	unlink(path("rw-log"));
	ev_a = event_new();
	ev_b = event_new();
	pid_t p = spawn(shared_writer, 0);
	int ww = wait_waiters(s, name, 1, 10000);
	CHECK(ww != -1);
	if (ww == 0)
		usleep(500000);
	CHECK_RC(dlock_acquire(r[2], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(r[0]), 0);
	CHECK_RC(dlock_release(r[1]), 0);
	CHECK(event_wait(ev_a)); /* writer got it once the readers left */
	CHECK_RC(dlock_acquire(r[2], 0), DLOCK_ELOCKED); /* writer alone */
	CHECK_RC(dlock_acquire(w, 0), DLOCK_ELOCKED);
	event_signal(ev_b);
	CHECK(reap(p) == 0);
	CHECK_RC(dlock_acquire(r[2], 5000), 0);
	CHECK_RC(dlock_release(r[2]), 0);
	for (int i = 0; i < 3; i++)
		dlock_lock_free(r[i]);
	dlock_lock_free(w);
	dlock_store_close(s2);
	dlock_store_close(s);
	event_close(&ev_a);
	event_close(&ev_b);
}

/* Semaphore: 8 processes, 3 permits. A file-locked gauge counts holders at once. */
#define SEM_PROCS 8
#define SEM_PERMITS 3
#define SEM_ROUNDS 15

static void gauge(int delta)
{
	int fd = open(path("gauge.lock"), O_RDWR | O_CREAT, 0600);
	flock(fd, LOCK_EX);
	long cur = read_long("gauge") + delta;
	write_long("gauge", cur);
	if (cur > read_long("gauge-max"))
		write_long("gauge-max", cur);
	flock(fd, LOCK_UN);
	close(fd);
}

static int sem_child(long i)
{
	char name[128];
	lock_name(name, sizeof(name), "sem");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, SEM_PERMITS, 0, 10000);
	for (int r = 0; r < SEM_ROUNDS; r++) {
		int rc = dlock_acquire(l, 60000);
		if (rc == DLOCK_ENOTSUPPORTED)
			return 42;
		if (rc != 0)
			die("semaphore child %ld: acquire", i);
		gauge(+1);
		usleep(3000);
		gauge(-1);
		if (dlock_release(l) != 0)
			die("semaphore child %ld: release", i);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

static void case_semaphore(void)
{
	char name[128];
	lock_name(name, sizeof(name), "sem");
	dlock_store *s = open_store();
	dlock_lock *probe = new_lock(s, name, DLOCK_EXCLUSIVE, SEM_PERMITS, 0, 10000);
	int rc = dlock_acquire(probe, 0);
	if (is_unsupported(rc, "semaphore")) {
		dlock_lock_free(probe);
		dlock_store_close(s);
		return;
	}
	CHECK_RC(rc, 0);
	/* N permits: N holders at once, the next one refused. */
	dlock_lock *more[SEM_PERMITS];
	for (int i = 0; i < SEM_PERMITS; i++)
		more[i] = new_lock(s, name, DLOCK_EXCLUSIVE, SEM_PERMITS, 0, 10000);
	for (int i = 0; i < SEM_PERMITS - 1; i++)
		CHECK_RC(dlock_acquire(more[i], 0), 0);
	CHECK_RC(dlock_acquire(more[SEM_PERMITS - 1], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(probe), 0);
	for (int i = 0; i < SEM_PERMITS - 1; i++)
		CHECK_RC(dlock_release(more[i]), 0);

	write_long("gauge", 0);
	write_long("gauge-max", 0);
	pid_t p[SEM_PROCS];
	for (int i = 0; i < SEM_PROCS; i++)
		p[i] = spawn(sem_child, i);
	CHECK(reap_all(p, SEM_PROCS) == 0);
	long max = read_long("gauge-max");
	printf("  semaphore of %d: at most %ld holders at once\n", SEM_PERMITS, max);
	CHECK(max <= SEM_PERMITS);
	CHECK(max >= 2); /* permits really are shared */
	for (int i = 0; i < SEM_PERMITS; i++)
		dlock_lock_free(more[i]);
	dlock_lock_free(probe);
	dlock_store_close(s);
}

/* Mixed permits on one name (issue 16 item 4). One rule on every store: a
 * request is granted only if (holders + 1) <= the smallest permits among the
 * holders and the requester; a mutex (permits 1) excludes everything. */
static void case_permits_mixed(void)
{
	char name[128];
	dlock_store *s = open_store();
	dlock_lock *l[4];

	/* Two holders of 2: a third asking 3 is refused (the holders' 2 applies). */
	lock_name(name, sizeof(name), "permits-a");
	l[0] = new_lock(s, name, DLOCK_EXCLUSIVE, 2, 0, 10000);
	int rc = dlock_acquire(l[0], 0);
	if (is_unsupported(rc, "permits_mixed")) {
		dlock_lock_free(l[0]);
		dlock_store_close(s);
		return;
	}
	CHECK_RC(rc, 0);
	l[1] = new_lock(s, name, DLOCK_EXCLUSIVE, 2, 0, 10000);
	l[2] = new_lock(s, name, DLOCK_EXCLUSIVE, 3, 0, 10000);
	CHECK_RC(dlock_acquire(l[1], 0), 0);
	CHECK_RC(dlock_acquire(l[2], 0), DLOCK_ELOCKED);
	for (int i = 0; i < 3; i++) {
		dlock_release(l[i]);
		dlock_lock_free(l[i]);
	}

	/* A holder of 3 admits a caller of 2 (2 holders <= 2), and a third
	 * holder of 3 then neither a caller of 3 (the holder of 2 limits) nor of 2. */
	lock_name(name, sizeof(name), "permits-b");
	l[0] = new_lock(s, name, DLOCK_EXCLUSIVE, 3, 0, 10000);
	l[1] = new_lock(s, name, DLOCK_EXCLUSIVE, 2, 0, 10000);
	l[2] = new_lock(s, name, DLOCK_EXCLUSIVE, 3, 0, 10000);
	l[3] = new_lock(s, name, DLOCK_EXCLUSIVE, 2, 0, 10000);
	CHECK_RC(dlock_acquire(l[0], 0), 0);
	CHECK_RC(dlock_acquire(l[1], 0), 0);
	CHECK_RC(dlock_acquire(l[2], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(l[3], 0), DLOCK_ELOCKED);
	/* Two holders of 3: a caller of 2 is refused, one of 3 admitted. */
	CHECK_RC(dlock_release(l[1]), 0);
	CHECK_RC(dlock_acquire(l[2], 0), 0);
	CHECK_RC(dlock_acquire(l[3], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(l[1], 0), DLOCK_ELOCKED);
	for (int i = 0; i < 4; i++) {
		dlock_release(l[i]);
		dlock_lock_free(l[i]);
	}

	/* A mutex beside a semaphore holder is refused, both ways. */
	lock_name(name, sizeof(name), "permits-c");
	l[0] = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	l[1] = new_lock(s, name, DLOCK_EXCLUSIVE, 3, 0, 10000);
	CHECK_RC(dlock_acquire(l[0], 0), 0);
	CHECK_RC(dlock_acquire(l[1], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(l[0]), 0);
	CHECK_RC(dlock_acquire(l[1], 0), 0);
	CHECK_RC(dlock_acquire(l[0], 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(l[1]), 0);
	CHECK_RC(dlock_acquire(l[0], 0), 0);
	CHECK_RC(dlock_release(l[0]), 0);
	dlock_lock_free(l[0]);
	dlock_lock_free(l[1]);
	dlock_store_close(s);
}

static void case_status(void)
{
	char name[128];
	lock_name(name, sizeof(name), "status");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	CHECK_RC(dlock_acquire(l, 0), 0);
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int rc = dlock_store_status(s, names, 1, &st, &n);
	if (!is_unsupported(rc, "status")) {
		CHECK_RC(rc, 0);
		CHECK(n == 1);
		if (n == 1) {
			CHECK(strcmp(st[0].name, name) == 0);
			CHECK(st[0].nholders == 1);
			if (st[0].nholders == 1) {
				CHECK(st[0].holders[0].fence == dlock_fence(l));
				CHECK(st[0].holders[0].pid == (int)getpid());
				CHECK(st[0].holders[0].ttl_left_ms > 0 && st[0].holders[0].ttl_left_ms <= 10000);
			}
		}
		dlock_status_free(st, n);
	}
	CHECK_RC(dlock_release(l), 0);
	rc = dlock_store_status(s, names, 1, &st, &n);
	if (rc == 0) {
		CHECK(n == 1 && st[0].nholders == 0);
		dlock_status_free(st, n);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void case_bad_input(void)
{
	dlock_store *s = open_store();
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "", NULL), DLOCK_EINVAL);
	char big[DLOCK_NAME_MAX + 2];
	memset(big, 'n', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	CHECK_RC(dlock_lock_new(&l, s, big, NULL), DLOCK_EINVAL);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = -1;
	CHECK_RC(dlock_lock_new(&l, s, "x", &o), DLOCK_EINVAL);
	CHECK(l == NULL);
	/* Names a store has to map (paths, quotes, long, non-ASCII) work and stay distinct. */
	const char *odd[] = { "a/b/../c", "quote'\"; DROP TABLE x; --", "ünïcødé/名前", "{braces}:colon", "%2F-percent",
			      big + 2 };
	dlock_lock *h[6];
	for (int i = 0; i < 6; i++) {
		char name[600];
		snprintf(name, sizeof(name), "%.20s%s", run_id, odd[i]);
		name[DLOCK_NAME_MAX] = '\0';
		h[i] = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
		CHECK_RC(dlock_acquire(h[i], 0), 0);
	}
	for (int i = 0; i < 6; i++) {
		CHECK(dlock_held(h[i]));
		CHECK_RC(dlock_release(h[i]), 0);
		dlock_lock_free(h[i]);
	}
	dlock_store_close(s);
}

/* Another process tries the "two-handles" lock once, opening and closing its
 * own store handle twice (as `dlock status` would): exit 0 if every try got
 * what `expect_free` says. */
static int other_process_try(long expect_free)
{
	char name[128];
	lock_name(name, sizeof(name), "two-handles");
	int ok = 1;
	for (int round = 0; round < 2; round++) {
		dlock_store *s = open_store();
		dlock_lock_status *st = NULL;
		size_t n = 0;
		const char *names[] = { name };
		if (dlock_store_status(s, names, 1, &st, &n) == 0)
			dlock_status_free(st, n);
		dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
		int rc = dlock_acquire(l, 0);
		if (expect_free ? rc != 0 : rc != DLOCK_ELOCKED) {
			fprintf(stderr, "other process, round %d: acquire gave %s\n", round, dlock_error_name(rc));
			ok = 0;
		}
		dlock_lock_free(l);
		dlock_store_close(s);
	}
	return ok ? 0 : 1;
}

/* Two store handles on one store in one process (two modules that each open
 * the default store), then another process: one holder at a time. */
static void case_two_handles(void)
{
	const long ttl = 1500;
	char name[128];
	lock_name(name, sizeof(name), "two-handles");
	dlock_store *s1 = open_store();
	dlock_lock *l1 = new_lock(s1, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	CHECK_RC(dlock_acquire(l1, 0), 0);
	dlock_store *s2 = open_store();
	dlock_lock *l2 = new_lock(s2, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	CHECK_RC(dlock_acquire(l2, 0), DLOCK_ELOCKED);
	dlock_lock_free(l2);
	dlock_store_close(s2); /* closing the second handle must not weaken the first's hold */
	CHECK(reap(spawn(other_process_try, 0)) == 0);
	/* Held across renewals after the second handle went. */
	long long until = tu_now_ms() + 2 * ttl;
	while (tu_now_ms() < until)
		usleep(50000);
	CHECK(dlock_held(l1));
	CHECK(reap(spawn(other_process_try, 0)) == 0);
	CHECK_RC(dlock_release(l1), 0);
	CHECK(reap(spawn(other_process_try, 1)) == 0);
	dlock_lock_free(l1);
	dlock_store_close(s1);
}

/* ------------------------------------------------------------ fork (issue 16)
 *
 * A store handle and its locks belong to the process that opened the store.
 * A fork()'s child that uses inherited handles gets DLOCK_EINVAL naming
 * fork() from every call, never a grant under the parent's identity, and
 * freeing them there ends nothing of the parent's (no release, no close of
 * its session). A store the child opens itself is a new owner. Children
 * report through their exit code: the number of wrong answers.
 */

#define FORK_CHECK(bad, cond)                                                                  \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "fork child %d: %s failed (%s: %s)\n", (int)getpid(), #cond, \
				dlock_error_name(dlock_error_last()->code),                     \
				dlock_error_last()->message);                                  \
			(bad)++;                                                               \
		}                                                                              \
	} while (0)

/* ThreadSanitizer refuses new threads in the child of a multi-threaded
 * fork (it dies: die_after_fork): there a child does not take a lock of
 * its own store (a grant starts the renewal threads). */
#if defined(__SANITIZE_THREAD__)
#define FORK_CHILD_THREADS 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FORK_CHILD_THREADS 0
#endif
#endif
#ifndef FORK_CHILD_THREADS
#define FORK_CHILD_THREADS 1
#endif

/* The last error is the fork rule's. */
static bool fork_error(void)
{
	const char *m = dlock_error_last()->message;
	return dlock_error_last()->code == DLOCK_EINVAL && strstr(m, "fork()") &&
	       strstr(m, "open a new store in the child");
}

static int fork_exit_code(int bad)
{
	return bad > 100 ? 100 : bad;
}

/* Every call on inherited handles is refused; then they are freed here. */
static int fork_inherited_calls(dlock_store *s, dlock_lock *l, const char *name)
{
	int bad = 0;
	FORK_CHECK(bad, !dlock_held(l) && dlock_fence(l) == 0 && dlock_ttl_left(l) == 0);
	FORK_CHECK(bad, dlock_acquire(l, 0) == DLOCK_EINVAL && fork_error());
	FORK_CHECK(bad, dlock_acquire(l, 300) == DLOCK_EINVAL && fork_error());
	FORK_CHECK(bad, dlock_extend(l, 0) == DLOCK_EINVAL && fork_error());
	FORK_CHECK(bad, dlock_release(l) == DLOCK_EINVAL && fork_error());
	char *h = NULL;
	FORK_CHECK(bad, dlock_lock_detach(l, &h) == DLOCK_EINVAL && h == NULL);
	dlock_lock *x = NULL;
	FORK_CHECK(bad, dlock_lock_new(&x, s, name, NULL) == DLOCK_EINVAL && x == NULL && fork_error());
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	FORK_CHECK(bad, dlock_store_status(s, names, 1, &st, &n) == DLOCK_EINVAL && fork_error());
	dlock_lock_free(l);   /* no release: the hold is the parent's */
	dlock_store_close(s); /* no close of the parent's connections or session */
	return bad;
}

/* A lock held in the parent: the child is refused, as a new owner too. */
static int fork_child_held(dlock_store *s, dlock_lock *l, const char *name)
{
	char parent_id[33];
	snprintf(parent_id, sizeof(parent_id), "%s", dlock_store_client_id(s));
	int bad = fork_inherited_calls(s, l, name);
	dlock_store *own = NULL;
	FORK_CHECK(bad, dlock_store_open(&own, uri) == 0);
	if (own) {
		FORK_CHECK(bad, strcmp(dlock_store_client_id(own), parent_id) != 0);
		dlock_lock *mine = new_lock(own, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
		FORK_CHECK(bad, dlock_acquire(mine, 0) == DLOCK_ELOCKED);
		dlock_lock_free(mine);
		dlock_store_close(own);
	}
	return bad;
}

/* Nothing held in the parent: refused through inherited handles; the child's
 * own store takes and frees the name (its fence in "fork-fence"). */
static int fork_child_idle(dlock_store *s, dlock_lock *l, const char *name)
{
	int bad = fork_inherited_calls(s, l, name);
	dlock_store *own = NULL;
	FORK_CHECK(bad, dlock_store_open(&own, uri) == 0);
	if (own && !FORK_CHILD_THREADS) {
		write_long("fork-fence", -1);
		dlock_store_close(own);
	} else if (own) {
		dlock_lock *mine = new_lock(own, name, DLOCK_EXCLUSIVE, 1, 0, 5000);
		FORK_CHECK(bad, dlock_acquire(mine, 5000) == 0 && dlock_held(mine) && dlock_fence(mine) > 0);
		write_long("fork-fence", (long)dlock_fence(mine));
		FORK_CHECK(bad, dlock_release(mine) == 0);
		dlock_lock_free(mine);
		dlock_store_close(own);
	}
	return bad;
}

/* Forked before any store was opened: each process opens its own and they
 * take turns incrementing a file under the lock. */
#define FORK_ROUNDS 25

static int fork_rounds(const char *name, const char *idfile)
{
	int bad = 0;
	dlock_store *s = open_store();
	append_line(idfile, "%s\n", dlock_store_client_id(s));
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	for (int r = 0; r < FORK_ROUNDS; r++) {
		int rc = dlock_acquire(l, 60000);
		FORK_CHECK(bad, rc == 0);
		if (rc != 0)
			break;
		long v = read_long("fork-counter");
		sched_yield();
		write_long("fork-counter", v + 1);
		append_line("fork-fences", "%llu\n", (unsigned long long)dlock_fence(l));
		FORK_CHECK(bad, dlock_release(l) == 0);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return bad;
}

static void case_fork(void)
{
	const long ttl = 1500;
	char name[128];

	/* 1. Forked after open, with a lock held in the parent. The fork comes
	 * right after the grant, so the renewer sleeps (next renewal at ttl/3). */
	lock_name(name, sizeof(name), "fork-held");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t fence = dlock_fence(l);
	tu_quiesce_before_fork();
	pid_t p = fork();
	if (p < 0)
		die("fork");
	if (p == 0)
		_exit(fork_exit_code(fork_child_held(s, l, name)));
	int code = tu_reap_within(p, 60000);
	if (code)
		fprintf(stderr, "fork after open, held: the child exited with %d\n", code);
	CHECK(code == 0);
	/* The child's exit and close ended nothing: held, renewed past 2 ttl. */
	dlock_store *s2 = open_store();
	dlock_lock *other = new_lock(s2, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	CHECK(dlock_held(l));
	CHECK_RC(dlock_acquire(other, 0), DLOCK_ELOCKED);
	long long until = tu_now_ms() + 2 * ttl + ttl / 2;
	while (tu_now_ms() < until)
		usleep(50000);
	CHECK(dlock_held(l) && dlock_fence(l) == fence);
	CHECK_RC(dlock_acquire(other, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_acquire(other, 5000), 0);
	CHECK(dlock_fence(other) > fence);
	CHECK_RC(dlock_release(other), 0);
	dlock_lock_free(other);
	dlock_lock_free(l);

	/* 2. Forked after open, nothing held: the child is refused through the
	 * inherited handles, takes the name through its own store, and the
	 * parent takes it after with a higher fence. */
	lock_name(name, sizeof(name), "fork-idle");
	l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	write_long("fork-fence", 0);
	tu_quiesce_before_fork();
	p = fork();
	if (p < 0)
		die("fork");
	if (p == 0)
		_exit(fork_exit_code(fork_child_idle(s, l, name)));
	code = tu_reap_within(p, 60000);
	if (code)
		fprintf(stderr, "fork after open, idle: the child exited with %d\n", code);
	CHECK(code == 0);
	long child_fence = read_long("fork-fence");
	if (child_fence < 0)
		printf("  fork: under ThreadSanitizer the child took no lock of its own store\n");
	CHECK(child_fence > 0 || (child_fence < 0 && !FORK_CHILD_THREADS));
	CHECK_RC(dlock_acquire(l, 5000), 0);
	CHECK((long)dlock_fence(l) > child_fence);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s2);
	dlock_store_close(s);

	/* 3. Forked before open: two independent owners, one holder at a time,
	 * fences increasing. */
	lock_name(name, sizeof(name), "fork-before");
	write_long("fork-counter", 0);
	unlink(path("fork-fences"));
	unlink(path("fork-ids"));
	fflush(NULL);
	p = fork();
	if (p < 0)
		die("fork");
	if (p == 0)
		_exit(fork_exit_code(fork_rounds(name, "fork-ids")));
	int bad = fork_rounds(name, "fork-ids");
	CHECK(bad == 0);
	code = tu_reap_within(p, 120000);
	if (code)
		fprintf(stderr, "fork before open: the child exited with %d\n", code);
	CHECK(code == 0);
	CHECK(read_long("fork-counter") == 2 * FORK_ROUNDS);
	FILE *f = fopen(path("fork-fences"), "r");
	unsigned long long prev = 0, cur;
	long n = 0, out_of_order = 0;
	while (f && fscanf(f, "%llu", &cur) == 1) {
		out_of_order += cur <= prev;
		prev = cur;
		n++;
	}
	if (f)
		fclose(f);
	CHECK(n == 2 * FORK_ROUNDS && out_of_order == 0);
	char ids[2][64] = { "", "" };
	f = fopen(path("fork-ids"), "r");
	CHECK(f && fscanf(f, "%63s %63s", ids[0], ids[1]) == 2);
	if (f)
		fclose(f);
	CHECK(ids[0][0] && strcmp(ids[0], ids[1]) != 0);
}

/* ------------------------------------------------- the network lies (issue 15)
 *
 * Each case puts src/tools/faultproxy.c between one client and the real
 * servers (every host of the URI, one route each) and faults that client's
 * connections only; the other clients talk to the servers directly. SQLite
 * has no network: its "blackhole" is another process that holds the
 * database's write lock and never lets go (a hung peer), and lost replies,
 * delays and resets do not apply to a local file.
 */

#define NET_TIMEOUT_MS 300   /* the proxied client's request timeout (timeout=) */
#define NET_CONNECT_MS 500   /* and its connect_timeout */

typedef struct net {
	tu_proxy *px;
	char uri[4096];   /* the proxied URI (with timeout= and connect_timeout=) */
	pid_t sqlite_hog; /* sqlite: the process holding the write lock */
} net;

static bool is_sqlite(void)
{
	return strncmp(uri, "sqlite:", 7) == 0;
}

static void with_options(char *out, size_t n, const char *base, long timeout, long connect)
{
	if (snprintf(out, n, "%s%stimeout=%ldms&connect_timeout=%ldms", base, strchr(base, '?') ? "&" : "?", timeout,
		     connect) >= (int)n)
		die("URI too long");
}

static int net_start(net *nt, long timeout, long connect)
{
	memset(nt, 0, sizeof(*nt));
	nt->sqlite_hog = -1;
	if (is_sqlite()) {
		with_options(nt->uri, sizeof(nt->uri), uri, timeout, connect);
		return 0;
	}
	char *proxied = NULL;
	nt->px = tu_proxy_start(uri, &proxied);
	if (!nt->px)
		return -1;
	with_options(nt->uri, sizeof(nt->uri), proxied, timeout, connect);
	free(proxied);
	return 0;
}

/* The database path of a sqlite: URI (for the hog). */
static const char *sqlite_path(void)
{
	const char *p = uri + 7;
	if (strncmp(p, "//", 2) == 0)
		p += 2;
	static char buf[4096];
	snprintf(buf, sizeof(buf), "%s", p);
	buf[strcspn(buf, "?")] = '\0';
	return buf;
}

/* "pass", "blackhole", "drop", "delay N", "reset". 1 when the mode does not
 * apply to this store (sqlite: all but pass and blackhole). */
static int net_set(net *nt, const char *mode)
{
	if (nt->px)
		return tu_proxy_set(nt->px, -1, mode) == 0 ? 0 : -1;
	if (strcmp(mode, "blackhole") == 0) {
#ifdef DLOCK_TEST_SQLITE3
		if (nt->sqlite_hog > 0)
			return 0;
		event e = event_new();
		pid_t p = fork();
		if (p == 0) {
			/* Another process takes the database's write lock and hangs. */
			sqlite3 *db = NULL;
			if (sqlite3_open_v2(sqlite_path(), &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
			    sqlite3_busy_timeout(db, 10000) != SQLITE_OK ||
			    sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK)
				_exit(3);
			event_signal(e);
			for (;;)
				pause();
		}
		int held = event_wait(e);
		event_close(&e);
		nt->sqlite_hog = p;
		return held ? 0 : -1;
#else
		return -1;
#endif
	}
	if (strcmp(mode, "pass") == 0) {
		if (nt->sqlite_hog > 0) {
			kill(nt->sqlite_hog, SIGKILL);
			waitpid(nt->sqlite_hog, NULL, 0);
			nt->sqlite_hog = -1;
		}
		return 0;
	}
	return 1;
}

static void net_stop(net *nt)
{
	if (nt->sqlite_hog > 0)
		net_set(nt, "pass");
	tu_proxy_stop(nt->px);
	nt->px = NULL;
}

static dlock_store *open_uri(const char *u)
{
	dlock_store *s = NULL;
	if (dlock_store_open(&s, u) != 0)
		die("cannot open store %s", u);
	return s;
}

/* The bound the core promises for a wait, wait + max(50 ms, 5 %), plus the
 * scheduling grace of a loaded CI machine. */
static long long slack(long long wait)
{
	return (wait / 20 > 50 ? wait / 20 : 50) + TU_SCHED_GRACE_MS;
}

typedef struct timed_acquire {
	dlock_lock *lock;
	long wait;
	int rc;
	long long started, ended;
	pthread_t t;
	bool then_release; /* a handle belongs to its thread: release there */
	bool retry_unavailable;
} timed_acquire;

static void *timed_acquire_main(void *arg)
{
	timed_acquire *a = arg;
	a->started = tu_now_ms();
	a->rc = dlock_acquire(a->lock, a->wait);
	/* A client that must have the lock tries again after "unavailable"
	 * (a first try answers it at once), for as long as its wait lasts. */
	while (a->retry_unavailable && a->rc == DLOCK_EUNAVAILABLE && tu_now_ms() - a->started < a->wait)
		a->rc = dlock_acquire(a->lock, a->wait - (tu_now_ms() - a->started));
	a->ended = tu_now_ms();
	if (a->rc == 0 && a->then_release && dlock_release(a->lock) != 0)
		a->rc = dlock_error_last()->code;
	return NULL;
}

static atomic_llong net_lost_at;

static void net_on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	long long zero = 0;
	atomic_compare_exchange_strong(&net_lost_at, &zero, tu_now_ms());
}

/* A hold through the fault proxy: the link, a store through it (faulty) and
 * one direct, and lock `a` on faulty whose on_lost is net_on_lost. */
typedef struct net_hold {
	net nt;
	dlock_store *direct, *faulty;
	dlock_lock *a;
} net_hold;

/* Set up h for lock `name` (ttl, the proxied client's timeout and connect
 * timeout) and clear net_lost_at. false, with nothing to stop, when the
 * proxy did not start (a failed check) or, when `no_link` is given, on a
 * store with no link to fault (sqlite): `no_link` says why. */
static bool net_hold_start(net_hold *h, const char *name, long ttl, long timeout, long connect, const char *no_link)
{
	if (net_start(&h->nt, timeout, connect) != 0) {
		CHECK(!"fault proxy did not start");
		return false;
	}
	if (no_link && !h->nt.px) {
		printf("  (%s)\n", no_link);
		net_stop(&h->nt);
		return false;
	}
	h->direct = open_store();
	h->faulty = open_uri(h->nt.uri);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = net_on_lost;
	if (dlock_lock_new(&h->a, h->faulty, name, &o) != 0)
		die("lock_new");
	net_lost_at = 0;
	return true;
}

/* Free h's lock (every other lock on its stores freed first), its stores and its link. */
static void net_hold_stop(net_hold *h)
{
	dlock_lock_free(h->a);
	dlock_store_close(h->faulty);
	dlock_store_close(h->direct);
	net_stop(&h->nt);
}

/* Open, acquire (mid-wait and from the start) and release while the network
 * is a black hole: each returns within its bound. */
static void case_net_bounds(void)
{
	char name[128];
	lock_name(name, sizeof(name), "net-bounds");
	net nt;
	if (net_start(&nt, NET_TIMEOUT_MS, NET_CONNECT_MS) != 0) {
		CHECK(!"fault proxy did not start");
		return;
	}
	dlock_store *direct = open_store();
	dlock_store *faulty = open_uri(nt.uri);
	dlock_lock *b = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 30000);
	dlock_lock *a = new_lock(faulty, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	CHECK_RC(dlock_acquire(b, 0), 0);

	/* A waiter whose network goes dark mid-wait. */
	timed_acquire ta = { a, 1500, 0, 0, 0, 0, false, false };
	pthread_create(&ta.t, NULL, timed_acquire_main, &ta);
	if (wait_waiters(direct, name, 1, 5000) < 0)
		CHECK(!"the proxied waiter never showed up as a waiter");
	CHECK(net_set(&nt, "blackhole") == 0);
	pthread_join(ta.t, NULL);
	long long took = ta.ended - ta.started;
	printf("  wait 1500 ms, network dark mid-wait: %s after %lld ms\n", dlock_error_name(ta.rc), took);
	CHECK(ta.rc == DLOCK_ETIMEOUT || ta.rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 1500 + slack(1500));

	/* Dark from the start. */
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(a, 1000);
	took = tu_now_ms() - t0;
	printf("  wait 1000 ms, network dark from the start: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 1000 + slack(1000));

	/* Open while dark: connect_timeout, and dlock_store_open_timeout. */
	if (nt.px) {
		dlock_store *o = NULL;
		t0 = tu_now_ms();
		rc = dlock_store_open(&o, nt.uri);
		took = tu_now_ms() - t0;
		printf("  open with connect_timeout=%d ms while dark: %s after %lld ms\n", NET_CONNECT_MS,
		       dlock_error_name(rc), took);
		CHECK(rc == DLOCK_EUNAVAILABLE);
		CHECK(took <= NET_CONNECT_MS + slack(NET_CONNECT_MS));
		dlock_store_close(o);
		o = NULL;
		t0 = tu_now_ms();
		rc = dlock_store_open_timeout(&o, nt.uri, 200);
		took = tu_now_ms() - t0;
		printf("  dlock_store_open_timeout(200 ms) while dark: %s after %lld ms\n", dlock_error_name(rc), took);
		CHECK(rc == DLOCK_EUNAVAILABLE);
		CHECK(took <= 200 + slack(200));
		dlock_store_close(o);
	}

	/* Release while dark: bounded by timeout=; the hold is then retried in
	 * the background and the name is free for others within one TTL. */
	CHECK(net_set(&nt, "pass") == 0);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	a = new_lock(faulty, name, DLOCK_EXCLUSIVE, 1, 0, 2000);
	/* The link is back, but the store's connection may have died while it
	 * was dark: a first try that meets it fails at once (EUNAVAILABLE, the
	 * first-try rule) and the next one reconnects. Within the same 5 s. */
	long long until = tu_now_ms() + 5000;
	do
		rc = dlock_acquire(a, until > tu_now_ms() ? until - tu_now_ms() : 0);
	while (rc == DLOCK_EUNAVAILABLE && tu_now_ms() < until);
	CHECK_RC(rc, 0);
	if (rc == 0) {
		CHECK(net_set(&nt, "blackhole") == 0);
		t0 = tu_now_ms();
		rc = dlock_release(a);
		took = tu_now_ms() - t0;
		printf("  release with timeout=%d ms while dark: %s after %lld ms\n", NET_TIMEOUT_MS,
		       dlock_error_name(rc), took);
		/* its bound: one request of its own, after at most one other request
		 * of the store handle in flight (a renewal, a retried release) */
		CHECK(took <= 2 * NET_TIMEOUT_MS + slack(NET_TIMEOUT_MS));
		CHECK(!dlock_held(a));
		/* The network is back, the lease carrying the failed release is not renewed:
		 * the name is free for others within one TTL. */
		CHECK(net_set(&nt, "pass") == 0);
		dlock_lock *c = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
		t0 = tu_now_ms();
		CHECK_RC(dlock_acquire(c, 2000 + 200), 0);
		printf("  another client granted %lld ms after the network came back\n", tu_now_ms() - t0);
		rc = dlock_release(a); /* after a store error, release can be called again */
		CHECK(rc == 0 || rc == DLOCK_ENOTHELD);
		CHECK(dlock_held(c));
		CHECK_RC(dlock_release(c), 0);
		dlock_lock_free(c);
	}
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(faulty);
	dlock_store_close(direct);
	net_stop(&nt);
}

/* A holder cut off from the store: on_lost fires by the deadline of its last
 * confirmed renewal, and no other client is granted before that. */
static void case_net_lost_signal(void)
{
	const long ttl = 1500;
	char name[128];
	lock_name(name, sizeof(name), "net-lost");
	net_hold h;
	if (!net_hold_start(&h, name, ttl, NET_TIMEOUT_MS, NET_CONNECT_MS, NULL))
		return;
	dlock_store *direct = h.direct;
	dlock_lock *a = h.a;
	CHECK_RC(dlock_acquire(a, 5000), 0);
	CHECK(net_set(&h.nt, "blackhole") == 0);
	long long deadline = tu_now_ms() + dlock_ttl_left(a); /* nothing is confirmed from here on */
	dlock_lock *b = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	timed_acquire tb = { b, 4 * ttl + 30000, 0, 0, 0, 0, true, false };
	pthread_create(&tb.t, NULL, timed_acquire_main, &tb);
	long long until = tu_now_ms() + 4 * ttl;
	while (!atomic_load(&net_lost_at) && tu_now_ms() < until)
		usleep(1000);
	CHECK(net_set(&h.nt, "pass") == 0); /* sqlite: the hung peer lets go only now */
	pthread_join(tb.t, NULL);
	int rc = tb.rc;
	long long granted = tb.ended;
	CHECK_RC(rc, 0);
	long long lost = atomic_load(&net_lost_at);
	printf("  on_lost %lld ms after the deadline; another client granted %lld ms after on_lost\n",
	       lost ? lost - deadline : -1, lost ? granted - lost : -1);
	CHECK(lost != 0);
	CHECK(lost <= deadline + TU_SCHED_GRACE_MS);
	CHECK(lost <= granted);
	CHECK(!dlock_held(a));
	dlock_lock_free(b);
	net_hold_stop(&h);
}

/* Does status show a holder of name whose owner is of client `id`? */
static int held_by_client(dlock_store *s, const char *name, const char *id)
{
	const char *names[] = { name };
	dlock_lock_status *st;
	size_t n;
	if (dlock_store_status(s, names, 1, &st, &n) != 0)
		return 0;
	int found = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t h = 0; h < st[i].nholders; h++)
			found |= strncmp(st[i].holders[h].owner, id, strlen(id)) == 0;
	dlock_status_free(st, n);
	return found;
}

/*
 * Stores where a blanket "drop" reaches "grant applied, reply lost" never or
 * only by luck: a grant of several requests (the answer to an early one is
 * lost, so the last is never sent), or one request that reads the same
 * granted or refused. For them the proxy drops the answers of the one
 * connection whose requests carry a pattern (dropmatch), from that request
 * on. The pattern is a store's wire format, so its test file gives it to
 * its suites (tests/stores/<kind>.cmake, dlock_store_suite's ENV):
 *   DLOCK_TEST_LOST_REPLY=PATTERN   \n a newline, %s the proxied client's id
 *   DLOCK_TEST_LOST_REPLY_ARM=release   arm it only once the holder's
 *                                       release has returned (else before
 *                                       the waiter starts)
 *   DLOCK_TEST_LOST_REPLY_OPTION=OPT    added to the proxied URI (the proxy
 *                                       must read the requests)
 */
typedef struct lost_reply_match {
	char pattern[256]; /* "" for a blanket drop */
	bool arm_after_release;
	const char *proxied_option;
} lost_reply_match;

static void lost_reply_match_get(lost_reply_match *m)
{
	const char *p = getenv("DLOCK_TEST_LOST_REPLY");
	const char *arm = getenv("DLOCK_TEST_LOST_REPLY_ARM");
	const char *opt = getenv("DLOCK_TEST_LOST_REPLY_OPTION");
	size_t n = 0;
	for (; p && *p && n + 1 < sizeof(m->pattern); p++)
		if (p[0] == '\\' && p[1] == 'n') {
			m->pattern[n++] = '\n';
			p++;
		} else {
			m->pattern[n++] = *p;
		}
	m->pattern[n] = '\0';
	m->arm_after_release = arm && strcmp(arm, "release") == 0;
	m->proxied_option = opt && *opt ? opt : NULL;
}

/* The pattern with each "%s" replaced by id, into out. */
static void lost_reply_pattern_fill(char *out, size_t size, const char *pattern, const char *id)
{
	size_t n = 0;
	for (const char *p = pattern; *p && n + 1 < size; p++) {
		if (p[0] == '%' && p[1] == 's') {
			n += (size_t)snprintf(out + n, size - n, "%s", id);
			if (n >= size)
				n = size - 1;
			p++;
		} else {
			out[n++] = *p;
		}
	}
	out[n] = '\0';
}

/* A waiter's try applied by the store but its reply lost, then retried:
 * never two holders, and fences still increase. */
static void case_net_lost_reply(void)
{
	const long ttl = 2000;
	char name[128];
	lock_name(name, sizeof(name), "net-reply");
	net nt;
	if (net_start(&nt, NET_TIMEOUT_MS, NET_CONNECT_MS) != 0) {
		CHECK(!"fault proxy did not start");
		return;
	}
	if (!nt.px) {
		printf("  (a local file has no replies to lose: not applicable to sqlite)\n");
		net_stop(&nt);
		return;
	}
	lost_reply_match m;
	lost_reply_match_get(&m);
	int lp = m.pattern[0] ? 0 : -1; /* a pattern to match, or a blanket drop */
	if (m.proxied_option) {
		size_t len = strlen(nt.uri);
		if (snprintf(nt.uri + len, sizeof(nt.uri) - len, "&%s", m.proxied_option) >=
		    (int)(sizeof(nt.uri) - len))
			die("URI too long");
	}
	dlock_store *direct = open_store();
	dlock_store *faulty = open_uri(nt.uri);
	dlock_lock *c = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.no_renew = 1;
	dlock_lock *a;
	if (dlock_lock_new(&a, faulty, name, &o) != 0)
		die("lock_new");
	CHECK_RC(dlock_acquire(c, 0), 0);
	uint64_t fc = dlock_fence(c);
	char pat[256] = "";
	if (lp >= 0)
		lost_reply_pattern_fill(pat, sizeof(pat), m.pattern, dlock_store_client_id(faulty));
	bool arm_after = lp >= 0 && m.arm_after_release;
	if (lp >= 0 && !arm_after)
		CHECK(tu_proxy_dropmatch(nt.px, -1, pat, strlen(pat)) == 0);
	timed_acquire ta = { a, 20000, 0, 0, 0, 0, false, true };
	pthread_create(&ta.t, NULL, timed_acquire_main, &ta);
	if (wait_waiters(direct, name, 1, 5000) < 0)
		CHECK(!"the proxied waiter never showed up as a waiter");
	int seen = 0, seen_unanswered = 0;
	long long fired = 0;
	for (int round = 0; lp >= 0 && round < 3 && !seen; round++) {
		/* Arming after the release: a try the proxy has already passed may
		 * be waiting in the server for the release's row locks and come back
		 * granted. Reset the link over the release so that no grant is
		 * answered before the arming; a try that was in flight then is
		 * applied but unanswered too, and its retry is the one that fires. */
		if (arm_after)
			CHECK(net_set(&nt, "reset") == 0);
		CHECK_RC(dlock_release(c), 0);
		if (arm_after)
			CHECK(tu_proxy_dropmatch(nt.px, -1, pat, strlen(pat)) == 0);
		long long until = tu_now_ms() + 5000;
		while (tu_proxy_fired(nt.px, 0, &fired) == 0 && fired == 0 && !dlock_held(a) && tu_now_ms() < until)
			usleep(2000);
		if (fired) {
			until = tu_now_ms() + 4000;
			while (!(seen = held_by_client(direct, name, dlock_store_client_id(faulty))) &&
			       tu_now_ms() < until)
				usleep(5000);
			seen_unanswered = seen && !dlock_held(a);
			break;
		}
		/* The waiter's try came between the release and the arming: granted
		 * and answered. Let its lease run out (no renewal), hold the lock
		 * again and make a new waiter. */
		printf("  (round %d: the waiter was answered before the fault was armed; again)\n", round);
		CHECK(net_set(&nt, "pass") == 0);
		pthread_join(ta.t, NULL);
		CHECK_RC(ta.rc, 0);
		CHECK_RC(dlock_acquire(c, 4 * ttl + 5000), 0);
		CHECK(dlock_fence(c) > fc);
		fc = dlock_fence(c);
		dlock_lock_free(a);
		if (dlock_lock_new(&a, faulty, name, &o) != 0)
			die("lock_new");
		if (!arm_after)
			CHECK(tu_proxy_dropmatch(nt.px, -1, pat, strlen(pat)) == 0);
		ta = (timed_acquire){ a, 20000, 0, 0, 0, 0, false, true };
		pthread_create(&ta.t, NULL, timed_acquire_main, &ta);
		if (wait_waiters(direct, name, 1, 5000) < 0)
			CHECK(!"the proxied waiter never showed up as a waiter");
	}
	if (lp < 0) {
		CHECK(net_set(&nt, "drop") == 0);
		CHECK_RC(dlock_release(c), 0);
	}
	/* The fault lasts until the store has granted the proxied client,
	 * unanswered. A client whose connection the drop killed cannot connect
	 * again while every answer is lost (MySQL's server speaks first): let
	 * the link through for a moment and drop again, up to three times. */
	for (int round = 0; lp < 0 && round < 3 && !seen; round++) {
		if (round > 0) {
			CHECK(net_set(&nt, "pass") == 0);
			usleep(300000);
			CHECK(net_set(&nt, "drop") == 0);
		}
		long long until = tu_now_ms() + 4000;
		while (!(seen = held_by_client(direct, name, dlock_store_client_id(faulty))) && tu_now_ms() < until)
			usleep(5000);
	}
	CHECK(seen);
	CHECK(lp < 0 || fired == 1);
	if (lp >= 0)
		printf("  dropmatch '%s' fired; the store showed the grant %s\n",
		       m.pattern[0] == '\n' ? m.pattern + 1 : m.pattern,
		       seen_unanswered ? "before the waiter had its answer" : "(the waiter answered by then)");
	long long dropped = 0;
	tu_proxy_stats(nt.px, 0, NULL, NULL, NULL, NULL, &dropped);
	CHECK(net_set(&nt, "pass") == 0);
	pthread_join(ta.t, NULL);
	CHECK_RC(ta.rc, 0);
	long long deadline = tu_now_ms() + dlock_ttl_left(a);
	uint64_t fa = dlock_fence(a);
	dlock_lock *d = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	int rc = dlock_acquire(d, 4 * ttl + 5000);
	long long granted = tu_now_ms();
	CHECK_RC(rc, 0);
	printf("  reply lost (%lld bytes dropped): the next client granted %lld ms after the first's deadline; fences %llu, %llu, %llu\n",
	       dropped, granted - deadline, (unsigned long long)fc, (unsigned long long)fa,
	       (unsigned long long)dlock_fence(d));
	CHECK(ta.rc != 0 || granted >= deadline);
	CHECK(ta.rc != 0 || fa > fc);
	CHECK(dlock_fence(d) > fc && (ta.rc != 0 || dlock_fence(d) > fa));
	if (rc == 0)
		CHECK_RC(dlock_release(d), 0);
	dlock_lock_free(a);
	dlock_lock_free(c);
	dlock_lock_free(d);
	dlock_store_close(faulty);
	dlock_store_close(direct);
	net_stop(&nt);
}

/* A slow link (ttl/5 each way): the holder keeps its lock through renewals
 * and nobody else gets it meanwhile. With one renewal in flight at a time a
 * lease survives a round trip below (ttl - drift) / 2: the next renewal
 * can only be sent when the last one is answered. ttl/4 each way is exactly
 * that limit; ttl/5 (a round trip of 0.4 ttl) leaves the drift margin. */
static void case_net_delay(void)
{
	const long ttl = 2000;
	char name[128];
	lock_name(name, sizeof(name), "net-delay");
	net_hold h;
	if (!net_hold_start(&h, name, ttl, 3000, 10000,
			    "a local file has no link to slow down: not applicable to sqlite"))
		return;
	dlock_store *direct = h.direct;
	dlock_lock *a = h.a;
	CHECK_RC(dlock_acquire(a, 5000), 0);
	char mode[32];
	/* libzookeeper drops a connection that received nothing for 2/3 of the
	 * session timeout and pings only after 1/3 of it: a round trip above
	 * ttl/3 loses the session's locks (docs/stores/zookeeper.md, "Slow link") */
	long div = strncmp(uri, "zk:", 3) == 0 ? 8 : 5;
	snprintf(mode, sizeof(mode), "delay %ld", ttl / div);
	CHECK(net_set(&h.nt, mode) == 0);
	dlock_lock *b = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	long long until = tu_now_ms() + 3 * ttl;
	int tries = 0, stolen = 0;
	while (tu_now_ms() < until) {
		int rc = dlock_acquire(b, 0);
		tries++;
		if (rc == 0) {
			stolen++;
			dlock_release(b);
		}
		usleep(50000);
	}
	printf("  %d tries by another client over %ld ms of a %ld ms link: %d granted; on_lost %s\n", tries, 3 * ttl,
	       2 * ttl / div, stolen, atomic_load(&net_lost_at) ? "fired" : "did not fire");
	CHECK(stolen == 0);
	CHECK(atomic_load(&net_lost_at) == 0);
	CHECK(dlock_held(a));

	/* ttl/4 each way: the grant and the first renewal take a whole ttl, more
	 * than the lease (ttl - drift) that counts from before the acquire was
	 * sent, so no client that renews only once it knows it holds can keep the
	 * lock. What must still hold is safety: the holder hears of the loss
	 * before anyone else is granted. */
	snprintf(mode, sizeof(mode), "delay %ld", ttl / 4);
	CHECK(net_set(&h.nt, mode) == 0);
	long long granted_at = 0;
	until = tu_now_ms() + 5 * ttl;
	while (!granted_at && tu_now_ms() < until) {
		if (dlock_acquire(b, 0) == 0) {
			granted_at = tu_now_ms();
			dlock_release(b);
		} else {
			usleep(20000);
		}
	}
	long long lost_at = atomic_load(&net_lost_at);
	printf("  at ttl/4 each way: on_lost %s, another client granted %lld ms after it\n",
	       lost_at ? "fired" : "did not fire", granted_at && lost_at ? granted_at - lost_at : -1);
	CHECK(!granted_at || (lost_at && lost_at <= granted_at));
	CHECK(!granted_at || !dlock_held(a));
	CHECK(net_set(&h.nt, "pass") == 0);
	dlock_release(a); /* ELOST if it was lost */
	CHECK_RC(dlock_acquire(b, 5000), 0);
	dlock_release(b);
	dlock_lock_free(b);
	net_hold_stop(&h);
}

/* Bytes the proxied client has sent, over every route. */
static long long net_up(net *nt)
{
	long long sum = 0;
	for (int i = 0; i < tu_proxy_routes(nt->px); i++) {
		long long up = 0;
		if (tu_proxy_stats(nt->px, i, NULL, NULL, &up, NULL, NULL) == 0)
			sum += up;
	}
	return sum;
}

/* Issue 30 row 1: extend while a renewal of the same hold is in flight. The
 * renewal (old ttl) is lagged on the link; extend(60 s) goes at once and
 * returns 0; the renewal lands after it. The store must then keep at least
 * the lease the holder counts: its TTL is not below the holder's, and no
 * other client is granted while the holder believes it holds, well past the
 * old ttl. Two shapes: a request timeout below the lag (the renewal's
 * outcome is unknown and it lands late: Redis, whose renewals have their own
 * connection), and above it (the renewal is answered late, and where it
 * shares the extend's connection — PostgreSQL, MySQL — the renewer's next
 * one, due at once, copied the old ttl before the extend was done). */
static void net_extend_renewal(long timeout)
{
	const long ttl = 3000, lag = 800;
	char name[128];
	lock_name(name, sizeof(name), "net-extend");
	net_hold h;
	if (!net_hold_start(&h, name, ttl, timeout, 2000,
			    "a local file has no link to slow down: sqlite's case is its own test"))
		return;
	dlock_store *direct = h.direct, *faulty = h.faulty;
	dlock_lock *a = h.a;
	dlock_lock *b = new_lock(direct, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	CHECK_RC(dlock_acquire(a, 5000), 0);
	/* Renewals come every ttl/3. The first opens the renewer's own
	 * connection (Redis) while it goes on the handle's: let two pass, each
	 * seen as the lease moving forward. */
	long long until = tu_now_ms() + ttl;
	for (int renewed = 0; renewed < 2; renewed++) {
		int64_t left = dlock_ttl_left(a), now_left;
		while ((now_left = dlock_ttl_left(a)) <= left && tu_now_ms() < until) {
			left = now_left;
			usleep(2000);
		}
		CHECK(now_left > left);
		until = tu_now_ms() + ttl;
	}
	/* Lag the link from before the next renewal until the proxy has read
	 * it; then everything else passes (and overtakes it). */
	long long up0 = net_up(&h.nt);
	char mode[32];
	snprintf(mode, sizeof(mode), "lag %ld", lag);
	CHECK(net_set(&h.nt, mode) == 0);
	until = tu_now_ms() + ttl;
	while (net_up(&h.nt) == up0 && tu_now_ms() < until)
		usleep(2000);
	CHECK(net_up(&h.nt) > up0);
	usleep(5000); /* a renewal written in several pieces: all of it lagged */
	CHECK(net_set(&h.nt, "pass") == 0);
	long long t_ext = tu_now_ms();
	int rc = dlock_extend(a, 60000);
	if (dlock_store_session_bound(faulty) && (rc == DLOCK_ELOST || rc == DLOCK_EINVAL)) {
		/* The lease is the session: a request that timed out ended it
		 * (ELOST), or the session's timeout bounds the ttl (EINVAL,
		 * ZooKeeper). No expiry to race on; no steal is still checked. */
		printf("  session-bound store: extend %s (%s)\n", dlock_error_name(rc), dlock_error_last()->message);
	} else if (rc == DLOCK_EUNAVAILABLE) {
		/* The extend's own request may time out on the lagged link of a
		 * loaded machine (etcd's lease grant): its outcome is unknown too.
		 * What follows checks that the holder counts no more than the
		 * store and that nobody is granted while it holds. */
		printf("  extend %s (%s): its outcome is unknown\n", dlock_error_name(rc), dlock_error_last()->message);
	} else {
		CHECK_RC(rc, 0);
	}
	long long t_done = tu_now_ms();
	/* The lagged renewal has landed by t_ext + lag: the store's lease is at
	 * least what the holder counts. */
	usleep((useconds_t)(t_ext + lag + 100 - tu_now_ms() > 0 ? (t_ext + lag + 100 - tu_now_ms()) * 1000 : 0));
	long long store_left = -1, holder_left = dlock_ttl_left(a);
	dlock_lock_status *st = NULL;
	size_t nst = 0;
	const char *names[] = { name };
	if (dlock_store_status(direct, names, 1, &st, &nst) == 0 && nst == 1 && st[0].nholders == 1)
		store_left = st[0].holders[0].ttl_left_ms;
	dlock_status_free(st, nst);
	printf("  after the lagged renewal landed: the store says %lld ms left, the holder counts %lld ms\n",
	       store_left, holder_left);
	/* a store may show whole seconds (etcd's lease TTL): one more */
	CHECK(store_left < 0 || store_left + 1000 + TU_SCHED_GRACE_MS >= holder_left);
	/* The old lease it would set ends by then + ttl. Another client tries
	 * until well past it. */
	int tries = 0, stolen = 0;
	long long left_at_steal = -1;
	until = t_ext + lag + ttl + 500;
	while (tu_now_ms() < until) {
		tries++;
		if (dlock_acquire(b, 0) == 0) {
			if (dlock_held(a)) {
				stolen++;
				left_at_steal = dlock_ttl_left(a);
			}
			dlock_release(b);
			break;
		}
		usleep(50000);
	}
	printf("  extend took %lld ms; %d tries by another client over %lld ms: %d granted while the holder "
	       "counted %lld ms left; on_lost %s\n",
	       t_done - t_ext, tries, until - t_ext, stolen, left_at_steal,
	       atomic_load(&net_lost_at) ? "fired" : "did not fire");
	CHECK(stolen == 0);
	CHECK(rc != 0 || dlock_held(a));
	dlock_release(a);
	dlock_lock_free(b);
	net_hold_stop(&h);
}

static void case_net_extend_renewal_unknown(void)
{
	net_extend_renewal(400);
}

static void case_net_extend_renewal_late(void)
{
	net_extend_renewal(2500);
}

/* ------------------------------------------------ names that must never meet
 * (issue 21 rows 3 and 6). A lock N held; then names shaped like N's own
 * internal keys in some store (memcached K/f and K/o/<owner>, Redis {P:N}:f,
 * etcd's <prefix>/<N>/<owner>), names that differ only in a character a store
 * escapes, and two namespaces (prefix=) whose keys would be the same if the
 * prefix were not escaped. Each must be a lock of its own: granted while N is
 * held, and N's lease and fence undisturbed (extend works, later fences grow). */

static dlock_store *open_prefixed(const char *prefix)
{
	char u[4400], enc[256];
	size_t o = 0;
	for (const char *p = prefix; *p && o + 4 < sizeof(enc); p++)
		o += (size_t)snprintf(enc + o, sizeof(enc) - o, strchr(":/%?&=#", *p) ? "%%%02X" : "%c",
				      (unsigned char)*p);
	snprintf(u, sizeof(u), "%s%sprefix=%s", uri, strchr(uri, '?') ? "&" : "?", enc);
	dlock_store *s = NULL;
	if (dlock_store_open(&s, u) != 0)
		die("cannot open %s", u);
	return s;
}

/* Take `l` once (it must be free) and return its fence. */
static uint64_t take(dlock_lock *l, const char *what)
{
	int rc = dlock_acquire(l, 0);
	if (rc != 0)
		fprintf(stderr, "names: %s: acquire gave %s: %s\n", what, dlock_error_name(rc),
			dlock_error_last()->message);
	CHECK_RC(rc, 0);
	return rc == 0 ? dlock_fence(l) : 0;
}

/* Renewal: a lock held for three leases by the renewal thread alone stays
 * ours — every try of a contender on another handle is refused, the fence
 * does not change (the store's own record agrees where it reports status),
 * and no lost signal fires. */
static void case_renewal(void)
{
	const int64_t ttl = 1200;
	char name[128];
	lock_name(name, sizeof(name), "renewal");
	dlock_store *mine = open_store(), *other = open_store();
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = on_lost;
	dlock_lock *a = NULL;
	if (dlock_lock_new(&a, mine, name, &o) != 0)
		die("lock_new");
	atomic_store(&lost_fired, 0);
	CHECK_RC(dlock_acquire(a, 5000), 0);
	uint64_t fence = dlock_fence(a);
	dlock_lock *b = new_lock(other, name, DLOCK_EXCLUSIVE, 1, 0, ttl);
	int tries = 0, refused = 0;
	long long until = tu_now_ms() + 3 * ttl;
	while (tu_now_ms() < until) {
		int rc = dlock_acquire(b, 0);
		tries++;
		refused += rc == DLOCK_ELOCKED;
		if (rc == 0)
			dlock_release(b);
		usleep(150000);
	}
	printf("  held %lld ms (3 leases) by renewal alone: %d of %d tries by another handle refused\n",
	       (long long)(3 * ttl), refused, tries);
	CHECK(tries >= 10 && refused == tries);
	CHECK(dlock_held(a) && dlock_fence(a) == fence);
	CHECK(atomic_load(&lost_fired) == 0);
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int rc = dlock_store_status(other, names, 1, &st, &n);
	if (rc == 0) {
		CHECK(n == 1 && st[0].nholders == 1 && st[0].holders[0].fence == fence);
		dlock_status_free(st, n);
	} else {
		CHECK_RC(rc, DLOCK_ENOTSUPPORTED);
	}
	CHECK_RC(dlock_release(a), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(mine);
	dlock_store_close(other);
}

static void case_names(void)
{
	char n[128];
	lock_name(n, sizeof(n), "names");
	dlock_store *s = open_store();
	dlock_lock *a = new_lock(s, n, DLOCK_EXCLUSIVE, 1, 0, 10000);
	uint64_t fa = take(a, n);
	/* N's owner token, as status shows it (a memcached lease key ends with it) */
	char owner[160];
	snprintf(owner, sizeof(owner), "%s-1", dlock_store_client_id(s));
	const char *names1[] = { n };
	dlock_lock_status *st = NULL;
	size_t ns = 0;
	if (dlock_store_status(s, names1, 1, &st, &ns) == 0) {
		if (ns == 1 && st[0].nholders == 1 && st[0].holders[0].owner)
			snprintf(owner, sizeof(owner), "%s", st[0].holders[0].owner);
		dlock_status_free(st, ns);
	}
	const char *shapes[] = { "%s/f", "%s/o/%s", "%s/o/x",  "%s:x", "%s:f",   "%s}:f", "%s/x/f",
				 "%s/",  "%s%%2F",  "%s%%2Ff", "%s:",  "%s%%3A", "%s%%",  "%s%%25" };
	enum { NSHAPES = sizeof(shapes) / sizeof(shapes[0]) };
	dlock_lock *c[NSHAPES];
	uint64_t fc[NSHAPES];
	char cn[NSHAPES][400];
	for (int i = 0; i < NSHAPES; i++) {
		snprintf(cn[i], sizeof(cn[i]), shapes[i], n, owner);
		c[i] = new_lock(s, cn[i], DLOCK_EXCLUSIVE, 1, 0, 10000);
		fc[i] = take(c[i], cn[i]);
	}
	/* every one held at once, N's lease still N's */
	for (int i = 0; i < NSHAPES; i++)
		CHECK(dlock_held(c[i]));
	CHECK(dlock_held(a) && dlock_fence(a) == fa);
	CHECK_RC(dlock_extend(a, 0), 0);
	/* the other order: release everything, the crafted names first this time */
	for (int i = 0; i < NSHAPES; i++)
		CHECK_RC(dlock_release(c[i]), 0);
	CHECK_RC(dlock_release(a), 0);
	for (int i = 0; i < NSHAPES; i++) {
		uint64_t f = take(c[i], cn[i]);
		CHECK(f > fc[i]);
	}
	uint64_t fa2 = take(a, n);
	CHECK(fa2 > fa);
	CHECK_RC(dlock_extend(a, 0), 0);
	for (int i = 0; i < NSHAPES; i++) {
		CHECK_RC(dlock_release(c[i]), 0);
		dlock_lock_free(c[i]);
	}
	CHECK_RC(dlock_release(a), 0);
	dlock_lock_free(a);

	/* Two namespaces whose unescaped keys would meet: (P:b, c) and (P, b:c);
	 * (P/x, y) and (P, x/y); (P/x, y) and (P, x), where a range over P's lock
	 * "x" must not reach the keys of namespace P/x. Both granted, both held. */
	char p[64];
	snprintf(p, sizeof(p), "cp%s", run_id);
	const char *pairs[][4] = {
		{ ":b", "c", "", "b:c" },
		{ "/x", "y", "", "x/y" },
		{ "/x", "y", "", "x" },
		{ "%", "3Ab", "%3A", "b" },
	};
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		char p1[128], p2[128];
		snprintf(p1, sizeof(p1), "%s%s", p, pairs[i][0]);
		snprintf(p2, sizeof(p2), "%s%s", p, pairs[i][2]);
		dlock_store *s1 = open_prefixed(p1), *s2 = open_prefixed(p2);
		dlock_lock *l1 = new_lock(s1, pairs[i][1], DLOCK_EXCLUSIVE, 1, 0, 10000);
		dlock_lock *l2 = new_lock(s2, pairs[i][3], DLOCK_EXCLUSIVE, 1, 0, 10000);
		char what[300];
		snprintf(what, sizeof(what), "prefix %s name %s, then prefix %s name %s", p1, pairs[i][1], p2,
			 pairs[i][3]);
		uint64_t f1 = take(l1, what);
		uint64_t f2 = take(l2, what);
		CHECK(dlock_held(l1) && dlock_held(l2));
		CHECK_RC(dlock_extend(l1, 0), 0);
		CHECK_RC(dlock_extend(l2, 0), 0);
		CHECK_RC(dlock_release(l2), 0);
		CHECK(dlock_held(l1));
		/* and the other way round */
		CHECK_RC(dlock_release(l1), 0);
		uint64_t g2 = take(l2, what), g1 = take(l1, what);
		CHECK(g1 > f1 && g2 > f2);
		CHECK_RC(dlock_release(l1), 0);
		CHECK_RC(dlock_release(l2), 0);
		dlock_lock_free(l1);
		dlock_lock_free(l2);
		dlock_store_close(s1);
		dlock_store_close(s2);
	}
	dlock_store_close(s);
}

/* ---------------------------------------------------------------- chaos
 *
 * Stores of several members (etcd and ZooKeeper clusters, Redlock masters,
 * Redis Cluster nodes): their fixture lists the members in DIR/members, one
 * "NAME PORT PID_FILE" line each, and starts a killed member again with
 * `SCRIPT restart-member DIR NAME` ($DLOCK_TEST_FIXTURE is the script).
 * One member at a time fails (chaos_member_stopped: SIGSTOP, it hangs:
 * connects succeed, nothing is answered; chaos_member_killed: SIGKILL, a
 * crash: connects are refused, the leader's death ends its term at once).
 * A leader's failure makes the others elect, a Cluster master's makes its
 * replica take over: an acquire that may wait, on a store opened before,
 * is granted before its wait ends (riding out the election or failover);
 * then, the store serving again, a fresh open takes at most half its
 * connect_timeout, and a try-once by another client, the holder's release
 * and the grant to a waiter it wakes each at most half the request
 * timeout: none waits for the failed member. The member is resumed (or
 * started again), and the next one fails only once it serves again (a
 * store of that member alone opens and answers). The chaos cases run only
 * for the suites whose fixture has members (tests/stores/CMakeLists.txt,
 * CHAOS). */

#define CHAOS_MAX 8
#define CHAOS_WAIT_MS 15000

typedef struct chaos_member {
	char name[32];
	int port;
	pid_t pid;
} chaos_member;

static _Atomic pid_t chaos_stopped; /* resumed at exit, whatever ends the case */

static void chaos_resume(void)
{
	pid_t p = atomic_exchange(&chaos_stopped, 0);
	if (p > 0)
		kill(p, SIGCONT);
}

/* `bash $DLOCK_TEST_FIXTURE VERB DIR [NAME]`; false (said why) unless it
 * exits 0. */
static bool chaos_fixture(const char *verb, const char *name)
{
	const char *script = getenv("DLOCK_TEST_FIXTURE");
	char dir[512], cmd[1500];
	tu_server_dir(dir, sizeof dir);
	snprintf(cmd, sizeof cmd, "bash '%s' %s '%s' '%s' >&2", script ? script : "", verb, dir, name ? name : "");
	int rc = script ? system(cmd) : -1;
	if (rc != 0)
		fprintf(stderr, "%s: exit %d (DLOCK_TEST_FIXTURE %s)\n", cmd, rc, script ? "set" : "not set");
	return rc == 0;
}

/* The members in the order their fixture wants them failed (a Cluster's
 * masters of now first: `SCRIPT members DIR` rewrites the list). */
static int chaos_members(chaos_member *m, int max)
{
	char dir[512], file[600];
	if (!chaos_fixture("members", NULL))
		return 0;
	tu_server_dir(dir, sizeof dir);
	snprintf(file, sizeof file, "%s/members", dir);
	FILE *f = fopen(file, "r");
	if (!f)
		return 0;
	int n = 0;
	char pidfile[512];
	while (n < max && fscanf(f, "%31s %d %511s", m[n].name, &m[n].port, pidfile) == 3) {
		char line[32];
		m[n].pid = tu_first_line(pidfile, line, sizeof line) == 0 ? (pid_t)atol(line) : 0;
		if (m[n].pid > 0)
			n++;
	}
	fclose(f);
	return n;
}

/* The store's URI with its members replaced by one: 127.0.0.1:port (a
 * Redlock master alone: redis://). */
static void chaos_member_uri(char *out, size_t n, int port)
{
	const char *hosts = strstr(uri, "://");
	hosts = hosts ? hosts + 3 : uri;
	size_t end = strcspn(hosts, "/?");
	if (strncmp(uri, "redlock://", 10) == 0)
		snprintf(out, n, "redis://127.0.0.1:%d%s", port, hosts + end);
	else
		snprintf(out, n, "%.*s127.0.0.1:%d%s", (int)(hosts - uri), uri, port, hosts + end);
}

/* The resumed member answers on its own (a member behind its cluster, or
 * not yet back in its quorum, refuses or times out): up to 30 s. */
static bool chaos_member_serves(int port)
{
	char u[4200];
	chaos_member_uri(u, sizeof u, port);
	const char *names[] = { "conf-chaos-probe" };
	for (long long until = tu_now_ms() + 30000; tu_now_ms() < until;) {
		dlock_store *s = NULL;
		dlock_lock_status *st = NULL;
		size_t n = 0;
		bool ok = dlock_store_open(&s, u) == 0 && dlock_store_status(s, names, 1, &st, &n) == 0;
		dlock_status_free(st, n);
		dlock_store_close(s);
		if (ok)
			return true;
		usleep(100000);
	}
	return false;
}

static long long uri_ms(const char *key, long long dflt)
{
	const char *q = strchr(uri, '?');
	for (const char *p = q; p && (p = strstr(p, key));) {
		if ((p[-1] == '?' || p[-1] == '&') && p[strlen(key)] == '=') {
			char *end = NULL;
			double v = strtod(p + strlen(key) + 1, &end);
			return end && strncmp(end, "ms", 2) == 0 ? (long long)v : (long long)(v * 1000);
		}
		p += strlen(key);
	}
	return dflt;
}

/* Names per round: a Redis Cluster spreads them over its masters (a round
 * has none on the stopped one of three (2/3)^8, about 4 %, of the time; the
 * rounds stop each master in turn). */
#define CHAOS_NAMES 8

/* The failed member back: resumed, or (killed) started again by its
 * fixture; then it must serve on its own. */
static bool chaos_member_back(const chaos_member *m, bool killed)
{
	if (!killed)
		chaos_resume();
	else if (!chaos_fixture("restart-member", m->name))
		return false;
	return chaos_member_serves(m->port);
}

static void chaos_round(const chaos_member *m, bool kill_it, long long connect_ms, long long request_ms)
{
	char what[48], name[CHAOS_NAMES][128];
	dlock_store *s1 = open_store(), *s2 = open_store(), *s3 = NULL;
	dlock_lock *a[CHAOS_NAMES], *b[CHAOS_NAMES];
	for (int k = 0; k < CHAOS_NAMES; k++) {
		snprintf(what, sizeof what, "chaos-%.31s-%d", m->name, k);
		lock_name(name[k], sizeof name[k], what);
		a[k] = new_lock(s1, name[k], DLOCK_EXCLUSIVE, 1, 0, 10000);
		b[k] = new_lock(s2, name[k], DLOCK_EXCLUSIVE, 1, 0, 10000);
	}
	if (kill_it) {
		CHECK(tu_kill(m->pid) == 0);
	} else {
		atomic_store(&chaos_stopped, m->pid);
		CHECK(tu_stop(m->pid) == 0);
	}
	printf("  %s %s:\n", m->name, kill_it ? "killed" : "stopped");

	/* a store opened before: its wait rides out the store's own recovery
	 * (an election, a replica taking over) */
	long long t0 = tu_now_ms(), slowest = 0;
	int granted = 0;
	for (int k = 0; k < CHAOS_NAMES; k++) {
		long long t = tu_now_ms();
		int rc = dlock_acquire(a[k], CHAOS_WAIT_MS);
		t = tu_now_ms() - t;
		slowest = t > slowest ? t : slowest;
		granted += rc == 0;
		CHECK_RC(rc, 0);
		CHECK(t <= CHAOS_WAIT_MS + slack(CHAOS_WAIT_MS));
	}
	printf("    acquire (wait %d ms) of %d names: %d granted in %lld ms, slowest %lld ms\n", CHAOS_WAIT_MS,
	       CHAOS_NAMES, granted, tu_now_ms() - t0, slowest);

	/* the store serves again (those grants say so): a fresh open does not
	 * spend its time on the stopped member */
	t0 = tu_now_ms();
	int orc = dlock_store_open(&s3, uri);
	long long took = tu_now_ms() - t0;
	printf("    open: %s in %lld ms (bound %lld)\n", dlock_error_name(orc), took, connect_ms / 2);
	CHECK_RC(orc, 0);
	CHECK(took <= connect_ms / 2 + TU_SCHED_GRACE_MS);

	if (granted == CHAOS_NAMES && orc == 0) {
		/* none of these needs the stopped member's answer */
		slowest = 0;
		for (int k = 0; k < CHAOS_NAMES; k++) {
			dlock_lock *c = new_lock(s3, name[k], DLOCK_EXCLUSIVE, 1, 0, 10000);
			long long t = tu_now_ms();
			CHECK_RC(dlock_acquire(c, 0), DLOCK_ELOCKED);
			t = tu_now_ms() - t;
			slowest = t > slowest ? t : slowest;
			dlock_lock_free(c);
		}
		printf("    try-once by another: slowest %lld ms (bound %lld)\n", slowest, request_ms / 2);
		CHECK(slowest <= request_ms / 2 + TU_SCHED_GRACE_MS);

		const char *names[CHAOS_NAMES];
		for (int k = 0; k < CHAOS_NAMES; k++)
			names[k] = name[k];
		dlock_lock_status *st = NULL;
		size_t nst = 0;
		t0 = tu_now_ms();
		int src = dlock_store_status(s3, names, CHAOS_NAMES, &st, &nst);
		took = tu_now_ms() - t0;
		printf("    status of %d names: %s in %lld ms (bound %lld)\n", CHAOS_NAMES, dlock_error_name(src), took,
		       request_ms / 2);
		if (src != DLOCK_ENOTSUPPORTED) {
			CHECK_RC(src, 0);
			CHECK(took <= request_ms / 2 + TU_SCHED_GRACE_MS);
			CHECK(nst == CHAOS_NAMES);
			for (size_t k = 0; k < nst; k++)
				CHECK(st[k].nholders == 1);
		}
		dlock_status_free(st, nst);

		/* waiters, each granted by its holder's release */
		timed_acquire w[CHAOS_NAMES];
		long long released[CHAOS_NAMES], slow_release = 0, slow_grant = 0;
		for (int k = 0; k < CHAOS_NAMES; k++) {
			/* (the releases come one by one: a wait to outlast them all) */
			w[k] = (timed_acquire){ .lock = b[k], .wait = 2 * CHAOS_WAIT_MS, .then_release = true };
			CHECK(pthread_create(&w[k].t, NULL, timed_acquire_main, &w[k]) == 0);
		}
		for (int k = 0; k < CHAOS_NAMES; k++) {
			(void)wait_waiters(s1, name[k], 1, 5000); /* a store that shows waiters: once it waits */
			t0 = tu_now_ms();
			CHECK_RC(dlock_release(a[k]), 0);
			released[k] = tu_now_ms();
			slow_release = released[k] - t0 > slow_release ? released[k] - t0 : slow_release;
		}
		for (int k = 0; k < CHAOS_NAMES; k++) {
			pthread_join(w[k].t, NULL);
			CHECK_RC(w[k].rc, 0);
			slow_grant = w[k].ended - released[k] > slow_grant ? w[k].ended - released[k] : slow_grant;
		}
		printf("    release: slowest %lld ms; its waiter granted (then released) %lld ms after at most "
		       "(bound %lld each)\n",
		       slow_release, slow_grant, request_ms / 2);
		CHECK(slow_release <= request_ms / 2 + TU_SCHED_GRACE_MS);
		CHECK(slow_grant <= request_ms / 2 + TU_SCHED_GRACE_MS);
	}
	for (int k = 0; k < CHAOS_NAMES; k++) {
		dlock_lock_free(a[k]);
		dlock_lock_free(b[k]);
	}
	dlock_store_close(s1);
	dlock_store_close(s2);
	dlock_store_close(s3);
	t0 = tu_now_ms();
	bool back = chaos_member_back(m, kill_it);
	printf("    %s: %s after %lld ms\n", kill_it ? "started again" : "resumed", back ? "serves" : "NOT serving",
	       tu_now_ms() - t0);
	CHECK(back);
}

static void chaos_members_fail(bool kill_it)
{
	chaos_member m[CHAOS_MAX];
	int n = chaos_members(m, CHAOS_MAX);
	printf("  %d members\n", n);
	CHECK(n >= 3);
	atexit(chaos_resume);
	/* the suite's options for these cases (a Redis Cluster of one replica
	 * per master: a grant that waits for a replica cannot be had while a
	 * shard is down to one node, see docs/stores/redis.md) */
	const char *opts = getenv("DLOCK_TEST_CHAOS_OPTIONS");
	size_t have = strlen(uri);
	if (opts && *opts)
		snprintf(uri + have, sizeof uri - have, "%s%s", strchr(uri, '?') ? "&" : "?", opts);
	long long connect_ms = uri_ms("connect_timeout", 5000);
	long long request_ms = uri_ms("timeout", connect_ms < 2000 ? connect_ms : 2000);
	/* up to three members in turn: all of a 3-member cluster (its leader
	 * among them), a Cluster's three masters */
	for (int i = 0; i < n && i < 3; i++)
		chaos_round(&m[i], kill_it, connect_ms, request_ms);
}

static void chaos_member_stopped(void)
{
	chaos_members_fail(false);
}

static void chaos_member_killed(void)
{
	chaos_members_fail(true);
}

/* clang-format off */
static const struct child_entry children[] = {
	{ "mutex_child", mutex_child },   { "holder_then_hang", holder_then_hang },
	{ "paused_holder", paused_holder }, { "fair_waiter", fair_waiter },
	{ "shared_writer", shared_writer }, { "sem_child", sem_child },
	{ "other_process_try", other_process_try },
};
/* clang-format on */

static int child_main(int argc, char **argv)
{
	if (argc != 11)
		return 97;
	snprintf(uri, sizeof(uri), "%s", argv[2]);
	snprintf(tmpdir, sizeof(tmpdir), "%s", argv[3]);
	snprintf(run_id, sizeof(run_id), "%s", argv[4]);
	ev_a = (event){ atoi(argv[7]), atoi(argv[8]) };
	ev_b = (event){ atoi(argv[9]), atoi(argv[10]) };
	/* Only the parent writes ev_b: if it dies, our read sees EOF. */
	if (ev_b.wr >= 0)
		close(ev_b.wr);
	if (ev_a.rd >= 0)
		close(ev_a.rd);
	for (size_t i = 0; i < sizeof(children) / sizeof(children[0]); i++)
		if (strcmp(children[i].name, argv[5]) == 0)
			return children[i].fn(atol(argv[6]));
	return 96;
}

static const tu_case cases[] = {
	{ "bad_input", case_bad_input },
	{ "owner_only", case_owner_only },
	{ "reentrancy_and_fences", case_reentrancy_and_fences },
	{ "try_and_timeout", case_try_and_timeout },
	{ "quiet_wait", case_quiet_wait },
	{ "status", case_status },
	{ "mutual_exclusion", case_mutual_exclusion },
	{ "killed_holder", case_killed_holder },
	{ "paused_holder", case_paused_holder },
	{ "fair_order", case_fair_order },
	{ "shared", case_shared },
	{ "semaphore", case_semaphore },
	{ "permits_mixed", case_permits_mixed },
	{ "two_handles", case_two_handles },
	{ "fork", case_fork },
	{ "net_bounds", case_net_bounds },
	{ "net_lost_signal", case_net_lost_signal },
	{ "net_lost_reply", case_net_lost_reply },
	{ "net_delay", case_net_delay },
	{ "net_extend_renewal_unknown", case_net_extend_renewal_unknown },
	{ "net_extend_renewal_late", case_net_extend_renewal_late },
	{ "names", case_names },
	{ "renewal", case_renewal },
};

/* Run only when named (CHAOS suites); the pattern in CMakeLists.txt reads them. */
static const tu_case chaos_cases[] = {
	{ "chaos_member_stopped", chaos_member_stopped },
	{ "chaos_member_killed", chaos_member_killed },
};

/* conformance --load MODULE ...: a store module built outside libdlock
 * (examples/store/memstore.c as store-mem.so) is loaded and its
 * dlock_store_module_init registers its schemes, as libdlock does with its
 * own modules; the children this suite starts load it too (through the
 * environment). 0, or 2 with a message. */
static int load_module(void)
{
	const char *path = getenv("DLOCK_CONFORMANCE_LOAD");
	if (!path || !*path)
		return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	dlock_store_module_init_fn init = h ? (dlock_store_module_init_fn)dlsym(h, DLOCK_STORE_MODULE_INIT) : NULL;
	if (!init) {
		fprintf(stderr, "conformance --load %s: %s\n", path, h ? "no dlock_store_module_init" : dlerror());
		return 2;
	}
	if (init() != 0) {
		fprintf(stderr, "conformance --load %s: %s\n", path, dlock_error_last()->message);
		return 2;
	}
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 2 && strcmp(argv[1], "--load") == 0) {
		setenv("DLOCK_CONFORMANCE_LOAD", argv[2], 1);
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	if (load_module() != 0)
		return 2;
	if (argc > 1 && strcmp(argv[1], "--child") == 0)
		return child_main(argc, argv);
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		return 2;
	self_exe[n] = '\0';
	ev_a = ev_b = (event){ -1, -1 };
	/* conformance [--load MODULE] [URI|- [CASE...]]: "-" or none, the URI from
	 * DLOCK_TEST_URI_FILE, with DLOCK_TEST_URI_SUFFIX appended (another mode
	 * of the store on the same server: "?mode=advisory"). */
	if (argc > 1 && argv[1][0] && strcmp(argv[1], "-") != 0) {
		snprintf(uri, sizeof(uri), "%s", argv[1]);
	} else {
		tu_uri_from_env(uri, sizeof uri, "conformance");
		const char *sfx = getenv("DLOCK_TEST_URI_SUFFIX");
		size_t have = strlen(uri);
		if (sfx && (size_t)snprintf(uri + have, sizeof(uri) - have, "%s", sfx) >= sizeof(uri) - have) {
			fprintf(stderr, "conformance: URI too long\n");
			return 2;
		}
	}
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/dlock-conformance-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 2;
	}
	unsigned char rnd[4];
	FILE *ur = fopen("/dev/urandom", "r");
	if (!ur || fread(rnd, 1, 4, ur) != 4)
		return 2;
	fclose(ur);
	snprintf(run_id, sizeof(run_id), "%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3]);

	dlock_store *s = open_store();
	printf("conformance: store %s (%s)\n", dlock_store_uri(s), dlock_store_kind(s));
	dlock_store_close(s);

	size_t ran = tu_run_cases(cases, sizeof cases / sizeof cases[0], argc, argv, 2);
	if (argc > 2)
		ran += tu_run_cases(chaos_cases, sizeof chaos_cases / sizeof chaos_cases[0], argc, argv, 2);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	printf("conformance: %zu case(s) run, %d unsupported\n", ran, unsupported);
	return tu_done("conformance");
}
