/*
 * The Redlock store: N >= 3 independent Redis masters, a lock is held when a
 * quorum (N/2 + 1) granted it within its validity. Every request goes to all
 * masters at once (one poll loop over N connections), each with a per-master
 * timeout well below the TTL. The scripts, key layout, connection handshake
 * and pub/sub notifier are the Redis store's (redis_common.h); this file adds
 * the fan-out, the quorum rules and the fence rule:
 *
 *   fence = max over the granting quorum of each master's INCR, then a second
 *   parallel round raises every master's counter to max(counter, fence), and
 *   acquire succeeds only when a quorum confirmed it. Any later grant's quorum
 *   intersects that one, so its INCRs start above the fence (proof and limits:
 *   docs/stores/redlock.md).
 */
#include "stores/redis_common.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIND "redlock"
#define QUIET_MS 1000

typedef struct rlock {
	dlock_backend base;
	dlock__rserver *srv;
	size_t n;
	size_t quorum;
	char *user, *password, *prefix;
	double drift;
	int64_t retry_ms;
	redisContext **c;
	int64_t *quiet_until; /* a master that just timed out is left alone until then */
	char sha[DLOCK__RS_COUNT][41];
	dlock__rnotify *nt;
} rlock;

/* One master's part of a parallel round. */
typedef struct rl_op {
	redisReply *reply; /* the answer (owned), NULL on failure */
	int rc;            /* 0, or why there is no reply */
	int skip;          /* handshake replies (AUTH, SELECT) still to read first */
	bool done, eval, want;
} rl_op;

static rlock *RL(dlock_backend *be)
{
	return (rlock *)be;
}

static struct timeval ms_tv(int64_t ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000) };
	return tv;
}

/* Per-master timeout: the configured one, but at most a tenth of the TTL so a
 * hung master costs a small part of the lease (at least 5 ms). */
static int64_t master_timeout(const rlock *s, int64_t ttl_ms)
{
	int64_t t = ttl_ms / 10;
	if (t < 5)
		t = 5;
	return t < s->srv[0].timeout_ms ? t : s->srv[0].timeout_ms;
}

static void drop(rlock *s, size_t i)
{
	if (s->c[i])
		redisFree(s->c[i]);
	s->c[i] = NULL;
}

static int op_fail(rlock *s, rl_op *op, size_t i, const char *what)
{
	op->rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "EIO", "redlock master %s:%d: %s", s->srv[i].host,
				 s->srv[i].port, what);
	op->done = true;
	drop(s, i);
	return op->rc;
}

static void append_script(rlock *s, size_t i, rl_op *op, int script, int argc, const char **argv, size_t *lens)
{
	bool eval = op->eval || !s->sha[script][0];
	argv[0] = eval ? "EVAL" : "EVALSHA";
	argv[1] = eval ? dlock__rscript_text[script] : s->sha[script];
	lens[0] = strlen(argv[0]);
	lens[1] = strlen(argv[1]);
	redisAppendCommandArgv(s->c[i], argc, argv, lens);
}

static bool flush(redisContext *c)
{
	int done = 0;
	while (!done)
		if (redisBufferWrite(c, &done) != REDIS_OK)
			return false;
	return true;
}

/*
 * Send one script call to every master (ops[i].want) at once and collect the
 * answers until each has answered or timeout_ms passed. A master that times
 * out loses its connection (a late reply would answer the next request); it
 * is reconnected on the next round. Fresh connections send AUTH/SELECT in
 * the same write as the script, so a reconnect costs no extra round trip.
 */
