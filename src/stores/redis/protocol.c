/*
 * What the Redis and Redlock stores share of the protocol: servers and their
 * connection handshake, replies of bounded size, I/O bounded by a deadline,
 * the key layout and the scripts' arguments, and reply decoding (redis.h).
 */
#include "redis.h"
#include "redis_lua.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* servers, connections, errors                                              */
/* ------------------------------------------------------------------------ */

/* Re-raise the last error with another code and a prefix (copies first: the
 * message lives in the buffer dlock_error_set writes). */
int dlock__rrewrap(int code, const char *kind, const char *prefix)
{
	char msg[512], sc[64];
	snprintf(msg, sizeof(msg), "%s", dlock_error_last()->message);
	snprintf(sc, sizeof(sc), "%s", dlock_error_last()->store_code);
	return dlock_error_set(code, kind, sc, "%s%s", prefix, msg);
}

int dlock__rserver_parse(dlock__rserver **out, size_t *n, dlock_uri *uri, const char *kind, int default_port,
			 const char *dbpath)
{
	*out = NULL;
	*n = 0;
	if (!uri->hosts || !*uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "%s:// needs a host: %s://host:port", uri->scheme,
				       uri->scheme);
	size_t esc = 0; /* each escaped character takes 3 bytes in the keys */
	for (const char *p = uri->prefix; *p; p++)
		esc += strchr(":%{}", *p) ? 3 : 1;
	if (esc > DLOCK__REDIS_PREFIX_MAX - 4)
		return dlock_error_set(DLOCK_EINVAL, kind, NULL, "prefix is too long (%zu bytes in keys; at most %d)",
				       esc, DLOCK__REDIS_PREFIX_MAX - 4);
	int db = 0;
	const char *p = dbpath ? dbpath : "";
	if (*p == '/')
		p++;
	if (*p) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (errno || *end || v < 0 || v > 100000 || end == p)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL,
					       "bad database number '%s' in the URI path (want /0, /1, ...)", p);
		db = (int)v;
	}
	int64_t timeout = uri->connect_timeout_ms < 2000 ? uri->connect_timeout_ms : 2000;
	const char *t = dlock_uri_param(uri, "timeout");
	if (t) {
		int rc = dlock_duration_parse(&timeout, t);
		if (rc)
			return dlock__rrewrap(DLOCK_EINVAL, kind, "option timeout: ");
		if (timeout < 1)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL, "timeout must be at least 1 ms");
	}
	dlock__rtls *tls = NULL;
	int rc = dlock__rtls_parse(&tls, uri, kind);
	if (rc)
		return rc;
	dlock_hostport *hp = NULL;
	size_t nh = 0;
	if ((rc = dlock_uri_hosts(uri, default_port, &hp, &nh))) {
		dlock__rtls_free(tls);
		return rc;
	}
	dlock__rserver *s = dlock_sys_calloc(nh ? nh : 1, sizeof(*s));
	if (!s) {
		dlock_free(hp);
		dlock__rtls_free(tls);
		return DLOCK_ENOMEM;
	}
	s[0].tls_owner = true;
	for (size_t i = 0; i < nh; i++) {
		if (uri->password && !tls && !dlock_sys_host_is_local(hp[i].host))
			dlock_sys_open_warning(
				"%s: the password and the lock traffic go to %s over plain TCP, which a "
				"man in the middle can read (use rediss://, or tls=yes)",
				kind, hp[i].host);
		s[i].tls = tls;
		snprintf(s[i].host, sizeof(s[i].host), "%s", hp[i].host);
		s[i].port = hp[i].port;
		s[i].user = uri->user && *uri->user ? uri->user : NULL; /* ":pw@": default user */
		s[i].password = uri->password;
		s[i].db = db;
		s[i].connect_timeout_ms = uri->connect_timeout_ms;
		s[i].timeout_ms = timeout;
	}
	dlock_free(hp);
	if (uri->user && !uri->password) {
		dlock__rservers_free(s);
		return dlock_error_set(DLOCK_EINVAL, kind, NULL,
				       "a user name without a password: write %s://user:password@host", uri->scheme);
	}
	*out = s;
	*n = nh;
	return 0;
}

