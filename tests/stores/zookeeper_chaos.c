/*
 * Issue 31 on a 3-server ZooKeeper ensemble: a follower is SIGSTOPped (its
 * kernel still takes connections, nothing answers); fresh stores opened
 * with every member in the URI must each get a session from the two others
 * within connect_timeout, and lock and unlock there. The C client picks its
 * first server at random and gave a silent one two thirds of the session
 * timeout — more than connect_timeout — so about one open in three failed
 * "no server ... answered". Bound: connect_timeout plus the scheduling delay
 * a 5 ms ticker measured during the open. The member is SIGCONTed at the end.
 *
 * Then a session already connected to a follower that is then stopped: a
 * try-once acquire and a release on that session must keep their request
 * timeout, and a lock it holds must stay held (no on_lost) for two TTLs. The
 * client itself leaves a silent server only after 2/3 of the session
 * timeout, past both. And the leader killed (restarted at the end): a fresh
 * open, a wait started at the kill, the renewal of a lock held across the
 * election and a release after it keep their bounds; the wait ends with a
 * grant (it ended "unavailable" on its first try before).
 * Usage: zookeeper_chaos SERVER_SCRIPT SERVER_DIR  (the 3-member fixture)
 */
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* The answer of the member on 127.0.0.1:port to "srvr" into buf ("" if none). */
static void srvr(int port, char *buf, size_t len)
{
	size_t got = 0;
	buf[0] = '\0';
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = { 2, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && write(fd, "srvr", 4) == 4) {
		ssize_t r;
		while (got < len - 1 && (r = read(fd, buf + got, len - 1 - got)) > 0)
			got += (size_t)r;
		buf[got] = '\0';
	}
	if (fd >= 0)
		close(fd);
}

/* "follower", "leader" or "" for the member on 127.0.0.1:port (srvr). */
static void member_mode(int port, char *out, size_t n)
{
	char buf[4096];
	srvr(port, buf, sizeof(buf));
	const char *m = strstr(buf, "Mode: ");
	out[0] = '\0';
	if (m)
		snprintf(out, n, "%.*s", (int)strcspn(m + 6, "\r\n"), m + 6);
}

/* "Connections: N" of the member on 127.0.0.1:port (srvr), -1 if none. */
static int member_conns(int port)
{
	char buf[4096];
	srvr(port, buf, sizeof(buf));
	const char *m = strstr(buf, "Connections: ");
	return m ? atoi(m + 13) : -1;
}

typedef struct member {
	char name[32];
	int port;
	int pid;
} member;

static int read_members(const char *dir, member *m, int max)
{
	char path[1024], pidfile[512];
	snprintf(path, sizeof(path), "%s/members", dir);
	FILE *f = fopen(path, "r");
	int n = 0;
	while (f && n < max && fscanf(f, "%31s %d %511s", m[n].name, &m[n].port, pidfile) == 3) {
		FILE *pf = fopen(pidfile, "r");
		m[n].pid = 0;
		if (pf && fscanf(pf, "%d", &m[n].pid) != 1)
			m[n].pid = 0;
		if (pf)
			fclose(pf);
		n++;
	}
	if (f)
		fclose(f);
	return n;
}

/* Every member serves a write through a session of its own (a member that
 * was stopped has rejoined the leader, an election is over): the next case
 * starts from a healthy ensemble. @return the ms it took, -1 if not in 60 s. */
static long long wait_healthy(const char *dir)
{
	member m[3];
	int nm = read_members(dir, m, 3);
	long long t0 = tu_now_ms();
	for (int i = 0; i < nm; i++) {
		bool ok = false;
		while (!ok && tu_now_ms() - t0 < 60000) {
			char u[128], name[64];
			snprintf(u, sizeof(u), "zk://127.0.0.1:%d?connect_timeout=2s", m[i].port);
			dlock_store *s = NULL;
			dlock_lock *l = NULL;
			if (dlock_store_open(&s, u) == 0) {
				snprintf(name, sizeof(name), "healthy-%d", (int)getpid());
				ok = dlock_lock_new(&l, s, name, NULL) == 0 && dlock_acquire(l, 2000) == 0 &&
				     dlock_release(l) == 0;
				dlock_lock_free(l);
				dlock_store_close(s);
			}
			if (!ok)
				nap_ms(100);
		}
		if (!ok)
			return -1;
	}
	return tu_now_ms() - t0;
}