static void rl_round(rlock *s, rl_op *ops, int script, int argc, const char **argv, size_t *lens,
		     int64_t timeout_ms)
{
	int64_t deadline = dlock_clock_ms() + timeout_ms;
	for (size_t i = 0; i < s->n; i++) {
		rl_op *op = &ops[i];
		op->reply = NULL;
		op->rc = 0;
		op->skip = 0;
		op->eval = false;
		op->done = !op->want;
		if (op->done)
			continue;
		if (!s->c[i] && dlock_clock_ms() < s->quiet_until[i]) {
			op_fail(s, op, i, "timed out recently; not asked again yet");
			continue;
		}
		if (!s->c[i]) {
			int64_t ct = s->srv[i].connect_timeout_ms < timeout_ms ? s->srv[i].connect_timeout_ms : timeout_ms;
			redisContext *c = redisConnectWithTimeout(s->srv[i].host, s->srv[i].port, ms_tv(ct));
			if (!c || c->err) {
				char what[160];
				snprintf(what, sizeof(what), "cannot connect: %s", c ? c->errstr : "out of memory");
				if (c)
					redisFree(c);
				op_fail(s, op, i, what);
				continue;
			}
			redisSetTimeout(c, ms_tv(s->srv[i].timeout_ms));
			redisEnableKeepAlive(c);
			s->c[i] = c;
			if (s->srv[i].password) {
				const char *a[3] = { "AUTH", s->srv[i].user ? s->srv[i].user : s->srv[i].password,
						     s->srv[i].password };
				redisAppendCommandArgv(c, s->srv[i].user ? 3 : 2, a, NULL);
				op->skip++;
			}
			if (s->srv[i].db) {
				char db[16];
				snprintf(db, sizeof(db), "%d", s->srv[i].db);
				const char *a[2] = { "SELECT", db };
				redisAppendCommandArgv(c, 2, a, NULL);
				op->skip++;
			}
		}
		append_script(s, i, op, script, argc, argv, lens);
		if (!flush(s->c[i]))
			op_fail(s, op, i, s->c[i] && s->c[i]->errstr[0] ? s->c[i]->errstr : "write failed");
	}
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
				pf[np].events = POLLIN;
				pf[np].revents = 0;
				idx[np++] = i;
			}
		if (!np)
			break;
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0) {
			for (size_t k = 0; k < np; k++) {
				char what[64];
				snprintf(what, sizeof(what), "no answer within %lld ms", (long long)timeout_ms);
				op_fail(s, &ops[idx[k]], idx[k], what);
				/* hung, not refusing (SIGSTOP, overload): do not make every request
				 * wait for it again; try it again after QUIET_MS */
				s->quiet_until[idx[k]] = dlock_clock_ms() + QUIET_MS;
			}
			break;
		}
		int pr = poll(pf, np, (int)left);
		if (pr < 0 && errno != EINTR) {
			for (size_t k = 0; k < np; k++)
				op_fail(s, &ops[idx[k]], idx[k], strerror(errno));
			break;
		}
		for (size_t k = 0; k < np && pr > 0; k++) {
			size_t i = idx[k];
			rl_op *op = &ops[i];
			if (!pf[k].revents)
				continue;
			if (redisBufferRead(s->c[i]) != REDIS_OK) {
				op_fail(s, op, i, s->c[i]->errstr[0] ? s->c[i]->errstr : "connection lost");
				continue;
			}
			void *v = NULL;
			while (!op->done && redisGetReplyFromReader(s->c[i], &v) == REDIS_OK && v) {
				redisReply *r = v;
				v = NULL;
				if (op->skip > 0) {
					op->skip--;
					if (r->type == REDIS_REPLY_ERROR) {
						int code = dlock__rreply_error(r, &s->srv[i], KIND);
						freeReplyObject(r);
						op->rc = code == DLOCK_ESTORE ? DLOCK_EAUTH : code;
						op->done = true;
						drop(s, i);
					} else {
						freeReplyObject(r);
					}
					continue;
				}
				if (r->type == REDIS_REPLY_ERROR && !op->eval && !strncmp(r->str, "NOSCRIPT", 8)) {
					freeReplyObject(r);
					op->eval = true; /* restarted or flushed master: send the text (caches it again) */
					append_script(s, i, op, script, argc, argv, lens);
					if (!flush(s->c[i]))
						op_fail(s, op, i, "write failed");
					continue;
				}
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
	}
	free(pf);
	free(idx);
}

static void ops_clear(rlock *s, rl_op *ops)
{
	for (size_t i = 0; i < s->n; i++) {
		if (ops[i].reply)
			freeReplyObject(ops[i].reply);
		ops[i].reply = NULL;
		ops[i].want = false;
	}
}

static void ops_all(rlock *s, rl_op *ops)
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

