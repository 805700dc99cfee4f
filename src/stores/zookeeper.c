/*
 * The ZooKeeper store (libzookeeper_mt): Curator's lock recipes over
 * ephemeral sequential nodes, with the holes of ZooKeeper's own C recipe
 * (zoo_lock.c) closed — a lost session is reported, a create that hit a
 * connection loss is found again instead of repeated, and a grant is only
 * returned after our node is seen first in line.
 *
 * Layout: /[chroot/]<prefix>/<escaped name>/_c_<owner>-<kind>-<10-digit seq>
 * where kind is "lock" (exclusive), "read" (shared) or "sem" (semaphore).
 * The prefix and name nodes are containers: the server removes them once
 * their last child is gone. A hold is granted when no earlier node blocks it:
 * exclusive — no earlier node at all; shared — no earlier lock/sem node;
 * semaphore of N — no earlier lock/read node and fewer than N earlier sem
 * nodes. Fence = czxid of our node (zxids only grow, ensemble-wide).
 *
 * Sessions: a hold lives in a session whose timeout is at least the hold's
 * TTL (the TTL rounded up to a power-of-two number of seconds, or the fixed
 * `session_timeout=` option), so the core's lease deadline (t0 + ttl) always
 * passes before the server can expire the session and give the lock away.
 * Every renewal is a round trip (pipelined exists() of our nodes), which is
 * what lets the core move that deadline forward: the server heard from us
 * after the renewal started, so it cannot expire us before t0 + timeout.
 *
 * Locking: every method but `wait` runs under the core's store mutex. `wait`
 * runs concurrently, so shared state (sessions, refs, watch registrations)
 * is under st->mu. The watcher runs on libzookeeper's completion thread and
 * takes st->mu, so no synchronous zoo_* call may ever be made holding st->mu,
 * and zookeeper_close (which joins that thread) is only called without it.
 */
#include "support.h"
#include "zookeeper_parse.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* libzookeeper_mt: the synchronous calls exist only in the threaded build */
#ifndef THREADED
#define THREADED
#endif
#include <zookeeper/zookeeper.h>

#define KIND "zookeeper"
#define SEQ_DIGITS 10

typedef struct zk_store zk_store;

/* One ZooKeeper session. Referenced by the store's table (while current),
 * by each hold placed in it, by orphans and by running waits. */
typedef struct zsess {
	zk_store *st;
	struct zsess *next;
	zhandle_t *zh;
	int64_t want_ms;  /* requested timeout: the table key */
	int negotiated;   /* timeout the server granted, ms */
	int state;        /* last session state the watcher saw */
	bool expired;     /* expired, auth failed or closed: never usable again */
	bool auth_failed;
	bool current;     /* new holds with this key go here */
	int64_t probed;   /* when the sweeper last sent a probe */
	int refs;
} zsess;

/* A wait() in progress: the watcher marks it when its path fires. */
typedef struct watch_wait {
	struct watch_wait *next;
	zsess *sess;
	const char *path;
	bool fired;
} watch_wait;

/* The nodes of one owner under one name whose create or delete outcome is
 * unknown (a reply that never came, a call whose deadline passed), and
 * that no hold of ours uses: deleted by a sweep as soon as the session is
 * connected (the session watcher starts it; no call of the user is needed),
 * or gone with the session if it expires. A retry of the same owner claims
 * it instead (find_own adopts the node). Under st->mu, like the sweep's
 * completions, which run on libzookeeper's completion thread. */
typedef struct orphan {
	struct orphan *next;
	zk_store *st;
	zsess *sess;
	char *dir;
	char *owner;
	bool sweeping; /* a listing or deletes of the sweep are in flight */
	bool again;    /* asked to sweep while sweeping */
	bool failed;   /* the sweep lost the connection: the next CONNECTED retries */
	int pending;   /* deletes in flight */
	int64_t since; /* when the sweep in flight was started */
} orphan;

/* Per-hold state (req->slot) from the first acquire to release or cancel. */
typedef struct hold {
	struct hold *prev, *next; /* every hold of the store (see zk_close) */
	char *owner;
	zsess *sess;
	char *dir;          /* /root/<escaped name> */
	char *node;         /* our node's full path, NULL until known */
	int64_t czxid;
	char *watch;        /* what wait() watches: a node, or dir when watch_children */
	bool watch_children;
	int32_t cversion;   /* dir's cversion when we last listed it */
	bool doubt;         /* a node of ours may exist that h->node does not name */
	/* The lease, as this store enforces it (under st->mu): a granted hold
	 * not confirmed again (renew, extend) by `expires` is given up by the
	 * sweeper, so that a live process that stops renewing frees the name
	 * like a dead one would. */
	struct hold *lprev, *lnext;
	bool leased;
	int64_t expires;
} hold;

struct zk_store {
	dlock_backend base;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char *hosts;            /* as the URI names them (messages) */
	dlock_hostport *hp;     /* the same, resolved before each new session */
	size_t nh;
	char *root;             /* "/chroot/<escaped prefix>" */
	char *auth;             /* "user:password" or NULL */
	int64_t fixed_session;  /* session_timeout= (0: follow each hold's ttl) */
	int recipe;             /* recipe=: RECIPE_DLOCK, _CURATOR or _CURATOR_RW */
	int64_t connect_ms;
	int64_t request_ms;     /* bound of status and list (timeout=) */
	bool closing;           /* zk_close is closing the sessions */
	bool sweeper_started;   /* the sweeper thread (see sweeper_main) */
	pthread_t sweeper;
	int64_t default_ttl;
	zsess *sessions;
	zsess *graveyard;       /* unreferenced in a callback: closed by the next call */
	watch_wait *waits;
	orphan *orphans;        /* under mu */
	hold *leased;           /* granted holds with a lease to enforce, under mu */
	struct zop *ops;        /* requests waited for or still out, under mu */
	hold *holds;            /* under the core's mutex, like every hold */
	struct ACL acl_entries[2];
	struct ACL_vector acl;
};

/* recipe= (docs/stores/zookeeper.md, "Curator"): which node names we make.
 * dlock's own ("-lock-", "-read-", "-sem<N>-") already orders with Curator's
 * InterProcessMutex ("-lock-"); curator-rw makes the names of Curator's
 * InterProcessReadWriteLock ("__WRIT__", "__READ__") so that its readers and
 * writers see ours. Both refuse what their Curator peer would not see. */
enum { RECIPE_DLOCK, RECIPE_CURATOR, RECIPE_CURATOR_RW };

/* Our own "code" for a request whose reply did not come by the call's
 * deadline: its outcome is unknown, like ZCONNECTIONLOSS. */
#define ZDEADLINE (-9000)

/* ---------------------------------------------------------------- errors */

static const char *zcode(int rc)
{
	switch (rc) {
	case ZCONNECTIONLOSS: return "ZCONNECTIONLOSS";
	case ZOPERATIONTIMEOUT: return "ZOPERATIONTIMEOUT";
	case ZSESSIONEXPIRED: return "ZSESSIONEXPIRED";
	case ZINVALIDSTATE: return "ZINVALIDSTATE";
	case ZNOAUTH: return "ZNOAUTH";
	case ZAUTHFAILED: return "ZAUTHFAILED";
	case ZNONODE: return "ZNONODE";
	case ZNODEEXISTS: return "ZNODEEXISTS";
	case ZNOTEMPTY: return "ZNOTEMPTY";
	case ZBADARGUMENTS: return "ZBADARGUMENTS";
	case ZINVALIDACL: return "ZINVALIDACL";
	case ZCLOSING: return "ZCLOSING";
	case ZMARSHALLINGERROR: return "ZMARSHALLINGERROR";
	case ZNOCHILDRENFOREPHEMERALS: return "ZNOCHILDRENFOREPHEMERALS";
	case ZDEADLINE: return "TIMEDOUT";
	case ZRUNTIMEINCONSISTENCY: return "ZRUNTIMEINCONSISTENCY";
	default: return "ZSYSTEMERROR";
	}
}

static int zerr(int rc, const char *what, const char *path)
{
	int code = DLOCK_EUNAVAILABLE;
	if (rc == ZNOAUTH || rc == ZAUTHFAILED)
		code = DLOCK_EAUTH;
	else if (rc == ZBADARGUMENTS || rc == ZINVALIDACL)
		code = DLOCK_EINVAL;
	if (rc == ZDEADLINE)
		return dlock_error_set(code, KIND, zcode(rc),
				       "zookeeper: %s %s: timed out (no reply by the call's deadline; outcome unknown)",
				       what, path ? path : "");
	return dlock_error_set(code, KIND, zcode(rc), "zookeeper: %s %s: %s", what, path ? path : "",
			       zerror(rc));
}

/* The request may or may not have been applied. (libzookeeper fails the
 * requests in flight with ZRUNTIMEINCONSISTENCY when it drops a connection
 * over a reply out of order: a request lost on a link that works again.) */
static bool lost_conn(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZRUNTIMEINCONSISTENCY || rc == ZDEADLINE;
}

/* ...and there may be time to ask again once reconnected. */
static bool retryable(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZRUNTIMEINCONSISTENCY;
}

/* A sweep's answer that settles the question (anything else: try again). */
static bool settled(int rc)
{
	return rc == ZOK || rc == ZNONODE || rc == ZNOAUTH || rc == ZBADARGUMENTS || rc == ZINVALIDACL;
}

/* ---------------------------------------------------------------- names */

static bool plain(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
	       c == '_' || c == '.';
}

/* One znode name component for s: reversible percent-encoding of everything
 * but [A-Za-z0-9._-]; "." and ".." (not valid znode names) become %2E... */
char *dlock__zk_escape(const char *s)
{
	size_t n = strlen(s);
	char *out = malloc(3 * n + 1);
	if (!out) {
		dlock__oom();
		return NULL;
	}
	bool dots = strspn(s, ".") == n;
	char *o = out;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (plain(*p) && !(dots && *p == '.')) {
			*o++ = (char)*p;
		} else {
			sprintf(o, "%%%02X", *p);
			o += 3;
		}
	}
	*o = '\0';
	return out;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* The lock name an escaped component stands for; NULL if it is not one of ours. */