int dlock__rconn_error(const redisContext *c, const dlock__rserver *srv, const char *kind)
{
	const char *what = c && c->errstr[0] ? c->errstr : "connection lost";
	if (c && c->err == REDIS_ERR_EOF)
		what = "server closed the connection";
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind,
			       !c                             ? "ECONN"
			       : c->err == REDIS_ERR_IO       ? "EIO"
			       : c->err == REDIS_ERR_PROTOCOL ? "EPROTO"
							      : "ECONN",
			       "%s %s:%d: %s", kind, srv->host, srv->port, what);
}

int dlock__rreply_error(const redisReply *r, const dlock__rserver *srv, const char *kind)
{
	char code[32];
	size_t i = 0;
	const char *s = r && r->str ? r->str : "";
	while (s[i] && s[i] != ' ' && i < sizeof(code) - 1) {
		code[i] = s[i];
		i++;
	}
	code[i] = 0;
	int rc = DLOCK_ESTORE;
	if (!strcmp(code, "NOAUTH") || !strcmp(code, "WRONGPASS") || !strcmp(code, "NOPERM") ||
	    strstr(s, "invalid password") || strstr(s, "invalid username-password"))
		rc = DLOCK_EAUTH;
	else if (!strcmp(code, "LOADING") || !strcmp(code, "BUSY") || !strcmp(code, "MASTERDOWN") ||
		 !strcmp(code, "TRYAGAIN") || !strcmp(code, "CLUSTERDOWN"))
		rc = DLOCK_EUNAVAILABLE;
	return dlock_error_set(rc, kind, code, "%s %s:%d: %s", kind, srv->host, srv->port, s);
}

/* ---- replies of bounded size (a hostile or broken server) ---- */

/*
 * hiredis 0.14 buffers a whole bulk string before it makes the reply, and
 * allocates an array's pointers (and then each element) as the header says:
 * "$2000000000" or "*25000000" would make the client allocate gigabytes.
 * Every read goes through dlock__rbuffer_read, which refuses a buffer of
 * unparsed reply bytes over DLOCK__REDIS_REPLY_MAX_BYTES, and the reader's
 * createArray is wrapped to refuse a reply whose arrays together announce
 * more than DLOCK__REDIS_REPLY_MAX_ELEMENTS elements (counted in the
 * reader's privdata, which hiredis does not use). Either sets a protocol
 * error on the context: the caller drops the connection.
 */
static redisReplyObjectFunctions base_fn, capped_fn;
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;

static redisReader *reader_of(const redisReadTask *t)
{
	while (t->parent)
		t = t->parent;
	/* the root task is rstack[0] of its reader */
	return (redisReader *)(void *)((char *)(uintptr_t)t - offsetof(redisReader, rstack));
}

static void *capped_array(const redisReadTask *t, int elements)
{
	redisReader *r = reader_of(t);
	uintptr_t seen = t->parent ? (uintptr_t)r->privdata : 0;
	seen += elements > 0 ? (uintptr_t)elements : 0;
	r->privdata = (void *)seen;
	if (seen > DLOCK__REDIS_REPLY_MAX_ELEMENTS)
		return NULL; /* hiredis reports "Out of memory"; dlock__rget_reply renames it */
	return base_fn.createArray(t, elements);
}

static void capped_init(void)
{
	redisReader *r = redisReaderCreate();
	if (!r)
		abort();
	base_fn = capped_fn = *r->fn;
	capped_fn.createArray = capped_array;
	redisReaderFree(r);
}

static void capped_install(redisContext *c)
{
	if (c->reader->fn != &capped_fn) {
		pthread_once(&capped_once, capped_init);
		c->reader->fn = &capped_fn;
		c->reader->privdata = NULL;
	}
}

