/*
 * etcd store: the pure half — base64, JSON getters and builders, key names,
 * Txn operations and their answers, the watch stream's objects (parse.h).
 * Nothing here touches the network; tests/fuzz/fuzz_etcd.c feeds it.
 */
#include "etcd.h"

/* ------------------------------------------------------------------ */
/* small helpers */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *dlock__etcd_b64_encode(const void *data, size_t len)
{
	const unsigned char *p = data;
	char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		unsigned v = (unsigned)p[i] << 16;
		if (i + 1 < len)
			v |= (unsigned)p[i + 1] << 8;
		if (i + 2 < len)
			v |= p[i + 2];
		*o++ = b64chars[(v >> 18) & 63];
		*o++ = b64chars[(v >> 12) & 63];
		*o++ = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
		*o++ = i + 2 < len ? b64chars[v & 63] : '=';
	}
	*o = '\0';
	return out;
}

static int b64_val(int c)
{
	const char *p = c ? strchr(b64chars, c) : NULL;
	return p ? (int)(p - b64chars) : -1;
}

/* Decode into a NUL-terminated malloc'd buffer; *len gets the byte count. NULL on bad input. */
char *dlock__etcd_b64_decode(const char *s, size_t *len)
{
	size_t n = strlen(s);
	char *out = malloc(n / 4 * 3 + 4), *o = out;
	unsigned v = 0;
	int bits = 0;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '=')
			break;
		int d = b64_val((unsigned char)s[i]);
		if (d < 0) {
			free(out);
			return NULL;
		}
		v = (v << 6) | (unsigned)d;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			*o++ = (char)((v >> bits) & 0xff);
		}
	}
	*o = '\0';
	if (len)
		*len = (size_t)(o - out);
	return out;
}

json_object *dlock__et_jget(json_object *o, const char *k)
{
	json_object *v = NULL;
	if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, k, &v))
		return v;
	return NULL;
}

/* int64 fields come as JSON strings; absent means 0 (the gateway omits defaults). */
int64_t dlock__et_jint(json_object *o, const char *k)
{
	json_object *v = dlock__et_jget(o, k);
	if (!v)
		return 0;
	if (json_object_is_type(v, json_type_string))
		return strtoll(json_object_get_string(v), NULL, 10);
	return json_object_get_int64(v);
}

const char *dlock__et_jstr(json_object *o, const char *k)
{
	json_object *v = dlock__et_jget(o, k);
	return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

int dlock__et_jbool(json_object *o, const char *k)
{
	json_object *v = dlock__et_jget(o, k);
	return v ? json_object_get_boolean(v) : 0;
}

int dlock__et_jadd_b64(json_object *o, const char *k, const char *data, size_t len)
{
	char *b = dlock__etcd_b64_encode(data, len);
	if (!b)
		return dlock_sys_oom();
	json_object_object_add(o, k, json_object_new_string(b));
	free(b);
	return 0;
}

void dlock__et_jadd_i64(json_object *o, const char *k, int64_t v)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%" PRId64, v);
	json_object_object_add(o, k, json_object_new_string(buf));
}

/* ------------------------------------------------------------------ */
/* key names */

/* "<prefix>/<escaped name>/": escaping '/' keeps one name's directory from
 * containing another name's keys ("a/" must not match "a/b/<owner>"). */
char *dlock__et_dir_of(const etcd_store *e, const char *name)
{
	size_t n = strlen(e->prefix) + 3 * strlen(name) + 3;
	char *d = malloc(n), *o = d;
	if (!d) {
		dlock_sys_oom();
		return NULL;
	}
	o += sprintf(o, "%s/", e->prefix);
	for (const char *p = name; *p; p++) {
		if (*p == '%' || *p == '/')
			o += sprintf(o, "%%%02X", (unsigned char)*p);
		else
			*o++ = *p;
	}
	*o++ = '/';
	*o = '\0';
	return d;
}

/*
 * The prefix as written in keys: '%' and '/' percent-escaped like a name, so a
 * key has exactly three parts, <prefix>/<name>/<owner>, and the range over
 * one lock's directory never reaches another namespace's keys (prefix=a with
 * lock "x" has the directory "a/x/"; prefix=a/x is written "a%2Fx"). Trailing
 * '/' are dropped first ("a/" is "a"). A prefix without '/' and '%' (the
 * default "dlock") is written as it is.
 */