char *dlock__zk_unescape(const char *s)
{
	char *out = malloc(strlen(s) + 1), *o = out;
	if (!out)
		return NULL;
	for (const char *p = s; *p; p++) {
		if (*p != '%') {
			*o++ = *p;
			continue;
		}
		int hi = hexval(p[1]), lo = hi < 0 ? -1 : hexval(p[2]);
		if (hi < 0 || lo < 0) {
			free(out);
			return NULL;
		}
		*o++ = (char)(hi * 16 + lo);
		p += 2;
	}
	*o = '\0';
	return out;
}

static const char *kind_word(node_kind k)
{
	return k == K_READ ? "read" : k == K_SEM ? "sem" : "lock";
}

/* Parse "<anything>-<kind>-<10 digits>"; a sequential node of another client
 * (Curator's "-lock-", kazoo's "__lock__") counts as exclusive. */
bool dlock__zk_parse_child(const char *name, child *c)
{
	size_t n = strlen(name);
	if (n < SEQ_DIGITS + 1)
		return false;
	const char *d = name + n - SEQ_DIGITS;
	int64_t seq = 0;
	for (int i = 0; i < SEQ_DIGITS; i++) {
		if (d[i] < '0' || d[i] > '9')
			return false;
		seq = seq * 10 + (d[i] - '0');
	}
	c->name = name;
	c->seq = seq;
	c->kind = K_LOCK;
	c->permits = 0;
	/* "-sem<N>-": a semaphore node that names its permits (the rule of the
	 * smallest limit needs every earlier holder's); "-sem-" is an older one */
	const char *w = d - 1;
	unsigned long p = 0, scale = 1;
	while (w > name && w[-1] >= '0' && w[-1] <= '9' && scale <= 100000000) {
		p += (unsigned long)(w[-1] - '0') * scale;
		scale *= 10;
		w--;
	}
	if (n >= SEQ_DIGITS + 6 && strncmp(d - 6, "-read-", 6) == 0)
		c->kind = K_READ;
	else if (n >= SEQ_DIGITS + 5 && strncmp(d - 5, "-sem-", 5) == 0)
		c->kind = K_SEM;
	else if (d[-1] == '-' && scale > 1 && w - name >= 4 && strncmp(w - 4, "-sem", 4) == 0) {
		c->kind = K_SEM;
		c->permits = p > 0 && p < 1000000 ? (unsigned)p : 1;
	}
	else if (n >= SEQ_DIGITS + 9 && strncmp(d - 9, "__rlock__", 9) == 0)
		c->kind = K_READ;
	else if (n >= SEQ_DIGITS + 8 && strncmp(d - 8, "__READ__", 8) == 0)
		c->kind = K_READ; /* Curator's InterProcessReadWriteLock ("__WRIT__": exclusive) */
	return true;
}

static int by_seq(const void *a, const void *b)
{
	const child *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}


/* ---------------------------------------------------------------- requests with a deadline */

/*
 * Every request is sent with libzookeeper's asynchronous API and waited for
 * on st->cv until the call's deadline; a synchronous zoo_* call cannot be
 * bounded (it waits until the reply or until the library gives the
 * connection up, 2/3 of the session timeout later). A request we stop
 * waiting for still completes later, into its zop: the zop is shared by the
 * waiter and the completion and freed by whichever lets go last. Its late
 * reply cannot be taken for the answer to another request (each reply goes
 * to its own completion), so the connection is kept: it is the session.
 */
typedef struct zop {
	zk_store *st;
	struct zop *prev, *next; /* every live op of the store (see zk_close) */
	int refs;    /* the waiter's and the completion's, under st->mu */
	bool done;
	int rc;
	struct Stat stat;
	struct String_vector kids; /* our copy */
	char *value;               /* created path, or node data */
	int vlen;
} zop;

static zop *op_new(zk_store *st)
{
	zop *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	op->st = st;
	op->refs = 2;
	op->rc = ZSYSTEMERROR;
	pthread_mutex_lock(&st->mu);
	op->next = st->ops;
	if (st->ops)
		st->ops->prev = op;
	st->ops = op;
	pthread_mutex_unlock(&st->mu);
	return op;
}

static void op_free_locked(zop *op)
{
	zk_store *st = op->st;
	if (op->prev)
		op->prev->next = op->next;
	else
		st->ops = op->next;
	if (op->next)
		op->next->prev = op->prev;
	deallocate_String_vector(&op->kids);
	free(op->value);
	free(op);
}

/* Under st->mu. */
static void op_unref_locked(zop *op)
{
	if (--op->refs > 0)
		return;
	op_free_locked(op);
}

/* The completion's part: record, wake the waiters, let go. */
static void op_finish(zop *op, int rc, const struct Stat *stat, struct String_vector kids, char *value, int vlen)
{
	zk_store *st = op->st;
	pthread_mutex_lock(&st->mu);
	op->rc = rc;
	if (stat)
		op->stat = *stat;
	op->kids = kids;
	op->value = value;
	op->vlen = vlen;
	op->done = true;
	pthread_cond_broadcast(&st->cv);
	op_unref_locked(op);
	pthread_mutex_unlock(&st->mu);
}

static struct String_vector copy_kids(int *rc, const struct String_vector *sv)
{
	struct String_vector kids = { 0, NULL };
	if (*rc != ZOK || !sv || sv->count <= 0)
		return kids;
	kids.data = calloc((size_t)sv->count, sizeof(char *));
	for (int i = 0; kids.data && i < sv->count; i++) {
		if (!(kids.data[i] = strdup(sv->data[i])))
			break;
		kids.count++;
	}
	if (kids.count != sv->count)
		*rc = ZSYSTEMERROR; /* out of memory: as good as no answer */
	return kids;
}

static void cb_void(int rc, const void *data)
{
	op_finish((zop *)data, rc, NULL, (struct String_vector){ 0, NULL }, NULL, 0);
}

static void cb_stat(int rc, const struct Stat *stat, const void *data)
{
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, NULL, 0);
}

static void cb_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
	char *v = rc == ZOK && value ? strdup(value) : NULL;
	if (rc == ZOK && !v)
		rc = ZSYSTEMERROR;
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, v, 0);
}

static void cb_kids(int rc, const struct String_vector *strings, const struct Stat *stat, const void *data)
{
	struct String_vector kids = copy_kids(&rc, strings);
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, kids, NULL, 0);
}

static void cb_data(int rc, const char *value, int len, const struct Stat *stat, const void *data)
{
	char *v = NULL;
	if (rc == ZOK && value && len > 0 && (v = malloc((size_t)len)) != NULL)
		memcpy(v, value, (size_t)len);
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, v, v ? len : 0);
}

/* After zoo_a*: a request the library refused will have no completion. */
static zop *op_sent(zk_store *st, zop *op, int r)
{
	if (op && r != ZOK) {
		pthread_mutex_lock(&st->mu);
		op->rc = r;
		op->done = true;
		op_unref_locked(op);
		pthread_mutex_unlock(&st->mu);
	}
	return op;
}

/* Wait until every op is done or the deadline passes. @return all done. */
static bool ops_wait(zk_store *st, zop *const *ops, size_t n, int64_t deadline)
{
	pthread_mutex_lock(&st->mu);
	for (;;) {
		size_t i = 0;
		while (i < n && (!ops[i] || ops[i]->done))
			i++;
		if (i == n)
			break;
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	bool all = true;
	for (size_t i = 0; i < n; i++)
		all = all && ops[i] && ops[i]->done;
	pthread_mutex_unlock(&st->mu);
	return all;
}

/* The op's result (ZDEADLINE if it is still out), after ops_wait. A done op
 * is no longer touched by its completion: its fields may be read freely. */
static int op_rc(zk_store *st, zop *op)
{
	if (!op)
		return ZSYSTEMERROR;
	pthread_mutex_lock(&st->mu);
	int rc = op->done ? op->rc : ZDEADLINE;
	pthread_mutex_unlock(&st->mu);
	return rc;
}

static void op_put(zk_store *st, zop *op)
{
	if (!op)
		return;
	pthread_mutex_lock(&st->mu);
	op_unref_locked(op);
	pthread_mutex_unlock(&st->mu);
}

static int op_wait1(zk_store *st, zop *op, int64_t deadline)
{
	ops_wait(st, &op, 1, deadline);
	return op_rc(st, op);
}

/* The bounded forms of the synchronous calls. */
static int z_children(zk_store *st, zhandle_t *zh, const char *path, int64_t deadline, struct String_vector *out,
		      int32_t *cversion)
{
	zop *op = op_new(st);
	op_sent(st, op, op ? zoo_aget_children2(zh, path, 0, cb_kids, op) : ZSYSTEMERROR);
	int rc = op_wait1(st, op, deadline);
	if (rc == ZOK) {
		*out = op->kids;
		op->kids = (struct String_vector){ 0, NULL };
		if (cversion)
			*cversion = op->stat.cversion;
	}
	op_put(st, op);
	return rc;
}

static int z_exists(zk_store *st, zhandle_t *zh, const char *path, int64_t deadline, struct Stat *stat)
{
	zop *op = op_new(st);
	op_sent(st, op, op ? zoo_aexists(zh, path, 0, cb_stat, op) : ZSYSTEMERROR);
	int rc = op_wait1(st, op, deadline);
	if (rc == ZOK && stat)
		*stat = op->stat;
	op_put(st, op);
	return rc;
}

static int z_delete(zk_store *st, zhandle_t *zh, const char *path, int64_t deadline)
{
	zop *op = op_new(st);
	op_sent(st, op, op ? zoo_adelete(zh, path, -1, cb_void, op) : ZSYSTEMERROR);
	int rc = op_wait1(st, op, deadline);
	op_put(st, op);
	return rc;
}

/* ---------------------------------------------------------------- sessions */

static void sweep_start_locked(orphan *o);
static void orphan_free_locked(orphan *o);

static void watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	zsess *z = ctx;
	zk_store *st = z->st;
	pthread_mutex_lock(&st->mu);
	if (type == ZOO_SESSION_EVENT) {
		z->state = state;
		if (state == ZOO_CONNECTED_STATE)
			z->negotiated = zoo_recv_timeout(zh);
		if (state == ZOO_EXPIRED_SESSION_STATE)
			z->expired = true;
		if (state == ZOO_AUTH_FAILED_STATE)
			z->expired = z->auth_failed = true;
		/* Orphans: connected again, delete them now (an idle process
		 * would otherwise keep them alive with its pings); expired, they
		 * are gone with the session. */
		for (orphan **p = &st->orphans; *p && !st->closing;) {
			orphan *o = *p;
			if (o->sess != z) {
				p = &o->next;
			} else if (z->expired && !o->sweeping) {
				*p = o->next;
				orphan_free_locked(o);
			} else {
				if (state == ZOO_CONNECTED_STATE)
					sweep_start_locked(o);
				p = &o->next;
			}
		}
	} else if (path) {
		for (watch_wait *w = st->waits; w; w = w->next)
			if (w->sess == z && strcmp(w->path, path) == 0)
				w->fired = true;
	}
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
}

