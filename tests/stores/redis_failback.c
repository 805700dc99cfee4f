/*
 * redis.failback (issue 30 row 5): fences never repeat after a failback on
 * plain Redis with the fence guard and no WAIT per grant
 * (fence_replicas=1&wait_replicas=0). Two servers of the harness, A and B:
 *   1. B replicates A; fences are taken on A (the first reserves 1000 and
 *      waits for B once);
 *   2. "failover": B is promoted (REPLICAOF NO ONE) and A grants one more
 *      fence that B never gets;
 *   3. failback: A is made a replica of B (it resyncs: the last fence is
 *      gone), then promoted again (REPLICAOF NO ONE) — with its old run_id;
 *      B replicates A again;
 *   4. the next fence on A, through the handle kept open and a fresh one,
 *      is strictly greater than every fence handed out before.
 * Before the epoch (run_id + master_replid) the guard compared run_ids only
 * and A handed out the step-2 fence a second time.
 * Usage: redis_failback SERVER_SCRIPT SERVER_DIR (a redis.sh DIR of 2 servers)
 */
#include "stores/redis_common_test.h"

#include <time.h>

/* A field of INFO replication (e.g. "master_link_status") into out. */
static void repl_field(redisContext *c, const char *field, char *out, size_t n)
{
	out[0] = 0;
	redisReply *r = redisCommand(c, "INFO replication");
	char key[64];
	snprintf(key, sizeof(key), "%s:", field);
	const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, key) : NULL;
	if (p)
		snprintf(out, n, "%.*s", (int)strcspn(p + strlen(key), "\r\n"), p + strlen(key));
	if (r)
		freeReplyObject(r);
}

/* Wait (looking every 20 ms, at most 20 s) until c's link to its master is up. */
static void await_link(redisContext *c)
{
	char v[64];
	long long until = tu_now_ms() + 20000;
	for (;;) {
		repl_field(c, "master_link_status", v, sizeof(v));
		if (!strcmp(v, "up") || tu_now_ms() > until)
			break;
		nanosleep(&(struct timespec){ 0, 20000000 }, NULL);
	}
	CHECK(!strcmp(v, "up"));
}

/* The fence of one acquire + release of `name` on s (0 when not granted). */
static uint64_t take(dlock_store *s, const char *name)
{
	dlock_lock *l = NULL;
	uint64_t f = 0;
	CHECK_RC(dlock_lock_new(&l, s, name, NULL), 0);
	int rc = dlock_acquire(l, 5000);
	CHECK_RC(rc, 0);
	if (rc == 0) {
		f = dlock_fence(l);
		CHECK_RC(dlock_release(l), 0);
	}
	dlock_lock_free(l);
	return f;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	setvbuf(stdout, NULL, _IOLBF, 0);
	int pa = rt_file_int(argv[2], "0/port"), pb = rt_file_int(argv[2], "1/port");
	redisContext *a = rt_raw_port(pa), *b = rt_raw_port(pb);
	const char *name = "failback";

	/* full resyncs at once (Redis 7 waits 5 s for more replicas by default) */
	rt_ok(a, "CONFIG SET repl-diskless-sync-delay 0");
	rt_ok(b, "CONFIG SET repl-diskless-sync-delay 0");
	/* 1. B replicates A; fences on A */
	rt_ok(b, "REPLICAOF 127.0.0.1 %d", pa);
	await_link(b);
	char u[256];
	snprintf(u, sizeof(u), "redis://127.0.0.1:%d/?fence_replicas=1&wait_replicas=0", pa);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, u), 0);
	if (!s)
		return tu_done("redis_failback");
	uint64_t top = 0, f;
	for (int i = 0; i < 3; i++) {
		f = take(s, name);
		CHECK(f > top);
		top = f;
	}
	redisReply *r = redisCommand(a, "WAIT 1 5000"); /* B has everything so far */
	CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
	if (r)
		freeReplyObject(r);

	/* 2. B promoted; A grants a fence B never sees */
	rt_ok(b, "REPLICAOF NO ONE");
	f = take(s, name);
	CHECK(f > top);
	top = f;
	char replid[64];
	repl_field(a, "master_replid", replid, sizeof(replid));

	/* 3. failback: A resyncs from B and is promoted again */
	rt_ok(a, "REPLICAOF 127.0.0.1 %d", pb);
	await_link(a);
	r = redisCommand(a, "GET {dlock:%s}:f", name);
	long long counter = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
	if (r)
		freeReplyObject(r);
	CHECK(counter < (long long)top); /* the last fence is lost: the case to prove */
	rt_ok(a, "REPLICAOF NO ONE");
	rt_ok(b, "REPLICAOF 127.0.0.1 %d", pa);
	await_link(b);
	char replid2[64];
	repl_field(a, "master_replid", replid2, sizeof(replid2));
	CHECK(strcmp(replid, replid2) != 0);

	/* 4. fences after the failback: above every earlier one */
	uint64_t again = take(s, name);
	printf("fences up to %llu handed out; A's counter after the resync %lld; after the failback: %llu "
	       "(kept handle)",
	       (unsigned long long)top, counter, (unsigned long long)again);
	CHECK(again > top);
	top = again > top ? again : top;
	rt_fence_new_handle(u, name, &top, take);
	f = take(s, name);
	printf(", %llu (next)\n", (unsigned long long)f);
	CHECK(f > top);

	dlock_store_close(s);
	rt_ok(b, "REPLICAOF NO ONE");
	redisFree(a);
	redisFree(b);
	return tu_done("redis_failback");
}
