/* Helpers shared by the redis store's own tests (header-only, test code). */
#ifndef DLOCK_TEST_REDIS_COMMON_H
#define DLOCK_TEST_REDIS_COMMON_H

#include "testutil/testutil.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdarg.h>
#include <string.h>

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
