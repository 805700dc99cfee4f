/*
 * Redlock over TLS when one master of three is slow (issue 31, row 4): the
 * TLS masters of tests/servers/redis-tls.sh (uri_redlock), the third behind a
 * small proxy of this test's own that can
 *  - trickle: forward the master's bytes one every 100 ms (a TLS record
 *    arrives a byte at a time: a blocking SSL_read would wait for all of it);
 *  - stall: accept, forward nothing (as a SIGSTOPped master: the TCP connect
 *    succeeds, the TLS handshake never ends).
 * With two healthy masters, every call keeps its own bound:
 *  - open with the third stalled: succeeds within the master timeout plus
 *    the open's time without the fault (before: "only 0 of 3 reachable"
 *    after the whole connect_timeout);
 *  - try-onces (timeout=500ms) back to back for 1.5 s with the third
 *    trickling: each granted within the timeout plus the slowest without
 *    the fault (before: 3.6 s, a blocking SSL_read waited for the record);
 *  - a held lock renewed while the third trickles: never reported lost.
 * Bounds are the deadline plus the time the same call takes with no fault,
 * plus the scheduling delay measured in this run.
 * Usage: redlock_tls_slow (DLOCK_TEST_URI_FILE names DIR/uri of redis-tls.sh)
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { PASS, TRICKLE, STALL };
static atomic_int mode;
static int lfd, tport;
static struct sockaddr_in target;

static void *conn_thread(void *arg)
{
	int c = (int)(intptr_t)arg, u = socket(AF_INET, SOCK_STREAM, 0);
	if (u < 0 || connect(u, (struct sockaddr *)&target, sizeof target) != 0)
		goto out;
	char down[1 << 16];
	size_t nd = 0;
	for (;;) {
		int m = atomic_load(&mode);
		struct pollfd p[2] = { { c, m == STALL ? 0 : POLLIN, 0 },
				       { u, m == STALL || nd == sizeof down ? 0 : POLLIN, 0 } };
		int r = poll(p, 2, m == TRICKLE || (m == PASS && nd) ? (m == TRICKLE ? 100 : 0) : 50);
		if (r < 0)
			break;
		if (p[0].revents) {
			char buf[4096];
			ssize_t n = read(c, buf, sizeof buf);
			if (n <= 0 || write(u, buf, (size_t)n) != n)
				break;
		}
		if (p[1].revents) {
			ssize_t n = read(u, down + nd, sizeof down - nd);
			if (n <= 0)
				break;
			nd += (size_t)n;
		}
		size_t give = m == PASS ? nd : m == TRICKLE && nd && r == 0 ? 1 : 0;
		if (give) {
			if (write(c, down, give) != (ssize_t)give)
				break;
			memmove(down, down + give, nd - give);
			nd -= give;
		}
	}
out:
	if (u >= 0)
		close(u);
	close(c);
	return NULL;
}

static void *accept_thread(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0)
			return NULL;
		pthread_t t;
		if (pthread_create(&t, NULL, conn_thread, (void *)(intptr_t)c) != 0)
			close(c);
		else
			pthread_detach(t);
	}
}

/* How late a 20 ms sleep wakes, the most of 10: this run's scheduling delay. */
static long long sched_delay(void)
{
	long long worst = 0;
	for (int i = 0; i < 10; i++) {
		long long t = tu_now_ms();
		struct timespec ts = { 0, 20 * 1000000L };
		nanosleep(&ts, NULL);
		long long late = tu_now_ms() - t - 20;
		if (late > worst)
			worst = late;
	}
	return worst;
}

/* Try-once acquires (each released) of l back to back for `ms`: the slowest. */
static long long tries(dlock_lock *l, long long ms)
{
	long long worst = 0, stop = tu_now_ms() + ms;
	int fails = 0;
	while (tu_now_ms() < stop) {
		long long t0 = tu_now_ms();
		int rc = dlock_acquire(l, 0);
		long long took = tu_now_ms() - t0;
		if (took > worst)
			worst = took;
		if (rc) {
			/* every failure said, with when and how long (a diagnosis aid) */
			printf("  try failed %lld ms into the loop, took %lld ms: %s: %s\n", t0 + ms - stop, took,
			       dlock_error_name(rc), dlock_error_last()->message);
			if (!fails++)
				CHECK_RC(rc, 0);
		} else {
			long long r0 = tu_now_ms();
			int rr = dlock_release(l);
			if (rr)
				printf("  release failed after %lld ms: %s\n", tu_now_ms() - r0,
				       dlock_error_last()->message);
			CHECK_RC(rr, 0);
		}
	}
	return worst;
}

