/*
 * The Redis Cluster store (redis+cluster://, rediss+cluster://): the Redis
 * store's scripts and key layout (redis.h), each lock on the master that owns
 * its hash tag's slot. This file adds only the routing: the slot map (CLUSTER
 * SLOTS), MOVED and ASK, TRYAGAIN and CLUSTERDOWN, renewals batched per node,
 * and wake-ups over sharded pub/sub (SSUBSCRIBE/SPUBLISH: a release is heard
 * on the shard that owns the lock, not broadcast to the whole cluster).
 * Guarantees and what a failover can lose: docs/stores/redis.md.
 */
#include "redis.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIND "redis+cluster"
#define SLOTS 16384
#define NODE_MAX 128       /* addresses ever seen by one handle (masters and replicas) */
#define REMAP_MAX 64
#define ADDR_MAX 300       /* host:port */
#define CHECK_MS 250       /* a node silent this long: is it still the slot's master? */

typedef struct cnode {
	redisContext *c;       /* non-blocking; NULL: not connected */
	char server_id[48];    /* run_id (fence guard), read when connecting */
} cnode;

typedef struct cluster_store {
	dlock_backend base;
	dlock__rserver *seeds; /* from the URI: where to ask for the slot map */
	size_t nseeds;
	dlock__rserver node[NODE_MAX]; /* every address met; [i].port == 0: unused.
				  Written only through dlock__rnotify_moved (the
				  notifier reads them under its lock). */
	cnode conn[NODE_MAX];
	size_t nnodes;
	uint16_t slot[SLOTS];  /* master of each slot: an index into node; NO_NODE: unknown */
	int64_t map_at;        /* when the map was last read */
	struct {
		char from[ADDR_MAX], to[ADDR_MAX];
	} remap[REMAP_MAX];
	size_t nremap;
	char *user, *password, *prefix;
	char *text[DLOCK__RS_COUNT]; /* the scripts, publishing with SPUBLISH */
	char sha[DLOCK__RS_COUNT][41];
	dlock__rnotify *nt;
	int wait_replicas, fence_replicas;
	bool stale;            /* a node timed out: read the map before the next request */
	bool silent;           /* the last exec met a node that took a request and said nothing */
	bool retried;          /* the last exec sent its command a second time */
	int busy;              /* the last exec failed while the slot was in transition: BUSY_* */
	bool unknown;          /* the last exec sent a request whose reply it never read */
} cluster_store;

/* Why the cluster, though it answered, did not serve a slot (exec). */
enum { BUSY_NONE, BUSY_MIGRATING, BUSY_FAILOVER };

static cluster_store *CS(dlock_backend *be)
{
	return (cluster_store *)be;
}

/* ---- slots ---- */

/* CRC16-CCITT (XModem), the hash Redis Cluster keys by. */
static uint16_t crc16(const char *p, size_t n)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)((unsigned char)p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
	}
	return crc;
}

/* The slot of a key: of its hash tag (the text between the first '{' and the
 * next '}', when not empty), else of the whole key. */
static int key_slot(const char *k, size_t n)
{
	const char *open = memchr(k, '{', n);
	if (open) {
		const char *close = memchr(open + 1, '}', n - (size_t)(open + 1 - k));
		if (close && close > open + 1)
			return crc16(open + 1, (size_t)(close - open - 1)) & (SLOTS - 1);
	}
	return crc16(k, n) & (SLOTS - 1);
}

#define NO_NODE UINT16_MAX /* above NODE_MAX */

static int slot_node(const cluster_store *s, int slot)
{
	return s->slot[slot] == NO_NODE ? -1 : s->slot[slot];
}

static void slot_set(cluster_store *s, int slot, int node)
{
	s->slot[slot] = (uint16_t)node;
}

/* The notifier's home of a channel: the master of its slot (-2: unknown). */
static int channel_home(void *arg, const char *channel)
{
	int n = slot_node(arg, key_slot(channel, strlen(channel)));
	return n < 0 ? -2 : n;
}

/* ---- nodes ---- */

/* An address as the cluster announces it, through the remap option (a
 * cluster behind NAT or a proxy announces addresses the client cannot use). */
static void remap(const cluster_store *s, char *host, size_t hcap, int *port)
{
	char a[ADDR_MAX];
	snprintf(a, sizeof(a), "%s:%d", host, *port);
	for (size_t i = 0; i < s->nremap; i++) {
		if (strcmp(a, s->remap[i].from) != 0)
			continue;
		const char *colon = strrchr(s->remap[i].to, ':');
		snprintf(host, hcap, "%.*s", (int)(colon - s->remap[i].to), s->remap[i].to);
		*port = atoi(colon + 1);
		return;
	}
}

/* The index of node host:port (after remap), added if new. @return -1 when
 * the table is full. */
static int node_find(cluster_store *s, const char *host_in, int port)
{
	char host[256];
	snprintf(host, sizeof(host), "%s", host_in);
	remap(s, host, sizeof(host), &port);
	for (size_t i = 0; i < s->nnodes; i++)
		if (s->node[i].port == port && !strcmp(s->node[i].host, host))
			return (int)i;
	if (s->nnodes == NODE_MAX)
		return -1;
	size_t i = s->nnodes++;
	dlock__rnotify_moved(s->nt, i, host, port);
	return (int)i;
}

