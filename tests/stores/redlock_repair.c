/*
 * Redlock when the masters themselves slip (issue 20 row 3) and when every
 * answer of a try is lost (issue 15 row 1), on five real masters WITHOUT
 * persistence (a restarted master comes back empty):
 *  - undo: every master hangs during a try (SIGSTOP; each applies the try
 *    when it resumes, after the client gave up on it): the try is undone
 *    there, and another client is granted at once, not after the TTL;
 *  - repair: the hold's copy deleted on one master after another (an early
 *    expiry), a renewal in between: each copy is written back, and no other
 *    client is ever granted while the first holds; three copies gone at once
 *    (a quorum): the holder is told it lost, nothing is written back;
 *  - restarts: masters restarted one at a time without their data, twice
 *    around all five, while holding and renewing and while idle: never two
 *    holders, every grant's fence is above every earlier one, and a hold
 *    taken after a master restarted stands on all five (the dead connection
 *    is replaced and the scripts sent again in the same round).
 * Usage: redlock_repair SERVER_SCRIPT SERVER_DIR
 */
#include "stores/redis_common_test.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#define NMASTERS 5

static const char *script, *dir;
static char uri[4096];

static void server(const char *verb, int i)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "bash '%s' %s '%s' %d", script, verb, dir, i);
	if (system(cmd) != 0) {
		fprintf(stderr, "'%s' failed\n", cmd);
		tu_failures++;
	}
}

static redisContext *master(int i)
{
	char path[1024], u[64];
	snprintf(path, sizeof(path), "%s/%d/port", dir, i);
	FILE *f = fopen(path, "r");
	int port = 0;
	if (!f || fscanf(f, "%d", &port) != 1)
		exit(1);
	fclose(f);
	snprintf(u, sizeof(u), "redis://127.0.0.1:%d", port);
	return rt_raw(u);
}

/* An integer command on master i (-1 on error). */
static long long master_int(int i, const char *fmt, const char *key)
{
	redisContext *c = master(i);
	redisReply *r = redisCommand(c, fmt, key);
	long long v = -1;
	if (r && r->type == REDIS_REPLY_INTEGER)
		v = r->integer;
	else if (r && r->type == REDIS_REPLY_STRING)
		v = strtoll(r->str, NULL, 10);
	else if (r && r->type == REDIS_REPLY_NIL)
		v = 0;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return v;
}

static bool has_key(int i, const char *key)
{
	return master_int(i, "EXISTS %s", key) == 1;
}

/* Wait (polling the master: no event tells a copy came back) until master i
 * has `key`, at most limit_ms. */
static bool wait_key(int i, const char *key, long long limit_ms)
{
	long long end = tu_now_ms() + limit_ms;
	while (tu_now_ms() < end) {
		if (has_key(i, key))
			return true;
		struct timespec ts = { 0, 20 * 1000000 };
		nanosleep(&ts, NULL);
	}
	return has_key(i, key);
}

/* Wait the same way until master i's fence counter `key` is at least `min`
 * (a repair raises it; a refused try's undo may still be on its way there). */
static bool wait_counter(int i, const char *key, long long min, long long limit_ms)
{
	long long end = tu_now_ms() + limit_ms;
	while (tu_now_ms() < end) {
		if (master_int(i, "GET %s", key) >= min)
			return true;
		struct timespec ts = { 0, 20 * 1000000 };
		nanosleep(&ts, NULL);
	}
	return master_int(i, "GET %s", key) >= min;
}

static int two_holders, fence_back;