static void quiet_log(const char *message)
{
	(void)message; /* libzookeeper logs every reconnect; our errors carry what matters */
}

/* Under st->mu: drop a reference; returns the session to close (after
 * unlocking) when it was the last. */
static zsess *unref_locked(zsess *z)
{
	if (--z->refs > 0)
		return NULL;
	zk_store *st = z->st;
	for (zsess **p = &st->sessions; *p; p = &(*p)->next) {
		if (*p == z) {
			*p = z->next;
			break;
		}
	}
	return z;
}

/* Under st->mu, on any thread (also libzookeeper's completion thread, which
 * cannot close its own handle): the last reference goes to the graveyard. */
static void unref_later_locked(zsess *z)
{
	zsess *dead = unref_locked(z);
	if (dead) {
		dead->next = dead->st->graveyard;
		dead->st->graveyard = dead;
	}
}

static void close_sess(zsess *z)
{
	if (!z)
		return;
	if (z->zh)
		zookeeper_close(z->zh);
	free(z);
}

/* Close the sessions the completion thread let go (from a caller's thread). */
static void reap(zk_store *st)
{
	pthread_mutex_lock(&st->mu);
	zsess *all = st->graveyard;
	st->graveyard = NULL;
	pthread_mutex_unlock(&st->mu);
	while (all) {
		zsess *z = all;
		all = z->next;
		close_sess(z);
	}
}

static void unref(zk_store *st, zsess *z)
{
	if (!z)
		return;
	pthread_mutex_lock(&st->mu);
	zsess *dead = unref_locked(z);
	pthread_mutex_unlock(&st->mu);
	close_sess(dead);
}

/* Under st->mu: wait until z is connected (true) or dead, or the deadline. */
static bool wait_connected_locked(zk_store *st, zsess *z, int64_t deadline)
{
	while (!z->expired && z->state != ZOO_CONNECTED_STATE) {
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	return !z->expired && z->state == ZOO_CONNECTED_STATE;
}

static bool wait_connected(zk_store *st, zsess *z, int64_t deadline)
{
	pthread_mutex_lock(&st->mu);
	bool ok = wait_connected_locked(st, z, deadline);
	pthread_mutex_unlock(&st->mu);
	return ok;
}

static bool sess_dead(zk_store *st, zsess *z)
{
	pthread_mutex_lock(&st->mu);
	bool dead = z->expired;
	pthread_mutex_unlock(&st->mu);
	return dead;
}

static bool sess_connected(zk_store *st, zsess *z)
{
	pthread_mutex_lock(&st->mu);
	bool ok = !z->expired && z->state == ZOO_CONNECTED_STATE;
	pthread_mutex_unlock(&st->mu);
	return ok;
}

/* The session timeout a hold of ttl_ms needs: never shorter than the ttl, so
 * the holder's own deadline passes before the server can expire it. */
static int64_t session_key(zk_store *st, int64_t ttl_ms)
{
	if (st->fixed_session)
		return st->fixed_session;
	int64_t k = 1000;
	while (k < ttl_ms && k < INT32_MAX / 2)
		k *= 2;
	return k;
}

static int dead_sess_error(zsess *z)
{
	if (z->auth_failed)
		return dlock_error_set(DLOCK_EAUTH, KIND, "ZAUTHFAILED",
				       "zookeeper: the server refused our credentials");
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZSESSIONEXPIRED", "zookeeper: session expired");
}

static int not_connected_error(zk_store *st, int64_t waited)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZCONNECTIONLOSS",
			       "zookeeper: not connected to any of %s: timed out after %lld ms", st->hosts,
			       (long long)waited);
}

/*
 * The connect string of a new session: every address of every host,
 * resolved by `deadline`. The C client would resolve the names itself with a
 * blocking getaddrinfo, in zookeeper_init and again on its reconnects; given
 * addresses it never asks the DNS. A host whose name does not resolve in time
 * is left out while another one answered.
 */
static int resolve_hosts(zk_store *st, int64_t deadline, char **out)
{
	*out = NULL;
	dlock__addrs *ad = dlock__calloc(st->nh, sizeof(*ad));
	int *rcs = dlock__calloc(st->nh, sizeof(*rcs));
	const char **names = dlock__calloc(st->nh, sizeof(*names));
	int rc = 0;
	if (!ad || !rcs || !names) {
		rc = DLOCK_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < st->nh; i++)
		names[i] = st->hp[i].host;
	if (!dlock__resolve_all(ad, rcs, names, st->nh, deadline, KIND)) {
		rc = dlock_error_last()->code;
		goto out;
	}
	size_t cap = st->nh * DLOCK__ADDRS_MAX * (DLOCK__ADDR_LEN + 10) + st->nh * 270 + 1, len = 0;
	char *cs = dlock__calloc(1, cap);
	if (!cs) {
		rc = DLOCK_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < st->nh; i++) {
		if (rcs[i])
			continue;
		for (size_t k = 0; k < (ad[i].n ? ad[i].n : 1); k++) {
			const char *h = ad[i].n ? ad[i].addr[k] : st->hp[i].host;
			bool v6 = strchr(h, ':') != NULL;
			len += (size_t)snprintf(cs + len, cap - len, "%s%s%s%s:%d", len ? "," : "", v6 ? "[" : "", h,
						v6 ? "]" : "", st->hp[i].port);
		}
	}
	*out = cs;
out:
	free(ad);
	free(rcs);
	free(names);
	return rc;
}

/* A connected session with timeout key `want` (made, or remade after expiry,
 * as needed), by `deadline`. Borrowed: valid while the caller holds the
 * core's store mutex. */
static int get_session(zk_store *st, int64_t want, int64_t deadline, zsess **out)
{
	int64_t start = dlock_clock_ms();
	pthread_mutex_lock(&st->mu);
	zsess *z = NULL, *retired = NULL;
	for (int round = 0; round < 2; round++) {
		z = NULL;
		for (zsess *s = st->sessions; s; s = s->next)
			if (s->current && s->want_ms == want)
				z = s;
		if (z && z->expired) {
			/* After expiry a new session serves later acquires; holds of the
			 * old one keep it referenced until they are released as lost. */
			z->current = false;
			retired = unref_locked(z);
			z = NULL;
		}
		if (!z)
			break;
		bool ok = wait_connected_locked(st, z, deadline);
		if (ok) {
			pthread_mutex_unlock(&st->mu);
			*out = z;
			return 0;
		}
		if (!z->expired || z->auth_failed) {
			int rc = z->expired ? dead_sess_error(z) : not_connected_error(st, dlock_clock_ms() - start);
			pthread_mutex_unlock(&st->mu);
			return rc;
		}
		/* it expired while we waited for it to reconnect: make a new one */
	}
	pthread_mutex_unlock(&st->mu);
	close_sess(retired);

	z = dlock__calloc(1, sizeof(*z));
	if (!z)
		return DLOCK_ENOMEM;
	z->st = st;
	z->want_ms = want;
	z->refs = 1;
	z->current = true;
	z->state = ZOO_CONNECTING_STATE;
	pthread_mutex_lock(&st->mu);
	z->next = st->sessions;
	st->sessions = z;
	pthread_mutex_unlock(&st->mu);
	/* zh is assigned before anything but the watcher can see z; the watcher
	 * only uses the handle it is given. */
	char *numeric = NULL;
	int rrc = resolve_hosts(st, deadline, &numeric);
	if (rrc) {
		unref(st, z);
		return rrc;
	}
	errno = 0;
	zhandle_t *zh = zookeeper_init2(numeric, watcher, (int)want, NULL, z, 0, quiet_log);
	free(numeric);
	if (!zh) {
		int e = errno;
		unref(st, z);
		return dlock_error_set(e == EINVAL ? DLOCK_EINVAL : DLOCK_EUNAVAILABLE, KIND, NULL,
				       "zookeeper: cannot start a session with %s: %s", st->hosts,
				       strerror(e ? e : EIO));
	}
	pthread_mutex_lock(&st->mu);
	z->zh = zh;
	pthread_mutex_unlock(&st->mu);
	if (st->auth) {
		/* queued: sent with the connect request, answered before CONNECTED */
		int rc = zoo_add_auth(zh, "digest", st->auth, (int)strlen(st->auth), NULL, NULL);
		if (rc != ZOK) {
			unref(st, z);
			return zerr(rc, "add digest auth for", "session");
		}
	}
	pthread_mutex_lock(&st->mu);
	bool ok = wait_connected_locked(st, z, deadline);
	bool auth = z->auth_failed;
	pthread_mutex_unlock(&st->mu);
	if (!ok) {
		pthread_mutex_lock(&st->mu);
		z->current = false;
		pthread_mutex_unlock(&st->mu);
		unref(st, z);
		if (auth)
			return dlock_error_set(DLOCK_EAUTH, KIND, "ZAUTHFAILED",
					       "zookeeper: the server refused our credentials");
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZCONNECTIONLOSS",
				       "zookeeper: no server of %s answered: timed out after %lld ms", st->hosts,
				       (long long)(dlock_clock_ms() - start));
	}
	*out = z;
	return 0;
}

/* The session for a hold of ttl_ms, refusing a ttl the server's session
 * timeout cannot cover. */
static int session_for(zk_store *st, int64_t ttl_ms, int64_t deadline, zsess **out)
{
	int rc = get_session(st, session_key(st, ttl_ms), deadline, out);
	if (rc)
		return rc;
	pthread_mutex_lock(&st->mu);
	int granted = (*out)->negotiated;
	pthread_mutex_unlock(&st->mu);
	if (ttl_ms > granted)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: lock ttl %lld ms is longer than the session timeout the server "
				       "granted (%d ms; see its maxSessionTimeout and our session_timeout option): "
				       "a holder cut off from ZooKeeper could outlive its session unnoticed",
				       (long long)ttl_ms, granted);
	return 0;
}

/* ---------------------------------------------------------------- holds and orphans */

