/*
 * redis+cluster:// on a real cluster of 3 masters and 3 replicas
 * (tests/servers/redis-cluster.sh; issue 19 §2):
 *  - spread: locks on many names land on every master (their holder keys
 *    are found on each of the three), and each master has its replica;
 *  - reshard: a held lock's slot moves to another master (redis-cli
 *    --cluster reshard) while the holder renews it and another client keeps
 *    trying: no on_lost, every try refused, the hold is found on the new
 *    master, a waiter that subscribed before the move is woken by the
 *    release after it, and its fence is higher;
 *  - migrate (issue 31 row 3; its own ctest entry): a lock's slot moved by
 *    hand (SETSLOT IMPORTING/MIGRATING, one MIGRATE per key, the slot kept
 *    in transition ~800 ms, SETSLOT NODE), there and back, while 4 clients
 *    acquire (waiting up to 15 s), hold and release it: every call succeeds
 *    within its bound, no error carries a raw ASK/MOVED/TRYAGAIN, one holder
 *    at a time, fences only grow;
 *  - failback (issue 30 row 5, wait_replicas=0): a master's replica cut off,
 *    one more fence, the replica takes over (the fence lost in the resync)
 *    and the old master takes its slots back with its old run_id: the next
 *    fence is above every earlier one;
 *  - failover: the master of a held lock is killed; its replica takes over;
 *    the hold survives (granted only once the replica had it: WAIT), the
 *    holder renews on the new master, another client is refused until the
 *    release and then gets a higher fence.
 * The cases run in that order (failover last: it leaves a master without a
 * replica). Usage: redis_cluster SERVER_SCRIPT SERVER_DIR [case...]
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

static char uri[2048], script[1024], dir[1024];
static int ports[6];

/* The slot of a key, asked of the cluster. */
static int keyslot(const char *key)
{
	redisContext *c = rt_raw_port(ports[0]);
	redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", key);
	int v = r && r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -1;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return v;
}

/* The master serving `slot` by CLUSTER SLOTS asked of a live node: its port
 * and id (id: 41 bytes). @return the port; -1. */
static int master_of(int slot, char *id)
{
	for (int i = 0; i < 6; i++) {
		char path[1100];
		snprintf(path, sizeof(path), "%s/dead-%d", dir, ports[i]);
		if (access(path, F_OK) == 0)
			continue;
		redisContext *c = rt_raw_port(ports[i]);
		redisReply *r = redisCommand(c, "CLUSTER SLOTS");
		int port = -1;
		for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
			redisReply *e = r->element[k];
			if (e->elements >= 3 && slot >= e->element[0]->integer && slot <= e->element[1]->integer) {
				port = (int)e->element[2]->element[1]->integer;
				if (id)
					snprintf(id, 41, "%s", e->element[2]->element[2]->str);
			}
		}
		if (r)
			freeReplyObject(r);
		redisFree(c);
		return port;
	}
	return -1;
}

/* EXISTS key on one node: 1, 0, or -2 when the node redirects (MOVED). */
static long long exists_at(int port, const char *key)
{
	redisContext *c = rt_raw_port(port);
	redisReply *r = redisCommand(c, "EXISTS %s", key);
	long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "MOVED ", 6))
		v = -2;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return v;
}

static dlock_store *open_store(void)
{
	dlock_store *s = NULL;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "open %s: %s\n", uri, dlock_error_last()->message);
		exit(1);
	}
	return s;
}

static atomic_int lost;
static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	atomic_store(&lost, 1);
}

static dlock_lock *new_lock(dlock_store *s, const char *name, long ttl, bool watch_lost)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	if (watch_lost)
		o.on_lost = on_lost;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0) {
		fprintf(stderr, "lock_new: %s\n", dlock_error_last()->message);
		exit(1);
	}
	return l;
}

