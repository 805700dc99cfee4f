/*
 * redis+sentinel:// through a failover window (issue 31, "What to build" 1),
 * on a master + replica + Sentinel of its own (tests/servers/redis-sentinel.sh):
 *  - the URI names a hung sentinel first (a socket that accepts and never
 *    answers) and the live one second: open takes at most half a request
 *    timeout on the hung one, and once the live one has answered it is
 *    asked first;
 *  - the master is killed; a wait that starts while Sentinel has not yet
 *    promoted the replica (its first try finds no master that answers,
 *    though the sentinel does) goes on until the promotion and is granted,
 *    soon after the sentinel names the new master — it does not end as
 *    "unavailable" after its first try.
 * Opened through the backend (as redis_sentinel.c). Usage:
 * redis_sentinel_wait SERVER_SCRIPT SERVER_DIR
 */
#include "stores/redis_sentinel_test.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A listening socket nobody accepts on: the kernel completes the TCP
 * handshake, and nothing ever answers (a hung server). */
static int hung_port(int *fd)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	*fd = socket(AF_INET, SOCK_STREAM, 0);
	if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(*fd, 64) != 0 ||
	    getsockname(*fd, (struct sockaddr *)&a, &len) != 0) {
		perror("hung socket");
		exit(1);
	}
	return ntohs(a.sin_port);
}

/* ROLE of the server on port: 1 master, 0 other, -1 no answer. */
static int is_master(int port)
{
	struct timeval tv = { 0, 300000 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	int v = -1;
	if (c && !c->err) {
		redisSetTimeout(c, tv);
		redisReply *r = redisCommand(c, "ROLE");
		if (r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING)
			v = !strcmp(r->element[0]->str, "master");
		if (r)
			freeReplyObject(r);
	}
	if (c)
		redisFree(c);
	return v;
}

static int replica_port;
static atomic_llong promoted_at; /* when the replica first said it is the master */
static atomic_int watching;

static void *watch_main(void *p)
{
	(void)p;
	while (atomic_load(&watching)) {
		if (is_master(replica_port) == 1) {
			atomic_store(&promoted_at, tu_now_ms());
			break;
		}
		nanosleep(&(struct timespec){ 0, 10 * 1000000 }, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 64;
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *dir = argv[2];
	char path[1100], uri[2048], two[4200], cmd[3000];
	snprintf(path, sizeof(path), "%s/uri", dir);
	if (tu_first_line(path, uri, sizeof(uri)) != 0 || strncmp(uri, "redis+sentinel://", 17) != 0) {
		fprintf(stderr, "no sentinel set-up: %s\n", path);
		return 1;
	}
	replica_port = rt_file_int(dir, "replica");
	int hfd, hung = hung_port(&hfd);
	snprintf(two, sizeof(two), "redis+sentinel://127.0.0.1:%d,%s", hung, uri + 17);

	/* open with the hung sentinel first */
	dlock_store *s = NULL;
	dlock_lock *l = NULL;
	long long t0 = tu_now_ms();
	/* no replica left after the failover: grants are not waited for on one */
	snprintf(two + strlen(two), sizeof(two) - strlen(two), "?wait_replicas=0&fence_replicas=0");
	CHECK_RC(rt_open_sentinel(&s, two), 0);
	long long open_ms = tu_now_ms() - t0;
	printf("open with a hung sentinel first: %lld ms (connect_timeout 5 s, request timeout 2 s)\n", open_ms);
	CHECK(open_ms < 1000 + 500); /* half a request timeout on the hung one, and slack */
	if (!s)
		return tu_done("redis_sentinel_wait");
	CHECK_RC(dlock_lock_new(&l, s, "sentinel-failover-wait", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t f1 = dlock_fence(l);
	CHECK_RC(dlock_release(l), 0);

	/* the master killed (Sentinel promotes the replica about a second later) */
	atomic_store(&watching, 1);
	pthread_t w;
	pthread_create(&w, NULL, watch_main, NULL);
	snprintf(cmd, sizeof(cmd), "bash %s kill-master %s", argv[1], dir);
	CHECK(system(cmd) == 0);
	long long killed = tu_now_ms();
	/* a wait that starts before the promotion rides it out */
	CHECK(atomic_load(&promoted_at) == 0);
	t0 = tu_now_ms();
	int rc = dlock_acquire(l, 60000);
	long long granted = tu_now_ms();
	atomic_store(&watching, 0);
	pthread_join(w, NULL);
	long long prom = atomic_load(&promoted_at);
	printf("wait started %lld ms after the kill: rc %d after %lld ms (%s); replica promoted %lld ms after the "
	       "kill, granted %lld ms after that\n",
	       t0 - killed, rc, granted - t0, rc ? dlock_error_last()->message : "granted", prom ? prom - killed : -1,
	       prom ? granted - prom : -1);
	CHECK_RC(rc, 0);
	if (rc == 0) {
		CHECK(dlock_fence(l) > f1);
		CHECK(prom > 0 && granted - prom < 3000); /* Sentinel's switch, then our next try */
		CHECK_RC(dlock_release(l), 0);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	close(hfd);
	return tu_done("redis_sentinel_wait");
}