static char *dir_of(zk_store *st, const char *name)
{
	char *e = dlock__zk_escape(name);
	if (!e)
		return NULL;
	char *d = dlock__sprintf("%s/%s", st->root, e);
	free(e);
	return d;
}

static void lease_drop(zk_store *st, hold *h);

static void hold_free(zk_store *st, hold *h)
{
	if (!h)
		return;
	lease_drop(st, h);
	if (h->prev)
		h->prev->next = h->next;
	else if (st->holds == h)
		st->holds = h->next;
	if (h->next)
		h->next->prev = h->prev;
	unref(st, h->sess);
	free(h->owner);
	free(h->dir);
	free(h->node);
	free(h->watch);
	free(h);
}

/* Under st->mu (the orphan is unlinked). */
static void orphan_free_locked(orphan *o)
{
	if (o->sess && !o->st->closing)
		unref_later_locked(o->sess);
	free(o->dir);
	free(o->owner);
	free(o);
}

/* Under st->mu: the sweep of o is over. */
static void sweep_done_locked(orphan *o, bool ok)
{
	zk_store *st = o->st;
	o->sweeping = false;
	pthread_cond_broadcast(&st->cv);
	if (st->closing)
		return; /* zk_close frees every orphan */
	if (!ok && !o->sess->expired) {
		o->failed = true;
		if (o->again && o->sess->state == ZOO_CONNECTED_STATE)
			sweep_start_locked(o);
		return;
	}
	if (ok && o->again) {
		sweep_start_locked(o);
		return;
	}
	/* Nothing of the owner is left (or the session, and its nodes, died). */
	for (orphan **p = &st->orphans; *p; p = &(*p)->next) {
		if (*p == o) {
			*p = o->next;
			break;
		}
	}
	orphan_free_locked(o);
}

static void sweep_deleted(int rc, const void *data)
{
	orphan *o = (orphan *)data;
	zk_store *st = o->st;
	pthread_mutex_lock(&st->mu);
	if (!settled(rc))
		o->failed = true;
	if (--o->pending == 0)
		sweep_done_locked(o, !o->failed); /* may free o */
	pthread_mutex_unlock(&st->mu);
}

static bool owned_by(const char *c, const char *owner);

static void sweep_listed(int rc, const struct String_vector *sv, const void *data)
{
	orphan *o = (orphan *)data;
	zk_store *st = o->st;
	pthread_mutex_lock(&st->mu);
	if (rc != ZOK && settled(rc)) {
		sweep_done_locked(o, true); /* nothing there (or nothing we can do) */
		pthread_mutex_unlock(&st->mu);
		return;
	}
	if (rc != ZOK) {
		sweep_done_locked(o, false);
		pthread_mutex_unlock(&st->mu);
		return;
	}
	o->failed = false;
	o->pending = 1; /* ours, until every delete is sent */
	for (int i = 0; sv && i < sv->count; i++) {
		if (!owned_by(sv->data[i], o->owner))
			continue;
		char *p = dlock__sprintf("%s/%s", o->dir, sv->data[i]);
		int r = p ? zoo_adelete(o->sess->zh, p, -1, sweep_deleted, o) : ZSYSTEMERROR;
		free(p);
		if (r == ZOK)
			o->pending++;
		else
			o->failed = true;
	}
	if (--o->pending == 0)
		sweep_done_locked(o, !o->failed);
	pthread_mutex_unlock(&st->mu);
}

/* Under st->mu, on any thread: list o's name and delete the owner's nodes,
 * asynchronously. Requests of one session run in order, so the listing sees
 * every create or delete of the owner that was sent before it. */
static void sweep_start_locked(orphan *o)
{
	if (o->sweeping) {
		o->again = true;
		return;
	}
	if (o->st->closing || o->sess->expired || o->sess->state != ZOO_CONNECTED_STATE)
		return;
	o->again = false;
	o->sweeping = true;
	o->since = dlock_clock_ms();
	int r = zoo_aget_children(o->sess->zh, o->dir, 0, sweep_listed, o);
	if (r != ZOK) {
		o->sweeping = false;
		o->failed = true;
	}
}

/* Under st->mu. */
static void lease_unlink_locked(zk_store *st, hold *h)
{
	if (!h->leased)
		return;
	if (h->lprev)
		h->lprev->lnext = h->lnext;
	else
		st->leased = h->lnext;
	if (h->lnext)
		h->lnext->lprev = h->lprev;
	h->lprev = h->lnext = NULL;
	h->leased = false;
}

static void lease_drop(zk_store *st, hold *h)
{
	pthread_mutex_lock(&st->mu);
	lease_unlink_locked(st, h);
	pthread_mutex_unlock(&st->mu);
}

static void *sweeper_main(void *arg);

/* Under st->mu: make sure the sweeper runs (it has work: an orphan or a lease). */
static void sweeper_wake_locked(zk_store *st)
{
	if (!st->sweeper_started && !st->closing)
		st->sweeper_started = pthread_create(&st->sweeper, NULL, sweeper_main, st) == 0;
	pthread_cond_broadcast(&st->cv);
}

/* h was confirmed by a request sent after `since` (>= the core's own start
 * of that request): its lease now ends at since + ttl_ms, never before the
 * core's deadline for it. A renewal (`again`) does not bring back a lease
 * the sweeper already ended. @return whether h is leased now. */
static bool lease_set(zk_store *st, hold *h, int64_t since, int64_t ttl_ms, bool again)
{
	pthread_mutex_lock(&st->mu);
	if (again && !h->leased) {
		pthread_mutex_unlock(&st->mu);
		return false;
	}
	h->expires = since + ttl_ms;
	if (!h->leased) {
		h->leased = true;
		h->lprev = NULL;
		h->lnext = st->leased;
		if (st->leased)
			st->leased->lprev = h;
		st->leased = h;
	}
	sweeper_wake_locked(st);
	pthread_mutex_unlock(&st->mu);
	return true;
}

static void probe_done(int rc, const struct Stat *stat, const void *data)
{
	(void)rc;
	(void)stat;
	(void)data;
}

/*
 * The sweeper: a thread of the store's own, running while orphans exist.
 * Requests lost on a link that then works again (a black hole that passes
 * once more, a dropped reply) are never answered: ZooKeeper has no
 * per-request timeout, and pings keep the connection alive, so a sweep
 * waiting for such a reply would wait as long as the session lives — and
 * keep the orphan's node blocking others. When a sweep has waited longer
 * than the request timeout, the sweeper sends a probe (exists of "/") on
 * its session: if the link works, the probe's answer arrives ahead of the
 * lost one, libzookeeper takes that for a broken connection and reconnects,
 * and the session watcher sweeps again. A probe lost too is followed by
 * another one request timeout later. It also restarts sweeps that
 * failed while the session stayed connected.
 */