/* b must be refused while a holds; a grant is two holders at once. */
static void must_refuse(dlock_lock *a, dlock_lock *b, const char *when)
{
	uint64_t fa = dlock_fence(a);
	int rc = dlock_acquire(b, 0);
	if (rc == 0 && !dlock_held(a)) {
		/* a knew it had lost (its renewals failed): no second holder, but
		 * the hold should have lasted; the caller's dlock_held(a) says so */
		fprintf(stderr, "%s: a had lost its hold (fence %llu) when b was granted (fence %llu)\n", when,
			(unsigned long long)fa, (unsigned long long)dlock_fence(b));
		dlock_release(b);
	} else if (rc == 0) {
		fprintf(stderr, "TWO HOLDERS %s: fences %llu and %llu\n", when, (unsigned long long)fa,
			(unsigned long long)dlock_fence(b));
		two_holders++;
		fence_back += dlock_fence(b) <= fa;
		dlock_release(b);
	} else if (rc != DLOCK_ELOCKED) {
		fprintf(stderr, "%s: b's try returned %s: %s\n", when, dlock_error_name(rc),
			dlock_error_last()->message);
		tu_failures++;
	}
}

static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;
static int lost_count;

static void on_lost(dlock_lock *l, void *p)
{
	(void)l;
	(void)p;
	pthread_mutex_lock(&lost_mu);
	lost_count++;
	pthread_mutex_unlock(&lost_mu);
}

static void *resume_later(void *arg)
{
	struct timespec ts = { 0, *(long *)arg * 1000000 };
	nanosleep(&ts, NULL);
	for (int i = 0; i < NMASTERS; i++)
		server("resume", i);
	return NULL;
}

/* Every master hangs during a try and applies it when it resumes. */
static void case_undo(dlock_store *s2)
{
	/* one request may take 900 ms: the try 600 of it (a third is kept for its undo) */
	char u[4200];
	snprintf(u, sizeof(u), "%s?timeout=900ms", uri);
	dlock_store *s1 = NULL;
	CHECK_RC(dlock_store_open(&s1, u), 0);
	if (!s1)
		return;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 5000;
	dlock_lock *a = NULL, *b = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "undo", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s2, "undo", &o), 0);
	/* warm: a's connections are up, so the try goes out at once */
	CHECK_RC(dlock_acquire(a, 0), 0);
	CHECK_RC(dlock_release(a), 0);
	for (int i = 0; i < NMASTERS; i++)
		server("pause", i);
	long resume_ms = 700; /* after the try's round (600 ms), within the undo's (300 more) */
	pthread_t th;
	long long t = tu_now_ms();
	pthread_create(&th, NULL, resume_later, &resume_ms);
	/* a wait, so that the first try gets the whole request time (a try-once gets 40 ms) */
	int rc = dlock_acquire(a, 2000);
	long long took = tu_now_ms() - t;
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	pthread_join(th, NULL);
	/* every master has run what it got while stopped (a fresh connection's PING comes after) */
	for (int i = 0; i < NMASTERS; i++)
		CHECK(master_int(i, "DBSIZE", "") >= 0);
	int left = 0;
	for (int i = 0; i < NMASTERS; i++)
		left += has_key(i, "{dlock:undo}");
	long long t2 = tu_now_ms();
	rc = dlock_acquire(b, 0);
	printf("undo: every master hung for %ld ms during a try: it failed after %lld ms (%s); "
	       "copies left on %d of 5 masters; another client's try %s\n",
	       resume_ms, took, dlock_error_last()->message, left, rc == 0 ? "granted" : dlock_error_name(rc));
	CHECK(left == 0);
	CHECK_RC(rc, 0);
	CHECK(tu_now_ms() - t2 < 1000);
	if (rc == 0)
		CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s1);
}

