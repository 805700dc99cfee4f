/*
 * etcd store: etcd v3 through its JSON gateway (/v3/...), libcurl + json-c.
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
 * on one multi handle (keep-alive connections). wait runs concurrently on
 * handle pairs (watch + read) from a small pool; `mu` guards the pool, the
 * token, the current endpoint and the key slots.
 */
#include "support.h"
#include "etcd_parse.h"

#include <curl/curl.h>
#include <json-c/json.h>

#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KIND "etcd"
#define MAX_LEASES 16
#define POOL_MAX 4
/* etcd's default --max-txn-ops */
#define TXN_MAX_OPS 128
/* gRPC status codes the gateway returns in {"code": N} */
#define GRPC_DEADLINE_EXCEEDED 4
#define GRPC_NOT_FOUND 5
#define GRPC_PERMISSION_DENIED 7
#define GRPC_UNAVAILABLE 14
#define GRPC_UNAUTHENTICATED 16

typedef struct lease {
	int64_t ttl_s;       /* what we asked for; the table key */
	int64_t granted_s;   /* what etcd granted (it raises small TTLs) */
	int64_t id;
	int64_t alive_until; /* CLOCK_MONOTONIC ms: send time of the last grant/keepalive + TTL */
	int64_t touched;     /* CLOCK_MONOTONIC ms of that send */
	int pinned;          /* carries a key of another process (extend of an attached hold): never revoke */
	int retired;         /* carries an orphan (a key whose delete failed): never kept alive
				again nor given new keys; revoked once no live key of ours rides on it */
} lease;

/* Which key of a name an owner of this store handle uses. */
typedef struct hold {
	char *name;
	char owner[64];
	unsigned slot;
	int64_t lease; /* the lease its key rides on, once known */
	int64_t maybe; /* a lease a put of unknown outcome may have moved it to (0: none) */
	int orphan;    /* its delete failed: the key may still be there, nobody wants it */
} hold;

/* A waiter's pair of transfers, pooled: the watch stream and a read beside
 * it, on a multi handle whose connection cache keeps the read's connection. */
typedef struct waitkit {
	CURLM *multi;
	CURL *watch, *read;
} waitkit;

typedef struct etcd {
	dlock_backend base;
	char **urls;
	size_t nurls;
	dlock_hostport *hp;   /* urls[i]'s host and port (resolved before each request) */
	char *prefix;
	char *user, *password;
	char *cacert, *cert, *key;
	long connect_timeout_ms;
	long request_timeout_ms;

	pthread_mutex_t mu;
	size_t cur;           /* endpoint in use (failover moves it) */
	char *token;          /* auth token or NULL */
	unsigned token_gen;
	waitkit *pool[POOL_MAX];
	size_t npool;

	CURL *cmd;            /* under the store mutex */
	CURL *side;           /* a second request in flight next to cmd (keepalive during acquire) */
	CURLM *multi;         /* runs cmd and side: one connection cache for both */
	long op_timeout_ms;   /* per-attempt limit for cmd requests while renewing; 0: none */
	int64_t deadline;     /* CLOCK_MONOTONIC ms by which the current call (cmd, side) must end */
	lease leases[MAX_LEASES];
	size_t nleases;

	hold *holds;          /* key slots of our holds and waiters, under mu (wait reads them) */
	size_t nholds, capholds;
} etcd;

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

static json_object *jget(json_object *o, const char *k)
{
	json_object *v = NULL;
	if (o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, k, &v))
		return v;
	return NULL;
}

/* int64 fields come as JSON strings; absent means 0 (the gateway omits defaults). */
static int64_t jint(json_object *o, const char *k)
{
	json_object *v = jget(o, k);
	if (!v)
		return 0;
	if (json_object_is_type(v, json_type_string))
		return strtoll(json_object_get_string(v), NULL, 10);
	return json_object_get_int64(v);
}

static const char *jstr(json_object *o, const char *k)
{
	json_object *v = jget(o, k);
	return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int jbool(json_object *o, const char *k)
{
	json_object *v = jget(o, k);
	return v ? json_object_get_boolean(v) : 0;
}

static int jadd_b64(json_object *o, const char *k, const char *data, size_t len)
{
	char *b = dlock__etcd_b64_encode(data, len);
	if (!b)
		return dlock__oom();
	json_object_object_add(o, k, json_object_new_string(b));
	free(b);
	return 0;
}

static void jadd_i64(json_object *o, const char *k, int64_t v)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%" PRId64, v);
	json_object_object_add(o, k, json_object_new_string(buf));
}

/* ------------------------------------------------------------------ */
/* key names */

/* "<prefix>/<escaped name>/": escaping '/' keeps one name's directory from
 * containing another name's keys ("a/" must not match "a/b/<owner>"). */
static char *dir_of(const etcd *e, const char *name)
{
	size_t n = strlen(e->prefix) + 3 * strlen(name) + 3;
	char *d = malloc(n), *o = d;
	if (!d) {
		dlock__oom();
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
static char *prefix_enc(const char *prefix)
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
static char *range_end(const char *dir)
{
	char *end = dlock__strdup(dir);
	if (end)
		end[strlen(end) - 1]++;
	return end;
}

/* ------------------------------------------------------------------ */
/* HTTP */

/* A reply body: support.h's growable string, capped (a hostile member's
 * endless reply fails the transfer instead of growing without bound). */
typedef dlock__sbuf buf;
#define REPLY_MAX (64u << 20)

static size_t buf_write(char *data, size_t size, size_t nmemb, void *ud)
{
	size_t len = size * nmemb;
	return dlock__sb_put(ud, data, len) == 0 ? len : 0; /* 0: curl fails the transfer */
}

/* A peer that vanished (host down, link cut) fails the connection after
 * this long with data unacknowledged, or keepalive probes unanswered. */
static int sockopt(void *ud, curl_socket_t fd, curlsocktype purpose)
{
	etcd *e = ud;
	unsigned int ms = (unsigned int)e->connect_timeout_ms;
	if (purpose == CURLSOCKTYPE_IPCXN)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
	return CURL_SOCKOPT_OK;
}

static CURL *handle_new(etcd *e)
{
	CURL *h = curl_easy_init();
	if (!h)
		return NULL;
	long idle = e->connect_timeout_ms / 3000 > 1 ? e->connect_timeout_ms / 3000 : 1;
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, idle);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
	curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, sockopt);
	curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, e);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, e->connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	if (e->cacert)
		curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
	if (e->cert)
		curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
	if (e->key)
		curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
	return h;
}

static void kit_free(waitkit *k)
{
	if (!k)
		return;
	curl_multi_cleanup(k->multi);
	curl_easy_cleanup(k->watch);
	curl_easy_cleanup(k->read);
	free(k);
}

static waitkit *kit_take(etcd *e)
{
	waitkit *k = NULL;
	pthread_mutex_lock(&e->mu);
	if (e->npool)
		k = e->pool[--e->npool];
	pthread_mutex_unlock(&e->mu);
	if (k || !(k = calloc(1, sizeof(*k))))
		return k;
	if (!(k->multi = curl_multi_init()) || !(k->watch = handle_new(e)) || !(k->read = handle_new(e))) {
		kit_free(k);
		return NULL;
	}
	curl_multi_setopt(k->multi, CURLMOPT_MAXCONNECTS, 2L);
	return k;
}

static void kit_put(etcd *e, waitkit *k)
{
	pthread_mutex_lock(&e->mu);
	if (e->npool < POOL_MAX) {
		e->pool[e->npool++] = k;
		k = NULL;
	}
	pthread_mutex_unlock(&e->mu);
	kit_free(k);
}

/* Connection-level failures worth trying the next endpoint for. */
static int curl_failover(CURLcode c)
{
	switch (c) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
		return 1;
	default:
		return 0;
	}
}

/* Nothing left this host: safe to resend even a non-idempotent request. */
static int curl_not_sent(CURLcode c)
{
	return c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST;
}

static char *endpoint_url(etcd *e, size_t *idx, const char *path)
{
	pthread_mutex_lock(&e->mu);
	*idx = e->cur;
	char *url = dlock__sprintf("%s%s", e->urls[*idx], path);
	pthread_mutex_unlock(&e->mu);
	return url;
}

static void endpoint_failed(etcd *e, size_t idx)
{
	pthread_mutex_lock(&e->mu);
	if (e->cur == idx)
		e->cur = (idx + 1) % e->nurls;
	pthread_mutex_unlock(&e->mu);
}

