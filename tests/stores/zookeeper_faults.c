/*
 * The ZooKeeper store's own failure cases, on a standalone server of their own:
 *  - connection loss between a create (or delete) request and its reply, and
 *    before the request reaches the server, injected by a TCP proxy in this
 *    program: the acquire succeeds with exactly one node of ours (never a
 *    duplicate, never an orphan), for a holder and for a waiter;
 *  - session expiry (the proxy swallows everything past the session timeout):
 *    the holder hears on_lost before the waiter is granted; afterwards the
 *    same store handle makes a new session and grants again;
 *  - a holder SIGSTOPped past its session timeout: a waiter gets the lock, and
 *    the holder, continued, sees the lost signal and can acquire again;
 *  - digest auth: other credentials can neither take nor delete our nodes;
 *  - odd names round-trip through status; empty parents are reaped.
 * Usage: zookeeper_faults SERVER_SCRIPT SERVER_DIR  (URI from DLOCK_TEST_URI_FILE)
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

#define OP_DELETE 2
#define OP_CREATE2 15

static char direct_uri[1024];
static char server_hp[256];
static int server_port;
static char run_id[16];
static zhandle_t *raw;

/* ---------------------------------------------------------------- a TCP proxy that can cut */

static struct {
	int lfd, port;
	pthread_mutex_t mu;
	int arm_op;          /* request opcode to cut at (0: none) */
	const char *arm_sub; /* ...whose bytes contain this */
	int arm_after;       /* 1: let the request through, swallow its reply; 0: swallow the request */
	int blackhole;       /* drop every connection, accept none */
	int then_blackhole;  /* after the armed cut, blackhole */
	int cuts;
	int fds[128];
	int nfds;
} px = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void px_track(int fd, int add)
{
	pthread_mutex_lock(&px.mu);
	if (add && px.nfds < 128) {
		px.fds[px.nfds++] = fd;
	} else {
		for (int i = 0; i < px.nfds; i++)
			if (px.fds[i] == fd)
				px.fds[i] = px.fds[--px.nfds];
	}
	pthread_mutex_unlock(&px.mu);
}

static int write_all(int fd, const char *b, size_t n)
{
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static uint32_t be32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return ntohl(v);
}

/* Read server frames until the reply with this xid arrives (then drop it). */
static void swallow_reply(int sfd, uint32_t xid)
{
	char buf[65536];
	size_t have = 0;
	long long until = tu_now_ms() + 5000;
	while (tu_now_ms() < until) {
		struct pollfd p = { sfd, POLLIN, 0 };
		if (poll(&p, 1, 100) <= 0)
			continue;
		ssize_t r = read(sfd, buf + have, sizeof(buf) - have);
		if (r <= 0)
			return;
		have += (size_t)r;
		while (have >= 8) {
			uint32_t len = be32(buf);
			if (have < 4 + (size_t)len)
				break;
			if (be32(buf + 4) == xid)
				return;
			memmove(buf, buf + 4 + len, have - 4 - len);
			have -= 4 + len;
		}
		if (have == sizeof(buf))
			return;
	}
}

