/* ZooKeeper store: acquire, release, extend, renew, cancel, wait (zk.h). */
#include "zk.h"

/* ---------------------------------------------------------------- methods */

/*
 * A waiting acquire whose try the ensemble did not serve (no session
 * connected within the try, or its connection lost meanwhile: a leader
 * election, a member that stopped and is being left) although it was
 * reachable before: "held, look again soon", so that the wait rides the
 * election out until its deadline instead of ending as unavailable on a
 * first try. A node whose create was in doubt went to the sweep, which the
 * next try's claim of the orphan waits for (and adopts the node).
 */
static int ride_out(zookeeper_store *st, const dlock_request *req, int rc, dlock_grant *out)
{
	if (rc != DLOCK_EUNAVAILABLE || !req->waiting)
		return rc;
	pthread_mutex_lock(&st->mu);
	bool seen = st->ever_connected;
	pthread_mutex_unlock(&st->mu);
	if (!seen)
		return rc;
	out->retry_ms = 50;
	char why[256]; /* the error is rewritten below: its text copied first */
	snprintf(why, sizeof(why), "%s", dlock_error_last()->message);
	return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s': not served in this try (%s); trying again",
			       req->name, why);
}

static int acquire_try(zookeeper_store *st, const dlock_request *req, dlock_grant *out);

int dlock__zk_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	zookeeper_store *st = (zookeeper_store *)be;
	return ride_out(st, req, acquire_try(st, req, out), out);
}

static int acquire_try(zookeeper_store *st, const dlock_request *req, dlock_grant *out)
{
	int64_t start = dlock_clock_ms();
	int64_t deadline = req->deadline_ms;
	if (st->recipe != RECIPE_DLOCK &&
	    (req->permits > 1 || (st->recipe == RECIPE_CURATOR && req->mode == DLOCK_SHARED)))
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL, "recipe=%s: %s",
				       st->recipe == RECIPE_CURATOR ? "curator" : "curator-rw",
				       req->permits > 1 ? "Curator's semaphores lay out nodes of their own: no "
							  "semaphores in a Curator recipe"
							: "Curator's InterProcessMutex does not order read nodes: "
							  "use recipe=curator-rw for shared locks");
	dlock__zk_reap(st);
	hold *h = out->slot = dlock__zk_current_hold(st, req, deadline);
	if (h && dlock__zk_sess_dead(st, h->sess)) {
		/* our queue position died with the session: queue again */
		dlock__zk_hold_free(st, h);
		out->slot = h = NULL;
	}
	zsess *z;
	int rc = dlock__zk_session_for(st, req->ttl_ms, deadline, &z);
	if (rc)
		return rc;
	if (!h) {
		h = dlock_sys_calloc(1, sizeof(*h));
		if (!h)
			return DLOCK_ENOMEM;
		h->next = st->holds;
		if (st->holds)
			st->holds->prev = h;
		st->holds = h;
		h->owner = dlock_sys_strdup(req->owner);
		h->dir = dlock__zk_dir_of(st, req->name);
		if (!h->owner || !h->dir) {
			dlock__zk_hold_free(st, h);
			return DLOCK_ENOMEM;
		}
		pthread_mutex_lock(&st->mu);
		h->sess = z;
		z->refs++;
		pthread_mutex_unlock(&st->mu);
		out->slot = h;
		int r = dlock__zk_claim_orphan(st, h, deadline);
		if (r != ZOK) {
			out->slot = NULL;
			dlock__zk_hold_free(st, h);
			return dlock__zk_zerr(r, "wait for the sweep of", req->name);
		}
	}
	bool granted = false;
	for (int round = 0;; round++) {
		bool listed = false;
		if (!h->node) {
			rc = 1;
			if (round == 0 && !h->doubt) {
				rc = dlock__zk_create_and_list(st, h, req, deadline, &granted);
				listed = rc == 0 || rc == 2;
			}
			if (rc == 1 && !h->node)
				rc = dlock__zk_place_node(st, h, req, deadline);
			if (rc == 1)
				rc = 0;
			if (rc && rc != 2)
				break;
		}
		if (!listed)
			rc = dlock__zk_evaluate(st, h, req, deadline, &granted);
		if (rc == 2) {
			/* Our place in line is known and the time ran out before we
			 * could look again: not granted, still queued (the core
			 * cancels or tries again). */
			if (req->waiting)
				return DLOCK_ELOCKED;
			rc = dlock__zk_zerr(ZDEADLINE, "list", h->dir);
		}
		if (rc != 1)
			break;
		/* Our node is gone (deleted by hand, or by `dlock release` with our
		 * handle from elsewhere): queue again, a few times at most. */
		free(h->node);
		h->node = NULL;
		if (round >= 2) {
			rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZNONODE",
					     "zookeeper: our lock node under %s keeps disappearing", h->dir);
			break;
		}
	}
	if (rc) {
		out->slot = NULL;
		if (h->node || h->doubt)
			dlock__zk_orphan_hold(st, h); /* our node, or a create in doubt: swept */
		else
			dlock__zk_hold_free(st, h);
		return rc;
	}
	if (granted) {
		free(h->watch);
		h->watch = NULL;
		out->fence = (uint64_t)h->czxid;
		dlock__zk_lease_set(st, h, start, req->ttl_ms, false);
		return 0;
	}
	if (!req->waiting) {
		out->slot = NULL;
		dlock__zk_discard_hold(st, h, deadline);
	}
	return DLOCK_ELOCKED;
}

