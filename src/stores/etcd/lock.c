/*
 * etcd store: the lock protocol — acquire, release, renew, extend, cancel.
 */
#include "etcd.h"

/* ------------------------------------------------------------------ */
/* the lock protocol */

void dlock__et_names_free(keyset *n)
{
	free(n->dir);
	free(n->end);
	free(n->key);
	memset(n, 0, sizeof(*n));
}

static hold *hold_find(etcd_store *e, const char *name, const char *owner)
{
	for (size_t i = 0; i < e->nholds; i++)
		if (strcmp(e->holds[i].owner, owner) == 0 && strcmp(e->holds[i].name, name) == 0)
			return &e->holds[i];
	return NULL;
}

/* The key of req now rides on lease_id (known from an answer). */
static void hold_set_lease(etcd_store *e, const dlock_request *req, int64_t lease_id)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h) {
		h->lease = lease_id;
		h->maybe = 0;
	}
	pthread_mutex_unlock(&e->mu);
}

/* A put of unknown outcome is about to put req's key on lease_id. */
static void hold_set_maybe(etcd_store *e, const dlock_request *req, int64_t lease_id)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h && h->lease != lease_id)
		h->maybe = lease_id;
	pthread_mutex_unlock(&e->mu);
}

static void lease_retire(etcd_store *e, int64_t id)
{
	lease *l = id ? dlock__et_lease_find_id(e, id) : NULL;
	if (l)
		l->retired = 1;
}

/*
 * The delete of req's key failed (a release, a cancel, an undo): the key may
 * still be there. Nobody wants it, but every keepalive of its lease would
 * keep it, and the name blocked, alive. So its lease is retired: never kept
 * alive again and given no new key; rescue() moves our live keys off it and
 * then revokes it, which deletes the orphan. The entry stays (marked) so a
 * retried release still finds the key.
 */
static void hold_orphan(etcd_store *e, const dlock_request *req)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h && !h->lease && !h->maybe) {
		free(h->name); /* no put of it was ever sent: there is no key */
		*h = e->holds[--e->nholds];
	} else if (h) {
		h->orphan = 1;
		lease_retire(e, h->lease);
		lease_retire(e, h->maybe);
	}
	pthread_mutex_unlock(&e->mu);
}

/* Forget req's key slot (released, cancelled, refused or gone). */
static void hold_forget(etcd_store *e, const dlock_request *req)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h) {
		free(h->name);
		*h = e->holds[--e->nholds];
	}
	pthread_mutex_unlock(&e->mu);
}

/*
 * The directory of req->name and, for a hold or waiter of this store handle,
 * its key "<dir><client id>-<slot>". The slot is the lowest one no other
 * owner of this handle uses on that name, so a handle that takes one lock
 * again and again reuses one key: etcd keeps one index entry per distinct
 * key until compaction and a range over the directory walks all of them, so
 * a key per acquire would slow every later acquire of a hot name.
 */
int dlock__et_names_make(etcd_store *e, const dlock_request *req, keyset *n, int how)
{
	const char *dash = strrchr(req->owner, '-');
	int len = dash ? (int)(dash - req->owner) : (int)strlen(req->owner);
	int rc = 0;
	memset(n, 0, sizeof(*n));
	if (!(n->dir = dlock__et_dir_of(e, req->name)) || !(n->end = dlock__et_range_end(n->dir))) {
		dlock__et_names_free(n);
		return DLOCK_ENOMEM;
	}
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (!h && how == MK_CREATE) {
		unsigned slot = 0;
		for (size_t i = 0; i < e->nholds; i++) {
			if (strcmp(e->holds[i].name, req->name) == 0 && e->holds[i].slot == slot) {
				slot++;
				i = (size_t)-1; /* rescan: slots are few */
			}
		}
		if (e->nholds == e->capholds) {
			size_t cap = e->capholds ? e->capholds * 2 : 8;
			hold *a = realloc(e->holds, cap * sizeof(hold));
			if (a) {
				e->holds = a;
				e->capholds = cap;
			}
		}
		char *name = e->nholds < e->capholds ? dlock_sys_strdup(req->name) : NULL;
		if (name) {
			h = &e->holds[e->nholds++];
			h->name = name;
			snprintf(h->owner, sizeof(h->owner), "%s", req->owner);
			h->slot = slot;
			h->lease = h->maybe = 0;
			h->orphan = 0;
		} else {
			rc = DLOCK_ENOMEM;
		}
	} else if (h && how == MK_CREATE) {
		h->orphan = 0; /* its owner tries again: the key is wanted after all */
	}
	if (h && !(n->key = dlock_sys_sprintf("%s%.*s-%u", n->dir, len, req->owner, h->slot)))
		rc = DLOCK_ENOMEM;
	pthread_mutex_unlock(&e->mu);
	if (rc != 0)
		dlock__et_names_free(n);
	return rc;
}