static void node_drop(cluster_store *s, int i)
{
	if (s->conn[i].c)
		dlock__rfree(s->conn[i].c);
	s->conn[i].c = NULL;
	s->conn[i].server_id[0] = 0;
}

/* Connect node i by the deadline. */
static int node_connect(cluster_store *s, int i, int64_t deadline)
{
	return s->conn[i].c ? 0 : dlock__rconnect_by(&s->conn[i].c, &s->node[i], KIND, deadline);
}

/* The fence guard names the node that grants: its run_id (new for every
 * process), read once per connection, when the first acquire needs it; the
 * script adds the node's master_replid, new on every promotion (fence.lua). */
static int node_server_id(cluster_store *s, int i, int64_t deadline)
{
	if (s->conn[i].server_id[0])
		return 0;
	int rc = dlock__rrun_id(s->conn[i].c, &s->node[i], KIND, deadline, s->conn[i].server_id,
				sizeof(s->conn[i].server_id));
	if (rc)
		node_drop(s, i);
	return rc;
}

/* ---- the slot map ---- */

/* Read CLUSTER SLOTS from one node into the map. @return 0; an error. */
static int map_from(cluster_store *s, int i, int64_t deadline)
{
	int rc = node_connect(s, i, deadline);
	if (rc)
		return rc;
	redisReply *r = NULL;
	redisAppendCommand(s->conn[i].c, "CLUSTER SLOTS");
	if ((rc = dlock__rread_by(s->conn[i].c, &s->node[i], KIND, deadline, &r)) != 0) {
		node_drop(s, i);
		return rc;
	}
	if (r->type == REDIS_REPLY_ERROR) {
		rc = dlock__rreply_error(r, &s->node[i], KIND);
		freeReplyObject(r);
		return rc;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
		freeReplyObject(r);
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "CLUSTERDOWN",
				       "%s:%d serves no slots (not a cluster?)", s->node[i].host, s->node[i].port);
	}
	char asked[256];
	snprintf(asked, sizeof(asked), "%s", s->node[i].host);
	memset(s->slot, 0xff, sizeof(s->slot)); /* NO_NODE */
	for (size_t k = 0; k < r->elements; k++) {
		const redisReply *e = r->element[k];
		long long lo, hi, port;
		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || dlock__rreply_int(e->element[0], &lo) ||
		    dlock__rreply_int(e->element[1], &hi) || e->element[2]->type != REDIS_REPLY_ARRAY ||
		    e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
		    dlock__rreply_int(e->element[2]->element[1], &port) || lo < 0 || hi >= SLOTS || lo > hi ||
		    port <= 0 || port > 65535)
			continue;
		/* an empty host: the node does not know its address; it is the one asked */
		const char *host = e->element[2]->element[0]->len ? e->element[2]->element[0]->str : asked;
		int m = node_find(s, host, (int)port);
		if (m < 0)
			break;
		for (long long sl = lo; sl <= hi; sl++)
			slot_set(s, (int)sl, m);
	}
	freeReplyObject(r);
	s->map_at = dlock_clock_ms();
	dlock__rnotify_rehome(s->nt);
	return 0;
}

/*
 * Read the slot map again: from the nodes we are connected to first (no
 * connect to wait for), then the seeds, then every other node met, each with
 * a fair share of the time left (one dead node does not use it all). Not
 * from node `skip` (-1: none): one whose reply to a request is still out.
 */
static int map_refresh_skip(cluster_store *s, int64_t deadline, int skip)
{
	int rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "no node of the cluster answered CLUSTER SLOTS");
	int order[NODE_MAX + 64];
	size_t n = 0;
	for (size_t i = 0; i < s->nnodes; i++)
		if (s->conn[i].c && (int)i != skip)
			order[n++] = (int)i;
	for (size_t i = 0; i < s->nseeds && n < sizeof(order) / sizeof(order[0]); i++) {
		int m = node_find(s, s->seeds[i].host, s->seeds[i].port);
		if (m >= 0 && !s->conn[m].c && m != skip)
			order[n++] = m;
	}
	for (size_t i = 0; i < s->nnodes && n < sizeof(order) / sizeof(order[0]); i++) {
		bool seen = (int)i == skip;
		for (size_t k = 0; k < n && !seen; k++)
			seen = order[k] == (int)i;
		if (!seen)
			order[n++] = (int)i;
	}
	for (size_t k = 0; k < n; k++) {
		int64_t left = dlock__rms_left(deadline);
		if (left <= 0)
			break;
		int64_t share = left / (int64_t)(n - k);
		if (share < 100)
			share = left < 100 ? left : 100;
		if ((rc = map_from(s, order[k], dlock_clock_ms() + share)) == 0)
			return 0;
	}
	return rc;
}

static int map_refresh(cluster_store *s, int64_t deadline)
{
	return map_refresh_skip(s, deadline, -1);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the slot and the node (an empty
 * host: the node that answered, `from`, does not know its own). @return the
 * node; -1. */
static int redirect_node(cluster_store *s, const char *err, int *slot, int from)
{
	const char *p = strchr(err, ' ');
	if (!p)
		return -1;
	*slot = atoi(p + 1);
	const char *addr = strchr(p + 1, ' ');
	const char *colon = addr ? strrchr(addr, ':') : NULL;
	if (!colon || *slot < 0 || *slot >= SLOTS)
		return -1;
	char host[256];
	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr - 1), addr + 1);
	if (!host[0])
		snprintf(host, sizeof(host), "%s", s->node[from].host);
	return node_find(s, host, atoi(colon + 1));
}