static int refuse(redisContext *c, const char *fmt, unsigned long cap)
{
	c->err = REDIS_ERR_PROTOCOL;
	snprintf(c->errstr, sizeof(c->errstr), fmt, cap);
	return REDIS_ERR;
}

int dlock__rbuffer_read(redisContext *c)
{
	capped_install(c);
	bool tls;
	if (dlock__rtls_read(c, &tls) != REDIS_OK || (!tls && redisBufferRead(c) != REDIS_OK))
		return REDIS_ERR;
	if (c->reader->len - c->reader->pos > DLOCK__REDIS_REPLY_MAX_BYTES)
		return refuse(c, "reply refused: more than %lu MiB (a hostile or broken server?)",
			      (unsigned long)DLOCK__REDIS_REPLY_MAX_BYTES >> 20);
	return REDIS_OK;
}

int dlock__rget_reply(redisContext *c, void **reply)
{
	capped_install(c);
	if (redisGetReplyFromReader(c, reply) == REDIS_OK)
		return REDIS_OK;
	if ((uintptr_t)c->reader->privdata > DLOCK__REDIS_REPLY_MAX_ELEMENTS)
		return refuse(c, "reply refused: more than %lu elements (a hostile or broken server?)",
			      (unsigned long)DLOCK__REDIS_REPLY_MAX_ELEMENTS);
	return REDIS_ERR;
}

/* ---- I/O bounded by a deadline ---- */

enum { IO_OK = 0, IO_ERR = -1, IO_TIMEOUT = -2 };

int64_t dlock__rms_left(int64_t deadline)
{
	int64_t left = deadline - dlock_clock_ms();
	return left > 0 ? left : 0;
}

/* 1: fd ready for ev; 0: the deadline passed; -1: poll failed. */
static int fd_wait(int fd, short ev, int64_t deadline)
{
	for (;;) {
		int64_t left = dlock__rms_left(deadline);
		if (left <= 0)
			return 0;
		struct pollfd p = { fd, ev, 0 };
		int r = poll(&p, 1, left > 60000 ? 60000 : (int)left);
		if (r > 0)
			return 1;
		if (r < 0 && errno != EINTR)
			return -1;
	}
}

/* Write what is buffered by the deadline. Works on blocking sockets too (poll
 * first: a short command then goes out in one write). */
static int io_flush(redisContext *c, int64_t deadline)
{
	int done = 0;
	for (;;) {
		if (dlock__rbuffer_write(c, &done) != REDIS_OK)
			return IO_ERR;
		if (done)
			return IO_OK;
		int w = fd_wait(c->fd, POLLOUT, deadline);
		if (w <= 0)
			return w == 0 ? IO_TIMEOUT : IO_ERR;
	}
}

int dlock__rflush_by(redisContext *c, int64_t deadline)
{
	return io_flush(c, deadline) == IO_OK ? 0 : -1;
}

/* Flush, then read the next reply by the deadline. */
static int io_reply(redisContext *c, int64_t deadline, redisReply **out)
{
	*out = NULL;
	int rc = io_flush(c, deadline);
	if (rc)
		return rc;
	for (;;) {
		void *v = NULL;
		if (dlock__rget_reply(c, &v) != REDIS_OK)
			return IO_ERR;
		if (v) {
			*out = v;
			return IO_OK;
		}
		int w = fd_wait(c->fd, POLLIN, deadline);
		if (w <= 0)
			return w == 0 ? IO_TIMEOUT : IO_ERR;
		if (dlock__rbuffer_read(c) != REDIS_OK)
			return IO_ERR;
	}
}

static int io_error(int io, const redisContext *c, const dlock__rserver *srv, const char *kind)
{
	if (io == IO_TIMEOUT)
		return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "ETIMEDOUT",
				       "%s %s:%d: timed out waiting for the server", kind, srv->host, srv->port);
	if (c->err)
		return dlock__rconn_error(c, srv, kind);
	return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "EIO", "%s %s:%d: %s", kind, srv->host, srv->port,
			       strerror(errno));
}