static int rl_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	rlock *s = RL(be);
	int rc = unsupported(req);
	if (rc)
		return rc;
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock__oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	/* one queue ticket for every master, and for every try of this acquire: all
	 * masters order their fair queues alike, so the first waiter heads a quorum,
	 * and a waiter that must rejoin a queue (a partial grant it undid removed it
	 * from those masters' queues) rejoins at its own place, not behind later ones */
	dlock__rargs_acquire(&a, &k, req, req->fair ? req->ticket_us : 0);
	dlock__rnotify_arm(s->nt, req);
	int64_t t0 = dlock_clock_ms();
	int64_t tmo = master_timeout(s, req->ttl_ms);
	int64_t drift = (int64_t)((double)req->ttl_ms * s->drift) + 2;
	ops_all(s, ops);
	rl_round(s, ops, DLOCK__RS_ACQUIRE, a.argc, a.argv, a.lens, tmo);
	size_t grants = 0, refused = 0, at_top = 0;
	uint64_t top = 0;
	int64_t soonest = -1;
	int err = 0;
	char errmsg[256] = "";
	for (size_t i = 0; i < s->n; i++) {
		if (!ops[i].reply) {
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
	/* When a quorum already counted up to the token (masters in step: the usual
	 * case), that quorum is the one the fence rule needs: no second round. */
	if (ok && at_top < s->quorum) {
		/* second round: raise every counter to the token before anyone can see it */
		char tok[24];
		const char *argv[5];
		size_t lens[5];
		argv[2] = "1";
		lens[2] = 1;
		argv[3] = k.k[DLOCK__RK_H];
		lens[3] = k.len[DLOCK__RK_H];
		lens[4] = (size_t)snprintf(tok, sizeof(tok), "%llu", (unsigned long long)top);
		argv[4] = tok;
		ops_all(s, ops);
		rl_round(s, ops, DLOCK__RS_RAISE, 5, argv, lens, tmo);
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
		*fence = top;
		dlock__racquire_done(req, 0);
		dlock__rnotify_forget(s->nt, req);
		return 0;
	}
	if (grants) { /* undo partial grants everywhere (a lost reply may hide one) */
		dlock__rargs r;
		dlock__rargs_owner(&r, &k, req);
		r.argv[r.argc] = "0"; /* quietly: nobody was granted, waking all would only feed the stampede */
		r.lens[r.argc++] = 1;
		ops_all(s, ops);
		rl_round(s, ops, DLOCK__RS_RELEASE, r.argc, r.argv, r.lens, tmo);
		ops_clear(s, ops);
	}
	free(ops);
	if (grants + refused < s->quorum)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "only %zu of %zu redlock masters answered (a quorum is %zu): %s",
				       grants + refused, s->n, s->quorum, errmsg[0] ? errmsg : "timed out");
	dlock__racquire_done(req, DLOCK_ELOCKED);
	/* a split vote (some grants) retries after a random delay; else when the lease ends */
	int64_t jitter = dlock__rand_between(s->retry_ms / 2 + 1, s->retry_ms);
	*retry_ms = grants || soonest < 0 ? jitter : soonest;
	return DLOCK_ELOCKED;
}

static int rl_release(dlock_backend *be, dlock_request *req)
{
	rlock *s = RL(be);
	dlock__rnotify_forget(s->nt, req);
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock__oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	ops_all(s, ops);
	rl_round(s, ops, DLOCK__RS_RELEASE, a.argc, a.argv, a.lens, master_timeout(s, req->ttl_ms));
	size_t released = 0, answered = 0;
	int err = 0;
	for (size_t i = 0; i < s->n; i++) {
		if (!ops[i].reply) {
			err = err ? err : ops[i].rc;
			continue;
		}
		answered++;
		if (ops[i].reply->type == REDIS_REPLY_INTEGER && ops[i].reply->integer == 1)
			released++;
	}
	ops_clear(s, ops);
	free(ops);
	if (released)
		return 0;
	if (!answered)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "no redlock master answered the release");
	return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s' is not held by %s on any master", req->name,
			       req->owner);
}

/*
 * Renew a batch on every master at once. A lock stays ours when a quorum
 * renewed it; it is lost (ENOTHELD) once so many masters said "not yours"
 * that a quorum can no longer be reached; otherwise (masters silent) the
 * result is transient and the core retries until the lease deadline.
 */
