/*
 * etcd under network faults, on its own real etcd member (tests/servers/etcd.sh):
 * the fault proxy (src/tools/faultproxy.c) sits between the client under
 * test and etcd and passes, blackholes (keeps the connection, forwards
 * nothing) or drops replies (forwards requests, swallows answers); the member
 * itself is also paused with SIGSTOP. A second client talks to etcd directly.
 *
 *   bounds     every call returns by its bound with the member hung or the link
 *              blackholed: acquire(wait 1000) within 1000 ms + TU_SCHED_GRACE_MS
 *              (a wait rides a stopped member out to its deadline), release within
 *              timeout= + 50 ms, open within connect_timeout + 50 ms, status
 *              within timeout= + 50 ms.
 *   lost       a held lock (ttl 2000) whose link is blackholed gets on_lost no
 *              later than its deadline + TU_SCHED_GRACE_MS, and before the direct client is
 *              granted.
 *   orphan     locks A and B on one TTL; the release of A is blackholed (it
 *              fails), then the link passes again: while B stays held and
 *              renewed, the direct client gets A within one TTL.
 *   orphanstore the same on the backend alone, with no core to retry the
 *              release in the background: only the store's orphan rule frees A.
 *   lostreply  a try whose answer is dropped (applied, unanswered) fails within
 *              its bound; the direct client is refused while that key stands;
 *              a retry by the same handle gets the lock; never two holders,
 *              fences increase.
 *   slowlink   a link with TTL/5 each way: the holder keeps its lock through
 *              renewals for three TTLs, nobody else is granted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "core/internal.h"
#include "testutil/netutil.h"
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef ETCD_SCRIPT
#error "build with -DETCD_SCRIPT=path/to/tests/servers/etcd.sh"
#endif

static char uri[1024];    /* direct */
static char server_dir[256];
static int server_pid = -1;

static void die(const char *what)
{
	fprintf(stderr, "etcd_net: %s: %s\n", what, dlock_error_last()->message);
	exit(2);
}

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- the proxy (src/tools/faultproxy.c) ---- */

static tu_proxy *px;
static char *proxied; /* etcd://127.0.0.1:<proxy port> */

static void px_set(const char *mode)
{
	if (tu_proxy_set(px, -1, mode) != 0) {
		fprintf(stderr, "etcd_net: proxy mode %s failed\n", mode);
		exit(2);
	}
}

/* ---- the member ---- */

static void server_stop(void)
{
	char cmd[1024];
	if (!server_dir[0])
		return;
	if (server_pid > 0)
		kill(server_pid, SIGCONT);
	snprintf(cmd, sizeof(cmd), "bash '%s' stop '%s' >/dev/null 2>&1; rm -rf '%s'", ETCD_SCRIPT, server_dir,
		 server_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "etcd_net: stopping %s failed\n", server_dir);
	server_dir[0] = '\0';
}

static void on_signal(int sig)
{
	server_stop();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void server_start(void)
{
	char cmd[1024], path[512], line[128], pidfile[400];
	snprintf(server_dir, sizeof(server_dir), "/tmp/dlock-etcdnet-XXXXXX");
	if (!mkdtemp(server_dir))
		die("mkdtemp");
	atexit(server_stop);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	snprintf(cmd, sizeof(cmd), "bash '%s' start '%s' 1", ETCD_SCRIPT, server_dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "etcd_net: could not start etcd\n");
		exit(2);
	}
	snprintf(path, sizeof(path), "%s/uri", server_dir);
	FILE *f = fopen(path, "r");
	if (!f || !fgets(uri, sizeof(uri), f))
		die("read uri");
	fclose(f);
	uri[strcspn(uri, "\r\n")] = '\0';
	snprintf(path, sizeof(path), "%s/members", server_dir);
	f = fopen(path, "r");
	if (!f || fscanf(f, "%*s %127s %399s", line, pidfile) != 2)
		die("read members");
	fclose(f);
	f = fopen(pidfile, "r");
	if (!f || fscanf(f, "%d", &server_pid) != 1)
		die("read pid");
	fclose(f);
}

/* ---- helpers ---- */

/* The member through the proxy, with a request timeout of timeout_ms. */
static dlock_store *open_proxied(long timeout_ms, long connect_ms)
{
	char u[256];
	snprintf(u, sizeof(u), "%s/?timeout=%ldms&connect_timeout=%ldms", proxied, timeout_ms, connect_ms);
	return nu_open(u);
}