/* release/extend of a hold this handle did not make (an attached handle, or
 * the core retrying a release that was not confirmed): find its node by owner. */
static int by_owner(zookeeper_store *st, const dlock_request *req, bool del, int64_t deadline)
{
	zsess *z;
	int rc = dlock__zk_get_session(st, dlock__zk_session_key(st, st->default_ttl), deadline, &z);
	if (rc)
		return rc;
	char *dir = dlock__zk_dir_of(st, req->name);
	if (!dir)
		return DLOCK_ENOMEM;
	int n = 0;
	int r;
	if (del) {
		r = dlock__zk_delete_owned(st, z->zh, dir, req->owner, deadline, &n);
	} else {
		struct String_vector sv = { 0, NULL };
		r = dlock__zk_z_children(st, z->zh, dir, deadline, &sv, NULL);
		for (int i = 0; r == ZOK && i < sv.count; i++)
			n += dlock__zk_owned_by(sv.data[i], req->owner);
		deallocate_String_vector(&sv);
	}
	if (r != ZOK && r != ZNONODE) {
		rc = dlock__zk_zerr(r, del ? "release in" : "look up", dir);
	} else if (n == 0) {
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "zookeeper: '%s' is not held by %s", req->name,
				     req->owner);
	}
	free(dir);
	return rc;
}

int dlock__zk_release(dlock_backend *be, const dlock_request *req)
{
	zookeeper_store *st = (zookeeper_store *)be;
	int64_t deadline = req->deadline_ms;
	dlock__zk_reap(st);
	hold *h = dlock__zk_current_hold(st, req, deadline);
	if (!h)
		return by_owner(st, req, true, deadline);
	if (!h->node || dlock__zk_sess_dead(st, h->sess)) {
		if (!h->node && h->doubt) { /* a create in doubt: the sweep finds it */
			dlock__zk_orphan_hold(st, h);
			return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "zookeeper: '%s' was not granted",
					       req->name);
		}
		dlock__zk_hold_free(st, h);
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZSESSIONEXPIRED",
				       "zookeeper: the session that held '%s' expired", req->name);
	}
	int r = dlock__zk_z_delete(st, h->sess->zh, h->node, deadline);
	bool retried = false;
	while (dlock__zk_retryable(r) && !retried && dlock__zk_wait_connected(st, h->sess, deadline)) {
		retried = true;
		r = dlock__zk_z_delete(st, h->sess->zh, h->node, deadline);
		if (r == ZNONODE) /* our first delete went through before the connection dropped */
			r = ZOK;
	}
	if (r == ZOK) {
		dlock__zk_hold_free(st, h);
		return 0;
	}
	int rc;
	if (r == ZNONODE) {
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, "ZNONODE", "zookeeper: our node for '%s' is gone",
				     req->name);
		dlock__zk_hold_free(st, h);
	} else {
		rc = dlock__zk_zerr(r, "delete", h->node);
		if (dlock__zk_lost_conn(r))
			dlock__zk_orphan_hold(st, h); /* deleted as soon as the session is connected again */
		else
			dlock__zk_hold_free(st, h);
	}
	return rc;
}

