/*
 * Memcached store (libmemcached): memcached://host:port
 *
 * Per lock name three kinds of keys:
 *   K            the holder list: one value, changed only by cas (gets+cas);
 *                it never expires while it lists anyone
 *   K/o/<owner>  one "lease key" per holder or waiter, written only by that
 *                owner, with a memcached expiry: the lease. An entry of K
 *                whose lease key is gone is dead and anyone may prune it.
 *   K/f          the fence counter (incr)
 * Expiry is judged only by memcached's own clock (key expiry); client clocks
 * appear only in what status reports. See docs/stores/memcached.md.
 */
#include "support.h"

#include <libmemcached/memcached.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIND "memcached"
#define MAX_ENCODED 160     /* longer keys are hashed (memcached allows 250) */
#define CAS_TRIES 50
/* An empty holder list is left to expire after an hour (never deleted: see
 * tidy_exptime). */
#define EMPTY_LIST_TTL 3600
/* Memcached treats expiries above 30 days as absolute times. */
#define MAX_TTL_S (30 * 24 * 3600 - 2)

typedef struct memcached_store {
	dlock_backend base;
	memcached_st *mc;
	memcached_st *rmc;          /* renewal batches: a second connection, noreply + buffered */
	char *ns;
	char hostport[300];
	int64_t deadline;           /* of the call in progress (calls hold the store mutex) */
	int dropped;                /* the last call closed the connection (timed out, failed) */
	int64_t request_timeout_ms; /* bound of status */
} memcached_store;

/* One entry of a holder list. */
typedef struct entry {
	char kind;  /* 'H' holder, 'Q' queued waiter */
	char owner[72];
	int mode;   /* 0 exclusive/semaphore, 1 shared */
	unsigned permits;
	int fair;
	uint64_t fence;
	uint64_t seq;
	int pid;
	char host[128];
	int live;
} entry;

typedef struct list {
	uint64_t next_seq;
	size_t n, cap;
	entry *e;
} list;

/* ----------------------------------------------------------------- errors */

/* Close the connection: nothing late is ever read from it. memcached_quit
 * first sends "quit", which may wait (purging replies still owed) for a
 * whole poll timeout: give it 1 ms. */
static void drop_conn(memcached_store *be)
{
	be->dropped = 1;
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, 1);
	memcached_quit(be->mc);
}

static int mc_error(memcached_store *be, memcached_return_t rc, const char *what)
{
	int code;
	if (rc == MEMCACHED_TIMEOUT) {
		/* Drop the connection: a late reply must not answer a later request. */
		drop_conn(be);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "TIMEOUT",
				       "%s on %s: timed out (no answer by the deadline); the connection was closed",
				       what, be->hostport);
	}
	switch (rc) {
	case MEMCACHED_CONNECTION_FAILURE:
	case MEMCACHED_CONNECTION_SOCKET_CREATE_FAILURE:
	case MEMCACHED_HOST_LOOKUP_FAILURE:
	case MEMCACHED_TIMEOUT:
	case MEMCACHED_SERVER_MARKED_DEAD:
	case MEMCACHED_SERVER_TEMPORARILY_DISABLED:
	case MEMCACHED_ERRNO:
	case MEMCACHED_WRITE_FAILURE:
	case MEMCACHED_READ_FAILURE:
	case MEMCACHED_UNKNOWN_READ_FAILURE:
	case MEMCACHED_NO_SERVERS:
	case MEMCACHED_SERVER_ERROR:
	case MEMCACHED_PARTIAL_READ:
		code = DLOCK_EUNAVAILABLE;
		break;
	case MEMCACHED_AUTH_FAILURE:
	case MEMCACHED_AUTH_PROBLEM:
		code = DLOCK_EAUTH;
		break;
	case MEMCACHED_MEMORY_ALLOCATION_FAILURE:
		return dlock_sys_oom();
	default:
		code = DLOCK_ESTORE;
	}
	/* libmemcached starts its message with the address of its server
	 * object, "(0x55f0…) ": an address is no one's business (issue 21). */
	const char *msg = memcached_last_error_message(be->mc), *cut;
	if (msg && strncmp(msg, "(0x", 3) == 0 && (cut = strstr(msg, ") ")))
		msg = cut + 2;
	/* ... and ends it with its own source position, " -> ./src/libmemcached/get.cc:233",
	 * and a doubled host: keep the words before them, lower case like ours */
	char text[256];
	snprintf(text, sizeof(text), "%s", msg ? msg : "");
	if ((cut = strstr(text, " -> ")) != NULL)
		text[cut - text] = '\0';
	if ((cut = strstr(text, ",  host: ")) != NULL || (cut = strstr(text, ", host: ")) != NULL)
		text[cut - text] = '\0';
	for (char *c = text; *c; c++)
		if (*c >= 'A' && *c <= 'Z')
			*c = (char)(*c - 'A' + 'a');
	/* ... and says "connection failure" without the reason: the errno */
	int en = code == DLOCK_EUNAVAILABLE ? memcached_last_error_errno(be->mc) : 0;
	int err = dlock_error_set(code, KIND, memcached_strerror(be->mc, rc), "%s on %s: %s%s%s", what, be->hostport,
				  text[0] ? text : memcached_strerror(be->mc, rc), en ? ": " : "",
				  en ? strerror(en) : "");
	if (code == DLOCK_EUNAVAILABLE)
		drop_conn(be); /* the next call starts on a new connection */
	return err;
}

