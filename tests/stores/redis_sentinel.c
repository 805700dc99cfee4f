/*
 * redis+sentinel:// (master + one replica + one Sentinel; issue 20 row 4):
 *  - the store finds the master through Sentinel; the cost of waiting for
 *    the replica (WAIT, on by default) is measured and printed;
 *  - with the replica stopped, a grant that cannot reach it is not handed
 *    out: acquire fails within its bound and the lock is left free;
 *  - a grant the failover loses (the replica cut off just before it, then
 *    the master killed): the next grant on the promoted replica gets a fence
 *    strictly greater than the lost one (fence guard, with wait_replicas=0 so
 *    that the grant itself is not waited for);
 *  - during the failover, open asks the sentinels again until the new master
 *    answers (within connect_timeout) instead of failing on the dead one;
 *  - the same store handle finds and uses the new master afterwards;
 *  - a failback (Sentinel fails over to the old master and back, the last
 *    fence lost on the way): the next fence is above every earlier one
 *    (issue 30 row 5; wait_replicas=0).
 *
 * Opened through the backend (dlock__redis_open + dlock_store_open_backend)
 * so that it does not depend on the scheme table naming "redis+sentinel".
 * Usage: redis_sentinel SERVER_SCRIPT SERVER_DIR
 */
#include "stores/redis_sentinel_test.h"

#include <signal.h>
#include <unistd.h>
#include <time.h>

static long long raw_int(redisContext *c, const char *cmd)
{
	redisReply *r = redisCommand(c, cmd);
	long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	if (r && r->type == REDIS_REPLY_STRING)
		v = atoll(r->str);
	if (r)
		freeReplyObject(r);
	return v;
}

/* A loaded machine puts Sentinel in TILT mode (it then does no failover for
 * 30 s): wait until it is out (bounded). */
static void sentinel_untilted(const char *uri)
{
	int port = 0;
	if (sscanf(uri, "redis+sentinel://127.0.0.1:%d", &port) != 1)
		return;
	redisContext *c = rt_raw_port(port);
	long long until = tu_now_ms() + 60000;
	for (;;) {
		redisReply *r = redisCommand(c, "INFO sentinel");
		int tilt = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "sentinel_tilt:1") != NULL;
		if (r)
			freeReplyObject(r);
		if (!tilt || tu_now_ms() > until)
			break;
		nanosleep(&(struct timespec){ 0, 200000000 }, NULL);
	}
	redisFree(c);
}

