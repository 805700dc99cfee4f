/* faultproxy: a TCP proxy for the tests that faults the network between a
 * client and a real server, controlled while it runs.
 *
 *   faultproxy CONTROL_SOCKET_PATH TARGET_HOST:PORT [TARGET_HOST:PORT ...]
 *
 * Route i listens on 127.0.0.1 (a port the kernel picks) and forwards to the
 * i-th target. On start it prints one line per route with its listen port,
 * then "ready", and serves until SIGTERM/SIGINT or the "quit" command.
 *
 * Control: a Unix stream socket at CONTROL_SOCKET_PATH, one command a line,
 * one reply line ("ok ..." once applied, or "error <text>"):
 *   pass [R] | delay MS [R] | lag MS [R] | blackhole [R] | drop [R] | dropmatch STRING [R] | reset [R]
 *   | stats R | quit
 * R is a route index; absent means every route. A mode applies to the
 * route's open connections and to new ones.
 *   pass       forward both ways.
 *   delay MS   forward both ways, each chunk MS ms after it was read.
 *   lag MS     forward both ways; each chunk read while the route is in lag
 *              is held until MS ms after it was read, and keeps that time
 *              when the mode changes (delay's chunks follow the mode): a lag
 *              set for a moment delays only the traffic of that moment, and
 *              a later connection's bytes overtake it (one connection stays
 *              in order). `dlock check --ops extend` lags a worker's link
 *              just when its renewal is due.
 *   blackhole  keep connections open, forward nothing: bytes read are discarded
 *              (counted in dropped), as are bytes still queued inside the proxy
 *              when the mode is set; a FIN is held and forwarded only when the
 *              direction flows again. New connections are accepted but not
 *              connected onward until the route leaves blackhole. A connection
 *              that lost bytes is reset when the mode changes (as dropmatch).
 *   drop       forward client->server, discard server->client (and hold its
 *              FIN); a connection that lost bytes is reset when the mode changes.
 *   dropmatch STRING
 *              forward both ways until a client->server byte stream of the
 *              route contains STRING (matched across reads, from the moment
 *              the mode is set); from then on that one connection is a drop:
 *              the request is forwarded, every server->client byte of it is
 *              discarded (its FIN held), the connection stays open. One shot:
 *              after it fired once, other and later connections only pass,
 *              until the mode is set again. Setting any mode resets (RST) the
 *              connection it fired on: one that lost answers never delivers a
 *              later byte (TCP never hands on a stream with a hole in it).
 *              STRING is one word of at most 128
 *              bytes once decoded: \s space, \t, \r, \n, \\, \xHH any byte.
 *              For a request whose effect is wanted but not its answer when
 *              a grant is several requests (a store's last write of it).
 *   reset      RST both sides of every connection of the route; new
 *              connections are reset at once.
 * stats R replies "ok conns=N open=N up=BYTES down=BYTES dropped=BYTES fired=N"
 * (connections accepted, open now, bytes forwarded each way, bytes discarded,
 * times a dropmatch fired); fields may be added at the end.
 * An error on either socket (RST, failed connect) resets the other side.
 * FAULTPROXY_BLACKHOLE=1 in the environment starts every route in blackhole
 * (for shell tests that need a server that accepts and never answers).
 * One thread, epoll, non-blocking sockets; pass mode arms no timer.
 *
 * Part of the dlock tool, built with FAULTPROXY_MAIN defined to another
 * name: `dlock check` forks and runs the proxy there to fault each worker's
 * connections. The tests build the same file as the program `faultproxy`
 * (tests/servers/CMakeLists.txt). Everything else here is static.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, accept4 */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HIGH_WATER (1 << 20) /* stop reading a side while its queue is over this */
#define READ_SIZE 65536
#define CTL_LINE_MAX 1024 /* a dropmatch STRING may be escaped to 4 bytes a byte */
#define PATTERN_MAX 128 /* bytes of a dropmatch STRING, decoded */

enum mode { M_PASS, M_DELAY, M_LAG, M_BLACKHOLE, M_DROP, M_DROPMATCH, M_RESET };
enum kind { K_LISTEN, K_CLIENT, K_SERVER, K_CTL_LISTEN, K_CTL, K_SIGNAL, K_TIMER };
enum { UP = 0, DOWN = 1 }; /* UP: client->server, DOWN: server->client */