/* ---- requests ---- */

static bool is_err(const redisReply *r, const char *what)
{
	size_t n = strlen(what);
	return r->type == REDIS_REPLY_ERROR && !strncmp(r->str, what, n) && (r->str[n] == ' ' || !r->str[n]);
}

/* A pause within the deadline (TRYAGAIN, a cluster between masters). */
static void pause_ms(int64_t deadline, int64_t ms)
{
	int64_t left = dlock__rms_left(deadline);
	dlock_sys_sleep_ms(left < ms ? left : ms);
}

/*
 * Run a script on the master of `slot` by the deadline: EVALSHA (EVAL on
 * NOSCRIPT), following MOVED (the map is read again) and ASK (one ASKING
 * request to the node named), waiting out TRYAGAIN (a slot migrating while
 * the lock's keys are split, or not all on the importing node yet) and
 * CLUSTERDOWN (a failover under way), and reading the map again after a
 * broken or refused connection (the node may have failed; a replica takes
 * over). Redirects and waits are bounded by the deadline alone, never by a
 * count: a migration or a failover window is ridden out to the deadline,
 * with a growing pause (5 ms to 100 ms) between rounds the cluster asked us
 * to repeat, and a redirect's text never reaches the caller. A connect to
 * the slot's master gets at most half the time left (at least 250 ms), so
 * that a stopped master leaves time to find its replica promoted. Every
 * script is safe to repeat (see redis.c run_argv); a timed-out request is
 * never repeated and its connection is dropped, and the map is read again
 * before the next request (s->stale); a request unanswered for CHECK_MS
 * while the cluster names another master for its slot goes there. argv[0..1] are filled here.
 * flags: EXEC_SID, the last argument is the node's run_id (fence guard);
 * EXEC_EVAL, send the text at once (the node just said NOSCRIPT). *node gets
 * the node that answered. @return the reply; NULL (*rc). After NULL,
 * s->busy says why when the cluster answered but would not serve the slot
 * in time (BUSY_MIGRATING, BUSY_FAILOVER), and s->unknown whether a request
 * may have been applied without our reading its reply.
 */
enum { EXEC_SID = 1, EXEC_EVAL = 2 };

/* The pause before the next round, then the next pause: 5 ms doubling to
 * 100 ms, with jitter (clients that met the same migration spread out). */
static void backoff_pause(int64_t deadline, int64_t *backoff)
{
	int64_t b = *backoff;
	pause_ms(deadline, b / 2 + (int64_t)(dlock_sys_rand_between(0, b / 2 + 1)));
	*backoff = b * 2 > 100 ? 100 : b * 2;
}

static const char *const busy_what[] = {
	[BUSY_NONE] = "",
	[BUSY_MIGRATING] = "was migrating between masters",
	[BUSY_FAILOVER] = "had no reachable master (failover under way?)",
};