/* Look every 50 ms, at most ms, until the server on port says line: 1, or 0. */
static int await_repl(int port, const char *line, long ms)
{
	long long until = tu_now_ms() + ms;
	while (!rt_repl_says(port, line)) {
		if (tu_now_ms() > until)
			return 0;
		nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	return 1;
}

/* SENTINEL FAILOVER (asked again while Sentinel is busy with an earlier one
 * or has not yet seen the replica), then wait until the sentinel names
 * `to` and `from` replicates it: 1, or 0 when that took more than 60 s. */
static int sentinel_failover(const char *uri, int to, int from)
{
	int sport = 0;
	if (sscanf(uri, "redis+sentinel://127.0.0.1:%d", &sport) != 1)
		return 0;
	sentinel_untilted(uri);
	redisContext *c = rt_raw_port(sport);
	long long until = tu_now_ms() + 60000;
	int started = 0, named = 0;
	while (!started && tu_now_ms() < until) {
		redisReply *r = redisCommand(c, "SENTINEL FAILOVER dlockmaster");
		started = r && r->type == REDIS_REPLY_STATUS;
		if (r)
			freeReplyObject(r);
		if (!started)
			nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
	}
	while (started && !named && tu_now_ms() < until) {
		redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name dlockmaster");
		named = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && atoi(r->element[1]->str) == to;
		if (r)
			freeReplyObject(r);
		if (!named)
			nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	redisFree(c);
	if (named) { /* what Sentinel does once it looks at the old master again (every 10 s) */
		c = rt_raw_port(from);
		rt_ok(c, "REPLICAOF 127.0.0.1 %d", to);
		redisFree(c);
	}
	char line[64];
	snprintf(line, sizeof(line), "master_port:%d\r\nmaster_link_status:up", to);
	return named && await_repl(from, line, until - tu_now_ms());
}

/* Microseconds per acquire + release pair over n pairs. */
static double pair_us(const char *u, int n)
{
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	if (rt_open_sentinel(&s, u) != 0 || dlock_lock_new(&l, s, "sentinel-cost", NULL) != 0)
		exit(1);
	CHECK_RC(dlock_acquire(l, 5000), 0);
	CHECK_RC(dlock_release(l), 0);
	long long t0 = tu_now_ms();
	for (int i = 0; i < n; i++) {
		CHECK_RC(dlock_acquire(l, 5000), 0);
		CHECK_RC(dlock_release(l), 0);
	}
	double us = (double)(tu_now_ms() - t0) * 1000.0 / n;
	dlock_lock_free(l);
	dlock_store_close(s);
	return us;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	setvbuf(stdout, NULL, _IOLBF, 0);
	char uri[4096], cmd[2048], u[4200];
	rt_read_uri(uri, sizeof(uri));
	int replica = rt_file_int(argv[2], "replica"), master = rt_file_int(argv[2], "master");
	char rpid_path[1100];
	snprintf(rpid_path, sizeof(rpid_path), "%s/r/redis.pid", argv[2]);
	FILE *pf = fopen(rpid_path, "r");
	int rpid = 0;
	if (!pf || fscanf(pf, "%d", &rpid) != 1 || rpid <= 0)
		return 1;
	fclose(pf);

	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(rt_open_sentinel(&s, uri), 0);
	if (!s)
		return tu_done("redis_sentinel");
	CHECK(!strcmp(dlock_store_kind(s), "redis"));
	CHECK_RC(dlock_lock_new(&l, s, "sentinel-test", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t f1 = dlock_fence(l);
	CHECK_RC(dlock_release(l), 0);

	dlock_store *bad = NULL;
	char wrong[4200];
	snprintf(wrong, sizeof(wrong), "%s-nosuchmaster?connect_timeout=300ms", uri);
	CHECK_RC(rt_open_sentinel(&bad, wrong), DLOCK_EUNAVAILABLE);
	snprintf(wrong, sizeof(wrong), "redis+sentinel://127.0.0.1:1");
	CHECK_RC(rt_open_sentinel(&bad, wrong), DLOCK_EINVAL);
	snprintf(wrong, sizeof(wrong), "%s?wait_replicas=x", uri);
	CHECK_RC(rt_open_sentinel(&bad, wrong), DLOCK_EINVAL);

	/* the cost of waiting for the replica */
	snprintf(u, sizeof(u), "%s?wait_replicas=0&fence_replicas=0", uri);
	double off = pair_us(u, 300);
	snprintf(u, sizeof(u), "%s?wait_replicas=0", uri);
	double guard = pair_us(u, 300);
	double on = pair_us(uri, 300);
	printf("acquire+release through Sentinel, 300 pairs: %.0f us without WAIT, %.0f us fence guard only, "
	       "%.0f us with WAIT 1 (default)\n",
	       off, guard, on);

	/* the replica stopped: a grant that cannot reach it is not handed out */
	redisContext *m = rt_raw_port(master);
	snprintf(u, sizeof(u), "%s?timeout=500ms", uri);
	dlock_store *w = NULL;
	dlock_lock *wl = NULL;
	CHECK_RC(rt_open_sentinel(&w, u), 0);
	CHECK_RC(dlock_lock_new(&wl, w, "sentinel-wait", NULL), 0);
	tu_stop(rpid);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(wl, 300);
	long long took = tu_now_ms() - t0;
	kill(rpid, SIGCONT);
	printf("replica stopped: acquire (wait 300 ms) %s after %lld ms (%s)\n", dlock_error_name(rc), took,
	       dlock_error_last()->message);
	CHECK(rc == DLOCK_EUNAVAILABLE || rc == DLOCK_ETIMEOUT);
	CHECK(took <= 300 + 50 + TU_SCHED_GRACE_MS);
	CHECK(!dlock_held(wl));
	/* given back at once, or by the core's undo in the background */
	long long until = tu_now_ms() + 5000;
	while (raw_int(m, "HLEN {dlock:sentinel-wait}") != 0 && tu_now_ms() < until)
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	CHECK(raw_int(m, "HLEN {dlock:sentinel-wait}") == 0);
	dlock_lock_free(wl);
	dlock_store_close(w);

	/* a grant that the failover loses */
	snprintf(u, sizeof(u), "%s?wait_replicas=0", uri);
	dlock_store *g = NULL;
	dlock_lock *gl = NULL;
	CHECK_RC(rt_open_sentinel(&g, u), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.no_renew = 1;
	o.ttl_ms = 3000; /* if the grant did reach the replica after all, it ends soon */
	CHECK_RC(dlock_lock_new(&gl, g, "sentinel-lost", &o), 0);
	CHECK_RC(dlock_acquire(gl, 5000), 0); /* reserves fences and waits for them once */
	CHECK_RC(dlock_release(gl), 0);
	sentinel_untilted(uri);
	snprintf(rpid_path, sizeof(rpid_path), "%s/m/redis.pid", argv[2]);
	pf = fopen(rpid_path, "r");
	int mpid = 0;
	if (!pf || fscanf(pf, "%d", &mpid) != 1 || mpid <= 0)
		return 1;
	fclose(pf);
	/* cut the replica off (stopped for a few ms, so that it cannot reconnect),
	 * grant, and kill the master at once: the grant never reaches the replica */
	tu_stop(rpid);
	redisReply *r = redisCommand(m, "CLIENT KILL TYPE replica");
	CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer >= 1);
	if (r)
		freeReplyObject(r);
	CHECK_RC(dlock_acquire(gl, 0), 0);
	kill(mpid, SIGKILL);
	uint64_t lost = dlock_fence(gl);
	redisFree(m);
	while (!tu_gone(mpid))
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	kill(rpid, SIGCONT);
	unlink(rpid_path);
	t0 = tu_now_ms();

	/* open during the failover: the sentinels still name the dead master */
	snprintf(u, sizeof(u), "%s?connect_timeout=40s&wait_replicas=0&fence_replicas=0", uri);
	dlock_store *n = NULL;
	rc = rt_open_sentinel(&n, u);
	printf("open during the failover: %s after %lld ms\n", dlock_error_name(rc), tu_now_ms() - t0);
	CHECK_RC(rc, 0);
	dlock_store_close(n);
	/* the old master comes back as a replica of the new one (else every
	 * grant waits for a replica that is not there) — only once the replica
	 * has been promoted: an empty server back on the old master's port
	 * before that would be the replica's master again, and its full resync
	 * would empty the replica (the fences it kept with it) */
	{
		redisContext *rc2 = rt_raw_port(replica);
		long long promoted_by = tu_now_ms() + 40000;
		for (;;) {
			redisReply *rr = redisCommand(rc2, "ROLE");
			int is_master = rr && rr->type == REDIS_REPLY_ARRAY && rr->elements > 0 &&
					rr->element[0]->type == REDIS_REPLY_STRING &&
					!strcmp(rr->element[0]->str, "master");
			if (rr)
				freeReplyObject(rr);
			if (is_master || tu_now_ms() > promoted_by)
				break;
			nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
		}
		redisFree(rc2);
	}
	snprintf(cmd, sizeof(cmd), "redis-server '%s/m/redis.conf' --replicaof 127.0.0.1 %d", argv[2], replica);
	CHECK(system(cmd) == 0);
	redisContext *nm = rt_raw_port(replica);
	while (raw_int(nm, "WAIT 1 100") < 1 && tu_now_ms() - t0 < 30000)
		;
	redisFree(nm);
	n = NULL;
	CHECK_RC(rt_open_sentinel(&n, uri), 0);
	if (n) {
		dlock_lock *nl = NULL;
		CHECK_RC(dlock_lock_new(&nl, n, "sentinel-lost", NULL), 0);
		redisContext *nm2 = rt_raw_port(replica);
		long long kept = raw_int(nm2, "GET {dlock:sentinel-lost}:f");
		redisFree(nm2);
		rc = dlock_acquire(nl, 20000);
		CHECK_RC(rc, 0);
		printf("a grant %s in the failover had fence %llu (the new master's counter came up at %lld); "
		       "the next grant on the new master has %llu\n",
		       kept < (long long)lost ? "lost" : "NOT lost (it replicated: the check below is weaker)",
		       (unsigned long long)lost, kept, (unsigned long long)dlock_fence(nl));
		CHECK(dlock_fence(nl) > lost);
		if (rc == 0)
			CHECK_RC(dlock_release(nl), 0);
		dlock_lock_free(nl);
		dlock_store_close(n);
	}
	dlock_lock_free(gl);
	dlock_store_close(g);

	/* the first store handle follows */
	struct timespec ts = { 0, 100 * 1000000 };
	while ((rc = dlock_acquire(l, 0)) != 0 && tu_now_ms() - t0 < 30000)
		nanosleep(&ts, NULL);
	CHECK_RC(rc, 0);
	printf("failover: the same handle granted a lock on the new master %lld ms after the kill "
	       "(fence %llu, before %llu)\n",
	       tu_now_ms() - t0, (unsigned long long)dlock_fence(l), (unsigned long long)f1);
	CHECK(dlock_fence(l) > f1);
	CHECK_RC(dlock_release(l), 0);

	/* it is the former replica that serves now */
	redisContext *c = rt_raw_port(replica);
	r = redisCommand(c, "ROLE");
	CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && !strcmp(r->element[0]->str, "master"));
	if (r)
		freeReplyObject(r);
	redisFree(c);

	/* Failback (issue 30 row 5), with wait_replicas=0. The former replica R
	 * serves, the restarted old master M replicates it. Fences on R; M is cut
	 * off (a wrong masterauth: it cannot sync again) and R grants one more
	 * fence; Sentinel fails over to M (R resyncs from it: that fence is lost)
	 * and back to R, which keeps its run_id. The next fence on R must be
	 * above every earlier one: with the run_id alone as the guard's epoch R
	 * found its own id in the data and handed out the lost fence again. */
	{
		redisContext *rr = rt_raw_port(replica), *mm = rt_raw_port(master);
		rt_ok(rr, "CONFIG SET repl-diskless-sync-delay 0");
		rt_ok(mm, "CONFIG SET repl-diskless-sync-delay 0");
		snprintf(u, sizeof(u), "%s?wait_replicas=0", uri);
		dlock_store *fb = NULL;
		dlock_lock *fl = NULL;
		CHECK_RC(rt_open_sentinel(&fb, u), 0);
		CHECK_RC(dlock_lock_new(&fl, fb, "sentinel-failback", NULL), 0);
		uint64_t top = 0;
		for (int i = 0; i < 2; i++) {
			CHECK_RC(dlock_acquire(fl, 10000), 0);
			CHECK(dlock_fence(fl) > top);
			top = dlock_fence(fl);
			CHECK_RC(dlock_release(fl), 0);
		}
		CHECK(raw_int(rr, "WAIT 1 5000") == 1);
		rt_ok(mm, "CONFIG SET masterauth not-the-password");
		{
			redisReply *k = redisCommand(rr, "CLIENT KILL TYPE replica");
			CHECK(k && k->type == REDIS_REPLY_INTEGER);
			if (k)
				freeReplyObject(k);
		}
		CHECK(await_repl(master, "master_link_status:down", 10000));
		CHECK_RC(dlock_acquire(fl, 10000), 0);
		CHECK(dlock_fence(fl) > top);
		top = dlock_fence(fl);
		CHECK_RC(dlock_release(fl), 0);
		redisFree(rr);
		redisFree(mm);
		t0 = tu_now_ms();
		CHECK(sentinel_failover(uri, master, replica));
		mm = rt_raw_port(master);
		rt_ok(mm, "CONFIG SET masterauth %s", "");
		redisFree(mm);
		rr = rt_raw_port(replica);
		long long kept = raw_int(rr, "GET {dlock:sentinel-failback}:f");
		redisFree(rr);
		CHECK(kept < (long long)top); /* the last fence is lost: the case to prove */
		CHECK(sentinel_failover(uri, replica, master));
		printf("failback: fences up to %llu handed out, %lld kept through the failover; back on the "
		       "first server (same run_id) after %lld ms",
		       (unsigned long long)top, kept, tu_now_ms() - t0);
		while ((rc = dlock_acquire(fl, 10000)) != 0 && tu_now_ms() - t0 < 90000)
			nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
		CHECK_RC(rc, 0);
		printf(": next fence %llu\n", (unsigned long long)dlock_fence(fl));
		CHECK(dlock_fence(fl) > top);
		if (rc == 0)
			CHECK_RC(dlock_release(fl), 0);
		dlock_lock_free(fl);
		dlock_store_close(fb);
	}

	dlock_lock_free(l);
	dlock_store_close(s);
	return tu_done("redis_sentinel");
}