/*
 * Cut libmemcached's timers to the time left before each of its calls: the
 * poll of every socket wait (POLL_TIMEOUT, read per wait) and the connect
 * (CONNECT_TIMEOUT). A call that finds no time left sends nothing.
 */
static int arm(memcached_store *be, const char *what)
{
	int64_t left = be->deadline - dlock_clock_ms();
	if (left <= 0) {
		drop_conn(be);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "TIMEOUT",
				       "%s on %s: timed out (no time left before the deadline)", what, be->hostport);
	}
	if (left > INT32_MAX)
		left = INT32_MAX;
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, (uint64_t)left);
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, (uint64_t)left);
	return 0;
}

/* memcached_fetch_result with the time left; NULL and MEMCACHED_TIMEOUT when none is. */
static memcached_result_st *fetch(memcached_store *be, memcached_return_t *rc)
{
	if (be->deadline - dlock_clock_ms() <= 0) {
		*rc = MEMCACHED_TIMEOUT;
		return NULL;
	}
	arm(be, "read");
	return memcached_fetch_result(be->mc, NULL, rc);
}

/* ------------------------------------------------------------------- keys */

/* A '/' of a name that would start one of the suffixes of a lock's own keys
 * ("/o/" anywhere, "/f" at the end): written %2F, so no name's K is another
 * name's lease or fence key (the fence key K/f of "deploy" is not the K of
 * "deploy/f"). Other '/' stay as they are: "orders/42" keeps its key. */
static int internal_suffix(const char *s)
{
	return (s[1] == 'o' && s[2] == '/') || (s[1] == 'f' && s[2] == '\0');
}

/*
 * K for a name: "prefix:name" with bytes memcached forbids in keys (space,
 * controls, DEL, non-ASCII) and '%' written as %XX, and the '/' of
 * internal_suffix in the name; injective (decoding %XX gives the pair back,
 * the prefix ends at the first ':'). When that is too long,
 * "prefix#" and 128 bits of two FNV-1a 64 hashes with different offsets.
 */
static void base_key(memcached_store *be, const char *name, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0;
	const char *parts[2] = { be->ns, name };
	int fits = 1;
	for (int p = 0; p < 2 && fits; p++) {
		for (const unsigned char *s = (const unsigned char *)parts[p]; *s; s++) {
			if (n + 4 > MAX_ENCODED) {
				fits = 0;
				break;
			}
			if (*s <= 0x20 || *s >= 0x7f || *s == '%' || (p == 0 && *s == ':') ||
			    (p == 1 && *s == '/' && internal_suffix((const char *)s))) {
				out[n++] = '%';
				out[n++] = hex[*s >> 4];
				out[n++] = hex[*s & 15];
			} else {
				out[n++] = (char)*s;
			}
		}
		if (p == 0 && fits)
			out[n++] = ':';
	}
	out[n] = 0;
	if (fits)
		return;
	uint64_t a = dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, be->ns, strlen(be->ns) + 1);
	a = dlock_sys_fnv1a64(a, name, strlen(name));
	uint64_t b = dlock_sys_fnv1a64(0x6c62272e07bb0142ULL ^ 0x9e3779b97f4a7c15ULL, name, strlen(name));
	b = dlock_sys_fnv1a64(b, be->ns, strlen(be->ns));
	uint64_t ph = dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, be->ns, strlen(be->ns));
	snprintf(out, cap, "dlock#%016" PRIx64 "#%016" PRIx64 "%016" PRIx64, ph, a, b);
}

static void lease_key(const char *k, const char *owner, char *out, size_t cap)
{
	snprintf(out, cap, "%s/o/%s", k, owner);
}

/* ------------------------------------------------------ leases (seconds) */

/*
 * Memcached expiry is in whole seconds against a server clock that ticks once
 * a second, so "N seconds" can end up to a second early. Round up and add a
 * second: the server lease is never shorter than the client's deadline (which
 * counts ttl_ms from before the request), only up to ~2 s longer.
 */
static time_t lease_s(int64_t ms)
{
	int64_t s = (ms + 999) / 1000 + 1;
	if (s > MAX_TTL_S)
		s = MAX_TTL_S;
	return (time_t)s;
}

/* ------------------------------------------------------------- the list */

static void list_free(list *l)
{
	free(l->e);
	memset(l, 0, sizeof *l);
}

static entry *list_push(list *l)
{
	if (l->n == l->cap) {
		size_t nc = l->cap ? l->cap * 2 : 8;
		entry *ne = realloc(l->e, nc * sizeof *ne);
		if (!ne)
			return NULL;
		l->e = ne;
		l->cap = nc;
	}
	entry *e = &l->e[l->n++];
	memset(e, 0, sizeof *e);
	return e;
}

/* "v1 <next seq>\n" then one line per entry:
 *   H <owner> <mode> <permits> <fence> <pid> <host>
 *   Q <owner> <mode> <fair> <seq> */