int dlock__zk_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	zookeeper_store *st = (zookeeper_store *)be;
	int64_t start = dlock_clock_ms();
	int64_t deadline = req->deadline_ms;
	/* req->slot as it is: extend gets a copy of the request, so a hold of
	 * another owner freed here would stay in the lock's (its next acquire
	 * or release frees it) */
	hold *h = req->slot;
	if (h && strcmp(h->owner, req->owner) != 0)
		h = NULL;
	if (!h)
		return by_owner(st, req, false, deadline); /* held by another session: it lives as long as that */
	if (!h->node || dlock__zk_sess_dead(st, h->sess))
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZSESSIONEXPIRED",
				       "zookeeper: the session that held '%s' expired", req->name);
	pthread_mutex_lock(&st->mu);
	int granted = h->sess->negotiated;
	pthread_mutex_unlock(&st->mu);
	if (ttl_ms > granted)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: cannot extend '%s' to %lld ms: its session times out after %d ms "
				       "(release it and acquire with the longer ttl)",
				       req->name, (long long)ttl_ms, granted);
	struct Stat stat;
	int r = dlock__zk_z_exists(st, h->sess->zh, h->node, deadline, &stat);
	if (r == ZOK && stat.ephemeralOwner == (int64_t)zoo_client_id(h->sess->zh)->client_id &&
	    dlock__zk_lease_set(st, h, start, ttl_ms, true))
		return 0;
	if (r == ZOK || r == ZNONODE)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZNONODE", "zookeeper: our node for '%s' is gone",
				       req->name);
	return dlock__zk_zerr(r, "check", h->node);
}

/* Confirm the holds of one session in one round trip: exists() of every
 * node, pipelined. Reads, not a multi of checks: a multi is a write, which
 * would cost a quorum proposal and a log fsync per renewal. */
static void renew_session(zookeeper_store *st, zsess *z, const dlock_request *const *reqs, size_t n, int *results,
			  int64_t start, int64_t deadline)
{
	bool dead = dlock__zk_sess_dead(st, z), up = dlock__zk_sess_connected(st, z);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		hold *h = reqs[i]->slot;
		if (results[i] != -1 || !h || h->sess != z)
			continue;
		if (dead || !up)
			results[i] = dead ? DLOCK_ENOTHELD : DLOCK_EUNAVAILABLE;
		else
			m++;
	}
	if (m == 0)
		return;
	zop **ops = calloc(m, sizeof(*ops));
	size_t *idx = calloc(m, sizeof(*idx));
	if (!ops || !idx) {
		free(ops);
		free(idx);
		return; /* left -1: reported transient */
	}
	size_t k = 0;
	for (size_t i = 0; i < n && k < m; i++) {
		hold *h = reqs[i]->slot;
		if (results[i] != -1 || !h || h->sess != z)
			continue;
		zop *op = dlock__zk_op_new(st);
		ops[k] = dlock__zk_op_sent(st, op,
					   op ? zoo_aexists(z->zh, h->node, 0, dlock__zk_cb_stat, op) : ZSYSTEMERROR);
		idx[k++] = i;
	}
	dlock__zk_ops_wait(st, z->zh, ops, k, deadline);
	for (size_t j = 0; j < k; j++) {
		int r = dlock__zk_op_rc(st, ops[j]);
		results[idx[j]] = r == ZOK                                                       ? 0
				  : (r == ZNONODE || r == ZSESSIONEXPIRED || r == ZINVALIDSTATE) ? DLOCK_ENOTHELD
												 : DLOCK_EUNAVAILABLE;
		if (r == ZOK && !dlock__zk_lease_set(st, reqs[idx[j]]->slot, start, reqs[idx[j]]->ttl_ms, true))
			results[idx[j]] = DLOCK_ENOTHELD; /* its lease ended: the sweep deletes it */
		dlock__zk_op_put(st, ops[j]);
	}
	free(ops);
	free(idx);
}

