/*
 * etcd store: wait — watch the key we queue behind (a pooled watch stream and
 * a read beside it), without the store mutex.
 */
#include "etcd.h"

/*
 * Read our key and the queue of nm, from the member we ask alone
 * (serializable), on h. While we wait in line: 1, *rev the revision read and
 * *target the key to watch (malloc'd; NULL: the whole directory). Nothing to
 * wait for (we hold, our key is gone) or the read failed: 0, and acquire
 * finds out which.
 */
static int wait_read(etcd_store *e, CURL *h, const keyset *nm, const dlock_request *req, int64_t until, int64_t *rev,
		     char **target)
{
	json_object *ok = json_object_new_array(), *body = json_object_new_object(), *resp = NULL;
	kv *mine = NULL, *keys = NULL;
	size_t nmine = 0, nkeys = 0;
	const kv *behind = NULL;
	unsigned permits = req->permits;
	int waiting = 0;
	*target = NULL;
	json_object_array_add(ok, dlock__et_op_range(nm->key, NULL, 0, 0, R_SERIALIZABLE));
	json_object_array_add(ok, dlock__et_op_range(nm->dir, nm->end, 1, 0, R_SERIALIZABLE));
	json_object_object_add(body, "compare", json_object_new_array());
	json_object_object_add(body, "success", ok);
	json_object_object_add(body, "failure", json_object_new_array());
	if (dlock__et_rpc_until(e, h, "/v3/kv/txn", body, &resp, NULL, until) != 0)
		return 0;
	*rev = dlock__et_jint(dlock__et_jget(resp, "header"), "revision");
	if (dlock__etcd_txn_range(resp, 0, &mine, &nmine) == 0 && dlock__etcd_txn_range(resp, 1, &keys, &nkeys) == 0 &&
	    nmine && !dlock__et_holds(keys, nkeys, &mine[0], req->mode, permits, &behind))
		waiting = !behind || !behind->key || (*target = dlock_sys_strdup(behind->key)) != NULL;
	json_object_put(resp);
	dlock__etcd_kvs_free(mine, nmine);
	dlock__etcd_kvs_free(keys, nkeys);
	return waiting;
}

/* Open a watch of key (or [key, end)) for deletes from now on, on w's stream. */
static int watch_start(etcd_store *e, waitkit *k, xfer *x, watch_ctx *w, const char *key, const char *end,
		       int64_t until)
{
	json_object *cr = json_object_new_object(), *body = json_object_new_object(),
		    *filters = json_object_new_array();
	int rc = DLOCK_ENOMEM;
	memset(x, 0, sizeof(*x));
	if (dlock__et_jadd_b64(cr, "key", key, strlen(key)) != 0 ||
	    (end && dlock__et_jadd_b64(cr, "range_end", end, strlen(end)) != 0)) {
		json_object_put(cr);
		json_object_put(filters);
		goto out;
	}
	json_object_array_add(filters, json_object_new_string("NOPUT"));
	json_object_object_add(cr, "filters", filters);
	json_object_object_add(body, "create_request", cr);
	const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
	/* body goes before the transfer runs: libcurl keeps a copy. */
	if (!text || dlock__et_xfer_start(e, x, k->watch, "/v3/watch", text, until, 1) != 0)
		goto out;
	curl_easy_setopt(k->watch, CURLOPT_COPYPOSTFIELDS, text);
	curl_easy_setopt(k->watch, CURLOPT_WRITEFUNCTION, dlock__etcd_watch_write);
	curl_easy_setopt(k->watch, CURLOPT_WRITEDATA, w);
	rc = curl_multi_add_handle(k->multi, k->watch) == CURLM_OK ? 0 : dlock_sys_oom();
out:
	json_object_put(body);
	return rc;
}

/*
 * Wait for the key we queue behind to go (or for a third of the TTL, or
 * timeout_ms). The watch starts at etcd's current revision, not at the one
 * we read: etcd serves a watch that starts in the past from its "unsynced"
 * group, which it catches up only every 100 ms — a delete in that window
 * reached the waiter up to 100 ms late. A watch from now is live at once;
 * the read is repeated next to it when the revision moved in between, so a
 * delete before the watch is not missed either.
 */
int dlock__et_wait(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out)
{
	(void)out; /* a wake-up only: the next acquire takes the lock */
	etcd_store *e = (etcd_store *)be;
	int64_t start = dlock_clock_ms();
	/* Come back within a third of the lease so acquire can keep our queue key alive. */
	int64_t cap = req->ttl_ms / 3 > 100 ? req->ttl_ms / 3 : 100;
	if (timeout_ms < 0 || timeout_ms > cap)
		timeout_ms = cap;
	keyset nm;
	if (dlock__et_names_make(e, req, &nm, MK_LOOKUP) != 0 || !nm.key) {
		dlock__et_names_free(&nm);
		return 0;
	}
	waitkit *k = dlock__et_kit_take(e);
	char *target = NULL, *again = NULL;
	int64_t rev = 0, rev2 = 0;
	watch_ctx w = { 0 };
	xfer x;
	memset(&x, 0, sizeof(x));
	/* Bounded by the wait's own timeout: a hung member must not hold us past it. */
	int64_t until = start + timeout_ms, left;
	if (!k || !wait_read(e, k->read, &nm, req, until, &rev, &target))
		goto out;
	left = until - dlock_clock_ms();
	if (left <= 0 || !(w.tok = json_tokener_new()))
		goto out;
	/* Watch only the key we queue behind (no thundering herd); a semaphore
	 * waits for any older key to go, so it watches the directory. */
	if (watch_start(e, k, &x, &w, target ? target : nm.dir, target ? NULL : nm.end, until) != 0)
		goto out;
	int checked = 0;
	x.c = CURLE_OK;
	while (!w.done && (left = until - dlock_clock_ms()) > 0) {
		int running = 0, q;
		CURLMsg *m;
		if (curl_multi_perform(k->multi, &running) != CURLM_OK)
			break;
		while ((m = curl_multi_info_read(k->multi, &q)))
			if (m->msg == CURLMSG_DONE && m->easy_handle == k->watch) {
				x.c = m->data.result;
				w.done = 1;
			}
		if (w.created && !checked && !w.done) {
			checked = 1;
			/* Revisions moved between our read and the watch: read again, at
			 * least at the watch's revision, that we still queue behind the
			 * same key. Else let acquire look. */
			if (w.rev > rev && (!wait_read(e, k->read, &nm, req, until, &rev2, &again) || rev2 < w.rev ||
					    (target && (!again || strcmp(again, target) != 0)) || (!target && again)))
				break;
			continue;
		}
		if (!w.done && curl_multi_poll(k->multi, NULL, 0, (int)(left < 1000 ? left : 1000), NULL) != CURLM_OK)
			break;
	}
	curl_multi_remove_handle(k->multi, k->watch);
	/* A timeout is the normal end of a wait; only a broken connection moves us on. */
	if (x.c != CURLE_OK && x.c != CURLE_WRITE_ERROR && x.c != CURLE_OPERATION_TIMEDOUT &&
	    dlock__et_curl_failover(x.c))
		dlock__et_endpoint_failed(e, x.idx);
out:
	dlock__et_xfer_end(&x);
	if (w.tok)
		json_tokener_free(w.tok);
	free(target);
	free(again);
	dlock__et_names_free(&nm);
	if (k)
		dlock__et_kit_put(e, k);
	return 0;
}