static redisReply *exec(cluster_store *s, int script, int slot, int argc, const char **argv, size_t *lens,
			unsigned flags, int64_t deadline, int *rc, int *node)
{
	bool eval = !s->sha[script][0] || (flags & EXEC_EVAL), with_sid = flags & EXEC_SID;
	int ask = -1, redirects = 0;
	int64_t backoff = 5;
	char why[300] = ""; /* the last connect's failure */
	s->retried = false;
	s->busy = BUSY_NONE;
	s->unknown = false;
	s->silent = false;
	bool sent = false;
	if (s->stale && map_refresh(s, dlock_clock_ms() + dlock__rms_left(deadline) / 2) == 0)
		s->stale = false; /* its replica may have taken over: the map says */
	for (;;) {
		if (dlock__rms_left(deadline) < 3) {
			if (s->busy != BUSY_NONE)
				*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND,
						      s->busy == BUSY_MIGRATING ? "TRYAGAIN" : "CLUSTERDOWN",
						      "timed out: slot %d %s until the deadline%s%s", slot,
						      busy_what[s->busy], why[0] ? "; last: " : "", why);
			else if (why[0])
				*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT", "timed out: slot %d: %s",
						      slot, why);
			else
				*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ETIMEDOUT", "timed out %s (slot %d)",
						      sent ? "following the cluster's redirects"
							   : "before the request was sent",
						      slot);
			return NULL;
		}
		int i = ask >= 0 ? ask : slot_node(s, slot);
		if (i < 0) {
			if ((*rc = map_refresh(s, deadline)) != 0)
				return NULL;
			if ((i = slot_node(s, slot)) < 0) { /* no master for it right now */
				s->busy = BUSY_FAILOVER;
				backoff_pause(deadline, &backoff);
				continue;
			}
		}
		if (!s->conn[i].c) {
			int64_t left = dlock__rms_left(deadline), cap = left / 2 > 250 ? left / 2 : 250;
			if ((*rc = node_connect(s, i, dlock_clock_ms() + (cap < left ? cap : left))) != 0) {
				/* a master gone or stopped: a replica may take over; ask the
				 * cluster again, and come back until the deadline */
				if (*rc != DLOCK_EUNAVAILABLE)
					return NULL;
				snprintf(why, sizeof(why), "%s", dlock_error_last()->message);
				ask = -1;
				if (map_refresh(s, deadline) == 0) {
					s->busy = BUSY_FAILOVER;
					if (slot_node(s, slot) != i)
						continue;
				}
				backoff_pause(deadline, &backoff);
				continue;
			}
		}
		if (with_sid) {
			if ((*rc = node_server_id(s, i, deadline)) != 0) {
				/* a connection that broke since its last use (a node gone) */
				bool timeout = !strcmp(dlock_error_last()->store_code, "ETIMEDOUT");
				s->silent = s->stale = timeout; /* a stopped master: its replica takes over */
				if (timeout || *rc != DLOCK_EUNAVAILABLE || dlock__rms_left(deadline) <= 0)
					return NULL;
				ask = -1;
				if (map_refresh(s, deadline) == 0)
					s->busy = BUSY_FAILOVER;
				backoff_pause(deadline, &backoff);
				continue;
			}
			argv[argc - 1] = s->conn[i].server_id;
			lens[argc - 1] = strlen(s->conn[i].server_id);
		}
		argv[0] = eval ? "EVAL" : "EVALSHA";
		argv[1] = eval ? s->text[script] : s->sha[script];
		lens[0] = strlen(argv[0]);
		lens[1] = strlen(argv[1]);
		if (ask >= 0)
			redisAppendCommand(s->conn[i].c, "ASKING");
		if (redisAppendCommandArgv(s->conn[i].c, argc, argv, lens) != REDIS_OK) {
			node_drop(s, i);
			*rc = dlock_sys_oom();
			return NULL;
		}
		s->retried = sent;
		sent = true;
		redisReply *r = NULL;
		*rc = 0;
		if (ask >= 0 && (*rc = dlock__rread_by(s->conn[i].c, &s->node[i], KIND, deadline, &r)) == 0) {
			freeReplyObject(r); /* +OK */
			r = NULL;
		}
		if (!*rc && ask < 0) {
			/* A node silent for a while (a quarter of the time left, at
			 * most CHECK_MS): does the cluster still name it the slot's
			 * master? A replica promoted in its place (this handle's map
			 * was older than the failover) takes the request now — the
			 * scripts are safe to repeat — instead of after the deadline. */
			int64_t left = dlock__rms_left(deadline), q = left / 4 < CHECK_MS ? left / 4 : CHECK_MS;
			*rc = dlock__rread_by(s->conn[i].c, &s->node[i], KIND, dlock_clock_ms() + q, &r);
			if (*rc && !strcmp(dlock_error_last()->store_code, "ETIMEDOUT") &&
			    dlock__rms_left(deadline) > 0) {
				if (map_refresh_skip(s, dlock_clock_ms() + dlock__rms_left(deadline) / 2, i) == 0 &&
				    slot_node(s, slot) >= 0 && slot_node(s, slot) != i) {
					node_drop(s, i);
					s->unknown = s->silent = true; /* it may apply it if it wakes */
					s->busy = BUSY_FAILOVER;
					continue;
				}
				*rc = dlock__rread_by(s->conn[i].c, &s->node[i], KIND, deadline, &r);
			}
		} else if (!*rc) {
			*rc = dlock__rread_by(s->conn[i].c, &s->node[i], KIND, deadline, &r);
		}
		bool asked = ask >= 0;
		ask = -1;
		if (*rc) {
			bool timeout = !strcmp(dlock_error_last()->store_code, "ETIMEDOUT");
			node_drop(s, i);
			s->unknown = true; /* sent, and no reply read */
			s->silent = s->stale = timeout; /* a stopped master: its replica takes over */
			if (timeout || *rc == DLOCK_ENOMEM || dlock__rms_left(deadline) <= 0)
				return NULL;
			map_refresh(s, deadline); /* the node may be gone: find the slot's master */
			backoff_pause(deadline, &backoff);
			continue;
		}
		if (r->type != REDIS_REPLY_ERROR) {
			*node = i;
			return r;
		}
		int to = -1, sl = slot;
		if (is_err(r, "NOSCRIPT") && !eval) {
			eval = true;
		} else if (is_err(r, "MOVED") && (to = redirect_node(s, r->str, &sl, i)) >= 0) {
			slot_set(s, sl, to);
			/* a resharding or failover moves more than one slot: read the map
			 * again (at most every 100 ms), then the notifier follows */
			if (dlock_clock_ms() - s->map_at >= 100)
				map_refresh(s, deadline);
			else
				dlock__rnotify_rehome(s->nt);
			if (slot_node(s, slot) < 0)
				slot_set(s, slot, to);
			if (++redirects > 2) /* nodes that disagree a moment: do not spin */
				backoff_pause(deadline, &backoff);
		} else if (is_err(r, "ASK") && (to = redirect_node(s, r->str, &sl, i)) >= 0) {
			ask = to;
			s->busy = BUSY_MIGRATING;
			if (++redirects > 2)
				backoff_pause(deadline, &backoff);
		} else if (is_err(r, "TRYAGAIN") || is_err(r, "CLUSTERDOWN") || is_err(r, "LOADING") ||
			   is_err(r, "MASTERDOWN") || (is_err(r, "READONLY") && !asked)) {
			/* a slot half migrated; a cluster between masters; a node that
			 * became a replica: wait a little, and look again */
			bool tryagain = is_err(r, "TRYAGAIN");
			s->busy = tryagain ? BUSY_MIGRATING : BUSY_FAILOVER;
			if (!tryagain)
				map_refresh(s, deadline);
			backoff_pause(deadline, &backoff);
		} else if (is_err(r, "MOVED") || is_err(r, "ASK")) {
			/* an address we cannot use (the node table is full): say so,
			 * without the raw redirect */
			*rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "REDIRECT",
					      "slot %d: the cluster sent the request to a node this handle cannot "
					      "reach (more than %d addresses met?)",
					      slot, NODE_MAX);
			freeReplyObject(r);
			return NULL;
		} else {
			*rc = dlock__rreply_error(r, &s->node[i], KIND);
			freeReplyObject(r);
			return NULL;
		}
		freeReplyObject(r);
	}
}

