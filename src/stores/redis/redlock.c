/*
 * The Redlock store: N >= 3 independent Redis masters, a lock is held when a
 * quorum (N/2 + 1) granted it within its validity. Every request goes to all
 * masters at once (one poll loop over N connections), each with a per-master
 * timeout well below the TTL. The scripts, key layout, connection handshake
 * and pub/sub notifier are the Redis store's (redis.h); this file adds
 * the fan-out, the quorum rules and the fence rule:
 *
 *   fence = max over the granting quorum of each master's INCR, then a second
 *   parallel round raises every master's counter to max(counter, fence), and
 *   acquire succeeds only when a quorum confirmed it. Any later grant's quorum
 *   intersects that one, so its INCRs start above the fence (proof and limits:
 *   docs/stores/redlock.md).
 */
#include "redis.h"
#include "redis_lua.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KIND "redlock"
#define QUIET_MS 1000

/*
 * A script of this store's own (lua/redlock_repair.lua), after the Redis
 * store's (redis.h; its RENEW answers the fence that a repair writes back):
 *
 * REPAIR: KEYS H1..Hn; ARGV owner1 ttl1 tail1 ... with tail = "fence mode
 *   permits pid host" (the hold's value after its expiry) -> per key 1 (the
 *   hold is here after all: renewed), 2 (it was missing and nobody else holds
 *   here: written back, and the fence counter raised to at least its fence)
 *   or 0 (another holder is in the way: nothing changed).
 */
enum { RL_REPAIR = DLOCK__RS_COUNT, RL_NSCRIPTS };

static const char *const rl_script_text[RL_NSCRIPTS - DLOCK__RS_COUNT] = {
	[RL_REPAIR - DLOCK__RS_COUNT] = DLOCK__LUA_REDLOCK_REPAIR,
};

static const char *script_text(int i)
{
	return i < DLOCK__RS_COUNT ? dlock__rscript_text[i] : rl_script_text[i - DLOCK__RS_COUNT];
}

typedef struct redlock_store {
	dlock_backend base;
	dlock__rserver *srv;
	size_t n;
	size_t quorum;
	char *user, *password, *prefix;
	double drift;
	int64_t retry_ms;
	int64_t request_timeout_ms; /* status and list, from their start */
	redisContext **c;
	int64_t *quiet_until; /* a master whose connect just failed is left alone until then */
	struct rl_owed *owed; /* per master: replies still to come from rounds that did not wait */
	char sha[RL_NSCRIPTS][41];
	dlock__rnotify *nt;
} redlock_store;

/* A round's command: EVALSHA of `script` (>= 0; argv[0..1] are filled in
 * per master: EVAL and the text where the master may lack the script) or,
 * script < 0, argv as it is. A master's rl_op may carry its own argv. */
typedef struct rl_cmd {
	int script;
	int argc;
	const char **argv;
	size_t *lens;
} rl_cmd;

/* One master's part of a parallel round. */
typedef struct rl_op {
	redisReply *reply; /* the answer (owned), NULL on failure */
	int rc;            /* 0, or why there is no reply */
	int skip;          /* handshake replies (AUTH, SELECT) still to read first */
	bool auth;         /* the first of them answers AUTH */
	bool done, eval, want;
	bool force;        /* ask even a master that timed out recently (undo) */
	bool sent;         /* the request went out: it may have been applied */
	bool answered;     /* the server answered the request (reply or error) */
	bool hs;           /* a fresh TLS connection still in its handshake (the request not sent yet) */
	short hs_events;   /* what the handshake waits for */
	int64_t hs_until;  /* its deadline (connect_timeout) */
	/* a command of this master's own for this round (NULL: the round's) */
	int argc;
	const char **argv;
	size_t *lens;
} rl_op;

static redlock_store *RL(dlock_backend *be)
{
	return (redlock_store *)be;
}

static struct timeval ms_tv(int64_t ms)
{
	return dlock_sys_ms_timeval(ms < 1 ? 1 : ms);
}

/* Longest wait for one master's answer: the `timeout` option. A round does
 * not wait that long for a slow master once the answers it has decide the
 * request (see rl_round), so a hung master costs little. */
static int64_t master_timeout(const redlock_store *s)
{
	return s->srv[0].timeout_ms;
}

/* Replies owed on one connection before it may carry a new request's answer:
 * beyond this the master is treated as gone (its connection dropped). */
#define OWED_MAX 64
/* Raises of a master found behind, kept for its next round; beyond this the
 * oldest is forgotten (the master stays behind, as a silent one does). */
#define RAISE_MAX 8

/*
 * An acquire whose round did not wait for every master (a far zone answers
 * after the quorum). Its late replies are still read: a master that granted
 * it below the fence handed out is behind, and is raised to that fence before
 * its next request, so that masters left behind do not add up to a quorum.
 */
typedef struct rl_grant {
	int refs;
	uint64_t top; /* the fence of the grant; 0 while unknown */
	char key[DLOCK__REDIS_KEY_MAX];
} rl_grant;

typedef struct rl_owed {
	rl_grant *late[OWED_MAX]; /* per owed reply, oldest first: its acquire, or NULL (skip it) */
	unsigned head, n;
	rl_grant *raise[RAISE_MAX]; /* raises to send before the master's next request */
	unsigned nraise;
} rl_owed;

static void grant_put(rl_grant *g)
{
	if (g && --g->refs == 0)
		free(g);
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static void drop(redlock_store *s, size_t i)
{
	if (s->c[i])
		dlock__rfree(s->c[i]);
	s->c[i] = NULL;
	if (!s->owed)
		return;
	rl_owed *o = &s->owed[i];
	for (; o->n; o->n--, o->head = (o->head + 1) % OWED_MAX)
		grant_put(o->late[o->head]);
	o->head = 0;
	while (o->nraise)
		grant_put(o->raise[--o->nraise]);
}

/* One more reply owed by master i: that of acquire g's request, or (NULL) one
 * to skip. false: too many were owed, and the connection was dropped. */
static bool owe(redlock_store *s, size_t i, rl_grant *g)
{
	rl_owed *o = &s->owed[i];
	if (o->n == OWED_MAX) {
		drop(s, i);
		return false;
	}
	o->late[(o->head + o->n++) % OWED_MAX] = g;
	if (g)
		g->refs++;
	return true;
}

/* A late reply r of master i (owned): if it is a grant below its acquire's
 * fence, the master is raised before its next request. */
static void late_reply(redlock_store *s, size_t i, redisReply *r)
{
	rl_owed *o = &s->owed[i];
	rl_grant *g = o->late[o->head];
	o->head = (o->head + 1) % OWED_MAX;
	o->n--;
	uint64_t f = 0;
	int64_t retry;
	dlock_sys_saved_error saved;
	dlock_sys_error_save(&saved);
	if (g && g->top && dlock__racquire_reply(r, &f, &retry, KIND) == 0 && f < g->top) {
		if (o->nraise == RAISE_MAX) {
			grant_put(o->raise[0]);
			memmove(o->raise, o->raise + 1, (RAISE_MAX - 1) * sizeof(*o->raise));
			o->nraise--;
		}
		o->raise[o->nraise++] = g;
		g = NULL; /* the raise list has its reference now */
	}
	dlock_sys_error_restore(&saved);
	freeReplyObject(r);
	grant_put(g);
}

/* A request that got no answer; `keep` when nothing was sent on the
 * connection (it carries no request whose reply could come late). */
static int op_fail_keep(redlock_store *s, rl_op *op, size_t i, const char *what, bool keep)
{
	op->rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "EIO", "redlock master %s:%d: %s", s->srv[i].host,
				 s->srv[i].port, what);
	op->done = true;
	if (!keep)
		drop(s, i);
	return op->rc;
}

static int op_fail(redlock_store *s, rl_op *op, size_t i, const char *what)
{
	return op_fail_keep(s, op, i, what, false);
}

/*
 * A dead peer is noticed by the kernel too, not only by our per-request
 * timeouts: keepalive probes after 1 s idle, every second, 3 of them; and
 * unacknowledged data aborts the connection after the command timeout (at
 * least 1 s). Matters for a master that vanishes from the network while idle.
 */
