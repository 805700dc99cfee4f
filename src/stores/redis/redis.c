/*
 * The Redis store (redis://, redis+sentinel://): one server, Lua scripts for
 * every decision (one round trip per acquire/release/extend, one per renewal
 * batch; the files in lua/), pub/sub wake-ups for waiters (notify.c). Key layout and
 * script contracts: redis.h and docs/stores/redis.md.
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

#define KIND "redis"

/* ------------------------------------------------------------------------ */
/* the redis:// backend                                                      */
/* ------------------------------------------------------------------------ */

/* Releases sent without waiting for their replies (release=pipelined). */
#define PIPELINE_MAX 16
typedef struct rpending {
	char key[DLOCK__REDIS_KEY_MAX];
	char owner[DLOCK_SYS_OWNER_MAX];
} rpending;

typedef struct redis_store {
	dlock_backend base;
	dlock__rserver *srv; /* one */
	size_t nsrv;
	char *user, *password;
	char *prefix;
	redisContext *c;     /* non-blocking socket; every wait bounded by the call's deadline */
	char sha[DLOCK__RS_COUNT][41];
	dlock__rnotify *nt;
	bool retried;        /* the last run_argv sent its command a second time */
	dlock__rserver *sentinels; /* redis+sentinel://: where to ask for the master */
	size_t nsentinels;
	size_t sentinel_first; /* the sentinel that answered last: asked first */
	bool busy;           /* since the acquire began, a sentinel answered but no master could be used */
	bool unknown;        /* since the acquire began, a request was sent whose reply was never read */
	char *master_name;
	bool pipelined;      /* release=pipelined */
	rpending *pend;      /* [PIPELINE_MAX]: sent, reply not read yet, in order */
	size_t npend;
	rpending *again;     /* [PIPELINE_MAX]: answered NOSCRIPT, to send again */
	size_t nagain;
	int wait_replicas;   /* a grant returns only once on this many replicas (WAIT) */
	int fence_replicas;  /* fence guard: reservations go to this many replicas; 0 = off */
	char server_id[48];  /* run_id of the server s->c talks to (fence guard) */
} redis_store;

static void drop(redis_store *s)
{
	if (s->c)
		dlock__rfree(s->c);
	s->c = NULL;
	s->npend = 0; /* pipelined releases whose fate is unknown: they end with their leases */
}

/* Drop the connection when the server closed it while it was idle (an EOF
 * or a reset waiting on the socket: a restarted or killed server): a request
 * sent on it would never be read, and its outcome would look unknown. */
