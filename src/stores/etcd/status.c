/*
 * etcd store: status and list.
 */
#include "etcd.h"

/* ------------------------------------------------------------------ */
/* status */

static int fill_status(etcd_store *e, dlock_lock_status *st, kv *keys, size_t n)
{
	uint64_t last = 0;
	st->permits = n ? keys[0].permits : 1;
	for (size_t i = 0; i < n; i++) {
		if (!dlock__et_holds(keys, n, &keys[i], keys[i].mode, keys[i].permits, NULL)) {
			st->waiters++;
			continue;
		}
		dlock_holder *h = dlock_sys_status_add_holder(st);
		if (!h)
			return DLOCK_ENOMEM;
		h->owner = dlock_sys_strdup(keys[i].owner ? keys[i].owner : "");
		h->host = dlock_sys_strdup(keys[i].host ? keys[i].host : "");
		if (!h->owner || !h->host)
			return DLOCK_ENOMEM;
		h->pid = keys[i].pid;
		h->mode = keys[i].mode;
		h->fence = (uint64_t)keys[i].create_rev;
		h->ttl_left_ms = -1;
		if (h->fence > last)
			last = h->fence;
		json_object *body = json_object_new_object(), *resp;
		dlock__et_jadd_i64(body, "ID", keys[i].lease);
		if (dlock__et_rpc(e, e->cmd, "/v3/lease/timetolive", body, &resp, NULL) == 0) {
			int64_t ttl = dlock__et_jint(resp, "TTL");
			h->ttl_left_ms = ttl > 0 ? ttl * 1000 : 0;
			json_object_put(resp);
		}
	}
	st->last_fence = last;
	return 0;
}

int dlock__et_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	etcd_store *e = (etcd_store *)be;
	int rc = 0;
	*out = NULL;
	*count = 0;
	dlock__et_call_begin(e, 0);
	for (size_t i = 0; i < nnames && rc == 0; i++) {
		char *dir = dlock__et_dir_of(e, names[i]), *end = dir ? dlock__et_range_end(dir) : NULL;
		json_object *ok = json_object_new_array(), *resp;
		kv *keys = NULL;
		size_t nk = 0;
		if (!end) {
			free(dir);
			json_object_put(ok);
			rc = DLOCK_ENOMEM;
			break;
		}
		json_object_array_add(ok, dlock__et_op_range(dir, end, 1, 0, 0));
		free(dir);
		free(end);
		if ((rc = dlock__et_txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
			break;
		rc = dlock__etcd_txn_range(resp, 0, &keys, &nk);
		json_object_put(resp);
		dlock_lock_status *st = rc == 0 ? dlock_sys_status_add(out, count) : NULL;
		if (rc == 0 && !st)
			rc = DLOCK_ENOMEM;
		if (rc == 0 && !(st->name = dlock_sys_strdup(names[i])))
			rc = DLOCK_ENOMEM;
		if (rc == 0)
			rc = fill_status(e, st, keys, nk);
		dlock__etcd_kvs_free(keys, nk);
	}
	if (rc != 0) {
		dlock_status_free(*out, *count);
		*out = NULL;
		*count = 0;
	}
	return rc;
}

/* The names with keys under the prefix: "<prefix>/<name>/<owner>" (names are
 * escaped, so the name is what lies between the prefix and the next '/'). */
int dlock__et_list(dlock_backend *be, char ***names, size_t *count)
{
	etcd_store *e = (etcd_store *)be;
	*names = NULL;
	*count = 0;
	dlock__et_call_begin(e, 0);
	char *pre = dlock_sys_sprintf("%s/", e->prefix), *end = pre ? dlock__et_range_end(pre) : NULL;
	json_object *ok = json_object_new_array(), *resp;
	kv *keys = NULL;
	size_t nk = 0, plen = pre ? strlen(pre) : 0;
	int rc = 0;
	if (!end) {
		free(pre);
		json_object_put(ok);
		return DLOCK_ENOMEM;
	}
	json_object_array_add(ok, dlock__et_op_range(pre, end, 1, 0, 0));
	free(end);
	if ((rc = dlock__et_txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) == 0) {
		rc = dlock__etcd_txn_range(resp, 0, &keys, &nk);
		json_object_put(resp);
	}
	if (rc == 0 && nk && !(*names = calloc(nk, sizeof(char *))))
		rc = dlock_sys_oom();
	for (size_t i = 0; i < nk && rc == 0; i++) {
		if (!keys[i].key || strncmp(keys[i].key, pre, plen) != 0)
			continue;
		const char *slash = strchr(keys[i].key + plen, '/');
		if (!slash || slash == keys[i].key + plen)
			continue;
		char *name = dlock__etcd_unescape_name(keys[i].key + plen, (size_t)(slash - keys[i].key) - plen);
		if (!name)
			rc = dlock_sys_oom();
		else
			(*names)[(*count)++] = name; /* duplicates: the core drops them */
	}
	free(pre);
	dlock__etcd_kvs_free(keys, nk);
	return rc;
}
