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
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

static char uri[2048], script[1024], dir[1024];
static int ports[6];

static redisContext *at(int port)
{
	char u[64];
	snprintf(u, sizeof(u), "redis://127.0.0.1:%d", port);
	return rt_raw(u);
}

/* The slot of a key, asked of the cluster. */
static int keyslot(const char *key)
{
	redisContext *c = at(ports[0]);
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
		redisContext *c = at(ports[i]);
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
	redisContext *c = at(port);
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
	redisContext *c = at(ports[0]);
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
		redisContext *c = at(src);
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
	printf("  slot %d moved %d -> %d in %lld ms; %d tries by another client, %d granted; on_lost %s\n", slot,
	       src, dst, moved, tries, granted, atomic_load(&lost) ? "fired" : "did not fire");
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

/* INFO replication of the node on port: does it say `line`? */
static int repl_says(int port, const char *line)
{
	redisContext *c = at(port);
	redisReply *r = redisCommand(c, "INFO replication");
	int yes = r && r->type == REDIS_REPLY_STRING && strstr(r->str, line) != NULL;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return yes;
}

/* Look every 50 ms, at most 60 s, until `port` is a replica with its link
 * up (to the master the slot map names: over TLS its master_port is the
 * TLS port, so that is not compared). */
static int await_replica(int port)
{
	for (long long until = tu_now_ms() + 60000;
	     !repl_says(port, "role:slave") || !repl_says(port, "master_link_status:up");) {
		if (tu_now_ms() > until)
			return 0;
		usleep(50000);
	}
	return 1;
}

/* A command on the node at port whose answer must not be an error. */
static void node_ok(int port, const char *cmd, const char *arg)
{
	redisContext *c = at(port);
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
	redisContext *c = at(master_of(slot, NULL));
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
	for (long long until = tu_now_ms() + 10000; !repl_says(r, "master_link_status:down") && tu_now_ms() < until;)
		usleep(20000);
	CHECK(repl_says(r, "master_link_status:down"));
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
	redisContext *c = at(m);
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
	dlock_store *s2 = NULL;
	CHECK_RC(dlock_store_open(&s2, u), 0);
	if (s2) {
		f = take_fence(s2, name);
		printf(", %llu (new handle)", (unsigned long long)f);
		CHECK(f > top);
		dlock_store_close(s2);
	}
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
	static const tu_case cases[] = {
		{ "spread", case_spread },
		{ "reshard", case_reshard },
		{ "failback", case_failback },
		{ "failover", case_failover },
	};
	tu_run_cases(cases, sizeof(cases) / sizeof(cases[0]), argc, argv, 3);
	return tu_done("redis_cluster");
}