struct item {
	enum kind kind;
	void *ptr;
};

struct chunk {
	struct chunk *next;
	int64_t read_ns;
	int64_t due_ns; /* lag: held until then whatever the mode */
	size_t len, off;
	char data[];
};

struct dir {
	struct chunk *head, *tail;
	size_t queued;
	int eof; /* the source sent FIN */
	int shut; /* FIN forwarded to the destination */
	int blocked; /* the last write to the destination hit EAGAIN */
};

struct route;

struct conn {
	struct conn *prev, *next;
	struct route *route;
	int fd[2]; /* [UP] = client side, [DOWN] = server side; -1 = none */
	int connecting;
	int dead; /* closed; freed after the current epoll batch */
	uint32_t events[2]; /* registered epoll interest, per fd */
	int registered[2];
	struct item it[2];
	struct dir dir[2];
	int swallow; /* dropmatch fired here: server->client is discarded */
	int holed;   /* bytes of it were discarded: reset when the mode changes */
	size_t carry_len; /* dropmatch: the last bytes client->server, for a match across reads */
	char carry[PATTERN_MAX];
};

struct route {
	int index;
	int lfd;
	struct item it;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	enum mode mode;
	int64_t delay_ns;
	int64_t lag_ns;    /* lag: what new chunks are held for */
	int64_t lag_until; /* the latest due time of a lagged chunk; 0 none */
	struct conn *conns;
	char pattern[PATTERN_MAX]; /* dropmatch */
	size_t pattern_len;
	int armed; /* dropmatch has not fired yet */
	long long accepted, open, up, down, dropped, fired;
};

struct ctl {
	struct ctl *prev, *next;
	int fd;
	struct item it;
	size_t len;
	char buf[CTL_LINE_MAX];
};

static int ep = -1;
static struct route *routes;
static int nroutes;
static struct ctl *ctls;
static struct conn *graveyard; /* closed conns that events of this batch may still name */
static int quitting;
static int timer_fd = -1;
static int64_t timer_armed = -1;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int flows(const struct conn *c, int d)
{
	if (d == DOWN && c->swallow)
		return 0;
	switch (c->route->mode) {
	case M_PASS:
	case M_DELAY:
	case M_LAG:
	case M_DROPMATCH:
		return 1;
	case M_DROP:
		return d == UP;
	default:
		return 0;
	}
}

static void queue_free(struct route *r, struct dir *q, int count)
{
	struct chunk *c = q->head;
	while (c) {
		struct chunk *n = c->next;
		if (count)
			r->dropped += (long long)(c->len - c->off);
		free(c);
		c = n;
	}
	q->head = q->tail = NULL;
	q->queued = 0;
}

static void unregister(struct conn *c, int side)
{
	if (c->registered[side]) {
		epoll_ctl(ep, EPOLL_CTL_DEL, c->fd[side], NULL);
		c->registered[side] = 0;
	}
}