static int rl_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	rlock *s = RL(be);
	if (!n)
		return 0;
	dlock__rbatch b;
	int rc = dlock__rbatch_renew(&b, s->prefix, reqs, n);
	if (rc)
		return rc;
	rl_op *ops = calloc(s->n, sizeof(*ops));
	size_t *yes = calloc(n, sizeof(*yes)), *no = calloc(n, sizeof(*no));
	int *one = calloc(n, sizeof(*one));
	if (!ops || !yes || !no || !one) {
		free(ops);
		free(yes);
		free(no);
		free(one);
		dlock__rbatch_free(&b);
		return dlock__oom();
	}
	int64_t ttl = reqs[0]->ttl_ms;
	for (size_t j = 1; j < n; j++)
		if (reqs[j]->ttl_ms < ttl)
			ttl = reqs[j]->ttl_ms;
	ops_all(s, ops);
	rl_round(s, ops, DLOCK__RS_RENEW, b.argc, b.argv, b.lens, master_timeout(s, ttl));
	size_t answered = 0;
	for (size_t i = 0; i < s->n; i++) {
		if (!ops[i].reply || dlock__rrenew_reply(ops[i].reply, n, one, KIND) != 0)
			continue;
		answered++;
		for (size_t j = 0; j < n; j++) {
			if (one[j] == 0)
				yes[j]++;
			else
				no[j]++;
		}
	}
	ops_clear(s, ops);
	for (size_t j = 0; j < n; j++) {
		if (yes[j] >= s->quorum)
			results[j] = 0;
		else if (s->n - no[j] < s->quorum)
			results[j] = DLOCK_ENOTHELD;
		else
			results[j] = DLOCK_EUNAVAILABLE;
	}
	if (!answered)
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "no redlock master answered the renewal");
	else if (answered < s->quorum)
		dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "only %zu of %zu redlock masters answered the renewal",
				answered, s->n);
	free(ops);
	free(yes);
	free(no);
	free(one);
	dlock__rbatch_free(&b);
	return rc;
}

static int rl_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	dlock_request copy = *req;
	copy.ttl_ms = ttl_ms;
	dlock_request *p = &copy;
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
	int64_t drift = (int64_t)((double)ttl_ms * RL(be)->drift) + 2;
	if (dlock_clock_ms() - t0 >= ttl_ms - drift)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "lock '%s': extension confirmed too late", req->name);
	return 0;
}

static int rl_wait(dlock_backend *be, dlock_request *req, int64_t timeout_ms)
{
	rlock *s = RL(be);
	dlock__rkeys k;
	dlock__rkeys_make(&k, s->prefix, req->name);
	return dlock__rnotify_wait(s->nt, req, k.k[DLOCK__RK_C], timeout_ms);
}

static int rl_cancel(dlock_backend *be, dlock_request *req)
{
	rlock *s = RL(be);
	dlock__rnotify_forget(s->nt, req);
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock__oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	req->slot = NULL;
	ops_all(s, ops);
	rl_round(s, ops, DLOCK__RS_CANCEL, a.argc, a.argv, a.lens, master_timeout(s, req->ttl_ms));
	ops_clear(s, ops);
	free(ops);
	return 0;
}

/* Status of one name: holders seen on a quorum of masters (min TTL, max fence). */
static int status_one(rlock *s, const char *name, dlock_lock_status **out, size_t *count)
{
	rl_op *ops = calloc(s->n, sizeof(*ops));
	if (!ops)
		return dlock__oom();
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, name);
	dlock__rargs_status(&a, &k);
	ops_all(s, ops);
	rl_round(s, ops, DLOCK__RS_STATUS, a.argc, a.argv, a.lens, s->srv[0].timeout_ms);
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
				     "only %zu of %zu redlock masters answered (a quorum is %zu)", nper, s->n, s->quorum);
	dlock_lock_status *st = rc ? NULL : dlock__status_add(out, count);
	if (!rc && (!st || !(st->name = dlock__strdup(name))))
		rc = DLOCK_ENOMEM;
	for (size_t m = 0; m < nper && !rc; m++) {
		if (per[m].last_fence > st->last_fence)
			st->last_fence = per[m].last_fence;
		if (per[m].waiters > st->waiters)
			st->waiters = per[m].waiters;
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
			dlock_holder *nh = dlock__status_add_holder(st);
			if (!nh || !(nh->owner = dlock__strdup(ho->owner)) || !(nh->host = dlock__strdup(ho->host))) {
				rc = DLOCK_ENOMEM;
				break;
			}
			nh->pid = ho->pid;
			nh->mode = ho->mode;
			nh->fence = fence;
			nh->ttl_left_ms = ttl;
		}
	}
	dlock_status_free(per, nper);
	return rc;
}

