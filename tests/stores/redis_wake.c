/*
 * The redis store wakes waiters through pub/sub instead of polling:
 *  - a waiter blocked for ~2 s sends a bounded handful of commands (counted
 *    with INFO commandstats on a server no other test uses at the same time),
 *  - it is granted within a few ms of the release, far sooner than its
 *    1 s re-registration nap would give,
 *  - it listens on its own lock's channel only and unsubscribes once granted;
 *  - a waiting acquire that is granted at once subscribes to nothing: an
 *    uncontended pair is its two script calls and nothing else;
 *  - renewal of many held locks is one script call per tick, not one per lock;
 *  - fair mode: a waiter that dies in the queue drops out after its
 *    registration deadline (3 s) instead of blocking the live waiter behind it
 *    for the whole wait.
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* Child mode: queue for the fair lock and wait (to be killed while waiting). */
static int fair_child(void)
{
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.fair = 1;
	if (dlock_store_open(&s, uri) || dlock_lock_new(&l, s, "wake-fair", &o))
		return 1;
	dlock_acquire(l, 60000);
	return 2; /* not reached: the parent kills us first */
}

static void dead_waiter_case(const char *self)
{
	dlock_store *s = NULL;
	dlock_lock *h = NULL, *b = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.fair = 1;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(dlock_lock_new(&h, s, "wake-fair", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s, "wake-fair", &o), 0);
	CHECK_RC(dlock_acquire(h, 0), 0);
	pid_t pid = fork();
	if (pid == 0) {
		execl(self, self, "--fair-child", (char *)NULL);
		_exit(127);
	}
	CHECK(tu_await_waiters(s, "wake-fair", 1, 10000));
	kill(pid, SIGKILL); /* dies at the head of the queue */
	waitpid(pid, NULL, 0);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(h), 0);
	/* the live waiter behind the dead one gets it once the dead registration lapses */
	CHECK_RC(dlock_acquire(b, 20000), 0);
	long long took = tu_now_ms() - t0;
	printf("fair: a dead waiter at the head held up the next one for %lld ms (registration ttl 3000 ms)\n", took);
	CHECK(took <= 3000 + 1500);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(h);
	dlock_lock_free(b);
	dlock_store_close(s);
}

/* Without a fair queue, a release with only writers waiting wakes one of
 * them (by name), not every waiter, and tells it on its own client's channel
 * ("{P:NAME}:c:<client id>"), so other processes' listeners stay asleep: a
 * raw subscriber to every channel of the lock sees owner names, each on the
 * channel of that owner's client, never the wake-everyone "*". All waiters
 * still get the lock in turn, each woken by the previous release. */
static int one_rc[3] = { -100, -100, -100 };

static void *one_waiter(void *arg)
{
	int *rc = arg;
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(dlock_lock_new(&l, s, "wake-one", NULL), 0);
	*rc = dlock_acquire(l, 10000);
	if (*rc == 0)
		CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	return NULL;
}

static void wake_one_case(redisContext *raw)
{
	const char *chan = "{dlock:wake-one}:c";
	redisContext *sub = rt_raw(uri);
	redisReply *r = redisCommand(sub, "PSUBSCRIBE %s*", chan);
	CHECK(r && r->type == REDIS_REPLY_ARRAY);
	if (r)
		freeReplyObject(r);
	dlock_store *s = NULL;
	dlock_lock *h = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(dlock_lock_new(&h, s, "wake-one", NULL), 0);
	CHECK_RC(dlock_acquire(h, 0), 0);
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, one_waiter, &one_rc[i]);
	CHECK(await_numsub(raw, chan, 3, 5000) == 3); /* the 3 waiters' listeners */
	CHECK_RC(dlock_release(h), 0);
	int named = 0, all = 0;
	for (int i = 0; i < 3; i++) { /* one wake-up per release: ours, then each waiter's */
		void *v = NULL;
		if (redisGetReply(sub, &v) != REDIS_OK || !v)
			break;
		r = v; /* pmessage, pattern, channel, payload */
		if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 && r->element[2]->type == REDIS_REPLY_STRING &&
		    r->element[3]->type == REDIS_REPLY_STRING) {
			const char *ch = r->element[2]->str, *msg = r->element[3]->str;
			char want[128];
			snprintf(want, sizeof(want), "%s:%.*s", chan, (int)strcspn(msg, "-"), msg);
			if (msg[0] == '*')
				all++;
			else if (!strcmp(ch, want))
				named++;
			else
				printf("  wake-up for %s on %s\n", msg, ch);
		}
		freeReplyObject(r);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		CHECK_RC(one_rc[i], 0);
	}
	printf("unfair release with 3 writers waiting: %d named wake-ups, %d wake-everyone\n", named, all);
	CHECK(named == 3 && all == 0);
	redisFree(sub);
	dlock_lock_free(h);
	dlock_store_close(s);
}

/* 50 locks held for ~1.2 s with a 900 ms TTL (renewed every 300 ms): the
 * renewals arrive in batches, a handful of script calls in all. */
static void batch_renew_case(redisContext *raw)
{
	enum { N = 50 };
	dlock_store *s = NULL;
	dlock_lock *l[N];
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 900;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	for (int i = 0; i < N; i++) {
		char lname[64];
		snprintf(lname, sizeof(lname), "batch-%d", i);
		CHECK_RC(dlock_lock_new(&l[i], s, lname, &o), 0);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	long ev0 = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval");
	struct timespec ts = { 1, 200 * 1000000 }; /* four renewal periods */
	nanosleep(&ts, NULL);
	long calls = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval") - ev0;
	int held = 0;
	for (int i = 0; i < N; i++)
		held += dlock_held(l[i]) != 0;
	printf("renewal: %d locks kept alive for 1.2 s (ttl 900 ms) with %ld script calls\n", held, calls);
	CHECK(held == N);
	CHECK(calls >= 3 && calls <= 10);
	for (int i = 0; i < N; i++) {
		CHECK_RC(dlock_release(l[i]), 0);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s);
}

/* Waiting acquires of a free lock (and their releases): two script calls
 * per pair, no SUBSCRIBE or UNSUBSCRIBE (issue: a subscription per pair). */
static void uncontended_case(redisContext *raw)
{
	enum { N = 50 };
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(dlock_lock_new(&l, s, "uncontended", NULL), 0);
	CHECK_RC(dlock_acquire(l, 5000), 0); /* the scripts loaded */
	CHECK_RC(dlock_release(l), 0);
	long ev0 = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval");
	long sub0 = rt_cmdstat(raw, "subscribe") + rt_cmdstat(raw, "unsubscribe");
	for (int i = 0; i < N; i++) {
		CHECK_RC(dlock_acquire(l, 5000), 0);
		CHECK_RC(dlock_release(l), 0);
	}
	long evals = rt_cmdstat(raw, "evalsha") + rt_cmdstat(raw, "eval") - ev0;
	long subs = rt_cmdstat(raw, "subscribe") + rt_cmdstat(raw, "unsubscribe") - sub0;
	printf("uncontended: %d waiting acquires and releases sent %ld script calls and %ld (UN)SUBSCRIBE\n", N, evals,
	       subs);
	CHECK(evals == 2 * N);
	CHECK(subs == 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

int main(int argc, char **argv)
{
	rt_read_uri(uri, sizeof(uri));
	if (argc > 1 && !strcmp(argv[1], "--fair-child"))
		return fair_child();
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
	raw = rt_raw(uri);
	uncontended_case(raw);
	batch_renew_case(raw);
	wake_one_case(raw);
	redisFree(raw);
	dead_waiter_case(argv[0]);
	return tu_done("redis_wake");
}