static void tune_socket(int fd, int64_t timeout_ms)
{
	int on = 1, idle = 1, intvl = 1, cnt = 3;
	unsigned int uto = (unsigned int)(timeout_ms < 1000 ? 1000 : timeout_ms);
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
#ifdef TCP_USER_TIMEOUT
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
#endif
}

/*
 * Masters whose end closed since our last round (a restart, a client kill):
 * their connections are replaced now, in this round, instead of costing this
 * request those masters — after a master restarts, the next acquire would
 * otherwise stand on one copy fewer (of five: a bare quorum after the next
 * restart). Closed: the peer hung up, or anything is there to read while no
 * reply is owed. Late replies still unread on a hung-up connection are
 * dropped with it (as a read of its EOF would). One poll for all masters (the
 * first 64; any further ones find out by the failed request, as before).
 */
static void drop_closed(redlock_store *s, const rl_op *ops)
{
	int fds[64], st[64];
	size_t which[64], n = 0;
	for (size_t i = 0; i < s->n && n < 64; i++)
		if (ops[i].want && s->c[i]) {
			which[n] = i;
			fds[n++] = s->c[i]->fd;
		}
	if (!n)
		return;
	dlock_sys_sock_states(fds, n, st);
	for (size_t k = 0; k < n; k++) {
		size_t i = which[k];
		if (st[k] == 2 || (st[k] == 1 && (!s->owed || !s->owed[i].n)))
			drop(s, i);
	}
}

static void append_cmd(redlock_store *s, size_t i, rl_op *op, const rl_cmd *cmd)
{
	int script = cmd->script, argc = cmd->argc;
	const char **argv = cmd->argv;
	size_t *lens = cmd->lens;
	if (op->argv) {
		argc = op->argc;
		argv = op->argv;
		lens = op->lens;
	}
	if (script >= 0) {
		bool eval = op->eval || !s->sha[script][0];
		argv[0] = eval ? "EVAL" : "EVALSHA";
		argv[1] = eval ? script_text(script) : s->sha[script];
		lens[0] = strlen(argv[0]);
		lens[1] = strlen(argv[1]);
	}
	redisAppendCommandArgv(s->c[i], argc, argv, lens);
}

/* raise.lua's arguments after EVAL/EVALSHA and the script: one key, the fence
 * (written into tok). */
static void raise_args(const char **argv, size_t *lens, const char *key, size_t keylen, uint64_t top, char tok[24])
{
	argv[2] = "1";
	lens[2] = 1;
	argv[3] = key;
	lens[3] = keylen;
	lens[4] = (size_t)snprintf(tok, 24, "%llu", (unsigned long long)top);
	argv[4] = tok;
}

/* Append master i's pending raises ahead of a request (their replies owed).
 * A fresh connection has none (drop forgets them), so they never come
 * between its AUTH/SELECT and their replies' checks. */
static void append_raises(redlock_store *s, size_t i)
{
	rl_owed *o = &s->owed[i];
	unsigned n = o->nraise;
	o->nraise = 0;
	for (unsigned k = 0; k < n; k++) {
		rl_grant *g = o->raise[k];
		char tok[24];
		const char *argv[5];
		size_t lens[5];
		raise_args(argv, lens, g->key, strlen(g->key), g->top, tok);
		/* EVAL, not EVALSHA: a master behind may be one that restarted empty */
		rl_op op = { .eval = true };
		if (s->c[i] && owe(s, i, NULL))
			append_cmd(s, i, &op, &(rl_cmd){ DLOCK__RS_RAISE, 5, argv, lens });
		grant_put(g);
	}
}

/* Write c's output buffer. A TLS connection is non-blocking (see rl_connect):
 * its writes wait in poll, until `deadline`. */
static bool flush(redisContext *c, int64_t deadline)
{
	int done = 0;
	for (;;) {
		if (dlock__rbuffer_write(c, &done) != REDIS_OK)
			return false;
		if (done)
			return true;
		if (c->flags & REDIS_BLOCK)
			continue; /* the write waited (SO_SNDTIMEO) */
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0) {
			c->err = REDIS_ERR_IO;
			snprintf(c->errstr, sizeof(c->errstr), "timed out writing the request");
			return false;
		}
		struct pollfd p = { c->fd, POLLOUT, 0 };
		(void)poll(&p, 1, left > 60000 ? 60000 : (int)left);
	}
}

/* Master i's request of this round onto its connection: a fresh connection's
 * AUTH/SELECT first (in the same write), then raises owed, then the command. */
static void send_op(redlock_store *s, rl_op *op, size_t i, bool fresh, const rl_cmd *cmd, int64_t deadline)
{
	if (fresh) {
		redisContext *c = s->c[i];
		/* a fresh connection is often to a restarted master, which has
		 * lost its scripts: their text, not EVALSHA — a NOSCRIPT answer
		 * after the round decided would leave the request unsent there */
		op->eval = true;
		if (s->srv[i].password) {
			const char *a[3] = { "AUTH", s->srv[i].user ? s->srv[i].user : s->srv[i].password,
					     s->srv[i].password };
			redisAppendCommandArgv(c, s->srv[i].user ? 3 : 2, a, NULL);
			op->skip++;
			op->auth = true;
		}
		if (s->srv[i].db) {
			char db[16];
			snprintf(db, sizeof(db), "%d", s->srv[i].db);
			const char *a[2] = { "SELECT", db };
			redisAppendCommandArgv(c, 2, a, NULL);
			op->skip++;
		}
	}
	append_raises(s, i);
	if (!s->c[i]) {
		op_fail_keep(s, op, i, "too many replies owed", true);
		return;
	}
	append_cmd(s, i, op, cmd);
	op->sent = true;
	if (!flush(s->c[i], deadline))
		op_fail(s, op, i, s->c[i] && s->c[i]->errstr[0] ? s->c[i]->errstr : "write failed");
}

/* Whether the answers so far decide a round (the rest may be left owed). */
typedef bool (*rl_enough)(const redlock_store *s, const rl_op *ops, void *arg);

/* What a decided round does about the masters still silent. */
typedef struct rl_after {
	bool prompt;     /* do not wait for them (else: as long again as the round took) */
	rl_grant *grant; /* an acquire's round: their late replies are read for it */
} rl_after;

/* Acquire, raise, release and cancel answer the caller as soon as a quorum
 * decides; renewals wait for slow masters a little (their repair needs the
 * answers). */
static const rl_after PROMPT = { true, NULL };

/*
 * A round is rl_send, then rl_collect. rl_send gives every master the
 * request, resolving the names of those without a connection all at once
 * (rl_resolve) and connecting them (rl_connect); rl_collect reads the
 * answers (rl_read, one master's) until the round is decided or its time is
 * up, leaving the slow masters' replies owed (rl_leave_owed).
 */

/* The masters of a round that need a connection, resolved all at once by
 * the connect deadline: hiredis would resolve with a blocking getaddrinfo. */
typedef struct rl_lookup {
	dlock_sys_addrs *ad; /* ad[k], rc[k]: the k-th name looked up */
	int *rc;
	const char **names;
	size_t *which; /* which[i]: master i's lookup, or s->n for none */
	bool failed;   /* out of memory: no lookup at all */
} rl_lookup;

static void rl_resolve(redlock_store *s, const rl_op *ops, int64_t now, int64_t end, rl_lookup *lk)
{
	*lk = (rl_lookup){ 0 };
	size_t need = 0, n = 0;
	for (size_t i = 0; i < s->n; i++)
		need += !s->c[i] && ops[i].want;
	if (!need)
		return;
	lk->ad = calloc(s->n, sizeof(*lk->ad));
	lk->rc = calloc(s->n, sizeof(*lk->rc));
	lk->names = calloc(s->n, sizeof(*lk->names));
	lk->which = calloc(s->n, sizeof(*lk->which));
	if (!lk->ad || !lk->rc || !lk->names || !lk->which) {
		lk->failed = true;
		return;
	}
	for (size_t i = 0; i < s->n; i++) {
		lk->which[i] = s->n;
		if (!s->c[i] && ops[i].want && (ops[i].force || dlock_clock_ms() >= s->quiet_until[i])) {
			lk->which[i] = n;
			lk->names[n++] = s->srv[i].host;
		}
	}
	if (n)
		dlock_sys_resolve_all(lk->ad, lk->rc, lk->names, n, min64(now + s->srv[0].connect_timeout_ms, end),
				      KIND);
}

