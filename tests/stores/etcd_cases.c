/*
 * etcd's own failure cases, on real etcd servers.
 *
 *   etcd_cases single    against the fixture's single member (DLOCK_TEST_URI_FILE):
 *                        killed holder replaced within TTL + 1 s; a waiter stopped
 *                        past its TTL is never told it holds; release wakes a waiter
 *                        by watch (not by polling); a waiter in the middle that leaves
 *                        does not let the last one in; names with '/' and '%' stay apart;
 *                        locks with different TTLs on one store all stay renewed;
 *                        a hold handed over (detach) outlives its store and is
 *                        extended and released through the handle elsewhere.
 *   etcd_cases auth      on its own member (auth enabled, token TTL 1 s): bad and
 *                        missing credentials fail with DLOCK_EAUTH; good ones work,
 *                        also after the token expired (re-authentication).
 *   etcd_cases cluster   on its own 3-member cluster: kill the member the client
 *                        talks to (the leader) while a lock is held; the lock stays
 *                        held, renewal fails over, release works.
 *   etcd_cases chaos     on its own 3-member cluster (issue 31): with the member the
 *                        client talks to SIGSTOPped, open, a try-once acquire and a
 *                        release succeed within the stopped member's share of their
 *                        deadline plus what the call costs on a healthy cluster (the
 *                        request races to the next member: gateway.c "Hedging"), an
 *                        open with connect_timeout=30s within one
 *                        request timeout plus an open of a live member; with the leader killed, a wait of 8 s is granted
 *                        after the election instead of ending "unavailable" after
 *                        its first try. Bounds: the deadline plus the scheduling
 *                        delay measured during the call.
 *   etcd_cases tls       on its own member with TLS and client certificates:
 *                        etcds:// with cacert/cert/key works; without the client
 *                        certificate, or over plain HTTP, open fails.
 *
 * Children are fresh processes (fork + exec of this program), so none inherits
 * a store or a renewal thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "testutil/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
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

static char uri[1024];
static char self_exe[4096];
static char run_id[16];

static void die(const char *what)
{
	fprintf(stderr, "etcd_cases: %s: %s\n", what, dlock_error_last()->message);
	exit(2);
}

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static dlock_store *open_uri(const char *u)
{
	dlock_store *s;
	if (dlock_store_open(&s, u) != 0)
		die("open store");
	return s;
}

static dlock_lock *new_lock(dlock_store *s, const char *name, int64_t ttl)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	dlock_lock *l;
	o.ttl_ms = ttl;
	if (dlock_lock_new(&l, s, name, &o) != 0)
		die("lock_new");
	return l;
}

static void lock_name(char *out, size_t n, const char *what)
{
	snprintf(out, n, "etcdcase/%s/%s", run_id, what);
}

/* Holders and waiters of `name` as the store reports them. */
static int counts(dlock_store *s, const char *name, size_t *holders, size_t *waiters)
{
	dlock_lock_status *st;
	size_t n;
	const char *names[1] = { name };
	if (dlock_store_status(s, names, 1, &st, &n) != 0 || n != 1)
		return -1;
	*holders = st[0].nholders;
	*waiters = st[0].waiters;
	dlock_status_free(st, n);
	return 0;
}

/* ---- children: report to the parent through fd 3 (results) ---- */

typedef struct report {
	int rc;
	uint64_t fence;
	long long at_ms; /* CLOCK_MONOTONIC is system-wide: comparable across processes */
} report;

static void send_report(int fd, int rc, uint64_t fence)
{
	report r = { rc, fence, tu_now_ms() };
	if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(3);
}

static int read_report(int fd, report *r, long timeout_ms)
{
	struct pollfd p = { fd, POLLIN, 0 };
	if (poll(&p, 1, (int)timeout_ms) != 1)
		return 0;
	return read(fd, r, sizeof(*r)) == (ssize_t)sizeof(*r);
}

/* Hold `name` with `ttl`, report, then hang until killed. */
static int child_hold(const char *name, long ttl, int fd)
{
	dlock_store *s = open_uri(uri);
	dlock_lock *l = new_lock(s, name, ttl);
	int rc = dlock_acquire(l, 0);
	send_report(fd, rc, dlock_fence(l));
	for (;;)
		pause();
	return 0;
}