/* Early expiry (DEL) of the hold's copy on one master after another. */
static void case_repair(dlock_store *s1, dlock_store *s2)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 1500; /* renewal every 500 ms */
	o.on_lost = on_lost;
	dlock_lock *a = NULL, *b = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "repair", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s2, "repair", &o), 0);
	CHECK_RC(dlock_acquire(a, 0), 0);
	uint64_t fa = dlock_fence(a);
	int repaired = 0;
	long long worst = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (int m = 0; m < NMASTERS; m++) {
			/* (0 is possible: a renewal that timed out on a loaded machine) */
			master_int(m, "DEL %s", "{dlock:repair}");
			char when[64];
			snprintf(when, sizeof(when), "after the copy on master %d was deleted", m);
			must_refuse(a, b, when);
			long long t = tu_now_ms();
			bool back = wait_key(m, "{dlock:repair}", 2 * o.ttl_ms);
			repaired += back;
			worst = tu_now_ms() - t > worst ? tu_now_ms() - t : worst;
			must_refuse(a, b, when);
			CHECK(dlock_held(a));
			/* the fence counter there is never below the hold's fence */
			CHECK(master_int(m, "GET %s", "{dlock:repair}:f") >= (long long)fa);
		}
	}
	printf("repair: 10 early expiries, one master at a time: %d copies written back (slowest %lld ms, "
	       "renewal every %lld ms); two holders %d times\n",
	       repaired, worst, (long long)o.ttl_ms / 3, two_holders);
	CHECK(repaired == 2 * NMASTERS);
	CHECK(two_holders == 0);
	CHECK(dlock_held(a));

	/* a quorum of copies gone at once: the hold has dissolved, another client
	 * may take it, and the first must hear it lost and write nothing back */
	for (int m = 0; m < 3; m++)
		master_int(m, "DEL %s", "{dlock:repair}");
	long long t = tu_now_ms();
	CHECK_RC(dlock_acquire(b, 3000), 0);
	uint64_t fb = dlock_fence(b);
	while (dlock_held(a) && tu_now_ms() - t < 3 * o.ttl_ms) {
		struct timespec ts = { 0, 10 * 1000000 };
		nanosleep(&ts, NULL);
	}
	/* on_lost runs on a thread of its own: it may come just after held turns false */
	long long cb_until = tu_now_ms() + 1000;
	int lost = 0;
	while (tu_now_ms() < cb_until) {
		pthread_mutex_lock(&lost_mu);
		lost = lost_count;
		pthread_mutex_unlock(&lost_mu);
		if (lost)
			break;
		struct timespec ts = { 0, 5 * 1000000 };
		nanosleep(&ts, NULL);
	}
	printf("repair: 3 of 5 copies gone at once: other client granted (fence %llu > %llu), first told lost "
	       "after %lld ms\n",
	       (unsigned long long)fb, (unsigned long long)fa, tu_now_ms() - t);
	CHECK(!dlock_held(a));
	CHECK(lost == 1);
	CHECK(fb > fa);
	CHECK(dlock_held(b));
	dlock_release(a);
	CHECK_RC(dlock_release(b), 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
}

/* A hold on a bare quorum is reported as one: status gives its copies. */
/* Copies of name's one holder as status shows them. A status round stops
 * waiting for a master that answers well after the others (it counts
 * "slower than the others", as a hung one): on a loaded machine one read may
 * miss a copy that is there. So: the most copies of up to five reads, ended
 * early once `want` is seen (a read showing more than there are still
 * fails the caller's check). */
static unsigned copies_of_holder(dlock_store *s, const char *name, unsigned want, unsigned *of)
{
	const char *names[] = { name };
	unsigned best = 0;
	*of = 0;
	for (int read = 0; read < 5 && best != want; read++) {
		dlock_lock_status *st = NULL;
		size_t n = 0;
		if (dlock_store_status(s, names, 1, &st, &n) == 0 && n == 1 && st[0].nholders == 1) {
			if (st[0].holders[0].copies > best)
				best = st[0].holders[0].copies;
			*of = st[0].holders[0].copies_of;
		}
		dlock_status_free(st, n);
	}
	return best;
}

