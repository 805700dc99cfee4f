/*
 * Key layout and notifier of the redis store (issue 15 row 8):
 *  - namespaces never collide: prefix=app + name "jobs:nightly" and
 *    prefix=app:jobs + name "nightly" are two locks, and each store lists
 *    only its own names; the default prefix keeps its old keys ({dlock:NAME});
 *  - the notifier hands the core's board a wake-up for its confirmed
 *    subscription, for every bare "*" (a second one from the same server,
 *    a cancel's, is a new event, not a copy of the first), and for a message
 *    naming our waiter's owner alone; a message naming another owner wakes
 *    nobody.
 * Usage: redis_keys (DLOCK_TEST_URI_FILE names the server)
 */
#include "stores/redis_common_test.h"
#include "stores/redis/redis.h"
#include "core/internal.h"

#include <unistd.h>

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

static void publish(redisContext *raw, const char *ch, const char *msg)
{
	redisReply *r = redisCommand(raw, "PUBLISH %s %s", ch, msg);
	CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
	if (r)
		freeReplyObject(r);
}

static void case_wakeups(redisContext *raw)
{
	dlock__rserver srv;
	memset(&srv, 0, sizeof(srv));
	if (sscanf(uri, "redis://%255[^:]:%d", srv.host, &srv.port) != 2)
		exit(1);
	srv.connect_timeout_ms = 1000;
	srv.timeout_ms = 1000;
	/* a backend of no store but with a board, as a store handle's */
	dlock_backend be;
	memset(&be, 0, sizeof(be));
	dlock__board *board = NULL;
	CHECK_RC(dlock__board_new(&board), 0);
	if (!board)
		return;
	dlock__board_attach(&be, board);
	dlock__rnotify *nt = NULL;
	CHECK_RC(dlock__rnotify_new(&nt, &be, &srv, 1, "redis"), 0);
	if (!nt) {
		dlock__board_free(board);
		return;
	}
	dlock_request req;
	memset(&req, 0, sizeof(req));
	req.name = "star";
	req.owner = "00ff00ff-1";
	/* the channels the notifier makes of prefix "keys-test" and name "star" */
	const char *prefix = "keys-test", *ch = "{keys-test:star}:c", *direct = "{keys-test:star}:c:00ff00ff";
	/* the subscription, once Redis confirmed it, wakes the name */
	uint64_t armed = dlock__board_arm(board, req.name, req.owner);
	CHECK_RC(dlock__rnotify_watch(nt, &req, prefix), 0);
	CHECK(dlock__board_wait(board, req.name, req.owner, armed, 3000));
	for (int round = 0; round < 3; round++) {
		armed = dlock__board_arm(board, req.name, req.owner);
		CHECK_RC(dlock__rnotify_watch(nt, &req, prefix), 0);
		publish(raw, ch, "*");
		long long t0 = tu_now_ms();
		CHECK(dlock__board_wait(board, req.name, req.owner, armed, 2000));
		printf("bare '*' number %d woke the waiter after %lld ms\n", round + 1, tu_now_ms() - t0);
	}
	/* a new head named on our direct channel: ours wakes, another's does not */
	armed = dlock__board_arm(board, req.name, req.owner);
	publish(raw, direct, "00ff00ff-7");
	CHECK(!dlock__board_wait(board, req.name, req.owner, armed, 300));
	publish(raw, direct, req.owner);
	CHECK(dlock__board_wait(board, req.name, req.owner, armed, 2000));
	/* unwatched: nothing subscribed is left to hear it */
	dlock__rnotify_forget(nt, &req);
	long long until = tu_now_ms() + 3000;
	int receivers = 1;
	while (receivers > 0 && tu_now_ms() < until) {
		redisReply *r = redisCommand(raw, "PUBSUB NUMSUB %s", ch);
		receivers = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? (int)r->element[1]->integer : -1;
		if (r)
			freeReplyObject(r);
		if (receivers > 0)
			usleep(10000);
	}
	CHECK(receivers == 0);
	dlock__rnotify_free(nt);
	dlock__board_free(board);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	rt_read_uri(uri, sizeof(uri));
	redisContext *raw = rt_raw(uri);
	case_namespaces(raw);
	case_wakeups(raw);
	redisFree(raw);
	return tu_done("redis_keys");
}