/*
 * A hold this store handle does not know (attached from another process):
 * find its key by the owner in the values. *create_rev gets its revision.
 * @return 0 and n->key set; DLOCK_ENOTHELD.
 */
static int find_by_owner(etcd_store *e, const dlock_request *req, keyset *n, int64_t *create_rev)
{
	json_object *ok = json_object_new_array(), *resp;
	kv *keys = NULL;
	size_t nk = 0;
	int rc;
	json_object_array_add(ok, dlock__et_op_range(n->dir, n->end, 1, 0, 0));
	if ((rc = dlock__et_txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
		return rc;
	rc = dlock__etcd_txn_range(resp, 0, &keys, &nk);
	json_object_put(resp);
	for (size_t i = 0; rc == 0 && i < nk && !n->key; i++) {
		if (keys[i].owner && strcmp(keys[i].owner, req->owner) == 0) {
			n->key = keys[i].key;
			keys[i].key = NULL;
			*create_rev = keys[i].create_rev;
		}
	}
	dlock__etcd_kvs_free(keys, nk);
	if (rc == 0 && !n->key)
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name, req->owner);
	return rc;
}

/* The key of a hold entry (see dlock__et_names_make). */
static char *hold_key(etcd_store *e, const hold *h)
{
	const char *dash = strrchr(h->owner, '-');
	int len = dash ? (int)(dash - h->owner) : (int)strlen(h->owner);
	char *dir = dlock__et_dir_of(e, h->name);
	char *key = dir ? dlock_sys_sprintf("%s%.*s-%u", dir, len, h->owner, h->slot) : NULL;
	free(dir);
	return key;
}

/*
 * Put `key`, if it exists, on lease `to`: a Put with ignore_value keeps the
 * create revision (fence, place in line) and the value; the compare makes
 * sure nothing is created. *moved: 1 moved, 0 the key is gone.
 */
static int move_key(etcd_store *e, const char *key, int64_t to, int *moved)
{
	json_object *cmp = json_object_new_array(), *ok = json_object_new_array(), *resp;
	json_object_array_add(cmp, dlock__et_cmp_create(key, NULL, "GREATER", 0));
	json_object_array_add(ok, dlock__et_op_put(key, NULL, to, 1));
	int rc = dlock__et_txn(e, e->cmd, cmp, ok, NULL, &resp, NULL);
	if (rc == 0) {
		*moved = dlock__et_jbool(resp, "succeeded");
		json_object_put(resp);
	}
	return rc;
}

/*
 * Deal with retired leases (see hold_orphan), by the current call's
 * deadline: move every live key of ours on one onto the current lease of
 * its TTL, then revoke it, which deletes what is left on it (the orphans).
 * Whatever fails is tried again on the next call; meanwhile nobody keeps
 * the retired lease alive, so the orphans end with it at the latest.
 * Cheap when there is nothing to do (one pass over the lease table).
 */
static int rescue(etcd_store *e)
{
	int rc = 0;
	for (size_t li = 0; li < e->nleases; li++) {
		if (!e->leases[li].retired)
			continue;
		lease old = e->leases[li];
		int live = 0;
		for (size_t i = 0; i < e->nholds; i++) {
			hold *h = &e->holds[i];
			if (h->orphan || (h->lease != old.id && h->maybe != old.id))
				continue;
			lease *to;
			int moved = 0;
			char *key = hold_key(e, h);
			int r = key ? dlock__et_lease_get(e, old.ttl_s * 1000, &to) : DLOCK_ENOMEM;
			/* The hold's deadline in the core may rest on the old lease's last
			 * keepalive: the new lease must last at least as long. */
			if (r == 0 && to->alive_until < old.alive_until) {
				int64_t left = 0;
				int64_t id = to->id;
				if ((r = dlock__et_keepalive(e, id, &left)) == 0 && left <= 0) {
					dlock__et_lease_drop(e, id);
					r = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "lease %llx ended",
							    (long long)id);
				}
				if (r == 0)
					to = dlock__et_lease_find_id(e, id);
				if (r == 0 && !to)
					r = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "lease ended");
			}
			int64_t to_id = r == 0 ? to->id : 0;
			if (r == 0) {
				pthread_mutex_lock(&e->mu);
				e->holds[i].maybe = to_id;
				pthread_mutex_unlock(&e->mu);
				r = move_key(e, key, to_id, &moved);
			}
			free(key);
			/* dlock__et_lease_get/dlock__et_keepalive may have changed the table: find `old` again. */
			li = 0;
			while (li < e->nleases && e->leases[li].id != old.id)
				li++;
			if (r != 0) {
				rc = r;
				live++;
				continue;
			}
			pthread_mutex_lock(&e->mu);
			e->holds[i].lease = moved ? to_id : 0;
			e->holds[i].maybe = 0;
			pthread_mutex_unlock(&e->mu);
		}
		if (live || li == e->nleases)
			continue;
		json_object *body = json_object_new_object(), *resp;
		rpc_result res;
		dlock__et_jadd_i64(body, "ID", old.id);
		int r = dlock__et_rpc(e, e->cmd, "/v3/lease/revoke", body, &resp, &res);
		if (r == 0)
			json_object_put(resp);
		else if (res.grpc == GRPC_NOT_FOUND)
			r = 0; /* already gone */
		if (r != 0) {
			rc = r;
			continue;
		}
		/* Its keys are gone: so are the orphans' entries. */
		pthread_mutex_lock(&e->mu);
		for (size_t i = 0; i < e->nholds;) {
			hold *h = &e->holds[i];
			if (h->orphan && (h->lease == old.id || h->maybe == old.id)) {
				free(h->name);
				*h = e->holds[--e->nholds];
			} else {
				i++;
			}
		}
		pthread_mutex_unlock(&e->mu);
		e->leases[li] = e->leases[--e->nleases];
		li--;
	}
	return rc;
}