static void drop_if_closed(redis_store *s)
{
	char b;
	if (!s->c || s->npend)
		return;
	ssize_t n = recv(s->c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		drop(s);
}

/* A request that ran out of time: the message says so (the contract's "timed out"). */
static int timed_out_error(int rc, const char *what)
{
	/* a refused reply, a connection the server refused or reset, a failed TLS
	 * handshake, a name that does not resolve did not time out (our sockets
	 * are non-blocking: a timeout is ETIMEDOUT) */
	const char *code = dlock_error_last()->store_code;
	if (rc == DLOCK_EUNAVAILABLE && !strstr(dlock_error_last()->message, "timed out") &&
	    strcmp(code, "EPROTO") != 0 && strcmp(code, "ECONN") != 0 && strcmp(code, "TLS") != 0 &&
	    strcmp(code, "EIO") != 0 && strncmp(code, "EAI", 3) != 0)
		return dlock__rrewrap(rc, KIND, what);
	return rc;
}

/*
 * redis+sentinel://: ask the sentinels where the master named in the URI is,
 * the one that answered last first, then the others in order (each gets a
 * fair share of the time left, so one hung sentinel does not use it all, and
 * once another has answered a hung one is no longer asked first).
 */
static int sentinel_resolve(redis_store *s, int64_t deadline)
{
	int rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "no sentinel answered with the address of master '%s'",
				 s->master_name);
	for (size_t k = 0; k < s->nsentinels; k++) {
		size_t i = (s->sentinel_first + k) % s->nsentinels;
		int64_t left = dlock__rms_left(deadline);
		if (left <= 0)
			break;
		int64_t share = left / (int64_t)(s->nsentinels - k);
		/* an answer is one short round trip: a sentinel that takes longer
		 * than half a request is hung (connect_cmd asks again later) */
		int64_t most = s->srv[0].timeout_ms / 2 > 250 ? s->srv[0].timeout_ms / 2 : 250;
		if (s->nsentinels - k > 1 && share > most)
			share = most;
		if (share < 100)
			share = left < 100 ? left : 100;
		int64_t until = dlock_clock_ms() + share;
		dlock__rserver q = s->sentinels[i];
		q.user = q.password = NULL; /* sentinels without AUTH (see docs) */
		q.db = 0;
		redisContext *c = NULL;
		if (dlock__rconnect_by(&c, &q, KIND, until) != 0)
			continue;
		const char *argv[3] = { "SENTINEL", "get-master-addr-by-name", s->master_name };
		redisAppendCommandArgv(c, 3, argv, NULL);
		redisReply *r = NULL;
		bool ok = dlock__rread_by(c, &q, KIND, until, &r) == 0 && r->type == REDIS_REPLY_ARRAY &&
			  r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
			  r->element[1]->type == REDIS_REPLY_STRING;
		if (ok)
			dlock__rnotify_moved(s->nt, 0, r->element[0]->str, atoi(r->element[1]->str));
		if (r)
			freeReplyObject(r);
		dlock__rfree(c);
		if (ok) {
			s->sentinel_first = i;
			return 0;
		}
	}
	return rc;
}

/* Connect to the master the sentinels named and check that it is one (ROLE):
 * during a failover the old address may still answer, as a replica. */
static int connect_master(redis_store *s, int64_t deadline)
{
	int rc = dlock__rconnect_by(&s->c, &s->srv[0], KIND, deadline);
	if (rc)
		return rc;
	redisReply *r = NULL;
	redisAppendCommand(s->c, "ROLE");
	if ((rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r)) != 0) {
		drop(s);
		return rc;
	}
	bool master = r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
		      !strcmp(r->element[0]->str, "master");
	freeReplyObject(r);
	if (!master) {
		drop(s);
		return dlock_error_set(
			DLOCK_EUNAVAILABLE, KIND, "READONLY",
			"%s:%d, named master '%s' by the sentinels, is not a master (failover in progress?)",
			s->srv[0].host, s->srv[0].port, s->master_name);
	}
	return 0;
}

/* The fence guard names the server it talks to: its run_id, new for every
 * process; the script adds its master_replid, new on every promotion (a
 * failback keeps the run_id: fence.lua). */
static int fetch_server_id(redis_store *s, int64_t deadline)
{
	s->server_id[0] = 0;
	if (!s->fence_replicas)
		return 0;
	int rc = dlock__rrun_id(s->c, &s->srv[0], KIND, deadline, s->server_id, sizeof(s->server_id));
	if (rc)
		drop(s);
	return rc;
}

/*
 * (Re)connect the command connection by the deadline. Through the sentinels
 * when configured, asking them again until a master answers or the time is
 * up: during a failover the old master refuses, hangs or is a replica, and
 * the sentinels name the new one a moment later. One try at the master
 * named gets at most half the time left (at least 250 ms): a stopped master
 * does not use the whole deadline while the sentinels could name another.
 */