/*
 * The arguments of a script that reads more than its holder key, for the
 * cluster: every key the script touches declared up front (H and its
 * :f :e :w :q :x), so that while the lock's slot migrates the node answers
 * TRYAGAIN or ASK before running it, never in the middle of it.
 */
typedef struct cargs {
	const char *argv[24];
	size_t lens[24];
	char keys[5][DLOCK__REDIS_KEY_MAX];
	int argc;
} cargs;

static void cargs_make(cargs *c, const dlock__rargs *a, const dlock__rkeys *k)
{
	static const char *const sfx[5] = { ":f", ":e", ":w", ":q", ":x" };
	c->argc = 2;
	c->argv[c->argc] = "6";
	c->lens[c->argc++] = 1;
	c->argv[c->argc] = k->k[DLOCK__RK_H];
	c->lens[c->argc++] = k->len[DLOCK__RK_H];
	for (int i = 0; i < 5; i++) {
		int n = snprintf(c->keys[i], sizeof(c->keys[i]), "%s%s", k->k[DLOCK__RK_H], sfx[i]);
		c->argv[c->argc] = c->keys[i];
		c->lens[c->argc++] = (size_t)n;
	}
	for (int i = 4; i < a->argc; i++) { /* a: EVALSHA sha 1 H ARGV... */
		c->argv[c->argc] = a->argv[i];
		c->lens[c->argc++] = a->lens[i];
	}
}

static redisReply *run(cluster_store *s, int script, const dlock__rargs *a, const dlock__rkeys *k, bool with_sid,
		       int64_t deadline, int *rc, int *node)
{
	cargs c;
	cargs_make(&c, a, k);
	return exec(s, script, key_slot(k->k[DLOCK__RK_H], k->len[DLOCK__RK_H]), c.argc, c.argv, c.lens,
		    with_sid ? EXEC_SID : 0, deadline, rc, node);
}

static int c_release_keys(cluster_store *s, const dlock_request *req, const dlock__rkeys *k, int64_t deadline)
{
	dlock__rargs a;
	dlock__rargs_owner(&a, k, req);
	int rc, node;
	redisReply *r = run(s, DLOCK__RS_RELEASE, &a, k, false, deadline, &rc, &node);
	if (!r)
		return rc;
	long long v = 0;
	rc = dlock__rreply_int(r, &v) ? dlock__rbad_reply(KIND, "release") : 0;
	freeReplyObject(r);
	if (!rc && v != 1 && !s->retried)
		rc = DLOCK_ENOTHELD;
	return rc;
}

static int c_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	cluster_store *s = CS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_acquire(&a, &k, req, 0);
	if (s->fence_replicas)
		dlock__rargs_add(&a, ""); /* ARGV[8]: the node's run_id, filled by exec */
	int64_t deadline = req->deadline_ms;
	int rc, node = -1;
	redisReply *r = run(s, DLOCK__RS_ACQUIRE, &a, &k, s->fence_replicas > 0, deadline, &rc, &node);
	if (!r) {
		/* The cluster answered but did not serve the lock's slot within
		 * this try (a migration, a failover), or a node took the request
		 * and stayed silent (stopped, or failing over): the store is there,
		 * and a wait rides it out (dlock_grant.reached). */
		if (rc == DLOCK_EUNAVAILABLE && (s->busy != BUSY_NONE || s->unknown || s->silent))
			out->reached = 1;
		return rc;
	}
	rc = dlock__racquire_reply(r, &out->fence, &out->retry_ms, KIND);
	long long reserve = 0;
	if (rc == 0 && r->elements == 3)
		dlock__rreply_int(r->element[2], &reserve);
	freeReplyObject(r);
	int want = s->wait_replicas;
	if (reserve > 0 && s->fence_replicas > want)
		want = s->fence_replicas;
	if (rc == 0 && want > 0) {
		long long acked = -1;
		bool broken = false;
		if (s->conn[node].c)
			acked = dlock__rwait_replicas(s->conn[node].c, &s->node[node], KIND, want, reserve, &k,
						      s->conn[node].server_id, deadline, &broken);
		if (broken)
			node_drop(s, node);
		if (acked < want) {
			/* a grant a failover can lose is not handed out (the core
			 * undoes it again if this does not arrive) */
			c_release_keys(s, req, &k, deadline);
			rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "NOREPLICAS",
					     "lock '%s': the grant reached %lld of %d replica(s) in time; given back",
					     req->name, acked < 0 ? 0 : acked, want);
		}
	}
	dlock__racquire_done(req, rc, out);
	return rc;
}