static int list_parse(list *l, const char *v, size_t len)
{
	memset(l, 0, sizeof *l);
	char *buf = dlock_sys_strndup(v, len);
	if (!buf)
		return DLOCK_ENOMEM;
	char *save = NULL, *line = strtok_r(buf, "\n", &save);
	unsigned long long seq = 0;
	if (!line || sscanf(line, "v1 %llu", &seq) != 1) {
		free(buf);
		return dlock_error_set(DLOCK_ESTORE, KIND, NULL,
				       "unexpected value in a lock key (not written by dlock?)");
	}
	l->next_seq = seq;
	while ((line = strtok_r(NULL, "\n", &save))) {
		entry *e = list_push(l);
		if (!e) {
			free(buf);
			list_free(l);
			return dlock_sys_oom();
		}
		unsigned long long a = 0, b = 0;
		int mode = 0, pid = 0, off = 0;
		unsigned p = 1;
		if (line[0] == 'H' &&
		    sscanf(line, "H %71s %d %u %llu %d %n", e->owner, &mode, &p, &a, &pid, &off) >= 5) {
			e->kind = 'H';
			e->mode = mode;
			e->permits = p;
			e->fence = a;
			e->pid = pid;
			snprintf(e->host, sizeof e->host, "%s", off ? line + off : "");
		} else if (line[0] == 'Q' && sscanf(line, "Q %71s %d %d %llu", e->owner, &mode, &pid, &b) == 4) {
			e->kind = 'Q';
			e->mode = mode;
			e->fair = pid;
			e->seq = b;
		} else {
			l->n--; /* unknown line: ignore */
		}
	}
	free(buf);
	return 0;
}

static char *list_format(const list *l, size_t *len)
{
	size_t cap = 32 + l->n * 320, n = 0;
	char *out = malloc(cap);
	if (!out)
		return NULL;
	n += (size_t)snprintf(out, cap, "v1 %" PRIu64 "\n", l->next_seq);
	for (size_t i = 0; i < l->n; i++) {
		const entry *e = &l->e[i];
		if (!e->live)
			continue;
		if (e->kind == 'H')
			n += (size_t)snprintf(out + n, cap - n, "H %s %d %u %" PRIu64 " %d %s\n", e->owner, e->mode,
					      e->permits, e->fence, e->pid, e->host);
		else
			n += (size_t)snprintf(out + n, cap - n, "Q %s %d %d %" PRIu64 "\n", e->owner, e->mode, e->fair,
					      e->seq);
	}
	*len = n;
	return out;
}

static size_t list_live(const list *l)
{
	size_t n = 0;
	for (size_t i = 0; i < l->n; i++)
		n += l->e[i].live;
	return n;
}

/* A list that lists no one may expire; one that lists anyone must not. */
static time_t tidy_exptime(const list *l)
{
	return list_live(l) ? 0 : EMPTY_LIST_TTL;
}

/* --------------------------------------------------------- server calls */

/* gets K: *found = 0 when absent. */
static int read_list(memcached_store *be, const char *k, list *l, uint64_t *cas, int *found)
{
	const char *keys[1] = { k };
	size_t lens[1] = { strlen(k) };
	int err = arm(be, "gets");
	if (err)
		return err;
	memcached_return_t rc = memcached_mget(be->mc, keys, lens, 1);
	if (rc != MEMCACHED_SUCCESS)
		return mc_error(be, rc, "gets");
	*found = 0;
	memset(l, 0, sizeof *l);
	l->next_seq = 1;
	memcached_result_st *res;
	while ((res = fetch(be, &rc))) {
		if (!*found && !err) {
			*cas = memcached_result_cas(res);
			err = list_parse(l, memcached_result_value(res), memcached_result_length(res));
			*found = err == 0;
		}
		memcached_result_free(res);
	}
	if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND) {
		list_free(l);
		return mc_error(be, rc, "gets");
	}
	if (err)
		list_free(l);
	return err;
}

/* Mark each entry live iff its lease key exists (one mget). */
static int check_leases(memcached_store *be, const char *k, list *l)
{
	if (l->n == 0)
		return 0;
	char(*names)[320] = calloc(l->n, sizeof *names);
	const char **keys = calloc(l->n, sizeof *keys);
	size_t *lens = calloc(l->n, sizeof *lens);
	int err = 0;
	if (!names || !keys || !lens) {
		err = dlock_sys_oom();
		goto out;
	}
	for (size_t i = 0; i < l->n; i++) {
		lease_key(k, l->e[i].owner, names[i], sizeof names[i]);
		keys[i] = names[i];
		lens[i] = strlen(names[i]);
		l->e[i].live = 0;
	}
	if ((err = arm(be, "get leases")))
		goto out;
	memcached_return_t rc = memcached_mget(be->mc, keys, lens, l->n);
	if (rc != MEMCACHED_SUCCESS) {
		err = mc_error(be, rc, "get leases");
		goto out;
	}
	memcached_result_st *res;
	while ((res = fetch(be, &rc))) {
		const char *key = memcached_result_key_value(res);
		size_t kl = memcached_result_key_length(res);
		for (size_t i = 0; i < l->n; i++)
			if (lens[i] == kl && memcmp(names[i], key, kl) == 0)
				l->e[i].live = 1;
		memcached_result_free(res);
	}
	if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND)
		err = mc_error(be, rc, "get leases");
out:
	free(names);
	free(keys);
	free(lens);
	return err;
}

/* Write the list back: add when it was absent, else cas. *raced = 1 when
 * someone changed it since we read it (the caller starts over). */
static int write_list(memcached_store *be, const char *k, const list *l, int found, uint64_t cas, int *raced)
{
	size_t len;
	int err = arm(be, found ? "cas" : "add");
	if (err)
		return err;
	char *v = list_format(l, &len);
	if (!v)
		return dlock_sys_oom();
	memcached_return_t rc = found ? memcached_cas(be->mc, k, strlen(k), v, len, tidy_exptime(l), 0, cas)
				      : memcached_add(be->mc, k, strlen(k), v, len, tidy_exptime(l), 0);
	free(v);
	*raced = 0;
	if (rc == MEMCACHED_SUCCESS || rc == MEMCACHED_STORED)
		return 0;
	if (rc == MEMCACHED_DATA_EXISTS || rc == MEMCACHED_NOTFOUND || rc == MEMCACHED_NOTSTORED) {
		*raced = 1;
		return 0;
	}
	return mc_error(be, rc, found ? "cas" : "add");
}