static void case_spread(void)
{
	dlock_store *s = open_store();
	enum { N = 30 };
	dlock_lock *l[N];
	int on[3] = { 0 }, masters[3] = { -1, -1, -1 };
	for (int i = 0; i < N; i++) {
		char name[32], key[64];
		snprintf(name, sizeof(name), "spread-%d", i);
		l[i] = new_lock(s, name, 10000, false);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
		snprintf(key, sizeof(key), "{dlock:%s}", name);
		int m = master_of(keyslot(key), NULL);
		CHECK(m > 0);
		CHECK(exists_at(m, key) == 1); /* on the slot's master */
		for (int k = 0; k < 3; k++) {
			if (masters[k] == m || masters[k] < 0) {
				masters[k] = m;
				on[k]++;
				break;
			}
		}
	}
	printf("  %d locks: %d, %d and %d on the three masters\n", N, on[0], on[1], on[2]);
	CHECK(on[0] > 0 && on[1] > 0 && on[2] > 0);
	/* a second client is refused on every name; the holders release */
	dlock_store *s2 = open_store();
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "spread-%d", i);
		dlock_lock *b = new_lock(s2, name, 10000, false);
		CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
		CHECK_RC(dlock_release(l[i]), 0);
		CHECK_RC(dlock_acquire(b, 0), 0);
		CHECK(dlock_fence(b) > dlock_fence(l[i]));
		CHECK_RC(dlock_release(b), 0);
		dlock_lock_free(b);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s2);
	dlock_store_close(s);
}

/* A name whose slot is among the first 10 of its master (the ones
 * `redis-cli --cluster reshard --cluster-slots 10` moves). */
static void low_slot_name(char *name, size_t n, int *slot, int *src, char *src_id)
{
	/* the lowest slot of each master: from CLUSTER SLOTS */
	int lows[3], nl = 0;
	redisContext *c = rt_raw_port(ports[0]);
	redisReply *r = redisCommand(c, "CLUSTER SLOTS");
	for (size_t k = 0; r && k < r->elements && nl < 3; k++)
		lows[nl++] = (int)r->element[k]->element[0]->integer;
	freeReplyObject(r);
	redisFree(c);
	for (int i = 0; i < 200000; i++) {
		char key[80];
		snprintf(name, n, "moving-%d", i);
		snprintf(key, sizeof(key), "{dlock:%s}", name);
		int sl = keyslot(key);
		for (int k = 0; k < nl; k++) {
			if (sl >= lows[k] && sl < lows[k] + 10 && master_of(sl, NULL) == master_of(lows[k], NULL)) {
				*slot = sl;
				*src = master_of(sl, src_id);
				return;
			}
		}
	}
	fprintf(stderr, "no name in a low slot found\n");
	exit(1);
}

typedef struct waiter {
	pthread_t t;
	dlock_lock *l;
	int rc, rrc;
	uint64_t fence;
	long long at;
} waiter;

static void *wait_main(void *p)
{
	waiter *w = p;
	w->rc = dlock_acquire(w->l, 60000);
	w->at = tu_now_ms();
	w->fence = dlock_fence(w->l);
	w->rrc = w->rc ? 0 : dlock_release(w->l); /* on the thread that holds it */
	return NULL;
}

