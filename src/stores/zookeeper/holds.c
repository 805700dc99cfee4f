/* ZooKeeper store: holds and orphans (and the sweeper that deletes what a
 * lost or abandoned hold left), placing our node and judging the queue (zk.h). */
#include "zk.h"

/* ---------------------------------------------------------------- holds and orphans */

char *dlock__zk_dir_of(zookeeper_store *st, const char *name)
{
	char *e = dlock__zk_escape(name);
	if (!e)
		return NULL;
	char *d = dlock_sys_sprintf("%s/%s", st->root, e);
	free(e);
	return d;
}

static void lease_drop(zookeeper_store *st, hold *h);

void dlock__zk_hold_free(zookeeper_store *st, hold *h)
{
	if (!h)
		return;
	lease_drop(st, h);
	if (h->prev)
		h->prev->next = h->next;
	else if (st->holds == h)
		st->holds = h->next;
	if (h->next)
		h->next->prev = h->prev;
	dlock__zk_unref(st, h->sess);
	free(h->owner);
	free(h->dir);
	free(h->node);
	free(h->watch);
	free(h);
}

/* Under st->mu (the orphan is unlinked). */
void dlock__zk_orphan_free_locked(orphan *o)
{
	if (o->sess && !o->st->closing)
		dlock__zk_unref_later_locked(o->sess);
	free(o->dir);
	free(o->owner);
	free(o);
}

/* Under st->mu: the sweep of o is over. */
static void sweep_done_locked(orphan *o, bool ok)
{
	zookeeper_store *st = o->st;
	o->sweeping = false;
	pthread_cond_broadcast(&st->cv);
	if (st->closing)
		return; /* dlock__zk_close frees every orphan */
	if (!ok && !o->sess->expired) {
		o->failed = true;
		if (o->again && o->sess->state == ZOO_CONNECTED_STATE)
			dlock__zk_sweep_start_locked(o);
		return;
	}
	if (ok && o->again) {
		dlock__zk_sweep_start_locked(o);
		return;
	}
	/* Nothing of the owner is left (or the session, and its nodes, died). */
	for (orphan **p = &st->orphans; *p; p = &(*p)->next) {
		if (*p == o) {
			*p = o->next;
			break;
		}
	}
	dlock__zk_orphan_free_locked(o);
}

static void sweep_deleted(int rc, const void *data)
{
	orphan *o = (orphan *)data;
	zookeeper_store *st = o->st;
	pthread_mutex_lock(&st->mu);
	if (!dlock__zk_settled(rc))
		o->failed = true;
	if (--o->pending == 0)
		sweep_done_locked(o, !o->failed); /* may free o */
	pthread_mutex_unlock(&st->mu);
}

static void sweep_listed(int rc, const struct String_vector *sv, const void *data)
{
	orphan *o = (orphan *)data;
	zookeeper_store *st = o->st;
	pthread_mutex_lock(&st->mu);
	if (rc != ZOK && dlock__zk_settled(rc)) {
		sweep_done_locked(o, true); /* nothing there (or nothing we can do) */
		pthread_mutex_unlock(&st->mu);
		return;
	}
	if (rc != ZOK) {
		sweep_done_locked(o, false);
		pthread_mutex_unlock(&st->mu);
		return;
	}
	o->failed = false;
	o->pending = 1; /* ours, until every delete is sent */
	for (int i = 0; sv && i < sv->count; i++) {
		if (!dlock__zk_owned_by(sv->data[i], o->owner))
			continue;
		char *p = dlock_sys_sprintf("%s/%s", o->dir, sv->data[i]);
		int r = p ? zoo_adelete(o->sess->zh, p, -1, sweep_deleted, o) : ZSYSTEMERROR;
		free(p);
		if (r == ZOK)
			o->pending++;
		else
			o->failed = true;
	}
	if (--o->pending == 0)
		sweep_done_locked(o, !o->failed);
	pthread_mutex_unlock(&st->mu);
}