/* The lease key's value is what status shows: "<client wall ms at set> <ttl ms>". */
static int set_lease(memcached_store *be, const char *lk, int64_t ttl_ms)
{
	char v[64];
	int n = snprintf(v, sizeof v, "%" PRId64 " %" PRId64, dlock_wall_ms(), ttl_ms);
	int err = arm(be, "set lease");
	if (err)
		return err;
	memcached_return_t rc = memcached_set(be->mc, lk, strlen(lk), v, (size_t)n, lease_s(ttl_ms), 0);
	return rc == MEMCACHED_SUCCESS ? 0 : mc_error(be, rc, "set lease");
}

/* Refresh our own lease key if it still exists (see mc_renew); *gone = 1 if not. */
static int refresh_lease(memcached_store *be, const char *lk, int64_t ttl_ms, int *gone)
{
	char v[64];
	int n = snprintf(v, sizeof v, "%" PRId64 " %" PRId64, dlock_wall_ms(), ttl_ms);
	*gone = 0;
	int err = arm(be, "replace lease");
	if (err)
		return err;
	memcached_return_t rc = memcached_replace(be->mc, lk, strlen(lk), v, (size_t)n, lease_s(ttl_ms), 0);
	if (rc == MEMCACHED_SUCCESS)
		return 0;
	if (rc == MEMCACHED_NOTSTORED || rc == MEMCACHED_NOTFOUND) {
		*gone = 1;
		return 0;
	}
	return mc_error(be, rc, "replace lease");
}

/*
 * The next fence: incr K/f, creating it on first use. It starts at the
 * client's wall clock in microseconds rather than 1, so that a counter lost
 * to a restart, eviction or flush_all most likely restarts above every fence
 * granted before (not a guarantee: see the docs).
 */
static int next_fence(memcached_store *be, const char *k, uint64_t *fence)
{
	char fk[320];
	snprintf(fk, sizeof fk, "%s/f", k);
	for (int i = 0; i < 5; i++) {
		uint64_t v = 0;
		int err = arm(be, "incr fence");
		if (err)
			return err;
		memcached_return_t rc = memcached_increment(be->mc, fk, strlen(fk), 1, &v);
		if (rc == MEMCACHED_SUCCESS) {
			*fence = v;
			return 0;
		}
		if (rc != MEMCACHED_NOTFOUND)
			return mc_error(be, rc, "incr fence");
		char init[32];
		uint64_t start = (uint64_t)dlock_wall_ms() * 1000;
		int n = snprintf(init, sizeof init, "%" PRIu64, start);
		if ((err = arm(be, "add fence")))
			return err;
		rc = memcached_add(be->mc, fk, strlen(fk), init, (size_t)n, 0, 0);
		if (rc == MEMCACHED_SUCCESS) {
			*fence = start;
			return 0;
		}
		if (rc != MEMCACHED_NOTSTORED && rc != MEMCACHED_DATA_EXISTS)
			return mc_error(be, rc, "add fence");
	}
	return dlock_error_set(DLOCK_ESTORE, KIND, NULL, "fence counter keeps vanishing");
}

/* ----------------------------------------------------------------- rules */

static entry *find(list *l, const char *owner, char kind)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->e[i].live && l->e[i].kind == kind && strcmp(l->e[i].owner, owner) == 0)
			return &l->e[i];
	return NULL;
}

/* The same rules as the PostgreSQL table mode: the mode must match the
 * holders', the permits rule (holders + 1 <= the smallest permits among the
 * holders and the caller: a mutex holder admits nobody), a waiting writer
 * blocks new readers, earlier fair waiters first. */
static int may_grant(list *l, const dlock_request *req)
{
	int mode = req->mode == DLOCK_SHARED;
	unsigned permits = req->permits;
	unsigned n = 0, bad = 0, writers_ahead = 0, fair_ahead = 0;
	entry *me = find(l, req->owner, 'Q');
	for (size_t i = 0; i < l->n; i++) {
		entry *e = &l->e[i];
		if (!e->live)
			continue;
		if (e->kind == 'H') {
			n++;
			if (e->mode != mode)
				bad++;
			else if (mode == 0 && e->permits < permits)
				permits = e->permits < 1 ? 1 : e->permits;
		} else if (e != me && (!me || e->seq < me->seq)) {
			writers_ahead += e->mode == 0;
			fair_ahead += e->fair != 0;
		}
	}
	if (bad)
		return 0;
	if (mode == 1)
		return writers_ahead == 0;
	return n < permits && fair_ahead < permits - n;
}

/* Waiters ahead of q in the queue (all, when q is NULL: a first try). */
static int64_t waiters_ahead(const list *l, const entry *q)
{
	int64_t n = 0;
	for (size_t i = 0; i < l->n; i++) {
		const entry *e = &l->e[i];
		n += e->live && e->kind == 'Q' && e != q && (!q || e->seq < q->seq);
	}
	return n;
}

/* ---------------------------------------------------------------- methods */