static void rl_lookup_free(rl_lookup *lk)
{
	free(lk->ad);
	free(lk->rc);
	free(lk->names);
	free(lk->which);
}

/* Connect master i to the addresses it resolved to (mad), blocking until
 * its connect timeout or `end`; then start a TLS handshake (the request is
 * sent when it finishes, from rl_collect) or send the request. */
static void rl_connect(redlock_store *s, rl_op *op, size_t i, const dlock_sys_addrs *mad, const rl_cmd *cmd,
		       int64_t left, int64_t end)
{
	int64_t ct = min64(s->srv[i].connect_timeout_ms, left);
	int64_t tc = dlock_clock_ms();
	redisContext *c = NULL;
	for (size_t k = 0; k < (mad->n ? mad->n : 1); k++) {
		int64_t cl = tc + ct - dlock_clock_ms();
		if (c) {
			if (cl <= 0)
				break;
			dlock__rfree(c);
		}
		c = redisConnectWithTimeout(mad->n ? mad->addr[k] : s->srv[i].host, s->srv[i].port,
					    ms_tv(cl > 0 ? cl : 1));
		if (!c || !c->err)
			break;
	}
	if (!c || c->err) {
		char what[160];
		snprintf(what, sizeof(what), "cannot connect: %s", c ? c->errstr : "out of memory");
		if (c)
			dlock__rfree(c);
		op_fail(s, op, i, what);
		/* the connect is blocking: a master whose connects time out (SYNs
		 * dropped) would cost every round its wait; try it again after
		 * QUIET_MS (a refused connect fails at once: no need) */
		if (dlock_clock_ms() - tc >= ct)
			s->quiet_until[i] = dlock_clock_ms() + QUIET_MS;
		return;
	}
	/* TLS: the handshake runs in the poll loop, beside the other masters'
	 * requests (a stalled master delays none of them); the socket stays
	 * non-blocking, so a reply that trickles in is read as it comes, like
	 * plain TCP's, never waited for in SSL_read */
	if (dlock__rtls_begin(c, &s->srv[i]) != 0) {
		dlock__rfree(c);
		op_fail(s, op, i, "out of memory");
		return;
	}
	if (s->srv[i].tls) {
		c->flags &= ~REDIS_BLOCK;
		op->hs = true;
		op->hs_until = tc + ct;
		op->hs_events = POLLOUT;
	} else {
		redisSetTimeout(c, ms_tv(s->srv[i].timeout_ms));
	}
	tune_socket(c->fd, s->srv[i].timeout_ms);
	s->c[i] = c;
	if (!op->hs)
		send_op(s, op, i, true, cmd, end);
}

/* Start the round: each master it wants gets the request, on its connection
 * or a new one (resolved and connected by `end`); a master that timed out
 * recently is left alone for QUIET_MS unless ops[i].force. */
static void rl_send(redlock_store *s, rl_op *ops, const rl_cmd *cmd, int64_t now, int64_t end)
{
	drop_closed(s, ops);
	rl_lookup lk;
	rl_resolve(s, ops, now, end, &lk);
	for (size_t i = 0; i < s->n; i++) {
		rl_op *op = &ops[i];
		op->reply = NULL;
		op->rc = 0;
		op->skip = 0;
		op->auth = false;
		op->eval = false;
		op->sent = false;
		op->answered = false;
		op->hs = false;
		op->done = !op->want;
		if (op->done)
			continue;
		if (!s->c[i] && !op->force && dlock_clock_ms() < s->quiet_until[i]) {
			op_fail(s, op, i, "cannot connect (timed out recently; not tried again yet)");
			continue;
		}
		if (!s->c[i] && lk.failed) {
			op_fail(s, op, i, "out of memory");
			continue;
		}
		if (!s->c[i] && lk.which[i] == s->n) {
			op_fail(s, op, i, "cannot connect (timed out recently; not tried again yet)");
			continue;
		}
		const dlock_sys_addrs *mad = s->c[i] ? NULL : &lk.ad[lk.which[i]];
		if (!s->c[i] && lk.rc[lk.which[i]]) {
			char what[300];
			snprintf(what, sizeof(what), "%s %s", mad->timed_out ? "timed out resolving" : "cannot resolve",
				 s->srv[i].host);
			if (mad->timed_out)
				s->quiet_until[i] = dlock_clock_ms() + QUIET_MS;
			op_fail(s, op, i, what);
			continue;
		}
		int64_t left = end - dlock_clock_ms();
		if (left <= 0) {
			op_fail_keep(s, op, i, "timed out: no time left before the deadline", true);
			continue;
		}
		if (!s->c[i])
			rl_connect(s, op, i, mad, cmd, left, end);
		else
			send_op(s, op, i, false, cmd, end);
	}
	rl_lookup_free(&lk);
}

/* Read what master i has sent: answers owed to earlier rounds, a fresh
 * connection's AUTH/SELECT answers, then this round's (sent again as text
 * after NOSCRIPT). */
static void rl_read(redlock_store *s, rl_op *op, size_t i, const rl_cmd *cmd, int64_t end)
{
	if (dlock__rbuffer_read(s->c[i]) != REDIS_OK) {
		op_fail(s, op, i, s->c[i]->errstr[0] ? s->c[i]->errstr : "connection lost");
		return;
	}
	void *v = NULL;
	while (!op->done && dlock__rget_reply(s->c[i], &v) == REDIS_OK && v) {
		redisReply *r = v;
		v = NULL;
		if (s->owed[i].n > 0) { /* the answer to an earlier round that did not wait for it */
			late_reply(s, i, r);
			continue;
		}
		if (op->skip > 0) {
			bool auth = op->auth;
			op->skip--;
			op->auth = false;
			if (r->type == REDIS_REPLY_ERROR) {
				int code = dlock__rreply_error(r, &s->srv[i], KIND);
				freeReplyObject(r);
				op->rc = code != DLOCK_ESTORE ? code : auth ? DLOCK_EAUTH : DLOCK_EINVAL;
				op->done = true;
				op->sent = false; /* refused before the command ran */
				drop(s, i);
			} else {
				freeReplyObject(r);
			}
			continue;
		}
		if (r->type == REDIS_REPLY_ERROR && cmd->script >= 0 && !op->eval && !strncmp(r->str, "NOSCRIPT", 8)) {
			freeReplyObject(r);
			op->eval = true; /* restarted or flushed master: send the text (caches it again) */
			append_cmd(s, i, op, cmd);
			if (!flush(s->c[i], end))
				op_fail(s, op, i, "write failed");
			continue;
		}
		op->answered = true;
		if (r->type == REDIS_REPLY_ERROR) {
			op->rc = dlock__rreply_error(r, &s->srv[i], KIND);
			freeReplyObject(r);
		} else {
			op->reply = r;
		}
		op->done = true;
	}
	if (!op->done && s->c[i] && s->c[i]->err)
		op_fail(s, op, i, s->c[i]->errstr);
}

/* A decided round's masters still silent (idx[0..np)): their outcome is
 * unknown to the caller, but they keep their connections, and their
 * replies (after a fresh connection's AUTH/SELECT answers) are owed, read
 * when they come (an acquire's for after->grant). */
static void rl_leave_owed(redlock_store *s, rl_op *ops, const size_t *idx, size_t np, const rl_after *after)
{
	for (size_t k = 0; k < np; k++) {
		size_t i = idx[k];
		if (ops[i].hs) { /* nothing sent: the connection is not worth keeping */
			op_fail(s, &ops[i], i, "TLS handshake not finished when the others had answered");
			continue;
		}
		ops[i].rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "EIO",
					    "redlock master %s:%d: slower than the others", s->srv[i].host,
					    s->srv[i].port);
		ops[i].done = true;
		bool kept = true;
		for (int h = 0; kept && h < ops[i].skip; h++)
			kept = owe(s, i, NULL);
		if (kept)
			owe(s, i, after ? after->grant : NULL);
	}
}

/* Collect the round's answers (it started at `now`) until each master has
 * answered or `end` came; once `enough` says they decide it, wait only as
 * long again as it took for the others, or (after->prompt) take only the
 * answers already there. */
