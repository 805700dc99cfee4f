/*
 * etcd store: etcd v3 through its JSON gateway (/v3/...), libcurl + json-c.
 * This file: options, open and close; the rest of the store: etcd.h.
 *
 * Key layout: one directory per lock name, one key per hold or waiter:
 *
 *   <prefix>/<name>/<client id>-<slot>   (prefix and name with '%' and '/'
 *                                         percent-escaped: see prefix_enc)
 *   value {"owner","mode","permits","host","pid"}, on a lease of ours
 *
 * The order of the keys by create revision is the queue: the N oldest keys
 * of a semaphore (1 for a mutex) hold it; a reader holds when no writer key
 * is older than its own. Fence = our key's create revision. Leases: one per
 * distinct TTL (in whole seconds) per store handle, shared by every hold and
 * waiter of that TTL, kept alive by the core's renewal thread.
 *
 * Time: every call keeps its deadline (e->deadline under the store mutex;
 * wait its own): each curl transfer's limits are cut to the time left.
 * Orphans: a key whose delete failed retires its lease (never kept alive
 * again); rescue() moves our live keys off it and revokes it.
 *
 * Threading: everything except wait runs under the core's store mutex and
 * uses `cmd` (and `side`, for a keepalive in parallel), reused curl handles
 * on one multi handle (keep-alive connections), and `hedge`, the handles
 * that race their request on the next members (gateway.c "Hedging"). wait runs concurrently on
 * handle pairs (watch + read) from a small pool; `mu` guards the pool, the
 * token, the current endpoint and the key slots.
 */
#include "etcd.h"

/* ------------------------------------------------------------------ */
/* open / close */

static void etcd_close(dlock_backend *be)
{
	etcd_store *e = (etcd_store *)be;
	if (!e)
		return;
	/* Revoking drops keys left on our leases at once instead of after their
	 * TTL. But a hold still in the table when the store closes was handed
	 * over (dlock_lock_detach: `dlock acquire` leaves it held after exit),
	 * and keys of other processes we adopted (pinned) must outlive us too. */
	dlock__et_call_begin(e, 0);
	for (size_t i = 0; e->cmd && i < e->nleases; i++) {
		int keep = e->leases[i].pinned;
		for (size_t j = 0; j < e->nholds && !keep; j++)
			keep = !e->holds[j].orphan &&
			       (e->holds[j].lease == e->leases[i].id || e->holds[j].maybe == e->leases[i].id);
		if (keep)
			continue;
		json_object *body = json_object_new_object(), *resp;
		dlock__et_jadd_i64(body, "ID", e->leases[i].id);
		if (dlock__et_rpc(e, e->cmd, "/v3/lease/revoke", body, &resp, NULL) == 0)
			json_object_put(resp);
	}
	curl_multi_cleanup(e->multi);
	curl_easy_cleanup(e->cmd);
	curl_easy_cleanup(e->side);
	for (size_t i = 0; e->hedge && i < 2 * e->nurls; i++)
		curl_easy_cleanup(e->hedge[i]);
	free(e->hedge);
	for (size_t i = 0; i < e->npool; i++)
		dlock__et_kit_free(e->pool[i]);
	for (size_t i = 0; i < e->nurls; i++)
		free(e->urls[i]);
	free(e->urls);
	free(e->hp);
	free(e->prefix);
	free(e->user);
	dlock_sys_free_secret(e->password);
	free(e->cacert);
	free(e->cert);
	free(e->key);
	dlock_sys_free_secret(e->token); /* an auth token is a password for its lifetime */
	for (size_t i = 0; i < e->nholds; i++)
		free(e->holds[i].name);
	free(e->holds);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int dup_opt(char **dst, dlock_uri *uri, const char *name)
{
	return dlock_sys_opt_dup(dst, dlock_uri_param(uri, name));
}

/* clang-format off */
static const dlock_backend_methods etcd_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.renew_max = TXN_MAX_OPS, /* one Txn reads a batch's keys */
	.acquire = dlock__et_acquire,
	.release = dlock__et_release,
	.renew = dlock__et_renew,
	.extend = dlock__et_extend,
	.wait = dlock__et_wait,
	.cancel = dlock__et_cancel,
	.status = dlock__et_status,
	.list = dlock__et_list,
	.close = etcd_close,
};
/* clang-format on */