static int mc_acquire(dlock_backend *base, const dlock_request *req, dlock_grant *out)
{
	memcached_store *be = (memcached_store *)base;
	char k[MAX_ENCODED + 64], lk[320];
	be->deadline = req->deadline_ms;
	be->dropped = 0;
	base_key(be, req->name, k, sizeof k);
	lease_key(k, req->owner, lk, sizeof lk);
	/* memcached cannot tell how long a key has left, nor wake anyone: a fair
	 * waiter is told how soon to look again by its place in the queue */
	for (int attempt = 0; attempt < CAS_TRIES; attempt++) {
		list l;
		uint64_t cas = 0;
		int found = 0, raced = 0;
		int rc = read_list(be, k, &l, &cas, &found);
		if (rc)
			return rc;
		if ((rc = check_leases(be, k, &l))) {
			list_free(&l);
			return rc;
		}
		entry *h = find(&l, req->owner, 'H');
		if (h) {
			/* Already ours (a try whose reply was lost): keep that grant and
			 * refresh its lease, unless the lease ended since we read it (a
			 * set would revive a hold someone may have pruned): read again. */
			uint64_t f = h->fence;
			int gone = 0;
			list_free(&l);
			if ((rc = refresh_lease(be, lk, req->ttl_ms, &gone)) != 0)
				return rc;
			if (gone)
				continue;
			out->fence = f;
			return 0;
		}
		if (may_grant(&l, req)) {
			entry *q = find(&l, req->owner, 'Q');
			if (q)
				q->live = 0;
			/* The lease key exists before the list names us: a listed holder
			 * without one would be pruned as dead. */
			uint64_t f = 0;
			if ((rc = set_lease(be, lk, req->ttl_ms)) || (rc = next_fence(be, k, &f))) {
				list_free(&l);
				return rc;
			}
			entry *e = list_push(&l);
			if (!e) {
				list_free(&l);
				return dlock_sys_oom();
			}
			e->kind = 'H';
			e->live = 1;
			snprintf(e->owner, sizeof e->owner, "%s", req->owner);
			e->mode = req->mode == DLOCK_SHARED;
			e->permits = req->permits;
			e->fence = f;
			e->pid = req->pid;
			snprintf(e->host, sizeof e->host, "%s", req->host ? req->host : "");
			for (char *p = e->host; *p; p++)
				if (*p == ' ' || *p == '\n')
					*p = '_';
			rc = write_list(be, k, &l, found, cas, &raced);
			list_free(&l);
			if (rc)
				return rc;
			if (!raced) {
				out->fence = f;
				return 0;
			}
			continue;
		}
		if (!req->waiting) {
			list_free(&l);
			return DLOCK_ELOCKED;
		}
		/* Queue (or stay queued): our lease key says we are still waiting. */
		int64_t qttl = req->queue_ttl_ms;
		if ((rc = set_lease(be, lk, qttl))) {
			list_free(&l);
			return rc;
		}
		entry *q = find(&l, req->owner, 'Q');
		if (req->fair) /* memcached tells no one of a release: look again by our place */
			out->retry_ms = dlock_sys_poll_hint(waiters_ahead(&l, q), 2);
		if (q && q->mode == (req->mode == DLOCK_SHARED) && q->fair == (req->fair != 0)) {
			list_free(&l);
			return DLOCK_ELOCKED;
		}
		if (!q) {
			q = list_push(&l);
			if (!q) {
				list_free(&l);
				return dlock_sys_oom();
			}
			q->kind = 'Q';
			q->live = 1;
			q->seq = l.next_seq++;
			snprintf(q->owner, sizeof q->owner, "%s", req->owner);
		}
		q->mode = req->mode == DLOCK_SHARED;
		q->fair = req->fair != 0;
		rc = write_list(be, k, &l, found, cas, &raced);
		list_free(&l);
		if (rc)
			return rc;
		if (!raced)
			return DLOCK_ELOCKED;
	}
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
			       "lock '%s': too much contention on the holder list (%d cas attempts)", req->name,
			       CAS_TRIES);
}

/* Drop req->owner's entry of `kind` from the list; *was_live: the entry and
 * its lease key existed. */
static int remove_entry(memcached_store *be, const dlock_request *req, char kind, int *was_live)
{
	char k[MAX_ENCODED + 64], lk[320];
	base_key(be, req->name, k, sizeof k);
	lease_key(k, req->owner, lk, sizeof lk);
	*was_live = 0;
	for (int attempt = 0; attempt < CAS_TRIES; attempt++) {
		list l;
		uint64_t cas = 0;
		int found = 0, raced = 0;
		int rc = read_list(be, k, &l, &cas, &found);
		if (rc)
			return rc;
		if (!found)
			break;
		if ((rc = check_leases(be, k, &l))) {
			list_free(&l);
			return rc;
		}
		int listed = 0;
		for (size_t i = 0; i < l.n; i++) {
			if (l.e[i].kind == kind && strcmp(l.e[i].owner, req->owner) == 0) {
				listed = 1;
				*was_live = l.e[i].live;
				l.e[i].live = 0;
			}
		}
		if (!listed) {
			list_free(&l);
			break;
		}
		rc = write_list(be, k, &l, 1, cas, &raced);
		list_free(&l);
		if (rc)
			return rc;
		if (!raced)
			break;
	}
	/* Our own lease key: no one else ever writes it, so an unconditional
	 * delete cannot touch another holder. */
	int err = arm(be, "delete lease");
	if (err)
		return err;
	memcached_return_t rc = memcached_delete(be->mc, lk, strlen(lk), 0);
	if (rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND)
		return mc_error(be, rc, "delete lease");
	return 0;
}