static void rl_collect(redlock_store *s, rl_op *ops, const rl_cmd *cmd, int64_t now, int64_t end, rl_enough enough,
		       void *arg, const rl_after *after)
{
	bool decided = false, drained = false;
	struct pollfd *pf = calloc(s->n, sizeof(*pf));
	size_t *idx = calloc(s->n, sizeof(*idx));
	if (!pf || !idx) {
		for (size_t i = 0; i < s->n; i++)
			if (!ops[i].done)
				op_fail(s, &ops[i], i, "out of memory");
		free(pf);
		free(idx);
		return;
	}
	for (;;) {
		size_t np = 0;
		for (size_t i = 0; i < s->n; i++)
			if (!ops[i].done) {
				pf[np].fd = s->c[i]->fd;
				pf[np].events = ops[i].hs ? ops[i].hs_events : POLLIN;
				pf[np].revents = 0;
				idx[np++] = i;
			}
		if (!np)
			break;
		int64_t t = dlock_clock_ms();
		if (enough && !decided && enough(s, ops, arg)) {
			decided = true;
			end = min64(end, after && after->prompt ? t : t + (t - now) + 2);
		}
		int64_t left = end - t;
		for (size_t k = 0; k < np; k++)
			if (ops[idx[k]].hs && ops[idx[k]].hs_until - t < left)
				left = ops[idx[k]].hs_until - t > 0 ? ops[idx[k]].hs_until - t : 0;
		if (left <= 0 && !drained) {
			/* read the answers already there, without waiting: also those
			 * that came while a blocking connect of another master took
			 * the round's time (they count; they are not timed out) */
			drained = true;
			left = 0;
		} else if (left <= 0 && decided) {
			rl_leave_owed(s, ops, idx, np, after);
			break;
		} else if (left <= 0) {
			for (size_t k = 0; k < np; k++) {
				char what[80];
				snprintf(what, sizeof(what), "timed out (no answer within %lld ms)",
					 (long long)(end - now));
				op_fail(s, &ops[idx[k]], idx[k], what);
			}
			break;
		}
		int pr = poll(pf, np, (int)left);
		if (pr < 0 && errno != EINTR) {
			for (size_t k = 0; k < np; k++)
				op_fail(s, &ops[idx[k]], idx[k], strerror(errno));
			break;
		}
		for (size_t k = 0; k < np && pr >= 0; k++) {
			size_t i = idx[k];
			rl_op *op = &ops[i];
			if (op->hs && !pf[k].revents && dlock_clock_ms() >= op->hs_until) {
				op_fail(s, op, i, "TLS handshake timed out");
				continue;
			}
			if (!pf[k].revents)
				continue;
			if (!op->hs) {
				rl_read(s, op, i, cmd, end);
				continue;
			}
			int r = dlock__rtls_step(s->c[i], &s->srv[i], KIND, &op->hs_events);
			if (r < 0) {
				char what[300];
				snprintf(what, sizeof(what), "%s", dlock_error_last()->message);
				op_fail(s, op, i, what);
			} else if (r == 0) {
				op->hs = false;
				send_op(s, op, i, true, cmd, end);
			}
		}
	}
	free(pf);
	free(idx);
}

/*
 * Send one command to every master (ops[i].want) at once and collect the
 * answers until each has answered, `tmo` ms passed, or `deadline` (absolute,
 * dlock_clock_ms) came, whichever is first. When `enough` says the answers
 * so far decide the request, the round waits only as long again as it took
 * for the others (slow but alive masters still count when in step) — or,
 * with after->prompt, takes only the answers already there; a master
 * still silent then keeps its connection and its reply is read when it
 * comes (owed; an acquire's, after->grant, may show that master behind, see
 * rl_grant): its outcome is unknown to the caller (ops[i].sent, no
 * answer), like a timeout's, but the master is not treated as hung. A
 * master that times out loses its connection (a late reply would answer
 * the next request) and is left alone for QUIET_MS unless ops[i].force; it
 * is reconnected on a later round, the connect bounded by the same
 * deadline. Fresh connections send AUTH/SELECT in the same write as the
 * command, so a reconnect costs no extra round trip.
 */
static void rl_round(redlock_store *s, rl_op *ops, const rl_cmd *cmd, int64_t tmo, int64_t deadline, rl_enough enough,
		     void *arg, const rl_after *after)
{
	int64_t now = dlock_clock_ms();
	int64_t end = min64(now + tmo, deadline);
	rl_send(s, ops, cmd, now, end);
	rl_collect(s, ops, cmd, now, end, enough, arg, after);
}

static void ops_clear(redlock_store *s, rl_op *ops)
{
	for (size_t i = 0; i < s->n; i++) {
		if (ops[i].reply)
			freeReplyObject(ops[i].reply);
		ops[i].reply = NULL;
		ops[i].want = false;
		ops[i].force = false;
		ops[i].argc = 0;
		ops[i].argv = NULL;
		ops[i].lens = NULL;
	}
}

static void ops_all(redlock_store *s, rl_op *ops)
{
	for (size_t i = 0; i < s->n; i++)
		ops[i].want = true;
}

static int unsupported(const dlock_request *req)
{
	if (req->permits > 1)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "semaphores (permits > 1) are not supported on redlock: majority quorums only "
				       "intersect pairwise, so N permits counted per master can admit more than N "
				       "holders; use redis:// or another store");
	return 0;
}

static int64_t drift_ms(const redlock_store *s, int64_t ttl_ms)
{
	return (int64_t)((double)ttl_ms * s->drift) + 2;
}

/*
 * acquire: a quorum granted, or so many refused that none can. Not while
 * every grant so far counted 1 from a bare quorum: to each of those masters
 * the name is new (a new name, or masters that came back without their
 * data), and the fence must then come from any master that kept its counter.
 * One more grant settles it: a quorum and one overlap the quorum of any
 * earlier grant in two masters at least, so one master that lost its data
 * cannot hide an earlier fence (with three masters that is all of them; with
 * five, one silent master no longer holds up the first grant of a name).
 */
/* acquire: a quorum granted (with a fence past the first, or more than a
 * bare quorum), or too many refused for a quorum. A waiting try (*arg) is
 * also decided by a split vote among a quorum of answers: the masters still
 * to answer could only break it if every one of them granted, and one that
 * is stopped keeps the round — and the store handle's other waiters behind
 * it — until the per-master timeout; a split vote retries after a short
 * random delay instead (the holder's release still landing on some masters
 * is the usual cause). */
static bool acquire_decided(const redlock_store *s, const rl_op *ops, void *arg)
{
	bool waiting = *(const bool *)arg;
	size_t grants = 0, refused = 0;
	uint64_t top = 0;
	for (size_t i = 0; i < s->n; i++) {
		uint64_t f = 0;
		int64_t retry;
		if (!ops[i].reply)
			continue;
		int r = dlock__racquire_reply(ops[i].reply, &f, &retry, KIND);
		grants += r == 0;
		refused += r == DLOCK_ELOCKED;
		if (r == 0 && f > top)
			top = f;
	}
	return (grants >= s->quorum && (top > 1 || grants > s->quorum)) || s->n - refused < s->quorum ||
	       (waiting && refused > 0 && grants + refused >= s->quorum);
}

/* raise: a quorum confirmed the token. */
static bool raise_decided(const redlock_store *s, const rl_op *ops, void *arg)
{
	uint64_t top = *(const uint64_t *)arg;
	size_t raised = 0;
	for (size_t i = 0; i < s->n; i++)
		raised += ops[i].reply && ops[i].reply->type == REDIS_REPLY_INTEGER && ops[i].reply->integer >= 0 &&
			  (uint64_t)ops[i].reply->integer >= top;
	return raised >= s->quorum;
}

/* release, cancel: no quorum can still hold it (N - Q + 1 answered). */
static bool release_decided(const redlock_store *s, const rl_op *ops, void *arg)
{
	(void)arg;
	size_t answered = 0;
	for (size_t i = 0; i < s->n; i++)
		answered += ops[i].answered;
	return answered >= s->n - s->quorum + 1;
}