static int connect_cmd(redis_store *s, int64_t deadline)
{
	if (!s->sentinels) {
		int rc = dlock__rconnect_by(&s->c, &s->srv[0], KIND, deadline);
		if (!rc)
			rc = fetch_server_id(s, deadline);
		return timed_out_error(rc, "timed out: ");
	}
	int rc;
	char last[400] = ""; /* what the master named last said: the best explanation */
	for (;;) {
		rc = sentinel_resolve(s, deadline);
		if (!rc) {
			int64_t left = dlock__rms_left(deadline), cap = left / 2 > 250 ? left / 2 : 250;
			s->busy = true; /* until a master answers: a failover window */
			if ((rc = connect_master(s, dlock_clock_ms() + (cap < left ? cap : left))) == 0 &&
			    (rc = fetch_server_id(s, deadline)) == 0) {
				s->busy = false;
				return 0;
			}
		}
		if (rc != DLOCK_EUNAVAILABLE)
			return rc;
		if (s->srv[0].port)
			snprintf(last, sizeof(last), "%s", dlock_error_last()->message);
		int64_t left = dlock__rms_left(deadline);
		if (left <= 0)
			break;
		dlock_sys_sleep_ms(left < 50 ? left : 50);
	}
	if (last[0])
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT",
				       "timed out finding the master '%s' through the sentinels (last: %s)",
				       s->master_name, last);
	return timed_out_error(rc, "timed out finding the master through the sentinels: ");
}

/*
 * Read the replies of the pipelined releases, which come before the reply of
 * anything sent after them. A release the server did not run because its
 * script cache was flushed (NOSCRIPT) goes to s->again, for resend_releases.
 * @return 0; an error when the connection broke or the deadline passed (then
 * the caller drops it): a release that did not reach the server ends with
 * its lease.
 */
static int read_pending(redis_store *s, int64_t deadline)
{
	size_t n = s->npend;
	s->npend = 0;
	for (size_t i = 0; i < n; i++) {
		redisReply *r = NULL;
		int rc = dlock__rread_by(s->c, &s->srv[0], KIND, deadline, &r);
		if (rc)
			return rc;
		if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8) && s->nagain < PIPELINE_MAX)
			s->again[s->nagain++] = s->pend[i];
		/* any other answer needs nothing: 0 = the hold had already ended */
		freeReplyObject(r);
	}
	return 0;
}

/* Send one command and read its reply by the deadline, after the replies of
 * the pipelined releases sent before it: they share one round trip. */
static int exchange(redis_store *s, int argc, const char **argv, const size_t *lens, int64_t deadline, redisReply **out)
{
	*out = NULL;
	if (redisAppendCommandArgv(s->c, argc, argv, lens) != REDIS_OK)
		return dlock_sys_oom();
	int rc = read_pending(s, deadline);
	return rc ? rc : dlock__rread_by(s->c, &s->srv[0], KIND, deadline, out);
}

static redisReply *run_argv(redis_store *s, int script, int argc, const char **argv, size_t *lens, int64_t deadline,
			    int *rc);

/* Send again, confirmed this time, the pipelined releases that met a flushed script cache. */
static void resend_releases(redis_store *s, int64_t deadline)
{
	while (s->nagain) {
		rpending p = s->again[--s->nagain];
		const char *argv[5] = { NULL, NULL, "1", p.key, p.owner };
		size_t lens[5] = { 0, 0, 1, strlen(p.key), strlen(p.owner) };
		int rc;
		redisReply *r = run_argv(s, DLOCK__RS_RELEASE, 5, argv, lens, deadline, &rc);
		if (r)
			freeReplyObject(r);
	}
}

/* Before using the connection for anything but a script: the pipelined
 * releases' replies first. */
static void settle(redis_store *s, int64_t deadline)
{
	if (s->c && s->npend && read_pending(s, deadline) != 0)
		drop(s);
	resend_releases(s, deadline);
}

/*
 * Run a script by the deadline: EVALSHA, EVAL on NOSCRIPT (a restarted or
 * flushed server; EVAL also caches it again). A connection found dead (the
 * server restarted since our last call) is replaced and the call tried once
 * more, if time is left — every script is safe to repeat: acquire returns the
 * same grant to the same owner (with its expiry refreshed), release/renew/
 * cancel are owner-checked. A timeout is not retried: the connection is
 * dropped (a late reply must never answer a later request) and the caller
 * gets DLOCK_EUNAVAILABLE "timed out"; the next call reconnects.
 * Returns the reply (caller frees) or NULL with the error set in *rc.
 */
