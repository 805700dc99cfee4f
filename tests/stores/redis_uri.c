/*
 * redis:// URIs as a user writes them, right and wrong: every mistake gets a
 * clear error code (and never echoes a password); ACL users, the default
 * user's password (requirepass) and SELECT work.
 */
#include "stores/redis_common_test.h"

static char uri[4096], host[256];
static int port;

static int try_open(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int try_open(const char *fmt, ...)
{
	char u[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(u, sizeof(u), fmt, ap);
	va_end(ap);
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc == 0) {
		/* prove it works: one lock round trip */
		dlock_lock *l = NULL;
		CHECK_RC(dlock_lock_new(&l, s, "uri-test", NULL), 0);
		CHECK_RC(dlock_acquire(l, 0), 0);
		CHECK_RC(dlock_release(l), 0);
		dlock_lock_free(l);
		dlock_store_close(s);
	} else {
		CHECK(s == NULL);
		CHECK(strstr(dlock_error_last()->message, "s3cr3tPW") == NULL);
		printf("  %-60s -> %s: %s\n", u, dlock_error_name(rc), dlock_error_last()->message);
	}
	return rc;
}

int main(void)
{
	rt_read_uri(uri, sizeof(uri));
	if (sscanf(uri, "redis://%255[^:]:%d", host, &port) != 2)
		return 1;
	redisContext *raw = rt_raw(uri);
	redisReply *r = redisCommand(raw, "ACL SETUSER dlocktest on >s3cr3tPW ~* &* +@all");
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	if (r)
		freeReplyObject(r);

	CHECK_RC(try_open("redis://%s:%d", host, port), 0);
	CHECK_RC(try_open("redis://%s:%d/3", host, port), 0);
	CHECK_RC(try_open("redis://%s:%d/?timeout=500ms", host, port), 0);
	CHECK_RC(try_open("redis://dlocktest:s3cr3tPW@%s:%d", host, port), 0);
	CHECK_RC(try_open("redis://dlocktest:wrong-s3cr3tPW@%s:%d", host, port), DLOCK_EAUTH);
	CHECK_RC(try_open("redis://:s3cr3tPW@%s:%d", host, port), DLOCK_EAUTH); /* no password configured */
	CHECK_RC(try_open("redis://%s:%d/99999", host, port), DLOCK_EINVAL);    /* no such database */
	CHECK_RC(try_open("redis://%s:%d/abc", host, port), DLOCK_EINVAL);
	CHECK_RC(try_open("redis://%s:%d?timeout=soon", host, port), DLOCK_EINVAL);
	CHECK_RC(try_open("redis://%s:%d?bogus=1", host, port), DLOCK_EINVAL);
	CHECK_RC(try_open("redis://%s:%d,%s:%d", host, port, host, port), DLOCK_EINVAL);
	CHECK_RC(try_open("redis://127.0.0.1:1"), DLOCK_EUNAVAILABLE);
	/* TLS to a plain server: the handshake gets no answer, bounded by
	 * connect_timeout. The TLS context (CA bundle) is made within the same
	 * bound, so on a loaded machine the time may run out before the TCP
	 * connect ("cannot connect ...: timed out"): either way it timed out. */
	long long t0 = tu_now_ms();
	CHECK_RC(try_open("rediss://%s:%d/?connect_timeout=700ms", host, port), DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	CHECK(tu_now_ms() - t0 < 700 + 300);

	/* AUTH <password> of the default user (requirepass). raw stays logged in. */
	r = redisCommand(raw, "CONFIG SET requirepass %s", "s3cr3tPW");
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	if (r)
		freeReplyObject(r);
	CHECK_RC(try_open("redis://:s3cr3tPW@%s:%d", host, port), 0);
	CHECK_RC(try_open("redis://:s3cr3tPW@%s:%d/2", host, port), 0);
	CHECK_RC(try_open("redis://:wrong-s3cr3tPW@%s:%d", host, port), DLOCK_EAUTH);
	CHECK_RC(try_open("redis://%s:%d", host, port), DLOCK_EAUTH); /* NOAUTH */
	CHECK_RC(try_open("redis://dlocktest:s3cr3tPW@%s:%d", host, port), 0);
	r = redisCommand(raw, "CONFIG SET requirepass %s", "");
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	if (r)
		freeReplyObject(r);
	CHECK_RC(try_open("redis://%s:%d", host, port), 0);

	r = redisCommand(raw, "ACL DELUSER dlocktest");
	if (r)
		freeReplyObject(r);
	redisFree(raw);
	return tu_done("redis_uri");
}