/*
 * Whether `me` holds given the keys of the name sorted by create revision
 * (all of them, or at least the first `permits` for exclusive mode). The
 * permits rule of every store (dlock/lock.h): holders + 1 <= the smallest
 * permits among the holders and the caller.
 * For waiters, *before gets the key to watch (or NULL: watch the directory).
 */
int dlock__et_holds(const kv *keys, size_t n, const kv *me, dlock_mode mode, unsigned permits, const kv **watch)
{
	size_t older = 0;
	unsigned limit = permits; /* the smallest permits among the older writers and me */
	const kv *prev = NULL, *prev_writer = NULL;
	for (size_t i = 0; i < n; i++) {
		if (keys[i].create_rev >= me->create_rev)
			break;
		older++;
		prev = &keys[i];
		if (keys[i].mode == DLOCK_EXCLUSIVE) {
			prev_writer = &keys[i];
			if (keys[i].permits < limit)
				limit = keys[i].permits;
		}
	}
	if (watch)
		*watch = NULL;
	if (mode == DLOCK_SHARED) {
		if (watch)
			*watch = prev_writer;
		return prev_writer == NULL;
	}
	if (permits <= 1) {
		if (watch)
			*watch = prev;
		return older == 0;
	}
	/* The key at queue position `older` holds while older + 1 <= the smallest
	 * permits of the keys up to it: the holders are a prefix of the queue, as
	 * many as every one of them allows (a mutex ahead admits nobody). */
	return older < limit;
}

