/*
 * The store conformance suite: the guarantees of DESIGN.md §1, checked
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
#include "unit/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char uri[4096];
static char tmpdir[256];
static char run_id[32];
static int unsupported;

typedef struct { int rd, wr; } event;

/* ---------------------------------------------------------------- helpers */

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (last error: %s: %s)\n", dlock_error_name(dlock_error_last()->code),
		dlock_error_last()->message);
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

static dlock_lock *new_lock(dlock_store *s, const char *name, dlock_mode mode, unsigned permits,
			    int fair, int64_t ttl)
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
	fflush(NULL);
	pid_t p = fork();
	if (p < 0)
		die("fork");
	if (p == 0) {
		char a[32], fds[4][16];
		snprintf(a, sizeof(a), "%ld", arg);
		snprintf(fds[0], 16, "%d", ev_a.rd);
		snprintf(fds[1], 16, "%d", ev_a.wr);
		snprintf(fds[2], 16, "%d", ev_b.rd);
		snprintf(fds[3], 16, "%d", ev_b.wr);
		execl(self_exe, self_exe, "--child", uri, tmpdir, run_id, fname, a, fds[0], fds[1], fds[2],
		      fds[3], (char *)NULL);
		_exit(98);
	}
	/* Only the child writes ev_a: if it dies, our read of ev_a sees EOF instead of hanging. */
	if (ev_a.wr >= 0) {
		close(ev_a.wr);
		ev_a.wr = -1;
	}
	return p;
}

#define spawn(fn, arg) spawn_named(#fn, arg)

static int reap(pid_t p)
{
	int st;
	while (waitpid(p, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

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

/* 16 processes x 200 increments of a plain file under the lock: exactly 3200, and the
 * fence of every increment is higher than the one before it. */
#define MUTEX_PROCS 16
#define MUTEX_ROUNDS 200

static int mutex_child(long i)
{
	char name[128];
	lock_name(name, sizeof(name), "mutex");
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, DLOCK_EXCLUSIVE, 1, 0, 10000);
	for (int r = 0; r < MUTEX_ROUNDS; r++) {
		if (dlock_acquire(l, 60000) != 0)
			die("mutex child %ld: acquire", i);
		long v = read_long("counter");
		sched_yield();
		write_long("counter", v + 1);
		append_line("fences", "%llu\n", (unsigned long long)dlock_fence(l));
		if (dlock_release(l) != 0)
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
		fprintf(stderr, "paused holder: lost_fired=%d held=%d release=%s\n", (int)lost_fired,
			dlock_held(l), dlock_error_name(rc));
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
	kill(p, SIGSTOP);
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
	const char *odd[] = { "a/b/../c", "quote'\"; DROP TABLE x; --", "ünïcødé/名前", "{braces}:colon",
			      "%2F-percent", big + 2 };
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

static const struct child_entry children[] = {
	{ "mutex_child", mutex_child },   { "holder_then_hang", holder_then_hang },
	{ "paused_holder", paused_holder }, { "fair_waiter", fair_waiter },
	{ "shared_writer", shared_writer }, { "sem_child", sem_child },
};

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

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
	{ "bad_input", case_bad_input },
	{ "owner_only", case_owner_only },
	{ "reentrancy_and_fences", case_reentrancy_and_fences },
	{ "try_and_timeout", case_try_and_timeout },
	{ "status", case_status },
	{ "mutual_exclusion", case_mutual_exclusion },
	{ "killed_holder", case_killed_holder },
	{ "paused_holder", case_paused_holder },
	{ "fair_order", case_fair_order },
	{ "shared", case_shared },
	{ "semaphore", case_semaphore },
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "--child") == 0)
		return child_main(argc, argv);
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		return 2;
	self_exe[n] = '\0';
	ev_a = ev_b = (event){ -1, -1 };
	if (argc > 1 && argv[1][0]) {
		snprintf(uri, sizeof(uri), "%s", argv[1]);
	} else {
		const char *file = getenv("DLOCK_TEST_URI_FILE");
		FILE *f = file ? fopen(file, "r") : NULL;
		if (!f || !fgets(uri, sizeof(uri), f)) {
			fprintf(stderr, "conformance: give a store URI or set DLOCK_TEST_URI_FILE (server not started?)\n");
			return 2;
		}
		fclose(f);
		uri[strcspn(uri, "\r\n")] = '\0';
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

	int ran = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int want = argc <= 2;
		for (int a = 2; a < argc; a++)
			want |= strcmp(argv[a], cases[i].name) == 0;
		if (!want)
			continue;
		int before = tu_failures;
		long long t0 = tu_now_ms();
		cases[i].fn();
		printf("%-24s %s (%lld ms)\n", cases[i].name, tu_failures == before ? "ok" : "FAILED",
		       tu_now_ms() - t0);
		ran++;
	}
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	printf("conformance: %d case(s) run, %d unsupported\n", ran, unsupported);
	return tu_done("conformance");
}