int dlock__zk_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	zookeeper_store *st = (zookeeper_store *)be;
	int64_t start = dlock_clock_ms();
	dlock__zk_reap(st);
	int64_t deadline = n ? reqs[0]->deadline_ms : start;
	for (size_t i = 0; i < n; i++) {
		hold *h = reqs[i]->slot;
		results[i] = -1; /* not done yet */
		if (!h || !h->node || strcmp(h->owner, reqs[i]->owner) != 0)
			results[i] = DLOCK_ENOTHELD;
	}
	for (size_t i = 0; i < n; i++) {
		if (results[i] != -1)
			continue;
		renew_session(st, ((hold *)reqs[i]->slot)->sess, reqs, n, results, start, deadline);
	}
	for (size_t i = 0; i < n; i++)
		if (results[i] == -1)
			results[i] = DLOCK_EUNAVAILABLE;
	return 0;
}

int dlock__zk_cancel(dlock_backend *be, const dlock_request *req)
{
	zookeeper_store *st = (zookeeper_store *)be;
	hold *h = req->slot;
	if (h)
		dlock__zk_discard_hold(st, h, req->deadline_ms);
	return 0;
}

int dlock__zk_wait(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out)
{
	(void)out; /* a wake-up only: the next acquire takes the lock */
	zookeeper_store *st = (zookeeper_store *)be;
	hold *h = req->slot;
	int64_t until = dlock_clock_ms() + timeout_ms;
	pthread_mutex_lock(&st->mu);
	if (!h || !h->watch || h->sess->expired || h->sess->state != ZOO_CONNECTED_STATE) {
		/* nothing to watch now: wait for the session to change, briefly */
		struct timespec ts;
		dlock_sys_abstime(&ts, timeout_ms < 100 ? timeout_ms : 100);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
		pthread_mutex_unlock(&st->mu);
		return 0;
	}
	zsess *z = h->sess;
	z->refs++;
	watch_wait w = { st->waits, z, h->watch, false };
	st->waits = &w;
	pthread_mutex_unlock(&st->mu);

	/* A data watch, not an exists watch: it is set only if the node exists,
	 * so a vanished predecessor leaves no watch behind. */
	zop *op = dlock__zk_op_new(st);
	int r = !op                 ? ZSYSTEMERROR
		: h->watch_children ? zoo_awget_children2(z->zh, h->dir, dlock__zk_watcher, z, dlock__zk_cb_kids, op)
				    : zoo_awget(z->zh, h->watch, dlock__zk_watcher, z, dlock__zk_cb_data, op);
	dlock__zk_op_sent(st, op, r);

	pthread_mutex_lock(&st->mu);
	for (;;) {
		if (!op || op->done) {
			/* gone (ZNONODE), an error acquire will report, or the
			 * children changed since we looked */
			if (!op || op->rc != ZOK || (h->watch_children && op->stat.cversion != h->cversion))
				break;
		}
		if (w.fired || z->expired || z->state != ZOO_CONNECTED_STATE)
			break;
		int64_t left = until - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock_sys_abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	for (watch_wait **p = &st->waits; *p; p = &(*p)->next) {
		if (*p == &w) {
			*p = w.next;
			break;
		}
	}
	if (op)
		dlock__zk_op_unref_locked(op);
	zsess *dead = dlock__zk_unref_locked(z);
	pthread_mutex_unlock(&st->mu);
	dlock__zk_close_sess(dead);
	return 0;
}