static void *sweeper_main(void *arg)
{
	zk_store *st = arg;
	pthread_mutex_lock(&st->mu);
	while (!st->closing) {
		int64_t now = dlock_clock_ms(), next = INT64_MAX;
		for (hold *h = st->leased; h;) {
			hold *hn = h->lnext;
			if (h->expires <= now) {
				/* Its lease ended unconfirmed (the core has reported it
				 * lost by now): its node goes, by the orphan sweep. */
				lease_unlink_locked(st, h);
				orphan *o = h->sess->expired ? NULL : calloc(1, sizeof(*o));
				if (o && (o->dir = strdup(h->dir)) && (o->owner = strdup(h->owner))) {
					o->st = st;
					o->sess = h->sess;
					h->sess->refs++;
					o->next = st->orphans;
					st->orphans = o;
					sweep_start_locked(o);
				} else if (o) {
					free(o->dir);
					free(o);
				}
			} else if (h->expires < next) {
				next = h->expires;
			}
			h = hn;
		}
		for (orphan *o = st->orphans; o; o = o->next) {
			zsess *z = o->sess;
			bool up = !z->expired && z->state == ZOO_CONNECTED_STATE;
			if (!o->sweeping && o->failed && up)
				sweep_start_locked(o);
			if (!o->sweeping)
				continue;
			if (now - o->since >= st->request_ms && up && now - z->probed >= st->request_ms) {
				/* (a probe lost like the rest is followed by another) */
				zoo_aexists(z->zh, "/", 0, probe_done, NULL);
				z->probed = now;
				o->since = now;
			}
			if (o->since + st->request_ms < next)
				next = o->since + st->request_ms;
		}
		if (!st->orphans && !st->leased) {
			pthread_cond_wait(&st->cv, &st->mu);
			continue;
		}
		struct timespec ts;
		int64_t left = next == INT64_MAX ? st->request_ms : next - dlock_clock_ms();
		dlock__abstime(&ts, left < 10 ? 10 : left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

/* The node(s) of h's owner are in doubt (a create or delete whose outcome is
 * unknown) and no hold will use them: hand them to the sweep. Takes over h. */
static void orphan_hold(zk_store *st, hold *h)
{
	orphan *o = calloc(1, sizeof(*o));
	pthread_mutex_lock(&st->mu);
	if (o && !h->sess->expired) {
		o->st = st;
		o->sess = h->sess;
		o->dir = h->dir;
		o->owner = h->owner;
		h->sess = NULL;
		h->dir = h->owner = NULL;
		o->next = st->orphans;
		st->orphans = o;
		sweep_start_locked(o);
		o = NULL;
		sweeper_wake_locked(st);
	}
	pthread_mutex_unlock(&st->mu);
	free(o);
	hold_free(st, h);
}

/* A new hold of an owner that left an orphan (a retry of the same acquire):
 * take the orphan back so find_own adopts its node and keeps its place in
 * line, after any sweep of it in flight is over. @return ZOK (h->doubt set
 * when there was one), or ZDEADLINE. */
static int claim_orphan(zk_store *st, hold *h, int64_t deadline)
{
	pthread_mutex_lock(&st->mu);
	int rc = ZOK;
	for (;;) {
		orphan *o = NULL, **at = NULL;
		for (orphan **p = &st->orphans; *p; p = &(*p)->next) {
			if (strcmp((*p)->owner, h->owner) == 0 && strcmp((*p)->dir, h->dir) == 0) {
				o = *p;
				at = p;
				break;
			}
		}
		if (!o)
			break;
		if (o->sweeping) {
			int64_t left = deadline - dlock_clock_ms();
			if (left <= 0) {
				rc = ZDEADLINE;
				break;
			}
			struct timespec ts;
			dlock__abstime(&ts, left);
			pthread_cond_timedwait(&st->cv, &st->mu, &ts);
			continue;
		}
		*at = o->next;
		/* An orphan of an older session of ours: its nodes die with it, or
		 * are ours to find in the listing all the same. */
		h->doubt = true;
		orphan_free_locked(o);
	}
	pthread_mutex_unlock(&st->mu);
	return rc;
}

/* Does child name c belong to owner? ("_c_<owner>-<kind>-<seq>") */
static bool owned_by(const char *c, const char *owner)
{
	size_t n = strlen(owner);
	return strncmp(c, "_c_", 3) == 0 && strncmp(c + 3, owner, n) == 0 && c[3 + n] == '-';
}

/* Delete every node of `owner` under dir, by `deadline`.
 * @return ZOK, ZNONODE (no dir), or an error (ZDEADLINE: in doubt). */
static int delete_owned(zk_store *st, zhandle_t *zh, const char *dir, const char *owner, int64_t deadline,
			int *deleted)
{
	struct String_vector sv = { 0, NULL };
	int rc = z_children(st, zh, dir, deadline, &sv, NULL);
	*deleted = 0;
	if (rc != ZOK)
		return rc;
	zop **ops = sv.count > 0 ? calloc((size_t)sv.count, sizeof(*ops)) : NULL;
	int n = 0;
	for (int i = 0; i < sv.count; i++) {
		if (!owned_by(sv.data[i], owner))
			continue;
		if (!ops) {
			rc = ZSYSTEMERROR;
			break;
		}
		char *p = dlock__sprintf("%s/%s", dir, sv.data[i]);
		zop *op = p ? op_new(st) : NULL;
		ops[n++] = op_sent(st, op, op ? zoo_adelete(zh, p, -1, cb_void, op) : ZSYSTEMERROR);
		free(p);
	}
	ops_wait(st, ops, (size_t)n, deadline);
	int first = ZOK;
	for (int i = 0; i < n; i++) {
		int r = op_rc(st, ops[i]);
		if (r == ZOK)
			(*deleted)++;
		else if (r != ZNONODE && first == ZOK)
			first = r;
		op_put(st, ops[i]);
	}
	free(ops);
	deallocate_String_vector(&sv);
	return rc != ZOK ? rc : first;
}

/* Create the chroot (persistent), prefix and name (containers) nodes: one
 * pipelined round trip (the creates run in order). */
static int make_parents(zk_store *st, zsess *z, const char *dir, int64_t deadline)
{
	char *p = dlock__strdup(dir);
	if (!p)
		return DLOCK_ENOMEM;
	size_t chroot_len = strlen(st->root) - strlen(base_name(st->root)) - 1;
	zop *ops[64];
	size_t n = 0;
	for (char *c = p + 1; n < 64; c++) {
		if (*c != '/' && *c != '\0')
			continue;
		char save = *c;
		*c = '\0';
		/* Inside the chroot only the prefix and the name are ours to reap. */
		bool ours = strlen(p) > chroot_len;
		zop *op = op_new(st);
		ops[n++] = op_sent(st, op,
				   op ? zoo_acreate2(z->zh, p, NULL, -1, &st->acl, ours ? ZOO_CONTAINER : ZOO_PERSISTENT,
						     cb_created, op)
				      : ZSYSTEMERROR);
		*c = save;
		if (save == '\0')
			break;
	}
	ops_wait(st, ops, n, deadline);
	int rc = ZOK;
	for (size_t i = 0; i < n; i++) {
		int r = op_rc(st, ops[i]);
		if (r != ZOK && r != ZNODEEXISTS && rc == ZOK)
			rc = r;
		op_put(st, ops[i]);
	}
	int out = rc == ZOK ? 0 : zerr(rc, "create", p);
	free(p);
	return out;
}

/* Find our own node after a lost connection (h->node NULL afterwards if
 * none; h->doubt cleared once the listing answered). */
static int find_own(zk_store *st, hold *h, int64_t deadline)
{
	struct String_vector sv = { 0, NULL };
	zhandle_t *zh = h->sess->zh;
	int rc = z_children(st, zh, h->dir, deadline, &sv, NULL);
	if (rc == ZNONODE) {
		h->doubt = false;
		return ZOK;
	}
	if (rc != ZOK)
		return rc;
	/* Exactly one create can have reached the server per attempt; should
	 * there be more, keep the first in line and delete the others. */
	child best = { NULL, -1, K_LOCK, 0 };
	for (int i = 0; i < sv.count; i++) {
		child c;
		if (owned_by(sv.data[i], h->owner) && dlock__zk_parse_child(sv.data[i], &c) &&
		    (!best.name || c.seq < best.seq))
			best = c;
	}
	for (int i = 0; i < sv.count && rc == ZOK; i++) {
		if (!owned_by(sv.data[i], h->owner))
			continue;
		char *p = dlock__sprintf("%s/%s", h->dir, sv.data[i]);
		if (!p) {
			rc = ZSYSTEMERROR;
			break;
		}
		if (sv.data[i] == best.name) {
			struct Stat stat;
			int r = z_exists(st, zh, p, deadline, &stat);
			if (r == ZOK) {
				h->node = p;
				h->czxid = stat.czxid;
				p = NULL;
			} else if (r != ZNONODE) {
				rc = r;
			}
		} else {
			int r = z_delete(st, zh, p, deadline);
			if (r != ZOK && r != ZNONODE)
				rc = r;
		}
		free(p);
	}
	deallocate_String_vector(&sv);
	if (rc == ZOK)
		h->doubt = false;
	return rc;
}

static char *node_data(dlock_request *req, int *len)
{
	char *d = dlock__sprintf("dlock1 pid=%d ttl=%lld permits=%u host=%s", req->pid, (long long)req->ttl_ms,
				 req->permits, req->host ? req->host : "");
	*len = d ? (int)strlen(d) : 0;
	return d;
}

static node_kind req_kind(const dlock_request *req)
{
	if (req->mode == DLOCK_SHARED)
		return K_READ;
	return req->permits > 1 ? K_SEM : K_LOCK;
}

/* The path prefix of our sequential node: a semaphore's names its permits
 * ("-sem3-"), which every later caller needs for the permits rule. */
static char *node_prefix(const zk_store *st, const hold *h, const dlock_request *req)
{
	if (st->recipe == RECIPE_CURATOR_RW)
		return dlock__sprintf("%s/_c_%s-%s", h->dir, h->owner,
				      req_kind(req) == K_READ ? "__READ__" : "__WRIT__");
	if (req_kind(req) == K_SEM)
		return dlock__sprintf("%s/_c_%s-sem%u-", h->dir, h->owner, req->permits);
	return dlock__sprintf("%s/_c_%s-%s-", h->dir, h->owner, kind_word(req_kind(req)));
}

/* Make sure h has a node in ZooKeeper: create it, or after a lost
 * connection (h->doubt) find the one our earlier create made. On failure
 * h->doubt says whether a node of ours may exist anyway. */
static int place_node(zk_store *st, hold *h, dlock_request *req, int64_t deadline)
{
	zhandle_t *zh = h->sess->zh;
	char *prefix = node_prefix(st, h, req);
	int dlen;
	char *data = node_data(req, &dlen);
	int rc = 0;
	if (!prefix || !data) {
		rc = dlock__oom();
		goto out;
	}
	for (int tries = 0;; tries++) {
		int r;
		if (h->doubt) {
			r = find_own(st, h, deadline);
			if (r == ZOK && h->node)
				break;
			if (r == ZOK)
				continue; /* the create never reached the server: make it now */
		} else {
			zop *op = op_new(st);
			op_sent(st, op,
				op ? zoo_acreate2(zh, prefix, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL, cb_created, op)
				   : ZSYSTEMERROR);
			r = op_wait1(st, op, deadline);
			if (r == ZOK) {
				h->node = op->value;
				h->czxid = op->stat.czxid;
				op->value = NULL;
			}
			op_put(st, op);
			if (r == ZOK)
				break;
			if (r == ZNONODE && tries < 4) {
				/* first use of the name, or its container was just reaped */
				if ((rc = make_parents(st, h->sess, h->dir, deadline)))
					goto out;
				continue;
			}
			if (lost_conn(r) || r == ZSYSTEMERROR)
				h->doubt = true;
		}
		if (!retryable(r) || tries >= 4 || !wait_connected(st, h->sess, deadline)) {
			rc = zerr(r, h->doubt ? "create (outcome unknown)" : "create", prefix);
			goto out;
		}
	}
out:
	free(prefix);
	free(data);
	return rc;
}

/* Is our node first in line among the children `sv` of h->dir (whose
 * cversion is given)? Sets h->watch to what blocks us.
 * @return 0 (*granted set), 1 when our node is gone, or an error. */
static int evaluate_list(hold *h, dlock_request *req, const struct String_vector *sv, int32_t cversion,
			 bool *granted)
{
	child *cs = calloc((size_t)sv->count + 1, sizeof(*cs));
	if (!cs)
		return dlock__oom();
	size_t n = 0;
	for (int i = 0; i < sv->count; i++)
		if (dlock__zk_parse_child(sv->data[i], &cs[n]))
			n++;
	qsort(cs, n, sizeof(*cs), by_seq);
	const char *mine = base_name(h->node);
	size_t me = n;
	for (size_t i = 0; i < n; i++)
		if (strcmp(cs[i].name, mine) == 0)
			me = i;
	int out = 0;
	if (me == n) {
		out = 1;
		goto done;
	}
	node_kind k = cs[me].kind;
	const child *blocker = NULL;
	bool crowd = false;
	size_t sems = 0;
	/* The permits rule (dlock/lock.h): a semaphore node holds while the nodes
	 * up to it number no more than the smallest permits among them (a node
	 * of an older client that does not name its permits counts as ours). */
	unsigned limit = req->permits;
	for (size_t i = 0; i < me; i++) {
		if (k == K_LOCK || (k == K_READ && cs[i].kind != K_READ) || (k == K_SEM && cs[i].kind != K_SEM))
			blocker = &cs[i]; /* the last earlier node that excludes us */
		else if (k == K_SEM) {
			sems++;
			if (cs[i].permits && cs[i].permits < limit)
				limit = cs[i].permits;
		}
	}
	if (!blocker && k == K_SEM && sems >= limit)
		crowd = true;
	*granted = !blocker && !crowd;
	free(h->watch);
	h->watch = NULL;
	h->watch_children = crowd;
	h->cversion = cversion;
	if (blocker)
		h->watch = dlock__sprintf("%s/%s", h->dir, blocker->name);
	else if (crowd)
		h->watch = dlock__strdup(h->dir);
	if (!*granted && !h->watch)
		out = DLOCK_ENOMEM;
done:
	free(cs);
	return out;
}

/* @return as evaluate_list, or 2 when the listing did not answer by the deadline. */
static int evaluate(zk_store *st, hold *h, dlock_request *req, int64_t deadline, bool *granted)
{
	struct String_vector sv = { 0, NULL };
	int32_t cversion = 0;
	int rc = z_children(st, h->sess->zh, h->dir, deadline, &sv, &cversion);
	if (rc == ZNONODE)
		return 1;
	if (rc == ZDEADLINE)
		return 2;
	if (rc != ZOK)
		return zerr(rc, "list", h->dir);
	rc = evaluate_list(h, req, &sv, cversion, granted);
	deallocate_String_vector(&sv);
	return rc;
}

/* The fast path of a first try: create our node and list its siblings in
 * one round trip. ZooKeeper runs a session's requests in order, so the list
 * already contains the node the create made.
 * @return 0 with h->node set and *granted decided; 1 when it could not be
 * used (no parent yet, or a lost connection: the careful path takes over,
 * h->doubt saying a node of ours may exist); 2 when the node was made but
 * its listing did not answer by the deadline; or an error (h->doubt set
 * when the create's outcome is unknown). */
static int create_and_list(zk_store *st, hold *h, dlock_request *req, int64_t deadline, bool *granted)
{
	char *path = node_prefix(st, h, req);
	int dlen;
	char *data = node_data(req, &dlen);
	zop *ops[2] = { NULL, NULL };
	if (!path || !data || !(ops[0] = op_new(st)) || !(ops[1] = op_new(st))) {
		free(path);
		free(data);
		if (ops[0]) { /* never sent */
			pthread_mutex_lock(&st->mu);
			op_free_locked(ops[0]);
			pthread_mutex_unlock(&st->mu);
		}
		return DLOCK_ENOMEM;
	}
	zhandle_t *zh = h->sess->zh;
	int r = zoo_acreate2(zh, path, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL, cb_created, ops[0]);
	op_sent(st, ops[0], r);
	op_sent(st, ops[1], r == ZOK ? zoo_aget_children2(zh, h->dir, 0, cb_kids, ops[1]) : r);
	free(path);
	free(data);
	ops_wait(st, ops, 2, deadline);
	int create_rc = op_rc(st, ops[0]), list_rc = op_rc(st, ops[1]);
	int out;
	if (create_rc == ZOK) {
		h->node = ops[0]->value; /* made; if not listed, the careful path lists */
		h->czxid = ops[0]->stat.czxid;
		ops[0]->value = NULL;
		out = 1;
		if (list_rc == ZOK) {
			out = evaluate_list(h, req, &ops[1]->kids, ops[1]->stat.cversion, granted);
			if (out == 1) /* cannot be (requests run in order), but never leave our node behind */
				out = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
						      "zookeeper: our new node is missing from %s", h->dir);
		} else if (list_rc == ZDEADLINE) {
			out = 2; /* as evaluate */
		}
	} else {
		h->doubt = lost_conn(create_rc) || create_rc == ZSYSTEMERROR;
		if (create_rc == ZDEADLINE)
			out = zerr(create_rc, "create (outcome unknown)", h->dir);
		else
			out = create_rc == ZNONODE || h->doubt ? 1 : zerr(create_rc, "create", h->dir);
	}
	op_put(st, ops[0]);
	op_put(st, ops[1]);
	return out;
}

/* Delete h's node (a refused try, a cancelled wait) and free h; what could
 * not be deleted in time goes to the sweep. */
static void discard_hold(zk_store *st, hold *h, int64_t deadline)
{
	if ((h->node || h->doubt) && !sess_dead(st, h->sess)) {
		int r = h->node ? z_delete(st, h->sess->zh, h->node, deadline) : ZDEADLINE;
		if (r != ZOK && r != ZNONODE && (lost_conn(r) || h->doubt)) {
			orphan_hold(st, h);
			return;
		}
	}
	hold_free(st, h);
}

/* A slot left from an earlier hold of the same lock handle (lost, attached). */
static hold *current_hold(zk_store *st, dlock_request *req, int64_t deadline)
{
	hold *h = req->slot;
	if (h && strcmp(h->owner, req->owner) != 0) {
		discard_hold(st, h, deadline);
		req->slot = h = NULL;
	}
	return h;
}

/* ---------------------------------------------------------------- methods */

static int zk_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	zk_store *st = (zk_store *)be;
	(void)retry_ms;
	int64_t start = dlock_clock_ms();
	int64_t deadline = req->deadline_ms;
	if (st->recipe != RECIPE_DLOCK && (req->permits > 1 || (st->recipe == RECIPE_CURATOR &&
								 req->mode == DLOCK_SHARED)))
		return dlock_error_set(DLOCK_ENOTSUPPORTED, KIND, NULL,
				       "recipe=%s: %s", st->recipe == RECIPE_CURATOR ? "curator" : "curator-rw",
				       req->permits > 1 ? "Curator's semaphores lay out nodes of their own: no "
							  "semaphores in a Curator recipe"
							: "Curator's InterProcessMutex does not order read nodes: "
							  "use recipe=curator-rw for shared locks");
	if (dlock_try_too_late(req, st->request_ms)) /* see "Time" in sys/backend.h */
		return dlock_error_set(DLOCK_ELOCKED, KIND, NULL, "lock '%s' not acquired by the end of the wait",
				       req->name);
	reap(st);
	hold *h = current_hold(st, req, deadline);
	if (h && sess_dead(st, h->sess)) {
		/* our queue position died with the session: queue again */
		hold_free(st, h);
		req->slot = h = NULL;
	}
	zsess *z;
	int rc = session_for(st, req->ttl_ms, deadline, &z);
	if (rc)
		return rc;
	if (!h) {
		h = dlock__calloc(1, sizeof(*h));
		if (!h)
			return DLOCK_ENOMEM;
		h->next = st->holds;
		if (st->holds)
			st->holds->prev = h;
		st->holds = h;
		h->owner = dlock__strdup(req->owner);
		h->dir = dir_of(st, req->name);
		if (!h->owner || !h->dir) {
			hold_free(st, h);
			return DLOCK_ENOMEM;
		}
		pthread_mutex_lock(&st->mu);
		h->sess = z;
		z->refs++;
		pthread_mutex_unlock(&st->mu);
		req->slot = h;
		int r = claim_orphan(st, h, deadline);
		if (r != ZOK) {
			req->slot = NULL;
			hold_free(st, h);
			return zerr(r, "wait for the sweep of", req->name);
		}
	}
	bool granted = false;
	for (int round = 0;; round++) {
		bool listed = false;
		if (!h->node) {
			rc = 1;
			if (round == 0 && !h->doubt) {
				rc = create_and_list(st, h, req, deadline, &granted);
				listed = rc == 0 || rc == 2;
			}
			if (rc == 1 && !h->node)
				rc = place_node(st, h, req, deadline);
			if (rc == 1)
				rc = 0;
			if (rc && rc != 2)
				break;
		}
		if (!listed)
			rc = evaluate(st, h, req, deadline, &granted);
		if (rc == 2) {
			/* Our place in line is known and the time ran out before we
			 * could look again: not granted, still queued (the core
			 * cancels or tries again). */
			if (req->waiting)
				return DLOCK_ELOCKED;
			rc = zerr(ZDEADLINE, "list", h->dir);
		}
		if (rc != 1)
			break;
		/* Our node is gone (deleted by hand, or by `dlock release` with our
		 * handle from elsewhere): queue again, a few times at most. */
		free(h->node);
		h->node = NULL;
		if (round >= 2) {
			rc = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZNONODE",
					     "zookeeper: our lock node under %s keeps disappearing", h->dir);
			break;
		}
	}
	if (rc) {
		req->slot = NULL;
		if (h->node || h->doubt)
			orphan_hold(st, h); /* our node, or a create in doubt: swept */
		else
			hold_free(st, h);
		return rc;
	}
	if (granted) {
		free(h->watch);
		h->watch = NULL;
		*fence = (uint64_t)h->czxid;
		lease_set(st, h, start, req->ttl_ms, false);
		return 0;
	}
	if (!req->waiting) {
		req->slot = NULL;
		discard_hold(st, h, deadline);
	}
	return DLOCK_ELOCKED;
}