/* One HTTP exchange being prepared, run and read. */
typedef struct xfer {
	CURL *h;
	char *url;
	struct curl_slist *hd;
	buf b;
	size_t idx;    /* endpoint */
	struct curl_slist *pin; /* CURLOPT_RESOLVE: the endpoint's name pinned to its addresses */
	bool unresolved; /* the endpoint's name did not resolve in time: try the next */
	unsigned gen;  /* token generation sent */
	CURLcode c;
	long status;
	int64_t until; /* its deadline */
} xfer;

static int timed_out(const char *what)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout", "%s: timed out (no time left to send it)",
			       what);
}

/*
 * libcurl's threaded resolver bounds a lookup by the transfer's timeout, but
 * removing a handle whose lookup still runs waits for it (Curl_resolver_kill
 * joins the thread). So the name is resolved here by the deadline (with
 * several endpoints by half the time left, leaving time for the next) and
 * pinned with CURLOPT_RESOLVE: curl connects to the addresses and keeps the
 * name for TLS (SNI, certificate check) and the Host header.
 */
static int pin_endpoint(etcd *e, xfer *x, CURL *h, int64_t until)
{
	const dlock_hostport *hp = &e->hp[x->idx];
	int64_t now = dlock_clock_ms();
	dlock__addrs ad;
	int rc = dlock__resolve(&ad, hp->host, e->nurls > 1 ? now + (until - now) / 2 : until, KIND);
	if (rc) {
		x->unresolved = rc == DLOCK_EUNAVAILABLE;
		if (x->unresolved)
			endpoint_failed(e, x->idx);
		return rc;
	}
	if (!ad.n || (ad.n == 1 && !strcmp(ad.addr[0], hp->host)))
		return 0; /* numeric: nothing to pin */
	char entry[300 + DLOCK__ADDRS_MAX * (DLOCK__ADDR_LEN + 3)];
	size_t len = (size_t)snprintf(entry, sizeof(entry), "%s:%d:", hp->host, hp->port);
	for (size_t i = 0; i < ad.n && len < sizeof(entry); i++) {
		bool v6 = strchr(ad.addr[i], ':') != NULL;
		len += (size_t)snprintf(entry + len, sizeof(entry) - len, "%s%s%s%s", i ? "," : "", v6 ? "[" : "",
					ad.addr[i], v6 ? "]" : "");
	}
	if (!(x->pin = curl_slist_append(NULL, entry)))
		return dlock__oom();
	curl_easy_setopt(h, CURLOPT_RESOLVE, x->pin);
	return 0;
}

/* Prepare one exchange that must end by `until` (CLOCK_MONOTONIC ms): curl's
 * limits are cut to the time left, and nothing is sent when none is left. */
static int xfer_start(etcd *e, xfer *x, CURL *h, const char *path, const char *text, int64_t until,
		      int with_token)
{
	int64_t left = until - dlock_clock_ms();
	memset(x, 0, sizeof(*x));
	if (left <= 0)
		return timed_out(path);
	x->h = h;
	x->url = endpoint_url(e, &x->idx, path);
	int rc = pin_endpoint(e, x, h, until);
	if (rc)
		return rc;
	x->hd = curl_slist_append(NULL, "Content-Type: application/json");
	if (x->hd)
		x->hd = curl_slist_append(x->hd, "Expect:");
	pthread_mutex_lock(&e->mu);
	x->gen = e->token_gen;
	if (x->hd && with_token && e->token) {
		char *line = dlock__sprintf("Authorization: %s", e->token);
		struct curl_slist *n = line ? curl_slist_append(x->hd, line) : NULL;
		free(line);
		if (!n) {
			curl_slist_free_all(x->hd);
			x->hd = NULL;
		}
	}
	pthread_mutex_unlock(&e->mu);
	if (!x->url || !x->hd)
		return dlock__oom();
	curl_easy_setopt(h, CURLOPT_URL, x->url);
	curl_easy_setopt(h, CURLOPT_POST, 1L);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, text);
	curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->hd);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
	x->b.limit = REPLY_MAX;
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &x->b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
			 (long)(left < e->connect_timeout_ms ? left : e->connect_timeout_ms));
	x->until = until;
	return 0;
}

static void xfer_end(xfer *x)
{
	if (x->h) {
		curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, NULL);
		curl_easy_setopt(x->h, CURLOPT_RESOLVE, NULL);
	}
	curl_slist_free_all(x->pin);
	curl_slist_free_all(x->hd);
	free(x->url);
	free(x->b.p);
	memset(x, 0, sizeof(*x));
}

/*
 * Run transfers. The command handles go through one multi handle so they
 * share its connection cache (keep-alive across both, and two requests can
 * be in flight at once); a waiter's pool handle runs on its own.
 */
static void run(etcd *e, xfer **xs, int n)
{
	if (n == 1 && xs[0]->h != e->cmd && xs[0]->h != e->side) {
		xs[0]->c = curl_easy_perform(xs[0]->h);
	} else {
		int left = n;
		for (int i = 0; i < n; i++) {
			xs[i]->c = CURLE_FAILED_INIT;
			if (curl_multi_add_handle(e->multi, xs[i]->h) != CURLM_OK)
				left--;
		}
		while (left > 0) {
			int running = 0, q;
			if (curl_multi_perform(e->multi, &running) != CURLM_OK)
				break;
			CURLMsg *m;
			while ((m = curl_multi_info_read(e->multi, &q))) {
				for (int i = 0; m->msg == CURLMSG_DONE && i < n; i++) {
					if (m->easy_handle == xs[i]->h) {
						xs[i]->c = m->data.result;
						left--;
					}
				}
			}
			if (left > 0 && curl_multi_poll(e->multi, NULL, 0, 1000, NULL) != CURLM_OK)
				break;
		}
		for (int i = 0; i < n; i++)
			curl_multi_remove_handle(e->multi, xs[i]->h);
	}
	for (int i = 0; i < n; i++)
		curl_easy_getinfo(xs[i]->h, CURLINFO_RESPONSE_CODE, &xs[i]->status);
}

typedef struct rpc_result {
	int grpc;      /* gRPC code of an error answer, else 0 */
	int ambiguous; /* an earlier attempt may have been applied */
} rpc_result;

enum { NEXT_DONE, NEXT_ENDPOINT, NEXT_REAUTH };

/* Read a finished transfer: 0 and *out, or an error (set) and what to do next. */
static int xfer_finish(etcd *e, xfer *x, json_object **out, rpc_result *res, int *next)
{
	*next = NEXT_DONE;
	*out = NULL;
	if (x->c != CURLE_OK) {
		/* curl closes a connection whose transfer it abandoned: a late
		 * answer cannot be read as the answer to a later request. */
		int rc = x->c == CURLE_OPERATION_TIMEDOUT
				 ? dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout", "%s: timed out", x->url)
				 : dlock_error_set(DLOCK_EUNAVAILABLE, KIND, curl_easy_strerror(x->c), "%s: %s",
						   x->url, curl_easy_strerror(x->c));
		if (curl_failover(x->c)) {
			if (!curl_not_sent(x->c))
				res->ambiguous = 1;
			endpoint_failed(e, x->idx);
			*next = NEXT_ENDPOINT;
		}
		return rc;
	}
	json_object *j = x->b.p ? json_tokener_parse(x->b.p) : NULL;
	if (x->status == 200 && j) {
		*out = j;
		return 0;
	}
	int grpc = (int)jint(j, "code"), rc;
	const char *msg = jstr(j, "message");
	char scode[32];
	snprintf(scode, sizeof(scode), "%d", grpc ? grpc : (int)x->status);
	res->grpc = grpc;
	if (grpc == GRPC_UNAUTHENTICATED && e->user)
		*next = NEXT_REAUTH;
	if (grpc == GRPC_UNAUTHENTICATED || grpc == GRPC_PERMISSION_DENIED ||
	    (msg && (strstr(msg, "authentication failed") || strstr(msg, "user name is empty") ||
		     strstr(msg, "permission denied")))) {
		rc = dlock_error_set(DLOCK_EAUTH, KIND, scode, "%s: %s", x->url, msg ? msg : "denied");
	} else if (x->status >= 500 || grpc == GRPC_UNAVAILABLE || grpc == GRPC_DEADLINE_EXCEEDED || !j) {
		/* A member without a leader (or timing out) may recover; another may answer now. */
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, scode, "%s: HTTP %ld: %s", x->url,
				     x->status, msg ? msg : "no JSON answer");
		res->ambiguous = 1;
		endpoint_failed(e, x->idx);
		*next = NEXT_ENDPOINT;
	} else {
		rc = dlock_error_set(DLOCK_ESTORE, KIND, scode, "%s: HTTP %ld: %s", x->url, x->status,
				     msg ? msg : "unexpected answer");
	}
	json_object_put(j);
	return rc;
}