/* Under st->mu, on any thread: list o's name and delete the owner's nodes,
 * asynchronously. Requests of one session run in order, so the listing sees
 * every create or delete of the owner that was sent before it. */
void dlock__zk_sweep_start_locked(orphan *o)
{
	if (o->sweeping) {
		o->again = true;
		return;
	}
	if (o->st->closing || o->sess->expired || o->sess->state != ZOO_CONNECTED_STATE)
		return;
	o->again = false;
	o->sweeping = true;
	o->since = dlock_clock_ms();
	int r = zoo_aget_children(o->sess->zh, o->dir, 0, sweep_listed, o);
	if (r != ZOK) {
		o->sweeping = false;
		o->failed = true;
	}
}

/* Under st->mu. */
static void lease_unlink_locked(zookeeper_store *st, hold *h)
{
	if (!h->leased)
		return;
	if (h->lprev)
		h->lprev->lnext = h->lnext;
	else
		st->leased = h->lnext;
	if (h->lnext)
		h->lnext->lprev = h->lprev;
	h->lprev = h->lnext = NULL;
	h->leased = false;
}

static void lease_drop(zookeeper_store *st, hold *h)
{
	pthread_mutex_lock(&st->mu);
	lease_unlink_locked(st, h);
	pthread_mutex_unlock(&st->mu);
}

/* Under st->mu: make sure the sweeper runs (it has work: an orphan or a lease). */
static void sweeper_wake_locked(zookeeper_store *st)
{
	if (!st->sweeper_started && !st->closing)
		st->sweeper_started = pthread_create(&st->sweeper, NULL, dlock__zk_sweeper_main, st) == 0;
	pthread_cond_broadcast(&st->cv);
}

/* h was confirmed by a request sent after `since` (>= the core's own start
 * of that request): its lease now ends at since + ttl_ms, never before the
 * core's deadline for it. A renewal (`again`) does not bring back a lease
 * the sweeper already ended. @return whether h is leased now. */
bool dlock__zk_lease_set(zookeeper_store *st, hold *h, int64_t since, int64_t ttl_ms, bool again)
{
	pthread_mutex_lock(&st->mu);
	if (again && !h->leased) {
		pthread_mutex_unlock(&st->mu);
		return false;
	}
	h->expires = since + ttl_ms;
	if (!h->leased) {
		h->leased = true;
		h->lprev = NULL;
		h->lnext = st->leased;
		if (st->leased)
			st->leased->lprev = h;
		st->leased = h;
	}
	sweeper_wake_locked(st);
	pthread_mutex_unlock(&st->mu);
	return true;
}

static void probe_done(int rc, const struct Stat *stat, const void *data)
{
	(void)rc;
	(void)stat;
	(void)data;
}

/*
 * The sweeper: a thread of the store's own, running while orphans exist.
 * Requests lost on a link that then works again (a black hole that passes
 * once more, a dropped reply) are never answered: ZooKeeper has no
 * per-request timeout, and pings keep the connection alive, so a sweep
 * waiting for such a reply would wait as long as the session lives — and
 * keep the orphan's node blocking others. When a sweep has waited longer
 * than the request timeout, the sweeper sends a probe (exists of "/") on
 * its session: if the link works, the probe's answer arrives ahead of the
 * lost one, libzookeeper takes that for a broken connection and reconnects,
 * and the session watcher sweeps again. A probe lost too is followed by
 * another one request timeout later. It also restarts sweeps that
 * failed while the session stayed connected.
 */
