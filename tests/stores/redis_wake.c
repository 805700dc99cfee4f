/*
 * The redis store wakes waiters through pub/sub instead of polling:
 *  - a waiter blocked for ~2 s sends a bounded handful of commands (counted
 *    with INFO commandstats on a server no other test uses at the same time),
 *  - it is granted within a few ms of the release, far sooner than its
 *    1 s re-registration nap would give,
 *  - it listens on its own lock's channel only and unsubscribes once granted.
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <time.h>

static char uri[4096];
static const char *name = "wake-test";
static long long granted_at;
static int granted_rc = -100;

static void *waiter(void *arg)
{
	(void)arg;
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(dlock_lock_new(&l, s, name, NULL), 0);
	granted_rc = dlock_acquire(l, 10000);
	granted_at = tu_now_ms();
	if (granted_rc == 0)
		CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	return NULL;
}

static long numsub(redisContext *c, const char *channel)
{
	redisReply *r = redisCommand(c, "PUBSUB NUMSUB %s", channel);
	long v = -1;
	if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER)
		v = (long)r->element[1]->integer;
	if (r)
		freeReplyObject(r);
	return v;
}

/* Wait (bounded) until the channel has `want` subscribers; returns the last count seen. */
static long await_numsub(redisContext *c, const char *channel, long want, int ms)
{
	long long until = tu_now_ms() + ms;
	long v;
	struct timespec ts = { 0, 10 * 1000000 };
	while ((v = numsub(c, channel)) != want && tu_now_ms() < until)
		nanosleep(&ts, NULL);
	return v;
}

int main(void)
{
	rt_read_uri(uri, sizeof(uri));
	redisContext *raw = rt_raw(uri);
	char chan[600], other[600];
	snprintf(chan, sizeof(chan), "{dlock:%s}:c", name);
	snprintf(other, sizeof(other), "{dlock:%s-other}:c", name);

	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	CHECK_RC(dlock_lock_new(&l, s, name, &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);

	long ev0 = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval");
	long sub0 = rt_cmdstat(raw, "subscribe");
	long long t0 = tu_now_ms();
	pthread_t th;
	pthread_create(&th, NULL, waiter, NULL);

	CHECK(await_numsub(raw, chan, 1, 5000) == 1);
	CHECK(numsub(raw, other) == 0);
	/* the scenario: the waiter stays blocked for about two seconds */
	long long hold = 2200 - (tu_now_ms() - t0);
	if (hold > 0) {
		struct timespec ts = { (time_t)(hold / 1000), (long)(hold % 1000) * 1000000 };
		nanosleep(&ts, NULL);
	}
	long long released_at = tu_now_ms();
	CHECK_RC(dlock_release(l), 0);
	pthread_join(th, NULL);

	CHECK_RC(granted_rc, 0);
	long long delay = granted_at - released_at;
	long evals = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval") - ev0;
	long subs = rt_cmdstat(raw, "subscribe") - sub0;
	/* minus the holder's release; the waiter also released once after its grant */
	long waiter_evals = evals - 2;
	printf("waited %lld ms; granted %lld ms after the release; waiter sent %ld script calls and %ld SUBSCRIBE\n",
	       granted_at - t0, delay, waiter_evals, subs);
	CHECK(delay < 300);
	CHECK(waiter_evals >= 2 && waiter_evals <= 7);
	CHECK(subs >= 1 && subs <= 2);
	CHECK(await_numsub(raw, chan, 0, 5000) == 0);

	dlock_lock_free(l);
	dlock_store_close(s);
	redisFree(raw);
	return tu_done("redis_wake");
}