static void case_reshard(void)
{
	char name[64], key[80], src_id[41], dst_id[41] = "";
	int slot, src;
	low_slot_name(name, sizeof(name), &slot, &src, src_id);
	snprintf(key, sizeof(key), "{dlock:%s}", name);
	/* the destination: another master */
	int dst = -1;
	for (int sl = 0; sl < 16384 && dst < 0; sl += 100) {
		char id[41];
		int m = master_of(sl, id);
		if (m > 0 && m != src) {
			dst = m;
			memcpy(dst_id, id, 41);
		}
	}
	CHECK(dst > 0);
	dlock_store *s = open_store(), *s2 = open_store(), *s3 = open_store();
	atomic_store(&lost, 0);
	dlock_lock *a = new_lock(s, name, 900, true); /* renewed every ~300 ms */
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fa = dlock_fence(a);
	CHECK(exists_at(src, key) == 1);
	/* many other keys in the slot, so that the migration takes a while (it
	 * moves 10 keys per MIGRATE): the lock's keys are split between the two
	 * masters for part of it, while the holder renews */
	{
		redisContext *c = rt_raw_port(src);
		enum { FILL = 20000 };
		for (int i = 0; i < FILL; i++)
			redisAppendCommand(c, "SET %s:fill:%d x", key, i);
		for (int i = 0; i < FILL; i++) {
			redisReply *r = NULL;
			if (redisGetReply(c, (void **)&r) == REDIS_OK && r)
				freeReplyObject(r);
		}
		redisFree(c);
	}
	/* a waiter subscribed on the old master before the move */
	waiter w = { .l = new_lock(s3, name, 5000, false) };
	pthread_create(&w.t, NULL, wait_main, &w);
	/* move the slot (and 9 others) while the holder renews */
	char cmd[4096];
	/* over TLS when the cluster speaks it (its MIGRATEs go node to node over TLS) */
	char tls[1200] = "", tport[32];
	int via = src;
	for (int i = 0; i < 6; i++) {
		char f[1100];
		snprintf(f, sizeof(f), "%s/%d/tls_port", dir, i);
		if (ports[i] == src && tu_first_line(f, tport, sizeof(tport)) == 0) {
			via = atoi(tport);
			snprintf(tls, sizeof(tls), "--tls --cacert %s/tls/ca.pem", dir);
		}
	}
	snprintf(cmd, sizeof(cmd),
		 "redis-cli %s --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s --cluster-slots 10 "
		 "--cluster-yes >%s/reshard.log 2>&1",
		 tls, via, src_id, dst_id, dir);
	dlock_lock *b = new_lock(s2, name, 5000, false);
	long long t0 = tu_now_ms();
	FILE *p = popen(cmd, "r");
	CHECK(p != NULL);
	int tries = 0, granted = 0;
	/* try while it runs (popen's child ends when the reshard does) */
	while (p && tu_now_ms() - t0 < 60000) {
		int rc = dlock_acquire(b, 0);
		tries++;
		if (rc == 0) {
			granted++;
			dlock_release(b);
		}
		if (master_of(slot, NULL) == dst)
			break;
		usleep(5000);
	}
	int st = p ? pclose(p) : -1;
	CHECK(st == 0);
	long long moved = tu_now_ms() - t0;
	CHECK(master_of(slot, NULL) == dst);
	/* held across the move and two more leases: renewals follow the slot */
	usleep(2000 * 1000);
	for (int i = 0; i < 10; i++) {
		int rc = dlock_acquire(b, 0);
		tries++;
		if (rc == 0) {
			granted++;
			dlock_release(b);
		}
	}
	printf("  slot %d moved %d -> %d in %lld ms; %d tries by another client, %d granted; on_lost %s\n", slot, src,
	       dst, moved, tries, granted, atomic_load(&lost) ? "fired" : "did not fire");
	CHECK(granted == 0);
	CHECK(!atomic_load(&lost));
	CHECK(dlock_held(a));
	CHECK(exists_at(dst, key) == 1);
	CHECK(exists_at(src, key) == -2); /* the old master sends us on */
	/* the waiter, subscribed before the move, is woken by the release */
	long long rel = tu_now_ms();
	CHECK_RC(dlock_release(a), 0);
	pthread_join(w.t, NULL);
	CHECK_RC(w.rc, 0);
	printf("  waiter granted %lld ms after the release\n", w.at - rel);
	CHECK(w.fence > fa);
	CHECK_RC(w.rrc, 0);
	dlock_lock_free(w.l);
	dlock_lock_free(b);
	dlock_lock_free(a);
	dlock_store_close(s3);
	dlock_store_close(s2);
	dlock_store_close(s);
}