static void case_bare_quorum(dlock_store *s1, dlock_store *s2)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 20000;
	o.no_renew = 1; /* no repair: the copies stay as the faults leave them */
	dlock_lock *a = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "bare", &o), 0);
	CHECK_RC(dlock_acquire(a, 0), 0);
	unsigned of;
	CHECK(copies_of_holder(s2, "bare", NMASTERS, &of) == NMASTERS && of == NMASTERS);
	master_int(0, "DEL %s", "{dlock:bare}");
	master_int(1, "DEL %s", "{dlock:bare}");
	unsigned c = copies_of_holder(s2, "bare", NMASTERS / 2 + 1, &of);
	printf("bare quorum: status shows the hold on %u of %u masters\n", c, of);
	CHECK(c == NMASTERS / 2 + 1 && of == NMASTERS);
	CHECK_RC(dlock_release(a), 0);
	dlock_lock_free(a);
}

/* Masters restarted one at a time without their data. */
static void case_restarts(dlock_store *s1, dlock_store *s2)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 1500;
	dlock_lock *a = NULL, *b = NULL;
	CHECK_RC(dlock_lock_new(&a, s1, "restart", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s2, "restart", &o), 0);
	uint64_t last = 0;
	int back = 0, grants = 0, repaired = 0, whole = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (int m = 0; m < NMASTERS; m++) {
			/* holding and renewing: the restarted master comes back empty */
			CHECK_RC(dlock_acquire(a, 2000), 0);
			uint64_t fa = dlock_fence(a);
			/* on all five, the master restarted idle last time included
			 * (its old connection is dead, and it has lost its scripts);
			 * looked at before the first renewal (ttl/3) could repair it,
			 * each master having had the try before these reads */
			int on = 0;
			for (int q = 0; q < NMASTERS; q++)
				on += has_key(q, "{dlock:restart}");
			whole += on == NMASTERS;
			if (on != NMASTERS)
				fprintf(stderr, "pass %d, master %d: the hold stands on %d of %d masters\n", pass, m,
					on, NMASTERS);
			back += fa <= last;
			last = fa > last ? fa : last;
			grants++;
			server("kill", m);
			server("restart", m);
			char when[64];
			snprintf(when, sizeof(when), "after master %d restarted empty", m);
			must_refuse(a, b, when);
			repaired += wait_key(m, "{dlock:restart}", 2 * o.ttl_ms);
			CHECK(wait_counter(m, "{dlock:restart}:f", (long long)fa, 2 * o.ttl_ms));
			must_refuse(a, b, when);
			CHECK(dlock_held(a));
			CHECK_RC(dlock_release(a), 0);
			/* idle: the next master restarts with nobody holding */
			int idle = (m + 2) % NMASTERS;
			server("kill", idle);
			server("restart", idle);
			CHECK_RC(dlock_acquire(b, 2000), 0);
			uint64_t fb = dlock_fence(b);
			back += fb <= last;
			if (fb <= last)
				fprintf(stderr, "fence went back: %llu after %llu\n", (unsigned long long)fb,
					(unsigned long long)last);
			last = fb > last ? fb : last;
			grants++;
			CHECK_RC(dlock_release(b), 0);
		}
	}
	printf("restarts without persistence: 20 restarts (10 under a renewed hold), %d grants, last fence %llu, "
	       "%d went back, %d of 10 holds on every master, %d of 10 copies written back, two holders %d times "
	       "(%d of them with a smaller fence)\n",
	       grants, (unsigned long long)last, back, whole, repaired, two_holders, fence_back);
	CHECK(back == 0);
	CHECK(whole == 2 * NMASTERS);
	CHECK(fence_back == 0);
	CHECK(repaired == 2 * NMASTERS);
	CHECK(two_holders == 0);
	dlock_lock_free(a);
	dlock_lock_free(b);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	script = argv[1];
	dir = argv[2];
	rt_read_uri(uri, sizeof(uri));
	dlock_store *s1 = NULL, *s2 = NULL;
	CHECK_RC(dlock_store_open(&s1, uri), 0);
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	if (!s1 || !s2)
		return tu_done("redlock_repair");
	case_undo(s2);
	case_repair(s1, s2);
	case_bare_quorum(s1, s2);
	case_restarts(s1, s2);
	dlock_store_close(s1);
	dlock_store_close(s2);
	return tu_done("redlock_repair");
}