static int mc_release(dlock_backend *base, const dlock_request *req)
{
	int live = 0;
	((memcached_store *)base)->deadline = req->deadline_ms;
	int rc = remove_entry((memcached_store *)base, req, 'H', &live);
	if (rc)
		return rc;
	return live ? 0 : DLOCK_ENOTHELD;
}

static int mc_cancel(dlock_backend *base, const dlock_request *req)
{
	int live = 0;
	memcached_store *be = (memcached_store *)base;
	/* The core cancels when a wait ends. If the last try lost the connection
	 * (it timed out), a reconnect now would overrun the caller's wait on a
	 * link that just failed: leave the queue entry to expire by itself (its
	 * lease key lives queue_ttl_ms, as a crashed waiter's does). */
	if (be->dropped)
		return 0;
	be->deadline = req->deadline_ms;
	return remove_entry((memcached_store *)base, req, 'Q', &live);
}

/*
 * Renew = replace of each hold's own lease key: replace stores only if the
 * key is still there (NOT_STORED once it expired), so a lease that ended can
 * never be revived; nothing but the owner ever writes that key. A batch is
 * one round trip whatever its size, not one per lock: on a connection of
 * its own whose stores ask for no reply and wait in a buffer (libmemcached
 * reconnects when those behaviours change, so they are set once, on a
 * handle kept for this), the replaces are buffered, then one multi-get of
 * the same keys flushes them and asks — one write, the server answers a
 * connection's commands in order — which exist with the value just
 * written: those were renewed; a missing key had expired (its replace
 * stored nothing). The same multi-get reads each hold's list and fence key:
 * read, they stay recently used (memory pressure evicts colder items first:
 * a list is written only at grants and releases), and a hold whose list no
 * longer names it — evicted, or rewritten without it — is reported not ours
 * (the core signals the loss), though its lease key was renewed.
 */
/* Whether the holder list value v (of len bytes) lists `owner` as a holder. */
static bool lists_holder(const char *v, size_t len, const char *owner)
{
	list l;
	if (list_parse(&l, v, len) != 0)
		return false;
	bool found = false;
	for (size_t i = 0; i < l.n && !found; i++)
		found = l.e[i].kind == 'H' && strcmp(l.e[i].owner, owner) == 0;
	list_free(&l);
	return found;
}

static void fence_key(const char *k, char *out, size_t cap)
{
	snprintf(out, cap, "%s/f", k);
}

static int renew_one(memcached_store *be, const dlock_request *req, int *result)
{
	char k[MAX_ENCODED + 64], lk[320], fk[320];
	base_key(be, req->name, k, sizeof k);
	lease_key(k, req->owner, lk, sizeof lk);
	int gone = 0;
	*result = refresh_lease(be, lk, req->ttl_ms, &gone);
	if (*result == 0 && gone)
		*result = DLOCK_ENOTHELD;
	if (*result != 0)
		return 0;
	/* The other keys of the hold: read (which keeps them recently used, so
	 * that memory pressure evicts colder keys first), and the holder list
	 * must still list us — evicted or rewritten without us, the lock may
	 * already be someone else's. */
	fence_key(k, fk, sizeof fk);
	const char *keys[2] = { k, fk };
	size_t lens[2] = { strlen(k), strlen(fk) };
	int err = arm(be, "renew (get list)");
	memcached_return_t rc = err ? MEMCACHED_SUCCESS : memcached_mget(be->mc, keys, lens, 2);
	if (!err && rc != MEMCACHED_SUCCESS)
		err = mc_error(be, rc, "renew (get list)");
	bool listed = false;
	memcached_result_st *res;
	while (!err && (res = fetch(be, &rc))) {
		if (memcached_result_key_length(res) == lens[0] && !memcmp(memcached_result_key_value(res), k, lens[0]))
			listed = lists_holder(memcached_result_value(res), memcached_result_length(res), req->owner);
		memcached_result_free(res);
	}
	if (!err && rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND)
		err = mc_error(be, rc, "renew (get list)");
	*result = err ? err : listed ? 0 : DLOCK_ENOTHELD;
	return 0;
}