static void conn_close(struct conn *c, int rst)
{
	struct route *r = c->route;
	for (int s = 0; s < 2; s++) {
		if (c->fd[s] < 0)
			continue;
		unregister(c, s);
		if (rst) {
			struct linger lg = { 1, 0 };
			setsockopt(c->fd[s], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		}
		close(c->fd[s]);
	}
	queue_free(r, &c->dir[UP], 0);
	queue_free(r, &c->dir[DOWN], 0);
	if (c->prev)
		c->prev->next = c->next;
	else
		r->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	r->open--;
	c->dead = 1;
	c->next = graveyard;
	graveyard = c;
}

static void bury(void)
{
	while (graveyard) {
		struct conn *n = graveyard->next;
		free(graveyard);
		graveyard = n;
	}
}

static int set_interest(struct conn *c, int side, uint32_t ev)
{
	struct epoll_event e = { .events = ev, .data.ptr = &c->it[side] };
	if (c->registered[side] && c->events[side] == ev)
		return 0;
	if (epoll_ctl(ep, c->registered[side] ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd[side], &e) < 0) {
		perror("faultproxy: epoll_ctl");
		return -1;
	}
	c->registered[side] = 1;
	c->events[side] = ev;
	return 0;
}

static int start_connect(struct conn *c)
{
	struct route *r = c->route;
	int fd = socket(r->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->fd[DOWN] = fd;
	if (connect(fd, (struct sockaddr *)&r->addr, r->addrlen) < 0) {
		if (errno != EINPROGRESS)
			return -1;
		c->connecting = 1;
	}
	return 0;
}

/* dropmatch: does the client->server stream, continued by buf, now contain
 * the route's pattern? Keeps the last pattern_len - 1 bytes for the next read. */
static int matches(struct conn *c, const char *buf, size_t n)
{
	const struct route *r = c->route;
	size_t keep = r->pattern_len - 1;
	if (c->carry_len) {
		char joint[2 * PATTERN_MAX];
		size_t k = n < keep ? n : keep;
		memcpy(joint, c->carry, c->carry_len);
		memcpy(joint + c->carry_len, buf, k);
		if (memmem(joint, c->carry_len + k, r->pattern, r->pattern_len))
			return 1;
	}
	if (memmem(buf, n, r->pattern, r->pattern_len))
		return 1;
	if (n >= keep) {
		memcpy(c->carry, buf + n - keep, keep);
		c->carry_len = keep;
	} else {
		size_t old = c->carry_len < keep - n ? c->carry_len : keep - n;
		memmove(c->carry, c->carry + c->carry_len - old, old);
		memcpy(c->carry + old, buf, n);
		c->carry_len = old + n;
	}
	return 0;
}

/* Read what side `s` has sent; returns -1 when the connection must be reset. */
static int pull(struct conn *c, int s, int force)
{
	struct route *r = c->route;
	struct dir *q = &c->dir[s];
	char buf[READ_SIZE];
	while (!q->eof && (force || !flows(c, s) || q->queued < HIGH_WATER)) {
		ssize_t n = recv(c->fd[s], buf, sizeof(buf), 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -1;
		}
		if (n == 0) {
			q->eof = 1;
			return 0;
		}
		if (!flows(c, s)) {
			r->dropped += n;
			c->holed = 1;
			continue;
		}
		if (s == UP && r->mode == M_DROPMATCH && r->armed && matches(c, buf, (size_t)n)) {
			r->armed = 0;
			r->fired++;
			c->swallow = 1;
			queue_free(r, &c->dir[DOWN], 1);
		}
		struct chunk *ch = malloc(sizeof(*ch) + (size_t)n);
		if (!ch) {
			fprintf(stderr, "faultproxy: out of memory\n");
			return -1;
		}
		ch->next = NULL;
		ch->read_ns = now_ns();
		ch->due_ns = ch->read_ns + (r->mode == M_LAG ? r->lag_ns : 0);
		if (ch->due_ns > r->lag_until)
			r->lag_until = ch->due_ns;
		ch->len = (size_t)n;
		ch->off = 0;
		memcpy(ch->data, buf, (size_t)n);
		if (q->tail)
			q->tail->next = ch;
		else
			q->head = ch;
		q->tail = ch;
		q->queued += (size_t)n;
	}
	return 0;
}

/* When a chunk may go: its read time plus the route's delay, not before its lag. */
static int64_t chunk_due(const struct route *r, const struct chunk *ch)
{
	int64_t t = ch->read_ns + r->delay_ns;
	return t > ch->due_ns ? t : ch->due_ns;
}

/* Write the ready part of direction d; returns -1 when the connection must be reset. */
static int push(struct conn *c, int d, int64_t now)
{
	struct route *r = c->route;
	struct dir *q = &c->dir[d];
	int dst = d == UP ? DOWN : UP;
	if (!flows(c, d)) {
		c->holed |= q->head != NULL;
		queue_free(r, q, 1);
		return 0;
	}
	if (c->fd[dst] < 0 || c->connecting)
		return 0;
	q->blocked = 0;
	while (q->head && chunk_due(r, q->head) <= now) {
		struct chunk *ch = q->head;
		ssize_t n = send(c->fd[dst], ch->data + ch->off, ch->len - ch->off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				q->blocked = 1;
				return 0;
			}
			return -1;
		}
		ch->off += (size_t)n;
		q->queued -= (size_t)n;
		if (d == UP)
			r->up += n;
		else
			r->down += n;
		if (ch->off == ch->len) {
			q->head = ch->next;
			if (!q->head)
				q->tail = NULL;
			free(ch);
		}
	}
	if (!q->head && q->eof && !q->shut) {
		shutdown(c->fd[dst], SHUT_WR);
		q->shut = 1;
	}
	return 0;
}

/* Bring one connection up to date with its route's mode and its sockets'
 * state: read, write, forward FINs, close when both FINs went through, and
 * register the epoll interest that follows. Frees c when it closes. */
static void pump(struct conn *c, int64_t now)
{
	struct route *r = c->route;
	if (r->mode == M_RESET) {
		conn_close(c, 1);
		return;
	}
	if (c->fd[DOWN] < 0 && r->mode != M_BLACKHOLE && start_connect(c) < 0) {
		conn_close(c, 1);
		return;
	}
	for (int d = 0; d < 2; d++) {
		if (push(c, d, now) < 0) {
			conn_close(c, 1);
			return;
		}
	}
	if (c->dir[UP].shut && c->dir[DOWN].shut) {
		conn_close(c, 0);
		return;
	}
	for (int s = 0; s < 2; s++) {
		if (c->fd[s] < 0)
			continue;
		int other = !s;
		struct dir *in = &c->dir[s], *out = &c->dir[other];
		/* A socket whose FIN came and to which ours went only reports
		 * EPOLLHUP from now on: take it out of the set. */
		if (in->eof && out->shut) {
			unregister(c, s);
			continue;
		}
		uint32_t ev = 0;
		if (s == DOWN && c->connecting)
			ev = EPOLLOUT;
		else {
			if (!in->eof && (!flows(c, s) || in->queued < HIGH_WATER))
				ev |= EPOLLIN;
			if (out->blocked)
				ev |= EPOLLOUT;
		}
		if (set_interest(c, s, ev) < 0) {
			conn_close(c, 1);
			return;
		}
	}
}

static void on_conn_event(struct conn *c, int s, uint32_t ev)
{
	if (c->dead)
		return;
	if (s == DOWN && c->connecting) {
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(c->fd[DOWN], SOL_SOCKET, SO_ERROR, &err, &len);
		if (err || (ev & (EPOLLERR | EPOLLHUP))) {
			conn_close(c, 1);
			return;
		}
		c->connecting = 0;
	}
	if (ev & EPOLLERR) {
		conn_close(c, 1);
		return;
	}
	/* EPOLLHUP stays up whatever we ask for: read to the end now, past the
	 * high-water mark (the peer has closed, so what is left is bounded). */
	if ((ev & (EPOLLIN | EPOLLHUP)) && pull(c, s, (ev & EPOLLHUP) != 0) < 0) {
		conn_close(c, 1);
		return;
	}
	pump(c, now_ns());
}

static void on_accept(struct route *r)
{
	for (;;) {
		int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				perror("faultproxy: accept");
			return;
		}
		r->accepted++;
		if (r->mode == M_RESET) {
			struct linger lg = { 1, 0 };
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			close(fd);
			continue;
		}
		struct conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->route = r;
		c->fd[UP] = fd;
		c->fd[DOWN] = -1;
		c->it[UP] = (struct item){ K_CLIENT, c };
		c->it[DOWN] = (struct item){ K_SERVER, c };
		c->next = r->conns;
		if (r->conns)
			r->conns->prev = c;
		r->conns = c;
		r->open++;
		pump(c, now_ns());
	}
}