/* release/extend of a hold this handle did not make (an attached handle, or
 * the core retrying a release that was not confirmed): find its node by owner. */
static int by_owner(zk_store *st, dlock_request *req, bool del, int64_t deadline)
{
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), deadline, &z);
	if (rc)
		return rc;
	char *dir = dir_of(st, req->name);
	if (!dir)
		return DLOCK_ENOMEM;
	int n = 0;
	int r;
	if (del) {
		r = delete_owned(st, z->zh, dir, req->owner, deadline, &n);
	} else {
		struct String_vector sv = { 0, NULL };
		r = z_children(st, z->zh, dir, deadline, &sv, NULL);
		for (int i = 0; r == ZOK && i < sv.count; i++)
			n += owned_by(sv.data[i], req->owner);
		deallocate_String_vector(&sv);
	}
	if (r != ZOK && r != ZNONODE) {
		rc = zerr(r, del ? "release in" : "look up", dir);
	} else if (n == 0) {
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "zookeeper: '%s' is not held by %s", req->name,
				     req->owner);
	}
	free(dir);
	return rc;
}

static int zk_release(dlock_backend *be, dlock_request *req)
{
	zk_store *st = (zk_store *)be;
	int64_t deadline = req->deadline_ms;
	reap(st);
	hold *h = current_hold(st, req, deadline);
	if (!h)
		return by_owner(st, req, true, deadline);
	req->slot = NULL;
	if (!h->node || sess_dead(st, h->sess)) {
		if (!h->node && h->doubt) { /* a create in doubt: the sweep finds it */
			orphan_hold(st, h);
			return dlock_error_set(DLOCK_ENOTHELD, KIND, NULL, "zookeeper: '%s' was not granted",
					       req->name);
		}
		hold_free(st, h);
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZSESSIONEXPIRED",
				       "zookeeper: the session that held '%s' expired", req->name);
	}
	int r = z_delete(st, h->sess->zh, h->node, deadline);
	bool retried = false;
	while (retryable(r) && !retried && wait_connected(st, h->sess, deadline)) {
		retried = true;
		r = z_delete(st, h->sess->zh, h->node, deadline);
		if (r == ZNONODE) /* our first delete went through before the connection dropped */
			r = ZOK;
	}
	if (r == ZOK) {
		hold_free(st, h);
		return 0;
	}
	int rc;
	if (r == ZNONODE) {
		rc = dlock_error_set(DLOCK_ENOTHELD, KIND, "ZNONODE", "zookeeper: our node for '%s' is gone",
				     req->name);
		hold_free(st, h);
	} else {
		rc = zerr(r, "delete", h->node);
		if (lost_conn(r))
			orphan_hold(st, h); /* deleted as soon as the session is connected again */
		else
			hold_free(st, h);
	}
	return rc;
}