static redisReply *run_argv(redis_store *s, int script, int argc, const char **argv, size_t *lens, int64_t deadline,
			    int *rc)
{
	bool eval = !s->sha[script][0];
	s->retried = false;
	if (dlock__rms_left(deadline) < 3) { /* too late to start: nothing sent, no late reply to fear */
		*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT",
				      "%s %s:%d: timed out before the request was sent", KIND, s->srv[0].host,
				      s->srv[0].port);
		return NULL;
	}
	drop_if_closed(s);
	for (int attempt = 0; attempt < 2; attempt++) {
		s->retried = attempt > 0;
		bool fresh = false;
		if (!s->c) {
			if ((*rc = connect_cmd(s, deadline)) != 0)
				return NULL;
			fresh = true;
		}
		redisReply *r = NULL;
		for (;;) {
			argv[0] = eval ? "EVAL" : "EVALSHA";
			argv[1] = eval ? dlock__rscript_text[script] : s->sha[script];
			lens[0] = strlen(argv[0]);
			lens[1] = strlen(argv[1]);
			*rc = exchange(s, argc, argv, lens, deadline, &r);
			if (!*rc && !eval && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
				freeReplyObject(r);
				r = NULL;
				eval = true;
				continue;
			}
			break;
		}
		if (r && r->type == REDIS_REPLY_ERROR && s->sentinels && !strncmp(r->str, "READONLY", 8) && !fresh) {
			/* our master was demoted (failover): ask the sentinels again */
			freeReplyObject(r);
			drop(s);
			continue;
		}
		if (r) {
			if (r->type == REDIS_REPLY_ERROR) {
				*rc = dlock__rreply_error(r, &s->srv[0], KIND);
				freeReplyObject(r);
				return NULL;
			}
			*rc = 0;
			if (s->nagain) {
				bool retried = s->retried;
				resend_releases(s, deadline);
				s->retried = retried;
			}
			return r;
		}
		bool timeout = !strcmp(dlock_error_last()->store_code, "ETIMEDOUT");
		drop(s);
		s->unknown = true; /* sent; its reply never read */
		if (fresh || timeout || *rc == DLOCK_ENOMEM || dlock__rms_left(deadline) <= 0) {
			if (timeout)
				*rc = timed_out_error(*rc, "timed out: ");
			return NULL;
		}
	}
	return NULL;
}

static redisReply *run(redis_store *s, int script, dlock__rargs *a, int64_t deadline, int *rc)
{
	return run_argv(s, script, a->argc, a->argv, a->lens, deadline, rc);
}

static redis_store *RS(dlock_backend *be)
{
	return (redis_store *)be;
}

/*
 * After a grant: wait until the replicas have it (wait_replicas), or have the
 * fence reservation it made (reserve > 0; then confirm the reservation).
 * Otherwise give the grant back: a grant or a fence that a failover can lose
 * is not handed out. @return 0; DLOCK_EUNAVAILABLE.
 */
static int replicate_grant(redis_store *s, const dlock_request *req, const dlock__rkeys *k, long long reserve,
			   int64_t deadline)
{
	int n = s->wait_replicas;
	if (reserve > 0 && s->fence_replicas > n)
		n = s->fence_replicas;
	if (n <= 0)
		return 0;
	bool broken;
	long long acked = dlock__rwait_replicas(s->c, &s->srv[0], KIND, n, reserve, k, s->server_id, deadline, &broken);
	if (broken)
		drop(s);
	if (acked == -2)
		return timed_out_error(DLOCK_EUNAVAILABLE, "timed out waiting for the replicas: ");
	if (acked >= n)
		return 0;
	/* give it back (the core undoes it again if this does not arrive) */
	int rc;
	dlock__rargs a;
	dlock__rargs_owner(&a, k, req);
	redisReply *r = run(s, DLOCK__RS_RELEASE, &a, deadline, &rc);
	if (r)
		freeReplyObject(r);
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "NOREPLICAS",
			       "lock '%s': the grant reached %lld of %d replica(s) in time; given back%s", req->name,
			       acked < 0 ? 0 : acked, n, acked < 0 ? " (timed out)" : "");
}