/* renew: every lock of the batch renewed by a quorum, or out of its reach. */
static bool renew_decided(const redlock_store *s, const rl_op *ops, void *arg)
{
	size_t n = *(const size_t *)arg;
	for (size_t j = 0; j < n; j++) {
		size_t yes = 0, no = 0;
		for (size_t i = 0; i < s->n; i++) {
			const redisReply *r = ops[i].reply;
			if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != n)
				continue;
			if (r->element[j]->type == REDIS_REPLY_INTEGER && r->element[j]->integer > 0)
				yes++;
			else
				no++;
		}
		if (yes < s->quorum && s->n - no >= s->quorum)
			return false;
	}
	return true;
}

/* undo: every master that granted the try (it answered: it is alive) has
 * answered the undo too; the silent ones are not waited for. */
static bool undo_decided(const redlock_store *s, const rl_op *ops, void *arg)
{
	const bool *granted = arg;
	for (size_t i = 0; i < s->n; i++)
		if (ops[i].want && granted[i] && !ops[i].done)
			return false;
	return true;
}

/*
 * Undo a try of owner req->owner on the masters marked in `maybe` (those that
 * granted it, and those whose answer never came: the request may have been
 * applied there). Quiet (wakes nobody: nobody was granted), sent even to a
 * master that just timed out, bounded by `deadline`. The round waits for the
 * masters that granted (`granted`); a silent master gets the undo on the
 * connection that carries the try, after it (a master that wakes up applies
 * both, in that order), and is not waited for: a SIGSTOPped master would
 * otherwise cost every refused try its whole timeout. @return the number of
 * marked masters that did not confirm (their copy, if any, stays until its
 * TTL unless the undo reaches them).
 */
static size_t undo(redlock_store *s, rl_op *ops, const dlock__rkeys *k, const dlock_request *req, const bool *maybe,
		   const bool *granted, int64_t tmo, int64_t deadline)
{
	dlock__rargs r;
	dlock__rargs_owner(&r, k, req);
	r.argv[r.argc] = "0";
	r.lens[r.argc++] = 1;
	size_t want = 0;
	for (size_t i = 0; i < s->n; i++) {
		ops[i].want = maybe[i];
		ops[i].force = true;
		want += maybe[i];
	}
	if (!want)
		return 0;
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_RELEASE, r.argc, r.argv, r.lens }, tmo, deadline, undo_decided,
		 (void *)granted, &PROMPT);
	size_t left = 0;
	for (size_t i = 0; i < s->n; i++)
		left += maybe[i] && !ops[i].answered;
	ops_clear(s, ops);
	return left;
}

static int rl_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	redlock_store *s = RL(be);
	int rc = unsupported(req);
	if (rc)
		return rc;
	rl_op *ops = calloc(s->n, sizeof(*ops));
	bool *maybe = calloc(2 * s->n, sizeof(*maybe)), *granted = maybe ? maybe + s->n : NULL;
	if (!ops || !maybe) {
		free(ops);
		free(maybe);
		return dlock_sys_oom();
	}
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	/* one queue ticket for every master, and for every try of this acquire: all
	 * masters order their fair queues alike, so the first waiter heads a quorum,
	 * and a waiter that must rejoin a queue (a partial grant it undid removed it
	 * from those masters' queues) rejoins at its own place, not behind later ones */
	dlock__rargs_acquire(&a, &k, req, req->fair ? req->ticket_us : 0);
	int64_t t0 = dlock_clock_ms();
	int64_t deadline = req->deadline_ms;
	int64_t drift = drift_ms(s, req->ttl_ms);
	/* a grant later than the validity is of no use: wait no longer for one */
	int64_t tmo = min64(master_timeout(s), req->ttl_ms - drift);
	/* the try itself may use the time up to the deadline less what an undo
	 * needs (a third of the time left, at most one per-master timeout) */
	int64_t try_end = deadline - min64((deadline - t0) / 3, tmo);
	rl_grant *g = calloc(1, sizeof(*g));
	if (!g) {
		free(ops);
		free(maybe);
		return dlock_sys_oom();
	}
	g->refs = 1;
	snprintf(g->key, sizeof(g->key), "%s", k.k[DLOCK__RK_H]);
	const rl_after after = { true, g };
	ops_all(s, ops);
	bool waiting = req->waiting;
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_ACQUIRE, a.argc, a.argv, a.lens }, tmo, try_end, acquire_decided,
		 &waiting, &after);
	size_t grants = 0, refused = 0, at_top = 0, unknown = 0;
	uint64_t top = 0;
	int64_t soonest = -1;
	int err = 0;
	char errmsg[256] = "";
	for (size_t i = 0; i < s->n; i++) {
		if (!ops[i].reply) {
			/* sent, no answer: it may have been applied (a lost reply) */
			if (ops[i].sent && !ops[i].answered) {
				maybe[i] = true;
				unknown++;
			}
			if (!err) {
				err = ops[i].rc;
				snprintf(errmsg, sizeof(errmsg), "%s", dlock_error_last()->message);
			}
			continue;
		}
		uint64_t f = 0;
		int64_t retry = -1;
		int r = dlock__racquire_reply(ops[i].reply, &f, &retry, KIND);
		if (r == 0) {
			grants++;
			maybe[i] = granted[i] = true;
			if (f > top) {
				top = f;
				at_top = 0;
			}
			at_top += f == top;
		} else if (r == DLOCK_ELOCKED) {
			refused++;
			if (soonest < 0 || retry < soonest)
				soonest = retry;
		}
	}
	ops_clear(s, ops);
	bool ok = grants >= s->quorum && dlock_clock_ms() - t0 < req->ttl_ms - drift;
	if (grants >= s->quorum)
		g->top = top; /* a late grant below it raises its master (even if this try fails: harmless) */
	grant_put(g);
	/* When every granting master counted up to the token (masters in step: the
	 * usual case), a quorum already holds it: no second round. A master behind
	 * (it missed grants, or came back without its data) is raised now, so that
	 * single faults do not add up to a quorum of masters behind. */
	if (ok && at_top < grants) {
		/* second round: raise every counter to the token before anyone can see it */
		char tok[24];
		const char *argv[5];
		size_t lens[5];
		raise_args(argv, lens, k.k[DLOCK__RK_H], k.len[DLOCK__RK_H], top, tok);
		ops_all(s, ops);
		rl_round(s, ops, &(rl_cmd){ DLOCK__RS_RAISE, 5, argv, lens }, tmo, try_end, raise_decided, &top,
			 &PROMPT);
		size_t raised = 0;
		for (size_t i = 0; i < s->n; i++) {
			long long v;
			if (ops[i].reply && ops[i].reply->type == REDIS_REPLY_INTEGER &&
			    (v = ops[i].reply->integer) >= 0 && (uint64_t)v >= top)
				raised++;
		}
		ops_clear(s, ops);
		ok = raised >= s->quorum && dlock_clock_ms() - t0 < req->ttl_ms - drift;
	}
	if (ok) {
		free(ops);
		free(maybe);
		out->fence = top;
		dlock__racquire_done(req, 0, out);
		return 0;
	}
	/* Not granted: undo everywhere it may have landed, a grant we saw or a
	 * request whose answer never came (even when every master timed out). */
	size_t stuck = grants || unknown ? undo(s, ops, &k, req, maybe, granted, tmo, deadline) : 0;
	free(ops);
	free(maybe);
	if (grants + refused < s->quorum)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "only %zu of %zu redlock masters answered (a quorum is %zu)%s: %s",
				       grants + refused, s->n, s->quorum,
				       stuck ? "; the undo of this try is unconfirmed on some" : "",
				       errmsg[0] ? errmsg : "timed out");
	if (grants >= s->quorum)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "lock '%s': granted by a quorum too late (timed out: validity spent)",
				       req->name);
	dlock__racquire_done(req, DLOCK_ELOCKED, out);
	/* a split vote (some grants) retries after a random delay; else when the lease ends */
	int64_t jitter = dlock_sys_rand_between(s->retry_ms / 2 + 1, s->retry_ms);
	out->retry_ms = grants || soonest < 0 ? jitter : soonest;
	return DLOCK_ELOCKED;
}

/*
 * Release on every master at once. The hold is gone once no quorum can still
 * hold it: at least N - Q + 1 masters answered (the silent ones, at most
 * Q - 1, keep a copy until its TTL at worst). Fewer answers: EUNAVAILABLE,
 * and the core retries.
 */