/* The deadline of one attempt on h: the call's, cut to the per-attempt
 * limit while renewing (so a hung member leaves time for the next one). */
static int64_t attempt_until(etcd *e, CURL *h, int64_t until)
{
	if ((h == e->cmd || h == e->side) && e->op_timeout_ms > 0) {
		int64_t cap = dlock_clock_ms() + e->op_timeout_ms;
		return cap < until ? cap : until;
	}
	return until;
}

static int authenticate(etcd *e, CURL *h, unsigned seen_gen, int64_t until);

#define RPC_NO_TOKEN 1

/*
 * POST body to path on the current endpoint; on a connection failure (or a
 * member that cannot answer) try the next endpoints, each once, all by
 * `until`. A 401 "invalid auth token" re-authenticates and retries once.
 * Takes ownership of body; *out gets the answer object.
 */
static int rpc_ex(etcd *e, CURL *h, const char *path, json_object *body, json_object **out,
		  rpc_result *res, int64_t until, int flags)
{
	const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
	rpc_result dummy;
	int rc = DLOCK_EUNAVAILABLE, reauthed = 0;
	size_t tries = 0;
	if (!res)
		res = &dummy;
	memset(res, 0, sizeof(*res));
	*out = NULL;
	if (!h || !text) {
		json_object_put(body);
		return dlock__oom();
	}
	while (tries < e->nurls) {
		xfer x, *xs[1] = { &x };
		int next;
		if ((rc = xfer_start(e, &x, h, path, text, attempt_until(e, h, until),
				     !(flags & RPC_NO_TOKEN))) != 0) {
			bool next_ep = x.unresolved;
			xfer_end(&x);
			if (next_ep) { /* its name did not resolve: try the next endpoint */
				tries++;
				continue;
			}
			break;
		}
		run(e, xs, 1);
		rc = xfer_finish(e, &x, out, res, &next);
		unsigned gen = x.gen;
		xfer_end(&x);
		if (next == NEXT_ENDPOINT) {
			tries++;
			continue;
		}
		if (next == NEXT_REAUTH && !reauthed && !(flags & RPC_NO_TOKEN)) {
			reauthed = 1;
			if ((rc = authenticate(e, h, gen, until)) != 0)
				break;
			continue;
		}
		break;
	}
	json_object_put(body);
	return rc;
}

static int rpc_until(etcd *e, CURL *h, const char *path, json_object *body, json_object **out,
		     rpc_result *res, int64_t until)
{
	return rpc_ex(e, h, path, body, out, res, until, 0);
}

/* A request of the current call (under the store mutex): by e->deadline. */
static int rpc(etcd *e, CURL *h, const char *path, json_object *body, json_object **out,
	       rpc_result *res)
{
	return rpc_ex(e, h, path, body, out, res, e->deadline, 0);
}

/*
 * Two requests at once on the command handles (cmd and side), one attempt.
 * rc1 and rc2 get each one's outcome; a caller that needs one to succeed
 * repeats it with rpc(), which fails over and re-authenticates.
 */
static void rpc_pair(etcd *e, const char *path1, json_object *body1, json_object **out1, int *rc1,
		     rpc_result *res1, const char *path2, json_object *body2, json_object **out2,
		     int *rc2)
{
	const char *t1 = json_object_to_json_string_ext(body1, JSON_C_TO_STRING_PLAIN);
	const char *t2 = json_object_to_json_string_ext(body2, JSON_C_TO_STRING_PLAIN);
	xfer x1, x2, *xs[2] = { &x1, &x2 };
	rpc_result r2;
	int next;
	memset(res1, 0, sizeof(*res1));
	memset(&r2, 0, sizeof(r2));
	memset(&x1, 0, sizeof(x1));
	memset(&x2, 0, sizeof(x2));
	*out1 = *out2 = NULL;
	*rc1 = xfer_start(e, &x1, e->cmd, path1, t1 ? t1 : "", attempt_until(e, e->cmd, e->deadline), 1);
	*rc2 = *rc1 != 0 ? *rc1
			 : xfer_start(e, &x2, e->side, path2, t2 ? t2 : "",
				      attempt_until(e, e->side, e->deadline), 1);
	if (*rc1 == 0 && *rc2 == 0 && t1 && t2) {
		run(e, xs, 2);
		*rc1 = xfer_finish(e, &x1, out1, res1, &next);
		*rc2 = xfer_finish(e, &x2, out2, &r2, &next);
	} else if (*rc1 == 0 || *rc2 == 0 || !t1 || !t2) {
		*rc1 = *rc2 = dlock__oom();
	}
	xfer_end(&x1);
	xfer_end(&x2);
	json_object_put(body1);
	json_object_put(body2);
}

