/*
 * Issue 31 on a 3-server ZooKeeper ensemble: a follower is SIGSTOPped (its
 * kernel still takes connections, nothing answers); fresh stores opened
 * with every member in the URI must each get a session from the two others
 * within connect_timeout, and lock and unlock there. The C client picks its
 * first server at random and gave a silent one two thirds of the session
 * timeout — more than connect_timeout — so about one open in three failed
 * "no server ... answered". Bound: connect_timeout plus the scheduling delay
 * a 5 ms ticker measured during the open. The member is SIGCONTed at the end.
 * Usage: zookeeper_chaos SERVER_SCRIPT SERVER_DIR  (the 3-member fixture)
 */
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static atomic_int lag_on, lag_quit;
static atomic_llong lag_max;

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void *lag_thread(void *p)
{
	(void)p;
	while (!atomic_load(&lag_quit)) {
		long long t = tu_now_ms();
		nap_ms(5);
		long long late = tu_now_ms() - t - 5;
		if (atomic_load(&lag_on) && late > atomic_load(&lag_max))
			atomic_store(&lag_max, late);
	}
	return NULL;
}

/* "follower", "leader" or "" for the member on 127.0.0.1:port (srvr). */
static void member_mode(int port, char *out, size_t n)
{
	char buf[4096] = "";
	size_t got = 0;
	out[0] = '\0';
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = { 2, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && write(fd, "srvr", 4) == 4) {
		ssize_t r;
		while (got < sizeof(buf) - 1 && (r = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
			got += (size_t)r;
		buf[got] = '\0';
		const char *m = strstr(buf, "Mode: ");
		if (m)
			snprintf(out, n, "%.*s", (int)strcspn(m + 6, "\r\n"), m + 6);
	}
	if (fd >= 0)
		close(fd);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3) {
		fprintf(stderr, "usage: zookeeper_chaos SERVER_SCRIPT SERVER_DIR\n");
		return 64;
	}
	char uri[1024], path[1024], name[32], pidfile[512], mode[32];
	snprintf(path, sizeof(path), "%s/uri", argv[2]);
	FILE *f = fopen(path, "r");
	if (!f || !fgets(uri, sizeof(uri), f)) {
		fprintf(stderr, "no %s (server not started?)\n", path);
		return 2;
	}
	fclose(f);
	uri[strcspn(uri, "\r\n")] = '\0';
	/* A follower: stopping the leader would stop every new session until
	 * an election, which is the ensemble's, not the client's, to shorten. */
	int pid = 0, port = 0;
	for (int tries = 0; tries < 100 && pid <= 0; tries++) {
		snprintf(path, sizeof(path), "%s/members", argv[2]);
		f = fopen(path, "r");
		int p;
		while (f && fscanf(f, "%31s %d %511s", name, &p, pidfile) == 3 && pid <= 0) {
			member_mode(p, mode, sizeof(mode));
			FILE *pf = strcmp(mode, "follower") == 0 ? fopen(pidfile, "r") : NULL;
			if (pf && fscanf(pf, "%d", &pid) == 1 && pid > 0)
				port = p;
			if (pf)
				fclose(pf);
		}
		if (f)
			fclose(f);
		if (pid <= 0)
			nap_ms(100); /* an election may be under way */
	}
	CHECK(pid > 0);
	if (pid <= 0)
		return tu_done("zookeeper_chaos");
	pthread_t th;
	CHECK(pthread_create(&th, NULL, lag_thread, NULL) == 0);
	kill(pid, SIGSTOP);
	printf("  follower on port %d (pid %d) stopped\n", port, pid);
	const long long connect_ms = 5000; /* the URI default */
	long long slowest = 0;
	int failed = 0;
	for (int i = 0; i < 8; i++) {
		dlock_store *s = NULL;
		atomic_store(&lag_max, 0);
		atomic_store(&lag_on, 1);
		long long t = tu_now_ms();
		int rc = dlock_store_open(&s, uri);
		long long took = tu_now_ms() - t;
		atomic_store(&lag_on, 0);
		long long lag = 2 * atomic_load(&lag_max) + 5;
		if (rc != 0) {
			failed++;
			printf("  open %d: %s after %lld ms: %s\n", i, dlock_error_name(rc), took,
			       dlock_error_last()->message);
		}
		CHECK_RC(rc, 0);
		CHECK(took <= connect_ms + lag);
		if (took > slowest)
			slowest = took;
		if (!s)
			continue;
		dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
		o.ttl_ms = 5000;
		dlock_lock *l = NULL;
		snprintf(name, sizeof(name), "chaos-%d-%d", (int)getpid(), i);
		CHECK_RC(dlock_lock_new(&l, s, name, &o), 0);
		if (l) {
			CHECK_RC(dlock_acquire(l, 0), 0);
			if (dlock_held(l))
				CHECK_RC(dlock_release(l), 0);
		}
		dlock_lock_free(l);
		dlock_store_close(s);
	}
	printf("  8 opens with a follower stopped: %d failed, slowest %lld ms (bound %lld + lag)\n", failed,
	       slowest, connect_ms);
	kill(pid, SIGCONT);
	atomic_store(&lag_quit, 1);
	pthread_join(th, NULL);
	return tu_done("zookeeper_chaos");
}