static int zk_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	zk_store *st = (zk_store *)be;
	int64_t start = dlock_clock_ms();
	int64_t deadline = req->deadline_ms;
	hold *h = current_hold(st, req, deadline);
	if (!h)
		return by_owner(st, req, false, deadline); /* held by another session: it lives as long as that */
	if (!h->node || sess_dead(st, h->sess))
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZSESSIONEXPIRED",
				       "zookeeper: the session that held '%s' expired", req->name);
	pthread_mutex_lock(&st->mu);
	int granted = h->sess->negotiated;
	pthread_mutex_unlock(&st->mu);
	if (ttl_ms > granted)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: cannot extend '%s' to %lld ms: its session times out after %d ms "
				       "(release it and acquire with the longer ttl)",
				       req->name, (long long)ttl_ms, granted);
	struct Stat stat;
	int r = z_exists(st, h->sess->zh, h->node, deadline, &stat);
	if (r == ZOK && stat.ephemeralOwner == (int64_t)zoo_client_id(h->sess->zh)->client_id &&
	    lease_set(st, h, start, ttl_ms, true))
		return 0;
	if (r == ZOK || r == ZNONODE)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZNONODE", "zookeeper: our node for '%s' is gone",
				       req->name);
	return zerr(r, "check", h->node);
}

/* Confirm the holds of one session in one round trip: exists() of every
 * node, pipelined. Reads, not a multi of checks: a multi is a write, which
 * would cost a quorum proposal and a log fsync per renewal. */
static void renew_session(zk_store *st, zsess *z, dlock_request *const *reqs, size_t n, int *results,
			  int64_t start, int64_t deadline)
{
	bool dead = sess_dead(st, z), up = sess_connected(st, z);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		hold *h = reqs[i]->slot;
		if (results[i] != -1 || !h || h->sess != z)
			continue;
		if (dead || !up)
			results[i] = dead ? DLOCK_ENOTHELD : DLOCK_EUNAVAILABLE;
		else
			m++;
	}
	if (m == 0)
		return;
	zop **ops = calloc(m, sizeof(*ops));
	size_t *idx = calloc(m, sizeof(*idx));
	if (!ops || !idx) {
		free(ops);
		free(idx);
		return; /* left -1: reported transient */
	}
	size_t k = 0;
	for (size_t i = 0; i < n && k < m; i++) {
		hold *h = reqs[i]->slot;
		if (results[i] != -1 || !h || h->sess != z)
			continue;
		zop *op = op_new(st);
		ops[k] = op_sent(st, op, op ? zoo_aexists(z->zh, h->node, 0, cb_stat, op) : ZSYSTEMERROR);
		idx[k++] = i;
	}
	ops_wait(st, ops, k, deadline);
	for (size_t j = 0; j < k; j++) {
		int r = op_rc(st, ops[j]);
		results[idx[j]] = r == ZOK ? 0
				  : (r == ZNONODE || r == ZSESSIONEXPIRED || r == ZINVALIDSTATE) ? DLOCK_ENOTHELD
				  : DLOCK_EUNAVAILABLE;
		if (r == ZOK && !lease_set(st, reqs[idx[j]]->slot, start, reqs[idx[j]]->ttl_ms, true))
			results[idx[j]] = DLOCK_ENOTHELD; /* its lease ended: the sweep deletes it */
		op_put(st, ops[j]);
	}
	free(ops);
	free(idx);
}

static int zk_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	zk_store *st = (zk_store *)be;
	int64_t start = dlock_clock_ms();
	reap(st);
	int64_t deadline = n ? reqs[0]->deadline_ms : start;
	for (size_t i = 0; i < n; i++) {
		hold *h = reqs[i]->slot;
		results[i] = -1; /* not done yet */
		if (!h || !h->node || strcmp(h->owner, reqs[i]->owner) != 0)
			results[i] = DLOCK_ENOTHELD;
	}
	for (size_t i = 0; i < n; i++) {
		if (results[i] != -1)
			continue;
		renew_session(st, ((hold *)reqs[i]->slot)->sess, reqs, n, results, start, deadline);
	}
	for (size_t i = 0; i < n; i++)
		if (results[i] == -1)
			results[i] = DLOCK_EUNAVAILABLE;
	return 0;
}

static int zk_cancel(dlock_backend *be, dlock_request *req)
{
	zk_store *st = (zk_store *)be;
	hold *h = req->slot;
	req->slot = NULL;
	if (h)
		discard_hold(st, h, req->deadline_ms);
	return 0;
}

static int zk_wait(dlock_backend *be, dlock_request *req, int64_t timeout_ms)
{
	zk_store *st = (zk_store *)be;
	hold *h = req->slot;
	int64_t until = dlock_clock_ms() + timeout_ms;
	pthread_mutex_lock(&st->mu);
	if (!h || !h->watch || h->sess->expired || h->sess->state != ZOO_CONNECTED_STATE) {
		/* nothing to watch now: wait for the session to change, briefly */
		struct timespec ts;
		dlock__abstime(&ts, timeout_ms < 100 ? timeout_ms : 100);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
		pthread_mutex_unlock(&st->mu);
		return 0;
	}
	zsess *z = h->sess;
	z->refs++;
	watch_wait w = { st->waits, z, h->watch, false };
	st->waits = &w;
	pthread_mutex_unlock(&st->mu);

	/* A data watch, not an exists watch: it is set only if the node exists,
	 * so a vanished predecessor leaves no watch behind. */
	zop *op = op_new(st);
	int r = !op ? ZSYSTEMERROR
	      : h->watch_children ? zoo_awget_children2(z->zh, h->dir, watcher, z, cb_kids, op)
				  : zoo_awget(z->zh, h->watch, watcher, z, cb_data, op);
	op_sent(st, op, r);

	pthread_mutex_lock(&st->mu);
	for (;;) {
		if (!op || op->done) {
			/* gone (ZNONODE), an error acquire will report, or the
			 * children changed since we looked */
			if (!op || op->rc != ZOK || (h->watch_children && op->stat.cversion != h->cversion))
				break;
		}
		if (w.fired || z->expired || z->state != ZOO_CONNECTED_STATE)
			break;
		int64_t left = until - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	for (watch_wait **p = &st->waits; *p; p = &(*p)->next) {
		if (*p == &w) {
			*p = w.next;
			break;
		}
	}
	if (op)
		op_unref_locked(op);
	zsess *dead = unref_locked(z);
	pthread_mutex_unlock(&st->mu);
	close_sess(dead);
	return 0;
}

/* ---------------------------------------------------------------- status */

static int status_one(zk_store *st, zhandle_t *zh, const char *name, int64_t deadline, dlock_lock_status **out,
		      size_t *count)
{
	dlock_lock_status *s = dlock__status_add(out, count);
	if (!s || !(s->name = dlock__strdup(name)))
		return DLOCK_ENOMEM;
	char *dir = dir_of(st, name);
	if (!dir)
		return DLOCK_ENOMEM;
	struct String_vector sv = { 0, NULL };
	int r = z_children(st, zh, dir, deadline, &sv, NULL);
	if (r == ZNONODE) {
		free(dir);
		return 0;
	}
	if (r != ZOK) {
		int rc = zerr(r, "list", dir);
		free(dir);
		return rc;
	}
	child *cs = calloc((size_t)sv.count + 1, sizeof(*cs));
	zop **ops = calloc((size_t)sv.count + 1, sizeof(*ops));
	int rc = cs && ops ? 0 : dlock__oom();
	size_t n = 0;
	for (int i = 0; cs && i < sv.count; i++)
		if (dlock__zk_parse_child(sv.data[i], &cs[n]))
			n++;
	if (cs)
		qsort(cs, n, sizeof(*cs), by_seq);
	/* Every node's data in one pipelined round trip. */
	for (size_t i = 0; i < n && !rc; i++) {
		char *p = dlock__sprintf("%s/%s", dir, cs[i].name);
		zop *op = p ? op_new(st) : NULL;
		ops[i] = op_sent(st, op, op ? zoo_aget(zh, p, 0, cb_data, op) : ZSYSTEMERROR);
		free(p);
	}
	if (!rc)
		ops_wait(st, ops, n, deadline);
	/* Who holds: the same rule acquire applies, node by node. */
	size_t sems = 0;
	bool writer_seen = false, reader_seen = false;
	unsigned sem_limit = UINT_MAX; /* the smallest permits of the semaphore nodes so far */
	for (size_t i = 0; i < n && !rc; i++) {
		r = op_rc(st, ops[i]);
		if (r == ZNONODE)
			continue;
		if (r != ZOK) {
			rc = zerr(r, "read", dir);
			break;
		}
		char data[600];
		int len = ops[i]->vlen < (int)sizeof(data) - 1 ? ops[i]->vlen : (int)sizeof(data) - 1;
		if (len > 0)
			memcpy(data, ops[i]->value, (size_t)len);
		data[len > 0 ? len : 0] = '\0';
		struct Stat stat = ops[i]->stat;
		int pid = 0;
		long long ttl = -1;
		unsigned permits = 1;
		char host[256] = "";
		const char *hp = strstr(data, " host=");
		if (hp)
			snprintf(host, sizeof(host), "%s", hp + 6);
		if (sscanf(data, "dlock1 pid=%d ttl=%lld permits=%u", &pid, &ttl, &permits) != 3)
			pid = 0, ttl = -1, permits = 1;
		bool holds;
		switch (cs[i].kind) {
		case K_READ:
			holds = !writer_seen && sems == 0;
			reader_seen = true;
			break;
		case K_SEM:
			if (permits < sem_limit)
				sem_limit = permits;
			holds = !writer_seen && !reader_seen && sems < sem_limit;
			sems++;
			if (permits > 1)
				s->permits = permits;
			break;
		default:
			holds = i == 0;
			writer_seen = true;
			break;
		}
		if (!holds) {
			s->waiters++;
			continue;
		}
		dlock_holder *hd = dlock__status_add_holder(s);
		if (!hd) {
			rc = DLOCK_ENOMEM;
			break;
		}
		/* owner: between "_c_" and "-<kind>-<seq>" */
		const char *o = strncmp(cs[i].name, "_c_", 3) == 0 ? cs[i].name + 3 : cs[i].name;
		size_t olen = strlen(o) - SEQ_DIGITS - 1;
		while (olen > 0 && o[olen - 1] != '-')
			olen--;
		hd->owner = dlock__strndup(o, olen ? olen - 1 : 0);
		hd->host = dlock__strdup(host);
		hd->pid = pid;
		hd->mode = cs[i].kind == K_READ ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		hd->fence = (uint64_t)stat.czxid;
		/* The node lives as long as its holder's session: its ttl is what the
		 * holder itself allows between confirmations. */
		hd->ttl_left_ms = ttl;
		if ((uint64_t)stat.czxid > s->last_fence)
			s->last_fence = (uint64_t)stat.czxid;
		if (!hd->owner || !hd->host)
			rc = DLOCK_ENOMEM;
	}
	for (size_t i = 0; ops && i < n; i++)
		op_put(st, ops[i]);
	free(ops);
	free(cs);
	deallocate_String_vector(&sv);
	free(dir);
	return rc;
}

/* The core lists through zk_list, so names is never NULL here. Bounded by
 * the request timeout from the start of the call. */
static int zk_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count)
{
	zk_store *st = (zk_store *)be;
	int64_t deadline = dlock_clock_ms() + st->request_ms;
	reap(st);
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), deadline, &z);
	for (size_t i = 0; i < nnames && !rc; i++)
		rc = status_one(st, z->zh, names[i], deadline, out, count);
	return rc;
}