/* Get a token for user/password unless another thread already replaced token `seen_gen`. */
static int authenticate(etcd *e, CURL *h, unsigned seen_gen, int64_t until)
{
	pthread_mutex_lock(&e->mu);
	int fresh = e->token_gen != seen_gen;
	pthread_mutex_unlock(&e->mu);
	if (fresh)
		return 0;
	json_object *req = json_object_new_object(), *resp;
	json_object_object_add(req, "name", json_object_new_string(e->user));
	json_object_object_add(req, "password", json_object_new_string(e->password ? e->password : ""));
	int rc = rpc_ex(e, h, "/v3/auth/authenticate", req, &resp, NULL, until, RPC_NO_TOKEN);
	if (rc == DLOCK_ESTORE)
		rc = dlock_error_set(DLOCK_EAUTH, KIND, dlock_error_last()->store_code, "%s",
				     dlock_error_last()->message);
	if (rc != 0)
		return rc;
	const char *tok = jstr(resp, "token");
	if (!tok) {
		json_object_put(resp);
		return dlock_error_set(DLOCK_EAUTH, KIND, NULL,
				       "authenticate: no token in the answer (is auth enabled?)");
	}
	char *t = dlock__strdup(tok);
	json_object_put(resp);
	if (!t)
		return DLOCK_ENOMEM;
	pthread_mutex_lock(&e->mu);
	free(e->token);
	e->token = t;
	e->token_gen++;
	pthread_mutex_unlock(&e->mu);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Txn building and reading */

#define R_KEYS_ONLY 1
/* Served by the member we ask, without the leader: stale by a moment at most. */
#define R_SERIALIZABLE 2

static json_object *op_range(const char *key, const char *end, int by_create, int64_t limit,
			     int flags)
{
	json_object *r = json_object_new_object(), *op = json_object_new_object();
	if (jadd_b64(r, "key", key, strlen(key)) != 0 ||
	    (end && jadd_b64(r, "range_end", end, strlen(end)) != 0)) {
		json_object_put(r);
		json_object_put(op);
		return NULL;
	}
	if (by_create) {
		json_object_object_add(r, "sort_order", json_object_new_string("ASCEND"));
		json_object_object_add(r, "sort_target", json_object_new_string("CREATE"));
	}
	if (limit > 0)
		jadd_i64(r, "limit", limit);
	if (flags & R_KEYS_ONLY)
		json_object_object_add(r, "keys_only", json_object_new_boolean(1));
	if (flags & R_SERIALIZABLE)
		json_object_object_add(r, "serializable", json_object_new_boolean(1));
	json_object_object_add(op, "request_range", r);
	return op;
}

static json_object *op_put(const char *key, const char *value, int64_t lease_id, int ignore_value)
{
	json_object *r = json_object_new_object(), *op = json_object_new_object();
	if (jadd_b64(r, "key", key, strlen(key)) != 0 ||
	    (value && jadd_b64(r, "value", value, strlen(value)) != 0)) {
		json_object_put(r);
		json_object_put(op);
		return NULL;
	}
	jadd_i64(r, "lease", lease_id);
	if (ignore_value)
		json_object_object_add(r, "ignore_value", json_object_new_boolean(1));
	json_object_object_add(op, "request_put", r);
	return op;
}

static json_object *cmp_create(const char *key, const char *end, const char *result, int64_t rev)
{
	json_object *c = json_object_new_object();
	if (jadd_b64(c, "key", key, strlen(key)) != 0 ||
	    (end && jadd_b64(c, "range_end", end, strlen(end)) != 0)) {
		json_object_put(c);
		return NULL;
	}
	json_object_object_add(c, "target", json_object_new_string("CREATE"));
	json_object_object_add(c, "result", json_object_new_string(result));
	jadd_i64(c, "create_revision", rev);
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
	const char *k = jstr(j, "key"), *v = jstr(j, "value");
	out->create_rev = jint(j, "create_revision");
	out->lease = jint(j, "lease");
	out->permits = 1;
	if (k && !(out->key = dlock__etcd_b64_decode(k, NULL)))
		return dlock__oom();
	if (v) {
		char *text = dlock__etcd_b64_decode(v, NULL);
		json_object *val = text ? json_tokener_parse(text) : NULL;
		free(text);
		if (val) {
			const char *s;
			if ((s = jstr(val, "owner")))
				out->owner = dlock__strdup(s);
			if ((s = jstr(val, "host")))
				out->host = dlock__strdup(s);
			out->pid = (int)jint(val, "pid");
			s = jstr(val, "mode");
			out->mode = s && strcmp(s, "shared") == 0 ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
			int64_t p = jint(val, "permits");
			out->permits = p > 0 && p < 1000000 ? (unsigned)p : 1;
			json_object_put(val);
		}
	}
	return 0;
}

/* The kvs of responses[i] (a response_range) of a Txn answer. */
int dlock__etcd_txn_range(json_object *txn, size_t i, kv **out, size_t *n)
{
	json_object *resps = jget(txn, "responses");
	json_object *r = resps && json_object_is_type(resps, json_type_array) &&
				 i < json_object_array_length(resps)
			 ? jget(json_object_array_get_idx(resps, i), "response_range")
			 : NULL;
	json_object *arr = jget(r, "kvs");
	size_t cnt = arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
	*out = NULL;
	*n = 0;
	if (!r)
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "txn answer without response %zu", i);
	if (!cnt)
		return 0;
	kv *k = calloc(cnt, sizeof(kv));
	if (!k)
		return dlock__oom();
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

static int txn(etcd *e, CURL *h, json_object *compare, json_object *success, json_object *failure,
	       json_object **out, rpc_result *res)
{
	json_object *body = json_object_new_object();
	json_object_object_add(body, "compare", compare ? compare : json_object_new_array());
	json_object_object_add(body, "success", success ? success : json_object_new_array());
	json_object_object_add(body, "failure", failure ? failure : json_object_new_array());
	return rpc(e, h, "/v3/kv/txn", body, out, res);
}

static int delete_key(etcd *e, CURL *h, const char *key, int64_t *deleted, rpc_result *res)
{
	json_object *body = json_object_new_object(), *resp;
	if (jadd_b64(body, "key", key, strlen(key)) != 0) {
		json_object_put(body);
		return DLOCK_ENOMEM;
	}
	int rc = rpc(e, h, "/v3/kv/deleterange", body, &resp, res);
	if (rc == 0) {
		if (deleted)
			*deleted = jint(resp, "deleted");
		json_object_put(resp);
	}
	return rc;
}

/* ------------------------------------------------------------------ */
/* leases (under the store mutex) */

static int64_t ttl_secs(int64_t ttl_ms)
{
	int64_t s = (ttl_ms + 999) / 1000;
	return s < 1 ? 1 : s;
}

static void lease_drop(etcd *e, int64_t id)
{
	for (size_t i = 0; i < e->nleases; i++) {
		if (e->leases[i].id == id) {
			e->leases[i] = e->leases[--e->nleases];
			return;
		}
	}
}

static lease *lease_find_id(etcd *e, int64_t id)
{
	for (size_t i = 0; i < e->nleases; i++)
		if (e->leases[i].id == id)
			return &e->leases[i];
	return NULL;
}

static json_object *keepalive_body(int64_t id)
{
	json_object *body = json_object_new_object();
	jadd_i64(body, "ID", id);
	return body;
}

/* Read a keepalive answer (consumed) for lease `id` sent at `sent`. */
static int keepalive_read(etcd *e, int64_t id, json_object *resp, int64_t sent, int64_t *ttl_s)
{
	int rc = 0;
	json_object *r = jget(resp, "result");
	*ttl_s = r ? jint(r, "TTL") : 0;
	if (!r && jget(resp, "error"))
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "keepalive: %s",
				     jstr(resp, "error") ? jstr(resp, "error") : "error");
	json_object_put(resp);
	if (rc != 0)
		return rc;
	lease *l = lease_find_id(e, id);
	if (l) {
		if (*ttl_s > 0) {
			l->alive_until = sent + *ttl_s * 1000;
			l->touched = sent;
		} else {
			lease_drop(e, id);
		}
	}
	return 0;
}

/*
 * Keep lease `id` alive now. *ttl_s gets what etcd says is left (0: the
 * lease is gone, its keys deleted). The gateway answers a keepalive of an
 * unknown lease with a result without TTL, not an error.
 */
static int keepalive(etcd *e, int64_t id, int64_t *ttl_s)
{
	json_object *resp;
	int64_t sent = dlock_clock_ms();
	lease *l = lease_find_id(e, id);
	if (l && l->retired)
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
				       "lease %llx carries a key whose delete failed: not kept alive",
				       (long long)id);
	int rc = rpc(e, e->cmd, "/v3/lease/keepalive", keepalive_body(id), &resp, NULL);
	if (rc != 0)
		return rc;
	return keepalive_read(e, id, resp, sent, ttl_s);
}

/* The lease for ttl_ms, granted on first use. */
static int lease_get(etcd *e, int64_t ttl_ms, lease **out)
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
	jadd_i64(body, "TTL", s);
	int rc = rpc(e, e->cmd, "/v3/lease/grant", body, &resp, NULL);
	if (rc != 0)
		return rc;
	int64_t id = jint(resp, "ID"), granted = jint(resp, "TTL");
	const char *err = jstr(resp, "error");
	json_object_put(resp);
	if (id == 0 || granted <= 0)
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "lease grant: %s",
				       err ? err : "no lease in the answer");
	if (e->nleases == MAX_LEASES) {
		/* Too many distinct TTLs: forget the least recently kept one (etcd
		 * still expires it). A retired one is kept until it is revoked. */
		size_t old = MAX_LEASES;
		for (size_t i = 0; i < e->nleases; i++)
			if (!e->leases[i].retired && (old == MAX_LEASES || e->leases[i].touched < e->leases[old].touched))
				old = i;
		if (old == MAX_LEASES)
			return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
					       "too many leases waiting to be revoked");
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

/* ------------------------------------------------------------------ */
/* the lock protocol */

typedef struct keyset {
	char *dir, *end, *key; /* key NULL: not a hold of this store handle (see find_by_owner) */
} keyset;

static void names_free(keyset *n)
{
	free(n->dir);
	free(n->end);
	free(n->key);
	memset(n, 0, sizeof(*n));
}

static hold *hold_find(etcd *e, const char *name, const char *owner)
{
	for (size_t i = 0; i < e->nholds; i++)
		if (strcmp(e->holds[i].owner, owner) == 0 && strcmp(e->holds[i].name, name) == 0)
			return &e->holds[i];
	return NULL;
}

/* The key of req now rides on lease_id (known from an answer). */
static void hold_set_lease(etcd *e, const dlock_request *req, int64_t lease_id)
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
static void hold_set_maybe(etcd *e, const dlock_request *req, int64_t lease_id)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h && h->lease != lease_id)
		h->maybe = lease_id;
	pthread_mutex_unlock(&e->mu);
}

