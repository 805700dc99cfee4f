/*
 * etcd store: HTTP to the v3 JSON gateway (libcurl): every transfer cut to
 * the caller's deadline, failover between endpoints, authentication.
 */
#include "etcd.h"

#include <fcntl.h>

/* ------------------------------------------------------------------ */
/* HTTP */

/* A reply body: support.h's growable string, capped (a hostile member's
 * endless reply fails the transfer instead of growing without bound). */
#define REPLY_MAX (64u << 20)

static size_t buf_write(char *data, size_t size, size_t nmemb, void *ud)
{
	size_t len = size * nmemb;
	return dlock__sb_put(ud, data, len) == 0 ? len : 0; /* 0: curl fails the transfer */
}

/* A peer that vanished (host down, link cut) fails the connection after
 * this long with data unacknowledged, or dlock__et_keepalive probes unanswered.
 * Close-on-exec: a program the caller starts (dlock run's COMMAND) never
 * inherits a connection of ours (curl makes its sockets without it). */
static int sockopt(void *ud, curl_socket_t fd, curlsocktype purpose)
{
	etcd *e = ud;
	unsigned int ms = (unsigned int)e->connect_timeout_ms;
	int fl = fcntl(fd, F_GETFD);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	if (purpose == CURLSOCKTYPE_IPCXN)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
	return CURL_SOCKOPT_OK;
}

CURL *dlock__et_handle_new(etcd *e)
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

void dlock__et_kit_free(waitkit *k)
{
	if (!k)
		return;
	curl_multi_cleanup(k->multi);
	curl_easy_cleanup(k->watch);
	curl_easy_cleanup(k->read);
	free(k);
}

waitkit *dlock__et_kit_take(etcd *e)
{
	waitkit *k = NULL;
	pthread_mutex_lock(&e->mu);
	if (e->npool)
		k = e->pool[--e->npool];
	pthread_mutex_unlock(&e->mu);
	if (k || !(k = calloc(1, sizeof(*k))))
		return k;
	if (!(k->multi = curl_multi_init()) || !(k->watch = dlock__et_handle_new(e)) || !(k->read = dlock__et_handle_new(e))) {
		dlock__et_kit_free(k);
		return NULL;
	}
	curl_multi_setopt(k->multi, CURLMOPT_MAXCONNECTS, 2L);
	return k;
}

void dlock__et_kit_put(etcd *e, waitkit *k)
{
	pthread_mutex_lock(&e->mu);
	if (e->npool < POOL_MAX) {
		e->pool[e->npool++] = k;
		k = NULL;
	}
	pthread_mutex_unlock(&e->mu);
	dlock__et_kit_free(k);
}

/* Connection-level failures worth trying the next endpoint for. */
int dlock__et_curl_failover(CURLcode c)
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

void dlock__et_endpoint_failed(etcd *e, size_t idx)
{
	pthread_mutex_lock(&e->mu);
	if (e->cur == idx)
		e->cur = (idx + 1) % e->nurls;
	pthread_mutex_unlock(&e->mu);
}


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
			dlock__et_endpoint_failed(e, x->idx);
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
int dlock__et_xfer_start(etcd *e, xfer *x, CURL *h, const char *path, const char *text, int64_t until,
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

void dlock__et_xfer_end(xfer *x)
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
		if (dlock__et_curl_failover(x->c)) {
			if (!curl_not_sent(x->c))
				res->ambiguous = 1;
			dlock__et_endpoint_failed(e, x->idx);
			*next = NEXT_ENDPOINT;
		}
		return rc;
	}
	json_object *j = x->b.p ? json_tokener_parse(x->b.p) : NULL;
	if (x->status == 200 && j) {
		*out = j;
		return 0;
	}
	int grpc = (int)dlock__et_jint(j, "code"), rc;
	const char *msg = dlock__et_jstr(j, "message");
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
		dlock__et_endpoint_failed(e, x->idx);
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
		if ((rc = dlock__et_xfer_start(e, &x, h, path, text, attempt_until(e, h, until),
				     !(flags & RPC_NO_TOKEN))) != 0) {
			bool next_ep = x.unresolved;
			dlock__et_xfer_end(&x);
			if (next_ep) { /* its name did not resolve: try the next endpoint */
				tries++;
				continue;
			}
			break;
		}
		run(e, xs, 1);
		rc = xfer_finish(e, &x, out, res, &next);
		unsigned gen = x.gen;
		dlock__et_xfer_end(&x);
		if (next == NEXT_ENDPOINT) {
			tries++;
			continue;
		}
		if (next == NEXT_REAUTH && !reauthed && !(flags & RPC_NO_TOKEN)) {
			reauthed = 1;
			if ((rc = dlock__et_authenticate(e, h, gen, until)) != 0)
				break;
			continue;
		}
		break;
	}
	json_object_put(body);
	return rc;
}

int dlock__et_rpc_until(etcd *e, CURL *h, const char *path, json_object *body, json_object **out,
		     rpc_result *res, int64_t until)
{
	return rpc_ex(e, h, path, body, out, res, until, 0);
}

/* A request of the current call (under the store mutex): by e->deadline. */
int dlock__et_rpc(etcd *e, CURL *h, const char *path, json_object *body, json_object **out,
	       rpc_result *res)
{
	return rpc_ex(e, h, path, body, out, res, e->deadline, 0);
}

/*
 * Two requests at once on the command handles (cmd and side), one attempt.
 * rc1 and rc2 get each one's outcome; a caller that needs one to succeed
 * repeats it with dlock__et_rpc(), which fails over and re-authenticates.
 */
void dlock__et_rpc_pair(etcd *e, const char *path1, json_object *body1, json_object **out1, int *rc1,
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
	*rc1 = dlock__et_xfer_start(e, &x1, e->cmd, path1, t1 ? t1 : "", attempt_until(e, e->cmd, e->deadline), 1);
	*rc2 = *rc1 != 0 ? *rc1
			 : dlock__et_xfer_start(e, &x2, e->side, path2, t2 ? t2 : "",
				      attempt_until(e, e->side, e->deadline), 1);
	if (*rc1 == 0 && *rc2 == 0 && t1 && t2) {
		run(e, xs, 2);
		*rc1 = xfer_finish(e, &x1, out1, res1, &next);
		*rc2 = xfer_finish(e, &x2, out2, &r2, &next);
	} else if (*rc1 == 0 || *rc2 == 0 || !t1 || !t2) {
		*rc1 = *rc2 = dlock__oom();
	}
	dlock__et_xfer_end(&x1);
	dlock__et_xfer_end(&x2);
	json_object_put(body1);
	json_object_put(body2);
}

/* Get a token for user/password unless another thread already replaced token `seen_gen`. */
int dlock__et_authenticate(etcd *e, CURL *h, unsigned seen_gen, int64_t until)
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
	const char *tok = dlock__et_jstr(resp, "token");
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
	dlock__free_secret(e->token);
	e->token = t;
	e->token_gen++;
	pthread_mutex_unlock(&e->mu);
	return 0;
}