static char run_id[16];

static void lock_name(char *out, size_t n, const char *what)
{
	snprintf(out, n, "etcdnet/%s/%s", run_id, what);
}

static int timed_out_msg(void)
{
	return strstr(dlock_error_last()->message, "timed out") != NULL;
}

/* ---- cases ---- */

static void case_bounds(void)
{
	char name[128];
	lock_name(name, sizeof(name), "bounds");
	dlock_store *direct = nu_open(uri);
	dlock_store *s = open_proxied(300, 500);
	dlock_lock *h = nu_lock(direct, name, 10000, 0), *a = nu_lock(s, name, 10000, 0);
	/* Release and status run on a store of their own: a store whose
	 * acquire timed out retries the undo in the background, and that holds
	 * the store for up to one request timeout (a core matter). */
	dlock_store *s3 = open_proxied(300, 500);
	dlock_lock *b = nu_lock(s3, "etcdnet-bounds-free", 10000, 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	CHECK_RC(dlock_acquire(h, 0), 0);

	/* The member hung before the call. */
	long long t0 = tu_now_ms();
	tu_stop(server_pid);
	int rc = dlock_acquire(a, 1000);
	long long took = tu_now_ms() - t0;
	printf("  acquire(wait 1000), member stopped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	CHECK(took <= 1000 + TU_SCHED_GRACE_MS);

	/* With the default request timeout (2 s, longer than the wait). */
	{
		char u2[256];
		snprintf(u2, sizeof(u2), "%s/?connect_timeout=2s", proxied);
		kill(server_pid, SIGCONT);
		dlock_store *s2 = nu_open(u2);
		dlock_lock *a2 = nu_lock(s2, name, 10000, 0);
		tu_stop(server_pid);
		t0 = tu_now_ms();
		rc = dlock_acquire(a2, 1000);
		took = tu_now_ms() - t0;
		printf("  acquire(wait 1000), timeout 2 s, member stopped: %s after %lld ms\n", dlock_error_name(rc),
		       took);
		CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
		CHECK(took <= 1000 + TU_SCHED_GRACE_MS);
		dlock_lock_free(a2);
		kill(server_pid, SIGCONT);
		dlock_store_close(s2);
		tu_stop(server_pid);
	}

	/* Status: within timeout=. */
	t0 = tu_now_ms();
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[1] = { name };
	rc = dlock_store_status(s3, names, 1, &st, &n);
	took = tu_now_ms() - t0;
	printf("  status, member stopped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 350);
	dlock_status_free(st, n);

	/* Release with the member stopped: within timeout= (300 ms) + 50 ms. */
	t0 = tu_now_ms();
	rc = dlock_release(b);
	took = tu_now_ms() - t0;
	printf("  release, member stopped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE && timed_out_msg());
	CHECK(took <= 350);

	/* Open: within connect_timeout (500 ms) in total. */
	char u[256];
	dlock_store *o = NULL;
	snprintf(u, sizeof(u), "%s/?connect_timeout=500ms&timeout=2s", proxied);
	t0 = tu_now_ms();
	rc = dlock_store_open(&o, u);
	took = tu_now_ms() - t0;
	printf("  open, member stopped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 550);
	dlock_store_close(o);
	kill(server_pid, SIGCONT);

	/* The same with the link blackholed and the member running. */
	px_set("blackhole");
	t0 = tu_now_ms();
	rc = dlock_acquire(a, 1000);
	took = tu_now_ms() - t0;
	printf("  acquire(wait 1000), blackhole: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	CHECK(took <= 1000 + TU_SCHED_GRACE_MS);
	px_set("pass");

	/* And a waiter that is queued and watching when the member stops. */
	CHECK_RC(dlock_acquire(a, 0), DLOCK_ELOCKED);
	t0 = tu_now_ms();
	pid_t pid = fork();
	if (pid == 0) {
		nap_ms(400);
		kill(server_pid, SIGSTOP); /* a forked child: no allocation here */
		_exit(0);
	}
	rc = dlock_acquire(a, 1000);
	took = tu_now_ms() - t0;
	printf("  acquire(wait 1000), member stopped after 400 ms: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	/* The core then cancels the registered waiter with a request timeout of
	 * its own (300 ms here) before it returns: the store's part is the wait. */
	CHECK(took <= 1000 + 300 + TU_SCHED_GRACE_MS);
	waitpid(pid, NULL, 0);
	kill(server_pid, SIGCONT);

	CHECK_RC(dlock_release(h), 0);
	dlock_lock_free(h);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s3);
	dlock_store_close(s);
	dlock_store_close(direct);
}

static void case_lost(void)
{
	char name[128];
	const long ttl = 2000;
	lock_name(name, sizeof(name), "lost");
	dlock_store *direct = nu_open(uri);
	dlock_store *s = open_proxied(300, 500);
	dlock_lock *a = nu_lock(s, name, ttl, NU_LOST), *d = nu_lock(direct, name, ttl, 0);
	nu_lost_at = 0;
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(a, 0), 0);
	nap_ms(300);
	px_set("blackhole");
	/* The deadline the core keeps: never later than t0 + ttl; renewals only move it on. */
	long long deadline = 0;
	while (dlock_held(a)) {
		deadline = tu_now_ms() + dlock_ttl_left(a);
		nap_ms(1);
	}
	(void)t0;
	int rc = dlock_acquire(d, 10000);
	long long granted = tu_now_ms();
	CHECK_RC(rc, 0);
	/* on_lost fired by then: wait for it a moment if the grant beat the callback. */
	for (int i = 0; i < 100 && !nu_lost_at; i++)
		nap_ms(10);
	printf("  on_lost %lld ms after the lease deadline; direct client granted %lld ms after on_lost\n",
	       nu_lost_at - deadline, granted - nu_lost_at);
	CHECK(nu_lost_at > 0);
	CHECK(nu_lost_at <= deadline + TU_SCHED_GRACE_MS);
	CHECK(nu_lost_at < granted);
	px_set("pass");
	CHECK_RC(dlock_release(d), 0);
	dlock_lock_free(a);
	dlock_lock_free(d);
	dlock_store_close(s);
	dlock_store_close(direct);
}

static void case_orphan(void)
{
	char na[128], nb[128];
	const long ttl = 3000;
	lock_name(na, sizeof(na), "orphanA");
	lock_name(nb, sizeof(nb), "orphanB");
	dlock_store *direct = nu_open(uri);
	dlock_store *s = open_proxied(300, 500);
	dlock_lock *a = nu_lock(s, na, ttl, 0), *b = nu_lock(s, nb, ttl, NU_LOST);
	dlock_lock *da = nu_lock(direct, na, ttl, 0), *db = nu_lock(direct, nb, ttl, 0);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	uint64_t fa = dlock_fence(a);
	px_set("blackhole");
	long long t0 = tu_now_ms();
	int rc = dlock_release(a);
	long long took = tu_now_ms() - t0;
	px_set("pass");
	printf("  release of A blackholed: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 350);
	/* B is renewed all along (its renewals carry on through the same store)... */
	rc = dlock_acquire(da, ttl + 1000);
	long long got = tu_now_ms() - t0;
	printf("  direct client got A %lld ms after the failed release (ttl %ld)\n", got, ttl);
	CHECK_RC(rc, 0);
	CHECK(got <= ttl);
	CHECK(dlock_fence(da) > fa);
	/* ...and stays ours. */
	nap_ms(ttl / 2);
	CHECK(dlock_held(b));
	CHECK(!nu_lost_at);
	CHECK_RC(dlock_acquire(db, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(da), 0);
	CHECK_RC(dlock_release(b), 0);
	CHECK_RC(dlock_acquire(db, 0), 0);
	CHECK_RC(dlock_release(db), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_lock_free(da);
	dlock_lock_free(db);
	dlock_store_close(s);
	dlock_store_close(direct);
}

/*
 * The orphan rule of the store alone, below the core (whose background
 * retry of the release would hide it): two holds A and B of one backend on
 * one TTL; A's release is blackholed and fails; then only B is renewed, as
 * the core's renewer would, every TTL/3. The direct client must get A within
 * one TTL although B's lease is kept alive all along.
 */
static void case_orphan_store(void)
{
	char na[128], nb[128];
	const long ttl = 3000;
	lock_name(na, sizeof(na), "orphanstoreA");
	lock_name(nb, sizeof(nb), "orphanstoreB");
	char u[256];
	snprintf(u, sizeof(u), "%s/?timeout=300ms&connect_timeout=500ms", proxied);
	dlock_uri *pu = NULL;
	dlock_backend *be = NULL;
	if (dlock_sys_uri_parse(&pu, u) != 0 || dlock__etcd_open(&be, pu) != 0)
		die("open backend");
	dlock_request ra = { 0 }, rb;
	ra.mode = DLOCK_EXCLUSIVE;
	ra.permits = 1;
	ra.ttl_ms = ttl;
	ra.queue_ttl_ms = 3000;
	ra.host = "test";
	ra.pid = getpid();
	rb = ra;
	ra.name = na;
	ra.owner = "00c0ffee00c0ffee00c0ffee00c0ffee-1";
	rb.name = nb;
	rb.owner = "00c0ffee00c0ffee00c0ffee00c0ffee-2";
	dlock_grant ga = { .retry_ms = -1 }, gb = { .retry_ms = -1 };
	ra.deadline_ms = tu_now_ms() + 2000;
	CHECK_RC(be->methods->acquire(be, &ra, &ga), 0);
	rb.deadline_ms = tu_now_ms() + 2000;
	CHECK_RC(be->methods->acquire(be, &rb, &gb), 0);
	px_set("blackhole");
	long long t0 = tu_now_ms();
	ra.deadline_ms = t0 + 300;
	int rc = be->methods->release(be, &ra);
	px_set("pass");
	CHECK(rc == DLOCK_EUNAVAILABLE);
	dlock_store *direct = nu_open(uri);
	dlock_lock *da = nu_lock(direct, na, ttl, 0), *db = nu_lock(direct, nb, ttl, 0);
	long long next_renew = t0, got = -1;
	int renew_failed = 0;
	while (tu_now_ms() - t0 < ttl + 1000 && got < 0) {
		if (tu_now_ms() >= next_renew) {
			const dlock_request *reqs[1] = { &rb };
			int res = -1;
			rb.deadline_ms = tu_now_ms() + 2000;
			if (be->methods->renew(be, reqs, 1, &res) != 0 || res != 0)
				renew_failed++;
			next_renew = tu_now_ms() + ttl / 3;
		}
		if (dlock_acquire(da, 0) == 0)
			got = tu_now_ms() - t0;
		else
			nap_ms(50);
	}
	printf("  store alone: direct client got A %lld ms after the failed release (ttl %ld)\n", got, ttl);
	CHECK(got >= 0 && got <= ttl);
	CHECK(renew_failed == 0);
	if (got >= 0)
		CHECK(dlock_fence(da) > ga.fence);
	CHECK_RC(dlock_acquire(db, 0), DLOCK_ELOCKED); /* B is still ours */
	if (got >= 0)
		CHECK_RC(dlock_release(da), 0);
	rb.deadline_ms = tu_now_ms() + 2000;
	CHECK_RC(be->methods->release(be, &rb), 0);
	CHECK_RC(dlock_acquire(db, 0), 0);
	CHECK_RC(dlock_release(db), 0);
	dlock_lock_free(da);
	dlock_lock_free(db);
	dlock_store_close(direct);
	be->methods->close(be);
	dlock_sys_uri_free(pu);
}

static void case_lost_reply(void)
{
	char name[128];
	const long ttl = 2000;
	lock_name(name, sizeof(name), "lostreply");
	dlock_store *direct = nu_open(uri);
	dlock_store *s = open_proxied(300, 500);
	dlock_lock *a = nu_lock(s, name, ttl, 0), *d = nu_lock(direct, name, ttl, 0);
	/* A first lock makes the store's lease exist (the grant of a lease is not the case here). */
	dlock_lock *warm = nu_lock(s, "etcdnet-lostreply-warm", ttl, 0);
	CHECK_RC(dlock_acquire(warm, 0), 0);
	CHECK_RC(dlock_release(warm), 0);
	CHECK_RC(dlock_acquire(d, 0), 0);
	uint64_t fd0 = dlock_fence(d);
	CHECK_RC(dlock_release(d), 0);

	px_set("drop");
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(a, 0);
	long long took = tu_now_ms() - t0;
	px_set("pass");
	printf("  try with its answer dropped: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE && timed_out_msg());
	CHECK(took <= 350);
	CHECK(!dlock_held(a));
	/* The try was applied. Its key stands in the way, or the core's undo
	 * (whose request the proxy forwards) already took it away: either the
	 * direct client is refused, or it is granted while `a` holds nothing. */
	int drc = dlock_acquire(d, 0);
	CHECK(drc == DLOCK_ELOCKED || drc == 0);
	if (drc == 0) {
		CHECK(!dlock_held(a));
		CHECK(dlock_fence(d) > fd0);
		fd0 = dlock_fence(d);
		CHECK_RC(dlock_release(d), 0);
	}
	/* ...and a retry through the same handle gets the lock, at once (the
	 * orphan's lease is revoked, not waited out). */
	t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(a, 5000), 0);
	took = tu_now_ms() - t0;
	printf("  retry granted after %lld ms\n", took);
	CHECK(took < ttl);
	uint64_t fa = dlock_fence(a);
	CHECK(fa > fd0);
	CHECK_RC(dlock_acquire(d, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(d, 0), 0);
	CHECK(dlock_fence(d) > fa);
	CHECK_RC(dlock_release(d), 0);
	dlock_lock_free(a);
	dlock_lock_free(d);
	dlock_lock_free(warm);
	dlock_store_close(s);
	dlock_store_close(direct);
}

/*
 * A slow link, TTL/5 each way (a round trip of 0.4 TTL): a renewal is one
 * round trip (the keepalive goes next to the read), so the holder keeps its
 * lock for three TTLs and the direct client is never granted. (With two
 * round trips a renewal took 0.8 TTL and the next one could not land before
 * the deadline of the one before.)
 */
static void case_slow_link(void)
{
	char name[128];
	const long ttl = 2000;
	lock_name(name, sizeof(name), "slowlink");
	dlock_store *direct = nu_open(uri);
	dlock_store *s = open_proxied(3000, 10000);
	dlock_lock *a = nu_lock(s, name, ttl, NU_LOST), *d = nu_lock(direct, name, ttl, 0);
	nu_lost_at = 0;
	CHECK_RC(dlock_acquire(a, 5000), 0);
	char mode[32];
	snprintf(mode, sizeof(mode), "delay %ld", ttl / 5);
	px_set(mode);
	long long until = tu_now_ms() + 3 * ttl;
	int tries = 0, stolen = 0;
	while (tu_now_ms() < until) {
		if (dlock_acquire(d, 0) == 0) {
			stolen++;
			dlock_release(d);
		}
		tries++;
		nap_ms(50);
	}
	printf("  %d tries by the direct client over %ld ms of a %ld ms round trip: %d granted; on_lost %s\n", tries,
	       3 * ttl, 2 * ttl / 5, stolen, nu_lost_at ? "fired" : "did not fire");
	CHECK(stolen == 0);
	CHECK(!nu_lost_at);
	CHECK(dlock_held(a));
	px_set("pass");
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(d, 0), 0);
	CHECK_RC(dlock_release(d), 0);
	dlock_lock_free(a);
	dlock_lock_free(d);
	dlock_store_close(s);
	dlock_store_close(direct);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	snprintf(run_id, sizeof(run_id), "%08lx", (unsigned long)(tu_now_ms() ^ (getpid() << 16)));
	server_start();
	if (!(px = tu_proxy_start(uri, &proxied))) {
		fprintf(stderr, "etcd_net: the fault proxy did not start\n");
		return 2;
        /* clang-format off */
	}
	struct {
		const char *name;
		void (*fn)(void);
	} cases[] = {
		{ "bounds", case_bounds },
		{ "lost", case_lost },
		{ "orphan", case_orphan },
		{ "orphanstore", case_orphan_store },
		{ "lostreply", case_lost_reply },
		{ "slowlink", case_slow_link },
	};
	/* clang-format on */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int want = argc < 2;
		for (int j = 1; j < argc; j++)
			want |= strcmp(argv[j], cases[i].name) == 0;
		if (!want)
			continue;
		int before = tu_failures;
		long long t = tu_now_ms();
		px_set("pass");
		cases[i].fn();
		printf("%-12s %s (%lld ms)\n", cases[i].name, tu_failures == before ? "ok" : "FAILED", tu_now_ms() - t);
	}
	tu_proxy_stop(px);
	free(proxied);
	server_stop();
	return tu_done("etcd_net");
}