static int rl_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count)
{
	rlock *s = RL(be);
	for (size_t i = 0; i < nnames; i++) { /* the core lists through rl_list: names is never NULL */
		int rc = status_one(s, names[i], out, count);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every master's names; a quorum must answer, or a lock held on it could be missed. */
static int rl_list(dlock_backend *be, char ***names, size_t *n)
{
	rlock *s = RL(be);
	size_t reached = 0;
	for (size_t i = 0; i < s->n; i++)
		if (dlock__rscan_names(&s->c[i], &s->srv[i], s->prefix, KIND, names, n) == 0)
			reached++;
	if (reached < s->quorum)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "only %zu of %zu redlock masters answered SCAN",
				       reached, s->n);
	return 0;
}

static void rl_close(dlock_backend *be)
{
	rlock *s = RL(be);
	if (!s)
		return;
	dlock__rnotify_free(s->nt);
	for (size_t i = 0; s->c && i < s->n; i++)
		drop(s, i);
	free(s->c);
	free(s->quiet_until);
	free(s->srv);
	free(s->user);
	free(s->password);
	free(s->prefix);
	free(s);
}

/* Learn the scripts' SHA1s from the first master that loads them. */
static void load_scripts(rlock *s)
{
	for (size_t i = 0; i < s->n; i++) {
		if (!s->c[i])
			continue;
		for (int j = 0; j < DLOCK__RS_COUNT; j++) {
			const char *argv[3] = { "SCRIPT", "LOAD", dlock__rscript_text[j] };
			redisAppendCommandArgv(s->c[i], 3, argv, NULL);
		}
		bool ok = true;
		for (int j = 0; j < DLOCK__RS_COUNT; j++) {
			void *v = NULL;
			if (redisGetReply(s->c[i], &v) != REDIS_OK || !v) {
				ok = false;
				drop(s, i);
				break;
			}
			redisReply *r = v;
			if (r->type == REDIS_REPLY_STRING && r->len == 40)
				memcpy(s->sha[j], r->str, 41);
			freeReplyObject(r);
		}
		if (ok)
			return;
	}
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
			free(srv);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "bad drift '%s': a clock drift factor from 0 to 0.5 (default 0.01)", d);
		}
	}
	const char *r = dlock_uri_param(uri, "retry");
	if (r && (dlock_duration_parse(&retry, r) != 0 || retry < 1)) {
		free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "bad retry '%s': the longest random delay after a split vote, e.g. 50ms", r);
	}
	if (n < 3) {
		free(srv);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "redlock needs at least 3 independent masters (got %zu): "
				       "redlock://h1:p1,h2:p2,h3:p3; for one server use redis://",
				       n);
	}
	rlock *s = dlock__calloc(1, sizeof(*s));
	if (!s) {
		free(srv);
		return DLOCK_ENOMEM;
	}
	s->srv = srv;
	s->n = n;
	s->quorum = n / 2 + 1;
	s->drift = drift;
	s->retry_ms = retry;
	s->base.version = DLOCK_BACKEND_VERSION;
	s->base.kind = KIND;
	s->base.acquire = rl_acquire;
	s->base.release = rl_release;
	s->base.extend = rl_extend;
	s->base.renew = rl_renew;
	s->base.wait = rl_wait;
	s->base.cancel = rl_cancel;
	s->base.status = rl_status;
	s->base.list = rl_list;
	s->base.close = rl_close;
	if (!(s->c = calloc(n, sizeof(*s->c))) || !(s->quiet_until = calloc(n, sizeof(int64_t))) || (uri->user && !(s->user = dlock__strdup(uri->user))) ||
	    (uri->password && !(s->password = dlock__strdup(uri->password))) ||
	    !(s->prefix = dlock__strdup(uri->prefix))) {
		rl_close(&s->base);
		return DLOCK_ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		srv[i].user = s->user;
		srv[i].password = s->password;
	}
	if ((rc = dlock__rnotify_new(&s->nt, s->srv, n, KIND)) != 0) {
		rl_close(&s->base);
		return rc;
	}
	/* a quorum must answer now, or the store is unusable */
	size_t up = 0;
	int first_err = 0;
	char msg[512] = "";
	for (size_t i = 0; i < n; i++) {
		int e = dlock__rconnect(&s->c[i], &srv[i], KIND);
		if (!e) {
			up++;
		} else if (!first_err || e == DLOCK_EAUTH) {
			first_err = e;
			snprintf(msg, sizeof(msg), "%s", dlock_error_last()->message);
		}
	}
	if (up < s->quorum) {
		rc = first_err == DLOCK_EAUTH || first_err == DLOCK_EINVAL ? first_err : DLOCK_EUNAVAILABLE;
		rl_close(&s->base);
		return dlock_error_set(rc, KIND, NULL, "only %zu of %zu redlock masters reachable (a quorum is %zu): %s",
				       up, n, n / 2 + 1, msg);
	}
	load_scripts(s);
	*out = &s->base;
	return 0;
}