int dlock__rread_by(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline, redisReply **out)
{
	int io = io_reply(c, deadline, out);
	return io ? io_error(io, c, srv, kind) : 0;
}

void dlock__rsock_setup(redisContext *c, int64_t timeout_ms)
{
	int fd = c->fd, on = 1;
	int idle = (int)(timeout_ms / 1000) > 1 ? (int)(timeout_ms / 1000) : 1, intvl = 1, cnt = 3;
	/* a silent peer (cut cable, dead host) is noticed by the kernel: keepalive
	 * probes on an idle socket, and unacknowledged data (or probes) kill the
	 * connection after TCP_USER_TIMEOUT */
	unsigned int user = (unsigned int)(timeout_ms > 1000 ? timeout_ms : 1000) + (unsigned int)(idle + 3) * 1000;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
}

static int simple_cmd(redisContext *c, const dlock__rserver *srv, const char *kind, int argc, const char **argv,
		      int64_t deadline)
{
	redisReply *r = NULL;
	redisAppendCommandArgv(c, argc, argv, NULL);
	int rc = dlock__rread_by(c, srv, kind, deadline, &r);
	if (rc)
		return rc;
	if (r->type == REDIS_REPLY_ERROR)
		rc = dlock__rreply_error(r, srv, kind);
	freeReplyObject(r);
	return rc;
}

/* connect + AUTH + SELECT by the deadline; nonblock: leave the socket non-blocking. */
static int connect_by(redisContext **out, const dlock__rserver *srv, const char *kind, int64_t deadline, bool nonblock)
{
	*out = NULL;
	int64_t ct = dlock__rms_left(deadline);
	if (ct > srv->connect_timeout_ms)
		ct = srv->connect_timeout_ms;
	if (ct <= 0)
		return dlock_error_set(DLOCK_EUNAVAILABLE, kind, "ETIMEDOUT", "cannot connect to %s %s:%d: timed out",
				       kind, srv->host, srv->port);
	/* hiredis resolves with a blocking getaddrinfo: resolve by the deadline
	 * here and hand it the addresses, tried in order within the same bound */
	int64_t end = dlock_clock_ms() + ct;
	dlock_sys_addrs ad;
	int rrc = dlock_sys_resolve(&ad, srv->host, end, kind);
	if (rrc)
		return rrc;
	redisContext *c = NULL;
	for (size_t i = 0; i < (ad.n ? ad.n : 1); i++) {
		int64_t left = end - dlock_clock_ms();
		if (c) {
			if (left <= 0)
				break;
			dlock__rfree(c);
		}
		c = redisConnectWithTimeout(ad.n ? ad.addr[i] : srv->host, srv->port,
					    dlock_sys_ms_timeval(left > 0 ? left : 1));
		if (!c)
			return dlock_sys_oom();
		if (!c->err)
			break;
	}
	if (c->err) {
		bool to = c->err == REDIS_ERR_IO && (strstr(c->errstr, "timed out") || strstr(c->errstr, "Timeout"));
		int rc = dlock_error_set(DLOCK_EUNAVAILABLE, kind, to ? "ETIMEDOUT" : "ECONN",
					 "cannot connect to %s %s:%d: %s%s", kind, srv->host, srv->port, c->errstr,
					 to && !strstr(c->errstr, "timed out") ? " (timed out)" : "");
		dlock__rfree(c);
		return rc;
	}
	/* hiredis makes its socket without close-on-exec: no program the caller
	 * starts (dlock run's COMMAND) may inherit it. */
	int fdfl = fcntl(c->fd, F_GETFD);
	if (fdfl >= 0)
		(void)fcntl(c->fd, F_SETFD, fdfl | FD_CLOEXEC);
	dlock__rsock_setup(c, srv->timeout_ms);
	int trc = dlock__rtls_connect(c, srv, kind, end); /* within what is left of connect_timeout */
	if (trc) {
		dlock__rfree(c);
		return trc;
	}
	if (nonblock) {
		/* every read and write goes through poll with the caller's deadline */
		int fl = fcntl(c->fd, F_GETFL);
		if (fl >= 0)
			fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
		c->flags &= ~REDIS_BLOCK;
	} else {
		redisSetTimeout(c, dlock_sys_ms_timeval(srv->timeout_ms));
	}
	int rc = 0;
	if (srv->password) {
		/* "redis://:pw@host" parses with an empty user: that is the default
		 * user's password (AUTH pw), not a user named "". */
		const char *user = srv->user && *srv->user ? srv->user : NULL;
		const char *a[3] = { "AUTH", user ? user : srv->password, srv->password };
		rc = simple_cmd(c, srv, kind, user ? 3 : 2, a, deadline);
		if (rc == DLOCK_ESTORE) /* e.g. "ERR AUTH <password> called without any password configured" */
			rc = dlock__rrewrap(DLOCK_EAUTH, kind, "");
	}
	if (!rc && srv->db) {
		char db[16];
		snprintf(db, sizeof(db), "%d", srv->db);
		const char *a[2] = { "SELECT", db };
		rc = simple_cmd(c, srv, kind, 2, a, deadline);
		if (rc == DLOCK_ESTORE)
			rc = dlock__rrewrap(DLOCK_EINVAL, kind, "cannot use the database of the URI path: ");
	}
	if (rc) {
		dlock__rfree(c);
		return rc;
	}
	*out = c;
	return 0;
}