static int rl_release(dlock_backend *be, const dlock_request *req)
{
	redlock_store *s = RL(be);
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock_sys_oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	ops_all(s, ops);
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_RELEASE, a.argc, a.argv, a.lens }, master_timeout(s), req->deadline_ms,
		 release_decided, NULL, &PROMPT);
	size_t released = 0, answered = 0;
	char errmsg[256] = "";
	for (size_t i = 0; i < s->n; i++) {
		if (!ops[i].reply) {
			if (!errmsg[0])
				snprintf(errmsg, sizeof(errmsg), "%s", dlock_error_last()->message);
			continue;
		}
		answered++;
		if (ops[i].reply->type == REDIS_REPLY_INTEGER && ops[i].reply->integer == 1)
			released++;
	}
	ops_clear(s, ops);
	free(ops);
	if (answered < s->n - s->quorum + 1)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "release of '%s' confirmed by %zu of %zu redlock masters (need %zu): %s",
				       req->name, answered, s->n, s->n - s->quorum + 1,
				       errmsg[0] ? errmsg : "timed out");
	if (released)
		return 0;
	return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by %s on any master", req->name,
			       req->owner);
}

/* The tail of a hold's value after its expiry: "fence mode permits pid host". */
static int hold_tail(char *buf, size_t n, const dlock_request *req, uint64_t fence)
{
	int len = snprintf(buf, n, "%llu %c %u %d %s", (unsigned long long)fence, req->mode == DLOCK_SHARED ? 's' : 'x',
			   req->permits, req->pid, req->host ? req->host : "");
	return len < 0 ? 0 : (size_t)len < n ? len : (int)n - 1;
}

/*
 * Put back the copies of holds that still stand on a quorum where a master
 * answered "not here" (its copy expired early, was deleted, or the master
 * restarted without its data). Only where nobody else holds: the REPAIR
 * script checks that in the same step as it writes. A copy is never written
 * for a hold below a quorum: that hold may have dissolved, and another client
 * may have held the name meanwhile.
 */
static void repair(redlock_store *s, const dlock_request *const *reqs, size_t n, unsigned char *absent,
		   const uint64_t *fence, const bool *standing, size_t *copies, int64_t tmo, int64_t deadline)
{
	rl_op *ops = calloc(s->n, sizeof(*ops));
	size_t *cnt = calloc(s->n, sizeof(*cnt));
	const char ***av = calloc(s->n, sizeof(*av));
	size_t **lv = calloc(s->n, sizeof(*lv));
	char(*keys)[DLOCK__REDIS_KEY_MAX] = calloc(n, sizeof(*keys));
	char(*nums)[24] = calloc(n, sizeof(*nums));
	char(*tails)[320] = calloc(n, sizeof(*tails));
	char(*nk)[24] = calloc(s->n, sizeof(*nk));
	size_t **which = calloc(s->n, sizeof(*which));
	bool any = false;
	if (!ops || !cnt || !av || !lv || !keys || !nums || !tails || !nk || !which)
		goto out;
	for (size_t j = 0; j < n; j++) {
		dlock__rkeys k;
		dlock__rkeys_make(&k, s->prefix, reqs[j]->name); /* the key the renew batch used */
		snprintf(keys[j], sizeof(keys[j]), "%s", k.k[DLOCK__RK_H]);
		snprintf(nums[j], sizeof(nums[j]), "%lld", (long long)reqs[j]->ttl_ms);
		hold_tail(tails[j], sizeof(tails[j]), reqs[j], fence[j]);
	}
	for (size_t i = 0; i < s->n; i++) {
		for (size_t j = 0; j < n; j++)
			cnt[i] += standing[j] && absent[i * n + j];
		if (!cnt[i])
			continue;
		size_t argc = 3 + 4 * cnt[i];
		av[i] = calloc(argc, sizeof(**av));
		lv[i] = calloc(argc, sizeof(**lv));
		which[i] = calloc(cnt[i], sizeof(**which));
		if (!av[i] || !lv[i] || !which[i])
			goto out;
		av[i][2] = nk[i];
		lv[i][2] = (size_t)snprintf(nk[i], sizeof(nk[i]), "%zu", cnt[i]);
		size_t m = 0;
		for (size_t j = 0; j < n; j++) {
			if (!standing[j] || !absent[i * n + j])
				continue;
			which[i][m] = j;
			av[i][3 + m] = keys[j];
			lv[i][3 + m] = strlen(keys[j]);
			const char **arg = &av[i][3 + cnt[i] + 3 * m];
			size_t *len = &lv[i][3 + cnt[i] + 3 * m];
			arg[0] = reqs[j]->owner;
			len[0] = strlen(arg[0]);
			arg[1] = nums[j];
			len[1] = strlen(nums[j]);
			arg[2] = tails[j];
			len[2] = strlen(tails[j]);
			m++;
		}
		ops[i].want = true;
		ops[i].argc = (int)argc;
		ops[i].argv = av[i];
		ops[i].lens = lv[i];
		any = true;
	}
	if (!any)
		goto out;
	rl_round(s, ops, &(rl_cmd){ RL_REPAIR, 0, NULL, NULL }, tmo, deadline, NULL, NULL, NULL);
	for (size_t i = 0; i < s->n; i++) {
		redisReply *r = ops[i].reply;
		if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != cnt[i])
			continue;
		for (size_t m = 0; m < cnt[i]; m++)
			if (r->element[m]->type == REDIS_REPLY_INTEGER && r->element[m]->integer > 0)
				copies[which[i][m]]++;
	}
	ops_clear(s, ops);
out:
	for (size_t i = 0; i < s->n && av && lv && which; i++) {
		free(av[i]);
		free(lv[i]);
		free(which[i]);
	}
	free(ops);
	free(cnt);
	free(av);
	free(lv);
	free(keys);
	free(nums);
	free(tails);
	free(nk);
	free(which);
}

/*
 * Renew a batch on every master at once. A lock stays ours when a quorum
 * renewed it; copies missing on masters that answered are then written back
 * (repair, a second round only when one is missing). It is lost (ENOTHELD)
 * once so many masters said "not here" that a quorum is out of reach;
 * otherwise (masters silent) the result is transient and the core retries
 * until the lease deadline.
 */
static int rl_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	redlock_store *s = RL(be);
	if (!n)
		return 0;
	dlock__rbatch b;
	int rc = dlock__rbatch_renew(&b, s->prefix, reqs, n);
	if (rc)
		return rc;
	rl_op *ops = calloc(s->n, sizeof(*ops));
	size_t *yes = calloc(n, sizeof(*yes)), *no = calloc(n, sizeof(*no));
	uint64_t *fence = calloc(n, sizeof(*fence));
	bool *standing = calloc(n, sizeof(*standing));
	unsigned char *absent = calloc(s->n * n, 1);
	if (!ops || !yes || !no || !fence || !standing || !absent) {
		rc = dlock_sys_oom();
		goto out;
	}
	int64_t ttl = reqs[0]->ttl_ms;
	for (size_t j = 1; j < n; j++)
		if (reqs[j]->ttl_ms < ttl)
			ttl = reqs[j]->ttl_ms;
	/* an answer is of use until the shortest lease of the batch would end */
	int64_t tmo = min64(master_timeout(s), ttl - drift_ms(s, ttl)), deadline = reqs[0]->deadline_ms;
	ops_all(s, ops);
	size_t nn = n;
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_RENEW, b.argc, b.argv, b.lens }, tmo, deadline, renew_decided, &nn, NULL);
	size_t answered = 0;
	bool missing = false;
	for (size_t i = 0; i < s->n; i++) {
		redisReply *r = ops[i].reply;
		if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != n)
			continue;
		answered++;
		for (size_t j = 0; j < n; j++) {
			long long v = r->element[j]->type == REDIS_REPLY_INTEGER ? r->element[j]->integer : 0;
			if (v > 0) {
				yes[j]++;
				if ((uint64_t)v > fence[j])
					fence[j] = (uint64_t)v;
			} else {
				no[j]++;
				absent[i * n + j] = 1;
			}
		}
	}
	ops_clear(s, ops);
	for (size_t j = 0; j < n; j++) {
		standing[j] = yes[j] >= s->quorum;
		missing |= standing[j] && no[j] > 0;
	}
	if (missing)
		repair(s, reqs, n, absent, fence, standing, yes, tmo, deadline);
	for (size_t j = 0; j < n; j++) {
		if (standing[j])
			results[j] = 0;
		else if (s->n - no[j] < s->quorum)
			results[j] = DLOCK_ENOTHELD;
		else
			results[j] = DLOCK_EUNAVAILABLE;
	}
	if (!answered)
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				     "no redlock master answered the renewal (timed out)");
	else if (answered < s->quorum)
		dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "only %zu of %zu redlock masters answered the renewal",
				answered, s->n);