static void lease_retire(etcd *e, int64_t id)
{
	lease *l = id ? lease_find_id(e, id) : NULL;
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
static void hold_orphan(etcd *e, const dlock_request *req)
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
static void hold_forget(etcd *e, const dlock_request *req)
{
	pthread_mutex_lock(&e->mu);
	hold *h = hold_find(e, req->name, req->owner);
	if (h) {
		free(h->name);
		*h = e->holds[--e->nholds];
	}
	pthread_mutex_unlock(&e->mu);
}

enum { MK_LOOKUP, MK_CREATE };

/*
 * The directory of req->name and, for a hold or waiter of this store handle,
 * its key "<dir><client id>-<slot>". The slot is the lowest one no other
 * owner of this handle uses on that name, so a handle that takes one lock
 * again and again reuses one key: etcd keeps one index entry per distinct
 * key until compaction and a range over the directory walks all of them, so
 * a key per acquire would slow every later acquire of a hot name.
 */
static int names_make(etcd *e, const dlock_request *req, keyset *n, int how)
{
	const char *dash = strrchr(req->owner, '-');
	int len = dash ? (int)(dash - req->owner) : (int)strlen(req->owner);
	int rc = 0;
	memset(n, 0, sizeof(*n));
	if (!(n->dir = dir_of(e, req->name)) || !(n->end = range_end(n->dir))) {
		names_free(n);
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
		char *name = e->nholds < e->capholds ? dlock__strdup(req->name) : NULL;
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
	if (h && !(n->key = dlock__sprintf("%s%.*s-%u", n->dir, len, req->owner, h->slot)))
		rc = DLOCK_ENOMEM;
	pthread_mutex_unlock(&e->mu);
	if (rc != 0)
		names_free(n);
	return rc;
}

/*
 * A hold this store handle does not know (attached from another process):
 * find its key by the owner in the values. *create_rev gets its revision.
 * @return 0 and n->key set; DLOCK_ENOTHELD.
 */
static int find_by_owner(etcd *e, const dlock_request *req, keyset *n, int64_t *create_rev)
{
	json_object *ok = json_object_new_array(), *resp;
	kv *keys = NULL;
	size_t nk = 0;
	int rc;
	json_object_array_add(ok, op_range(n->dir, n->end, 1, 0, 0));
	if ((rc = txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
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

/* The key of a hold entry (see names_make). */
static char *hold_key(etcd *e, const hold *h)
{
	const char *dash = strrchr(h->owner, '-');
	int len = dash ? (int)(dash - h->owner) : (int)strlen(h->owner);
	char *dir = dir_of(e, h->name);
	char *key = dir ? dlock__sprintf("%s%.*s-%u", dir, len, h->owner, h->slot) : NULL;
	free(dir);
	return key;
}

/*
 * Put `key`, if it exists, on lease `to`: a Put with ignore_value keeps the
 * create revision (fence, place in line) and the value; the compare makes
 * sure nothing is created. *moved: 1 moved, 0 the key is gone.
 */
static int move_key(etcd *e, const char *key, int64_t to, int *moved)
{
	json_object *cmp = json_object_new_array(), *ok = json_object_new_array(), *resp;
	json_object_array_add(cmp, cmp_create(key, NULL, "GREATER", 0));
	json_object_array_add(ok, op_put(key, NULL, to, 1));
	int rc = txn(e, e->cmd, cmp, ok, NULL, &resp, NULL);
	if (rc == 0) {
		*moved = jbool(resp, "succeeded");
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
static int rescue(etcd *e)
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
			int r = key ? lease_get(e, old.ttl_s * 1000, &to) : DLOCK_ENOMEM;
			/* The hold's deadline in the core may rest on the old lease's last
			 * keepalive: the new lease must last at least as long. */
			if (r == 0 && to->alive_until < old.alive_until) {
				int64_t left = 0;
				int64_t id = to->id;
				if ((r = keepalive(e, id, &left)) == 0 && left <= 0) {
					lease_drop(e, id);
					r = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "lease %llx ended",
							    (long long)id);
				}
				if (r == 0)
					to = lease_find_id(e, id);
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
			/* lease_get/keepalive may have changed the table: find `old` again. */
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
		jadd_i64(body, "ID", old.id);
		int r = rpc(e, e->cmd, "/v3/lease/revoke", body, &resp, &res);
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
static int holds(const kv *keys, size_t n, const kv *me, dlock_mode mode, unsigned permits,
		 const kv **watch)
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
	char *s = dlock__strdup(json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
	json_object_put(v);
	return s;
}

/* Delete req's key (an undo, a release): forget it, or, when that fails, orphan it. */
static int drop_key(etcd *e, const dlock_request *req, const char *key, int64_t *deleted,
		    rpc_result *res)
{
	int rc = delete_key(e, e->cmd, key, deleted, res);
	if (rc == 0)
		hold_forget(e, req);
	else
		hold_orphan(e, req);
	return rc;
}

/* Set the deadline of a call (under the store mutex). */
static void call_begin(etcd *e, int64_t deadline)
{
	e->deadline = deadline > 0 ? deadline : dlock_clock_ms() + e->request_timeout_ms;
}

static int lease_retired(etcd *e, int64_t id)
{
	lease *l = lease_find_id(e, id);
	return l && l->retired;
}

/* req->slot marks "our key was queued by an earlier try of this acquire":
 * the next try reads instead of writing. Only a hint: the read checks. */
#define QUEUED(e) ((void *)(e))

static int etcd_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	etcd *e = (etcd *)be;
	int64_t t0 = dlock_clock_ms();
	unsigned permits = req->permits;
	int shared = req->mode == DLOCK_SHARED;
	/* Readers need every older key to see writers; a semaphore needs its N oldest. */
	int64_t limit = shared ? 0 : permits;
	/* A try-once mutex asks "is the directory empty?" instead of queueing and unqueueing. */
	int try_empty = !req->waiting && !shared && permits == 1;
	int queued = req->slot == QUEUED(e), was_queued = queued;
	keyset nm;
	char *value = NULL;
	int rc = names_make(e, req, &nm, MK_CREATE);
	(void)retry_ms;
	if (rc != 0)
		return rc;
	if (!(value = value_json(req))) {
		names_free(&nm);
		return DLOCK_ENOMEM;
	}
	/* A waiting try with too little time left sends nothing (see "Time" in
	 * sys/backend.h); a queued waiter stays queued: the core cancels. */
	if (dlock_try_too_late(req, e->request_timeout_ms)) {
		free(value);
		names_free(&nm);
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "%s is held", req->name);
	}
	req->slot = NULL;
	call_begin(e, req->deadline_ms);
	rescue(e);
	for (int attempt = 0; attempt < 4; attempt++) {
		lease *l;
		json_object *resp = NULL, *ka_resp = NULL;
		kv *mine = NULL, *keys = NULL;
		size_t nmine = 0, nkeys = 0;
		rpc_result res;
		if ((rc = lease_get(e, req->ttl_ms, &l)) != 0)
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
			json_object_array_add(ok, op_range(nm.key, NULL, 0, 0, R_SERIALIZABLE));
			json_object_array_add(ok, op_range(nm.dir, nm.end, 1, limit, R_SERIALIZABLE));
		} else {
			hold_set_maybe(e, req, lease_id);
			json_object_array_add(cmp, try_empty ? cmp_create(nm.dir, nm.end, "EQUAL", 0)
							     : cmp_create(nm.key, NULL, "EQUAL", 0));
			/* Created now: our create revision is the put's revision. */
			json_object_array_add(ok, op_put(nm.key, value, lease_id, 0));
			json_object_array_add(ok, op_range(nm.dir, nm.end, 1, limit, 0));
			json_object_array_add(ko, op_range(nm.key, NULL, 0, 0, 0));
			json_object_array_add(ko, op_range(nm.dir, nm.end, 1, limit, 0));
		}
		json_object_object_add(body, "compare", cmp);
		json_object_object_add(body, "success", ok);
		json_object_object_add(body, "failure", ko);
		/* The core counts the lease from t0. A shared lease last kept alive
		 * before t0 would end earlier than it thinks, so keep it alive now, in
		 * parallel with the Txn (a second connection): no extra round trip. */
		int need_ka = l->alive_until < t0 + req->ttl_ms;
		int64_t ka_left = -1, ka_sent = dlock_clock_ms();
		if (need_ka) {
			int ka_rc;
			json_object_get(body);
			rpc_pair(e, "/v3/kv/txn", body, &resp, &rc, &res, "/v3/lease/keepalive",
				 keepalive_body(lease_id), &ka_resp, &ka_rc);
			if (ka_rc == 0 && keepalive_read(e, lease_id, ka_resp, ka_sent, &ka_left) != 0)
				ka_left = -1;
			/* One attempt only: fail over or re-authenticate through rpc(). The
			 * Txn may be repeated safely: its compare makes the write happen once. */
			if (rc != 0 && res.grpc != GRPC_NOT_FOUND &&
			    (rc == DLOCK_EUNAVAILABLE || res.grpc == GRPC_UNAUTHENTICATED))
				rc = rpc(e, e->cmd, "/v3/kv/txn", body, &resp, &res);
			else
				json_object_put(body);
		} else {
			rc = rpc(e, e->cmd, "/v3/kv/txn", body, &resp, &res);
		}
		if (rc != 0) {
			if (res.grpc == GRPC_NOT_FOUND) {
				/* "requested lease not found": it expired (we were paused, or
				 * cut off longer than its TTL). Start again on a new lease:
				 * our old queue position went with it. */
				lease_drop(e, lease_id);
				queued = 0;
				continue;
			}
			break;
		}
		if (jbool(resp, "succeeded") && !queued) {
			json_object *rs = jget(resp, "responses");
			json_object *put = rs && json_object_is_type(rs, json_type_array)
						   ? jget(json_object_array_get_idx(rs, 0), "response_put")
						   : NULL;
			int64_t prev = jint(jget(put, "header"), "revision");
			if (prev <= 0) {
				rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "txn answer without put revision");
			} else if (!(mine = calloc(1, sizeof(kv)))) {
				rc = dlock__oom();
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
		int granted = holds(keys, nkeys, &mine[0], req->mode, permits, NULL);
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
			lease *kl = lease_find_id(e, key_lease);
			int64_t left;
			if (key_lease == lease_id && ka_left >= 0) {
				left = ka_left; /* the parallel keepalive covered it */
			} else if (kl && kl->alive_until >= t0 + req->ttl_ms) {
				left = kl->granted_s; /* granted or kept alive after t0 */
			} else if ((rc = keepalive(e, key_lease, &left)) != 0) {
				/* Unsure whether the lease lives: do not claim the lock. */
				dlock__saved_error saved;
				dlock__error_save(&saved);
				drop_key(e, req, nm.key, NULL, NULL);
				dlock__error_restore(&saved);
				break;
			}
			if (left <= 0) {
				lease_drop(e, key_lease);
				queued = 0;
				continue;
			}
			if (dlock_clock_ms() - t0 >= req->ttl_ms - dlock__drift_ms(req->ttl_ms)) {
				/* We were paused (or the answers were that slow) past the lease
				 * the core would count from t0: no grant. A waiter tries again
				 * at once and gets a fresh deadline; a try-once gives up. */
				if (req->waiting) {
					req->slot = QUEUED(e);
					rc = DLOCK_ELOCKED;
				} else {
					drop_key(e, req, nm.key, NULL, NULL);
					rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
							     "%s: the grant came after the lease would have ended",
							     req->name);
				}
				break;
			}
			*fence = rev;
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
		lease *kl = lease_find_id(e, key_lease);
		if (ka_left < 0 && kl && dlock_clock_ms() - kl->touched > kl->granted_s * 1000 / 3) {
			int64_t left = 0;
			if (keepalive(e, key_lease, &left) == 0 && left <= 0) {
				lease_drop(e, key_lease);
				queued = 0;
				continue;
			}
		}
		req->slot = QUEUED(e);
		rc = DLOCK_ELOCKED;
		break;
	}
	if (rc != 0 && rc != DLOCK_ELOCKED && !was_queued) {
		/* The core only cancels waiters it saw queued: a failed first try may
		 * still have created our key, so take it back (best effort, within
		 * this call's deadline; keep the error). If that fails too, the key
		 * is an orphan: its lease is retired so it cannot outlive its TTL. */
		dlock__saved_error saved;
		dlock__error_save(&saved);
		drop_key(e, req, nm.key, NULL, NULL);
		dlock__error_restore(&saved);
	}
	free(value);
	names_free(&nm);
	if (rc == DLOCK_ELOCKED)
		dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "%s is held", req->name);
	return rc;
}

static int etcd_release(dlock_backend *be, dlock_request *req)
{
	etcd *e = (etcd *)be;
	keyset nm;
	int64_t deleted = 0, rev = 0;
	rpc_result res;
	int rc = names_make(e, req, &nm, MK_LOOKUP);
	memset(&res, 0, sizeof(res));
	if (rc != 0)
		return rc;
	call_begin(e, req->deadline_ms);
	if (nm.key) {
		rc = drop_key(e, req, nm.key, &deleted, &res);
	} else if ((rc = find_by_owner(e, req, &nm, &rev)) == 0) {
		/* Attached from another process: delete that key only if it is still the one we found. */
		json_object *cmp = json_object_new_array(), *ok = json_object_new_array(), *resp;
		json_object *del = json_object_new_object(), *op = json_object_new_object();
		json_object_array_add(cmp, cmp_create(nm.key, NULL, "EQUAL", rev));
		jadd_b64(del, "key", nm.key, strlen(nm.key));
		json_object_object_add(op, "request_delete_range", del);
		json_object_array_add(ok, op);
		if ((rc = txn(e, e->cmd, cmp, ok, NULL, &resp, &res)) == 0) {
			deleted = jbool(resp, "succeeded");
			json_object_put(resp);
		}
	}
	names_free(&nm);
	if (rc != 0)
		return rc;
	/* After an attempt that may have been applied, "nothing to delete" means ours went. */
	if (deleted == 0 && !res.ambiguous)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name,
				       req->owner);
	return 0;
}

static int etcd_cancel(dlock_backend *be, dlock_request *req)
{
	etcd *e = (etcd *)be;
	keyset nm;
	int rc = names_make(e, req, &nm, MK_LOOKUP);
	req->slot = NULL;
	if (rc != 0 || !nm.key) {
		names_free(&nm);
		return rc;
	}
	call_begin(e, req->deadline_ms);
	rc = drop_key(e, req, nm.key, NULL, NULL);
	names_free(&nm);
	return rc;
}

static int etcd_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	etcd *e = (etcd *)be;
	int64_t t0 = dlock_clock_ms();
	keyset nm;
	lease *l;
	json_object *resp;
	kv *mine = NULL;
	size_t nmine = 0;
	int64_t rev;
	int rc = names_make(e, req, &nm, MK_LOOKUP);
	if (rc != 0)
		return rc;
	call_begin(e, req->deadline_ms);
	rescue(e);
	if (!nm.key && (rc = find_by_owner(e, req, &nm, &rev)) != 0)
		goto out;
	if ((rc = lease_get(e, ttl_ms, &l)) != 0)
		goto out;
	int64_t lease_id = l->id;
	json_object *ok = json_object_new_array();
	json_object_array_add(ok, op_range(nm.key, NULL, 0, 0, 1));
	if ((rc = txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
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
		json_object_array_add(cmp, cmp_create(nm.key, NULL, "EQUAL", mine[0].create_rev));
		json_object_array_add(put, op_put(nm.key, NULL, lease_id, 1));
		rpc_result res;
		int foreign = lease_find_id(e, mine[0].lease) == NULL;
		if ((rc = txn(e, e->cmd, cmp, put, NULL, &resp, &res)) != 0) {
			if (res.grpc == GRPC_NOT_FOUND) /* our lease expired meanwhile */
				lease_drop(e, lease_id);
			goto out;
		}
		int moved = jbool(resp, "succeeded");
		json_object_put(resp);
		if (!moved) {
			rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: not held by %s", req->name,
					     req->owner);
			goto out;
		}
		lease *own = lease_find_id(e, lease_id);
		if (own && foreign)
			own->pinned = 1;
		hold_set_lease(e, req, lease_id);
	}
	l = lease_find_id(e, lease_id);
	if (!l || l->alive_until < t0 + ttl_ms) {
		int64_t left = 0;
		if ((rc = keepalive(e, lease_id, &left)) != 0)
			goto out;
		if (left <= 0)
			rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "%s: lease expired", req->name);
	}
out:
	dlock__etcd_kvs_free(mine, nmine);
	names_free(&nm);
	return rc;
}