/* Look every 50 ms, at most 60 s, until `port` is a replica with its link
 * up (to the master the slot map names: over TLS its master_port is the
 * TLS port, so that is not compared). */
static int await_replica(int port)
{
	for (long long until = tu_now_ms() + 60000;
	     !rt_repl_says(port, "role:slave") || !rt_repl_says(port, "master_link_status:up");) {
		if (tu_now_ms() > until)
			return 0;
		usleep(50000);
	}
	return 1;
}

/* A command on the node at port whose answer must not be an error. */
static void node_ok(int port, const char *cmd, const char *arg)
{
	redisContext *c = rt_raw_port(port);
	redisReply *r = arg ? redisCommand(c, cmd, arg) : redisCommand(c, cmd);
	if (!r || r->type == REDIS_REPLY_ERROR) {
		fprintf(stderr, "%d: '%s' failed: %s\n", port, cmd, r ? r->str : "no reply");
		tu_failures++;
	}
	if (r)
		freeReplyObject(r);
	redisFree(c);
}

/* The first replica of the master serving slot (CLUSTER SLOTS): its port; -1. */
static int replica_of_slot(int slot)
{
	redisContext *c = rt_raw_port(master_of(slot, NULL));
	redisReply *r = redisCommand(c, "CLUSTER SLOTS");
	int port = -1;
	for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
		redisReply *e = r->element[k];
		if (e->elements >= 4 && slot >= e->element[0]->integer && slot <= e->element[1]->integer)
			port = (int)e->element[3]->element[1]->integer;
	}
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return port;
}

/* One acquire + release on s within 30 s (the map settles after a
 * failover): the fence, 0 when not granted. */
static uint64_t take_fence(dlock_store *s, const char *name)
{
	dlock_lock *l = new_lock(s, name, 5000, false);
	int rc;
	long long until = tu_now_ms() + 30000;
	while ((rc = dlock_acquire(l, 2000)) != 0 && tu_now_ms() < until)
		usleep(100000);
	CHECK_RC(rc, 0);
	uint64_t f = rc == 0 ? dlock_fence(l) : 0;
	if (rc == 0)
		CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	return f;
}

/*
 * Failback (issue 30 row 5), with wait_replicas=0: fences on master M; its
 * replica R cut off (a wrong masterauth: it cannot sync again) and M grants
 * one more; R takes over (CLUSTER FAILOVER FORCE), M becomes its replica and
 * resyncs (that fence is lost), then M takes its slots back (CLUSTER
 * FAILOVER), with its old run_id. The next fence must be above every
 * earlier one: with the run_id alone as the guard's epoch, M found its own
 * id in the data and handed out the lost fence again.
 */