static void *px_pump(void *arg)
{
	int *fds = arg;
	int cfd = fds[0], sfd = fds[1];
	free(fds);
	char cbuf[1 << 20];
	size_t have = 0;
	int first = 1;
	for (;;) {
		struct pollfd p[2] = { { cfd, POLLIN, 0 }, { sfd, POLLIN, 0 } };
		if (poll(p, 2, 200) < 0 && errno != EINTR)
			break;
		pthread_mutex_lock(&px.mu);
		int bh = px.blackhole;
		pthread_mutex_unlock(&px.mu);
		if (bh)
			break;
		if (p[1].revents) {
			char b[65536];
			ssize_t r = read(sfd, b, sizeof(b));
			if (r <= 0 || write_all(cfd, b, (size_t)r))
				break;
		}
		if (p[0].revents) {
			ssize_t r = read(cfd, cbuf + have, sizeof(cbuf) - have);
			if (r <= 0)
				break;
			have += (size_t)r;
			int cut = 0;
			while (have >= 4) {
				uint32_t len = be32(cbuf);
				if (have < 4 + (size_t)len)
					break;
				int trip = 0, after = 0;
				uint32_t xid = 0;
				if (!first && len >= 8) {
					xid = be32(cbuf + 4);
					int op = (int)be32(cbuf + 8);
					pthread_mutex_lock(&px.mu);
					if (px.arm_op && op == px.arm_op &&
					    memmem(cbuf, 4 + len, px.arm_sub, strlen(px.arm_sub))) {
						trip = 1;
						after = px.arm_after;
						px.arm_op = 0;
						px.cuts++;
						if (px.then_blackhole)
							px.blackhole = 1;
					}
					pthread_mutex_unlock(&px.mu);
				}
				first = 0;
				if (trip) {
					if (after && write_all(sfd, cbuf, 4 + len) == 0)
						swallow_reply(sfd, xid); /* the server did it; the client never hears */
					cut = 1;
					break;
				}
				if (write_all(sfd, cbuf, 4 + len))
					cut = 1;
				memmove(cbuf, cbuf + 4 + len, have - 4 - len);
				have -= 4 + len;
				if (cut)
					break;
			}
			if (cut || have == sizeof(cbuf))
				break;
		}
	}
	px_track(cfd, 0);
	px_track(sfd, 0);
	close(cfd);
	close(sfd);
	return NULL;
}

static void *px_accept(void *unused)
{
	(void)unused;
	for (;;) {
		int cfd = accept(px.lfd, NULL, NULL);
		if (cfd < 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		pthread_mutex_lock(&px.mu);
		int bh = px.blackhole;
		pthread_mutex_unlock(&px.mu);
		if (bh) {
			close(cfd);
			continue;
		}
		int sfd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)server_port) };
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (sfd < 0 || connect(sfd, (struct sockaddr *)&a, sizeof(a)) != 0) {
			close(cfd);
			if (sfd >= 0)
				close(sfd);
			continue;
		}
		px_track(cfd, 1);
		px_track(sfd, 1);
		int *fds = malloc(2 * sizeof(int));
		fds[0] = cfd;
		fds[1] = sfd;
		pthread_t t;
		pthread_create(&t, NULL, px_pump, fds);
		pthread_detach(t);
	}
}