static int c_release(dlock_backend *be, const dlock_request *req)
{
	cluster_store *s = CS(be);
	dlock__rkeys k;
	dlock__rkeys_make(&k, s->prefix, req->name);
	return c_release_keys(s, req, &k, req->deadline_ms);
}

static int c_cancel(dlock_backend *be, const dlock_request *req)
{
	cluster_store *s = CS(be);
	dlock__rkeys k;
	dlock__rargs a;
	dlock__rkeys_make(&k, s->prefix, req->name);
	dlock__rargs_owner(&a, &k, req);
	int rc, node;
	redisReply *r = run(s, DLOCK__RS_CANCEL, &a, &k, false, req->deadline_ms, &rc, &node);
	if (r)
		freeReplyObject(r);
	return r ? 0 : rc;
}

/* One RENEW for requests of one slot; results through their indices. */
static int renew_group(cluster_store *s, const dlock_request *const *reqs, const size_t *idx, size_t n, int *results,
		       unsigned flags, int64_t deadline)
{
	const dlock_request **sub = malloc(n * sizeof(*sub));
	if (!sub)
		return dlock_sys_oom();
	for (size_t j = 0; j < n; j++)
		sub[j] = reqs[idx[j]];
	dlock__rbatch b;
	int rc = dlock__rbatch_renew(&b, s->prefix, sub, n);
	free(sub);
	if (rc)
		return rc;
	int *res = malloc(n * sizeof(*res));
	int node;
	redisReply *r = res ? exec(s, DLOCK__RS_RENEW, key_slot(b.argv[3], b.lens[3]), b.argc, b.argv, b.lens, flags,
				   deadline, &rc, &node)
			    : NULL;
	if (!res)
		rc = dlock_sys_oom();
	dlock__rbatch_free(&b);
	if (r) {
		rc = dlock__rrenew_reply(r, n, res, KIND);
		freeReplyObject(r);
		for (size_t j = 0; !rc && j < n; j++)
			results[idx[j]] = res[j];
	}
	free(res);
	return rc;
}

typedef struct rslot {
	int slot;
	size_t i;
} rslot;

static int by_slot(const void *a, const void *b)
{
	const rslot *x = a, *y = b;
	return x->slot != y->slot ? (x->slot < y->slot ? -1 : 1) : (x->i < y->i ? -1 : x->i > y->i);
}

/*
 * Renew a batch: one RENEW per slot (a script's keys must share a slot),
 * the RENEWs of every slot on one master written together and their replies
 * read together — one round trip per node. A slot that answered with a
 * redirect (or whose node broke) is renewed again on its own, through exec.
 */
typedef struct rgroup {
	size_t b, e;  /* order[b..e): one slot */
	int node;
	bool alone;   /* to run through exec */
	bool noscript; /* the node said NOSCRIPT: exec sends the text */
} rgroup;

static int c_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	cluster_store *s = CS(be);
	if (n == 0)
		return 0;
	int64_t deadline = reqs[0]->deadline_ms;
	rslot *order = malloc(n * sizeof(*order));
	size_t *idx = malloc(n * sizeof(*idx));
	rgroup *gr = malloc(n * sizeof(*gr));
	const dlock_request **sub = malloc(n * sizeof(*sub));
	int *res = malloc(n * sizeof(*res));
	int rc = order && idx && gr && sub && res ? 0 : dlock_sys_oom();
	for (size_t i = 0; !rc && i < n; i++) {
		dlock__rkeys k;
		dlock__rkeys_make(&k, s->prefix, reqs[i]->name);
		order[i].slot = key_slot(k.k[DLOCK__RK_H], k.len[DLOCK__RK_H]);
		order[i].i = i;
	}
	size_t ng = 0;
	if (!rc) {
		qsort(order, n, sizeof(*order), by_slot);
		if (slot_node(s, order[0].slot) < 0)
			map_refresh(s, deadline);
		for (size_t g = 0; g < n; ng++) {
			gr[ng].b = g;
			while (g < n && order[g].slot == order[gr[ng].b].slot)
				g++;
			gr[ng].e = g;
			gr[ng].node = slot_node(s, order[gr[ng].b].slot);
			gr[ng].alone = gr[ng].node < 0 || !s->sha[DLOCK__RS_RENEW][0];
			gr[ng].noscript = false;
		}
	}
	for (size_t g = 0; !rc && g < ng; g++) {
		int node = gr[g].node;
		if (gr[g].alone || gr[g].b == SIZE_MAX)
			continue;
		bool up = node_connect(s, node, deadline) == 0;
		/* write every group of this node */
		for (size_t h = g; h < ng && !rc; h++) {
			if (gr[h].node != node || gr[h].alone || gr[h].b == SIZE_MAX)
				continue;
			if (!up) {
				gr[h].alone = true;
				continue;
			}
			for (size_t j = gr[h].b; j < gr[h].e; j++)
				sub[j - gr[h].b] = reqs[order[j].i];
			dlock__rbatch b;
			if ((rc = dlock__rbatch_renew(&b, s->prefix, sub, gr[h].e - gr[h].b)) != 0)
				break;
			b.argv[0] = "EVALSHA";
			b.lens[0] = 7;
			b.argv[1] = s->sha[DLOCK__RS_RENEW];
			b.lens[1] = 40;
			if (redisAppendCommandArgv(s->conn[node].c, b.argc, b.argv, b.lens) != REDIS_OK)
				rc = dlock_sys_oom();
			dlock__rbatch_free(&b);
		}
		if (rc && up)
			node_drop(s, node); /* half a pipeline written */
		if (!up || rc)
			continue;
		/* read their replies, in the same order */
		bool broken = false;
		for (size_t h = g; h < ng; h++) {
			if (gr[h].node != node || gr[h].alone || gr[h].b == SIZE_MAX)
				continue;
			size_t cnt = gr[h].e - gr[h].b;
			redisReply *r = NULL;
			if (broken || dlock__rread_by(s->conn[node].c, &s->node[node], KIND, deadline, &r) != 0) {
				broken = true;
				gr[h].alone = true;
				continue;
			}
			if (r->type == REDIS_REPLY_ERROR) {
				gr[h].alone = true; /* redirected, or the script cache flushed */
				gr[h].noscript = !strncmp(r->str, "NOSCRIPT", 8);
			} else {
				int e2 = dlock__rrenew_reply(r, cnt, res, KIND);
				for (size_t j = 0; !e2 && j < cnt; j++)
					results[order[gr[h].b + j].i] = res[j];
				if (e2 && !rc)
					rc = e2;
				gr[h].b = SIZE_MAX; /* done */
			}
			freeReplyObject(r);
		}
		if (broken)
			node_drop(s, node);
	}
	/* the groups to run alone, with every redirect followed */
	for (size_t g = 0; !rc && g < ng; g++) {
		if (gr[g].b == SIZE_MAX || !gr[g].alone)
			continue;
		for (size_t j = gr[g].b; j < gr[g].e; j++)
			idx[j] = order[j].i;
		rc = renew_group(s, reqs, idx + gr[g].b, gr[g].e - gr[g].b, results, gr[g].noscript ? EXEC_EVAL : 0,
				 deadline);
	}
	free(order);
	free(idx);
	free(gr);
	free(sub);
	free(res);
	return rc;
}

