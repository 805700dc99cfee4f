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
	return dlock_sys_sb_put(ud, data, len) == 0 ? len : 0; /* 0: curl fails the transfer */
}

/* A peer that vanished (host down, link cut) fails the connection after
 * this long with data unacknowledged, or keepalive probes unanswered.
 * Close-on-exec: a program the caller starts (dlock run's COMMAND) never
 * inherits a connection of ours (curl makes its sockets without it). */
static int sockopt(void *ud, curl_socket_t fd, curlsocktype purpose)
{
	etcd_store *e = ud;
	unsigned int ms = (unsigned int)e->connect_timeout_ms;
	int fl = fcntl(fd, F_GETFD);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	if (purpose == CURLSOCKTYPE_IPCXN)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
	return CURL_SOCKOPT_OK;
}

CURL *dlock__et_handle_new(etcd_store *e)
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

waitkit *dlock__et_kit_take(etcd_store *e)
{
	waitkit *k = NULL;
	pthread_mutex_lock(&e->mu);
	if (e->npool)
		k = e->pool[--e->npool];
	pthread_mutex_unlock(&e->mu);
	if (k || !(k = calloc(1, sizeof(*k))))
		return k;
	if (!(k->multi = curl_multi_init()) || !(k->watch = dlock__et_handle_new(e)) ||
	    !(k->read = dlock__et_handle_new(e))) {
		dlock__et_kit_free(k);
		return NULL;
	}
	curl_multi_setopt(k->multi, CURLMOPT_MAXCONNECTS, 2L);
	return k;
}

void dlock__et_kit_put(etcd_store *e, waitkit *k)
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

void dlock__et_endpoint_failed(etcd_store *e, size_t idx)
{
	pthread_mutex_lock(&e->mu);
	if (e->cur == idx)
		e->cur = (idx + 1) % e->nurls;
	pthread_mutex_unlock(&e->mu);
}

static int timed_out(const char *what)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout", "%s: timed out (no time left to send it)", what);
}

/*
 * libcurl's threaded resolver bounds a lookup by the transfer's timeout, but
 * removing a handle whose lookup still runs waits for it (Curl_resolver_kill
 * joins the thread). So the name is resolved here by the deadline (with
 * several endpoints by half the time left, leaving time for the next) and
 * pinned with CURLOPT_RESOLVE: curl connects to the addresses and keeps the
 * name for TLS (SNI, certificate check) and the Host header.
 */
static int pin_endpoint(etcd_store *e, xfer *x, CURL *h, int64_t until)
{
	const dlock_hostport *hp = &e->hp[x->idx];
	int64_t now = dlock_clock_ms();
	dlock_sys_addrs ad;
	int rc = dlock_sys_resolve(&ad, hp->host, e->nurls > 1 ? now + (until - now) / 2 : until, KIND);
	if (rc) {
		x->unresolved = rc == DLOCK_EUNAVAILABLE;
		if (x->unresolved)
			dlock__et_endpoint_failed(e, x->idx);
		return rc;
	}
	if (!ad.n || (ad.n == 1 && !strcmp(ad.addr[0], hp->host)))
		return 0; /* numeric: nothing to pin */
	char entry[300 + DLOCK_SYS_ADDRS_MAX * (DLOCK_SYS_ADDR_LEN + 3)];
	size_t len = (size_t)snprintf(entry, sizeof(entry), "%s:%d:", hp->host, hp->port);
	for (size_t i = 0; i < ad.n && len < sizeof(entry); i++) {
		bool v6 = strchr(ad.addr[i], ':') != NULL;
		len += (size_t)snprintf(entry + len, sizeof(entry) - len, "%s%s%s%s", i ? "," : "", v6 ? "[" : "",
					ad.addr[i], v6 ? "]" : "");
	}
	if (!(x->pin = curl_slist_append(NULL, entry)))
		return dlock_sys_oom();
	curl_easy_setopt(h, CURLOPT_RESOLVE, x->pin);
	return 0;
}

/* Prepare one exchange that must end by `until` (CLOCK_MONOTONIC ms): curl's
 * limits are cut to the time left, and nothing is sent when none is left. */