/*
 * An acquire that found no master: when the sentinels answered (a failover
 * window: the master they name refuses, hangs or is a replica) and nothing
 * was sent whose outcome is unknown, a waiting caller hears "held, try
 * again soon" and its wait goes on to its end; otherwise rc.
 */
static int failover_wait(redis_store *s, const dlock_request *req, int rc, dlock_grant *out)
{
	if (rc != DLOCK_EUNAVAILABLE || !req->waiting || !s->sentinels || !s->busy || s->unknown)
		return rc;
	out->retry_ms = 50;
	rc = dlock_error_set(DLOCK_ELOCKED, KIND, NULL,
			     "lock '%s': the sentinels name no master that answers yet (failover?); trying again",
			     req->name);
	dlock__racquire_done(req, rc, out);
	return rc;
}

static int r_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	redis_store *s = RS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_acquire(&a, &k, req, 0);
	int64_t deadline = req->deadline_ms;
	int rc;
	redisReply *r = NULL;
	s->busy = s->unknown = false;
	drop_if_closed(s);
	if (s->fence_replicas) {
		/* ARGV[8]: the server's id, read when connecting: connect first */
		if (!s->c && (rc = connect_cmd(s, deadline)) != 0)
			return failover_wait(s, req, rc, out);
		dlock__rargs_add(&a, s->server_id);
	}
	r = run(s, DLOCK__RS_ACQUIRE, &a, deadline, &rc);
	if (!r)
		return failover_wait(s, req, rc, out);
	rc = dlock__racquire_reply(r, &out->fence, &out->retry_ms, KIND);
	long long reserve = 0;
	if (rc == 0 && r->elements == 3)
		dlock__rreply_int(r->element[2], &reserve);
	freeReplyObject(r);
	if (rc == 0 && (s->wait_replicas > 0 || reserve > 0) && s->c)
		rc = replicate_grant(s, req, &k, reserve, deadline);
	else if (rc == 0 && !s->c && (s->wait_replicas > 0 || reserve > 0))
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "lock '%s': connection lost before WAIT",
				     req->name);
	dlock__racquire_done(req, rc, out);
	return rc;
}

/*
 * release=pipelined: write the release and return without its reply; the
 * next command on the connection reads it (exchange). The script still checks
 * the owner; what the caller gives up is the answer ("was it still ours?").
 * @return false when it could not be sent (no connection): confirm instead.
 */
static bool send_release(redis_store *s, dlock__rargs *a, int64_t deadline)
{
	if (s->npend == PIPELINE_MAX || !s->sha[DLOCK__RS_RELEASE][0])
		settle(s, deadline);
	if (!s->c || !s->sha[DLOCK__RS_RELEASE][0])
		return false;
	a->argv[0] = "EVALSHA";
	a->argv[1] = s->sha[DLOCK__RS_RELEASE];
	a->lens[0] = 7;
	a->lens[1] = 40;
	if (redisAppendCommandArgv(s->c, a->argc, a->argv, a->lens) != REDIS_OK)
		return false;
	if (dlock__rflush_by(s->c, deadline) != 0) {
		drop(s); /* unknown whether it arrived: the confirmed path sends it again */
		return false;
	}
	rpending *p = &s->pend[s->npend++];
	snprintf(p->key, sizeof(p->key), "%.*s", (int)a->lens[3], a->argv[3]);
	snprintf(p->owner, sizeof(p->owner), "%.*s", (int)a->lens[4], a->argv[4]);
	return true;
}

static int r_release(dlock_backend *be, const dlock_request *req)
{
	redis_store *s = RS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	if (s->pipelined && !req->confirm && send_release(s, &a, req->deadline_ms))
		return 0;
	int rc;
	redisReply *r = run(s, DLOCK__RS_RELEASE, &a, req->deadline_ms, &rc);
	if (!r)
		return rc;
	long long v = 0;
	rc = dlock__rreply_int(r, &v) ? dlock__rbad_reply(KIND, "release") : 0;
	freeReplyObject(r);
	/* "not held" after a resend: the first send most likely released it before the
	 * connection broke (or the lease had ended: either way it is not held) */
	if (!rc && v != 1 && !s->retried)
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by %s", req->name, req->owner);
	return rc;
}