int dlock__rconnect_by(redisContext **out, const dlock__rserver *srv, const char *kind, int64_t deadline)
{
	return connect_by(out, srv, kind, deadline, true);
}

int dlock__rconnect(redisContext **out, const dlock__rserver *srv, const char *kind)
{
	return connect_by(out, srv, kind, dlock_clock_ms() + srv->connect_timeout_ms + 2 * srv->timeout_ms, false);
}

/* ------------------------------------------------------------------------ */
/* keys and arguments                                                        */
/* ------------------------------------------------------------------------ */

/*
 * The prefix as it appears in keys: ':' (which ends it), '%' (the escape) and
 * the hash-tag braces are percent-escaped, so "{P:NAME}" is injective: prefix
 * "app" + name "jobs:x" and prefix "app:jobs" + name "x" are different keys.
 * A prefix without those characters (the default "dlock") is unchanged.
 */
size_t dlock__rprefix_enc(char *out, size_t cap, const char *prefix)
{
	size_t o = 0;
	for (const char *p = prefix; *p && o + 4 < cap; p++) {
		if (strchr(":%{}", *p))
			o += (size_t)snprintf(out + o, cap - o, "%%%02X", (unsigned char)*p);
		else
			out[o++] = *p;
	}
	out[o] = 0;
	return o;
}

void dlock__rkeys_make(dlock__rkeys *k, const char *prefix, const char *name)
{
	static const char *const suffix[DLOCK__RK_COUNT] = { "", ":c" };
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	dlock__rprefix_enc(pe, sizeof(pe), prefix);
	for (int i = 0; i < DLOCK__RK_COUNT; i++) {
		int n = snprintf(k->k[i], sizeof(k->k[i]), "{%s:%s}%s", pe, name, suffix[i]);
		k->len[i] = (size_t)n < sizeof(k->k[i]) ? (size_t)n : sizeof(k->k[i]) - 1;
	}
}

static void arg(dlock__rargs *a, const char *s, size_t len)
{
	a->argv[a->argc] = s;
	a->lens[a->argc] = len;
	a->argc++;
}

void dlock__rargs_add(dlock__rargs *a, const char *s)
{
	arg(a, s, strlen(s));
}

static void arg_i(dlock__rargs *a, int slot, long long v)
{
	int n = snprintf(a->nums[slot], sizeof(a->nums[slot]), "%lld", v);
	arg(a, a->nums[slot], (size_t)n);
}