static char *value_json(const dlock_request *req)
{
	json_object *v = json_object_new_object();
	json_object_object_add(v, "owner", json_object_new_string(req->owner));
	json_object_object_add(v, "mode", json_object_new_string(req->mode == DLOCK_SHARED ? "shared" : "exclusive"));
	json_object_object_add(v, "permits", json_object_new_int64(req->permits));
	json_object_object_add(v, "host", json_object_new_string(req->host ? req->host : ""));
	json_object_object_add(v, "pid", json_object_new_int64(req->pid));
	char *s = dlock_sys_strdup(json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
	json_object_put(v);
	return s;
}

/* Delete req's key (an undo, a release): forget it, or, when that fails, orphan it. */
static int drop_key(etcd_store *e, const dlock_request *req, const char *key, int64_t *deleted, rpc_result *res)
{
	int rc = dlock__et_delete_key(e, e->cmd, key, deleted, res);
	if (rc == 0)
		hold_forget(e, req);
	else
		hold_orphan(e, req);
	return rc;
}

/* Set the deadline of a call (under the store mutex). */
void dlock__et_call_begin(etcd_store *e, int64_t deadline)
{
	e->deadline = deadline > 0 ? deadline : dlock_clock_ms() + e->request_timeout_ms;
	e->reached = 0;
}

static int lease_retired(etcd_store *e, int64_t id)
{
	lease *l = dlock__et_lease_find_id(e, id);
	return l && l->retired;
}

/* req->slot marks "our key was queued by an earlier try of this acquire":
 * the next try reads instead of writing. Only a hint: the read checks. */
#define QUEUED(e) ((void *)(e))

int dlock__et_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	etcd_store *e = (etcd_store *)be;
	int64_t t0 = dlock_clock_ms();
	/* a shared lease confirmed alive until then needs no keep-alive for a grant */
	const int64_t alive_enough = t0 + req->ttl_ms * 2 / 3;
	unsigned permits = req->permits;
	int shared = req->mode == DLOCK_SHARED;
	/* Readers need every older key to see writers; a semaphore needs its N oldest. */
	int64_t limit = shared ? 0 : permits;
	/* A try-once mutex asks "is the directory empty?" instead of queueing and unqueueing. */
	int try_empty = !req->waiting && !shared && permits == 1;
	int queued = req->slot == QUEUED(e), was_queued = queued;
	keyset nm;
	char *value = NULL;
	int rc = dlock__et_names_make(e, req, &nm, MK_CREATE);
	if (rc != 0)
		return rc;
	if (!(value = value_json(req))) {
		dlock__et_names_free(&nm);
		return DLOCK_ENOMEM;
	}
	out->slot = NULL;
	dlock__et_call_begin(e, req->deadline_ms);
	rescue(e);
	for (int attempt = 0; attempt < 4; attempt++) {
		lease *l;
		json_object *resp = NULL, *ka_resp = NULL;
		kv *mine = NULL, *keys = NULL;
		size_t nmine = 0, nkeys = 0;
		rpc_result res;
		if ((rc = dlock__et_lease_get(e, req->ttl_ms, &l)) != 0)
			break;
		int64_t lease_id = l->id;
		json_object *cmp = json_object_new_array(), *ok = json_object_new_array(),
			    *ko = json_object_new_array(), *body = json_object_new_object();
		if (queued) {
			/* Our key exists: re-check with a serializable read, which no raft
			 * round and no pending write of another client delays. Safe because
			 * (a) if this member shows our key first at revision R, no older key
			 * exists at R and none can appear later (create revisions only grow),
			 * and (b) the grant also needs the lease confirmed alive after t0
			 * below (a keepalive the leader answers, or a grant), so our key still
			 * exists now. A lagging member only makes us wait longer. */
			json_object_array_add(ok, dlock__et_op_range(nm.key, NULL, 0, 0, R_SERIALIZABLE));
			json_object_array_add(ok, dlock__et_op_range(nm.dir, nm.end, 1, limit, R_SERIALIZABLE));
		} else {
			hold_set_maybe(e, req, lease_id);
			json_object_array_add(cmp, try_empty ? dlock__et_cmp_create(nm.dir, nm.end, "EQUAL", 0)
							     : dlock__et_cmp_create(nm.key, NULL, "EQUAL", 0));
			/* Created now: our create revision is the put's revision. */
			json_object_array_add(ok, dlock__et_op_put(nm.key, value, lease_id, 0));
			json_object_array_add(ok, dlock__et_op_range(nm.dir, nm.end, 1, limit, 0));
			json_object_array_add(ko, dlock__et_op_range(nm.key, NULL, 0, 0, 0));
			json_object_array_add(ko, dlock__et_op_range(nm.dir, nm.end, 1, limit, 0));
		}
		json_object_object_add(body, "compare", cmp);
		json_object_object_add(body, "success", ok);
		json_object_object_add(body, "failure", ko);
		/* The core counts the lease from t0 unless told otherwise. A shared
		 * lease confirmed alive for two thirds of a TTL from t0 or more is
		 * used as it is: the grant says when it was confirmed
		 * (out->lease_from_ms) and the renewer keeps it alive from a third of
		 * it. Else keep it alive now, in parallel with the Txn (a second
		 * connection): no extra round trip, but work for the server. */
		int need_ka = l->alive_until < alive_enough;
		int64_t ka_left = -1, ka_sent = dlock_clock_ms();
		if (need_ka) {
			int ka_rc;
			json_object_get(body);
			dlock__et_rpc_pair(e, "/v3/kv/txn", body, &resp, &rc, &res, "/v3/lease/keepalive",
					   dlock__et_keepalive_body(lease_id), &ka_resp, &ka_rc);
			if (ka_rc == 0 && dlock__et_keepalive_read(e, lease_id, ka_resp, ka_sent, &ka_left) != 0)
				ka_left = -1;
			/* One attempt only: fail over or re-authenticate through dlock__et_rpc(). The
			 * Txn may be repeated safely: its compare makes the write happen once. */
			if (rc != 0 && res.grpc != GRPC_NOT_FOUND &&
			    (rc == DLOCK_EUNAVAILABLE || res.grpc == GRPC_UNAUTHENTICATED))
				rc = dlock__et_rpc(e, e->cmd, "/v3/kv/txn", body, &resp, &res);
			else
				json_object_put(body);
		} else {
			rc = dlock__et_rpc(e, e->cmd, "/v3/kv/txn", body, &resp, &res);
		}
		if (rc != 0) {
			if (res.grpc == GRPC_NOT_FOUND) {
				/* "requested lease not found": it expired (we were paused, or
				 * cut off longer than its TTL). Start again on a new lease:
				 * our old queue position went with it. */
				dlock__et_lease_drop(e, lease_id);
				queued = 0;
				continue;
			}
			break;
		}
		if (dlock__et_jbool(resp, "succeeded") && !queued) {
			json_object *rs = dlock__et_jget(resp, "responses");
			json_object *put = rs && json_object_is_type(rs, json_type_array)
						   ? dlock__et_jget(json_object_array_get_idx(rs, 0), "response_put")
						   : NULL;
			int64_t prev = dlock__et_jint(dlock__et_jget(put, "header"), "revision");
			if (prev <= 0) {
				rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "txn answer without put revision");
			} else if (!(mine = calloc(1, sizeof(kv)))) {
				rc = dlock_sys_oom();
			} else {
				nmine = 1;
				mine[0].create_rev = prev;
				mine[0].lease = lease_id;
				mine[0].mode = req->mode;
				mine[0].permits = permits;
				rc = dlock__etcd_txn_range(resp, 1, &keys, &nkeys);
			}
		} else if ((rc = dlock__etcd_txn_range(resp, 0, &mine, &nmine)) == 0) {
			rc = dlock__etcd_txn_range(resp, 1, &keys, &nkeys);
		}
		json_object_put(resp);
		if (rc != 0) {
			dlock__etcd_kvs_free(mine, nmine);
			dlock__etcd_kvs_free(keys, nkeys);
			break;
		}
		if (nmine == 0) {
			dlock__etcd_kvs_free(keys, nkeys);
			if (queued) { /* our queue key is gone (its lease ended): queue again */
				queued = 0;
				attempt--;
				continue;
			}
			/* Only the try-once compare leaves us without a key: someone holds it. */
			hold_forget(e, req);
			rc = DLOCK_ELOCKED;
			break;
		}
		/* Our key and the queue come from one Txn, i.e. one revision: if we are
		 * first there, our key (and so our lease) was alive at that revision.
		 * This is the re-read etcd's own Lock RPC lacked (etcd issue 11456). */
		int granted = dlock__et_holds(keys, nkeys, &mine[0], req->mode, permits, NULL);
		int64_t key_lease = mine[0].lease;
		hold_set_lease(e, req, key_lease);
		uint64_t rev = (uint64_t)mine[0].create_rev;
		dlock__etcd_kvs_free(mine, nmine);
		dlock__etcd_kvs_free(keys, nkeys);
		if (granted && lease_retired(e, key_lease)) {
			/* Our key rides on a lease retired during this call: move it, then
			 * read again (its place and create revision stay). */
			if ((rc = rescue(e)) != 0)
				break;
			queued = 1;
			continue;
		}
		if (granted) {
			lease *kl = dlock__et_lease_find_id(e, key_lease);
			int64_t left;
			if (key_lease == lease_id && ka_left >= 0) {
				left = ka_left; /* the parallel keepalive covered it */
			} else if (kl && kl->alive_until >= alive_enough) {
				left = kl->granted_s; /* granted or kept alive lately */
				if (kl->alive_until < t0 + req->ttl_ms)
					out->lease_from_ms = kl->alive_until - req->ttl_ms;
			} else if ((rc = dlock__et_keepalive(e, key_lease, &left)) != 0) {
				/* Unsure whether the lease lives: do not claim the lock. */
				dlock_sys_saved_error saved;
				dlock_sys_error_save(&saved);
				drop_key(e, req, nm.key, NULL, NULL);
				dlock_sys_error_restore(&saved);
				break;
			}
			if (left <= 0) {
				dlock__et_lease_drop(e, key_lease);
				queued = 0;
				continue;
			}
			if (dlock_clock_ms() - t0 >= req->ttl_ms - dlock_sys_drift_ms(req->ttl_ms)) {
				/* We were paused (or the answers were that slow) past the lease
				 * the core would count from t0: no grant. A waiter tries again
				 * at once and gets a fresh deadline; a try-once gives up. */
				if (req->waiting) {
					out->slot = QUEUED(e);
					rc = DLOCK_ELOCKED;
				} else {
					drop_key(e, req, nm.key, NULL, NULL);
					rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
							     "%s: the grant came after the lease would have ended",
							     req->name);
				}
				break;
			}
			out->fence = rev;
			rc = 0;
			break;
		}
		if (!req->waiting) {
			int drc = drop_key(e, req, nm.key, NULL, NULL);
			rc = drc == 0 ? DLOCK_ELOCKED : drc;
			break;
		}
		/* Queued: our key is our place in line. Nobody renews its lease while
		 * we hold nothing, so each try keeps it alive (above, or here). */
		lease *kl = dlock__et_lease_find_id(e, key_lease);
		if (ka_left < 0 && kl && dlock_clock_ms() - kl->touched > kl->granted_s * 1000 / 3) {
			int64_t left = 0;
			if (dlock__et_keepalive(e, key_lease, &left) == 0 && left <= 0) {
				dlock__et_lease_drop(e, key_lease);
				queued = 0;
				continue;
			}
		}
		out->slot = QUEUED(e);
		rc = DLOCK_ELOCKED;
		break;
	}
	if (rc != 0 && rc != DLOCK_ELOCKED && !was_queued) {
		/* The core only cancels waiters it saw queued: a failed first try may
		 * still have created our key, so take it back (best effort, within
		 * this call's deadline; keep the error). If that fails too, the key
		 * is an orphan: its lease is retired so it cannot outlive its TTL. */
		dlock_sys_saved_error saved;
		dlock_sys_error_save(&saved);
		drop_key(e, req, nm.key, NULL, NULL);
		dlock_sys_error_restore(&saved);
	}
	/* A member took our requests but none was served in time (a leader
	 * election): the cluster is there, so a wait goes on (sys/backend.h). */
	if (rc == DLOCK_EUNAVAILABLE && e->reached)
		out->reached = 1;
	free(value);
	dlock__et_names_free(&nm);
	if (rc == DLOCK_ELOCKED)
		dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "%s is held", req->name);
	return rc;
}