static void case_failback(void)
{
	const char *name = "failback";
	char key[64], u[2200];
	snprintf(key, sizeof(key), "{dlock:%s}", name);
	int slot = keyslot(key), m = master_of(slot, NULL), r = replica_of_slot(slot);
	for (long long until = tu_now_ms() + 10000; r <= 0 && tu_now_ms() < until; r = replica_of_slot(slot))
		usleep(50000); /* a fresh cluster's map names the replicas once the bus has gossiped them */
	CHECK(m > 0 && r > 0);
	if (m <= 0 || r <= 0)
		return;
	snprintf(u, sizeof(u), "%s%swait_replicas=0", uri, strchr(uri, '?') ? "&" : "?");
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, u), 0);
	if (!s)
		return;
	uint64_t top = 0, f;
	for (int i = 0; i < 2; i++) {
		f = take_fence(s, name);
		CHECK(f > top);
		top = f;
	}
	node_ok(m, "CONFIG SET repl-diskless-sync-delay 0", NULL);
	node_ok(r, "CONFIG SET repl-diskless-sync-delay 0", NULL);
	node_ok(m, "WAIT 1 5000", NULL);
	node_ok(r, "CONFIG SET masterauth not-the-password", NULL);
	node_ok(m, "CLIENT KILL TYPE replica", NULL);
	for (long long until = tu_now_ms() + 10000; !rt_repl_says(r, "master_link_status:down") && tu_now_ms() < until;)
		usleep(20000);
	CHECK(rt_repl_says(r, "master_link_status:down"));
	f = take_fence(s, name);
	CHECK(f > top);
	top = f;
	long long t0 = tu_now_ms();
	node_ok(r, "CLUSTER FAILOVER FORCE", NULL);
	while (master_of(slot, NULL) != r && tu_now_ms() - t0 < 60000)
		usleep(50000);
	CHECK(master_of(slot, NULL) == r);
	node_ok(r, "CONFIG SET masterauth %s", "");
	CHECK(await_replica(m));
	redisContext *c = rt_raw_port(m);
	redisReply *rep = redisCommand(c, "READONLY");
	if (rep)
		freeReplyObject(rep);
	rep = redisCommand(c, "GET %s:f", key);
	long long kept = rep && rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : -1;
	if (rep)
		freeReplyObject(rep);
	redisFree(c);
	CHECK(kept >= 0 && kept < (long long)top); /* the last fence is lost: the case to prove */
	/* a manual failover times out (5 s) when R does not know M as its
	 * replica yet (the bus gossips it): ask again */
	for (long long again = 0; master_of(slot, NULL) != m && tu_now_ms() - t0 < 90000; usleep(50000)) {
		if (tu_now_ms() >= again) {
			node_ok(m, "CLUSTER FAILOVER", NULL);
			again = tu_now_ms() + 6000;
		}
	}
	CHECK(master_of(slot, NULL) == m);
	CHECK(await_replica(r));
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "bash %s wait-ok %s", script, dir);
	CHECK(system(cmd) == 0);
	f = take_fence(s, name);
	printf("  failback: fences up to %llu handed out, %lld kept through the failover; %d serves the slot "
	       "again after %lld ms: next fence %llu",
	       (unsigned long long)top, kept, m, tu_now_ms() - t0, (unsigned long long)f);
	CHECK(f > top);
	top = f > top ? f : top;
	rt_fence_new_handle(u, name, &top, take_fence);
	printf("\n");
	dlock_store_close(s);
}

static void case_failover(void)
{
	const char *name = "failover";
	char key[64];
	snprintf(key, sizeof(key), "{dlock:%s}", name);
	int slot = keyslot(key);
	dlock_store *s = open_store(), *s2 = open_store();
	atomic_store(&lost, 0);
	dlock_lock *a = new_lock(s, name, 15000, true);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fa = dlock_fence(a);
	int old = master_of(slot, NULL);
	CHECK(old > 0);
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "bash %s kill %s %d", script, dir, old);
	long long t0 = tu_now_ms();
	CHECK(system(cmd) == 0);
	/* the cluster notices (node timeout 1 s), then the replica is promoted */
	int now = old;
	while ((now = master_of(slot, NULL)) == old && tu_now_ms() - t0 < 60000)
		usleep(50000);
	snprintf(cmd, sizeof(cmd), "bash %s wait-ok %s", script, dir);
	CHECK(system(cmd) == 0);
	printf("  master %d killed; replica %d serves the slot after %lld ms\n", old, now, tu_now_ms() - t0);
	CHECK(now > 0 && now != old);
	CHECK(exists_at(now, key) == 1); /* the grant had reached the replica */
	/* the holder renews on the new master: extend goes there */
	CHECK_RC(dlock_extend(a, 15000), 0);
	dlock_lock *b = new_lock(s2, name, 5000, false);
	CHECK_RC(dlock_acquire(b, 0), DLOCK_ELOCKED);
	CHECK(!atomic_load(&lost));
	CHECK_RC(dlock_release(a), 0);
	/* the new master has no replica yet: a grant it cannot replicate is refused */
	CHECK_RC(dlock_acquire(b, 0), DLOCK_EUNAVAILABLE);
	/* the old master comes back, as the new one's replica: grants again */
	snprintf(cmd, sizeof(cmd), "bash %s restart %s %d", script, dir, old);
	CHECK(system(cmd) == 0);
	CHECK_RC(dlock_acquire(b, 0), 0);
	printf("  fences: %llu before the failover, %llu after\n", (unsigned long long)fa,
	       (unsigned long long)dlock_fence(b));
	CHECK(dlock_fence(b) > fa);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(b);
	dlock_lock_free(a);
	dlock_store_close(s2);
	dlock_store_close(s);
}

