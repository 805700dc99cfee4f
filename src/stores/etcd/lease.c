/*
 * etcd store: leases, one per distinct TTL per store handle (under the store
 * mutex); orphans retire their lease.
 */
#include "etcd.h"

/* ------------------------------------------------------------------ */
/* leases (under the store mutex) */

static int64_t ttl_secs(int64_t ttl_ms)
{
	int64_t s = (ttl_ms + 999) / 1000;
	return s < 1 ? 1 : s;
}

void dlock__et_lease_drop(etcd_store *e, int64_t id)
{
	for (size_t i = 0; i < e->nleases; i++) {
		if (e->leases[i].id == id) {
			e->leases[i] = e->leases[--e->nleases];
			return;
		}
	}
}

lease *dlock__et_lease_find_id(etcd_store *e, int64_t id)
{
	for (size_t i = 0; i < e->nleases; i++)
		if (e->leases[i].id == id)
			return &e->leases[i];
	return NULL;
}

json_object *dlock__et_keepalive_body(int64_t id)
{
	json_object *body = json_object_new_object();
	dlock__et_jadd_i64(body, "ID", id);
	return body;
}

/* Read a keepalive answer (consumed) for lease `id` sent at `sent`. */
int dlock__et_keepalive_read(etcd_store *e, int64_t id, json_object *resp, int64_t sent, int64_t *ttl_s)
{
	int rc = 0;
	json_object *r = dlock__et_jget(resp, "result");
	*ttl_s = r ? dlock__et_jint(r, "TTL") : 0;
	if (!r && dlock__et_jget(resp, "error"))
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "keepalive: %s",
				     dlock__et_jstr(resp, "error") ? dlock__et_jstr(resp, "error") : "error");
	json_object_put(resp);
	if (rc != 0)
		return rc;
	lease *l = dlock__et_lease_find_id(e, id);
	if (l) {
		if (*ttl_s > 0) {
			l->alive_until = sent + *ttl_s * 1000;
			l->touched = sent;
		} else {
			dlock__et_lease_drop(e, id);
		}
	}
	return 0;
}

/*
 * Keep lease `id` alive now. *ttl_s gets what etcd says is left (0: the
 * lease is gone, its keys deleted). The gateway answers a keepalive of an
 * unknown lease with a result without TTL, not an error.
 */
int dlock__et_keepalive(etcd_store *e, int64_t id, int64_t *ttl_s)
{
	json_object *resp;
	int64_t sent = dlock_clock_ms();
	lease *l = dlock__et_lease_find_id(e, id);
	if (l && l->retired)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "lease %llx carries a key whose delete failed: not kept alive", (long long)id);
	int rc = dlock__et_rpc(e, e->cmd, "/v3/lease/keepalive", dlock__et_keepalive_body(id), &resp, NULL);
	if (rc != 0)
		return rc;
	return dlock__et_keepalive_read(e, id, resp, sent, ttl_s);
}

/* The lease for ttl_ms, granted on first use. */
int dlock__et_lease_get(etcd_store *e, int64_t ttl_ms, lease **out)
{
	int64_t s = ttl_secs(ttl_ms);
	for (size_t i = 0; i < e->nleases; i++) {
		if (e->leases[i].ttl_s == s && !e->leases[i].retired) {
			*out = &e->leases[i];
			return 0;
		}
	}
	json_object *body = json_object_new_object(), *resp;
	int64_t sent = dlock_clock_ms();
	dlock__et_jadd_i64(body, "TTL", s);
	int rc = dlock__et_rpc(e, e->cmd, "/v3/lease/grant", body, &resp, NULL);
	if (rc != 0)
		return rc;
	int64_t id = dlock__et_jint(resp, "ID"), granted = dlock__et_jint(resp, "TTL");
	const char *err = dlock__et_jstr(resp, "error");
	json_object_put(resp);
	if (id == 0 || granted <= 0)
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "lease grant: %s",
				       err ? err : "no lease in the answer");
	if (e->nleases == MAX_LEASES) {
		/* Too many distinct TTLs: forget the least recently kept one (etcd
		 * still expires it). A retired one is kept until it is revoked. */
		size_t old = MAX_LEASES;
		for (size_t i = 0; i < e->nleases; i++)
			if (!e->leases[i].retired &&
			    (old == MAX_LEASES || e->leases[i].touched < e->leases[old].touched))
				old = i;
		if (old == MAX_LEASES)
			return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "too many leases waiting to be revoked");
		e->leases[old] = e->leases[--e->nleases];
	}
	lease *l = &e->leases[e->nleases++];
	memset(l, 0, sizeof(*l));
	l->ttl_s = s;
	l->granted_s = granted;
	l->id = id;
	l->touched = sent;
	l->alive_until = sent + granted * 1000;
	*out = l;
	return 0;
}
