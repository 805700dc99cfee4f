/*
 * A small TCP fault proxy for the MySQL and Memcached network tests, standing
 * in for tests/unit/faultproxy.h until main has it. One thread, poll():
 *   pass       forward both ways
 *   blackhole  keep every connection, forward nothing (a hung link or server)
 *   drop       forward requests, swallow replies (applied but unanswered)
 * A closed side closes its peer, except in blackhole, where nothing is seen.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "mysql_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXPAIRS 128

struct mp_proxy {
	int lfd, port, target_port;
	atomic_int mode;
	atomic_int stop;
	atomic_llong dropped; /* reply bytes swallowed in drop mode */
	char needle[64];      /* MP_DROP_ON: turn to MP_DROP at the first request containing it */
	pthread_t th;
	int pairs[MAXPAIRS][2]; /* [client, server] */
	int npairs;
};

static void pair_close(mp_proxy *p, int i)
{
	close(p->pairs[i][0]);
	close(p->pairs[i][1]);
	p->pairs[i][0] = p->pairs[--p->npairs][0];
	p->pairs[i][1] = p->pairs[p->npairs][1];
}

static int write_all(int fd, const char *b, ssize_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, b, (size_t)n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= w;
	}
	return 0;
}

static void *loop(void *arg)
{
	mp_proxy *p = arg;
	struct pollfd fds[1 + 2 * MAXPAIRS];
	char buf[65536];
	while (!p->stop) {
		int mode = p->mode, n = 1;
		fds[0].fd = p->lfd;
		fds[0].events = POLLIN;
		for (int i = 0; i < p->npairs; i++)
			for (int s = 0; s < 2; s++) {
				fds[n].fd = p->pairs[i][s];
				fds[n].events = mode == MP_BLACKHOLE ? 0 : POLLIN;
				n++;
			}
		if (poll(fds, (nfds_t)n, 5) <= 0)
			continue;
		if (fds[0].revents & POLLIN) {
			int c = accept(p->lfd, NULL, NULL);
			if (c >= 0) {
				int sfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
				struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p->target_port) };
				a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
				if (p->npairs < MAXPAIRS && connect(sfd, (struct sockaddr *)&a, sizeof(a)) == 0) {
					setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
					setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
					p->pairs[p->npairs][0] = c;
					p->pairs[p->npairs][1] = sfd;
					p->npairs++;
				} else {
					close(c);
					close(sfd);
				}
			}
		}
		if (mode == MP_BLACKHOLE)
			continue;
		/* Walk the pairs as they were polled; a closed pair ends this round. */
		for (int i = 0, f = 1; i < p->npairs && f < n; i++, f += 2) {
			int closed = 0;
			for (int s = 0; s < 2 && !closed; s++) {
				if (!(fds[f + s].revents & (POLLIN | POLLHUP | POLLERR)))
					continue;
				ssize_t r = recv(p->pairs[i][s], buf, sizeof(buf), 0);
				if (r <= 0) {
					closed = 1;
				} else if (s == 0 && mode == MP_DROP_ON && memmem(buf, (size_t)r, p->needle, strlen(p->needle))) {
					p->mode = MP_DROP;
					mode = MP_DROP;
					if (write_all(p->pairs[i][1], buf, r) != 0)
						closed = 1;
				} else if (s == 1 && mode == MP_DROP) {
					p->dropped += r;
				} else if (write_all(p->pairs[i][!s], buf, r) != 0) {
					closed = 1;
				}
			}
			if (closed) {
				pair_close(p, i);
				break;
			}
		}
	}
	return NULL;
}

int mp_start(mp_proxy **out, int target_port)
{
	mp_proxy *p = calloc(1, sizeof(*p));
	if (!p)
		return -1;
	p->target_port = target_port;
	p->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(p->lfd, 64) != 0 ||
	    getsockname(p->lfd, (struct sockaddr *)&a, &al) != 0 ||
	    pthread_create(&p->th, NULL, loop, p) != 0) {
		if (p->lfd >= 0)
			close(p->lfd);
		free(p);
		return -1;
	}
	p->port = ntohs(a.sin_port);
	*out = p;
	return 0;
}

int mp_port(const mp_proxy *p)
{
	return p->port;
}

void mp_set(mp_proxy *p, int mode)
{
	p->mode = mode;
	usleep(20000); /* one poll round: the loop sees the mode before the caller goes on */
}

void mp_drop_on(mp_proxy *p, const char *needle)
{
	snprintf(p->needle, sizeof(p->needle), "%s", needle);
	mp_set(p, *needle ? MP_DROP_ON : MP_DROP);
}

long long mp_dropped(const mp_proxy *p)
{
	return p->dropped;
}

void mp_stop(mp_proxy *p)
{
	if (!p)
		return;
	p->stop = 1;
	pthread_join(p->th, NULL);
	while (p->npairs)
		pair_close(p, 0);
	close(p->lfd);
	free(p);
}

int mp_uri(char *out, size_t size, const char *uri, int port)
{
	/* scheme://[userinfo@]host:PORT[/...]: replace host:port by 127.0.0.1:port. */
	const char *auth = strstr(uri, "://");
	if (!auth)
		return -1;
	auth += 3;
	const char *end = auth + strcspn(auth, "/?");
	const char *at = NULL;
	for (const char *q = auth; q < end; q++)
		if (*q == '@')
			at = q;
	const char *host = at ? at + 1 : auth;
	int n = snprintf(out, size, "%.*s127.0.0.1:%d%s", (int)(host - uri), uri, port, end);
	return n > 0 && (size_t)n < size ? 0 : -1;
}