/* ---- migrate (issue 31 row 3) ---- */

/* A command on a raw connection that must succeed (not an error reply). */
static void must(redisContext *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	redisReply *r = redisvCommand(c, fmt, ap);
	va_end(ap);
	if (!r || r->type == REDIS_REPLY_ERROR) {
		fprintf(stderr, "  command %s: %s\n", fmt, r ? r->str : c->errstr);
		tu_failures++;
	}
	if (r)
		freeReplyObject(r);
}

typedef struct mclient {
	pthread_t t;
	dlock_store *s;
	dlock_lock *l;
	int grants, fails;
	long long max_acq, max_rel;
	char err[300], msg[256]; /* the last failure; its message as the library gave it */
} mclient;

static atomic_int m_stop, m_inside, m_overlap;
static pthread_mutex_t m_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t m_last_fence;
static int m_fence_back;

static bool redirect_text(const char *m)
{
	return !strncmp(m, "ASK", 3) || !strncmp(m, "MOVED", 5) || !strncmp(m, "TRYAGAIN", 8) || strstr(m, ": ASK ") ||
	       strstr(m, ": MOVED ") || strstr(m, ": TRYAGAIN");
}

static void m_fail(mclient *c, const char *what, int rc)
{
	c->fails++;
	snprintf(c->msg, sizeof(c->msg), "%s", dlock_error_last()->message);
	snprintf(c->err, sizeof(c->err), "%s: rc %d: %s", what, rc, c->msg);
}

/* Acquire (waiting up to 15 s), hold 1 ms, release, until told to stop:
 * every call must succeed, within its bound, with one holder at a time and
 * fences that only grow. */
static void *mclient_main(void *p)
{
	mclient *c = p;
	while (!atomic_load(&m_stop)) {
		long long t0 = tu_now_ms();
		int rc = dlock_acquire(c->l, 15000);
		long long t1 = tu_now_ms();
		if (t1 - t0 > c->max_acq)
			c->max_acq = t1 - t0;
		if (rc) {
			m_fail(c, "acquire", rc);
			continue;
		}
		if (atomic_fetch_add(&m_inside, 1) != 0)
			atomic_store(&m_overlap, 1);
		uint64_t f = dlock_fence(c->l);
		pthread_mutex_lock(&m_mu);
		if (f <= m_last_fence)
			m_fence_back++;
		m_last_fence = f;
		pthread_mutex_unlock(&m_mu);
		usleep(1000);
		atomic_fetch_sub(&m_inside, 1);
		t0 = tu_now_ms();
		rc = dlock_release(c->l);
		t1 = tu_now_ms();
		if (t1 - t0 > c->max_rel)
			c->max_rel = t1 - t0;
		if (rc)
			m_fail(c, "release", rc);
		else
			c->grants++;
	}
	return NULL;
}

/* Move `slot` from one master to another by hand, as redis-cli --cluster
 * does, but slowly: IMPORTING/MIGRATING, the keys one MIGRATE at a time,
 * then the slot kept in transition with every key on the new master (every
 * lock request on it is answered ASK, then TRYAGAIN) until `window_ms`
 * passed, then SETSLOT NODE on both and on the other masters. */