int dlock__et_release(dlock_backend *be, const dlock_request *req)
{
	etcd_store *e = (etcd_store *)be;
	keyset nm;
	int64_t deleted = 0, rev = 0;
	rpc_result res;
	int rc = dlock__et_names_make(e, req, &nm, MK_LOOKUP);
	memset(&res, 0, sizeof(res));
	if (rc != 0)
		return rc;
	dlock__et_call_begin(e, req->deadline_ms);
	if (nm.key) {
		rc = drop_key(e, req, nm.key, &deleted, &res);
	} else if ((rc = find_by_owner(e, req, &nm, &rev)) == 0) {
		/* Attached from another process: delete that key only if it is still the one we found. */
		json_object *cmp = json_object_new_array(), *ok = json_object_new_array(), *resp;
		json_object *del = json_object_new_object(), *op = json_object_new_object();
		json_object_array_add(cmp, dlock__et_cmp_create(nm.key, NULL, "EQUAL", rev));
		dlock__et_jadd_b64(del, "key", nm.key, strlen(nm.key));
		json_object_object_add(op, "request_delete_range", del);
		json_object_array_add(ok, op);
		if ((rc = dlock__et_txn(e, e->cmd, cmp, ok, NULL, &resp, &res)) == 0) {
			deleted = dlock__et_jbool(resp, "succeeded");
			json_object_put(resp);
		}
	}
	dlock__et_names_free(&nm);
	if (rc != 0)
		return rc;
	/* After an attempt that may have been applied, "nothing to delete" means ours went. */
	if (deleted == 0 && !res.ambiguous)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name, req->owner);
	return 0;
}