char *dlock__et_prefix_enc(const char *prefix)
{
	size_t n = strlen(prefix);
	while (n > 1 && prefix[n - 1] == '/')
		n--;
	char *out = malloc(3 * n + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (prefix[i] == '%' || prefix[i] == '/')
			o += sprintf(o, "%%%02X", (unsigned char)prefix[i]);
		else
			*o++ = prefix[i];
	}
	*o = '\0';
	return out;
}

char *dlock__etcd_unescape_name(const char *s, size_t n)
{
	char *out = malloc(n + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%' && i + 2 < n) {
			char hex[3] = { s[i + 1], s[i + 2], 0 };
			*o++ = (char)strtol(hex, NULL, 16);
			i += 2;
		} else {
			*o++ = s[i];
		}
	}
	*o = '\0';
	return out;
}

/* The end of a prefix range: the prefix with its last byte + 1 ('/' -> '0'). */
char *dlock__et_range_end(const char *dir)
{
	char *end = dlock_sys_strdup(dir);
	if (end)
		end[strlen(end) - 1]++;
	return end;
}

/* ------------------------------------------------------------------ */
/* Txn building and reading */

json_object *dlock__et_op_range(const char *key, const char *end, int by_create, int64_t limit, int flags)
{
	json_object *r = json_object_new_object(), *op = json_object_new_object();
	if (dlock__et_jadd_b64(r, "key", key, strlen(key)) != 0 ||
	    (end && dlock__et_jadd_b64(r, "range_end", end, strlen(end)) != 0)) {
		json_object_put(r);
		json_object_put(op);
		return NULL;
	}
	if (by_create) {
		json_object_object_add(r, "sort_order", json_object_new_string("ASCEND"));
		json_object_object_add(r, "sort_target", json_object_new_string("CREATE"));
	}
	if (limit > 0)
		dlock__et_jadd_i64(r, "limit", limit);
	if (flags & R_KEYS_ONLY)
		json_object_object_add(r, "keys_only", json_object_new_boolean(1));
	if (flags & R_SERIALIZABLE)
		json_object_object_add(r, "serializable", json_object_new_boolean(1));
	json_object_object_add(op, "request_range", r);
	return op;
}

json_object *dlock__et_op_put(const char *key, const char *value, int64_t lease_id, int ignore_value)
{
	json_object *r = json_object_new_object(), *op = json_object_new_object();
	if (dlock__et_jadd_b64(r, "key", key, strlen(key)) != 0 ||
	    (value && dlock__et_jadd_b64(r, "value", value, strlen(value)) != 0)) {
		json_object_put(r);
		json_object_put(op);
		return NULL;
	}
	dlock__et_jadd_i64(r, "lease", lease_id);
	if (ignore_value)
		json_object_object_add(r, "ignore_value", json_object_new_boolean(1));
	json_object_object_add(op, "request_put", r);
	return op;
}

json_object *dlock__et_cmp_create(const char *key, const char *end, const char *result, int64_t rev)
{
	json_object *c = json_object_new_object();
	if (dlock__et_jadd_b64(c, "key", key, strlen(key)) != 0 ||
	    (end && dlock__et_jadd_b64(c, "range_end", end, strlen(end)) != 0)) {
		json_object_put(c);
		return NULL;
	}
	json_object_object_add(c, "target", json_object_new_string("CREATE"));
	json_object_object_add(c, "result", json_object_new_string(result));
	dlock__et_jadd_i64(c, "create_revision", rev);
	return c;
}

void dlock__etcd_kv_clear(kv *k)
{
	free(k->key);
	free(k->owner);
	free(k->host);
	memset(k, 0, sizeof(*k));
}

void dlock__etcd_kvs_free(kv *k, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dlock__etcd_kv_clear(&k[i]);
	free(k);
}

int dlock__etcd_kv_parse(json_object *j, kv *out)
{
	memset(out, 0, sizeof(*out));
	const char *k = dlock__et_jstr(j, "key"), *v = dlock__et_jstr(j, "value");
	out->create_rev = dlock__et_jint(j, "create_revision");
	out->lease = dlock__et_jint(j, "lease");
	out->permits = 1;
	if (k && !(out->key = dlock__etcd_b64_decode(k, NULL)))
		return dlock_sys_oom();
	if (v) {
		char *text = dlock__etcd_b64_decode(v, NULL);
		json_object *val = text ? json_tokener_parse(text) : NULL;
		free(text);
		if (val) {
			const char *s;
			if ((s = dlock__et_jstr(val, "owner")))
				out->owner = dlock_sys_strdup(s);
			if ((s = dlock__et_jstr(val, "host")))
				out->host = dlock_sys_strdup(s);
			out->pid = (int)dlock__et_jint(val, "pid");
			s = dlock__et_jstr(val, "mode");
			out->mode = s && strcmp(s, "shared") == 0 ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
			int64_t p = dlock__et_jint(val, "permits");
			out->permits = p > 0 && p < 1000000 ? (unsigned)p : 1;
			json_object_put(val);
		}
	}
	return 0;
}