static void move_slot(int slot, int from, const char *from_id, int to, const char *to_id, long long window_ms)
{
	redisContext *src = rt_raw_port(from), *dst = rt_raw_port(to);
	long long t0 = tu_now_ms();
	must(dst, "CLUSTER SETSLOT %d IMPORTING %s", slot, from_id);
	must(src, "CLUSTER SETSLOT %d MIGRATING %s", slot, to_id);
	int moved = 0;
	for (;;) {
		redisReply *r = redisCommand(src, "CLUSTER GETKEYSINSLOT %d 1", slot);
		bool none = !r || r->type != REDIS_REPLY_ARRAY || r->elements == 0;
		if (!none) {
			char port[16];
			snprintf(port, sizeof(port), "%d", to);
			const char *argv[8] = { "MIGRATE", "127.0.0.1", port,   "",
						"0",       "5000",      "KEYS", r->element[0]->str };
			redisReply *m = redisCommandArgv(src, 8, argv, NULL);
			if (!m || m->type == REDIS_REPLY_ERROR) {
				fprintf(stderr, "  MIGRATE: %s\n", m ? m->str : src->errstr);
				tu_failures++;
				none = true;
			}
			if (m)
				freeReplyObject(m);
			moved++;
		}
		if (r)
			freeReplyObject(r);
		if (none && tu_now_ms() - t0 >= window_ms)
			break;
		usleep(20000); /* the keys split between the two for a while */
	}
	must(dst, "CLUSTER SETSLOT %d NODE %s", slot, to_id);
	must(src, "CLUSTER SETSLOT %d NODE %s", slot, to_id);
	for (int i = 0; i < 6; i++)
		if (ports[i] != from && ports[i] != to) {
			redisContext *o = rt_raw_port(ports[i]);
			redisReply *r = redisCommand(o, "CLUSTER SETSLOT %d NODE %s", slot, to_id);
			if (r) /* a replica refuses: its master tells it */
				freeReplyObject(r);
			redisFree(o);
		}
	printf("  slot %d: %d -> %d, %d key(s) moved, in transition %lld ms\n", slot, from, to, moved,
	       tu_now_ms() - t0);
	redisFree(src);
	redisFree(dst);
}

typedef struct mover {
	pthread_t t;
	int slot, from, to;
	char from_id[41], to_id[41];
} mover;

static void *mover_main(void *p)
{
	mover *m = p;
	move_slot(m->slot, m->from, m->from_id, m->to, m->to_id, 3000);
	return NULL;
}