static int r_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	redis_store *s = RS(be);
	if (n == 0)
		return 0;
	dlock__rbatch b;
	int rc = dlock__rbatch_renew(&b, s->prefix, reqs, n);
	if (rc)
		return rc;
	redisReply *r = run_argv(s, DLOCK__RS_RENEW, b.argc, b.argv, b.lens, reqs[0]->deadline_ms, &rc);
	dlock__rbatch_free(&b);
	if (!r)
		return rc;
	rc = dlock__rrenew_reply(r, n, results, KIND);
	freeReplyObject(r);
	return rc;
}

static int r_watch(dlock_backend *be, const dlock_request *req)
{
	return dlock__rnotify_watch(RS(be)->nt, req, RS(be)->prefix);
}

static void r_unwatch(dlock_backend *be, const dlock_request *req)
{
	dlock__rnotify_forget(RS(be)->nt, req);
}

static int r_cancel(dlock_backend *be, const dlock_request *req)
{
	redis_store *s = RS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	int rc;
	redisReply *r = run(s, DLOCK__RS_CANCEL, &a, req->deadline_ms, &rc);
	if (r)
		freeReplyObject(r);
	return r ? 0 : rc;
}

static int status_one(redis_store *s, const char *name, int64_t deadline, dlock_lock_status **out, size_t *count)
{
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, name);
	dlock__rargs_status(&a, &k);
	int rc;
	redisReply *r = run(s, DLOCK__RS_STATUS, &a, deadline, &rc);
	if (!r)
		return rc;
	rc = dlock__rstatus_decode(r, name, out, count, KIND);
	freeReplyObject(r);
	return rc;
}

/* Escape glob characters of the prefix for SCAN MATCH. */
static void glob_escape(char *out, size_t cap, const char *s)
{
	size_t o = 0;
	for (; *s && o + 3 < cap; s++) {
		if (strchr("*?[]\\", *s))
			out[o++] = '\\';
		out[o++] = *s;
	}
	out[o] = 0;
}

/* Every name with holders or waiters: SCAN "{prefix:*", take holder hashes and
 * waiter sets. deadline > 0 bounds the whole scan (a connection made here is
 * non-blocking); 0: each SCAN gets srv->timeout_ms (blocking connection). */
static int scan_names(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
		      char ***names_io, size_t *n_io, int64_t deadline)
{
	char pat[2 * DLOCK__REDIS_PREFIX_MAX + 8], esc[2 * DLOCK__REDIS_PREFIX_MAX + 4];
	char pe[DLOCK__REDIS_PREFIX_MAX + 1];
	size_t plen = dlock__rprefix_enc(pe, sizeof(pe), prefix) + 2; /* "{prefix:" */
	glob_escape(esc, sizeof(esc), pe);
	snprintf(pat, sizeof(pat), "{%s:*", esc);
	char **names = *names_io;
	size_t n = *n_io, cap = n;
	char cursor[32] = "0";
	int rc = 0;
	do {
		int64_t until = deadline > 0 ? deadline : dlock_clock_ms() + srv->timeout_ms;
		if (!*cp && (rc = deadline > 0 ? dlock__rconnect_by(cp, srv, kind, until)
					       : dlock__rconnect(cp, srv, kind)) != 0)
			break;
		const char *argv[6] = { "SCAN", cursor, "MATCH", pat, "COUNT", "1000" };
		redisReply *r = NULL;
		redisAppendCommandArgv(*cp, 6, argv, NULL);
		if ((rc = dlock__rread_by(*cp, srv, kind, until, &r)) != 0) {
			dlock__rfree(*cp);
			*cp = NULL;
			break;
		}
		if (r->type == REDIS_REPLY_ERROR || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
			rc = r->type == REDIS_REPLY_ERROR ? dlock__rreply_error(r, srv, kind)
							  : dlock__rbad_reply(kind, "SCAN");
			freeReplyObject(r);
			break;
		}
		snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
		for (size_t i = 0; i < r->element[1]->elements && !rc; i++) {
			const redisReply *e = r->element[1]->element[i];
			if (e->type != REDIS_REPLY_STRING || e->len <= plen + 1)
				continue;
			size_t end;
			if (e->str[e->len - 1] == '}')
				end = e->len - 1;
			else if (e->len > plen + 3 && !strcmp(e->str + e->len - 3, "}:w"))
				end = e->len - 3;
			else
				continue;
			if (end <= plen || memchr(e->str, 0, e->len))
				continue;
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				char **nn = realloc(names, cap * sizeof(*names));
				if (!nn) {
					rc = dlock_sys_oom();
					break;
				}
				names = nn;
			}
			if (!(names[n] = dlock_sys_strndup(e->str + plen, end - plen)))
				rc = DLOCK_ENOMEM;
			else
				n++;
		}
		freeReplyObject(r);
	} while (!rc && strcmp(cursor, "0") != 0);
	*names_io = names;
	*n_io = n;
	return rc;
}