out:
	free(ops);
	free(yes);
	free(no);
	free(fence);
	free(standing);
	free(absent);
	dlock__rbatch_free(&b);
	return rc;
}

static int rl_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	dlock_request copy = *req;
	copy.ttl_ms = ttl_ms;
	const dlock_request *p = &copy;
	int result = 0;
	int64_t t0 = dlock_clock_ms();
	int rc = rl_renew(be, &p, 1, &result);
	if (rc)
		return rc;
	if (result == DLOCK_ENOTHELD)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is no longer held by %s on a quorum",
				       req->name, req->owner);
	if (result)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "lock '%s': too few redlock masters confirmed the extension", req->name);
	if (dlock_clock_ms() - t0 >= ttl_ms - drift_ms(RL(be), ttl_ms))
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s': extension confirmed too late",
				       req->name);
	return 0;
}

static int rl_watch(dlock_backend *be, const dlock_request *req)
{
	return dlock__rnotify_watch(RL(be)->nt, req, RL(be)->prefix);
}

static void rl_unwatch(dlock_backend *be, const dlock_request *req)
{
	dlock__rnotify_forget(RL(be)->nt, req);
}

static int rl_cancel(dlock_backend *be, const dlock_request *req)
{
	redlock_store *s = RL(be);
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock_sys_oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	ops_all(s, ops);
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_CANCEL, a.argc, a.argv, a.lens }, master_timeout(s), req->deadline_ms,
		 release_decided, NULL, &PROMPT);
	ops_clear(s, ops);
	free(ops);
	return 0;
}

static bool quorum_answered(const redlock_store *s, const rl_op *ops, void *arg);

/* Status of one name: holders seen on a quorum of masters (min TTL, max fence). */
static int status_one(redlock_store *s, const char *name, dlock_lock_status **out, size_t *count, int64_t deadline)
{
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock_sys_oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, name);
	dlock__rargs_status(&a, &k);
	ops_all(s, ops);
	/* a quorum's answers, and as long again for the others (a stopped
	 * master does not cost the whole timeout) */
	rl_round(s, ops, &(rl_cmd){ DLOCK__RS_STATUS, a.argc, a.argv, a.lens }, master_timeout(s), deadline,
		 quorum_answered, NULL, NULL);
	dlock_lock_status *per = NULL;
	size_t nper = 0;
	int rc = 0;
	for (size_t i = 0; i < s->n && !rc; i++)
		if (ops[i].reply)
			rc = dlock__rstatus_decode(ops[i].reply, name, &per, &nper, KIND);
	ops_clear(s, ops);
	free(ops);
	if (!rc && nper < s->quorum)
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				     "only %zu of %zu redlock masters answered (a quorum is %zu)", nper, s->n,
				     s->quorum);
	dlock_lock_status *st = rc ? NULL : dlock_sys_status_add(out, count);
	if (!rc && (!st || !(st->name = dlock_sys_strdup(name))))
		rc = DLOCK_ENOMEM;
	/* Waiters as a quorum sees them, like holders: the most that at least a
	 * quorum of masters each show (the quorum-th largest count). One
	 * master's count is not enough: a waiter whose registration has reached
	 * it but not yet a quorum bars nobody, since a grant's quorum can still
	 * miss it (a writer so reported did not yet hold new readers back). */
	for (size_t m = 0; m < nper && !rc; m++) {
		size_t at_least = 0;
		for (size_t m2 = 0; m2 < nper; m2++)
			at_least += per[m2].waiters >= per[m].waiters;
		if (at_least >= s->quorum && per[m].waiters > st->waiters)
			st->waiters = per[m].waiters;
	}
	for (size_t m = 0; m < nper && !rc; m++) {
		if (per[m].last_fence > st->last_fence)
			st->last_fence = per[m].last_fence;
		for (size_t h = 0; h < per[m].nholders && !rc; h++) {
			const dlock_holder *ho = &per[m].holders[h];
			bool seen = false;
			for (size_t x = 0; x < st->nholders; x++)
				seen |= !strcmp(st->holders[x].owner, ho->owner);
			if (seen)
				continue;
			size_t votes = 0;
			uint64_t fence = 0;
			int64_t ttl = ho->ttl_left_ms;
			for (size_t m2 = 0; m2 < nper; m2++)
				for (size_t h2 = 0; h2 < per[m2].nholders; h2++)
					if (!strcmp(per[m2].holders[h2].owner, ho->owner)) {
						votes++;
						if (per[m2].holders[h2].fence > fence)
							fence = per[m2].holders[h2].fence;
						if (per[m2].holders[h2].ttl_left_ms < ttl)
							ttl = per[m2].holders[h2].ttl_left_ms;
					}
			if (votes < s->quorum)
				continue;
			dlock_holder *nh = dlock_sys_status_add_holder(st);
			if (!nh || !(nh->owner = dlock_sys_strdup(ho->owner)) ||
			    !(nh->host = dlock_sys_strdup(ho->host))) {
				rc = DLOCK_ENOMEM;
				break;
			}
			nh->pid = ho->pid;
			nh->mode = ho->mode;
			nh->fence = fence;
			nh->ttl_left_ms = ttl;
			nh->copies = (unsigned)votes;
			nh->copies_of = (unsigned)s->n;
		}
	}
	dlock_status_free(per, nper);
	return rc;
}

static int rl_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	redlock_store *s = RL(be);
	int64_t deadline = dlock_clock_ms() + s->request_timeout_ms;
	for (size_t i = 0; i < nnames; i++) { /* the core lists through rl_list: names is never NULL */
		int rc = status_one(s, names[i], out, count, deadline);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every master's names; a quorum must answer, or a lock held on it could be missed. */
static int rl_list(dlock_backend *be, char ***names, size_t *n)
{
	redlock_store *s = RL(be);
	size_t reached = 0;
	int64_t deadline = dlock_clock_ms() + s->request_timeout_ms;
	for (size_t i = 0; i < s->n; i++) {
		/* one master after the other, each with what is left of the time */
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0)
			break;
		if (!s->c[i] && dlock_clock_ms() < s->quiet_until[i])
			continue;
		if (s->owed[i].n)
			drop(s, i); /* SCAN below reads the next reply as its own */
		dlock__rserver cut = s->srv[i];
		cut.connect_timeout_ms = min64(cut.connect_timeout_ms, left);
		cut.timeout_ms = min64(cut.timeout_ms, left);
		if (s->c[i])
			redisSetTimeout(s->c[i], ms_tv(cut.timeout_ms));
		if (dlock__rscan_names(&s->c[i], &cut, s->prefix, KIND, names, n) == 0)
			reached++;
		else
			drop(s, i); /* a timed-out SCAN may still answer */
		if (s->c[i])
			redisSetTimeout(s->c[i], ms_tv(s->srv[i].timeout_ms));
	}
	if (reached < s->quorum)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "only %zu of %zu redlock masters answered SCAN%s", reached, s->n,
				       dlock_clock_ms() >= deadline ? " (timed out)" : "");
	return 0;
}

static void rl_close(dlock_backend *be)
{
	redlock_store *s = RL(be);
	if (!s)
		return;
	dlock__rnotify_free(s->nt);
	for (size_t i = 0; s->c && i < s->n; i++)
		drop(s, i);
	free(s->c);
	free(s->quiet_until);
	free(s->owed);
	dlock__rservers_free(s->srv);
	free(s->user);
	dlock_sys_free_secret(s->password);
	free(s->prefix);
	free(s);
}