static atomic_int lost_count;
static void on_lost(dlock_lock *l, void *p)
{
	(void)l, (void)p;
	atomic_fetch_add(&lost_count, 1);
}

#define REQ_MS 2000LL /* the URI's default request timeout: min(connect_timeout, 2 s) */
#define TTL_MS 3000LL /* a 4 s session: the client leaves a silent server after 2.7 s */

/* A session on a follower that stops: calls keep their bounds, the hold stays. */
static void case_connected_follower(const char *uri, const char *dir)
{
	long long healthy = wait_healthy(dir);
	printf("  ensemble serving on every member after %lld ms\n", healthy);
	CHECK(healthy >= 0);
	member m[3];
	int nm = read_members(dir, m, 3);
	CHECK(nm == 3);
	dlock_store *s = NULL;
	dlock_lock *a = NULL;
	int on = -1;
	char name[64], mode[32];
	for (int tries = 0; tries < 40 && on < 0; tries++) {
		int before[3];
		for (int i = 0; i < nm; i++)
			before[i] = member_conns(m[i].port);
		if (dlock_store_open(&s, uri) != 0) {
			s = NULL;
			continue;
		}
		dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
		o.ttl_ms = TTL_MS;
		o.on_lost = on_lost;
		snprintf(name, sizeof(name), "moved-a-%d", (int)getpid());
		if (dlock_lock_new(&a, s, name, &o) == 0 && dlock_acquire(a, 5000) == 0) {
			int grew = 0, which = -1;
			for (int i = 0; i < nm; i++) {
				if (member_conns(m[i].port) > before[i]) {
					grew++;
					which = i;
				}
			}
			member_mode(which >= 0 ? m[which].port : 0, mode, sizeof(mode));
			if (grew == 1 && strcmp(mode, "follower") == 0) {
				on = which;
				break;
			}
			dlock_release(a);
		}
		dlock_lock_free(a);
		a = NULL;
		dlock_store_close(s);
		s = NULL;
	}
	CHECK(on >= 0);
	if (on < 0)
		return;
	atomic_store(&lost_count, 0);
	tu_stop(m[on].pid);
	printf("  session on follower %s (port %d) stopped\n", m[on].name, m[on].port);
	long long t0 = tu_now_ms();
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = TTL_MS;
	dlock_lock *b = NULL;
	snprintf(name, sizeof(name), "moved-b-%d", (int)getpid());
	CHECK_RC(dlock_lock_new(&b, s, name, &o), 0);
	tu_lag_start();
	long long t = tu_now_ms();
	int rc = dlock_acquire(b, 0);
	long long acq = tu_now_ms() - t;
	if (rc)
		printf("  try-once: %s after %lld ms: %s\n", dlock_error_name(rc), acq, dlock_error_last()->message);
	CHECK_RC(rc, 0);
	CHECK(acq <= REQ_MS + tu_lag_ms());
	long long rel = -1;
	if (rc == 0) {
		tu_lag_start();
		t = tu_now_ms();
		rc = dlock_release(b);
		rel = tu_now_ms() - t;
		if (rc)
			printf("  release: %s after %lld ms: %s\n", dlock_error_name(rc), rel,
			       dlock_error_last()->message);
		CHECK_RC(rc, 0);
		CHECK(rel <= REQ_MS + tu_lag_ms());
	}
	dlock_lock_free(b);
	/* the hold made before the stop, renewed across it */
	while (tu_now_ms() - t0 < 2 * TTL_MS && dlock_held(a) && atomic_load(&lost_count) == 0)
		nap_ms(50);
	bool kept = dlock_held(a) && atomic_load(&lost_count) == 0;
	CHECK(kept);
	tu_lag_start();
	t = tu_now_ms();
	rc = dlock_release(a);
	long long rel_a = tu_now_ms() - t;
	CHECK_RC(rc, 0);
	CHECK(rel_a <= REQ_MS + tu_lag_ms());
	printf("  connected follower stopped: try-once %lld ms, release %lld ms, held lock %s for %lld ms, "
	       "its release %lld ms (bound %lld + lag each)\n",
	       acq, rel, kept ? "kept" : "LOST", 2 * TTL_MS, rel_a, REQ_MS);
	dlock_lock_free(a);
	kill(m[on].pid, SIGCONT);
	dlock_store_close(s);
}