/* Wait for `name` with `ttl`, report the outcome, release. */
static int child_wait(const char *name, long ttl, int fd)
{
	dlock_store *s = open_uri(uri);
	dlock_lock *l = new_lock(s, name, ttl);
	int rc = dlock_acquire(l, 60000);
	send_report(fd, rc, dlock_fence(l));
	if (rc == 0 && dlock_release(l) != 0)
		return 4;
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

static void close_fd(void *fd)
{
	close(*(int *)fd);
}

static pid_t spawn(const char *what, const char *name, long ttl, int *rd)
{
	int fd[2];
	if (pipe(fd) != 0)
		die("pipe");
	char a[32], f[16];
	snprintf(a, sizeof(a), "%ld", ttl);
	snprintf(f, sizeof(f), "%d", fd[1]);
	char *argv[] = { self_exe, "--child", (char *)what, uri, (char *)name, a, f, NULL };
	pid_t p = tu_spawn_self(argv, close_fd, &fd[0]);
	if (p < 0)
		die("fork");
	close(fd[1]);
	*rd = fd[0];
	return p;
}

#define reap tu_reap

/* ---- single member ---- */

static void case_killed_holder(void)
{
	const long ttl = 2000;
	char name[128];
	int rd;
	report r;
	lock_name(name, sizeof(name), "killed");
	pid_t p = spawn("hold", name, ttl, &rd);
	CHECK(read_report(rd, &r, 10000) && r.rc == 0);
	dlock_store *s = open_uri(uri);
	dlock_lock *l = new_lock(s, name, 5000);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	long long t0 = tu_now_ms();
	kill(p, SIGKILL);
	reap(p);
	CHECK_RC(dlock_acquire(l, 10000), 0);
	long long took = tu_now_ms() - t0;
	printf("  killed holder (ttl %ld ms) replaced after %lld ms\n", ttl, took);
	CHECK(took <= ttl + 1000);
	CHECK(dlock_fence(l) > r.fence);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	close(rd);
}

static void case_stopped_waiter(void)
{
	const long ttl = 2000;
	char name[128];
	int rd;
	report r;
	lock_name(name, sizeof(name), "stopped");
	dlock_store *s = open_uri(uri);
	dlock_lock *a = new_lock(s, name, 20000), *b = new_lock(s, name, 20000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	pid_t p = spawn("wait", name, ttl, &rd);
	CHECK(tu_await_waiters(s, name, 1, 10000));
	tu_stop(p);
	/* Its lease runs out while it is stopped: its queue key goes. */
	CHECK(tu_await_waiters(s, name, 0, ttl + 5000));
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(b, 0), 0); /* the stopped waiter lost its place */
	uint64_t fb = dlock_fence(b);
	kill(p, SIGCONT);
	/* It wakes up, finds its key gone and queues again behind b... */
	CHECK(tu_await_waiters(s, name, 1, 10000));
	/* ...without ever having been told it holds the lock. */
	struct pollfd pf = { rd, POLLIN, 0 };
	CHECK(poll(&pf, 1, 0) == 0);
	CHECK(dlock_held(b));
	CHECK_RC(dlock_release(b), 0);
	CHECK(read_report(rd, &r, 10000));
	CHECK(r.rc == 0);
	CHECK(r.fence > fb);
	CHECK(reap(p) == 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s);
	close(rd);
}

static void case_watch_wakeup(void)
{
	char name[128];
	int rd;
	report r;
	lock_name(name, sizeof(name), "wake");
	dlock_store *s = open_uri(uri);
	dlock_lock *a = new_lock(s, name, 10000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	pid_t p = spawn("wait", name, 10000, &rd);
	CHECK(tu_await_waiters(s, name, 1, 10000));
	nap_ms(300); /* let the waiter settle into its watch */
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(a), 0);
	CHECK(read_report(rd, &r, 10000) && r.rc == 0);
	long long lag = r.at_ms - t0;
	printf("  release -> waiter granted in %lld ms\n", lag);
	/* The core retries every second without a wake-up: a watch does it at once. */
	CHECK(lag < 300);
	CHECK(reap(p) == 0);
	dlock_lock_free(a);
	dlock_store_close(s);
	close(rd);
}

/* A waiter between the holder and us leaves (killed: its key goes with its
 * lease). Its delete must not make us think we are first: the wait counts
 * every key in our way, and the holder's is still there. */
static void case_middle_leaves(void)
{
	const long short_ttl = 1000;
	char name[128];
	int rd1, rd2;
	report r;
	lock_name(name, sizeof(name), "middle");
	dlock_store *s = open_uri(uri);
	dlock_lock *a = new_lock(s, name, 20000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fa = dlock_fence(a);
	pid_t p1 = spawn("wait", name, short_ttl, &rd1);
	CHECK(tu_await_waiters(s, name, 1, 10000));
	pid_t p2 = spawn("wait", name, 20000, &rd2);
	CHECK(tu_await_waiters(s, name, 2, 10000));
	nap_ms(300); /* let both settle into their watches */
	kill(p1, SIGKILL);
	reap(p1);
	/* The killed waiter's key goes with its lease... */
	CHECK(tu_await_waiters(s, name, 1, short_ttl + 5000));
	/* ...and the last waiter stays a waiter while we hold. */
	struct pollfd pf = { rd2, POLLIN, 0 };
	CHECK(poll(&pf, 1, 1000) == 0);
	CHECK(dlock_held(a));
	CHECK_RC(dlock_release(a), 0);
	CHECK(read_report(rd2, &r, 10000));
	CHECK(r.rc == 0);
	CHECK(r.fence > fa);
	CHECK(reap(p2) == 0);
	dlock_lock_free(a);
	dlock_store_close(s);
	close(rd1);
	close(rd2);
}

static void case_names_apart(void)
{
	char n1[128], n2[128], n3[128], n4[128];
	lock_name(n1, sizeof(n1), "dir");
	lock_name(n2, sizeof(n2), "dir/sub");
	lock_name(n3, sizeof(n3), "x/y");
	lock_name(n4, sizeof(n4), "x%2Fy");
	dlock_store *s = open_uri(uri);
	dlock_lock *l[4] = { new_lock(s, n1, 5000), new_lock(s, n2, 5000), new_lock(s, n3, 5000),
			     new_lock(s, n4, 5000) };
	for (int i = 0; i < 4; i++)
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	size_t h, w;
	CHECK(counts(s, n1, &h, &w) == 0 && h == 1 && w == 0);
	CHECK(counts(s, n3, &h, &w) == 0 && h == 1 && w == 0);
	for (int i = 0; i < 4; i++) {
		CHECK_RC(dlock_release(l[i]), 0);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s);
}

static void case_mixed_ttls(void)
{
	char n1[128], n2[128];
	lock_name(n1, sizeof(n1), "ttl2");
	lock_name(n2, sizeof(n2), "ttl5");
	dlock_store *s = open_uri(uri), *o = open_uri(uri);
	dlock_lock *a = new_lock(s, n1, 2000), *b = new_lock(s, n2, 5000);
	dlock_lock *x = new_lock(o, n1, 2000), *y = new_lock(o, n2, 2000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	nap_ms(6000); /* past both TTLs: only renewal keeps them */
	CHECK(dlock_held(a) && dlock_held(b));
	CHECK_RC(dlock_acquire(x, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_acquire(y, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_extend(a, 7000), 0); /* moves a onto the 7 s lease */
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_release(b), 0);
	CHECK_RC(dlock_acquire(x, 0), 0);
	CHECK_RC(dlock_release(x), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_lock_free(x);
	dlock_lock_free(y);
	dlock_store_close(o);
	dlock_store_close(s);
}

/* A hold granted on the shared lease as it was last kept alive (the acquire
 * sends no keep-alive of its own when two thirds of a TTL are left): its
 * lease counts from that keep-alive, not from the acquire, it never ends
 * later by our count than by the server's, and renewal keeps it past its TTL. */
static void case_lease_age(void)
{
	char n1[128], n2[128];
	lock_name(n1, sizeof(n1), "age1");
	lock_name(n2, sizeof(n2), "age2");
	dlock_store *s = open_uri(uri);
	dlock_lock *a = new_lock(s, n1, 3000), *b = new_lock(s, n2, 3000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	nap_ms(600); /* the shared lease is 600 ms old: 2.4 s of 3 left, no keep-alive for b */
	CHECK_RC(dlock_acquire(b, 0), 0);
	int64_t left_a = dlock_ttl_left(a), left_b = dlock_ttl_left(b);
	printf("  a (first on the lease) has %lld ms left, b (600 ms later) %lld ms\n", (long long)left_a,
	       (long long)left_b);
	CHECK(left_b <= left_a + 50); /* b's lease is a's keep-alive, not a fresh 3 s */
	CHECK(left_b < 3000 - 400);
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[1] = { n2 };
	CHECK_RC(dlock_store_status(s, names, 1, &st, &n), 0);
	/* etcd reports whole seconds left, rounded down: up to 1 s more */
	CHECK(n == 1 && st[0].nholders == 1 && st[0].holders[0].ttl_left_ms >= 0 &&
	      dlock_ttl_left(b) <= st[0].holders[0].ttl_left_ms + 1000);
	dlock_status_free(st, n);
	nap_ms(4000); /* past the TTL: only renewal keeps them */
	CHECK(dlock_held(a) && dlock_held(b));
	dlock_store *o = open_uri(uri);
	dlock_lock *x = new_lock(o, n2, 3000);
	CHECK_RC(dlock_acquire(x, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(b), 0);
	CHECK_RC(dlock_acquire(x, 0), 0);
	CHECK_RC(dlock_release(x), 0);
	CHECK_RC(dlock_release(a), 0);
	dlock_lock_free(x);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(o);
	dlock_store_close(s);
}

/* `dlock acquire` then `dlock release HANDLE` from another process: a hold
 * handed over survives the store's close (its lease is not revoked) and the
 * handle releases it from a new store. */
static void case_handover(void)
{
	char name[128];
	char *handle = NULL;
	lock_name(name, sizeof(name), "handover");
	dlock_store *s = open_uri(uri);
	dlock_lock *a = new_lock(s, name, 10000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fence = dlock_fence(a);
	CHECK_RC(dlock_lock_detach(a, &handle), 0);
	dlock_lock_free(a);
	dlock_store_close(s);
	dlock_store *s2 = open_uri(uri);
	dlock_lock *b = new_lock(s2, name, 10000), *c = new_lock(s2, name, 10000);
	CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
	CHECK(handle && dlock_lock_attach(c, handle) == 0);
	CHECK_RC(dlock_extend(c, 5000), 0);
	CHECK_RC(dlock_release(c), 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	CHECK(dlock_fence(b) > fence);
	CHECK_RC(dlock_release(b), 0);
	dlock_free(handle);
	dlock_lock_free(b);
	dlock_lock_free(c);
	dlock_store_close(s2);
}

/* ---- own servers ---- */

static char server_dir[256];

static void server_stop(void)
{
	char cmd[1024];
	if (!server_dir[0])
		return;
	snprintf(cmd, sizeof(cmd), "bash '%s' stop '%s' >/dev/null 2>&1; rm -rf '%s'", ETCD_SCRIPT, server_dir,
		 server_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "etcd_cases: stopping %s failed\n", server_dir);
	server_dir[0] = '\0';
}

static void on_signal(int sig)
{
	server_stop();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void server_start(int members, const char *extra_args, int tls)
{
	char cmd[2048];
	snprintf(server_dir, sizeof(server_dir), "/tmp/dlock-etcdcase-XXXXXX");
	if (!mkdtemp(server_dir))
		die("mkdtemp");
	atexit(server_stop);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	snprintf(cmd, sizeof(cmd), "DLOCK_ETCD_TLS='%s' DLOCK_ETCD_ARGS='%s' bash '%s' start '%s' %d", tls ? "1" : "",
		 extra_args, ETCD_SCRIPT, server_dir, members);
	if (system(cmd) != 0) {
		fprintf(stderr, "etcd_cases: could not start etcd (%s)\n", cmd);
		exit(2);
	}
	char path[512];
	snprintf(path, sizeof(path), "%s/uri", server_dir);
	FILE *f = fopen(path, "r");
	if (!f || !fgets(uri, sizeof(uri), f))
		die("read uri");
	fclose(f);
	uri[strcspn(uri, "\r\n")] = '\0';
}

static int sh(const char *fmt, const char *a, const char *b)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), fmt, a, b);
	return system(cmd);
}

static void case_auth(void)
{
	server_start(1, "--auth-token-ttl=1", 0);
	const char *hosts = uri + strlen("etcd://");
	char good[1200], bad[1200];
	CHECK(sh("ETCDCTL_API=3 etcdctl --endpoints=http://%s user add root:s3cret >/dev/null && "
		 "ETCDCTL_API=3 etcdctl --endpoints=http://%s auth enable >/dev/null",
		 hosts, hosts) == 0);
	snprintf(good, sizeof(good), "etcd://root:s3cret@%s", hosts);
	snprintf(bad, sizeof(bad), "etcd://root:wrong@%s", hosts);
	dlock_store *s;
	CHECK_RC(dlock_store_open(&s, bad), DLOCK_EAUTH);
	CHECK(strstr(dlock_error_last()->message, "wrong") == NULL);
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_EAUTH); /* no credentials */
	s = open_uri(good);
	dlock_lock *l = new_lock(s, "auth", 3000);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	nap_ms(2500); /* the 1 s token expires */
	CHECK_RC(dlock_acquire(l, 0), 0);
	nap_ms(4000); /* renewals re-authenticate as needed */
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	server_stop();
}

static void case_tls(void)
{
	server_start(1, "", 1);
	/* etcds://127.0.0.1:P/?cacert=C&cert=X&key=K */
	char hostport[128], ca[600], nocert[1200], plain[300], badopt[900];
	const char *hp = uri + strlen("etcds://"), *q = strchr(uri, '?');
	snprintf(hostport, sizeof(hostport), "%.*s", (int)strcspn(hp, "/?"), hp);
	snprintf(ca, sizeof(ca), "%.*s", (int)strcspn(q + 1, "&"), q + 1);
	snprintf(nocert, sizeof(nocert), "etcds://%s/?%s", hostport, ca);
	snprintf(plain, sizeof(plain), "etcd://%s", hostport);
	snprintf(badopt, sizeof(badopt), "etcd://%s/?%s", hostport, ca);
	dlock_store *s;
	CHECK_RC(dlock_store_open(&s, nocert), DLOCK_EUNAVAILABLE); /* the member wants a client cert */
	CHECK_RC(dlock_store_open(&s, plain), DLOCK_EUNAVAILABLE);  /* plain HTTP to a TLS port */
	CHECK_RC(dlock_store_open(&s, badopt), DLOCK_EINVAL);       /* cacert= needs etcds:// */
	s = open_uri(uri);
	dlock_lock *a = new_lock(s, "tls", 3000), *b = new_lock(s, "tls", 3000);
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
	CHECK_RC(dlock_release(a), 0);
	CHECK_RC(dlock_acquire(b, 1000), 0);
	CHECK(dlock_fence(b) > 0);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s);
	server_stop();
}

/* "PID_FILE" of the member listening on `port`, from DIR/members. */
static int member_pid(const char *port)
{
	char path[512], name[32], p[32], pidfile[400];
	snprintf(path, sizeof(path), "%s/members", server_dir);
	FILE *f = fopen(path, "r");
	int pid = -1;
	while (f && fscanf(f, "%31s %31s %399s", name, p, pidfile) == 3) {
		if (strcmp(p, port) == 0) {
			FILE *pf = fopen(pidfile, "r");
			if (pf && fscanf(pf, "%d", &pid) != 1)
				pid = -1;
			if (pf)
				fclose(pf);
		}
	}
	if (f)
		fclose(f);
	return pid;
}

static volatile sig_atomic_t lost;

static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	lost = 1;
}

static void case_cluster_failover(void)
{
	server_start(3, "", 0);
	const char *hosts = uri + strlen("etcd://");
	char cmd[1400], line[512], leader[64] = "", others[256] = "";
	/* Put the leader first: the member we talk to is the one we kill, and
	 * losing the leader is the hard case (an election, leases handed over). */
	snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s endpoint status", hosts);
	FILE *f = popen(cmd, "r");
	while (f && fgets(line, sizeof(line), f)) {
		char ep[64];
		if (sscanf(line, "%63[^,],", ep) != 1)
			continue;
		const char *hp = strncmp(ep, "http://", 7) == 0 ? ep + 7 : ep;
		if (strstr(line, ", true, false,"))
			snprintf(leader, sizeof(leader), "%s", hp);
		else
			snprintf(others + strlen(others), sizeof(others) - strlen(others), ",%s", hp);
	}
	if (f)
		pclose(f);
	CHECK(leader[0] && others[0]);
	if (!leader[0] || !others[0])
		return;
	char u1[512], u2[512];
	snprintf(u1, sizeof(u1), "etcd://%s%s", leader, others);
	snprintf(u2, sizeof(u2), "etcd://%s", others + 1);
	printf("  killing leader %s, which the client talks to: %s\n", leader, u1);

	/* Above an election (1-2 s with etcd's default 1 s election timeout)
	 * plus one renewal interval: a shorter lease cannot survive losing the
	 * leader with any client. */
	const long ttl = 5000;
	dlock_store *s = open_uri(u1);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = on_lost;
	dlock_lock *l;
	if (dlock_lock_new(&l, s, "failover", &o) != 0)
		die("lock_new");
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t fence = dlock_fence(l);
	int pid = member_pid(strrchr(leader, ':') + 1);
	CHECK(pid > 0);
	if (pid > 0)
		kill(pid, SIGKILL);
	long long t0 = tu_now_ms();
	/* Three TTLs: the lease only lives if renewals reach the new leader. */
	while (tu_now_ms() - t0 < 3 * ttl) {
		if (!dlock_held(l))
			break;
		nap_ms(100);
	}
	CHECK(dlock_held(l));
	CHECK(!lost);
	dlock_store *s2 = open_uri(u2);
	dlock_lock *l2 = new_lock(s2, "failover", ttl);
	CHECK_RC(dlock_acquire(l2, 0), DLOCK_ELOCKED); /* still held in etcd */
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_acquire(l2, 5000), 0);
	CHECK(dlock_fence(l2) > fence);
	CHECK_RC(dlock_release(l2), 0);
	dlock_lock_free(l2);
	dlock_lock_free(l);
	dlock_store_close(s2);
	dlock_store_close(s);
	server_stop();
}

/* ---- chaos: a member stopped, the leader killed ---- */

/* The leader's host:port, and the others' as ",h:p,h:p", from etcdctl. */
static int find_leader(char *leader, size_t nl, char *others, size_t no)
{
	const char *hosts = uri + strlen("etcd://");
	char cmd[1400], line[512];
	leader[0] = others[0] = '\0';
	snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s endpoint status", hosts);
	FILE *f = popen(cmd, "r");
	while (f && fgets(line, sizeof(line), f)) {
		char ep[64];
		if (sscanf(line, "%63[^,],", ep) != 1)
			continue;
		const char *hp = strncmp(ep, "http://", 7) == 0 ? ep + 7 : ep;
		if (strstr(line, ", true, false,"))
			snprintf(leader, nl, "%s", hp);
		else
			snprintf(others + strlen(others), no - strlen(others), ",%s", hp);
	}
	if (f)
		pclose(f);
	CHECK(leader[0] && others[0]);
	return leader[0] && others[0];
}

static void case_chaos_stopped(void)
{
	/* A follower first in the URI: where every handle starts. (A stopped
	 * leader stops writes everywhere until an election: case_chaos_leader.) */
	char leader[64], others[256], u[600], f1[64];
	if (!find_leader(leader, sizeof(leader), others, sizeof(others)))
		return;
	snprintf(f1, sizeof(f1), "%.*s", (int)strcspn(others + 1, ","), others + 1);
	snprintf(u, sizeof(u), "etcd://%s,%s%s", f1, leader, others + 1 + strlen(f1));
	int pid1 = member_pid(strrchr(f1, ':') + 1);
	CHECK(pid1 > 0);
	if (pid1 <= 0)
		return;
	const long long request_ms = 2000, connect_ms = 5000; /* the URI defaults */
	dlock_store *sa = open_uri(u), *sb = open_uri(u);
	dlock_lock *held = new_lock(sb, "chaos-stop-rel", 10000);
	CHECK_RC(dlock_acquire(held, 0), 0);
	dlock_lock *a = new_lock(sa, "chaos-stop-acq", 7000); /* a new TTL: a lease grant too */
	/* What the same calls cost on a live member, through a store handle of
	 * its own (a new connection, a lease grant, a write): the part of a
	 * bound that is not the stopped member's share. The slowest of five. */
	long long base_ms = 0;
	char ulive[200];
	snprintf(ulive, sizeof(ulive), "etcd://%s", leader);
	for (int i = 0; i < 5; i++) {
		dlock_store *sw = open_uri(ulive);
		dlock_lock *w = new_lock(sw, "chaos-stop-warm", 9000);
		long long t0 = tu_now_ms();
		CHECK_RC(dlock_acquire(w, 0), 0);
		long long t1 = tu_now_ms();
		CHECK_RC(dlock_release(w), 0);
		long long t2 = tu_now_ms();
		if (t1 - t0 > base_ms)
			base_ms = t1 - t0;
		if (t2 - t1 > base_ms)
			base_ms = t2 - t1;
		dlock_lock_free(w);
		dlock_store_close(sw);
	}
	/* The stopped member's share of a call (gateway.c "Hedging"): the
	 * deadline over the three members. */
	const long long share_ms = request_ms / 3, open_share_ms = connect_ms / 3;
	tu_stop(pid1);
	printf("  follower %s, first in %s, stopped\n", f1, u);

	tu_lag_start();
	long long t = tu_now_ms();
	CHECK_RC(dlock_release(held), 0);
	long long took = tu_now_ms() - t, lag = tu_lag_ms();
	printf("  release through the stopped member: %lld ms (bound: share %lld + healthy call %lld + lag %lld)\n",
	       took, share_ms, base_ms, lag);
	CHECK(took <= share_ms + base_ms + lag);

	tu_lag_start();
	t = tu_now_ms();
	CHECK_RC(dlock_acquire(a, 0), 0);
	took = tu_now_ms() - t;
	lag = tu_lag_ms();
	printf("  try-once acquire through the stopped member: %lld ms (bound: share %lld + healthy call %lld + "
	       "lag %lld)\n",
	       took, share_ms, base_ms, lag);
	CHECK(took <= share_ms + base_ms + lag);
	if (dlock_held(a))
		CHECK_RC(dlock_release(a), 0);

	dlock_store *so = NULL;
	tu_lag_start();
	t = tu_now_ms();
	CHECK_RC(dlock_store_open(&so, u), 0);
	took = tu_now_ms() - t;
	lag = tu_lag_ms();
	/* An open of a member that answers, alone: the rest of the bound. */
	char ul[700], uok[200];
	dlock_store *sl = NULL;
	snprintf(uok, sizeof(uok), "etcd://%s", leader);
	long long t3 = tu_now_ms();
	CHECK_RC(dlock_store_open(&sl, uok), 0);
	long long answer_ms = tu_now_ms() - t3;
	dlock_store_close(sl);
	sl = NULL;
	printf("  open with the first member stopped: %lld ms (bound: share %lld + an open of a live member %lld "
	       "+ lag %lld)\n",
	       took, open_share_ms, answer_ms, lag);
	CHECK(took <= open_share_ms + answer_ms + lag);
	/* A long connect_timeout: the stopped member gets one request's worth,
	 * then a member that answers takes as long as an open of it alone. */
	snprintf(ul, sizeof(ul), "%s/?connect_timeout=30s", u);
	tu_lag_start();
	t = tu_now_ms();
	CHECK_RC(dlock_store_open(&sl, ul), 0);
	took = tu_now_ms() - t;
	lag = tu_lag_ms();
	printf("  open with connect_timeout=30s: %lld ms (bound: one request timeout %lld + an open of a live "
	       "member %lld + lag %lld)\n",
	       took, request_ms, answer_ms, lag);
	CHECK(took <= request_ms + answer_ms + lag);
	dlock_store_close(sl);
	if (so) {
		dlock_lock *o = new_lock(so, "chaos-stop-open", 5000);
		CHECK_RC(dlock_acquire(o, 0), 0);
		CHECK_RC(dlock_release(o), 0);
		dlock_lock_free(o);
		dlock_store_close(so);
	}
	kill(pid1, SIGCONT);
	dlock_lock_free(held);
	dlock_lock_free(a);
	dlock_store_close(sa);
	dlock_store_close(sb);
}

static void case_chaos_leader(void)
{
	char leader[64], others[256];
	if (!find_leader(leader, sizeof(leader), others, sizeof(others)))
		return;
	/* The leader first; a request timeout of 1 s, shorter than any
	 * election (a follower campaigns after 1-2 s without a heartbeat), so
	 * the first try cannot be served: the wait must ride the election out. */
	char u1[512];
	snprintf(u1, sizeof(u1), "etcd://%s%s/?timeout=1s", leader, others);
	dlock_store *s = open_uri(u1);
	dlock_lock *l = new_lock(s, "chaos-leader", 6000);
	int pid = member_pid(strrchr(leader, ':') + 1);
	CHECK(pid > 0);
	if (pid <= 0)
		return;
	kill(pid, SIGKILL);
	printf("  leader %s killed\n", leader);
	const long long wait_ms = 8000;
	tu_lag_start();
	long long t = tu_now_ms();
	CHECK_RC(dlock_acquire(l, wait_ms), 0);
	long long took = tu_now_ms() - t, lag = tu_lag_ms();
	printf("  a wait of %lld ms started as the leader died: %s after %lld ms (lag %lld)\n", wait_ms,
	       dlock_held(l) ? "granted" : dlock_error_name(dlock_error_last()->code), took, lag);
	CHECK(took <= wait_ms + lag);
	if (dlock_held(l))
		CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void case_chaos(void)
{
	server_start(3, "", 0);
	case_chaos_stopped();
	case_chaos_leader();
	server_stop();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 7 && strcmp(argv[1], "--child") == 0) {
		snprintf(uri, sizeof(uri), "%s", argv[3]);
		long ttl = atol(argv[5]);
		int fd = atoi(argv[6]);
		if (strcmp(argv[2], "hold") == 0)
			return child_hold(argv[4], ttl, fd);
		return child_wait(argv[4], ttl, fd);
	}
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		die("readlink");
	self_exe[n] = '\0';
	snprintf(run_id, sizeof(run_id), "%08lx", (unsigned long)(tu_now_ms() ^ (getpid() << 16)));
	const char *what = argc > 1 ? argv[1] : "single";
	if (strcmp(what, "single") == 0) {
		tu_uri_from_env(uri, sizeof uri, "etcd_cases");
		/* clang-format off */
		static const tu_case cases[] = {
			{ "killed_holder", case_killed_holder },
			{ "stopped_waiter", case_stopped_waiter },
			{ "watch_wakeup", case_watch_wakeup },
			{ "middle_leaves", case_middle_leaves },
			{ "names_apart", case_names_apart },
			{ "mixed_ttls", case_mixed_ttls },
			{ "lease_age", case_lease_age },
			{ "handover", case_handover },
		};
		/* clang-format on */
		tu_run_cases(cases, sizeof cases / sizeof cases[0], argc, argv, 2);
	} else if (strcmp(what, "auth") == 0) {
		case_auth();
	} else if (strcmp(what, "cluster") == 0) {
		case_cluster_failover();
	} else if (strcmp(what, "chaos") == 0) {
		case_chaos();
	} else if (strcmp(what, "tls") == 0) {
		case_tls();
	} else {
		fprintf(stderr, "usage: etcd_cases single|auth|cluster|chaos|tls\n");
		return 64;
	}
	return tu_done(what);
}