static void arg_key(dlock__rargs *a, const dlock__rkeys *k, int which)
{
	arg(a, k->k[which], k->len[which]);
}

/* Marks a request registered as a waiter by an earlier refused try (req->slot). */
static char registered_mark;

void dlock__rargs_acquire(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req, int64_t ticket)
{
	a->argc = 2;
	dlock__rargs_add(a, "1");
	arg_key(a, k, DLOCK__RK_H);
	dlock__rargs_add(a, req->owner);
	arg_i(a, 0, req->ttl_ms);
	a->flags[0] = req->mode == DLOCK_SHARED ? 's' : 'x';
	a->flags[1] = req->fair ? '1' : '0';
	a->flags[2] = !req->waiting ? '0' : req->slot == &registered_mark ? '2' : '1';
	a->flags[3] = 0;
	arg(a, a->flags, 3);
	arg_i(a, 1, req->permits);
	arg_i(a, 2, req->queue_ttl_ms);
	int n = snprintf(a->meta, sizeof(a->meta), "%d %s", req->pid, req->host ? req->host : "");
	arg(a, a->meta, (size_t)n < sizeof(a->meta) ? (size_t)n : sizeof(a->meta) - 1);
	if (ticket > 0)
		arg_i(a, 3, ticket);
	else
		dlock__rargs_add(a, "");
}

void dlock__racquire_done(const dlock_request *req, int rc, dlock_grant *out)
{
	if (rc == DLOCK_ELOCKED && req->waiting)
		out->slot = &registered_mark;
	else if (rc == 0)
		out->slot = NULL;
}

void dlock__rargs_owner(dlock__rargs *a, const dlock__rkeys *k, const dlock_request *req)
{
	a->argc = 2;
	dlock__rargs_add(a, "1");
	arg_key(a, k, DLOCK__RK_H);
	dlock__rargs_add(a, req->owner);
}

void dlock__rargs_status(dlock__rargs *a, const dlock__rkeys *k)
{
	a->argc = 2;
	dlock__rargs_add(a, "1");
	arg_key(a, k, DLOCK__RK_H);
}

/* ------------------------------------------------------------------------ */
/* replies                                                                   */
/* ------------------------------------------------------------------------ */

int dlock__rbad_reply(const char *kind, const char *what)
{
	return dlock_error_set(DLOCK_ESTORE, kind, NULL, "unexpected reply from %s to %s", kind, what);
}

int dlock__rreply_int(const redisReply *r, long long *v)
{
	if (r->type == REDIS_REPLY_INTEGER) {
		*v = r->integer;
		return 0;
	}
	if (r->type == REDIS_REPLY_STRING) {
		char *end;
		errno = 0;
		*v = strtoll(r->str, &end, 10);
		return errno || end == r->str || *end ? -1 : 0;
	}
	return -1;
}

int dlock__racquire_reply(const redisReply *r, uint64_t *fence, int64_t *retry_ms, const char *kind)
{
	long long ok, v;
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->elements > 3 ||
	    dlock__rreply_int(r->element[0], &ok) || dlock__rreply_int(r->element[1], &v))
		return dlock__rbad_reply(kind, "acquire");
	if (ok == 1) {
		*fence = (uint64_t)v;
		return 0;
	}
	if (retry_ms)
		*retry_ms = v;
	return DLOCK_ELOCKED;
}