static int mc_renew(dlock_backend *base, const dlock_request *const *reqs, size_t n, int *results)
{
	memcached_store *be = (memcached_store *)base;
	if (n == 0)
		return 0;
	be->deadline = reqs[0]->deadline_ms;
	/* One renewal (an extend) too goes as a batch: one round trip for its
	 * lease, its list and its fence key. */
	if (!be->rmc) {
		be->rmc = memcached_clone(NULL, be->mc);
		if (!be->rmc)
			return dlock_sys_oom();
		memcached_behavior_set(be->rmc, MEMCACHED_BEHAVIOR_NOREPLY, 1);
		memcached_behavior_set(be->rmc, MEMCACHED_BEHAVIOR_BUFFER_REQUESTS, 1);
	}
	/* the helpers (arm, fetch, mc_error) act on be->mc: the batch's handle for now */
	memcached_st *main_mc = be->mc;
	int main_dropped = be->dropped; /* about the main connection: kept */
	be->mc = be->rmc;
	/* lease keys [0, n), holder lists [n, 2n), fence keys [2n, 3n) */
	char(*keys)[320] = malloc(3 * n * sizeof(*keys));
	const char **kp = malloc(3 * n * sizeof(*kp));
	size_t *kl = malloc(3 * n * sizeof(*kl));
	bool *listed = calloc(n, sizeof(*listed));
	char val[64];
	int vn = snprintf(val, sizeof val, "%" PRId64 " %" PRId64, dlock_wall_ms(), reqs[0]->ttl_ms);
	int rc = keys && kp && kl && listed ? arm(be, "renew") : dlock_sys_oom();
	memcached_return_t mrc = MEMCACHED_SUCCESS;
	if (!rc) {
		for (size_t i = 0; i < n; i++) {
			char k[MAX_ENCODED + 64];
			base_key(be, reqs[i]->name, k, sizeof k);
			lease_key(k, reqs[i]->owner, keys[i], sizeof keys[i]);
			snprintf(keys[n + i], sizeof keys[n + i], "%s", k);
			fence_key(k, keys[2 * n + i], sizeof keys[2 * n + i]);
			for (size_t j = i; j < 3 * n; j += n) {
				kp[j] = keys[j];
				kl[j] = strlen(keys[j]);
			}
			results[i] = DLOCK_ENOTHELD; /* until the multi-get shows our value */
			/* one ttl for the batch (the core batches holds of one ttl; a
			 * different one is renewed on its own below) */
			if (reqs[i]->ttl_ms != reqs[0]->ttl_ms)
				continue;
			mrc = memcached_replace(be->mc, keys[i], kl[i], val, (size_t)vn, lease_s(reqs[0]->ttl_ms), 0);
			if (mrc != MEMCACHED_SUCCESS && mrc != MEMCACHED_BUFFERED)
				break;
		}
		if (mrc != MEMCACHED_SUCCESS && mrc != MEMCACHED_BUFFERED)
			rc = mc_error(be, mrc, "renew (replace)");
	}
	if (!rc && (rc = arm(be, "renew")) == 0) {
		/* the lists and fence keys too: read, they stay recently used
		 * (memory pressure evicts colder keys first), and each list must
		 * still name its holder */
		mrc = memcached_mget(be->mc, kp, kl, 3 * n);
		if (mrc != MEMCACHED_SUCCESS)
			rc = mc_error(be, mrc, "renew (get)");
	}
	/* hits come back in the order asked for (misses skipped): one cursor
	 * over the 3n keys finds each at once (a key asked twice, twice) */
	size_t at = 0, nk = 3 * n;
	while (!rc) {
		memcached_result_st *res = fetch(be, &mrc);
		if (!res) {
			if (mrc != MEMCACHED_END && mrc != MEMCACHED_NOTFOUND && mrc != MEMCACHED_SUCCESS)
				rc = mc_error(be, mrc, "renew (get)");
			break;
		}
		const char *key = memcached_result_key_value(res);
		size_t klen = memcached_result_key_length(res);
		size_t hit = nk;
		for (size_t tried = 0; tried < nk; tried++, at = (at + 1) % nk) {
			if (kl[at] == klen && !memcmp(keys[at], key, klen)) {
				hit = at;
				at = (at + 1) % nk;
				break;
			}
		}
		if (hit < n) {
			bool ours = memcached_result_length(res) == (size_t)vn &&
				    !memcmp(memcached_result_value(res), val, (size_t)vn);
			if (ours && reqs[hit]->ttl_ms == reqs[0]->ttl_ms)
				results[hit] = 0;
		} else if (hit < 2 * n) {
			listed[hit - n] = lists_holder(memcached_result_value(res), memcached_result_length(res),
						       reqs[hit - n]->owner);
		}
		memcached_result_free(res);
	}
	be->mc = main_mc;
	be->dropped = main_dropped;
	for (size_t i = 0; !rc && i < n; i++) {
		if (reqs[i]->ttl_ms != reqs[0]->ttl_ms)
			renew_one(be, reqs[i], &results[i]);
		else if (results[i] == 0 && !listed[i])
			results[i] = DLOCK_ENOTHELD; /* renewed a lease the list no longer names */
	}
	free(keys);
	free(kp);
	free(kl);
	free(listed);
	return rc;
}

static int mc_status(dlock_backend *base, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count)
{
	memcached_store *be = (memcached_store *)base;
	be->deadline = dlock_clock_ms() + be->request_timeout_ms;
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	int rc = 0;
	for (size_t i = 0; i < nnames && !rc; i++) {
		dlock_lock_status *s = dlock_sys_status_add(&st, &cnt);
		if (!s || !(s->name = dlock_sys_strdup(names[i]))) {
			rc = DLOCK_ENOMEM;
			break;
		}
		s->permits = 1;
		char k[MAX_ENCODED + 64];
		base_key(be, names[i], k, sizeof k);
		list l;
		uint64_t cas;
		int found = 0;
		if ((rc = read_list(be, k, &l, &cas, &found)))
			break;
		if ((rc = check_leases(be, k, &l))) {
			list_free(&l);
			break;
		}
		for (size_t j = 0; j < l.n && !rc; j++) {
			entry *e = &l.e[j];
			if (!e->live)
				continue;
			if (e->kind == 'Q') {
				s->waiters++;
				continue;
			}
			dlock_holder *h = dlock_sys_status_add_holder(s);
			if (!h || !(h->owner = dlock_sys_strdup(e->owner)) || !(h->host = dlock_sys_strdup(e->host))) {
				rc = DLOCK_ENOMEM;
				break;
			}
			h->pid = e->pid;
			h->mode = e->mode ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
			h->fence = e->fence;
			if (e->fence > s->last_fence)
				s->last_fence = e->fence;
			if (!e->mode && e->permits > 1)
				s->permits = e->permits;
			/* memcached (text protocol) cannot report a key's expiry: estimate
			 * from the holder's own note, on this client's clock. */
			h->ttl_left_ms = -1;
			char lk[320];
			lease_key(k, e->owner, lk, sizeof lk);
			size_t vl = 0;
			uint32_t fl = 0;
			memcached_return_t mrc;
			if ((rc = arm(be, "get lease")))
				break;
			char *v = memcached_get(be->mc, lk, strlen(lk), &vl, &fl, &mrc);
			if (!v && mrc != MEMCACHED_NOTFOUND && mrc != MEMCACHED_SUCCESS) {
				rc = mc_error(be, mrc, "get lease");
				break;
			}
			long long at = 0, ttl = 0;
			if (v && sscanf(v, "%lld %lld", &at, &ttl) == 2) {
				int64_t left = at + ttl - dlock_wall_ms();
				h->ttl_left_ms = left > 0 ? left : 0;
			}
			free(v);
		}
		list_free(&l);
	}
	if (rc) {
		dlock_status_free(st, cnt);
		return rc;
	}
	*out = st;
	*count = cnt;
	return 0;
}