static void px_start(void)
{
	px.lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(px.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0 };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (bind(px.lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(px.lfd, 64) != 0 ||
	    getsockname(px.lfd, (struct sockaddr *)&a, &al) != 0) {
		perror("proxy");
		exit(2);
	}
	px.port = ntohs(a.sin_port);
	pthread_t t;
	pthread_create(&t, NULL, px_accept, NULL);
	pthread_detach(t);
}

static void px_arm(int op, const char *sub, int after)
{
	pthread_mutex_lock(&px.mu);
	px.then_blackhole = 0;
	px.arm_op = op;
	px.arm_sub = sub;
	px.arm_after = after;
	px.cuts = 0;
	pthread_mutex_unlock(&px.mu);
}

static int px_cuts(void)
{
	pthread_mutex_lock(&px.mu);
	int c = px.cuts;
	pthread_mutex_unlock(&px.mu);
	return c;
}

static void px_blackhole(int on)
{
	pthread_mutex_lock(&px.mu);
	px.blackhole = on;
	for (int i = 0; on && i < px.nfds; i++)
		shutdown(px.fds[i], SHUT_RDWR);
	pthread_mutex_unlock(&px.mu);
}

/* ---------------------------------------------------------------- helpers */

/* Nodes of client `cid` under /<prefix>/<name> (name without escapes); *czxid of the last. */
static int count_own(const char *prefix, const char *name, const char *cid, int64_t *czxid)
{
	char dir[512], want[64];
	snprintf(dir, sizeof(dir), "/%s/%s", prefix, name);
	snprintf(want, sizeof(want), "_c_%s-", cid);
	struct String_vector sv = { 0, NULL };
	int r = zoo_get_children(raw, dir, 0, &sv);
	if (r == ZNONODE)
		return 0;
	if (r != ZOK) {
		fprintf(stderr, "list %s: %s\n", dir, zerror(r));
		return -1;
	}
	int n = 0;
	for (int i = 0; i < sv.count; i++) {
		if (strncmp(sv.data[i], want, strlen(want)) != 0)
			continue;
		n++;
		char p[1024];
		snprintf(p, sizeof(p), "%s/%s", dir, sv.data[i]);
		struct Stat st;
		if (czxid && zoo_exists(raw, p, 0, &st) == ZOK)
			*czxid = st.czxid;
	}
	deallocate_String_vector(&sv);
	return n;
}

static int nchildren(const char *path)
{
	struct String_vector sv = { 0, NULL };
	int r = zoo_get_children(raw, path, 0, &sv);
	if (r == ZNONODE)
		return -1;
	int n = r == ZOK ? sv.count : -2;
	deallocate_String_vector(&sv);
	return n;
}

/* Make the name's parent nodes, so the cut create is one the server carries out. */
static void ensure_dir(const char *name)
{
	char d[256];
	snprintf(d, sizeof(d), "/dlock/%s", name);
	zoo_create(raw, "/dlock", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
	int r = zoo_create(raw, d, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
	CHECK(r == ZOK || r == ZNODEEXISTS);
}

/* ---------------------------------------------------------------- cases */

/* One acquire whose create hits a cut; after = 1: the server made the node. */
static void lost_create(int after)
{
	char name[64];
	snprintf(name, sizeof(name), "loss-%s-%d", run_id, after);
	dlock_store *s = nu_openf("zk://127.0.0.1:%d", px.port);
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	ensure_dir(name);
	px_arm(OP_CREATE2, "-lock-", after);
	CHECK_RC(dlock_acquire(l, 10000), 0);
	CHECK(px_cuts() == 1);
	int64_t cz = 0;
	CHECK(count_own("dlock", name, dlock_store_client_id(s), &cz) == 1);
	CHECK((uint64_t)cz == dlock_fence(l));
	CHECK_RC(dlock_release(l), 0);
	CHECK(count_own("dlock", name, dlock_store_client_id(s), NULL) == 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void case_lost_create_reply(void)
{
	lost_create(1);
}

static void case_lost_create_request(void)
{
	lost_create(0);
}

static void case_lost_delete_reply(void)
{
	char name[64];
	snprintf(name, sizeof(name), "lossdel-%s", run_id);
	dlock_store *s = nu_openf("zk://127.0.0.1:%d", px.port);
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	CHECK_RC(dlock_acquire(l, 0), 0);
	px_arm(OP_DELETE, "-lock-", 1);
	CHECK_RC(dlock_release(l), 0);
	CHECK(px_cuts() == 1);
	CHECK(count_own("dlock", name, dlock_store_client_id(s), NULL) == 0);
	/* and the name is free for others */
	dlock_store *s2 = nu_openf("%s", direct_uri);
	dlock_lock *l2 = nu_lock_cb(s2, name, 4000, NULL);
	CHECK_RC(dlock_acquire(l2, 0), 0);
	CHECK_RC(dlock_release(l2), 0);
	dlock_lock_free(l2);
	dlock_store_close(s2);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* The create went through but the session cannot reconnect in time: the
 * acquire fails as unavailable, and the node it left is deleted once the
 * session is back, with no further call of ours — it never blocks others
 * while we live. */
static void case_lost_create_no_reconnect(void)
{
	char name[64], other[64];
	snprintf(name, sizeof(name), "lossnr-%s", run_id);
	snprintf(other, sizeof(other), "lossnr2-%s", run_id);
	dlock_store *s = nu_openf("zk://127.0.0.1:%d?connect_timeout=500ms", px.port);
	dlock_lock *l = nu_lock_cb(s, name, 8000, NULL), *l2 = nu_lock_cb(s, other, 8000, NULL);
	ensure_dir(name);
	px_arm(OP_CREATE2, "-lock-", 1);
	pthread_mutex_lock(&px.mu);
	px.then_blackhole = 1;
	pthread_mutex_unlock(&px.mu);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_EUNAVAILABLE);
	CHECK(px_cuts() == 1);
	CHECK(count_own("dlock", name, dlock_store_client_id(s), NULL) == 1); /* made, in doubt */
	px_blackhole(0);
	/* No call of ours: the session watcher sweeps it once reconnected. */
	long long back = tu_now_ms();
	while (count_own("dlock", name, dlock_store_client_id(s), NULL) != 0 && tu_now_ms() - back < 8000)
		usleep(20000);
	printf("  the node in doubt was gone %lld ms after the link came back, process idle\n", tu_now_ms() - back);
	CHECK(count_own("dlock", name, dlock_store_client_id(s), NULL) == 0);
	CHECK_RC(dlock_acquire(l2, 5000), 0);
	CHECK_RC(dlock_release(l2), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(count_own("dlock", name, dlock_store_client_id(s), NULL) == 1);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_lock_free(l2);
	dlock_store_close(s);
}

static dlock_lock *waiter_lock;
static dlock_store *waiter_store;
static int waiter_rc, waiter_nodes, waiter_release;

/* A handle belongs to its thread: this one acquires, counts and releases. */
static void *waiter_main(void *unused)
{
	(void)unused;
	waiter_rc = dlock_acquire(waiter_lock, 15000);
	if (waiter_rc == 0) {
		waiter_nodes = count_own("dlock", dlock_lock_name(waiter_lock), dlock_store_client_id(waiter_store),
					 NULL);
		waiter_release = dlock_release(waiter_lock);
	}
	return NULL;
}

/* A waiter whose queue node is created across a cut keeps exactly one node. */
static void case_lost_create_waiter(void)
{
	char name[64];
	snprintf(name, sizeof(name), "losswait-%s", run_id);
	dlock_store *hs = nu_openf("%s", direct_uri);
	dlock_lock *h = nu_lock_cb(hs, name, 4000, NULL);
	CHECK_RC(dlock_acquire(h, 0), 0);
	dlock_store *ws = nu_openf("zk://127.0.0.1:%d", px.port);
	waiter_store = ws;
	waiter_lock = nu_lock_cb(ws, name, 4000, NULL);
	px_arm(OP_CREATE2, "-lock-", 1);
	pthread_t t;
	pthread_create(&t, NULL, waiter_main, NULL);
	long long until = tu_now_ms() + 10000;
	while (nu_waiters(hs, name) < 1 && tu_now_ms() < until)
		usleep(5000);
	CHECK(nu_waiters(hs, name) == 1);
	CHECK(px_cuts() == 1);
	CHECK(count_own("dlock", name, dlock_store_client_id(ws), NULL) == 1);
	CHECK_RC(dlock_release(h), 0);
	pthread_join(t, NULL);
	CHECK_RC(waiter_rc, 0);
	CHECK(waiter_nodes == 1);
	CHECK_RC(waiter_release, 0);
	CHECK(count_own("dlock", name, dlock_store_client_id(ws), NULL) == 0);
	dlock_lock_free(waiter_lock);
	dlock_lock_free(h);
	dlock_store_close(ws);
	dlock_store_close(hs);
}

static atomic_llong lost_at;

static void note_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	lost_at = tu_now_ms();
}

/* Cut off past the session timeout: lost before anyone else is granted;
 * then a new session serves the same store handle. */
static void case_session_expiry(void)
{
	char name[64], name2[64];
	snprintf(name, sizeof(name), "expire-%s", run_id);
	snprintf(name2, sizeof(name2), "expire2-%s", run_id);
	const int64_t ttl = 2000; /* session timeout 2 s */
	dlock_store *s = nu_openf("zk://127.0.0.1:%d", px.port);
	dlock_lock *l = nu_lock_cb(s, name, ttl, note_lost);
	lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	dlock_store *ws = nu_openf("%s", direct_uri);
	dlock_lock *w = nu_lock_cb(ws, name, 4000, NULL);
	long long cut = tu_now_ms();
	px_blackhole(1);
	CHECK_RC(dlock_acquire(w, 15000), 0);
	long long granted = tu_now_ms();
	printf("  cut off at 0 ms: holder lost at %lld ms, waiter granted at %lld ms (session timeout %lld ms)\n",
	       lost_at ? lost_at - cut : -1, granted - cut, (long long)ttl);
	CHECK(lost_at > 0 && lost_at <= granted);
	CHECK(!dlock_held(l));
	px_blackhole(0);
	CHECK_RC(dlock_release(l), DLOCK_ELOST);
	/* The old session is gone; the same handle makes a new one. */
	dlock_lock *l2 = nu_lock_cb(s, name2, ttl, NULL);
	CHECK_RC(dlock_acquire(l2, 10000), 0);
	CHECK_RC(dlock_release(l2), 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED); /* w still holds it */
	CHECK_RC(dlock_release(w), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l2);
	dlock_lock_free(l);
	dlock_lock_free(w);
	dlock_store_close(ws);
	dlock_store_close(s);
}

/* Our node deleted behind our back (an operator, a bad script): the next
 * renewal notices, on_lost runs, release reports the loss. */
static void case_node_deleted(void)
{
	char name[64];
	snprintf(name, sizeof(name), "deleted-%s", run_id);
	dlock_store *s = nu_openf("%s", direct_uri);
	dlock_lock *l = nu_lock_cb(s, name, 1500, note_lost);
	lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	char dir[128], node[512] = "";
	snprintf(dir, sizeof(dir), "/dlock/%s", name);
	struct String_vector sv = { 0, NULL };
	CHECK(zoo_get_children(raw, dir, 0, &sv) == ZOK && sv.count == 1);
	if (sv.count == 1)
		snprintf(node, sizeof(node), "%s/%s", dir, sv.data[0]);
	deallocate_String_vector(&sv);
	long long t0 = tu_now_ms();
	CHECK(zoo_delete(raw, node, -1) == ZOK);
	while (!lost_at && tu_now_ms() - t0 < 3000)
		usleep(5000);
	CHECK(lost_at > 0 && lost_at - t0 <= 1500);
	CHECK(!dlock_held(l));
	CHECK_RC(dlock_release(l), DLOCK_ELOST);
	/* Lost again, and this time freed without a release: closing the store
	 * still frees what the store kept for it (LeakSanitizer checks). */
	lost_at = 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	sv = (struct String_vector){ 0, NULL };
	CHECK(zoo_get_children(raw, dir, 0, &sv) == ZOK && sv.count == 1);
	if (sv.count == 1)
		snprintf(node, sizeof(node), "%s/%s", dir, sv.data[0]);
	deallocate_String_vector(&sv);
	t0 = tu_now_ms();
	CHECK(zoo_delete(raw, node, -1) == ZOK);
	while (!lost_at && tu_now_ms() - t0 < 3000)
		usleep(5000);
	CHECK(lost_at > 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static int pipe_a[2], pipe_b[2];

static int stopped_child(const char *name)
{
	dlock_store *s = nu_openf("%s", direct_uri);
	dlock_lock *l = nu_lock_cb(s, name, 3000, note_lost);
	if (dlock_acquire(l, 0) != 0)
		return 10;
	char c = 1;
	if (write(pipe_a[1], &c, 1) != 1 || read(pipe_b[0], &c, 1) != 1)
		return 11;
	long long until = tu_now_ms() + 5000;
	while (!lost_at && tu_now_ms() < until)
		usleep(1000);
	int rc = dlock_release(l);
	if (!lost_at || dlock_held(l) || rc != DLOCK_ELOST) {
		fprintf(stderr, "stopped holder: lost=%lld held=%d release=%s\n", (long long)lost_at, dlock_held(l),
			dlock_error_name(rc));
		return 12;
	}
	/* after its session expired, the same store acquires again on a new one */
	if (dlock_acquire(l, 15000) != 0)
		return 13;
	dlock_release(l);
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

static void case_stopped_holder(void)
{
	char name[64];
	snprintf(name, sizeof(name), "stopped-%s", run_id);
	if (pipe(pipe_a) || pipe(pipe_b))
		exit(2);
	lost_at = 0;
	fflush(NULL);
	pid_t p = fork();
	if (p == 0)
		_exit(stopped_child(name));
	char c;
	CHECK(read(pipe_a[0], &c, 1) == 1);
	tu_stop(p);
	long long t0 = tu_now_ms();
	dlock_store *s = nu_openf("%s", direct_uri);
	dlock_lock *l = nu_lock_cb(s, name, 4000, NULL);
	CHECK_RC(dlock_acquire(l, 15000), 0);
	long long took = tu_now_ms() - t0;
	printf("  stopped holder (ttl 3000 ms, session 4000 ms) replaced after %lld ms\n", took);
	CHECK(took >= 2500 && took < 4000 + 4000);
	kill(p, SIGCONT);
	CHECK(write(pipe_b[1], &c, 1) == 1);
	usleep(200000); /* let the child see its loss before the lock is free again */
	CHECK_RC(dlock_release(l), 0);
	int st = 0;
	waitpid(p, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "stopped holder exited with %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	dlock_lock_free(l);
	dlock_store_close(s);
	for (int i = 0; i < 2; i++) {
		close(pipe_a[i]);
		close(pipe_b[i]);
	}
}

static void case_digest_acl(void)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "acl-%s", run_id);
	dlock_store *a = nu_openf("zk://alice:secret@%s?prefix=%s", server_hp, prefix);
	dlock_store *b = nu_openf("zk://%s?prefix=%s", server_hp, prefix);
	dlock_store *c = nu_openf("zk://alice:wrong@%s?prefix=%s", server_hp, prefix);
	dlock_store *d = nu_openf("zk://alice:secret@%s?prefix=%s", server_hp, prefix);
	dlock_lock *la = nu_lock_cb(a, "x", 5000, NULL), *lb = nu_lock_cb(b, "x", 5000, NULL),
		   *lc = nu_lock_cb(c, "x", 5000, NULL), *ld = nu_lock_cb(d, "x", 5000, NULL);
	CHECK_RC(dlock_acquire(la, 0), 0);
	CHECK_RC(dlock_acquire(lb, 0), DLOCK_EAUTH);
	CHECK_RC(dlock_acquire(lc, 0), DLOCK_EAUTH);
	CHECK_RC(dlock_acquire(ld, 0), DLOCK_ELOCKED);
	/* Another client with a handle naming alice's hold cannot delete it. */
	const char *names[] = { "x" };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(b, names, 1, &st, &n), 0); /* reading is allowed */
	CHECK(n == 1 && st[0].nholders == 1);
	if (n == 1 && st[0].nholders == 1) {
		char handle[256];
		snprintf(handle, sizeof(handle), "dl1.x.1.%llu.5000.%s", (unsigned long long)st[0].holders[0].fence,
			 st[0].holders[0].owner);
		CHECK_RC(dlock_lock_attach(lb, handle), 0);
		CHECK_RC(dlock_release(lb), DLOCK_EAUTH);
	}
	dlock_status_free(st, n);
	char path[128];
	snprintf(path, sizeof(path), "/%s/x", prefix);
	CHECK(nchildren(path) == 1);
	CHECK(dlock_held(la));
	CHECK_RC(dlock_release(la), 0);
	CHECK_RC(dlock_acquire(ld, 0), 0);
	CHECK_RC(dlock_release(ld), 0);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_lock_free(lc);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(b);
	dlock_store_close(c);
	dlock_store_close(d);
}

static void case_names_and_cleanup(void)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "names-%s", run_id);
	dlock_store *s = nu_openf("%s?prefix=%s", direct_uri, prefix);
	const char *names[] = { "a/b", "..", ".", "%41", "zookeeper", "sp ace", "\xc3\xbc/..", "_c_x-lock-0000000001" };
	const char *escaped[] = { "a%2Fb",     "%2E%2E",   "%2E",         "%2541",
				  "zookeeper", "sp%20ace", "%C3%BC%2F..", "_c_x-lock-0000000001" };
	enum { N = sizeof(names) / sizeof(names[0]) };
	dlock_lock *l[N];
	for (int i = 0; i < N; i++) {
		l[i] = nu_lock_cb(s, names[i], 5000, NULL);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
		char path[256];
		snprintf(path, sizeof(path), "/%s/%s", prefix, escaped[i]);
		CHECK(nchildren(path) == 1);
	}
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, NULL, 0, &st, &n), 0);
	CHECK(n == N);
	for (int i = 0; i < N; i++) {
		int found = 0;
		for (size_t j = 0; j < n; j++)
			found += strcmp(st[j].name, names[i]) == 0 && st[j].nholders == 1;
		CHECK(found == 1);
	}
	dlock_status_free(st, n);
	for (int i = 0; i < N; i++) {
		CHECK_RC(dlock_release(l[i]), 0);
		dlock_lock_free(l[i]);
	}
	/* Containers: the server removes empty name nodes, then the prefix node. */
	char root[128];
	snprintf(root, sizeof(root), "/%s", prefix);
	long long until = tu_now_ms() + 15000;
	while (nchildren(root) != -1 && tu_now_ms() < until)
		usleep(50000);
	CHECK(nchildren(root) == -1);
	dlock_store_close(s);
}

static void case_bad_uris(void)
{
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, "zk://"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "zk://127.0.0.1:1/a//b"), DLOCK_EINVAL);
	CHECK_RC(dlock_store_open(&s, "zk://127.0.0.1:1?session_timeout=soon"), DLOCK_EINVAL);
	long long t1 = tu_now_ms();
	CHECK_RC(dlock_store_open(&s, "zk://127.0.0.1:1?sesion_timeout=5s"), DLOCK_EINVAL); /* misspelt */
	CHECK(tu_now_ms() - t1 < 1000); /* said at once, not after connect_timeout */
	char u[2048];
	/* nothing listens on port 1: unavailable, within connect_timeout */
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_store_open(&s, "zk://127.0.0.1:1?connect_timeout=500ms"), DLOCK_EUNAVAILABLE);
	CHECK(tu_now_ms() - t0 < 3000);
	/* a ttl the session timeout cannot cover is refused, not silently unsafe */
	snprintf(u, sizeof(u), "%s?session_timeout=2s", direct_uri);
	CHECK_RC(dlock_store_open(&s, u), 0);
	dlock_lock *l = nu_lock_cb(s, "long-ttl", 10000, NULL);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_EINVAL);
	dlock_lock_free(l);
	l = nu_lock_cb(s, "short-ttl", 1500, NULL);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_extend(l, 5000), DLOCK_EINVAL);
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	/* a chroot that does not exist yet is made */
	snprintf(u, sizeof(u), "%s/chroot-%s/x", direct_uri, run_id);
	CHECK_RC(dlock_store_open(&s, u), 0);
	l = nu_lock_cb(s, "in-chroot", 5000, NULL);
	CHECK_RC(dlock_acquire(l, 0), 0);
	char path[128];
	snprintf(path, sizeof(path), "/chroot-%s/x/dlock/in-chroot", run_id);
	CHECK(nchildren(path) == 1);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static const tu_case cases[] = {
	{ "bad_uris", case_bad_uris },
	{ "lost_create_reply", case_lost_create_reply },
	{ "lost_create_request", case_lost_create_request },
	{ "lost_delete_reply", case_lost_delete_reply },
	{ "lost_create_waiter", case_lost_create_waiter },
	{ "lost_create_no_reconnect", case_lost_create_no_reconnect },
	{ "session_expiry", case_session_expiry },
	{ "node_deleted", case_node_deleted },
	{ "stopped_holder", case_stopped_holder },
	{ "digest_acl", case_digest_acl },
	{ "names_and_cleanup", case_names_and_cleanup },
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	tu_uri_from_env(direct_uri, sizeof(direct_uri), "zookeeper_faults");
	if (sscanf(direct_uri, "zk://%255[^/?]", server_hp) != 1 || !strchr(server_hp, ':')) {
		fprintf(stderr, "zookeeper_faults: want a zk://host:port URI, got %s\n", direct_uri);
		return 2;
	}
	server_port = atoi(strrchr(server_hp, ':') + 1);
	snprintf(run_id, sizeof(run_id), "%08x", (unsigned)(tu_now_ms() ^ (getpid() << 16)));
	zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
	raw = zookeeper_init(server_hp, NULL, 30000, NULL, NULL, 0);
	long long until = tu_now_ms() + 10000;
	while (raw && zoo_state(raw) != ZOO_CONNECTED_STATE && tu_now_ms() < until)
		usleep(10000);
	if (!raw || zoo_state(raw) != ZOO_CONNECTED_STATE) {
		fprintf(stderr, "zookeeper_faults: cannot connect to %s\n", server_hp);
		return 2;
	}
	px_start();
	(void)argc;
	(void)argv;
	tu_run_cases(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, 3);
	zookeeper_close(raw);
	return tu_done("zookeeper_faults");
}