static int etcd_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	etcd *e = (etcd *)be;
	int64_t *leases = calloc(n ? n : 1, sizeof(int64_t));
	int rc = 0;
	if (!leases)
		return dlock__oom();
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
	call_begin(e, deadline == INT64_MAX ? 0 : deadline);
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
	for (size_t from = 0; from < n && rc == 0; from += TXN_MAX_OPS) {
		size_t cnt = n - from < TXN_MAX_OPS ? n - from : TXN_MAX_OPS;
		json_object *ok = json_object_new_array(), *resp;
		for (size_t i = 0; i < cnt; i++) {
			keyset nm;
			if ((rc = names_make(e, reqs[from + i], &nm, MK_LOOKUP)) != 0)
				break;
			/* Not ours (never is, for a renewed hold): the bare directory name,
			 * which is never a key, reads as "gone". */
			json_object_array_add(ok, op_range(nm.key ? nm.key : nm.dir, NULL, 0, 0,
							   R_KEYS_ONLY | R_SERIALIZABLE));
			names_free(&nm);
		}
		if (rc != 0) {
			json_object_put(ok);
			break;
		}
		json_object *body = json_object_new_object();
		json_object_object_add(body, "compare", json_object_new_array());
		json_object_object_add(body, "success", ok);
		json_object_object_add(body, "failure", json_object_new_array());
		if (from == 0 && ka_id) {
			json_object *ka_resp = NULL;
			rpc_result res;
			int ka_rc;
			int64_t sent = dlock_clock_ms();
			json_object_get(body);
			rpc_pair(e, "/v3/kv/txn", body, &resp, &rc, &res, "/v3/lease/keepalive",
				 keepalive_body(ka_id), &ka_resp, &ka_rc);
			if (ka_rc != 0 || keepalive_read(e, ka_id, ka_resp, sent, &ka_left) != 0)
				ka_left = -1;
			/* One attempt only: fail over or re-authenticate through rpc(). */
			if (rc != 0 && (rc == DLOCK_EUNAVAILABLE || res.grpc == GRPC_UNAUTHENTICATED))
				rc = rpc(e, e->cmd, "/v3/kv/txn", body, &resp, NULL);
			else
				json_object_put(body);
		} else {
			rc = rpc(e, e->cmd, "/v3/kv/txn", body, &resp, NULL);
		}
		if (rc != 0)
			break;
		for (size_t i = 0; i < cnt && rc == 0; i++) {
			kv *k;
			size_t nk;
			if ((rc = dlock__etcd_txn_range(resp, i, &k, &nk)) != 0)
				break;
			leases[from + i] = nk ? k[0].lease : 0;
			dlock__etcd_kvs_free(k, nk);
		}
		json_object_put(resp);
	}
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
		int krc = leases[i] == ka_id && ka_left >= 0 ? (left = ka_left, 0) : keepalive(e, leases[i], &left);
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