static int c_watch(dlock_backend *be, const dlock_request *req)
{
	return dlock__rnotify_watch(CS(be)->nt, req, CS(be)->prefix);
}

static void c_unwatch(dlock_backend *be, const dlock_request *req)
{
	dlock__rnotify_forget(CS(be)->nt, req);
}

static int c_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	cluster_store *s = CS(be);
	int64_t deadline = dlock_clock_ms() + s->seeds[0].timeout_ms;
	for (size_t i = 0; i < nnames; i++) {
		dlock__rkeys k;
		dlock__rargs a;
		dlock__rkeys_make(&k, s->prefix, names[i]);
		dlock__rargs_status(&a, &k);
		int rc, node;
		redisReply *r = run(s, DLOCK__RS_STATUS, &a, &k, false, deadline, &rc, &node);
		if (!r)
			return rc;
		rc = dlock__rstatus_decode(r, names[i], out, count, KIND);
		freeReplyObject(r);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every name with holders or waiters: SCAN on every master of the map. */
static int c_list(dlock_backend *be, char ***names, size_t *n)
{
	cluster_store *s = CS(be);
	int64_t deadline = dlock_clock_ms() + s->seeds[0].timeout_ms;
	int rc = map_refresh(s, deadline);
	unsigned char seen[NODE_MAX] = { 0 };
	for (int sl = 0; !rc && sl < SLOTS; sl++) {
		int m = slot_node(s, sl);
		if (m < 0 || seen[m])
			continue;
		seen[m] = 1;
		rc = dlock__rscan_names_by(&s->conn[m].c, &s->node[m], s->prefix, KIND, names, n, deadline);
	}
	return rc;
}

static void c_close(dlock_backend *be)
{
	cluster_store *s = CS(be);
	if (!s)
		return;
	dlock__rnotify_free(s->nt);
	for (size_t i = 0; i < NODE_MAX; i++)
		node_drop(s, (int)i);
	for (int i = 0; i < DLOCK__RS_COUNT; i++)
		free(s->text[i]);
	dlock__rservers_free(s->seeds);
	free(s->user);
	dlock_sys_free_secret(s->password);
	free(s->prefix);
	free(s);
}

/* The scripts, with every PUBLISH a sharded one (SPUBLISH: heard on the
 * lock's shard, where its waiters SSUBSCRIBE). */
static int make_scripts(cluster_store *s)
{
	for (int i = 0; i < DLOCK__RS_COUNT; i++) {
		const char *t = dlock__rscript_text[i];
		size_t n = 0;
		for (const char *p = t; (p = strstr(p, "'PUBLISH'")) != NULL; p++)
			n++;
		char *o = malloc(strlen(t) + n + 1);
		if (!o)
			return DLOCK_ENOMEM;
		char *w = o;
		for (const char *p = t; *p;) {
			if (!strncmp(p, "'PUBLISH'", 9)) {
				memcpy(w, "'SPUBLISH'", 10);
				w += 10;
				p += 9;
			} else {
				*w++ = *p++;
			}
		}
		*w = 0;
		s->text[i] = o;
	}
	return 0;
}

/* SCRIPT LOAD on one node: the SHA1 of a text is the same everywhere, so
 * EVALSHA works on every node once each has it (NOSCRIPT: EVAL loads it). */
static int load_scripts(cluster_store *s, int i, int64_t deadline)
{
	int rc = node_connect(s, i, deadline);
	if (rc)
		return rc;
	bool broken;
	rc = dlock__rload_scripts(s->conn[i].c, &s->node[i], KIND, (const char *const *)s->text, s->sha, deadline,
				  &broken);
	if (broken)
		node_drop(s, i);
	return rc;
}

/* remap=announced>reachable[,announced>reachable...], each host:port */
static int parse_remap(cluster_store *s, const char *v)
{
	while (v && *v) {
		size_t len = strcspn(v, ",");
		const char *gt = memchr(v, '>', len);
		size_t a = gt ? (size_t)(gt - v) : 0, b = gt ? len - a - 1 : 0;
		if (!gt || s->nremap == REMAP_MAX || !a || !b || a >= ADDR_MAX || b >= ADDR_MAX || !memchr(v, ':', a) ||
		    !memchr(gt + 1, ':', b))
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "option remap: want announced-host:port>reachable-host:port[,...] "
					       "(at most %d), not '%.*s'",
					       REMAP_MAX, (int)len, v);
		snprintf(s->remap[s->nremap].from, ADDR_MAX, "%.*s", (int)a, v);
		snprintf(s->remap[s->nremap].to, ADDR_MAX, "%.*s", (int)b, gt + 1);
		s->nremap++;
		v += len + (v[len] == ',');
	}
	return 0;
}