int dlock__et_cancel(dlock_backend *be, const dlock_request *req)
{
	etcd_store *e = (etcd_store *)be;
	keyset nm;
	int rc = dlock__et_names_make(e, req, &nm, MK_LOOKUP);
	if (rc != 0 || !nm.key) {
		dlock__et_names_free(&nm);
		return rc;
	}
	dlock__et_call_begin(e, req->deadline_ms);
	rc = drop_key(e, req, nm.key, NULL, NULL);
	dlock__et_names_free(&nm);
	return rc;
}

int dlock__et_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	etcd_store *e = (etcd_store *)be;
	int64_t t0 = dlock_clock_ms();
	keyset nm;
	lease *l;
	json_object *resp;
	kv *mine = NULL;
	size_t nmine = 0;
	int64_t rev;
	int rc = dlock__et_names_make(e, req, &nm, MK_LOOKUP);
	if (rc != 0)
		return rc;
	dlock__et_call_begin(e, req->deadline_ms);
	rescue(e);
	if (!nm.key && (rc = find_by_owner(e, req, &nm, &rev)) != 0)
		goto out;
	if ((rc = dlock__et_lease_get(e, ttl_ms, &l)) != 0)
		goto out;
	int64_t lease_id = l->id;
	json_object *ok = json_object_new_array();
	json_object_array_add(ok, dlock__et_op_range(nm.key, NULL, 0, 0, 1));
	if ((rc = dlock__et_txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
		goto out;
	rc = dlock__etcd_txn_range(resp, 0, &mine, &nmine);
	json_object_put(resp);
	if (rc != 0)
		goto out;
	if (nmine == 0) {
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name, req->owner);
		goto out;
	}
	if (mine[0].lease != lease_id) {
		/* Another TTL, or a hold attached from another process: move the key
		 * onto our lease of this TTL. Same create revision, so same fence and
		 * same place in line; only if it is still the same key. */
		json_object *cmp = json_object_new_array(), *put = json_object_new_array();
		json_object_array_add(cmp, dlock__et_cmp_create(nm.key, NULL, "EQUAL", mine[0].create_rev));
		json_object_array_add(put, dlock__et_op_put(nm.key, NULL, lease_id, 1));
		rpc_result res;
		int foreign = dlock__et_lease_find_id(e, mine[0].lease) == NULL;
		if ((rc = dlock__et_txn(e, e->cmd, cmp, put, NULL, &resp, &res)) != 0) {
			if (res.grpc == GRPC_NOT_FOUND) /* our lease expired meanwhile */
				dlock__et_lease_drop(e, lease_id);
			goto out;
		}
		int moved = dlock__et_jbool(resp, "succeeded");
		json_object_put(resp);
		if (!moved) {
			rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name, req->owner);
			goto out;
		}
		lease *own = dlock__et_lease_find_id(e, lease_id);
		if (own && foreign)
			own->pinned = 1;
		hold_set_lease(e, req, lease_id);
	}
	l = dlock__et_lease_find_id(e, lease_id);
	if (!l || l->alive_until < t0 + ttl_ms) {
		int64_t left = 0;
		if ((rc = dlock__et_keepalive(e, lease_id, &left)) != 0)
			goto out;
		if (left <= 0)
			rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: lease expired", req->name);
	}