static void mc_close(dlock_backend *base)
{
	memcached_store *be = (memcached_store *)base;
	if (!be)
		return;
	if (be->mc)
		memcached_free(be->mc);
	if (be->rmc)
		memcached_free(be->rmc);
	free(be->ns);
	free(be);
}

/* Memcached cannot enumerate its keys: no list. */
static const dlock_backend_methods memcached_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.acquire = mc_acquire,
	.release = mc_release,
	.renew = mc_renew,
	.cancel = mc_cancel,
	.status = mc_status,
	.close = mc_close,
};

int dlock__memcached_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	if (uri->user || uri->password)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "memcached: user/password are not supported (SASL is not built in)");
	if (uri->path && *uri->path && strcmp(uri->path, "/") != 0)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "memcached: unexpected path '%s' (use memcached://host:port)", uri->path);
	/* no options of its own: an unknown one is a usage error, before any connection */
	int rc = dlock_sys_uri_check_unused(uri);
	if (rc)
		return rc;
	dlock_hostport *hp = NULL;
	size_t nh = 0;
	if ((rc = dlock_uri_hosts(uri, 11211, &hp, &nh)) != 0)
		return rc;
	if (nh != 1) {
		dlock_free(hp);
		/* A key's server would change when the ring changes: no lock survives that. */
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "memcached: give exactly one host:port (locks cannot be spread "
				       "over several servers safely)");
	}
	memcached_store *be = calloc(1, sizeof *be);
	if (!be) {
		dlock_free(hp);
		return dlock_sys_oom();
	}
	dlock_backend_init(&be->base, &memcached_methods);
	snprintf(be->hostport, sizeof be->hostport, "%s:%d", hp[0].host, hp[0].port);
	be->ns = dlock_sys_strdup(uri->prefix ? uri->prefix : "dlock");
	be->mc = memcached_create(NULL);
	if (!be->ns || !be->mc) {
		dlock_free(hp);
		mc_close(&be->base);
		return dlock_sys_oom();
	}
	int64_t tmo = uri->connect_timeout_ms;
	be->deadline = dlock_clock_ms() + tmo;
	be->request_timeout_ms = uri->request_timeout_ms;
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_SUPPORT_CAS, 1);
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
	/* Every socket wait is bounded by POLL_TIMEOUT/CONNECT_TIMEOUT, cut to the
	 * time left before each call (arm). libmemcached's sockets are non-blocking,
	 * so RCV/SND_TIMEOUT (SO_RCVTIMEO) never bound anything: not set. Keepalive
	 * ends a connection to a host that went away; libmemcached gives no access
	 * to its socket, so no TCP_USER_TIMEOUT. */
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_TCP_KEEPALIVE, 1);
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_TCP_KEEPIDLE, (uint64_t)((tmo + 999) / 1000));
	/* Try the one server again at once after a failure (never "mark dead"). */
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 0);
	memcached_behavior_set(be->mc, MEMCACHED_BEHAVIOR_DEAD_TIMEOUT, 0);
	/* libmemcached resolves with a blocking getaddrinfo: it gets the address,
	 * resolved here by the open's deadline, once (its reconnects reuse it) */
	dlock_sys_addrs ad;
	if ((rc = dlock_sys_resolve(&ad, hp[0].host, be->deadline, KIND)) != 0) {
		dlock_free(hp);
		mc_close(&be->base);
		return rc;
	}
	memcached_return_t mrc = memcached_server_add(be->mc, ad.n ? ad.addr[0] : hp[0].host, (in_port_t)hp[0].port);
	dlock_free(hp);
	if (mrc != MEMCACHED_SUCCESS) {
		rc = mc_error(be, mrc, "add server");
		mc_close(&be->base);
		return rc;
	}
	/* Reach the server now so that open reports an unreachable store. */
	size_t vl;
	uint32_t fl;
	if ((rc = arm(be, "connect")) != 0) {
		mc_close(&be->base);
		return rc;
	}
	char *v = memcached_get(be->mc, "dlock:ping", 10, &vl, &fl, &mrc);
	free(v);
	if (mrc != MEMCACHED_SUCCESS && mrc != MEMCACHED_NOTFOUND) {
		rc = mc_error(be, mrc, "memcached connect");
		mc_close(&be->base);
		return rc;
	}
	*out = &be->base;
	return 0;
}
