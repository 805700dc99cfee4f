/* Helpers shared by the redis store's own tests (header-only, test code). */
#ifndef DLOCK_TEST_REDIS_COMMON_H
#define DLOCK_TEST_REDIS_COMMON_H

#include "testutil/testutil.h"

#include <dlock/dlock.h>
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The store URI from $DLOCK_TEST_URI_FILE (exit 1 when missing: a failure, never a skip). */
static inline void rt_read_uri(char *uri, size_t n)
{
	const char *file = getenv("DLOCK_TEST_URI_FILE");
	FILE *f = file ? fopen(file, "r") : NULL;
	if (!f || !fgets(uri, (int)n, f)) {
		fprintf(stderr, "no server: DLOCK_TEST_URI_FILE=%s unreadable\n", file ? file : "(unset)");
		exit(1);
	}
	fclose(f);
	uri[strcspn(uri, "\r\n")] = 0;
}

/* A raw hiredis connection to the host:port of a redis:// URI. */
static inline redisContext *rt_raw(const char *uri)
{
	char host[256];
	int port;
	if (sscanf(uri, "redis://%255[^:]:%d", host, &port) != 2) {
		fprintf(stderr, "cannot parse %s\n", uri);
		exit(1);
	}
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout(host, port, tv);
	if (!c || c->err) {
		fprintf(stderr, "cannot connect to %s\n", uri);
		exit(1);
	}
	return c;
}

/* A raw hiredis connection to 127.0.0.1:port. */
static inline redisContext *rt_raw_port(int port)
{
	char u[64];
	snprintf(u, sizeof(u), "redis://127.0.0.1:%d", port);
	return rt_raw(u);
}

/* The number in the file dir/name (a port a server script wrote); exit 1
 * when it cannot be read. */
static inline int rt_file_int(const char *dir, const char *name)
{
	char path[1100];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	int v = 0;
	if (!f || fscanf(f, "%d", &v) != 1) {
		fprintf(stderr, "cannot read %s\n", path);
		exit(1);
	}
	fclose(f);
	return v;
}

/* Send a command whose answer must be a status (+OK); else count a failure. */
static inline void rt_ok(redisContext *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void rt_ok(redisContext *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	redisReply *r = redisvCommand(c, fmt, ap);
	va_end(ap);
	if (!r || r->type != REDIS_REPLY_STATUS) {
		fprintf(stderr, "'%s' failed: %s\n", fmt, r && r->type == REDIS_REPLY_ERROR ? r->str : "no reply");
		tu_failures++;
	}
	if (r)
		freeReplyObject(r);
}

/* INFO replication of the server on 127.0.0.1:port: does it say `line`? */
static inline int rt_repl_says(int port, const char *line)
{
	redisContext *c = rt_raw_port(port);
	redisReply *r = redisCommand(c, "INFO replication");
	int yes = r && r->type == REDIS_REPLY_STRING && strstr(r->str, line) != NULL;
	if (r)
		freeReplyObject(r);
	redisFree(c);
	return yes;
}

/*
 * After a failback: the next fence of `name` through a handle opened now on
 * `uri` (take: acquire, read the fence, release) is above *top, which is
 * raised to it; printed as ", F (new handle)". The fence guard's promise is
 * for every handle, not only the one that saw the failover.
 */
static inline void rt_fence_new_handle(const char *uri, const char *name, uint64_t *top,
				       uint64_t (*take)(dlock_store *s, const char *name))
{
	dlock_store *s2 = NULL;
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	if (!s2)
		return;
	uint64_t f = take(s2, name);
	printf(", %llu (new handle)", (unsigned long long)f);
	CHECK(f > *top);
	*top = f > *top ? f : *top;
	dlock_store_close(s2);
}

/* calls=N of one command in INFO commandstats (0 when never called). */
static inline long rt_cmdstat(redisContext *c, const char *cmd)
{
	redisReply *r = redisCommand(c, "INFO commandstats");
	long v = 0;
	char key[64];
	snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
	if (r && r->type == REDIS_REPLY_STRING) {
		const char *p = strstr(r->str, key);
		if (p)
			v = strtol(p + strlen(key), NULL, 10);
	}
	if (r)
		freeReplyObject(r);
	return v;
}

#endif