/* ------------------------------------------------------------------ */
/* wait: watch the key we queue behind */

void dlock__etcd_watch_object(watch_ctx *w, json_object *o)
{
	json_object *r = jget(o, "result");
	if (!r) {
		w->done = 1; /* {"error": ...} */
		return;
	}
	if (jbool(r, "created")) {
		w->created = 1;
		w->rev = jint(jget(r, "header"), "revision");
	}
	/* Cancelled (e.g. compacted past our start revision): re-read instead. */
	if (jbool(r, "canceled") || jint(r, "compact_revision") > 0)
		w->done = 1;
	json_object *ev = jget(r, "events");
	size_t n = ev && json_object_is_type(ev, json_type_array) ? json_object_array_length(ev) : 0;
	for (size_t i = 0; i < n; i++) {
		const char *type = jstr(json_object_array_get_idx(ev, i), "type");
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

/*
 * Read our key and the queue of nm, from the member we ask alone
 * (serializable), on h. While we wait in line: 1, *rev the revision read and
 * *target the key to watch (malloc'd; NULL: the whole directory). Nothing to
 * wait for (we hold, our key is gone) or the read failed: 0, and acquire
 * finds out which.
 */
static int wait_read(etcd *e, CURL *h, const keyset *nm, const dlock_request *req, int64_t until,
		     int64_t *rev, char **target)
{
	json_object *ok = json_object_new_array(), *body = json_object_new_object(), *resp = NULL;
	kv *mine = NULL, *keys = NULL;
	size_t nmine = 0, nkeys = 0;
	const kv *behind = NULL;
	unsigned permits = req->permits;
	int waiting = 0;
	*target = NULL;
	json_object_array_add(ok, op_range(nm->key, NULL, 0, 0, R_SERIALIZABLE));
	json_object_array_add(ok, op_range(nm->dir, nm->end, 1, 0, R_SERIALIZABLE));
	json_object_object_add(body, "compare", json_object_new_array());
	json_object_object_add(body, "success", ok);
	json_object_object_add(body, "failure", json_object_new_array());
	if (rpc_until(e, h, "/v3/kv/txn", body, &resp, NULL, until) != 0)
		return 0;
	*rev = jint(jget(resp, "header"), "revision");
	if (dlock__etcd_txn_range(resp, 0, &mine, &nmine) == 0 &&
	    dlock__etcd_txn_range(resp, 1, &keys, &nkeys) == 0 && nmine &&
	    !holds(keys, nkeys, &mine[0], req->mode, permits, &behind))
		waiting = !behind || !behind->key || (*target = dlock__strdup(behind->key)) != NULL;
	json_object_put(resp);
	dlock__etcd_kvs_free(mine, nmine);
	dlock__etcd_kvs_free(keys, nkeys);
	return waiting;
}

/* Open a watch of key (or [key, end)) for deletes from now on, on w's stream. */
static int watch_start(etcd *e, waitkit *k, xfer *x, watch_ctx *w, const char *key, const char *end,
		       int64_t until)
{
	json_object *cr = json_object_new_object(), *body = json_object_new_object(),
		    *filters = json_object_new_array();
	int rc = DLOCK_ENOMEM;
	memset(x, 0, sizeof(*x));
	if (jadd_b64(cr, "key", key, strlen(key)) != 0 ||
	    (end && jadd_b64(cr, "range_end", end, strlen(end)) != 0)) {
		json_object_put(cr);
		json_object_put(filters);
		goto out;
	}
	json_object_array_add(filters, json_object_new_string("NOPUT"));
	json_object_object_add(cr, "filters", filters);
	json_object_object_add(body, "create_request", cr);
	const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
	/* body goes before the transfer runs: libcurl keeps a copy. */
	if (!text || xfer_start(e, x, k->watch, "/v3/watch", text, until, 1) != 0)
		goto out;
	curl_easy_setopt(k->watch, CURLOPT_COPYPOSTFIELDS, text);
	curl_easy_setopt(k->watch, CURLOPT_WRITEFUNCTION, dlock__etcd_watch_write);
	curl_easy_setopt(k->watch, CURLOPT_WRITEDATA, w);
	rc = curl_multi_add_handle(k->multi, k->watch) == CURLM_OK ? 0 : dlock__oom();
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
static int etcd_wait(dlock_backend *be, dlock_request *req, int64_t timeout_ms)
{
	etcd *e = (etcd *)be;
	int64_t start = dlock_clock_ms();
	/* Come back within a third of the lease so acquire can keep our queue key alive. */
	int64_t cap = req->ttl_ms / 3 > 100 ? req->ttl_ms / 3 : 100;
	if (timeout_ms < 0 || timeout_ms > cap)
		timeout_ms = cap;
	keyset nm;
	if (names_make(e, req, &nm, MK_LOOKUP) != 0 || !nm.key) {
		names_free(&nm);
		return 0;
	}
	waitkit *k = kit_take(e);
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
			if (w.rev > rev && (!wait_read(e, k->read, &nm, req, until, &rev2, &again) ||
					    rev2 < w.rev || (target && (!again || strcmp(again, target) != 0)) ||
					    (!target && again)))
				break;
			continue;
		}
		if (!w.done && curl_multi_poll(k->multi, NULL, 0, (int)(left < 1000 ? left : 1000), NULL) != CURLM_OK)
			break;
	}
	curl_multi_remove_handle(k->multi, k->watch);
	/* A timeout is the normal end of a wait; only a broken connection moves us on. */
	if (x.c != CURLE_OK && x.c != CURLE_WRITE_ERROR && x.c != CURLE_OPERATION_TIMEDOUT && curl_failover(x.c))
		endpoint_failed(e, x.idx);
out:
	xfer_end(&x);
	if (w.tok)
		json_tokener_free(w.tok);
	free(target);
	free(again);
	names_free(&nm);
	if (k)
		kit_put(e, k);
	return 0;
}

/* ------------------------------------------------------------------ */
/* status */

static int fill_status(etcd *e, dlock_lock_status *st, kv *keys, size_t n)
{
	uint64_t last = 0;
	st->permits = n ? keys[0].permits : 1;
	for (size_t i = 0; i < n; i++) {
		if (!holds(keys, n, &keys[i], keys[i].mode, keys[i].permits, NULL)) {
			st->waiters++;
			continue;
		}
		dlock_holder *h = dlock__status_add_holder(st);
		if (!h)
			return DLOCK_ENOMEM;
		h->owner = dlock__strdup(keys[i].owner ? keys[i].owner : "");
		h->host = dlock__strdup(keys[i].host ? keys[i].host : "");
		if (!h->owner || !h->host)
			return DLOCK_ENOMEM;
		h->pid = keys[i].pid;
		h->mode = keys[i].mode;
		h->fence = (uint64_t)keys[i].create_rev;
		h->ttl_left_ms = -1;
		if (h->fence > last)
			last = h->fence;
		json_object *body = json_object_new_object(), *resp;
		jadd_i64(body, "ID", keys[i].lease);
		if (rpc(e, e->cmd, "/v3/lease/timetolive", body, &resp, NULL) == 0) {
			int64_t ttl = jint(resp, "TTL");
			h->ttl_left_ms = ttl > 0 ? ttl * 1000 : 0;
			json_object_put(resp);
		}
	}
	st->last_fence = last;
	return 0;
}

static int etcd_status(dlock_backend *be, const char *const *names, size_t nnames,
		       dlock_lock_status **out, size_t *count)
{
	etcd *e = (etcd *)be;
	int rc = 0;
	*out = NULL;
	*count = 0;
	call_begin(e, 0);
	for (size_t i = 0; i < nnames && rc == 0; i++) {
		char *dir = dir_of(e, names[i]), *end = dir ? range_end(dir) : NULL;
		json_object *ok = json_object_new_array(), *resp;
		kv *keys = NULL;
		size_t nk = 0;
		if (!end) {
			free(dir);
			json_object_put(ok);
			rc = DLOCK_ENOMEM;
			break;
		}
		json_object_array_add(ok, op_range(dir, end, 1, 0, 0));
		free(dir);
		free(end);
		if ((rc = txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) != 0)
			break;
		rc = dlock__etcd_txn_range(resp, 0, &keys, &nk);
		json_object_put(resp);
		dlock_lock_status *st = rc == 0 ? dlock__status_add(out, count) : NULL;
		if (rc == 0 && !st)
			rc = DLOCK_ENOMEM;
		if (rc == 0 && !(st->name = dlock__strdup(names[i])))
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
static int etcd_list(dlock_backend *be, char ***names, size_t *count)
{
	etcd *e = (etcd *)be;
	*names = NULL;
	*count = 0;
	call_begin(e, 0);
	char *pre = dlock__sprintf("%s/", e->prefix), *end = pre ? range_end(pre) : NULL;
	json_object *ok = json_object_new_array(), *resp;
	kv *keys = NULL;
	size_t nk = 0, plen = pre ? strlen(pre) : 0;
	int rc = 0;
	if (!end) {
		free(pre);
		json_object_put(ok);
		return DLOCK_ENOMEM;
	}
	json_object_array_add(ok, op_range(pre, end, 1, 0, 0));
	free(end);
	if ((rc = txn(e, e->cmd, NULL, ok, NULL, &resp, NULL)) == 0) {
		rc = dlock__etcd_txn_range(resp, 0, &keys, &nk);
		json_object_put(resp);
	}
	if (rc == 0 && nk && !(*names = calloc(nk, sizeof(char *))))
		rc = dlock__oom();
	for (size_t i = 0; i < nk && rc == 0; i++) {
		if (!keys[i].key || strncmp(keys[i].key, pre, plen) != 0)
			continue;
		const char *slash = strchr(keys[i].key + plen, '/');
		if (!slash || slash == keys[i].key + plen)
			continue;
		char *name = dlock__etcd_unescape_name(keys[i].key + plen, (size_t)(slash - keys[i].key) - plen);
		if (!name)
			rc = dlock__oom();
		else
			(*names)[(*count)++] = name; /* duplicates: the core drops them */
	}
	free(pre);
	dlock__etcd_kvs_free(keys, nk);
	return rc;
}

/* ------------------------------------------------------------------ */
/* open / close */

static void etcd_close(dlock_backend *be)
{
	etcd *e = (etcd *)be;
	if (!e)
		return;
	/* Revoking drops keys left on our leases at once instead of after their
	 * TTL. But a hold still in the table when the store closes was handed
	 * over (dlock_lock_detach: `dlock acquire` leaves it held after exit),
	 * and keys of other processes we adopted (pinned) must outlive us too. */
	call_begin(e, 0);
	for (size_t i = 0; e->cmd && i < e->nleases; i++) {
		int keep = e->leases[i].pinned;
		for (size_t j = 0; j < e->nholds && !keep; j++)
			keep = !e->holds[j].orphan && (e->holds[j].lease == e->leases[i].id ||
						       e->holds[j].maybe == e->leases[i].id);
		if (keep)
			continue;
		json_object *body = json_object_new_object(), *resp;
		jadd_i64(body, "ID", e->leases[i].id);
		if (rpc(e, e->cmd, "/v3/lease/revoke", body, &resp, NULL) == 0)
			json_object_put(resp);
	}
	curl_multi_cleanup(e->multi);
	curl_easy_cleanup(e->cmd);
	curl_easy_cleanup(e->side);
	for (size_t i = 0; i < e->npool; i++)
		kit_free(e->pool[i]);
	for (size_t i = 0; i < e->nurls; i++)
		free(e->urls[i]);
	free(e->urls);
	free(e->hp);
	free(e->prefix);
	free(e->user);
	if (e->password) {
		memset(e->password, 0, strlen(e->password));
		free(e->password);
	}
	free(e->cacert);
	free(e->cert);
	free(e->key);
	free(e->token);
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
	return dlock__opt_dup(dst, dlock_uri_param(uri, name));
}

static const dlock_backend_methods etcd_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.acquire = etcd_acquire,
	.release = etcd_release,
	.renew = etcd_renew,
	.extend = etcd_extend,
	.wait = etcd_wait,
	.cancel = etcd_cancel,
	.status = etcd_status,
	.list = etcd_list,
	.close = etcd_close,
};

int dlock__etcd_open(dlock_backend **out, dlock_uri *uri)
{
	etcd *e;
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
	if (!(e = dlock__calloc(1, sizeof(*e)))) {
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
		if (!tls && uri->password && !dlock__host_is_local(hp[i].host))
			dlock__open_warning("etcd: the password and the lock traffic go to %s over plain HTTP, which a "
					    "man in the middle can read; use etcds:// with cacert=CA.pem", hp[i].host);
		int v6 = strchr(hp[i].host, ':') != NULL;
		if (!(e->urls[i] = dlock__sprintf("%s://%s%s%s:%d", tls ? "https" : "http", v6 ? "[" : "",
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
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL, "etcd: unknown recipe '%s' (dlock or concurrency)", recipe);
		goto fail;
	}
	if (verbatim) {
		size_t plen = strlen(uri->prefix);
		while (plen > 1 && uri->prefix[plen - 1] == '/')
			plen--;
		e->prefix = dlock__strndup(uri->prefix, plen);
	} else {
		e->prefix = prefix_enc(uri->prefix);
	}
	if (!e->prefix) {
		rc = dlock__oom();
		goto fail;
	}
	if ((uri->user && !(e->user = dlock__strdup(uri->user))) ||
	    (uri->password && !(e->password = dlock__strdup(uri->password))))
		goto fail;
	if (dup_opt(&e->cacert, uri, "cacert") || dup_opt(&e->cert, uri, "cert") ||
	    dup_opt(&e->key, uri, "key"))
		goto fail;
	if (!tls && (e->cacert || e->cert || e->key)) {
		rc = dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				     "cacert/cert/key need the etcds:// scheme (TLS)");
		goto fail;
	}
	if (!(e->cmd = handle_new(e)) || !(e->side = handle_new(e)) || !(e->multi = curl_multi_init()))
		goto fail;
	/* The whole open (authentication and the first answer) within connect_timeout. */
	e->deadline = start + e->connect_timeout_ms;
	curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, 8L);
	dlock_free(hp);
	hp = NULL;
	/* Check now that a member answers (and that the credentials work), so a
	 * wrong URI fails at open rather than at the first lock. */
	if (e->user && (rc = authenticate(e, e->cmd, e->token_gen, e->deadline)) != 0)
		goto fail;
	{
		json_object *body = json_object_new_object(), *resp;
		char *pre = dlock__sprintf("%s/", e->prefix);
		if (!pre) {
			json_object_put(body);
			goto fail;
		}
		jadd_b64(body, "key", pre, strlen(pre));
		free(pre);
		json_object_object_add(body, "count_only", json_object_new_boolean(1));
		json_object_object_add(body, "serializable", json_object_new_boolean(1));
		if ((rc = rpc(e, e->cmd, "/v3/kv/range", body, &resp, NULL)) != 0)
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
