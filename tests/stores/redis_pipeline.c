/*
 * redis://…?release=pipelined: dlock_release sends the release and returns
 * without waiting for the reply, which the next command on the connection
 * reads. These cases show that
 *  - the release is on the wire when dlock_release returns (it returns while
 *    the server is paused, where a confirmed release waits for the pause to
 *    end) and is applied before anything sent after it, by anyone;
 *  - a release through an attached handle is still confirmed, so a wrong
 *    handle gets DLOCK_ENOTHELD and the real holder keeps the lock;
 *  - a release that met a flushed script cache (NOSCRIPT) is sent again;
 *  - more releases in a row than the pipeline holds all take effect.
 */
#include "stores/redis_common_test.h"

static char uri[4096], piped[4200], confirmed[4200];

static dlock_store *open_store(const char *u)
{
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, u), 0);
	if (!s)
		exit(1);
	return s;
}

static dlock_lock *new_lock(dlock_store *s, const char *name)
{
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, name, NULL), 0);
	if (!l)
		exit(1);
	return l;
}

static void raw_ok(redisContext *raw, const char *cmd)
{
	redisReply *r = redisCommand(raw, cmd);
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	if (r)
		freeReplyObject(r);
}

/* How long a release takes while the server is paused for 1.5 s; afterwards
 * another client must find the lock free at once. */
static long long release_during_pause(redisContext *raw, const char *u, const char *name)
{
	dlock_store *a = open_store(u), *b = open_store(uri);
	dlock_lock *la = new_lock(a, name), *lb = new_lock(b, name);
	CHECK_RC(dlock_acquire(la, 0), 0);
	raw_ok(raw, "CLIENT PAUSE 1500 ALL");
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(la), 0);
	long long took = tu_now_ms() - t0;
	/* waits for the pause to end (a try-once would be cut short by its own
	 * bound); the release came first, so this is free */
	CHECK_RC(dlock_acquire(lb, 3000), 0);
	CHECK_RC(dlock_release(lb), 0);
	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_store_close(a);
	dlock_store_close(b);
	return took;
}

int main(void)
{
	rt_read_uri(uri, sizeof(uri));
	snprintf(piped, sizeof(piped), "%s?release=pipelined", uri);
	snprintf(confirmed, sizeof(confirmed), "%s?release=confirmed", uri);
	redisContext *raw = rt_raw(uri);

	/* 1. sent before dlock_release returns, applied before later commands */
	long long t_piped = release_during_pause(raw, piped, "pipe-1");
	long long t_conf = release_during_pause(raw, confirmed, "pipe-1c");
	printf("  release while the server is paused: pipelined %lld ms, confirmed %lld ms\n", t_piped, t_conf);
	CHECK(t_piped < 700);
	CHECK(t_conf >= 1000); /* the control: this pause does hold up a confirmed release */

	/* 2. an attached handle with a wrong owner: confirmed, refused, the holder keeps it */
	dlock_store *a = open_store(piped), *b = open_store(uri);
	dlock_lock *lb = new_lock(b, "pipe-2"), *la = new_lock(a, "pipe-2");
	CHECK_RC(dlock_acquire(lb, 0), 0);
	char *h = NULL;
	CHECK_RC(dlock_lock_detach(lb, &h), 0);
	CHECK(h && strlen(h) > 10);
	if (h) {
		char wrong[256];
		snprintf(wrong, sizeof(wrong), "%s", h);
		char *last = wrong + strlen(wrong) - 1; /* change the owner's serial */
		*last = *last == '1' ? '2' : '1';
		CHECK_RC(dlock_lock_attach(la, wrong), 0);
		CHECK_RC(dlock_release(la), DLOCK_ENOTHELD);
		dlock_lock *other = new_lock(a, "pipe-2");
		CHECK_RC(dlock_acquire(other, 0), DLOCK_ELOCKED); /* still held by b */
		dlock_lock_free(other);
		CHECK_RC(dlock_lock_attach(lb, h), 0);
		CHECK_RC(dlock_release(lb), 0);
		dlock_free(h);
	}

	/* 3. NOSCRIPT: the script cache is flushed between acquire and release */
	dlock_lock *l3 = new_lock(a, "pipe-3"), *l4 = new_lock(a, "pipe-4"), *l3b = new_lock(b, "pipe-3");
	CHECK_RC(dlock_acquire(l3, 0), 0);
	raw_ok(raw, "SCRIPT FLUSH");
	CHECK_RC(dlock_release(l3), 0);   /* answered NOSCRIPT, read by the next call */
	CHECK_RC(dlock_acquire(l4, 0), 0); /* reads it and sends the release again */
	CHECK_RC(dlock_acquire(l3b, 0), 0);
	CHECK_RC(dlock_release(l3b), 0);
	CHECK_RC(dlock_release(l4), 0);
	dlock_lock_free(l3);
	dlock_lock_free(l4);
	dlock_lock_free(l3b);

	/* 4. more releases in a row than the pipeline holds */
	enum { N = 40 };
	dlock_lock *many[N], *check = NULL;
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "pipe-many-%d", i);
		many[i] = new_lock(a, name);
		CHECK_RC(dlock_acquire(many[i], 0), 0);
	}
	for (int i = 0; i < N; i++)
		CHECK_RC(dlock_release(many[i]), 0);
	int freed = 0;
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "pipe-many-%d", i);
		check = new_lock(b, name);
		if (dlock_acquire(check, 0) == 0) {
			freed++;
			dlock_release(check);
		}
		dlock_lock_free(check);
		dlock_lock_free(many[i]);
	}
	printf("  %d of %d pipelined releases in a row took effect\n", freed, N);
	CHECK(freed == N);

	dlock_lock_free(la);
	dlock_lock_free(lb);
	dlock_store_close(a);
	dlock_store_close(b);
	redisFree(raw);
	return tu_done("redis_pipeline");
}