typedef struct waiter {
	dlock_store *s;
	char name[64];
	long long wait_ms, took;
	int rc;
} waiter;

static void *wait_thread(void *p)
{
	waiter *w = p;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = TTL_MS;
	dlock_lock *l = NULL;
	long long t = tu_now_ms();
	w->rc = dlock_lock_new(&l, w->s, w->name, &o);
	if (w->rc == 0)
		w->rc = dlock_acquire(l, w->wait_ms);
	w->took = tu_now_ms() - t;
	if (w->rc)
		printf("  wait: %s after %lld ms: %s\n", dlock_error_name(w->rc), w->took, dlock_error_last()->message);
	if (w->rc == 0)
		dlock_release(l);
	dlock_lock_free(l);
	return NULL;
}

/* The leader killed: an election; every call keeps its bound, the wait ends granted. */
static void case_leader_killed(const char *uri, const char *script, const char *dir)
{
	long long healthy = wait_healthy(dir);
	printf("  ensemble serving on every member after %lld ms\n", healthy);
	CHECK(healthy >= 0);
	member m[3];
	int nm = read_members(dir, m, 3), leader = -1;
	char mode[32], name[64];
	for (int tries = 0; tries < 100 && leader < 0; tries++) {
		for (int i = 0; i < nm && leader < 0; i++) {
			member_mode(m[i].port, mode, sizeof(mode));
			if (strcmp(mode, "leader") == 0)
				leader = i;
		}
		if (leader < 0)
			nap_ms(100);
	}
	CHECK(leader >= 0);
	if (leader < 0)
		return;
	dlock_store *s = NULL, *w_s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	/* The waiter's tries are shorter than an election (timeout=500ms): its
	 * first try ended the whole wait as "unavailable" before. */
	char w_uri[1200];
	snprintf(w_uri, sizeof(w_uri), "%s%stimeout=500ms", uri, strchr(uri, '?') ? "&" : "?");
	CHECK_RC(dlock_store_open(&w_s, w_uri), 0);
	if (!s || !w_s) {
		dlock_store_close(s);
		dlock_store_close(w_s);
		return;
	}
	atomic_store(&lost_count, 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = TTL_MS;
	o.on_lost = on_lost;
	dlock_lock *h = NULL;
	snprintf(name, sizeof(name), "elect-h-%d", (int)getpid());
	CHECK_RC(dlock_lock_new(&h, s, name, &o), 0);
	CHECK_RC(dlock_acquire(h, 5000), 0);
	/* the waiter's session is made before the kill (a wait of a connected store) */
	dlock_lock *warm = NULL;
	snprintf(name, sizeof(name), "elect-warm-%d", (int)getpid());
	CHECK_RC(dlock_lock_new(&warm, w_s, name, &o), 0);
	CHECK_RC(dlock_acquire(warm, 0), 0);
	dlock_release(warm);
	dlock_lock_free(warm);

	kill(m[leader].pid, SIGKILL);
	long long t0 = tu_now_ms();
	printf("  leader %s (port %d) killed\n", m[leader].name, m[leader].port);
	waiter w = { .s = w_s, .wait_ms = 10000, .rc = -1 };
	snprintf(w.name, sizeof(w.name), "elect-w-%d", (int)getpid());
	pthread_t wt;
	CHECK(pthread_create(&wt, NULL, wait_thread, &w) == 0);
	tu_lag_start();
	dlock_store *fresh = NULL;
	long long t = tu_now_ms();
	int rc = dlock_store_open(&fresh, uri);
	long long open_ms = tu_now_ms() - t;
	if (rc)
		printf("  open: %s after %lld ms: %s\n", dlock_error_name(rc), open_ms, dlock_error_last()->message);
	CHECK_RC(rc, 0);
	CHECK(open_ms <= 5000 + tu_lag_ms());
	dlock_store_close(fresh);
	pthread_join(wt, NULL);
	CHECK_RC(w.rc, 0);
	CHECK(w.took <= w.wait_ms + tu_lag_ms());
	/* the election is over (a session was made): the held lock was renewed */
	while (tu_now_ms() - t0 < 2 * TTL_MS && dlock_held(h) && atomic_load(&lost_count) == 0)
		nap_ms(50);
	bool kept = dlock_held(h) && atomic_load(&lost_count) == 0;
	CHECK(kept);
	tu_lag_start();
	t = tu_now_ms();
	rc = dlock_release(h);
	long long rel = tu_now_ms() - t;
	if (rc)
		printf("  release: %s after %lld ms: %s\n", dlock_error_name(rc), rel, dlock_error_last()->message);
	CHECK_RC(rc, 0);
	CHECK(rel <= REQ_MS + tu_lag_ms());
	printf("  leader killed: open %lld ms (bound 5000 + lag), wait %s after %lld ms (bound %lld), held lock "
	       "%s, release %lld ms (bound %lld + lag)\n",
	       open_ms, w.rc == 0 ? "granted" : "failed", w.took, w.wait_ms, kept ? "kept" : "LOST", rel, REQ_MS);
	dlock_lock_free(h);
	dlock_store_close(s);
	dlock_store_close(w_s);
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "bash '%s' restart-member '%s' %s >&2", script, dir, m[leader].name + 1);
	CHECK(system(cmd) == 0);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3) {
		fprintf(stderr, "usage: zookeeper_chaos SERVER_SCRIPT SERVER_DIR\n");
		return 64;
	}
	char uri[1024], path[1024], name[32], pidfile[512], mode[32];
	snprintf(path, sizeof(path), "%s/uri", argv[2]);
	FILE *f = fopen(path, "r");
	if (!f || !fgets(uri, sizeof(uri), f)) {
		fprintf(stderr, "no %s (server not started?)\n", path);
		return 2;
	}
	fclose(f);
	uri[strcspn(uri, "\r\n")] = '\0';
	/* A follower: stopping the leader would stop every new session until
	 * an election, which is the ensemble's, not the client's, to shorten. */
	int pid = 0, port = 0;
	for (int tries = 0; tries < 100 && pid <= 0; tries++) {
		snprintf(path, sizeof(path), "%s/members", argv[2]);
		f = fopen(path, "r");
		int p;
		while (f && fscanf(f, "%31s %d %511s", name, &p, pidfile) == 3 && pid <= 0) {
			member_mode(p, mode, sizeof(mode));
			FILE *pf = strcmp(mode, "follower") == 0 ? fopen(pidfile, "r") : NULL;
			if (pf && fscanf(pf, "%d", &pid) == 1 && pid > 0)
				port = p;
			if (pf)
				fclose(pf);
		}
		if (f)
			fclose(f);
		if (pid <= 0)
			nap_ms(100); /* an election may be under way */
	}
	CHECK(pid > 0);
	if (pid <= 0)
		return tu_done("zookeeper_chaos");
	tu_stop(pid);
	printf("  follower on port %d (pid %d) stopped\n", port, pid);
	const long long connect_ms = 5000; /* the URI default */
	long long slowest = 0;
	int failed = 0;
	for (int i = 0; i < 8; i++) {
		dlock_store *s = NULL;
		tu_lag_start();
		long long t = tu_now_ms();
		int rc = dlock_store_open(&s, uri);
		long long took = tu_now_ms() - t;
		long long lag = tu_lag_ms();
		if (rc != 0) {
			failed++;
			printf("  open %d: %s after %lld ms: %s\n", i, dlock_error_name(rc), took,
			       dlock_error_last()->message);
		}
		CHECK_RC(rc, 0);
		CHECK(took <= connect_ms + lag);
		if (took > slowest)
			slowest = took;
		if (!s)
			continue;
		dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
		o.ttl_ms = 5000;
		dlock_lock *l = NULL;
		snprintf(name, sizeof(name), "chaos-%d-%d", (int)getpid(), i);
		CHECK_RC(dlock_lock_new(&l, s, name, &o), 0);
		if (l) {
			CHECK_RC(dlock_acquire(l, 0), 0);
			if (dlock_held(l))
				CHECK_RC(dlock_release(l), 0);
		}
		dlock_lock_free(l);
		dlock_store_close(s);
	}
	printf("  8 opens with a follower stopped: %d failed, slowest %lld ms (bound %lld + lag)\n", failed, slowest,
	       connect_ms);
	kill(pid, SIGCONT);
	case_connected_follower(uri, argv[2]);
	case_leader_killed(uri, argv[1], argv[2]);
	return tu_done("zookeeper_chaos");
}
