/*
 * A hostile Redis server (issue 21 row 4): a fake server in this process
 * answers every command with a reply that announces more than any client
 * should hold, and the store must refuse it, drop the connection and fail
 * with a clear error well before its request timeout, its memory bounded:
 *  - bulk:   "$2000000000" then bytes streamed as fast as the client reads;
 *  - array:  "*25000000" then nothing (hiredis would allocate the pointers
 *            and wait for the elements until the timeout);
 *  - nested: "*2" "*500000" + 500000 integers, then "*600000": over the
 *            per-reply element bound only counted together.
 * Asserts: the open (or, if it got through, status) fails with
 * DLOCK_EUNAVAILABLE and "reply refused"; within half the request timeout;
 * the server could send at most the byte bound plus socket buffers; VmRSS
 * grew by less than 512 MiB (before the bounds: 1.4 GiB and more).
 * Usage: redis_hostile (no server needed)
 */
#include "testutil/testutil.h"

#include "stores/redis/redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TIMEOUT_MS 8000

typedef struct fake {
	int lfd, port;
	const char *mode;
	pthread_t th;
	atomic_llong sent;
	atomic_int stop;
} fake;

static int send_all(fake *f, int fd, const char *p, size_t n)
{
	while (n > 0) {
		struct pollfd pf = { fd, POLLOUT, 0 };
		if (atomic_load(&f->stop))
			return -1;
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (w <= 0)
			return -1;
		atomic_fetch_add(&f->sent, w);
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* One connection: wait for a command, answer with the hostile reply. */
static void serve(fake *f, int fd)
{
	char buf[4096];
	struct pollfd pf = { fd, POLLIN, 0 };
	while (!atomic_load(&f->stop) && poll(&pf, 1, 100) == 0)
		;
	if (atomic_load(&f->stop) || recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
		return;
	static char chunk[1 << 16];
	if (!strcmp(f->mode, "bulk")) {
		memset(chunk, 'x', sizeof(chunk));
		if (send_all(f, fd, "$2000000000\r\n", 13))
			return;
		for (long long total = 0; total < 2000000000LL; total += (long long)sizeof(chunk))
			if (send_all(f, fd, chunk, sizeof(chunk)))
				return;
	} else if (!strcmp(f->mode, "array")) {
		if (send_all(f, fd, "*25000000\r\n", 11))
			return;
	} else {
		for (size_t i = 0; i + 4 <= sizeof(chunk); i += 4)
			memcpy(chunk + i, ":1\r\n", 4);
		if (send_all(f, fd, "*2\r\n*500000\r\n", 13))
			return;
		for (long left = 500000; left > 0; left -= (long)sizeof(chunk) / 4) {
			size_t n = left < (long)sizeof(chunk) / 4 ? (size_t)left * 4 : sizeof(chunk);
			if (send_all(f, fd, chunk, n))
				return;
		}
		if (send_all(f, fd, "*600000\r\n", 9))
			return;
	}
	/* then hold the connection open and silent until the client goes */
	while (!atomic_load(&f->stop)) {
		struct pollfd q = { fd, POLLIN, 0 };
		if (poll(&q, 1, 100) > 0 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
			return;
	}
}

static void *fake_main(void *arg)
{
	fake *f = arg;
	while (!atomic_load(&f->stop)) {
		struct pollfd pf = { f->lfd, POLLIN, 0 };
		if (poll(&pf, 1, 100) <= 0)
			continue;
		int fd = accept(f->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		serve(f, fd);
		close(fd);
	}
	return NULL;
}

static void fake_start(fake *f, const char *mode)
{
	memset(f, 0, sizeof(*f));
	f->mode = mode;
	f->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(f->lfd, 8) != 0 ||
	    getsockname(f->lfd, (struct sockaddr *)&a, &al) != 0) {
		perror("fake server");
		exit(1);
	}
	f->port = ntohs(a.sin_port);
	if (pthread_create(&f->th, NULL, fake_main, f) != 0)
		exit(1);
}

static void fake_stop(fake *f)
{
	atomic_store(&f->stop, 1);
	pthread_join(f->th, NULL);
	close(f->lfd);
}

static long rss_kib(void)
{
	FILE *fp = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (fp && fgets(line, sizeof(line), fp))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	if (fp)
		fclose(fp);
	return v;
}

static void hostile(const char *mode)
{
	fake f;
	fake_start(&f, mode);
	char uri[200];
	snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d?timeout=%d&connect_timeout=%d", f.port, TIMEOUT_MS,
		 TIMEOUT_MS);
	long rss0 = rss_kib();
	long long t0 = tu_now_ms();
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, uri);
	if (rc == 0) { /* an open that sends nothing: the first request meets the server */
		dlock_lock_status *st = NULL;
		size_t n = 0;
		rc = dlock_store_status(s, NULL, 0, &st, &n);
		if (rc == 0)
			dlock_status_free(st, n);
	}
	long long took = tu_now_ms() - t0;
	const char *msg = dlock_error_last()->message;
	long rss1 = rss_kib();
	printf("%-6s: %s (%s) after %lld ms; the server sent %lld bytes; VmRSS %+ld KiB\n", mode, dlock_error_name(rc),
	       msg, took, (long long)atomic_load(&f.sent), rss1 - rss0);
	CHECK_RC(rc, DLOCK_EUNAVAILABLE);
	CHECK(strstr(msg, "reply refused") != NULL);
	CHECK(strcmp(dlock_error_last()->store_code, "EPROTO") == 0);
	CHECK(took < TIMEOUT_MS / 2);
	/* the byte bound, plus what the socket buffers hold */
	CHECK(atomic_load(&f.sent) < (long long)DLOCK__REDIS_REPLY_MAX_BYTES + (32LL << 20));
	CHECK(rss1 - rss0 < 512L * 1024);
	dlock_store_close(s);
	fake_stop(&f);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	hostile("array");
	hostile("nested");
	hostile("bulk");
	return tu_done("redis_hostile");
}
