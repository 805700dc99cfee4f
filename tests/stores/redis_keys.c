/*
 * Key layout and notifier of the redis store (issue 15 row 8):
 *  - namespaces never collide: prefix=app + name "jobs:nightly" and
 *    prefix=app:jobs + name "nightly" are two locks, and each store lists
 *    only its own names; the default prefix keeps its old keys ({dlock:NAME});
 *  - the notifier counts a second bare "*" wake-up (a cancel's) from the same
 *    server as a new event, not as a copy of the first.
 * Usage: redis_keys (DLOCK_TEST_URI_FILE names the server)
 */
#include "stores/redis_common_test.h"
#include "stores/redis/redis.h"

static char uri[4096];

static dlock_store *open_with(const char *opts)
{
	char u[4200];
	snprintf(u, sizeof(u), "%s%s", uri, opts);
	dlock_store *s = NULL;
	if (dlock_store_open(&s, u) != 0) {
		fprintf(stderr, "cannot open %s: %s\n", u, dlock_error_last()->message);
		exit(1);
	}
	return s;
}

static int lists_only(dlock_store *s, const char *name)
{
	dlock_lock_status *st = NULL;
	size_t n = 0;
	if (dlock_store_status(s, NULL, 0, &st, &n) != 0)
		return 0;
	int ok = n == 1 && !strcmp(st[0].name, name);
	for (size_t i = 0; i < n; i++)
		printf("  listed: %s\n", st[i].name);
	dlock_status_free(st, n);
	return ok;
}

static void case_namespaces(redisContext *raw)
{
	dlock_store *a = open_with("?prefix=app"), *b = open_with("?prefix=app:jobs"), *d = open_with("");
	dlock_lock *la = NULL, *lb = NULL, *ld = NULL;
	CHECK_RC(dlock_lock_new(&la, a, "jobs:nightly", NULL), 0);
	CHECK_RC(dlock_lock_new(&lb, b, "nightly", NULL), 0);
	CHECK_RC(dlock_lock_new(&ld, d, "plain", NULL), 0);
	CHECK_RC(dlock_acquire(la, 0), 0);
	/* another namespace's lock, however its name looks */
	CHECK_RC(dlock_acquire(lb, 0), 0);
	CHECK(dlock_held(la) && dlock_held(lb));
	CHECK(lists_only(a, "jobs:nightly"));
	CHECK(lists_only(b, "nightly"));
	/* the default prefix writes the keys it always wrote */
	CHECK_RC(dlock_acquire(ld, 0), 0);
	redisReply *r = redisCommand(raw, "EXISTS {dlock:plain}");
	CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
	if (r)
		freeReplyObject(r);
	CHECK_RC(dlock_release(la), 0);
	CHECK_RC(dlock_release(lb), 0);
	CHECK_RC(dlock_release(ld), 0);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_lock_free(ld);
	dlock_store_close(a);
	dlock_store_close(b);
	dlock_store_close(d);
}

static void case_second_star(redisContext *raw)
{
	dlock__rserver srv;
	memset(&srv, 0, sizeof(srv));
	if (sscanf(uri, "redis://%255[^:]:%d", srv.host, &srv.port) != 2)
		exit(1);
	srv.connect_timeout_ms = 1000;
	srv.timeout_ms = 1000;
	dlock__rnotify *nt = NULL;
	CHECK_RC(dlock__rnotify_new(&nt, &srv, 1, "redis"), 0);
	if (!nt)
		return;
	dlock_request req;
	memset(&req, 0, sizeof(req));
	req.name = "star";
	req.owner = "00ff00ff-1";
	const char *ch = "{keys-test:star}:c";
	/* the first wait subscribes and returns once Redis confirmed it */
	dlock__rnotify_wait(nt, &req, ch, 3000);
	for (int round = 0; round < 3; round++) {
		dlock__rnotify_arm(nt, &req);
		redisReply *r = redisCommand(raw, "PUBLISH %s *", ch);
		CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
		if (r)
			freeReplyObject(r);
		long long t0 = tu_now_ms();
		dlock__rnotify_wait(nt, &req, ch, 2000);
		long long took = tu_now_ms() - t0;
		printf("bare '*' number %d woke the waiter after %lld ms\n", round + 1, took);
		CHECK(took < 1000);
	}
	dlock__rnotify_forget(nt, &req);
	dlock__rnotify_free(nt);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	rt_read_uri(uri, sizeof(uri));
	redisContext *raw = rt_raw(uri);
	case_namespaces(raw);
	case_second_star(raw);
	redisFree(raw);
	return tu_done("redis_keys");
}