static const dlock_backend_methods cluster_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_RENEW_APART,
	.acquire = c_acquire,
	.release = c_release,
	.renew = c_renew,
	.watch = c_watch,
	.unwatch = c_unwatch,
	.cancel = c_cancel,
	.status = c_status,
	.list = c_list,
	.close = c_close,
};

int dlock__redis_cluster_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	int64_t deadline = dlock_clock_ms() + uri->connect_timeout_ms;
	if (uri->path && uri->path[0] && strcmp(uri->path, "/") != 0 && strcmp(uri->path, "/0") != 0)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "Redis Cluster has only database 0 (the URI's path is '%s')", uri->path);
	cluster_store *s = dlock_sys_calloc(1, sizeof(*s));
	if (!s)
		return DLOCK_ENOMEM;
	int rc = dlock__rserver_parse(&s->seeds, &s->nseeds, uri, KIND, 6379, "");
	if (rc) {
		free(s);
		return rc;
	}
	dlock_backend_init(&s->base, &cluster_methods);
	memset(s->slot, 0xff, sizeof(s->slot)); /* NO_NODE: no map yet */
	if (uri->user && *uri->user && !(s->user = dlock_sys_strdup(uri->user)))
		goto oom;
	if (uri->password && !(s->password = dlock_sys_strdup(uri->password)))
		goto oom;
	if (!(s->prefix = dlock_sys_strdup(uri->prefix)))
		goto oom;
	for (size_t i = 0; i < s->nseeds; i++) {
		s->seeds[i].user = s->user;
		s->seeds[i].password = s->password;
	}
	for (size_t i = 0; i < NODE_MAX; i++) { /* every node: the seeds' settings, no address yet */
		s->node[i] = s->seeds[0];
		s->node[i].tls_owner = false;
		s->node[i].host[0] = 0;
		s->node[i].port = 0;
	}
	if ((rc = parse_remap(s, dlock_uri_param(uri, "remap"))) != 0)
		goto fail;
	/* as redis+sentinel://: a grant and its fence must survive a failover */
	s->wait_replicas = s->fence_replicas = 1;
	if ((rc = dlock__rreplicas_option(uri, KIND, &s->wait_replicas, &s->fence_replicas)) != 0)
		goto fail;
	/* an unknown option is a usage error, before any connection */
	if ((rc = dlock_sys_uri_check_unused(uri)) != 0)
		goto fail;
	if ((rc = make_scripts(s)) != 0)
		goto fail;
	if ((rc = dlock__rnotify_new(&s->nt, &s->base, s->node, NODE_MAX, KIND)) != 0)
		goto fail;
	dlock__rnotify_sharded(s->nt, channel_home, s);
	if ((rc = map_refresh(s, deadline)) != 0)
		goto fail;
	/* every master caches the scripts now (one that fails here gets them
	 * with its first EVAL); at least one must answer. Those connected
	 * first (the one that gave the map answered a moment ago), each with a
	 * share of the time left; once one has them, the others get at most a
	 * quarter of a request's time each: a stopped master does not hold up
	 * the open. */
	int masters[NODE_MAX], nm = 0;
	unsigned char seen[NODE_MAX] = { 0 };
	for (int pass = 0; pass < 2; pass++)
		for (int sl = 0; sl < SLOTS; sl++) {
			int m = slot_node(s, sl);
			if (m >= 0 && !seen[m] && (pass || s->conn[m].c)) {
				seen[m] = 1;
				masters[nm++] = m;
			}
		}
	int loaded = 0;
	rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL, "the slot map names no master");
	for (int k = 0; k < nm; k++) {
		int64_t share = dlock__rms_left(deadline) / (nm - k);
		if (loaded && share > s->seeds[0].timeout_ms / 4)
			share = s->seeds[0].timeout_ms / 4;
		int e = load_scripts(s, masters[k], dlock_clock_ms() + share);
		if (!e)
			loaded++;
		else if (!loaded)
			rc = e;
	}
	if (!loaded)
		goto fail;
	*out = &s->base;
	return 0;
oom:
	rc = DLOCK_ENOMEM;
fail:
	c_close(&s->base);
	return rc;
}