static void pump_route(struct route *r)
{
	int64_t now = now_ns();
	struct conn *c = r->conns;
	while (c) {
		struct conn *n = c->next;
		pump(c, now);
		c = n;
	}
}

/* Arm the timer for the earliest delayed chunk; pass mode never gets here
 * with anything queued past its read time, so it arms nothing. */
static void arm_timer(void)
{
	int64_t next = -1;
	for (int i = 0; i < nroutes; i++) {
		if (routes[i].delay_ns == 0 && routes[i].lag_until == 0)
			continue;
		for (struct conn *c = routes[i].conns; c; c = c->next) {
			for (int d = 0; d < 2; d++) {
				struct chunk *h = c->dir[d].head;
				int dst = d == UP ? DOWN : UP;
				if (!h || c->dir[d].blocked || !flows(c, d) || c->fd[dst] < 0 || c->connecting)
					continue;
				int64_t t = chunk_due(&routes[i], h);
				if (next < 0 || t < next)
					next = t;
			}
		}
	}
	if (next == timer_armed)
		return;
	struct itimerspec its = { 0 };
	if (next >= 0) {
		its.it_value.tv_sec = next / 1000000000;
		its.it_value.tv_nsec = next % 1000000000;
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
	timer_armed = next;
}

static void set_mode(struct route *r, enum mode m, long ms)
{
	r->mode = m;
	r->armed = m == M_DROPMATCH;
	/* A connection that lost bytes (dropmatch, drop, blackhole) never
	 * delivers a later byte (a stream with a hole in it is no network's
	 * behaviour: TCP would have retransmitted or given up): it is reset. */
	for (struct conn *c = r->conns, *n; c; c = n) {
		n = c->next;
		c->carry_len = 0;
		if (c->swallow || c->holed)
			conn_close(c, 1);
	}
	r->delay_ns = m == M_DELAY ? (int64_t)ms * 1000000 : 0;
	r->lag_ns = m == M_LAG ? (int64_t)ms * 1000000 : 0;
	pump_route(r);
}

static void ctl_close(struct ctl *k)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
	close(k->fd);
	if (k->prev)
		k->prev->next = k->next;
	else
		ctls = k->next;
	if (k->next)
		k->next->prev = k->prev;
	free(k);
}