int main(void)
{
	char base[4096], u[4300];
	tu_uri_from_env(base, sizeof base, "redlock_tls_slow");
	char dir[1024], path[1200];
	tu_server_dir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/uri_redlock", dir);
	if (tu_first_line(path, base, sizeof base) != 0)
		return fprintf(stderr, "redlock_tls_slow: cannot read %s\n", path), 2;
	/* redlock://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/?...: C behind the proxy */
	char *hosts = strstr(base, "://") + 3, *end = strchr(hosts, '/');
	char *third = NULL;
	for (char *p = hosts; p < end; p++)
		if (*p == ',')
			third = p + 1;
	if (!third || !end)
		return fprintf(stderr, "redlock_tls_slow: no third master in %s\n", base), 2;
	target.sin_family = AF_INET;
	target.sin_port = htons((uint16_t)atoi(strchr(third, ':') + 1));
	target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct sockaddr_in la = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t ll = sizeof la;
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&la, sizeof la) != 0 || listen(lfd, 16) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&la, &ll) != 0)
		return perror("redlock_tls_slow: proxy"), 2;
	tport = ntohs(la.sin_port);
	snprintf(u, sizeof u, "%.*s127.0.0.1:%d%s&timeout=500ms&connect_timeout=5s", (int)(third - base), base, tport,
		 end);
	pthread_t at;
	pthread_create(&at, NULL, accept_thread, NULL);
	printf("masters: %s\n", u);

	/* no fault: what an open and a try-once take here and now */
	long long t0 = tu_now_ms();
	dlock_store *s = nu_open(u);
	long long open_ms = tu_now_ms() - t0;
	dlock_lock *l = nu_lock(s, "tls-slow-base", 5000, NU_NO_RENEW);
	t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(l, 0), 0);
	long long try_ms = tu_now_ms() - t0;
	dlock_release(l);
	dlock_lock_free(l);
	dlock_store_close(s);
	long long late = sched_delay();
	long long slack = 2 * late + TU_SCHED_GRACE_MS;
	printf("no fault: open %lld ms, try-once %lld ms; scheduling delay %lld ms\n", open_ms, try_ms, late);

	/* 1. open with the third master stalled (handshake never ends) */
	atomic_store(&mode, STALL);
	t0 = tu_now_ms();
	s = NULL;
	int rc = dlock_store_open(&s, u);
	long long took = tu_now_ms() - t0;
	printf("open, third master stalled: %s in %lld ms (bound %lld)\n", rc ? dlock_error_last()->message : "ok",
	       took, 500 + open_ms + slack);
	CHECK_RC(rc, 0);
	CHECK(took <= 500 + open_ms + slack);
	if (s)
		dlock_store_close(s);

	/* 2. a try-once with the third trickling (connections made while it passed) */
	atomic_store(&mode, PASS);
	s = nu_open(u);
	l = nu_lock(s, "tls-slow-try", 5000, NU_NO_RENEW);
	CHECK_RC(dlock_acquire(l, 0), 0); /* every master's connection up and in step */
	dlock_release(l);
	long long base_worst = tries(l, 1000);
	atomic_store(&mode, TRICKLE);
	/* back to back for 1.5 s: some rounds start while a trickled byte of
	 * the slow master's late reply is on its way (one every 100 ms) */
	long long worst = tries(l, 1500);
	printf("try-once: slowest %lld ms with no fault, %lld ms with the third master trickling (bound %lld)\n",
	       base_worst, worst, 500 + base_worst + slack);
	CHECK(worst <= 500 + base_worst + slack);
	dlock_lock_free(l);

	/* 3. a held lock renewed while the third trickles: never lost */
	atomic_store(&mode, PASS);
	atomic_store(&nu_lost_at, 0);
	l = nu_lock(s, "tls-slow-held", 1500, NU_LOST);
	CHECK_RC(dlock_acquire(l, 0), 0);
	atomic_store(&mode, TRICKLE);
	long long lost = nu_wait_lost(4500); /* three leases */
	printf("held lock, third master trickling: %s\n", lost ? "LOST" : "kept for 4.5 s (3 leases)");
	CHECK(lost == 0);
	dlock_release(l);
	dlock_lock_free(l);
	dlock_store_close(s);
	atomic_store(&mode, PASS);
	shutdown(lfd, SHUT_RDWR);
	close(lfd);
	pthread_join(at, NULL);
	return tu_done("redlock_tls_slow");
}