int dlock__rscan_names(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
		       char ***names, size_t *n)
{
	return scan_names(cp, srv, prefix, kind, names, n, 0);
}

int dlock__rscan_names_by(redisContext **cp, const dlock__rserver *srv, const char *prefix, const char *kind,
			  char ***names, size_t *n, int64_t deadline)
{
	return scan_names(cp, srv, prefix, kind, names, n, deadline > 0 ? deadline : 1);
}

/* The core lists through r_list, so names is never NULL here. Bounded by the
 * request timeout from the call (the contract's bound for status). */
static int r_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	redis_store *s = RS(be);
	int64_t deadline = dlock_clock_ms() + s->srv[0].timeout_ms;
	for (size_t i = 0; i < nnames; i++) {
		int rc = status_one(s, names[i], deadline, out, count);
		if (rc)
			return rc;
	}
	return 0;
}

static int r_list(dlock_backend *be, char ***names, size_t *n)
{
	redis_store *s = RS(be);
	int64_t deadline = dlock_clock_ms() + s->srv[0].timeout_ms;
	settle(s, deadline);
	int rc = s->c ? 0 : connect_cmd(s, deadline);
	if (!rc)
		rc = dlock__rscan_names_by(&s->c, &s->srv[0], s->prefix, KIND, names, n, deadline);
	if (rc)
		rc = timed_out_error(rc, dlock__rms_left(deadline) <= 0 ? "timed out: " : "");
	return rc;
}

static void r_close(dlock_backend *be)
{
	redis_store *s = RS(be);
	if (!s)
		return;
	if (s->pend && s->c)
		settle(s, dlock_clock_ms() + s->srv[0].timeout_ms); /* confirm what is pipelined first */
	dlock__rnotify_free(s->nt);
	drop(s);
	free(s->pend);
	free(s->again);
	dlock__rservers_free(s->srv);
	dlock__rservers_free(s->sentinels);
	free(s->master_name);
	free(s->user);
	dlock_sys_free_secret(s->password);
	free(s->prefix);
	free(s);
}

/* SCRIPT LOAD everything in one pipelined round trip; EVALSHA from then on. */
static int load_scripts(redis_store *s, int64_t deadline)
{
	bool broken;
	int rc = dlock__rload_scripts(s->c, &s->srv[0], KIND, dlock__rscript_text, s->sha, deadline, &broken);
	if (broken) {
		drop(s);
		return timed_out_error(rc, "timed out: ");
	}
	return rc;
}

/* A hold is keys in the server, keyed by owner: the renewer renews from an
 * instance (connection) of its own, never behind a caller's request. */
static const dlock_backend_methods redis_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_RENEW_APART,
	.acquire = r_acquire,
	.release = r_release,
	.renew = r_renew,
	.watch = r_watch,
	.unwatch = r_unwatch,
	.cancel = r_cancel,
	.status = r_status,
	.list = r_list,
	.close = r_close,
};