/* The kvs of responses[i] (a response_range) of a Txn answer. */
int dlock__etcd_txn_range(json_object *dlock__et_txn, size_t i, kv **out, size_t *n)
{
	json_object *resps = dlock__et_jget(dlock__et_txn, "responses");
	json_object *r = resps && json_object_is_type(resps, json_type_array) && i < json_object_array_length(resps)
				 ? dlock__et_jget(json_object_array_get_idx(resps, i), "response_range")
				 : NULL;
	json_object *arr = dlock__et_jget(r, "kvs");
	size_t cnt = arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
	*out = NULL;
	*n = 0;
	if (!r)
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "txn answer without response %zu", i);
	if (!cnt)
		return 0;
	kv *k = calloc(cnt, sizeof(kv));
	if (!k)
		return dlock_sys_oom();
	for (size_t x = 0; x < cnt; x++) {
		if (dlock__etcd_kv_parse(json_object_array_get_idx(arr, x), &k[x]) != 0) {
			dlock__etcd_kvs_free(k, x + 1);
			return DLOCK_ENOMEM;
		}
	}
	*out = k;
	*n = cnt;
	return 0;
}

int dlock__et_txn(etcd_store *e, CURL *h, json_object *compare, json_object *success, json_object *failure,
		  json_object **out, rpc_result *res)
{
	json_object *body = json_object_new_object();
	json_object_object_add(body, "compare", compare ? compare : json_object_new_array());
	json_object_object_add(body, "success", success ? success : json_object_new_array());
	json_object_object_add(body, "failure", failure ? failure : json_object_new_array());
	return dlock__et_rpc(e, h, "/v3/kv/txn", body, out, res);
}

int dlock__et_delete_key(etcd_store *e, CURL *h, const char *key, int64_t *deleted, rpc_result *res)
{
	json_object *body = json_object_new_object(), *resp;
	if (dlock__et_jadd_b64(body, "key", key, strlen(key)) != 0) {
		json_object_put(body);
		return DLOCK_ENOMEM;
	}
	int rc = dlock__et_rpc(e, h, "/v3/kv/deleterange", body, &resp, res);
	if (rc == 0) {
		if (deleted)
			*deleted = dlock__et_jint(resp, "deleted");
		json_object_put(resp);
	}
	return rc;
}

/* ------------------------------------------------------------------ */
/* wait: watch the key we queue behind */

void dlock__etcd_watch_object(watch_ctx *w, json_object *o)
{
	json_object *r = dlock__et_jget(o, "result");
	if (!r) {
		w->done = 1; /* {"error": ...} */
		return;
	}
	if (dlock__et_jbool(r, "created")) {
		w->created = 1;
		w->rev = dlock__et_jint(dlock__et_jget(r, "header"), "revision");
	}
	/* Cancelled (e.g. compacted past our start revision): re-read instead. */
	if (dlock__et_jbool(r, "canceled") || dlock__et_jint(r, "compact_revision") > 0)
		w->done = 1;
	json_object *ev = dlock__et_jget(r, "events");
	size_t n = ev && json_object_is_type(ev, json_type_array) ? json_object_array_length(ev) : 0;
	for (size_t i = 0; i < n; i++) {
		const char *type = dlock__et_jstr(json_object_array_get_idx(ev, i), "type");
		if (type && strcmp(type, "DELETE") == 0)
			w->done = 1;
	}
}

/* The stream is JSON objects separated by newlines; one may span chunks. */
size_t dlock__etcd_watch_write(char *data, size_t size, size_t nmemb, void *ud)
{
	watch_ctx *w = ud;
	size_t len = size * nmemb, off = 0;
	while (off < len && !w->done) {
		json_object *o = json_tokener_parse_ex(w->tok, data + off, (int)(len - off));
		enum json_tokener_error err = json_tokener_get_error(w->tok);
		if (err == json_tokener_continue)
			break;
		size_t used = json_tokener_get_parse_end(w->tok);
		if (err != json_tokener_success || !o) {
			json_tokener_reset(w->tok);
			w->done = 1;
			break;
		}
		dlock__etcd_watch_object(w, o);
		json_object_put(o);
		off += used ? used : len - off;
	}
	return w->done ? 0 : len; /* 0 ends the transfer: we have what we waited for */
}