/*
 * Connect to every master at once and learn the scripts' SHA1s (SCRIPT LOAD,
 * one parallel round per script, which also caches them on every master),
 * all by `deadline`. @return how many masters answered the first round;
 * *err and msg: the first failure (an authentication failure first).
 */
/* A quorum of masters answered (the open's script loads): one silent master
 * then costs the open only as long again as the quorum took, not the whole
 * connect_timeout (a stopped one would take all of it). */
static bool quorum_answered(const redlock_store *s, const rl_op *ops, void *arg)
{
	(void)arg;
	size_t n = 0;
	for (size_t i = 0; i < s->n; i++)
		n += ops[i].want && ops[i].done && ops[i].reply;
	return n >= s->quorum;
}

static size_t load_scripts(redlock_store *s, int64_t deadline, int *err, char *msg, size_t msglen)
{
	rl_op *ops = calloc(s->n, sizeof(*ops));
	bool *up = calloc(s->n, sizeof(*up));
	size_t nup = 0;
	if (!ops || !up) {
		free(ops);
		free(up);
		*err = dlock_sys_oom();
		return 0;
	}
	for (int j = 0; j < RL_NSCRIPTS; j++) {
		const char *argv[3] = { "SCRIPT", "LOAD", script_text(j) };
		size_t lens[3] = { 6, 4, strlen(argv[2]) };
		bool any = false;
		for (size_t i = 0; i < s->n; i++)
			any |= ops[i].want = j == 0 || up[i];
		if (!any)
			break;
		rl_round(s, ops, &(rl_cmd){ -1, 3, argv, lens }, deadline - dlock_clock_ms(), deadline,
			 j == 0 ? quorum_answered : NULL, NULL, NULL);
		for (size_t i = 0; i < s->n; i++) {
			redisReply *r = ops[i].reply;
			if (j == 0 && r) {
				up[i] = true;
				nup++;
			} else if (j == 0 && ops[i].want && (!*err || ops[i].rc == DLOCK_EAUTH) &&
				   *err != DLOCK_EAUTH) {
				*err = ops[i].rc ? ops[i].rc : DLOCK_EUNAVAILABLE;
				snprintf(msg, msglen, "%s", dlock_error_last()->message);
			}
			if (r && r->type == REDIS_REPLY_STRING && r->len == 40 && !s->sha[j][0])
				memcpy(s->sha[j], r->str, 41);
		}
		ops_clear(s, ops);
	}
	free(ops);
	free(up);
	return nup;
}

static const dlock_backend_methods redlock_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.acquire = rl_acquire,
	.release = rl_release,
	.renew = rl_renew,
	.extend = rl_extend,
	.watch = rl_watch,
	.unwatch = rl_unwatch,
	.cancel = rl_cancel,
	.status = rl_status,
	.list = rl_list,
	.close = rl_close,
};

/*
 * A quorum counts independent masters: two entries that reach the same
 * server (h:1 twice, or localhost and 127.0.0.1 with one port) would make
 * one server count as several. After resolution (by the open's deadline),
 * entries with the same port and a common address are refused, naming both.
 * A name that does not resolve now cannot be compared: it is left to fail
 * (or not) when it is connected.
 */
static int refuse_duplicates(const dlock__rserver *srv, size_t n, int64_t deadline)
{
	int rc = 0;
	dlock_sys_addrs *ad = calloc(n, sizeof(*ad));
	int *arc = calloc(n, sizeof(*arc));
	const char **names = calloc(n, sizeof(*names));
	if (!ad || !arc || !names) {
		rc = dlock_sys_oom();
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		names[i] = srv[i].host;
	dlock_sys_saved_error saved; /* a name that does not resolve is not this check's error */
	dlock_sys_error_save(&saved);
	dlock_sys_resolve_all(ad, arc, names, n, deadline, KIND);
	dlock_sys_error_restore(&saved);
	for (size_t i = 0; i < n && !rc; i++) {
		for (size_t j = i + 1; j < n && !rc; j++) {
			if (srv[i].port != srv[j].port)
				continue;
			const char *same = NULL;
			if (strcmp(srv[i].host, srv[j].host) == 0)
				same = srv[i].host;
			for (size_t a = 0; !same && !arc[i] && !arc[j] && a < ad[i].n; a++)
				for (size_t b = 0; !same && b < ad[j].n; b++)
					if (strcmp(ad[i].addr[a], ad[j].addr[b]) == 0)
						same = ad[i].addr[a];
			if (same)
				rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL,
						     "redlock masters %zu (%s:%d) and %zu (%s:%d) are the same server "
						     "(%s port %d): a quorum must be of independent masters",
						     i + 1, srv[i].host, srv[i].port, j + 1, srv[j].host, srv[j].port,
						     same, srv[i].port);
		}
	}
out:
	free(ad);
	free(arc);
	free(names);
	return rc;
}

int dlock__redlock_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	dlock__rserver *srv = NULL;
	size_t n = 0;
	int rc = dlock__rserver_parse(&srv, &n, uri, KIND, 6379, uri->path);
	if (rc)
		return rc;
	double drift = 0.01;
	int64_t retry = 50;
	const char *d = dlock_uri_param(uri, "drift");
	if (d) {
		char *end;
		errno = 0;
		drift = strtod(d, &end);
		if (errno || end == d || *end || !(drift >= 0 && drift < 0.5)) {
			dlock__rservers_free(srv);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "bad drift '%s': a clock drift factor from 0 to 0.5 (default 0.01)", d);
		}
	}
	const char *r = dlock_uri_param(uri, "retry");
	if (r && (dlock_duration_parse(&retry, r) != 0 || retry < 1)) {
		dlock__rservers_free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "bad retry '%s': the longest random delay after a split vote, e.g. 50ms", r);
	}
	if (n < 3) {
		dlock__rservers_free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "redlock needs at least 3 independent masters (got %zu): "
				       "redlock://h1:p1,h2:p2,h3:p3; for one server use redis://",
				       n);
	}
	int64_t open_end = dlock_clock_ms() + uri->connect_timeout_ms; /* the whole open's bound */
	/* an unknown option is a usage error, before any connection */
	if ((rc = dlock_sys_uri_check_unused(uri)) != 0 || (rc = refuse_duplicates(srv, n, open_end)) != 0) {
		dlock__rservers_free(srv);
		return rc;
	}
	redlock_store *s = dlock_sys_calloc(1, sizeof(*s));
	if (!s) {
		dlock__rservers_free(srv);
		return DLOCK_ENOMEM;
	}
	s->srv = srv;
	s->n = n;
	s->quorum = n / 2 + 1;
	s->drift = drift;
	s->retry_ms = retry;
	s->request_timeout_ms = uri->request_timeout_ms > 0 ? uri->request_timeout_ms : 2000;
	dlock_backend_init(&s->base, &redlock_methods);
	if (!(s->c = calloc(n, sizeof(*s->c))) || !(s->quiet_until = calloc(n, sizeof(int64_t))) ||
	    !(s->owed = calloc(n, sizeof(*s->owed))) || (uri->user && !(s->user = dlock_sys_strdup(uri->user))) ||
	    (uri->password && !(s->password = dlock_sys_strdup(uri->password))) ||
	    !(s->prefix = dlock_sys_strdup(uri->prefix))) {
		rl_close(&s->base);
		return DLOCK_ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		srv[i].user = s->user;
		srv[i].password = s->password;
	}
	if ((rc = dlock__rnotify_new(&s->nt, &s->base, s->srv, n, KIND)) != 0) {
		rl_close(&s->base);
		return rc;
	}
	/* a quorum must answer now, or the store is unusable; all masters are
	 * asked at once, the whole open bounded by connect_timeout */
	int first_err = 0;
	char msg[512] = "";
	size_t up = load_scripts(s, open_end, &first_err, msg, sizeof(msg));
	if (up < s->quorum) {
		rc = first_err == DLOCK_EAUTH || first_err == DLOCK_EINVAL ? first_err : DLOCK_EUNAVAILABLE;
		rl_close(&s->base);
		return dlock_error_set(rc, KIND, NULL,
				       "only %zu of %zu redlock masters reachable (a quorum is %zu): %s", up, n,
				       n / 2 + 1, msg);
	}
	*out = &s->base;
	return 0;
}