static void case_migrate(void)
{
	char name[64] = "migrating", key[80], src_id[41], dst_id[41] = "";
	snprintf(key, sizeof(key), "{dlock:%s}", name);
	int slot = keyslot(key);
	int src = master_of(slot, src_id), dst = -1;
	for (int sl = 0; sl < 16384 && dst < 0; sl += 100) {
		char id[41];
		int m = master_of(sl, id);
		if (m > 0 && m != src) {
			dst = m;
			memcpy(dst_id, id, 41);
		}
	}
	CHECK(src > 0 && dst > 0);
	enum { N = 4 };
	mclient c[N];
	memset(c, 0, sizeof(c));
	atomic_store(&m_stop, 0);
	atomic_store(&m_inside, 0);
	atomic_store(&m_overlap, 0);
	m_last_fence = 0;
	m_fence_back = 0;
	for (int i = 0; i < N; i++) {
		c[i].s = open_store();
		c[i].l = new_lock(c[i].s, name, 5000, false);
		pthread_create(&c[i].t, NULL, mclient_main, &c[i]);
	}
	usleep(300 * 1000); /* the clients at work (and waiting) before the move */
	move_slot(slot, src, src_id, dst, dst_id, 800);
	usleep(300 * 1000);
	move_slot(slot, dst, dst_id, src, src_id, 800);
	usleep(300 * 1000);
	atomic_store(&m_stop, 1);
	int grants = 0, fails = 0;
	long long max_acq = 0, max_rel = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(c[i].t, NULL);
		grants += c[i].grants;
		fails += c[i].fails;
		max_acq = c[i].max_acq > max_acq ? c[i].max_acq : max_acq;
		max_rel = c[i].max_rel > max_rel ? c[i].max_rel : max_rel;
		if (c[i].fails) {
			printf("  client %d: %d failed call(s), last: %s\n", i, c[i].fails, c[i].err);
			CHECK(!redirect_text(c[i].msg)); /* never the raw redirect */
		}
		dlock_lock_free(c[i].l);
		dlock_store_close(c[i].s);
	}
	printf("  %d grants, %d failed calls; slowest acquire %lld ms, release %lld ms; fences back %d, overlap %d\n",
	       grants, fails, max_acq, max_rel, m_fence_back, atomic_load(&m_overlap));
	CHECK(fails == 0);
	CHECK(grants > 10);
	CHECK(!atomic_load(&m_overlap));
	CHECK(m_fence_back == 0);
	CHECK(max_acq <= 15000 + 750); /* --wait 15 s and its slack */
	CHECK(max_rel <= 2000 + 500);  /* one request timeout (the default 2 s) */
	CHECK(master_of(slot, NULL) == src);

	/* A wait that starts while the slot is in transition for longer than one
	 * request (3 s > the 2 s request timeout): its first try meets only
	 * ASK/TRYAGAIN; the cluster answers, so the wait goes on to the grant. */
	mover mv = { .slot = slot, .from = src, .to = dst };
	memcpy(mv.from_id, src_id, 41);
	memcpy(mv.to_id, dst_id, 41);
	pthread_create(&mv.t, NULL, mover_main, &mv);
	redisContext *rc = rt_raw_port(src);
	for (int i = 0; i < 500; i++) { /* until every key is on the new master */
		redisReply *r = redisCommand(rc, "CLUSTER COUNTKEYSINSLOT %d", slot);
		long long keys = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
		redisReply *st = redisCommand(rc, "CLUSTER NODES");
		bool migrating = st && st->type == REDIS_REPLY_STRING && strstr(st->str, "->-");
		if (r)
			freeReplyObject(r);
		if (st)
			freeReplyObject(st);
		if (keys == 0 && migrating)
			break;
		usleep(10000);
	}
	redisFree(rc);
	dlock_store *s = open_store();
	dlock_lock *l = new_lock(s, name, 5000, false);
	long long t0 = tu_now_ms();
	int arc = dlock_acquire(l, 15000);
	long long took = tu_now_ms() - t0;
	printf("  an acquire started in a 3 s transition: rc %d after %lld ms (%s)\n", arc, took,
	       arc ? dlock_error_last()->message : "granted");
	CHECK_RC(arc, 0);
	CHECK(took < 15000);
	CHECK(dlock_fence(l) > m_last_fence);
	pthread_join(mv.t, NULL);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	CHECK(master_of(slot, NULL) == dst);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: redis_cluster SERVER_SCRIPT SERVER_DIR [case...]\n");
		return 2;
	}
	snprintf(script, sizeof(script), "%s", argv[1]);
	snprintf(dir, sizeof(dir), "%s", argv[2]);
	char path[1100];
	snprintf(path, sizeof(path), "%s/uri", dir);
	if (tu_first_line(path, uri, sizeof(uri)) != 0) {
		fprintf(stderr, "no cluster: %s unreadable\n", path);
		return 1;
	}
	for (int i = 0; i < 6; i++) {
		char p[1100], line[32];
		snprintf(p, sizeof(p), "%s/%d/port", dir, i);
		if (tu_first_line(p, line, sizeof(line)) != 0)
			return 1;
		ports[i] = atoi(line);
	}
	/* clang-format off */
	static const tu_case cases[] = {
		{ "spread", case_spread },
		{ "reshard", case_reshard },
		{ "migrate", case_migrate },
		{ "failback", case_failback },
		{ "failover", case_failover },
	};
	/* clang-format on */
	tu_run_cases(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, 3);
	return tu_done("redis_cluster");
}