void *dlock__zk_sweeper_main(void *arg)
{
	zookeeper_store *st = arg;
	pthread_mutex_lock(&st->mu);
	while (!st->closing) {
		int64_t now = dlock_clock_ms(), next = INT64_MAX;
		for (hold *h = st->leased; h;) {
			hold *hn = h->lnext;
			if (h->expires <= now) {
				/* Its lease ended unconfirmed (the core has reported it
				 * lost by now): its node goes, by the orphan sweep. */
				lease_unlink_locked(st, h);
				orphan *o = h->sess->expired ? NULL : calloc(1, sizeof(*o));
				if (o && (o->dir = strdup(h->dir)) && (o->owner = strdup(h->owner))) {
					o->st = st;
					o->sess = h->sess;
					h->sess->refs++;
					o->next = st->orphans;
					st->orphans = o;
					dlock__zk_sweep_start_locked(o);
				} else if (o) {
					free(o->dir);
					free(o);
				}
			} else if (h->expires < next) {
				next = h->expires;
			}
			h = hn;
		}
		for (orphan *o = st->orphans; o; o = o->next) {
			zsess *z = o->sess;
			bool up = !z->expired && z->state == ZOO_CONNECTED_STATE;
			if (!o->sweeping && o->failed && up)
				dlock__zk_sweep_start_locked(o);
			if (!o->sweeping)
				continue;
			if (now - o->since >= st->request_ms && up && now - z->probed >= st->request_ms) {
				/* (a probe lost like the rest is followed by another) */
				zoo_aexists(z->zh, "/", 0, probe_done, NULL);
				z->probed = now;
				o->since = now;
			}
			if (o->since + st->request_ms < next)
				next = o->since + st->request_ms;
		}
		if (!st->orphans && !st->leased) {
			pthread_cond_wait(&st->cv, &st->mu);
			continue;
		}
		struct timespec ts;
		int64_t left = next == INT64_MAX ? st->request_ms : next - dlock_clock_ms();
		dlock_sys_abstime(&ts, left < 10 ? 10 : left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

/* The node(s) of h's owner are in doubt (a create or delete whose outcome is
 * unknown) and no hold will use them: hand them to the sweep. Takes over h. */
void dlock__zk_orphan_hold(zookeeper_store *st, hold *h)
{
	orphan *o = calloc(1, sizeof(*o));
	pthread_mutex_lock(&st->mu);
	if (o && !h->sess->expired) {
		o->st = st;
		o->sess = h->sess;
		o->dir = h->dir;
		o->owner = h->owner;
		h->sess = NULL;
		h->dir = h->owner = NULL;
		o->next = st->orphans;
		st->orphans = o;
		dlock__zk_sweep_start_locked(o);
		o = NULL;
		sweeper_wake_locked(st);
	}
	pthread_mutex_unlock(&st->mu);
	free(o);
	dlock__zk_hold_free(st, h);
}

/* A new hold of an owner that left an orphan (a retry of the same acquire):
 * take the orphan back so dlock__zk_find_own adopts its node and keeps its place in
 * line, after any sweep of it in flight is over. @return ZOK (h->doubt set
 * when there was one), or ZDEADLINE. */
int dlock__zk_claim_orphan(zookeeper_store *st, hold *h, int64_t deadline)
{
	pthread_mutex_lock(&st->mu);
	int rc = ZOK;
	for (;;) {
		orphan *o = NULL, **at = NULL;
		for (orphan **p = &st->orphans; *p; p = &(*p)->next) {
			if (strcmp((*p)->owner, h->owner) == 0 && strcmp((*p)->dir, h->dir) == 0) {
				o = *p;
				at = p;
				break;
			}
		}
		if (!o)
			break;
		if (o->sweeping) {
			int64_t left = deadline - dlock_clock_ms();
			if (left <= 0) {
				rc = ZDEADLINE;
				break;
			}
			struct timespec ts;
			dlock_sys_abstime(&ts, left);
			pthread_cond_timedwait(&st->cv, &st->mu, &ts);
			continue;
		}
		*at = o->next;
		/* An orphan of an older session of ours: its nodes die with it, or
		 * are ours to find in the listing all the same. */
		h->doubt = true;
		dlock__zk_orphan_free_locked(o);
	}
	pthread_mutex_unlock(&st->mu);
	return rc;
}

/* Does child name c belong to owner? ("_c_<owner>-<kind>-<seq>") */
bool dlock__zk_owned_by(const char *c, const char *owner)
{
	size_t n = strlen(owner);
	return strncmp(c, "_c_", 3) == 0 && strncmp(c + 3, owner, n) == 0 && c[3 + n] == '-';
}

/* Delete every node of `owner` under dir, by `deadline`.
 * @return ZOK, ZNONODE (no dir), or an error (ZDEADLINE: in doubt). */
int dlock__zk_delete_owned(zookeeper_store *st, zhandle_t *zh, const char *dir, const char *owner, int64_t deadline,
			   int *deleted)
{
	struct String_vector sv = { 0, NULL };
	int rc = dlock__zk_z_children(st, zh, dir, deadline, &sv, NULL);
	*deleted = 0;
	if (rc != ZOK)
		return rc;
	zop **ops = sv.count > 0 ? calloc((size_t)sv.count, sizeof(*ops)) : NULL;
	int n = 0;
	for (int i = 0; i < sv.count; i++) {
		if (!dlock__zk_owned_by(sv.data[i], owner))
			continue;
		if (!ops) {
			rc = ZSYSTEMERROR;
			break;
		}
		char *p = dlock_sys_sprintf("%s/%s", dir, sv.data[i]);
		zop *op = p ? dlock__zk_op_new(st) : NULL;
		ops[n++] = dlock__zk_op_sent(st, op, op ? zoo_adelete(zh, p, -1, dlock__zk_cb_void, op) : ZSYSTEMERROR);
		free(p);
	}
	dlock__zk_ops_wait(st, zh, ops, (size_t)n, deadline);
	int first = ZOK;
	for (int i = 0; i < n; i++) {
		int r = dlock__zk_op_rc(st, ops[i]);
		if (r == ZOK)
			(*deleted)++;
		else if (r != ZNONODE && first == ZOK)
			first = r;
		dlock__zk_op_put(st, ops[i]);
	}
	free(ops);
	deallocate_String_vector(&sv);
	return rc != ZOK ? rc : first;
}

/* Create the chroot (persistent), prefix and name (containers) nodes: one
 * pipelined round trip (the creates run in order). */
static int make_parents(zookeeper_store *st, zsess *z, const char *dir, int64_t deadline)
{
	char *p = dlock_sys_strdup(dir);
	if (!p)
		return DLOCK_ENOMEM;
	size_t chroot_len = strlen(st->root) - strlen(dlock__zk_base_name(st->root)) - 1;
	zop *ops[64];
	size_t n = 0;
	for (char *c = p + 1; n < 64; c++) {
		if (*c != '/' && *c != '\0')
			continue;
		char save = *c;
		*c = '\0';
		/* Inside the chroot only the prefix and the name are ours to reap. */
		bool ours = strlen(p) > chroot_len;
		zop *op = dlock__zk_op_new(st);
		ops[n++] = dlock__zk_op_sent(st, op,
					     op ? zoo_acreate2(z->zh, p, NULL, -1, &st->acl,
							       ours ? ZOO_CONTAINER : ZOO_PERSISTENT,
							       dlock__zk_cb_created, op)
						: ZSYSTEMERROR);
		*c = save;
		if (save == '\0')
			break;
	}
	dlock__zk_ops_wait(st, z->zh, ops, n, deadline);
	int rc = ZOK;
	for (size_t i = 0; i < n; i++) {
		int r = dlock__zk_op_rc(st, ops[i]);
		if (r != ZOK && r != ZNODEEXISTS && rc == ZOK)
			rc = r;
		dlock__zk_op_put(st, ops[i]);
	}
	int out = rc == ZOK ? 0 : dlock__zk_zerr(rc, "create", p);
	free(p);
	return out;
}

/* Find our own node after a lost connection (h->node NULL afterwards if
 * none; h->doubt cleared once the listing answered). */
int dlock__zk_find_own(zookeeper_store *st, hold *h, int64_t deadline)
{
	struct String_vector sv = { 0, NULL };
	zhandle_t *zh = h->sess->zh;
	int rc = dlock__zk_z_children(st, zh, h->dir, deadline, &sv, NULL);
	if (rc == ZNONODE) {
		h->doubt = false;
		return ZOK;
	}
	if (rc != ZOK)
		return rc;
	/* Exactly one create can have reached the server per attempt; should
	 * there be more, keep the first in line and delete the others. */
	child best = { NULL, -1, K_LOCK, 0 };
	for (int i = 0; i < sv.count; i++) {
		child c;
		if (dlock__zk_owned_by(sv.data[i], h->owner) && dlock__zk_parse_child(sv.data[i], &c) &&
		    (!best.name || c.seq < best.seq))
			best = c;
	}
	for (int i = 0; i < sv.count && rc == ZOK; i++) {
		if (!dlock__zk_owned_by(sv.data[i], h->owner))
			continue;
		char *p = dlock_sys_sprintf("%s/%s", h->dir, sv.data[i]);
		if (!p) {
			rc = ZSYSTEMERROR;
			break;
		}
		if (sv.data[i] == best.name) {
			struct Stat stat;
			int r = dlock__zk_z_exists(st, zh, p, deadline, &stat);
			if (r == ZOK) {
				h->node = p;
				h->czxid = stat.czxid;
				p = NULL;
			} else if (r != ZNONODE) {
				rc = r;
			}
		} else {
			int r = dlock__zk_z_delete(st, zh, p, deadline);
			if (r != ZOK && r != ZNONODE)
				rc = r;
		}
		free(p);
	}
	deallocate_String_vector(&sv);
	if (rc == ZOK)
		h->doubt = false;
	return rc;
}

static char *node_data(const dlock_request *req, int *len)
{
	char *d = dlock_sys_sprintf("dlock1 pid=%d ttl=%lld permits=%u host=%s", req->pid, (long long)req->ttl_ms,
				    req->permits, req->host ? req->host : "");
	*len = d ? (int)strlen(d) : 0;
	return d;
}

static node_kind req_kind(const dlock_request *req)
{
	if (req->mode == DLOCK_SHARED)
		return K_READ;
	return req->permits > 1 ? K_SEM : K_LOCK;
}

/* The path prefix of our sequential node: a semaphore's names its permits
 * ("-sem3-"), which every later caller needs for the permits rule. */
static char *node_prefix(const zookeeper_store *st, const hold *h, const dlock_request *req)
{
	if (st->recipe == RECIPE_CURATOR_RW)
		return dlock_sys_sprintf("%s/_c_%s-%s", h->dir, h->owner,
					 req_kind(req) == K_READ ? "__READ__" : "__WRIT__");
	if (req_kind(req) == K_SEM)
		return dlock_sys_sprintf("%s/_c_%s-sem%u-", h->dir, h->owner, req->permits);
	return dlock_sys_sprintf("%s/_c_%s-%s-", h->dir, h->owner, dlock__zk_kind_word(req_kind(req)));
}

/* Make sure h has a node in ZooKeeper: create it, or after a lost
 * connection (h->doubt) find the one our earlier create made. On failure
 * h->doubt says whether a node of ours may exist anyway. */
int dlock__zk_place_node(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline)
{
	zhandle_t *zh = h->sess->zh;
	char *prefix = node_prefix(st, h, req);
	int dlen;
	char *data = node_data(req, &dlen);
	int rc = 0;
	if (!prefix || !data) {
		rc = dlock_sys_oom();
		goto out;
	}
	for (int tries = 0;; tries++) {
		int r;
		if (h->doubt) {
			r = dlock__zk_find_own(st, h, deadline);
			if (r == ZOK && h->node)
				break;
			if (r == ZOK)
				continue; /* the create never reached the server: make it now */
		} else {
			zop *op = dlock__zk_op_new(st);
			dlock__zk_op_sent(st, op,
					  op ? zoo_acreate2(zh, prefix, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL,
							    dlock__zk_cb_created, op)
					     : ZSYSTEMERROR);
			r = dlock__zk_op_wait1(st, zh, op, deadline);
			if (r == ZOK) {
				h->node = op->value;
				h->czxid = op->stat.czxid;
				op->value = NULL;
			}
			dlock__zk_op_put(st, op);
			if (r == ZOK)
				break;
			if (r == ZNONODE && tries < 4) {
				/* first use of the name, or its container was just reaped */
				if ((rc = make_parents(st, h->sess, h->dir, deadline)))
					goto out;
				continue;
			}
			if (dlock__zk_lost_conn(r) || r == ZSYSTEMERROR)
				h->doubt = true;
		}
		if (!dlock__zk_retryable(r) || tries >= 4 || !dlock__zk_wait_connected(st, h->sess, deadline)) {
			rc = dlock__zk_zerr(r, h->doubt ? "create (outcome unknown)" : "create", prefix);
			goto out;
		}
	}
out:
	free(prefix);
	free(data);
	return rc;
}

/* Is our node first in line among the children `sv` of h->dir (whose
 * cversion is given)? Sets h->watch to what blocks us.
 * @return 0 (*granted set), 1 when our node is gone, or an error. */
static int evaluate_list(hold *h, const dlock_request *req, const struct String_vector *sv, int32_t cversion,
			 bool *granted)
{
	child *cs = calloc((size_t)sv->count + 1, sizeof(*cs));
	if (!cs)
		return dlock_sys_oom();
	size_t n = 0;
	for (int i = 0; i < sv->count; i++)
		if (dlock__zk_parse_child(sv->data[i], &cs[n]))
			n++;
	qsort(cs, n, sizeof(*cs), dlock__zk_by_seq);
	const char *mine = dlock__zk_base_name(h->node);
	size_t me = n;
	for (size_t i = 0; i < n; i++)
		if (strcmp(cs[i].name, mine) == 0)
			me = i;
	int out = 0;
	if (me == n) {
		out = 1;
		goto done;
	}
	node_kind k = cs[me].kind;
	const child *blocker = NULL;
	bool crowd = false;
	size_t sems = 0;
	/* The permits rule (dlock/lock.h): a semaphore node holds while the nodes
	 * up to it number no more than the smallest permits among them (a node
	 * of an older client that does not name its permits counts as ours). */
	unsigned limit = req->permits;
	for (size_t i = 0; i < me; i++) {
		if (k == K_LOCK || (k == K_READ && cs[i].kind != K_READ) || (k == K_SEM && cs[i].kind != K_SEM))
			blocker = &cs[i]; /* the last earlier node that excludes us */
		else if (k == K_SEM) {
			sems++;
			if (cs[i].permits && cs[i].permits < limit)
				limit = cs[i].permits;
		}
	}
	if (!blocker && k == K_SEM && sems >= limit)
		crowd = true;
	*granted = !blocker && !crowd;
	free(h->watch);
	h->watch = NULL;
	h->watch_children = crowd;
	h->cversion = cversion;
	if (blocker)
		h->watch = dlock_sys_sprintf("%s/%s", h->dir, blocker->name);
	else if (crowd)
		h->watch = dlock_sys_strdup(h->dir);
	if (!*granted && !h->watch)
		out = DLOCK_ENOMEM;
done:
	free(cs);
	return out;
}

/* @return as evaluate_list, or 2 when the listing did not answer by the deadline. */
int dlock__zk_evaluate(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline, bool *granted)
{
	struct String_vector sv = { 0, NULL };
	int32_t cversion = 0;
	int rc = dlock__zk_z_children(st, h->sess->zh, h->dir, deadline, &sv, &cversion);
	if (rc == ZNONODE)
		return 1;
	if (rc == ZDEADLINE)
		return 2;
	if (rc != ZOK)
		return dlock__zk_zerr(rc, "list", h->dir);
	rc = evaluate_list(h, req, &sv, cversion, granted);
	deallocate_String_vector(&sv);
	return rc;
}

/* The fast path of a first try: create our node and list its siblings in
 * one round trip. ZooKeeper runs a session's requests in order, so the list
 * already contains the node the create made.
 * @return 0 with h->node set and *granted decided; 1 when it could not be
 * used (no parent yet, or a lost connection: the careful path takes over,
 * h->doubt saying a node of ours may exist); 2 when the node was made but
 * its listing did not answer by the deadline; or an error (h->doubt set
 * when the create's outcome is unknown). */
int dlock__zk_create_and_list(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline, bool *granted)
{
	char *path = node_prefix(st, h, req);
	int dlen;
	char *data = node_data(req, &dlen);
	zop *ops[2] = { NULL, NULL };
	if (!path || !data || !(ops[0] = dlock__zk_op_new(st)) || !(ops[1] = dlock__zk_op_new(st))) {
		free(path);
		free(data);
		if (ops[0]) { /* never sent */
			pthread_mutex_lock(&st->mu);
			dlock__zk_op_free_locked(ops[0]);
			pthread_mutex_unlock(&st->mu);
		}
		return DLOCK_ENOMEM;
	}
	zhandle_t *zh = h->sess->zh;
	int r = zoo_acreate2(zh, path, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL, dlock__zk_cb_created, ops[0]);
	dlock__zk_op_sent(st, ops[0], r);
	dlock__zk_op_sent(st, ops[1], r == ZOK ? zoo_aget_children2(zh, h->dir, 0, dlock__zk_cb_kids, ops[1]) : r);
	free(path);
	free(data);
	dlock__zk_ops_wait(st, zh, ops, 2, deadline);
	int create_rc = dlock__zk_op_rc(st, ops[0]), list_rc = dlock__zk_op_rc(st, ops[1]);
	int out;
	if (create_rc == ZOK) {
		h->node = ops[0]->value; /* made; if not listed, the careful path lists */
		h->czxid = ops[0]->stat.czxid;
		ops[0]->value = NULL;
		out = 1;
		if (list_rc == ZOK) {
			out = evaluate_list(h, req, &ops[1]->kids, ops[1]->stat.cversion, granted);
			if (out == 1) /* cannot be (requests run in order), but never leave our node behind */
				out = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
						      "zookeeper: our new node is missing from %s", h->dir);
		} else if (list_rc == ZDEADLINE) {
			out = 2; /* as dlock__zk_evaluate */
		}
	} else {
		h->doubt = dlock__zk_lost_conn(create_rc) || create_rc == ZSYSTEMERROR;
		if (create_rc == ZDEADLINE)
			out = dlock__zk_zerr(create_rc, "create (outcome unknown)", h->dir);
		else
			out = create_rc == ZNONODE || h->doubt ? 1 : dlock__zk_zerr(create_rc, "create", h->dir);
	}
	dlock__zk_op_put(st, ops[0]);
	dlock__zk_op_put(st, ops[1]);
	return out;
}

/* Delete h's node (a refused try, a cancelled wait) and free h; what could
 * not be deleted in time goes to the sweep. */
void dlock__zk_discard_hold(zookeeper_store *st, hold *h, int64_t deadline)
{
	if ((h->node || h->doubt) && !dlock__zk_sess_dead(st, h->sess)) {
		int r = h->node ? dlock__zk_z_delete(st, h->sess->zh, h->node, deadline) : ZDEADLINE;
		if (r != ZOK && r != ZNONODE && (dlock__zk_lost_conn(r) || h->doubt)) {
			dlock__zk_orphan_hold(st, h);
			return;
		}
	}
	dlock__zk_hold_free(st, h);
}

/* req->slot when it is a hold of req->owner; one of another owner (an
 * earlier hold of the same lock handle: lost, attached) is discarded, and
 * NULL returned. */
hold *dlock__zk_current_hold(zookeeper_store *st, const dlock_request *req, int64_t deadline)
{
	hold *h = req->slot;
	if (h && strcmp(h->owner, req->owner) != 0) {
		dlock__zk_discard_hold(st, h, deadline);
		h = NULL;
	}
	return h;
}