/* Parse an optional route index; returns -2 on a bad one, -1 for "all". */
static int parse_route(const char *s)
{
	if (!s)
		return -1;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < 0 || v >= nroutes)
		return -2;
	return (int)v;
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* Decode a dropmatch STRING into out[PATTERN_MAX]; -1 when empty, too long or badly escaped. */
static int unescape(const char *s, char *out, size_t *len)
{
	size_t n = 0;
	for (; *s; s++) {
		char ch = *s;
		if (ch == '\\') {
			switch (*++s) {
                        /* clang-format off */
			case 's': ch = ' '; break;
			case 't': ch = '\t'; break;
			case 'r': ch = '\r'; break;
			case 'n': ch = '\n'; break;
			case '\\': ch = '\\'; break;
			/* clang-format on */
			case 'x': {
				int hi = hexval(s[1]), lo = hi < 0 ? -1 : hexval(s[2]);
				if (lo < 0)
					return -1;
				ch = (char)(hi * 16 + lo);
				s += 2;
				break;
			}
			default:
				return -1;
			}
		}
		if (n == PATTERN_MAX)
			return -1;
		out[n++] = ch;
	}
	*len = n;
	return n ? 0 : -1;
}

static void ctl_command(char *line, char *reply, size_t cap)
{
	char *save = NULL;
	char *cmd = strtok_r(line, " \t\r", &save);
	char *a1 = cmd ? strtok_r(NULL, " \t\r", &save) : NULL;
	char *a2 = a1 ? strtok_r(NULL, " \t\r", &save) : NULL;
	char *a3 = a2 ? strtok_r(NULL, " \t\r", &save) : NULL;
	snprintf(reply, cap, "ok\n");
	if (!cmd) {
		snprintf(reply, cap, "error empty command\n");
		return;
	}
	if (!strcmp(cmd, "quit")) {
		quitting = 1;
		return;
	}
	if (!strcmp(cmd, "stats")) {
		int r = a1 && !a2 ? parse_route(a1) : -2;
		if (r < 0) {
			snprintf(reply, cap, "error usage: stats ROUTE (0..%d)\n", nroutes - 1);
			return;
		}
		struct route *rt = &routes[r];
		snprintf(reply, cap, "ok conns=%lld open=%lld up=%lld down=%lld dropped=%lld fired=%lld\n",
			 rt->accepted, rt->open, rt->up, rt->down, rt->dropped, rt->fired);
		return;
	}
	enum mode m;
	long ms = 0;
	char *ra = a1;
	char pattern[PATTERN_MAX];
	size_t plen = 0;
	if (!strcmp(cmd, "pass"))
		m = M_PASS;
	else if (!strcmp(cmd, "blackhole"))
		m = M_BLACKHOLE;
	else if (!strcmp(cmd, "drop"))
		m = M_DROP;
	else if (!strcmp(cmd, "reset"))
		m = M_RESET;
	else if (!strcmp(cmd, "delay") || !strcmp(cmd, "lag")) {
		char *end;
		m = !strcmp(cmd, "lag") ? M_LAG : M_DELAY;
		errno = 0;
		ms = a1 ? strtol(a1, &end, 10) : -1;
		if (!a1 || errno || *end || end == a1 || ms < 0 || ms > 3600000) {
			snprintf(reply, cap, "error usage: %s MS [ROUTE]\n", cmd);
			return;
		}
		ra = a2;
		a2 = a3;
	} else if (!strcmp(cmd, "dropmatch")) {
		m = M_DROPMATCH;
		if (!a1 || unescape(a1, pattern, &plen) < 0) {
			snprintf(reply, cap,
				 "error usage: dropmatch STRING [ROUTE] (1..%d bytes; \\s \\t \\r \\n \\\\ \\xHH)\n",
				 PATTERN_MAX);
			return;
		}
		ra = a2;
		a2 = a3;
	} else {
		snprintf(reply, cap, "error unknown command '%s'\n", cmd);
		return;
	}
	int r = a2 ? -2 : parse_route(ra);
	if (r == -2) {
		snprintf(reply, cap, "error bad route (0..%d)\n", nroutes - 1);
		return;
	}
	for (int i = 0; i < nroutes; i++)
		if (r < 0 || r == i) {
			memcpy(routes[i].pattern, pattern, plen);
			routes[i].pattern_len = plen;
			set_mode(&routes[i], m, ms);
		}
}