static int xfer_start_at(etcd_store *e, xfer *x, CURL *h, size_t idx, const char *path, const char *text, int64_t until,
			 int with_token)
{
	int64_t left = until - dlock_clock_ms();
	memset(x, 0, sizeof(*x));
	if (left <= 0)
		return timed_out(path);
	x->h = h;
	x->idx = idx;
	x->url = dlock_sys_sprintf("%s%s", e->urls[idx], path);
	int rc = pin_endpoint(e, x, h, until);
	if (rc)
		return rc;
	x->hd = curl_slist_append(NULL, "Content-Type: application/json");
	if (x->hd)
		x->hd = curl_slist_append(x->hd, "Expect:");
	pthread_mutex_lock(&e->mu);
	x->gen = e->token_gen;
	if (x->hd && with_token && e->token) {
		char *line = dlock_sys_sprintf("Authorization: %s", e->token);
		struct curl_slist *n = line ? curl_slist_append(x->hd, line) : NULL;
		free(line);
		if (!n) {
			curl_slist_free_all(x->hd);
			x->hd = NULL;
		}
	}
	pthread_mutex_unlock(&e->mu);
	if (!x->url || !x->hd)
		return dlock_sys_oom();
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

int dlock__et_xfer_start(etcd_store *e, xfer *x, CURL *h, const char *path, const char *text, int64_t until,
			 int with_token)
{
	size_t idx;
	pthread_mutex_lock(&e->mu);
	idx = e->cur;
	pthread_mutex_unlock(&e->mu);
	return xfer_start_at(e, x, h, idx, path, text, until, with_token);
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

/* Run a waiter's transfer (its pool handle, on its own; the command
 * handles race through e->multi: "Hedging" below). */
static void run_one(xfer *x)
{
	x->c = curl_easy_perform(x->h);
	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
}

enum { NEXT_DONE, NEXT_ENDPOINT, NEXT_REAUTH };

/* Read a finished transfer: 0 and *out, or an error (set) and what to do next. */
static int xfer_finish(etcd_store *e, xfer *x, json_object **out, rpc_result *res, int *next)
{
	*next = NEXT_DONE;
	*out = NULL;
	if (x->c != CURLE_OK) {
		/* curl closes a connection whose transfer it abandoned: a late
		 * answer cannot be read as the answer to a later request. */
		int rc = x->c == CURLE_OPERATION_TIMEDOUT
				 ? dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "timeout", "etcd %s: timed out", x->url)
				 : dlock_error_set(DLOCK_EUNAVAILABLE, KIND, curl_easy_strerror(x->c), "etcd %s: %s",
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
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, scode, "%s: HTTP %ld: %s", x->url, x->status,
				     msg ? msg : "no JSON answer");
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

/* The deadline of one attempt of the current call: the call's, cut to the
 * per-attempt limit while renewing (so a hung member leaves time for the
 * next one even with the whole deadline given to it). */
static int64_t attempt_until(etcd_store *e, int64_t until)
{
	if (e->op_timeout_ms > 0) {
		int64_t cap = dlock_clock_ms() + e->op_timeout_ms;
		return cap < until ? cap : until;
	}
	return until;
}

/* ------------------------------------------------------------------ */
/* Hedging */

/*
 * A request of the current call (on cmd or side, under the store mutex)
 * races over the members instead of waiting on one. Attempt 0 goes to the
 * current member with the whole deadline. When it has not answered within
 * its share of the time left (time left / members not yet tried, at least
 * HEDGE_MIN_MS, at most one request timeout), the same request goes to the
 * next member too, WITHOUT giving up the first: the first answer wins, and
 * the attempts still in flight are abandoned (curl closes their
 * connections, so no late answer is ever read as another request's). A
 * member that fails (refused, reset, 5xx, no leader, its own timeout)
 * starts the next one at once, as a fail-over. So a stopped member costs
 * one share, while a slow but healthy network keeps every attempt's whole
 * deadline: nothing is cut short, a 800 ms round trip still answers.
 *
 * The member that answered becomes the current one. A loser may still be
 * applied after the winner's answer (it was sent), so a race with more
 * than one attempt sent reports its outcome ambiguous, as a fail-over
 * does; every request the store sends is safe to apply twice: reads and
 * keepalives change nothing; a Txn that puts our key compares its
 * create_revision to 0 (a second put finds it); deletes and revokes are
 * by our own key or lease (a second one finds nothing); a lease grant
 * applied twice leaves one lease that nobody keeps alive, which etcd
 * drops after its TTL with nothing on it.
 */
#define HEDGE_MIN_MS 250

typedef struct race {
	int which;           /* 0: cmd's request, 1: side's */
	const char *path, *text;
	int with_token;
	int64_t until;
	size_t first;        /* endpoint of attempt 0 */
	size_t n;            /* attempts made: x[0..n) (started, skipped or over) */
	size_t live;         /* attempts in flight */
	int64_t hedge_at;    /* start the next member then if none answered */
	xfer *x;             /* e->nurls */
	bool *on;            /* x[k] in flight on e->multi */
	bool done;
	int rc, next;
	unsigned gen;        /* token generation the deciding attempt sent */
	json_object *out;
	rpc_result res;
} race;

static int race_init(etcd_store *e, race *r, int which, const char *path, const char *text, int64_t until,
		     int with_token)
{
	memset(r, 0, sizeof(*r));
	r->which = which;
	r->path = path;
	r->text = text;
	r->until = until;
	r->with_token = with_token;
	r->rc = DLOCK_EUNAVAILABLE;
	pthread_mutex_lock(&e->mu);
	r->first = e->cur;
	pthread_mutex_unlock(&e->mu);
	r->x = calloc(e->nurls, sizeof(*r->x));
	r->on = calloc(e->nurls, sizeof(*r->on));
	if (!r->x || !r->on) {
		free(r->x);
		free(r->on);
		r->x = NULL;
		r->on = NULL;
		r->done = true;
		return r->rc = dlock_sys_oom();
	}
	return 0;
}

/* The handle of attempt k: cmd or side first, then one of e->hedge. */
static CURL *race_handle(etcd_store *e, const race *r, size_t k)
{
	if (k == 0)
		return r->which ? e->side : e->cmd;
	if (!e->hedge && !(e->hedge = calloc(2 * e->nurls, sizeof(CURL *))))
		return NULL;
	CURL **slot = &e->hedge[(size_t)r->which * e->nurls + k];
	if (!*slot)
		*slot = dlock__et_handle_new(e);
	return *slot;
}

static int64_t hedge_share(const etcd_store *e, int64_t now, int64_t until, size_t untried)
{
	int64_t share = (until - now) / (int64_t)(untried ? untried : 1);
	if (share > e->request_timeout_ms)
		share = e->request_timeout_ms;
	return share < HEDGE_MIN_MS ? HEDGE_MIN_MS : share;
}

/* Stop every attempt of r still in flight, and free them all. */
static void race_end(etcd_store *e, race *r)
{
	for (size_t k = 0; r->x && k < r->n; k++) {
		if (r->on[k]) {
			curl_multi_remove_handle(e->multi, r->x[k].h);
			r->on[k] = false;
			r->live--;
		}
		dlock__et_xfer_end(&r->x[k]);
	}
}

static void race_free(etcd_store *e, race *r)
{
	race_end(e, r);
	free(r->x);
	free(r->on);
	r->x = NULL;
	r->on = NULL;
}

/* Start the next member's attempt (skipping names that do not resolve). */
static void race_start(etcd_store *e, race *r)
{
	while (!r->done && r->n < e->nurls) {
		size_t k = r->n++;
		xfer *x = &r->x[k];
		CURL *h = race_handle(e, r, k);
		int rc = h ? xfer_start_at(e, x, h, (r->first + k) % e->nurls, r->path, r->text,
					   attempt_until(e, r->until), r->with_token)
			   : dlock_sys_oom();
		if (rc == 0 && curl_multi_add_handle(e->multi, h) != CURLM_OK)
			rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "%s: curl_multi_add_handle failed",
					     r->path);
		if (rc == 0) {
			int64_t now = dlock_clock_ms();
			r->on[k] = true;
			r->live++;
			r->hedge_at = now + hedge_share(e, now, r->until, e->nurls - k);
			return;
		}
		bool next_ep = x->unresolved;
		dlock__et_xfer_end(x);
		r->rc = rc;
		if (!next_ep) { /* no time left or no memory: start nothing more */
			r->n = e->nurls;
			break;
		}
	}
	if (!r->live)
		r->done = true; /* nothing in flight and nothing left: r->rc says why */
}

/* Attempt k of r ended with c: decide r, or go on with the others. */
static void race_finish(etcd_store *e, race *r, size_t k, CURLcode c)
{
	xfer *x = &r->x[k];
	json_object *out = NULL;
	rpc_result res;
	long sent = 0;
	int next;
	memset(&res, 0, sizeof(res));
	curl_multi_remove_handle(e->multi, x->h);
	r->on[k] = false;
	r->live--;
	x->c = c;
	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
	curl_easy_getinfo(x->h, CURLINFO_REQUEST_SIZE, &sent);
	if (c == CURLE_OK || sent > 0)
		e->reached = 1; /* it answered, or its kernel took the bytes */
	r->rc = xfer_finish(e, x, &out, &res, &next);
	r->res.ambiguous |= res.ambiguous;
	if (next == NEXT_ENDPOINT) {
		dlock__et_xfer_end(x);
		if (!r->live)
			race_start(e, r); /* failed over: the next member at once */
		return;
	}
	r->done = true;
	r->out = out;
	r->next = next;
	r->gen = x->gen;
	r->res.grpc = res.grpc;
	if (r->live) /* another attempt went out and may still be applied */
		r->res.ambiguous = 1;
	pthread_mutex_lock(&e->mu);
	e->cur = x->idx; /* it answered: the next calls start there */
	pthread_mutex_unlock(&e->mu);
	race_end(e, r);
}

/* Run races (one request each, at most two: cmd's and side's) to their end. */
static void races_run(etcd_store *e, race **rs, int nr)
{
	for (int i = 0; i < nr; i++)
		if (!rs[i]->done)
			race_start(e, rs[i]);
	for (;;) {
		int64_t now = dlock_clock_ms(), wake = now + 1000;
		int pending = 0;
		for (int i = 0; i < nr; i++) {
			race *r = rs[i];
			if (!r->done && r->n < e->nurls && now >= r->hedge_at)
				race_start(e, r); /* no answer within the share: the next member too */
			if (r->done)
				continue;
			pending++;
			if (r->n < e->nurls && r->hedge_at < wake)
				wake = r->hedge_at;
		}
		if (!pending)
			break;
		int running = 0, q;
		if (curl_multi_perform(e->multi, &running) != CURLM_OK)
			break;
		CURLMsg *m;
		while ((m = curl_multi_info_read(e->multi, &q))) {
			CURL *done_h = m->easy_handle;
			CURLcode c = m->data.result;
			if (m->msg != CURLMSG_DONE)
				continue;
			for (int i = 0; i < nr; i++)
				for (size_t k = 0; !rs[i]->done && k < rs[i]->n; k++)
					if (rs[i]->on[k] && rs[i]->x[k].h == done_h)
						race_finish(e, rs[i], k, c);
		}
		now = dlock_clock_ms();
		pending = 0;
		for (int i = 0; i < nr; i++)
			pending += !rs[i]->done;
		if (!pending)
			break;
		int64_t ms = wake - now;
		if (curl_multi_poll(e->multi, NULL, 0, (int)(ms < 0 ? 0 : ms > 1000 ? 1000 : ms), NULL) != CURLM_OK)
			break;
	}
	for (int i = 0; i < nr; i++) {
		if (!rs[i]->done) {
			rs[i]->done = true;
			rs[i]->rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "%s: curl multi failed",
						    rs[i]->path);
		}
		race_end(e, rs[i]);
	}
}

#define RPC_NO_TOKEN 1

/*
 * POST body to path: on the command handles a race over the members
 * ("Hedging"), on a waiter's handle the current endpoint and, on a
 * connection failure (or a member that cannot answer), the next ones, each
 * once; all by `until`. A 401 "invalid auth token" re-authenticates and
 * retries once. Takes ownership of body; *out gets the answer object.
 */
static int rpc_ex(etcd_store *e, CURL *h, const char *path, json_object *body, json_object **out, rpc_result *res,
		  int64_t until, int flags)
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
		return dlock_sys_oom();
	}
	if (h == e->cmd || h == e->side) {
		for (;;) {
			race r, *rs[1] = { &r };
			if (race_init(e, &r, h == e->side, path, text, until, !(flags & RPC_NO_TOKEN)) == 0)
				races_run(e, rs, 1);
			rc = r.rc;
			*out = r.out;
			res->grpc = r.res.grpc;
			res->ambiguous |= r.res.ambiguous;
			race_free(e, &r);
			if (r.next == NEXT_REAUTH && !reauthed && !(flags & RPC_NO_TOKEN)) {
				reauthed = 1;
				if ((rc = dlock__et_authenticate(e, h, r.gen, until)) != 0)
					break;
				continue;
			}
			break;
		}
		json_object_put(body);
		return rc;
	}
	while (tries < e->nurls) {
		xfer x;
		int next;
		if ((rc = dlock__et_xfer_start(e, &x, h, path, text, until, !(flags & RPC_NO_TOKEN))) != 0) {
			bool next_ep = x.unresolved;
			dlock__et_xfer_end(&x);
			if (next_ep) { /* its name did not resolve: try the next endpoint */
				tries++;
				continue;
			}
			break;
		}
		run_one(&x);
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

int dlock__et_rpc_until(etcd_store *e, CURL *h, const char *path, json_object *body, json_object **out, rpc_result *res,
			int64_t until)
{
	return rpc_ex(e, h, path, body, out, res, until, 0);
}

/* A request of the current call (under the store mutex): by e->deadline. */
int dlock__et_rpc(etcd_store *e, CURL *h, const char *path, json_object *body, json_object **out, rpc_result *res)
{
	return rpc_ex(e, h, path, body, out, res, e->deadline, 0);
}

/*
 * Two requests at once on the command handles (cmd and side), each a race
 * over the members ("Hedging"), no re-authentication. rc1 and rc2 get each
 * one's outcome; a caller that needs one to succeed repeats it with
 * dlock__et_rpc(), which re-authenticates.
 */
void dlock__et_rpc_pair(etcd_store *e, const char *path1, json_object *body1, json_object **out1, int *rc1,
			rpc_result *res1, const char *path2, json_object *body2, json_object **out2, int *rc2)
{
	const char *t1 = json_object_to_json_string_ext(body1, JSON_C_TO_STRING_PLAIN);
	const char *t2 = json_object_to_json_string_ext(body2, JSON_C_TO_STRING_PLAIN);
	race r1, r2, *rs[2] = { &r1, &r2 };
	memset(res1, 0, sizeof(*res1));
	*out1 = *out2 = NULL;
	if (!t1 || !t2) {
		*rc1 = *rc2 = dlock_sys_oom();
	} else {
		int i1 = race_init(e, &r1, 0, path1, t1, e->deadline, 1);
		int i2 = race_init(e, &r2, 1, path2, t2, e->deadline, 1);
		if (i1 == 0 && i2 == 0)
			races_run(e, rs, 2);
		*rc1 = i2 ? i2 : r1.rc;
		*rc2 = i1 ? i1 : r2.rc;
		*out1 = r1.out;
		*out2 = r2.out;
		*res1 = r1.res;
		race_free(e, &r1);
		race_free(e, &r2);
	}
	json_object_put(body1);
	json_object_put(body2);
}

/* Get a token for user/password unless another thread already replaced token `seen_gen`. */
int dlock__et_authenticate(etcd_store *e, CURL *h, unsigned seen_gen, int64_t until)
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
	char *t = dlock_sys_strdup(tok);
	json_object_put(resp);
	if (!t)
		return DLOCK_ENOMEM;
	pthread_mutex_lock(&e->mu);
	dlock_sys_free_secret(e->token);
	e->token = t;
	e->token_gen++;
	pthread_mutex_unlock(&e->mu);
	return 0;
}
