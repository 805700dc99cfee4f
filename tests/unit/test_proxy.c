/* The fault proxy against a small echo server: each mode does what it says. */
#include "testutil/faultproxy.h"
#include "testutil/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_ECHO_CONNS 32

static int echo_lfd = -1;
static int echo_stop[2];
static atomic_llong echo_received;

static void *echo_main(void *arg)
{
	struct pollfd pfd[MAX_ECHO_CONNS + 2];
	int n = 2;
	pfd[0] = (struct pollfd){ .fd = echo_lfd, .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = echo_stop[0], .events = POLLIN };
	for (;;) {
		if (poll(pfd, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		if (pfd[0].revents & POLLIN) {
			int fd = accept(echo_lfd, NULL, NULL);
			if (fd >= 0 && n < MAX_ECHO_CONNS + 2)
				pfd[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
			else if (fd >= 0)
				close(fd);
		}
		for (int i = 2; i < n; i++) {
			if (!pfd[i].revents)
				continue;
			char buf[4096];
			ssize_t r = read(pfd[i].fd, buf, sizeof(buf));
			if (r > 0) {
				echo_received += r;
				if (write(pfd[i].fd, buf, (size_t)r) == r)
					continue;
			}
			close(pfd[i].fd);
			pfd[i--] = pfd[--n];
		}
	}
	for (int i = 2; i < n; i++)
		close(pfd[i].fd);
	return arg;
}

static int connect_to(int port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_port = htons((uint16_t)port),
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		return -1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* 1 when fd becomes readable within ms, 0 if not. */
static int readable_within(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) > 0;
}

/* Send msg and read it back: the round trip in ms, or -1. */
static long long roundtrip(int fd, const char *msg, int timeout_ms)
{
	size_t len = strlen(msg), got = 0;
	char buf[256];
	long long t0 = tu_now_ms();
	if (send(fd, msg, len, MSG_NOSIGNAL) != (ssize_t)len)
		return -1;
	while (got < len) {
		long long left = t0 + timeout_ms - tu_now_ms();
		if (left <= 0 || !readable_within(fd, (int)left))
			return -1;
		ssize_t r = read(fd, buf + got, sizeof(buf) - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	if (got != len || memcmp(buf, msg, len) != 0)
		return -1;
	return tu_now_ms() - t0;
}

static long long wait_received(long long want, int ms)
{
	long long deadline = tu_now_ms() + ms;
	while (echo_received < want && tu_now_ms() < deadline)
		usleep(5000);
	return echo_received;
}

int main(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	pthread_t th;
	char uri[256], *proxied = NULL;
	long long conns, open, up, down, dropped, up0, down0, dropped0;

	CHECK((echo_lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	CHECK(bind(echo_lfd, (struct sockaddr *)&sin, sizeof(sin)) == 0);
	CHECK(listen(echo_lfd, 16) == 0);
	CHECK(getsockname(echo_lfd, (struct sockaddr *)&sin, &sl) == 0);
	CHECK(pipe(echo_stop) == 0);
	CHECK(pthread_create(&th, NULL, echo_main, NULL) == 0);
	int eport = ntohs(sin.sin_port);

	/* URI rewriting: userinfo, two hosts, path and query survive. */
	snprintf(uri, sizeof(uri), "redlock://u:p@127.0.0.1:%d,localhost:%d/db?timeout=1s", eport, eport);
	tu_proxy *p = tu_proxy_start(uri, &proxied);
	CHECK(p != NULL);
	if (!p)
		return tu_done("proxy.self");
	CHECK(tu_proxy_routes(p) == 2);
	int port0 = 0, port1 = 0;
	CHECK(sscanf(proxied, "redlock://u:p@127.0.0.1:%d,127.0.0.1:%d/db?timeout=1s", &port0, &port1) == 2);
	CHECK(strstr(proxied, "/db?timeout=1s") != NULL);
	CHECK(port0 > 0 && port1 > 0 && port0 != port1);
	free(proxied);
	char *bad = (char *)"x";
	CHECK(tu_proxy_start("redis://127.0.0.1/0", &bad) == NULL && bad == NULL);
	CHECK(tu_proxy_set(p, 5, "pass") < 0);
	CHECK(tu_proxy_set(p, -1, "sideways") < 0);

	/* pass: echoes, fast. */
	int fd = connect_to(port0);
	CHECK(fd >= 0);
	long long rt = roundtrip(fd, "hello", 1000);
	CHECK(rt >= 0 && rt < 50);
	CHECK(roundtrip(fd, "again", 1000) >= 0);
	int fd1 = connect_to(port1);
	CHECK(roundtrip(fd1, "route1", 1000) >= 0);
	close(fd1);

	/* delay 100 on the open connection: at least 200 ms round trip. */
	CHECK(tu_proxy_set(p, 0, "delay 100") == 0);
	rt = roundtrip(fd, "slow", 2000);
	CHECK(rt >= 190 && rt < 1000);
	fprintf(stderr, "delay 100: round trip %lld ms\n", rt);
	CHECK(tu_proxy_set(p, 0, "pass") == 0);
	rt = roundtrip(fd, "quick", 1000);
	CHECK(rt >= 0 && rt < 50);

	/* blackhole: nothing comes back, nothing is forwarded, the bytes are gone. */
	CHECK(tu_proxy_stats(p, 0, NULL, NULL, &up0, &down0, &dropped0) == 0);
	long long rcv0 = echo_received;
	CHECK(tu_proxy_set(p, 0, "blackhole") == 0);
	CHECK(send(fd, "void", 4, MSG_NOSIGNAL) == 4);
	CHECK(!readable_within(fd, 300));
	int fdb = connect_to(port0); /* accepted, but nothing flows */
	CHECK(fdb >= 0);
	CHECK(send(fdb, "void2", 5, MSG_NOSIGNAL) == 5);
	CHECK(!readable_within(fdb, 100));
	CHECK(tu_proxy_stats(p, 0, NULL, &open, &up, &down, &dropped) == 0);
	CHECK(up == up0 && down == down0);
	CHECK(dropped == dropped0 + 9);
	CHECK(open == 2);
	CHECK(echo_received == rcv0);
	/* Back to pass: a connection that lost bytes is reset (TCP never hands
	 * on a stream with a hole in it); a new one flows. */
	CHECK(tu_proxy_set(p, 0, "pass") == 0);
	CHECK(roundtrip(fd, "after", 1000) < 0);
	CHECK(roundtrip(fdb, "late", 1000) < 0);
	close(fdb);
	close(fd);
	fd = connect_to(port0);
	CHECK(fd >= 0);
	CHECK(roundtrip(fd, "after", 1000) >= 0);

	/* drop: the server gets the request, the client no reply. */
	CHECK(tu_proxy_set(p, 0, "drop") == 0);
	rcv0 = echo_received;
	CHECK(tu_proxy_stats(p, 0, NULL, NULL, NULL, &down0, &dropped0) == 0);
	CHECK(send(fd, "applied", 7, MSG_NOSIGNAL) == 7);
	CHECK(wait_received(rcv0 + 7, 1000) == rcv0 + 7);
	CHECK(!readable_within(fd, 300));
	CHECK(tu_proxy_stats(p, 0, NULL, NULL, NULL, &down, &dropped) == 0);
	CHECK(down == down0 && dropped == dropped0 + 7);

	/* reset: the open connection is reset at once, so are new ones. */
	CHECK(tu_proxy_set(p, 0, "reset") == 0);
	long long t0 = tu_now_ms();
	CHECK(readable_within(fd, 1000));
	char c;
	errno = 0;
	ssize_t r = read(fd, &c, 1);
	CHECK(r == 0 || (r < 0 && errno == ECONNRESET));
	CHECK(tu_now_ms() - t0 < 200);
	close(fd);
	fd = connect_to(port0);
	if (fd >= 0) { /* the handshake is the kernel's; the RST follows */
		CHECK(readable_within(fd, 1000));
		errno = 0;
		r = read(fd, &c, 1);
		CHECK(r == 0 || (r < 0 && errno == ECONNRESET));
		close(fd);
	}
	CHECK(tu_proxy_stats(p, 0, NULL, &open, NULL, NULL, NULL) == 0);
	CHECK(open == 0);

	/* pass again: a new connection works; a half-close goes through. */
	CHECK(tu_proxy_set(p, -1, "pass") == 0);
	fd = connect_to(port0);
	CHECK(fd >= 0);
	CHECK(roundtrip(fd, "back", 1000) >= 0);
	CHECK(shutdown(fd, SHUT_WR) == 0);
	CHECK(readable_within(fd, 1000));
	CHECK(read(fd, &c, 1) == 0);
	close(fd);
	long long deadline = tu_now_ms() + 1000;
	do {
		CHECK(tu_proxy_stats(p, 0, &conns, &open, NULL, NULL, NULL) == 0);
	} while (open != 0 && tu_now_ms() < deadline && usleep(5000) == 0);
	CHECK(open == 0);
	CHECK(conns == 5); /* one more: a fresh connection after the blackhole */

	/* dropmatch: only the connection whose request stream contains the
	 * pattern loses its replies, from that request on, and stays open; the
	 * match spans reads but starts when the mode is set; one shot. */
	long long fired = -1;
	CHECK(tu_proxy_set(p, -1, "dropmatch") < 0); /* no STRING */
	CHECK(tu_proxy_set(p, 0, "dropmatch bad\\q") < 0);
	CHECK(tu_proxy_set(p, 0, "dropmatch a\\x4") < 0);
	int fa = connect_to(port0), fc = connect_to(port0);
	CHECK(fa >= 0 && fc >= 0);
	CHECK(roundtrip(fa, "GRANT ", 1000) >= 0);
	CHECK(tu_proxy_dropmatch(p, 0, "GRANT me", 8) == 0);
	CHECK(roundtrip(fa, "me", 1000) >= 0);    /* "GRANT " came before the arming */
	CHECK(roundtrip(fa, "xxGRA", 1000) >= 0); /* half of it: no match yet */
	CHECK(tu_proxy_fired(p, 0, &fired) == 0 && fired == 0);
	CHECK(tu_proxy_stats(p, 0, NULL, NULL, NULL, NULL, &dropped0) == 0);
	rcv0 = echo_received;
	CHECK(send(fa, "NT me!", 6, MSG_NOSIGNAL) == 6);
	CHECK(wait_received(rcv0 + 6, 1000) == rcv0 + 6); /* the request went through */
	CHECK(!readable_within(fa, 300));                 /* its answer did not */
	CHECK(tu_proxy_fired(p, 0, &fired) == 0 && fired == 1);
	/* Another open connection and a later one pass, pattern and all. */
	CHECK(roundtrip(fc, "GRANT me", 1000) >= 0);
	int fd2 = connect_to(port0);
	CHECK(fd2 >= 0);
	CHECK(roundtrip(fd2, "GRANT me", 1000) >= 0);
	CHECK(tu_proxy_fired(p, 0, &fired) == 0 && fired == 1);
	/* The fired connection keeps forwarding requests, never answers. */
	CHECK(send(fa, "more", 4, MSG_NOSIGNAL) == 4);
	CHECK(wait_received(rcv0 + 6 + 8 + 8 + 4, 1000) == rcv0 + 6 + 8 + 8 + 4);
	CHECK(!readable_within(fa, 200));
	deadline = tu_now_ms() + 1000;
	do {
		CHECK(tu_proxy_stats(p, 0, NULL, &open, NULL, NULL, &dropped) == 0);
	} while (dropped != dropped0 + 10 && tu_now_ms() < deadline && usleep(5000) == 0);
	CHECK(dropped == dropped0 + 10);
	CHECK(open == 3);
	/* Setting a mode again resets the fired connection (a later answer after
	 * lost ones would be a stream with a hole in it); the others pass. */
	CHECK(tu_proxy_set(p, 0, "pass") == 0);
	CHECK(readable_within(fa, 1000));
	errno = 0;
	r = read(fa, &c, 1);
	CHECK(r == 0 || (r < 0 && errno == ECONNRESET));
	CHECK(roundtrip(fc, "after", 1000) >= 0);
	close(fa);
	close(fc);
	close(fd2);

	tu_proxy_stop(p);
	tu_proxy_stop(NULL);
	CHECK(write(echo_stop[1], "x", 1) == 1);
	pthread_join(th, NULL);
	close(echo_lfd);
	close(echo_stop[0]);
	close(echo_stop[1]);
	return tu_done("proxy.self");
}
