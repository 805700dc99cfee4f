/*
 * redis+sentinel://: the store finds the master through Sentinel, and after
 * the master is killed and Sentinel promotes the replica, the same store
 * handle finds and uses the new master.
 *
 * Opened through the backend (dlock__redis_open + dlock_store_open_backend)
 * so that it does not depend on the scheme table naming "redis+sentinel".
 * Usage: redis_sentinel SERVER_SCRIPT SERVER_DIR
 */
#include "stores/redis_common_test.h"
#include "core/internal.h"

#include <time.h>

static int open_sentinel(dlock_store **out, const char *text)
{
	dlock_uri *u = NULL;
	dlock_backend *be = NULL;
	int rc = dlock__uri_parse(&u, text);
	if (!rc)
		rc = dlock__redis_open(&be, u);
	if (!rc && (rc = dlock__uri_check_unused(u)) != 0)
		be->close(be);
	dlock__uri_free(u);
	if (rc)
		return rc;
	return dlock_store_open_backend(out, be, text, 30000);
}

static int file_int(const char *dir, const char *name)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	int v = 0;
	if (!f || fscanf(f, "%d", &v) != 1)
		exit(1);
	fclose(f);
	return v;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	char uri[4096], cmd[2048];
	rt_read_uri(uri, sizeof(uri));
	int replica = file_int(argv[2], "replica");

	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	CHECK_RC(open_sentinel(&s, uri), 0);
	if (!s)
		return tu_done("redis_sentinel");
	CHECK(!strcmp(dlock_store_kind(s), "redis"));
	CHECK_RC(dlock_lock_new(&l, s, "sentinel-test", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t f1 = dlock_fence(l);
	CHECK_RC(dlock_release(l), 0);

	dlock_store *bad = NULL;
	char wrong[4200];
	snprintf(wrong, sizeof(wrong), "%s-nosuchmaster", uri);
	CHECK_RC(open_sentinel(&bad, wrong), DLOCK_EUNAVAILABLE);
	snprintf(wrong, sizeof(wrong), "redis+sentinel://127.0.0.1:1");
	CHECK_RC(open_sentinel(&bad, wrong), DLOCK_EINVAL);

	snprintf(cmd, sizeof(cmd), "bash '%s' kill-master '%s'", argv[1], argv[2]);
	CHECK(system(cmd) == 0);
	long long t0 = tu_now_ms();
	/* Sentinel needs ~1 s to see the master down and a moment to promote */
	int rc;
	struct timespec ts = { 0, 100 * 1000000 };
	while ((rc = dlock_acquire(l, 0)) != 0 && tu_now_ms() - t0 < 30000)
		nanosleep(&ts, NULL);
	CHECK_RC(rc, 0);
	printf("failover: the same handle granted a lock on the new master %lld ms after the kill "
	       "(fence %llu, before %llu)\n",
	       tu_now_ms() - t0, (unsigned long long)dlock_fence(l), (unsigned long long)f1);
	CHECK(dlock_fence(l) > f1); /* the counter had replicated */
	CHECK_RC(dlock_release(l), 0);

	/* it is the former replica that serves now */
	char rep[64];
	snprintf(rep, sizeof(rep), "redis://127.0.0.1:%d", replica);
	redisContext *c = rt_raw(rep);
	redisReply *r = redisCommand(c, "ROLE");
	CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && !strcmp(r->element[0]->str, "master"));
	if (r)
		freeReplyObject(r);
	redisFree(c);

	dlock_lock_free(l);
	dlock_store_close(s);
	return tu_done("redis_sentinel");
}