out:
	dlock__etcd_kvs_free(mine, nmine);
	dlock__et_names_free(&nm);
	return rc;
}

int dlock__et_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	etcd_store *e = (etcd_store *)be;
	int64_t *leases = calloc(n ? n : 1, sizeof(int64_t));
	int rc = 0;
	if (!leases)
		return dlock_sys_oom();
	/* With several members, one that hangs must not eat the whole lease:
	 * give each attempt at most 3/5 of the shortest TTL, then try the next
	 * member (a link as slow as TTL/2 a round trip still gets through). */
	int64_t min_ttl = INT64_MAX, deadline = INT64_MAX;
	for (size_t i = 0; i < n; i++) {
		if (reqs[i]->ttl_ms < min_ttl)
			min_ttl = reqs[i]->ttl_ms;
		if (reqs[i]->deadline_ms > 0 && reqs[i]->deadline_ms < deadline)
			deadline = reqs[i]->deadline_ms;
	}
	dlock__et_call_begin(e, deadline == INT64_MAX ? 0 : deadline);
	rescue(e);
	int64_t cap = min_ttl / 5 * 3;
	e->op_timeout_ms = e->nurls < 2 ? 0 : cap < 500 ? 500 : (long)cap;
	/* One Txn reads every hold's key (which lease it rides on, whether it is
	 * still there); one keepalive per distinct lease covers them all. The
	 * keepalive of the lease our holds are known to ride on goes in
	 * parallel with the read (one round trip, so a link as slow as TTL/2
	 * keeps its locks); a lease the read finds unexpected gets its own.
	 * The read is serializable so that it needs no leader (it must not eat
	 * the lease during an election); the keepalive, which the leader
	 * answers, is what proves the lease. */
	int64_t ka_id = 0, ka_left = -1;
	pthread_mutex_lock(&e->mu);
	for (size_t i = 0; i < n && !ka_id; i++) {
		hold *h = hold_find(e, reqs[i]->name, reqs[i]->owner);
		if (h && h->lease && !h->maybe && !lease_retired(e, h->lease))
			ka_id = h->lease;
	}
	pthread_mutex_unlock(&e->mu);
	/* n <= TXN_MAX_OPS (renew_max): one Txn. */
	json_object *ok = json_object_new_array(), *resp = NULL;
	for (size_t i = 0; i < n; i++) {
		keyset nm;
		if ((rc = dlock__et_names_make(e, reqs[i], &nm, MK_LOOKUP)) != 0)
			break;
		/* Not ours (never is, for a renewed hold): the bare directory name,
		 * which is never a key, reads as "gone". */
		json_object_array_add(ok, dlock__et_op_range(nm.key ? nm.key : nm.dir, NULL, 0, 0,
							     R_KEYS_ONLY | R_SERIALIZABLE));
		dlock__et_names_free(&nm);
	}
	if (rc != 0) {
		json_object_put(ok);
	} else {
		json_object *body = json_object_new_object();
		json_object_object_add(body, "compare", json_object_new_array());
		json_object_object_add(body, "success", ok);
		json_object_object_add(body, "failure", json_object_new_array());
		if (ka_id) {
			json_object *ka_resp = NULL;
			rpc_result res;
			int ka_rc;
			int64_t sent = dlock_clock_ms();
			json_object_get(body);
			dlock__et_rpc_pair(e, "/v3/kv/txn", body, &resp, &rc, &res, "/v3/lease/keepalive",
					   dlock__et_keepalive_body(ka_id), &ka_resp, &ka_rc);
			if (ka_rc != 0 || dlock__et_keepalive_read(e, ka_id, ka_resp, sent, &ka_left) != 0)
				ka_left = -1;
			/* One attempt only: fail over or re-authenticate through dlock__et_rpc(). */
			if (rc != 0 && (rc == DLOCK_EUNAVAILABLE || res.grpc == GRPC_UNAUTHENTICATED))
				rc = dlock__et_rpc(e, e->cmd, "/v3/kv/txn", body, &resp, NULL);
			else
				json_object_put(body);
		} else {
			rc = dlock__et_rpc(e, e->cmd, "/v3/kv/txn", body, &resp, NULL);
		}
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		kv *k;
		size_t nk;
		if ((rc = dlock__etcd_txn_range(resp, i, &k, &nk)) != 0)
			break;
		leases[i] = nk ? k[0].lease : 0;
		dlock__etcd_kvs_free(k, nk);
	}
	json_object_put(resp);
	if (rc != 0) {
		e->op_timeout_ms = 0;
		free(leases);
		return rc;
	}
	for (size_t i = 0; i < n; i++)
		results[i] = leases[i] ? 1 : DLOCK_ENOTHELD; /* 1: not yet decided */
	for (size_t i = 0; i < n; i++) {
		if (results[i] != 1)
			continue;
		int64_t left = 0;
		int krc = leases[i] == ka_id && ka_left >= 0 ? (left = ka_left, 0)
							     : dlock__et_keepalive(e, leases[i], &left);
		int r = krc != 0 ? krc : left > 0 ? 0 : DLOCK_ENOTHELD;
		for (size_t j = i; j < n; j++)
			if (results[j] == 1 && leases[j] == leases[i])
				results[j] = r;
	}
	for (size_t i = 0; i < n; i++)
		if (results[i] == DLOCK_ENOTHELD)
			hold_forget(e, reqs[i]);
	e->op_timeout_ms = 0;
	free(leases);
	return 0;
}