static void on_ctl(struct ctl *k)
{
	for (;;) {
		ssize_t n = recv(k->fd, k->buf + k->len, sizeof(k->buf) - k->len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			ctl_close(k);
			return;
		}
		k->len += (size_t)n;
		char *nl;
		while ((nl = memchr(k->buf, '\n', k->len))) {
			char reply[256];
			size_t used = (size_t)(nl - k->buf) + 1;
			*nl = '\0';
			ctl_command(k->buf, reply, sizeof(reply));
			memmove(k->buf, k->buf + used, k->len - used);
			k->len -= used;
			/* Replies are short and the client waits for each one: a
			 * client that does not read them is dropped. */
			size_t rl = strlen(reply);
			if (send(k->fd, reply, rl, MSG_NOSIGNAL) != (ssize_t)rl) {
				ctl_close(k);
				return;
			}
			if (quitting)
				return;
		}
		if (k->len == sizeof(k->buf)) {
			ctl_close(k);
			return;
		}
	}
}

static void on_ctl_accept(int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		struct ctl *k = calloc(1, sizeof(*k));
		if (!k) {
			close(fd);
			continue;
		}
		k->fd = fd;
		k->it = (struct item){ K_CTL, k };
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = &k->it };
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) < 0) {
			close(fd);
			free(k);
			continue;
		}
		k->next = ctls;
		if (ctls)
			ctls->prev = k;
		ctls = k;
	}
}

static int resolve(struct route *r, const char *target)
{
	char host[256];
	const char *colon = strrchr(target, ':');
	if (!colon || colon == target || !colon[1] || (size_t)(colon - target) >= sizeof(host)) {
		fprintf(stderr, "faultproxy: target '%s' is not HOST:PORT\n", target);
		return -1;
	}
	const char *h = target;
	size_t hl = (size_t)(colon - target);
	if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(host, h, hl);
	host[hl] = '\0';
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *a;
	int rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc) {
		fprintf(stderr, "faultproxy: %s: %s\n", target, gai_strerror(rc));
		return -1;
	}
	/* "localhost" may list ::1 first; test servers listen on 127.0.0.1. */
	struct addrinfo *pick = res;
	for (a = res; a; a = a->ai_next)
		if (a->ai_family == AF_INET) {
			pick = a;
			break;
		}
	memcpy(&r->addr, pick->ai_addr, pick->ai_addrlen);
	r->addrlen = pick->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int add_fd(int fd, struct item *it)
{
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = it };
	return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
}

#ifndef FAULTPROXY_MAIN
#define FAULTPROXY_MAIN main
#else
int FAULTPROXY_MAIN(int argc, char **argv);
#endif