int dlock__etcd_open(dlock_backend **out, dlock_uri *uri)
{
	etcd_store *e;
	dlock_hostport *hp = NULL;
	size_t nhp = 0;
	int tls = strcmp(uri->scheme, "etcds") == 0, rc;
	*out = NULL;
	int64_t start = dlock_clock_ms();
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "curl_global_init failed");
	if (!uri->hosts || !uri->hosts[0])
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "etcd URI needs host:port[,host:port...] (etcd://127.0.0.1:2379)");
	if (uri->path[0] && strcmp(uri->path, "/") != 0)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "etcd URI takes no path (use ?prefix= for a namespace)");
	if ((rc = dlock_uri_hosts(uri, 2379, &hp, &nhp)) != 0)
		return rc;
	if (!(e = dlock_sys_calloc(1, sizeof(*e)))) {
		dlock_free(hp);
		return DLOCK_ENOMEM;
	}
	pthread_mutex_init(&e->mu, NULL);
	dlock_backend_init(&e->base, &etcd_methods);
	e->connect_timeout_ms = (long)uri->connect_timeout_ms;
	e->request_timeout_ms = (long)uri->request_timeout_ms;
	rc = DLOCK_ENOMEM;
	if (!(e->urls = calloc(nhp, sizeof(char *))) || !(e->hp = calloc(nhp, sizeof(*e->hp))))
		goto fail;
	memcpy(e->hp, hp, nhp * sizeof(*hp));
	for (size_t i = 0; i < nhp; i++) {
		if (!tls && uri->password && !dlock_sys_host_is_local(hp[i].host))
			dlock_sys_open_warning(
				"etcd: the password and the lock traffic go to %s over plain HTTP, which a "
				"man in the middle can read; use etcds:// with cacert=CA.pem",
				hp[i].host);
		int v6 = strchr(hp[i].host, ':') != NULL;
		if (!(e->urls[i] = dlock_sys_sprintf("%s://%s%s%s:%d", tls ? "https" : "http", v6 ? "[" : "",
						     hp[i].host, v6 ? "]" : "", hp[i].port)))
			goto fail;
		e->nurls++;
	}
	/* recipe=concurrency: the keys of etcd's concurrency.Mutex (`etcdctl
	 * lock <prefix>/<name>`): the prefix is the etcd key prefix as given,
	 * '/' and all (docs/stores/etcd.md, "Sharing a lock with etcdctl") */
	const char *recipe = dlock_uri_param(uri, "recipe");
	int verbatim = recipe && strcmp(recipe, "concurrency") == 0;
	if (recipe && !verbatim && strcmp(recipe, "dlock") != 0) {
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "etcd: unknown recipe '%s' (dlock or concurrency)",
				     recipe);
		goto fail;
	}
	if (verbatim) {
		size_t plen = strlen(uri->prefix);
		while (plen > 1 && uri->prefix[plen - 1] == '/')
			plen--;
		e->prefix = dlock_sys_strndup(uri->prefix, plen);
	} else {
		e->prefix = dlock__et_prefix_enc(uri->prefix);
	}
	if (!e->prefix) {
		rc = dlock_sys_oom();
		goto fail;
	}
	if ((uri->user && !(e->user = dlock_sys_strdup(uri->user))) ||
	    (uri->password && !(e->password = dlock_sys_strdup(uri->password))))
		goto fail;
	if (dup_opt(&e->cacert, uri, "cacert") || dup_opt(&e->cert, uri, "cert") || dup_opt(&e->key, uri, "key"))
		goto fail;
	if (!tls && (e->cacert || e->cert || e->key)) {
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "cacert/cert/key need the etcds:// scheme (TLS)");
		goto fail;
	}
	if (!(e->cmd = dlock__et_handle_new(e)) || !(e->side = dlock__et_handle_new(e)) ||
	    !(e->multi = curl_multi_init()))
		goto fail;
	/* The whole open (authentication and the first answer) within connect_timeout. */
	e->deadline = start + e->connect_timeout_ms;
	/* cmd, side and their hedges (gateway.c "Hedging") keep a connection each */
	curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, (long)(e->nurls * 2 + 2 > 8 ? e->nurls * 2 + 2 : 8));
	dlock_free(hp);
	hp = NULL;
	/* An unknown option is a usage error, before any connection. */
	if ((rc = dlock_sys_uri_check_unused(uri)) != 0)
		goto fail;
	/* Check now that a member answers (and that the credentials work), so a
	 * wrong URI fails at open rather than at the first lock. */
	if (e->user && (rc = dlock__et_authenticate(e, e->cmd, e->token_gen, e->deadline)) != 0)
		goto fail;
	{
		json_object *body = json_object_new_object(), *resp;
		char *pre = dlock_sys_sprintf("%s/", e->prefix);
		if (!pre) {
			json_object_put(body);
			goto fail;
		}
		dlock__et_jadd_b64(body, "key", pre, strlen(pre));
		free(pre);
		json_object_object_add(body, "count_only", json_object_new_boolean(1));
		json_object_object_add(body, "serializable", json_object_new_boolean(1));
		if ((rc = dlock__et_rpc(e, e->cmd, "/v3/kv/range", body, &resp, NULL)) != 0)
			goto fail;
		json_object_put(resp);
	}
	*out = &e->base;
	return 0;
fail:
	dlock_free(hp);
	etcd_close(&e->base);
	return rc;
}