int dlock__rstatus_decode(const redisReply *r, const char *name, dlock_lock_status **out, size_t *count,
			  const char *kind)
{
	long long now, fence, waiters;
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || dlock__rreply_int(r->element[0], &now) ||
	    dlock__rreply_int(r->element[1], &fence) || r->element[2]->type != REDIS_REPLY_ARRAY ||
	    dlock__rreply_int(r->element[3], &waiters))
		return dlock__rbad_reply(kind, "status");
	dlock_lock_status *st = dlock_sys_status_add(out, count);
	if (!st || !(st->name = dlock_sys_strdup(name)))
		return DLOCK_ENOMEM;
	st->last_fence = (uint64_t)fence;
	st->waiters = (size_t)waiters;
	const redisReply *h = r->element[2];
	unsigned int permits = 1;
	for (size_t i = 0; i + 1 < h->elements; i += 2) {
		const redisReply *k = h->element[i], *v = h->element[i + 1];
		if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		long long exp, f;
		char mode;
		unsigned int p;
		int pid, used = 0;
		if (sscanf(v->str, "%lld %lld %c %u %d %n", &exp, &f, &mode, &p, &pid, &used) < 5 || exp <= now)
			continue; /* expired holders are gone, even if not yet pruned */
		permits = p;
		dlock_holder *ho = dlock_sys_status_add_holder(st);
		if (!ho || !(ho->owner = dlock_sys_strdup(k->str)) ||
		    !(ho->host = dlock_sys_strdup(used ? v->str + used : "")))
			return DLOCK_ENOMEM;
		ho->pid = pid;
		ho->mode = mode == 's' ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		ho->fence = (uint64_t)f;
		ho->ttl_left_ms = exp - now;
	}
	st->permits = st->nholders && permits > 1 ? permits : 1;
	return 0;
}

int dlock__rbatch_renew(dlock__rbatch *b, const char *prefix, const dlock_request *const *reqs, size_t n)
{
	/* one script call for the whole batch: keys, then (owner, ttl) pairs */
	memset(b, 0, sizeof(*b));
	b->argc = (int)(3 + 3 * n);
	b->argv = calloc((size_t)b->argc, sizeof(*b->argv));
	b->lens = calloc((size_t)b->argc, sizeof(*b->lens));
	b->keys = malloc(n * DLOCK__REDIS_KEY_MAX);
	b->nums = malloc(n * 24 + 24);
	if (!b->argv || !b->lens || !b->keys || !b->nums) {
		dlock__rbatch_free(b);
		return dlock_sys_oom();
	}
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	dlock__rprefix_enc(pe, sizeof(pe), prefix);
	snprintf(b->nums + n * 24, 24, "%zu", n);
	b->argv[2] = b->nums + n * 24;
	b->lens[2] = strlen(b->argv[2]);
	for (size_t i = 0; i < n; i++) {
		char *key = b->keys + i * DLOCK__REDIS_KEY_MAX;
		int kl = snprintf(key, DLOCK__REDIS_KEY_MAX, "{%s:%s}", pe, reqs[i]->name);
		b->argv[3 + i] = key;
		b->lens[3 + i] = (size_t)kl;
		b->argv[3 + n + 2 * i] = reqs[i]->owner;
		b->lens[3 + n + 2 * i] = strlen(reqs[i]->owner);
		int nl = snprintf(b->nums + i * 24, 24, "%lld", (long long)reqs[i]->ttl_ms);
		b->argv[3 + n + 2 * i + 1] = b->nums + i * 24;
		b->lens[3 + n + 2 * i + 1] = (size_t)nl;
	}
	return 0;
}

void dlock__rbatch_free(dlock__rbatch *b)
{
	free(b->argv);
	free(b->lens);
	free(b->keys);
	free(b->nums);
	memset(b, 0, sizeof(*b));
}

int dlock__rrenew_reply(const redisReply *r, size_t n, int *results, const char *kind)
{
	if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
		return dlock__rbad_reply(kind, "renew");
	for (size_t i = 0; i < n; i++) {
		long long v = 0;
		results[i] = dlock__rreply_int(r->element[i], &v) == 0 && v >= 1 ? 0 : DLOCK_ENOTHELD;
	}
	return 0;
}

static const char confirm_lua[] = DLOCK__LUA_CONFIRM;