/* The name nodes under the root (a name node with nobody in it, about to be
 * reaped, shows as an idle lock: the core drops it). */
static int zk_list(dlock_backend *be, char ***names, size_t *n)
{
	zk_store *st = (zk_store *)be;
	int64_t deadline = dlock_clock_ms() + st->request_ms;
	reap(st);
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), deadline, &z);
	if (rc)
		return rc;
	struct String_vector sv = { 0, NULL };
	int r = z_children(st, z->zh, st->root, deadline, &sv, NULL);
	if (r == ZNONODE)
		return 0;
	if (r != ZOK)
		return zerr(r, "list", st->root);
	char **all = sv.count > 0 ? calloc((size_t)sv.count, sizeof(*all)) : NULL;
	if (sv.count > 0 && !all)
		rc = dlock__oom();
	for (int i = 0; i < sv.count && all; i++)
		if ((all[*n] = dlock__zk_unescape(sv.data[i])) != NULL) /* NULL: not a name of ours */
			(*n)++;
	*names = all;
	deallocate_String_vector(&sv);
	return rc;
}

static void zk_close(dlock_backend *be)
{
	zk_store *st = (zk_store *)be;
	reap(st);
	/* Holds nobody released: a lock freed after it was lost (the core does
	 * not release those). Their nodes end with the sessions below. */
	while (st->holds)
		hold_free(st, st->holds);
	/* Orphans' nodes end with the sessions too. Closing a session completes
	 * its requests in flight (ZCLOSING), sweeps included: `closing` keeps
	 * those from freeing orphans or starting anything. */
	pthread_mutex_lock(&st->mu);
	st->closing = true;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	if (st->sweeper_started)
		pthread_join(st->sweeper, NULL);
	pthread_mutex_lock(&st->mu);
	zsess *all = st->sessions;
	st->sessions = NULL;
	pthread_mutex_unlock(&st->mu);
	while (all) {
		zsess *z = all;
		all = z->next;
		close_sess(z);
	}
	reap(st);
	/* libzookeeper (3.8) can lose completions it queues while closing (its
	 * completion thread may stop before running them): free what never
	 * came back. No completion can come any more. */
	while (st->ops)
		op_free_locked(st->ops);
	while (st->orphans) {
		orphan *o = st->orphans;
		st->orphans = o->next;
		o->sess = NULL; /* closed above */
		orphan_free_locked(o);
	}
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st->hosts);
	dlock_free(st->hp);
	free(st->root);
	if (st->auth) {
		memset(st->auth, 0, strlen(st->auth));
		free(st->auth);
	}
	free(st);
}

/* ---------------------------------------------------------------- open */

static int check_chroot(const char *path)
{
	if (!*path || strcmp(path, "/") == 0)
		return 0;
	if (path[0] != '/')
		return DLOCK_EINVAL;
	for (const char *c = path + 1;;) {
		size_t n = strcspn(c, "/");
		if (n == 0 && c[0] == '\0' && c[-1] == '/')
			return 0; /* a trailing slash */
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return DLOCK_EINVAL;
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
				return DLOCK_EINVAL;
		if (c[n] == '\0')
			return 0;
		c += n + 1;
	}
}

/* Ephemeral nodes live with our session: DLOCK_BACKEND_F_SESSION. */
static const dlock_backend_methods zk_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_SESSION,
	.acquire = zk_acquire,
	.release = zk_release,
	.renew = zk_renew,
	.extend = zk_extend,
	.wait = zk_wait,
	.cancel = zk_cancel,
	.status = zk_status,
	.list = zk_list,
	.close = zk_close,
};

int dlock__zk_open(dlock_backend **out, dlock_uri *uri)
{
	if (!uri->hosts || !*uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper URIs name servers: zk://host:port[,host:port...][/chroot]");
	if (check_chroot(uri->path))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: bad chroot '%s' (want /a/b: no empty, '.' or '..' parts)", uri->path);
	int64_t fixed = 0;
	const char *v = dlock_uri_param(uri, "session_timeout");
	if (v && (dlock_duration_parse(&fixed, v) != 0 || fixed < 10 || fixed > INT32_MAX / 2))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: bad session_timeout '%s' (a duration such as 10s)", v);
	if (uri->user && !uri->password)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: digest auth needs user:password@ (got a user without a password)");
	if (!*uri->prefix)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "zookeeper: the prefix must not be empty");
	int recipe = RECIPE_DLOCK;
	if ((v = dlock_uri_param(uri, "recipe")) != NULL) {
		if (strcmp(v, "curator") == 0)
			recipe = RECIPE_CURATOR;
		else if (strcmp(v, "curator-rw") == 0)
			recipe = RECIPE_CURATOR_RW;
		else if (strcmp(v, "dlock") != 0)
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "zookeeper: unknown recipe '%s' (dlock, curator or curator-rw)", v);
	}

	dlock_hostport *hp = NULL;
	size_t nh = 0;
	int rc = dlock_uri_hosts(uri, 2181, &hp, &nh);
	if (rc)
		return rc;
	zk_store *st = dlock__calloc(1, sizeof(*st));
	if (!st) {
		dlock_free(hp);
		return DLOCK_ENOMEM;
	}
	dlock_backend_init(&st->base, &zk_methods);
	st->fixed_session = fixed;
	st->recipe = recipe;
	st->connect_ms = uri->connect_timeout_ms;
	st->request_ms = uri->request_timeout_ms > 0 ? uri->request_timeout_ms : 2000;
	st->default_ttl = uri->ttl_ms;
	pthread_mutex_init(&st->mu, NULL);
	dlock__cond_init_monotonic(&st->cv);

	size_t cap = nh * 270 + 1;
	st->hosts = calloc(1, cap);
	for (size_t i = 0; st->hosts && i < nh; i++) {
		size_t len = strlen(st->hosts);
		bool v6 = strchr(hp[i].host, ':') != NULL;
		snprintf(st->hosts + len, cap - len, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", hp[i].host,
			 v6 ? "]" : "", hp[i].port);
	}
	st->hp = hp;
	st->nh = nh;
	char *pre = dlock__zk_escape(uri->prefix);
	const char *chroot = strcmp(uri->path, "/") == 0 ? "" : uri->path;
	size_t cl = strlen(chroot);
	while (cl > 0 && chroot[cl - 1] == '/')
		cl--;
	st->root = pre ? dlock__sprintf("%.*s/%s", (int)cl, chroot, pre) : NULL;
	if (!cl && pre && strcmp(pre, "zookeeper") == 0) {
		free(pre);
		zk_close(&st->base);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: prefix 'zookeeper' is reserved by the server at the root");
	}
	free(pre);
	if (uri->user)
		st->auth = dlock__sprintf("%s:%s", uri->user, uri->password);
	for (size_t i = 0; uri->user && i < nh; i++)
		if (!dlock__host_is_local(hp[i].host)) {
			dlock__open_warning("zookeeper: the digest password and the lock traffic go to %s over "
					    "plain TCP, which a man in the middle can read (this build's client has "
					    "no TLS)", hp[i].host);
			break;
		}
	if (!st->hosts || !st->root || (uri->user && !st->auth)) {
		zk_close(&st->base);
		return DLOCK_ENOMEM;
	}
	if (st->auth) {
		/* Ours to change, readable by all (status from other credentials). */
		st->acl_entries[0] = (struct ACL){ ZOO_PERM_ALL, ZOO_AUTH_IDS };
		st->acl_entries[1] = (struct ACL){ ZOO_PERM_READ, ZOO_ANYONE_ID_UNSAFE };
		st->acl = (struct ACL_vector){ 2, st->acl_entries };
	} else {
		st->acl = ZOO_OPEN_ACL_UNSAFE;
	}
	/* Every option is read by now: report a misspelt one before spending
	 * connect_timeout on a server that may not be there. */
	if ((rc = dlock__uri_check_unused(uri))) {
		zk_close(&st->base);
		return rc;
	}
	/* Connect now: a wrong address or credentials should fail at open (a
	 * ttl the session cannot cover is refused per lock, at acquire). */
	zsess *z;
	rc = get_session(st, session_key(st, st->default_ttl), dlock_clock_ms() + st->connect_ms, &z);
	if (rc) {
		zk_close(&st->base);
		return rc;
	}
	*out = &st->base;
	return 0;
}