int FAULTPROXY_MAIN(int argc, char **argv)
{
	int error = 1, ctl_fd = -1, sig_fd = -1;
	struct item ctl_it = { K_CTL_LISTEN, NULL }, sig_it = { K_SIGNAL, NULL }, timer_it = { K_TIMER, NULL };
	if (argc < 3) {
		fprintf(stderr, "usage: faultproxy CONTROL_SOCKET_PATH TARGET_HOST:PORT [TARGET_HOST:PORT ...]\n");
		return 2;
	}
	nroutes = argc - 2;
	routes = calloc((size_t)nroutes, sizeof(*routes));
	if (!routes)
		return 1;
	for (int i = 0; i < nroutes; i++)
		routes[i].lfd = -1;

	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || (sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
	    (timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
	    add_fd(sig_fd, &sig_it) < 0 || add_fd(timer_fd, &timer_it) < 0) {
		perror("faultproxy: setup");
		goto out;
	}

	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	if (strlen(argv[1]) >= sizeof(sun.sun_path)) {
		fprintf(stderr, "faultproxy: control socket path too long\n");
		goto out;
	}
	strcpy(sun.sun_path, argv[1]);
	unlink(argv[1]);
	if ((ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(ctl_fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(ctl_fd, 16) < 0 ||
	    add_fd(ctl_fd, &ctl_it) < 0) {
		fprintf(stderr, "faultproxy: control socket %s: %s\n", argv[1], strerror(errno));
		goto out;
	}

	for (int i = 0; i < nroutes; i++) {
		struct route *r = &routes[i];
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t len = sizeof(sin);
		r->index = i;
		r->it = (struct item){ K_LISTEN, r };
		if (resolve(r, argv[i + 2]) < 0)
			goto out;
		if ((r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0 ||
		    bind(r->lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(r->lfd, 128) < 0 ||
		    getsockname(r->lfd, (struct sockaddr *)&sin, &len) < 0 || add_fd(r->lfd, &r->it) < 0) {
			perror("faultproxy: listen");
			goto out;
		}
		printf("%d\n", ntohs(sin.sin_port));
		const char *bh = getenv("FAULTPROXY_BLACKHOLE");
		if (bh && strcmp(bh, "1") == 0)
			set_mode(r, M_BLACKHOLE, 0);
	}
	printf("ready\n");
	fflush(stdout);

	while (!quitting) {
		struct epoll_event evs[64];
		arm_timer();
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("faultproxy: epoll_wait");
			goto out;
		}
		int timer_fired = 0;
		for (int i = 0; i < n && !quitting; i++) {
			struct item *it = evs[i].data.ptr;
			switch (it->kind) {
			case K_LISTEN:
				on_accept(it->ptr);
				break;
			case K_CLIENT:
			case K_SERVER:
				on_conn_event(it->ptr, it->kind == K_CLIENT ? UP : DOWN, evs[i].events);
				break;
			case K_CTL_LISTEN:
				on_ctl_accept(ctl_fd);
				break;
			case K_CTL:
				on_ctl(it->ptr);
				break;
			case K_SIGNAL: {
				struct signalfd_siginfo si;
				while (read(sig_fd, &si, sizeof(si)) == sizeof(si))
					quitting = 1;
				break;
			}
			case K_TIMER: {
				uint64_t ticks;
				while (read(timer_fd, &ticks, sizeof(ticks)) == sizeof(ticks))
					;
				timer_armed = -1;
				timer_fired = 1;
				break;
			}
			}
		}
		if (timer_fired) {
			int64_t now = now_ns();
			for (int i = 0; i < nroutes; i++) {
				if (routes[i].delay_ns || routes[i].lag_until)
					pump_route(&routes[i]);
				if (routes[i].lag_until && routes[i].lag_until <= now)
					routes[i].lag_until = 0;
			}
		}
		bury();
	}
	error = 0;
out:
	while (ctls)
		ctl_close(ctls);
	for (int i = 0; i < nroutes; i++) {
		while (routes[i].conns)
			conn_close(routes[i].conns, 0);
		if (routes[i].lfd >= 0)
			close(routes[i].lfd);
	}
	bury();
	free(routes);
	if (ctl_fd >= 0) {
		close(ctl_fd);
		unlink(argv[1]);
	}
	if (sig_fd >= 0)
		close(sig_fd);
	if (timer_fd >= 0)
		close(timer_fd);
	if (ep >= 0)
		close(ep);
	return error;
}