long long dlock__rwait_replicas(redisContext *c, const dlock__rserver *srv, const char *kind, int n, long long reserve,
				const dlock__rkeys *k, const char *server_id, int64_t deadline, bool *drop)
{
	*drop = false;
	int64_t left = dlock__rms_left(deadline);
	int64_t margin = left / 5 > 10 ? left / 5 : 10; /* for the reply to come back in time */
	if (left - margin < 1)
		return -1;
	char num[16], ms[24];
	snprintf(num, sizeof(num), "%d", n);
	snprintf(ms, sizeof(ms), "%lld", (long long)(left - margin));
	const char *argv[3] = { "WAIT", num, ms };
	redisReply *r = NULL;
	redisAppendCommandArgv(c, 3, argv, NULL);
	if (dlock__rread_by(c, srv, kind, deadline, &r) != 0) {
		*drop = true;
		return -2;
	}
	long long acked = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	freeReplyObject(r);
	if (acked >= n && reserve > 0) { /* best effort: unconfirmed, the next grant waits again */
		char rv[24];
		snprintf(rv, sizeof(rv), "%lld", reserve);
		const char *cv[6] = { "EVAL", confirm_lua, "1", k->k[DLOCK__RK_H], rv, server_id };
		size_t lens[6] = { 4, sizeof(confirm_lua) - 1, 1, k->len[DLOCK__RK_H], strlen(rv), strlen(server_id) };
		redisAppendCommandArgv(c, 6, cv, lens);
		if (dlock__rread_by(c, srv, kind, deadline, &r) != 0)
			*drop = true; /* the grant stands; the next one confirms again */
		else
			freeReplyObject(r);
	}
	return acked;
}

int dlock__rreplicas_option(dlock_uri *uri, const char *kind, int *wait, int *fence)
{
	const char *opt[2] = { "wait_replicas", "fence_replicas" };
	int *val[2] = { wait, fence };
	for (int i = 0; i < 2; i++) {
		const char *v = dlock_uri_param(uri, opt[i]);
		if (!v)
			continue;
		char *end;
		errno = 0;
		long x = strtol(v, &end, 10);
		if (errno || end == v || *end || x < 0 || x > 100)
			return dlock_error_set(DLOCK_EINVAL, kind, NULL,
					       "option %s: want a number of replicas (0-100), not '%s'", opt[i], v);
		*val[i] = (int)x;
	}
	return 0;
}

int dlock__rrun_id(redisContext *c, const dlock__rserver *srv, const char *kind, int64_t deadline, char *out,
		   size_t cap)
{
	out[0] = 0;
	redisReply *r = NULL;
	redisAppendCommand(c, "INFO server");
	int rc = dlock__rread_by(c, srv, kind, deadline, &r);
	if (rc)
		return rc;
	const char *p = r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
	if (p)
		snprintf(out, cap, "%.*s", (int)strcspn(p + 7, "\r\n"), p + 7);
	freeReplyObject(r);
	if (!out[0])
		return dlock_error_set(DLOCK_ESTORE, kind, NULL, "%s:%d: INFO server has no run_id (fence guard)",
				       srv->host, srv->port);
	return 0;
}

int dlock__rload_scripts(redisContext *c, const dlock__rserver *srv, const char *kind, const char *const *text,
			 char (*sha)[41], int64_t deadline, bool *broken)
{
	*broken = false;
	for (int i = 0; i < DLOCK__RS_COUNT; i++) {
		const char *argv[3] = { "SCRIPT", "LOAD", text[i] };
		redisAppendCommandArgv(c, 3, argv, NULL);
	}
	int rc = 0;
	for (int i = 0; i < DLOCK__RS_COUNT; i++) {
		redisReply *r = NULL;
		int e = dlock__rread_by(c, srv, kind, deadline, &r);
		if (e) {
			*broken = true;
			return e;
		}
		if (r->type == REDIS_REPLY_STRING && r->len == 40)
			memcpy(sha[i], r->str, 41);
		else if (r->type == REDIS_REPLY_ERROR && !rc)
			rc = dlock__rreply_error(r, srv, kind);
		freeReplyObject(r);
	}
	return rc;
}