int dlock__redis_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	int64_t deadline = dlock_clock_ms() + uri->connect_timeout_ms; /* the whole open */
	bool sentinel = !strcmp(uri->scheme, "redis+sentinel");
	/* redis+sentinel://s1:p1,s2:p2/MASTERNAME[/db] */
	char master[256] = "";
	const char *dbpath = uri->path;
	if (sentinel) {
		const char *p = uri->path && uri->path[0] == '/' ? uri->path + 1 : "";
		size_t len = strcspn(p, "/");
		if (!len || len >= sizeof(master))
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "redis+sentinel:// needs the master's name: "
					       "redis+sentinel://host:26379,host:26379/MASTERNAME[/db]");
		memcpy(master, p, len);
		master[len] = 0;
		dbpath = p + len;
	}
	dlock__rserver *srv = NULL;
	size_t n = 0;
	int rc = dlock__rserver_parse(&srv, &n, uri, KIND, sentinel ? 26379 : 6379, dbpath);
	if (rc)
		return rc;
	if (n != 1 && !sentinel) {
		dlock__rservers_free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "redis:// takes exactly one host (got %zu); for several independent masters "
				       "use redlock://h1:p1,h2:p2,h3:p3",
				       n);
	}
	redis_store *s = dlock_sys_calloc(1, sizeof(*s));
	if (!s) {
		dlock__rservers_free(srv);
		return DLOCK_ENOMEM;
	}
	if (sentinel) { /* srv: the sentinels; s->srv: the master, found at connect */
		s->sentinels = srv;
		s->nsentinels = n;
		if (!(s->master_name = dlock_sys_strdup(master)) || !(s->srv = dlock_sys_calloc(1, sizeof(*s->srv))))
			goto oom;
		s->srv[0] = srv[0];
		s->srv[0].tls_owner = false; /* the sentinels' array owns the TLS settings */
		s->srv[0].host[0] = 0;
		s->srv[0].port = 0;
	} else {
		s->srv = srv;
	}
	s->nsrv = 1;
	dlock_backend_init(&s->base, &redis_methods);
	/* the URI outlives nothing: keep our own copies of what srv borrows */
	if (uri->user && *uri->user && !(s->user = dlock_sys_strdup(uri->user)))
		goto oom;
	if (uri->password && !(s->password = dlock_sys_strdup(uri->password)))
		goto oom;
	if (!(s->prefix = dlock_sys_strdup(uri->prefix)))
		goto oom;
	s->srv[0].user = s->user;
	s->srv[0].password = s->password;
	const char *rel = dlock_uri_param(uri, "release");
	if (rel && strcmp(rel, "confirmed") != 0 && strcmp(rel, "pipelined") != 0) {
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "option release: want confirmed or pipelined, not '%s'",
				     rel);
		goto fail;
	}
	if (rel && !strcmp(rel, "pipelined")) {
		s->pipelined = true;
		if (!(s->pend = dlock_sys_calloc(PIPELINE_MAX, sizeof(*s->pend))) ||
		    !(s->again = dlock_sys_calloc(PIPELINE_MAX, sizeof(*s->again))))
			goto oom;
	}
	/* Sentinel: a failover must not lose a grant that was handed out, nor
	 * make a fence go back (see docs/stores/redis.md) */
	s->wait_replicas = s->fence_replicas = sentinel ? 1 : 0;
	if ((rc = dlock__rreplicas_option(uri, KIND, &s->wait_replicas, &s->fence_replicas)) != 0)
		goto fail;
	/* An unknown option is a usage error, before any connection. */
	if ((rc = dlock_sys_uri_check_unused(uri)) != 0)
		goto fail;
	if ((rc = dlock__rnotify_new(&s->nt, &s->base, s->srv, 1, KIND)) != 0)
		goto fail;
	if ((rc = connect_cmd(s, deadline)) != 0)
		goto fail;
	if ((rc = load_scripts(s, deadline)) != 0)
		goto fail;
	*out = &s->base;
	return 0;
oom:
	rc = DLOCK_ENOMEM;
fail:
	if (!s->srv && !s->sentinels)
		dlock__rservers_free(srv);
	r_close(&s->base);
	return rc;
}
