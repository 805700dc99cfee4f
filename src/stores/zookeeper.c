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
#include "core/internal.h"
#include "stores/zookeeper_parse.h"

#include <errno.h>
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
	int refs;
} zsess;

/* A wait() in progress: the watcher marks it when its path fires. */
typedef struct watch_wait {
	struct watch_wait *next;
	zsess *sess;
	const char *path;
	bool fired;
} watch_wait;

/* A node of ours in doubt (connection lost while creating or deleting it):
 * adopted by a retry of the same owner, else deleted once we can. */
typedef struct orphan {
	struct orphan *next;
	zsess *sess;
	char *dir;
	char *owner;
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
} hold;

struct zk_store {
	dlock_backend base;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char *hosts;
	char *root;             /* "/chroot/<escaped prefix>" */
	char *auth;             /* "user:password" or NULL */
	int64_t fixed_session;  /* session_timeout= (0: follow each hold's ttl) */
	int64_t connect_ms;
	int64_t default_ttl;
	zsess *sessions;
	watch_wait *waits;
	orphan *orphans;
	hold *holds;            /* under the core's mutex, like every hold */
	struct ACL acl_entries[2];
	struct ACL_vector acl;
};

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
	return dlock_error_set(code, KIND, zcode(rc), "zookeeper: %s %s: %s", what, path ? path : "",
			       zerror(rc));
}

static bool lost_conn(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
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
	if (n >= SEQ_DIGITS + 6 && strncmp(d - 6, "-read-", 6) == 0)
		c->kind = K_READ;
	else if (n >= SEQ_DIGITS + 5 && strncmp(d - 5, "-sem-", 5) == 0)
		c->kind = K_SEM;
	else if (n >= SEQ_DIGITS + 9 && strncmp(d - 9, "__rlock__", 9) == 0)
		c->kind = K_READ;
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

/* Does child name c belong to owner? ("_c_<owner>-<kind>-<seq>") */
static bool owned_by(const char *c, const char *owner)
{
	size_t n = strlen(owner);
	return strncmp(c, "_c_", 3) == 0 && strncmp(c + 3, owner, n) == 0 && c[3 + n] == '-';
}

/* ---------------------------------------------------------------- sessions */

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

static void close_sess(zsess *z)
{
	if (!z)
		return;
	if (z->zh)
		zookeeper_close(z->zh);
	free(z);
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

/* Under st->mu: wait until z is connected (true) or dead, or ms pass. */
static bool wait_connected_locked(zk_store *st, zsess *z, int64_t ms)
{
	int64_t until = dlock_clock_ms() + ms;
	while (!z->expired && z->state != ZOO_CONNECTED_STATE) {
		int64_t left = until - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	return !z->expired && z->state == ZOO_CONNECTED_STATE;
}

static bool wait_connected(zk_store *st, zsess *z, int64_t ms)
{
	pthread_mutex_lock(&st->mu);
	bool ok = wait_connected_locked(st, z, ms);
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

/* A connected session with timeout key `want` (made, or remade after expiry,
 * as needed). Borrowed: valid while the caller holds the core's store mutex. */
static int get_session(zk_store *st, int64_t want, zsess **out)
{
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
		bool ok = wait_connected_locked(st, z, st->connect_ms);
		if (ok) {
			pthread_mutex_unlock(&st->mu);
			*out = z;
			return 0;
		}
		if (!z->expired || z->auth_failed) {
			int rc = z->expired ? dead_sess_error(z)
					    : dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZCONNECTIONLOSS",
							      "zookeeper: not connected to any of %s within %lld ms",
							      st->hosts, (long long)st->connect_ms);
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
	errno = 0;
	zhandle_t *zh = zookeeper_init2(st->hosts, watcher, (int)want, NULL, z, 0, quiet_log);
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
		int rc = zoo_add_auth(zh, "digest", st->auth, (int)strlen(st->auth), NULL, NULL);
		if (rc != ZOK) {
			unref(st, z);
			return zerr(rc, "add digest auth for", "session");
		}
	}
	pthread_mutex_lock(&st->mu);
	bool ok = wait_connected_locked(st, z, st->connect_ms);
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
				       "zookeeper: no server of %s answered within %lld ms", st->hosts,
				       (long long)st->connect_ms);
	}
	*out = z;
	return 0;
}

/* The session for a hold of ttl_ms, refusing a ttl the server's session
 * timeout cannot cover. */
static int session_for(zk_store *st, int64_t ttl_ms, zsess **out)
{
	int rc = get_session(st, session_key(st, ttl_ms), out);
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

static void hold_free(zk_store *st, hold *h)
{
	if (!h)
		return;
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

static void orphan_free(zk_store *st, orphan *o)
{
	unref(st, o->sess);
	free(o->dir);
	free(o->owner);
	free(o);
}

/* Our node's fate is unknown (or its delete failed): remember it, so a retry
 * of the same owner adopts it and otherwise it is deleted as soon as we can.
 * Takes over h (freed). */
static void orphan_hold(zk_store *st, hold *h)
{
	pthread_mutex_lock(&st->mu);
	bool dead = h->sess->expired;
	pthread_mutex_unlock(&st->mu);
	orphan *o = dead ? NULL : calloc(1, sizeof(*o));
	if (o) {
		o->sess = h->sess;
		o->dir = h->dir;
		o->owner = h->owner;
		h->sess = NULL;
		h->dir = h->owner = NULL;
		o->next = st->orphans; /* the list is only used under the core's mutex */
		st->orphans = o;
	}
	hold_free(st, h);
}

/* Note that a node of h may exist (a create whose reply was lost) so that
 * place_node's adopt_orphan looks for it; h stays ours. */
static void orphan_hold_keep(zk_store *st, hold *h)
{
	orphan *o = calloc(1, sizeof(*o));
	if (!o)
		return;
	o->dir = strdup(h->dir);
	o->owner = strdup(h->owner);
	if (!o->dir || !o->owner) {
		free(o->dir);
		free(o->owner);
		free(o);
		return;
	}
	pthread_mutex_lock(&st->mu);
	o->sess = h->sess;
	h->sess->refs++;
	pthread_mutex_unlock(&st->mu);
	o->next = st->orphans;
	st->orphans = o;
}

/* Delete every node of `owner` under dir. @return ZOK, ZNONODE (none), or an error. */
static int delete_owned(zhandle_t *zh, const char *dir, const char *owner, int *deleted)
{
	struct String_vector sv = { 0, NULL };
	int rc = zoo_get_children(zh, dir, 0, &sv);
	*deleted = 0;
	if (rc != ZOK)
		return rc;
	int first = ZOK;
	for (int i = 0; i < sv.count; i++) {
		if (!owned_by(sv.data[i], owner))
			continue;
		char *p = dlock__sprintf("%s/%s", dir, sv.data[i]);
		int r = p ? zoo_delete(zh, p, -1) : ZSYSTEMERROR;
		free(p);
		if (r == ZOK)
			(*deleted)++;
		else if (r != ZNONODE && first == ZOK)
			first = r;
	}
	deallocate_String_vector(&sv);
	return first;
}

/* Delete the nodes of holds we gave up on while the connection was down
 * (except those of `keep`, an owner whose acquire is being retried: it
 * adopts its node and keeps its place in the queue). */
static void sweep_orphans(zk_store *st, const char *keep)
{
	for (orphan **p = &st->orphans; *p;) {
		orphan *o = *p;
		if (keep && strcmp(o->owner, keep) == 0) {
			p = &o->next;
			continue;
		}
		if (sess_dead(st, o->sess)) { /* its nodes died with it */
			*p = o->next;
			orphan_free(st, o);
			continue;
		}
		if (!sess_connected(st, o->sess)) {
			p = &o->next;
			continue;
		}
		int n, rc = delete_owned(o->sess->zh, o->dir, o->owner, &n);
		if (lost_conn(rc)) {
			p = &o->next;
			continue;
		}
		*p = o->next;
		orphan_free(st, o);
	}
}

/* Take back an orphan of this owner (a retry after a lost create). */
static bool adopt_orphan(zk_store *st, hold *h)
{
	for (orphan **p = &st->orphans; *p; p = &(*p)->next) {
		orphan *o = *p;
		if (o->sess == h->sess && strcmp(o->owner, h->owner) == 0 && strcmp(o->dir, h->dir) == 0) {
			*p = o->next;
			orphan_free(st, o);
			return true;
		}
	}
	return false;
}

/* Create the chroot (persistent), prefix and name (containers) nodes. */
static int make_parents(zk_store *st, zsess *z, const char *dir)
{
	char *p = dlock__strdup(dir);
	if (!p)
		return DLOCK_ENOMEM;
	size_t chroot_len = strlen(st->root) - strlen(base_name(st->root)) - 1;
	int rc = ZOK;
	for (char *c = p + 1;; c++) {
		if (*c != '/' && *c != '\0')
			continue;
		char save = *c;
		*c = '\0';
		/* Inside the chroot only the prefix and the name are ours to reap. */
		bool ours = strlen(p) > chroot_len;
		int r = zoo_create(z->zh, p, NULL, -1, &st->acl, ours ? ZOO_CONTAINER : ZOO_PERSISTENT, NULL, 0);
		*c = save;
		if (r != ZOK && r != ZNODEEXISTS) {
			rc = r;
			break;
		}
		if (save == '\0')
			break;
	}
	int out = rc == ZOK ? 0 : zerr(rc, "create", p);
	free(p);
	return out;
}

/* Find our own node after a lost connection (h->node NULL afterwards if none). */
static int find_own(zk_store *st, hold *h)
{
	(void)st;
	struct String_vector sv = { 0, NULL };
	zhandle_t *zh = h->sess->zh;
	int rc = zoo_get_children(zh, h->dir, 0, &sv);
	if (rc == ZNONODE)
		return ZOK;
	if (rc != ZOK)
		return rc;
	/* Exactly one create can have reached the server per attempt; should
	 * there be more, keep the first in line and delete the others. */
	child best = { NULL, -1, K_LOCK };
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
			int r = zoo_exists(zh, p, 0, &stat);
			if (r == ZOK) {
				h->node = p;
				h->czxid = stat.czxid;
				p = NULL;
			} else if (r != ZNONODE) {
				rc = r;
			}
		} else {
			int r = zoo_delete(zh, p, -1);
			if (r != ZOK && r != ZNONODE)
				rc = r;
		}
		free(p);
	}
	deallocate_String_vector(&sv);
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

/* Make sure h has a node in ZooKeeper: create it, or after a lost
 * connection find the one our earlier create made. On failure *doubt says
 * whether a node of ours may exist anyway. */
static int place_node(zk_store *st, hold *h, dlock_request *req, bool *doubt)
{
	zhandle_t *zh = h->sess->zh;
	*doubt = adopt_orphan(st, h);
	char *prefix = dlock__sprintf("%s/_c_%s-%s-", h->dir, h->owner, kind_word(req_kind(req)));
	int dlen;
	char *data = node_data(req, &dlen);
	size_t cap = prefix ? strlen(prefix) + SEQ_DIGITS + 2 : 0;
	char *created = prefix ? malloc(cap) : NULL;
	int rc = 0;
	if (!prefix || !data || !created) {
		rc = dlock__oom();
		goto out;
	}
	for (int tries = 0;; tries++) {
		int r;
		if (*doubt) {
			r = find_own(st, h);
			if (r == ZOK && h->node)
				break;
			if (r == ZOK) {
				*doubt = false; /* the create never reached the server: make it now */
				continue;
			}
		} else {
			struct Stat stat;
			r = zoo_create2(zh, prefix, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL, created, (int)cap,
					&stat);
			if (r == ZOK) {
				if (!(h->node = dlock__strdup(created))) {
					rc = DLOCK_ENOMEM;
					*doubt = true;
					goto out;
				}
				h->czxid = stat.czxid;
				break;
			}
			if (r == ZNONODE && tries < 4) {
				/* first use of the name, or its container was just reaped */
				if ((rc = make_parents(st, h->sess, h->dir)))
					goto out;
				continue;
			}
			if (lost_conn(r))
				*doubt = true;
		}
		if (!lost_conn(r) || tries >= 4 || !wait_connected(st, h->sess, st->connect_ms)) {
			rc = zerr(r, *doubt ? "create (outcome unknown)" : "create", prefix);
			goto out;
		}
	}
out:
	free(prefix);
	free(data);
	free(created);
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
	for (size_t i = 0; i < me; i++) {
		if (k == K_LOCK || (k == K_READ && cs[i].kind != K_READ) || (k == K_SEM && cs[i].kind != K_SEM))
			blocker = &cs[i]; /* the last earlier node that excludes us */
		else if (k == K_SEM)
			sems++;
	}
	if (!blocker && k == K_SEM && sems >= (req->permits ? req->permits : 1))
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

static int evaluate(hold *h, dlock_request *req, bool *granted)
{
	struct String_vector sv = { 0, NULL };
	struct Stat dstat;
	int rc = zoo_get_children2(h->sess->zh, h->dir, 0, &sv, &dstat);
	if (rc == ZNONODE)
		return 1;
	if (rc != ZOK)
		return zerr(rc, "list", h->dir);
	rc = evaluate_list(h, req, &sv, dstat.cversion, granted);
	deallocate_String_vector(&sv);
	return rc;
}

/* The fast path of a first try: create our node and list its siblings in
 * one round trip. ZooKeeper runs a session's requests in order, so the list
 * already contains the node the create made. */
typedef struct pipelined {
	zk_store *st;
	int pending;
	int create_rc, list_rc;
	char *created;
	int64_t czxid;
	struct String_vector kids; /* our copy: the library frees its own */
	int32_t cversion;
} pipelined;

static void pl_done(pipelined *p)
{
	if (--p->pending == 0)
		pthread_cond_broadcast(&p->st->cv);
}

static void pl_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
	pipelined *p = (pipelined *)data;
	char *v = rc == ZOK && value ? strdup(value) : NULL;
	pthread_mutex_lock(&p->st->mu);
	p->create_rc = rc == ZOK && !v ? ZSYSTEMERROR : rc;
	p->created = v;
	if (rc == ZOK && stat)
		p->czxid = stat->czxid;
	pl_done(p);
	pthread_mutex_unlock(&p->st->mu);
}

static void pl_listed(int rc, const struct String_vector *strings, const struct Stat *stat, const void *data)
{
	pipelined *p = (pipelined *)data;
	struct String_vector kids = { 0, NULL };
	if (rc == ZOK && strings && strings->count > 0) {
		kids.data = calloc((size_t)strings->count, sizeof(char *));
		for (int i = 0; kids.data && i < strings->count; i++) {
			if (!(kids.data[i] = strdup(strings->data[i])))
				break;
			kids.count++;
		}
		if (kids.count != strings->count)
			rc = ZSYSTEMERROR;
	}
	pthread_mutex_lock(&p->st->mu);
	p->list_rc = rc;
	p->kids = kids;
	if (rc == ZOK && stat)
		p->cversion = stat->cversion;
	pl_done(p);
	pthread_mutex_unlock(&p->st->mu);
}

/* Try the fast path. @return 0 with h->node set and *granted decided; 1 when
 * it could not be used (no parent yet, or a lost connection: the careful
 * path takes over, knowing a node of ours may exist, *doubt); or an error. */
static int create_and_list(zk_store *st, hold *h, dlock_request *req, bool *granted, bool *doubt)
{
	*doubt = false;
	char *path = dlock__sprintf("%s/_c_%s-%s-", h->dir, h->owner, kind_word(req_kind(req)));
	int dlen;
	char *data = node_data(req, &dlen);
	if (!path || !data) {
		free(path);
		free(data);
		return DLOCK_ENOMEM;
	}
	pipelined p = { .st = st, .pending = 0, .create_rc = ZSYSTEMERROR, .list_rc = ZSYSTEMERROR };
	zhandle_t *zh = h->sess->zh;
	pthread_mutex_lock(&st->mu);
	p.pending = 2;
	pthread_mutex_unlock(&st->mu);
	int r = zoo_acreate2(zh, path, data, dlen, &st->acl, ZOO_EPHEMERAL_SEQUENTIAL, pl_created, &p);
	int r2 = r == ZOK ? zoo_aget_children2(zh, h->dir, 0, pl_listed, &p) : r;
	pthread_mutex_lock(&st->mu);
	if (r != ZOK) {
		p.pending -= 2;
		p.create_rc = r;
	} else if (r2 != ZOK) {
		p.pending--;
		p.list_rc = r2;
	}
	while (p.pending > 0)
		pthread_cond_wait(&st->cv, &st->mu);
	pthread_mutex_unlock(&st->mu);
	free(path);
	free(data);
	int out;
	if (p.create_rc == ZOK && p.list_rc == ZOK) {
		h->node = p.created;
		h->czxid = p.czxid;
		p.created = NULL;
		out = evaluate_list(h, req, &p.kids, p.cversion, granted);
		if (out == 1) /* cannot be (requests run in order), but never leave our node behind */
			out = dlock_error_set(DLOCK_EUNAVAILABLE, KIND, NULL,
					      "zookeeper: our new node is missing from %s", h->dir);
	} else if (p.create_rc == ZOK) {
		h->node = p.created; /* made, but not listed: the careful path lists */
		h->czxid = p.czxid;
		p.created = NULL;
		out = 1;
	} else {
		*doubt = lost_conn(p.create_rc) || p.create_rc == ZSYSTEMERROR;
		out = p.create_rc == ZNONODE || *doubt ? 1 : zerr(p.create_rc, "create", h->dir);
	}
	free(p.created);
	deallocate_String_vector(&p.kids);
	return out;
}

/* Delete h's node (a refused try, a cancelled wait) and free h. */
static void discard_hold(zk_store *st, hold *h)
{
	if (h->node && !sess_dead(st, h->sess)) {
		int r = zoo_delete(h->sess->zh, h->node, -1);
		if (lost_conn(r)) {
			orphan_hold(st, h);
			return;
		}
	}
	hold_free(st, h);
}

/* A slot left from an earlier hold of the same lock handle (lost, attached). */
static hold *current_hold(zk_store *st, dlock_request *req)
{
	hold *h = req->slot;
	if (h && strcmp(h->owner, req->owner) != 0) {
		discard_hold(st, h);
		req->slot = h = NULL;
	}
	return h;
}

/* ---------------------------------------------------------------- methods */

static int zk_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	zk_store *st = (zk_store *)be;
	(void)retry_ms;
	hold *h = current_hold(st, req);
	if (h && sess_dead(st, h->sess)) {
		/* our queue position died with the session: queue again */
		hold_free(st, h);
		req->slot = h = NULL;
	}
	zsess *z;
	int rc = session_for(st, req->ttl_ms, &z);
	if (rc)
		return rc;
	sweep_orphans(st, req->owner); /* after session_for: it waits for a reconnect */
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
	}
	bool granted = false;
	for (int round = 0;; round++) {
		bool listed = false;
		if (!h->node) {
			bool doubt = false;
			rc = 1;
			if (round == 0) {
				rc = create_and_list(st, h, req, &granted, &doubt);
				listed = rc == 0;
			}
			if (rc == 1 && !h->node) {
				if (doubt) /* let place_node look for what our create made */
					orphan_hold_keep(st, h);
				rc = place_node(st, h, req, &doubt);
				if (rc && doubt) { /* our create's outcome is unknown */
					req->slot = NULL;
					orphan_hold(st, h);
					return rc;
				}
			}
			if (rc == 1)
				rc = 0;
			if (rc)
				break;
		}
		if (!listed)
			rc = evaluate(h, req, &granted);
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
		if (h->node)
			orphan_hold(st, h);
		else
			hold_free(st, h);
		return rc;
	}
	if (granted) {
		free(h->watch);
		h->watch = NULL;
		*fence = (uint64_t)h->czxid;
		return 0;
	}
	if (!req->waiting) {
		req->slot = NULL;
		discard_hold(st, h);
	}
	return DLOCK_ELOCKED;
}

/* release/extend of a hold this handle did not make (an attached handle):
 * find its node by owner. */
static int by_owner(zk_store *st, dlock_request *req, bool del)
{
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), &z);
	if (rc)
		return rc;
	char *dir = dir_of(st, req->name);
	if (!dir)
		return DLOCK_ENOMEM;
	int n = 0;
	int r;
	if (del) {
		r = delete_owned(z->zh, dir, req->owner, &n);
	} else {
		struct String_vector sv = { 0, NULL };
		r = zoo_get_children(z->zh, dir, 0, &sv);
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
	sweep_orphans(st, NULL);
	hold *h = current_hold(st, req);
	if (!h)
		return by_owner(st, req, true);
	req->slot = NULL;
	if (!h->node || sess_dead(st, h->sess)) {
		hold_free(st, h);
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZSESSIONEXPIRED",
				       "zookeeper: the session that held '%s' expired", req->name);
	}
	int r = zoo_delete(h->sess->zh, h->node, -1);
	bool retried = false;
	while (lost_conn(r) && !retried && wait_connected(st, h->sess, st->connect_ms)) {
		retried = true;
		r = zoo_delete(h->sess->zh, h->node, -1);
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
			orphan_hold(st, h); /* deleted as soon as we are connected again */
		else
			hold_free(st, h);
	}
	return rc;
}

static int zk_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	zk_store *st = (zk_store *)be;
	hold *h = current_hold(st, req);
	if (!h)
		return by_owner(st, req, false); /* held by another session: it lives as long as that */
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
	int r = zoo_exists(h->sess->zh, h->node, 0, &stat);
	if (r == ZOK && stat.ephemeralOwner == (int64_t)zoo_client_id(h->sess->zh)->client_id)
		return 0;
	if (r == ZOK || r == ZNONODE)
		return dlock_error_set(DLOCK_ENOTHELD, KIND, "ZNONODE", "zookeeper: our node for '%s' is gone",
				       req->name);
	return zerr(r, "check", h->node);
}

/* One pipelined exists() of a renewal batch. */
typedef struct probe {
	zk_store *st;
	int *pending;
	int rc;
} probe;

static void probe_done(int rc, const struct Stat *stat, const void *data)
{
	(void)stat;
	probe *p = (probe *)data;
	pthread_mutex_lock(&p->st->mu);
	p->rc = rc;
	if (--*p->pending == 0)
		pthread_cond_broadcast(&p->st->cv);
	pthread_mutex_unlock(&p->st->mu);
}

/* Confirm the holds of one session in one round trip: exists() of every
 * node, pipelined. Reads, not a multi of checks: a multi is a write, which
 * would cost a quorum proposal and a log fsync per renewal. */
static void renew_session(zk_store *st, zsess *z, dlock_request *const *reqs, size_t n, int *results)
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
	probe *ps = calloc(m, sizeof(*ps));
	size_t *idx = calloc(m, sizeof(*idx));
	if (!ps || !idx) {
		free(ps);
		free(idx);
		return; /* left -1: reported transient */
	}
	int pending = 0;
	size_t k = 0;
	for (size_t i = 0; i < n && k < m; i++) {
		hold *h = reqs[i]->slot;
		if (results[i] != -1 || !h || h->sess != z)
			continue;
		ps[k] = (probe){ st, &pending, ZSYSTEMERROR };
		idx[k] = i;
		pthread_mutex_lock(&st->mu);
		pending++;
		pthread_mutex_unlock(&st->mu);
		int r = zoo_aexists(z->zh, h->node, 0, probe_done, &ps[k]);
		if (r != ZOK) { /* not queued: no completion will come */
			pthread_mutex_lock(&st->mu);
			pending--;
			ps[k].rc = r;
			pthread_mutex_unlock(&st->mu);
		}
		k++;
	}
	/* Every queued request completes (with ZCONNECTIONLOSS at worst). */
	pthread_mutex_lock(&st->mu);
	while (pending > 0)
		pthread_cond_wait(&st->cv, &st->mu);
	pthread_mutex_unlock(&st->mu);
	for (size_t j = 0; j < k; j++) {
		int r = ps[j].rc;
		results[idx[j]] = r == ZOK ? 0
				  : (r == ZNONODE || r == ZSESSIONEXPIRED || r == ZINVALIDSTATE) ? DLOCK_ENOTHELD
				  : DLOCK_EUNAVAILABLE;
	}
	free(ps);
	free(idx);
}

static int zk_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	zk_store *st = (zk_store *)be;
	sweep_orphans(st, NULL);
	for (size_t i = 0; i < n; i++) {
		hold *h = reqs[i]->slot;
		results[i] = -1; /* not done yet */
		if (!h || !h->node || strcmp(h->owner, reqs[i]->owner) != 0)
			results[i] = DLOCK_ENOTHELD;
	}
	for (size_t i = 0; i < n; i++) {
		if (results[i] != -1)
			continue;
		renew_session(st, ((hold *)reqs[i]->slot)->sess, reqs, n, results);
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
		discard_hold(st, h);
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

	bool fired = false;
	int r;
	if (h->watch_children) {
		struct String_vector sv = { 0, NULL };
		struct Stat stat;
		r = zoo_wget_children2(z->zh, h->dir, watcher, z, &sv, &stat);
		if (r == ZOK) {
			fired = stat.cversion != h->cversion; /* changed since we looked */
			deallocate_String_vector(&sv);
		}
	} else {
		/* A data watch, not an exists watch: it is set only if the node
		 * exists, so a vanished predecessor leaves no watch behind. */
		char buf[1];
		int len = 0;
		struct Stat stat;
		r = zoo_wget(z->zh, h->watch, watcher, z, buf, &len, &stat);
	}
	fired = fired || r != ZOK; /* gone (ZNONODE) or an error acquire will report */

	pthread_mutex_lock(&st->mu);
	while (!fired && !w.fired && !z->expired && z->state == ZOO_CONNECTED_STATE) {
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
	zsess *dead = unref_locked(z);
	pthread_mutex_unlock(&st->mu);
	close_sess(dead);
	return 0;
}

/* ---------------------------------------------------------------- status */

static int status_one(zk_store *st, zhandle_t *zh, const char *name, dlock_lock_status **out, size_t *count)
{
	dlock_lock_status *s = dlock__status_add(out, count);
	if (!s || !(s->name = dlock__strdup(name)))
		return DLOCK_ENOMEM;
	char *dir = dir_of(st, name);
	if (!dir)
		return DLOCK_ENOMEM;
	struct String_vector sv = { 0, NULL };
	int r = zoo_get_children(zh, dir, 0, &sv);
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
	int rc = cs ? 0 : dlock__oom();
	size_t n = 0;
	for (int i = 0; cs && i < sv.count; i++)
		if (dlock__zk_parse_child(sv.data[i], &cs[n]))
			n++;
	if (cs)
		qsort(cs, n, sizeof(*cs), by_seq);
	/* Who holds: the same rule acquire applies, node by node. */
	size_t sems = 0;
	bool writer_seen = false, reader_seen = false;
	for (size_t i = 0; i < n && !rc; i++) {
		char *p = dlock__sprintf("%s/%s", dir, cs[i].name);
		char data[600];
		int len = (int)sizeof(data) - 1;
		struct Stat stat;
		r = p ? zoo_get(zh, p, 0, data, &len, &stat) : ZSYSTEMERROR;
		free(p);
		if (r == ZNONODE)
			continue;
		if (r != ZOK) {
			rc = zerr(r, "read", dir);
			break;
		}
		data[len > 0 ? len : 0] = '\0';
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
			holds = !writer_seen && !reader_seen && sems < permits;
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
	free(cs);
	deallocate_String_vector(&sv);
	free(dir);
	return rc;
}

/* The core lists through zk_list, so names is never NULL here. */
static int zk_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count)
{
	zk_store *st = (zk_store *)be;
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), &z);
	for (size_t i = 0; i < nnames && !rc; i++)
		rc = status_one(st, z->zh, names[i], out, count);
	return rc;
}

/* The name nodes under the root (a name node with nobody in it, about to be
 * reaped, shows as an idle lock: the core drops it). */
static int zk_list(dlock_backend *be, char ***names, size_t *n)
{
	zk_store *st = (zk_store *)be;
	zsess *z;
	int rc = get_session(st, session_key(st, st->default_ttl), &z);
	if (rc)
		return rc;
	struct String_vector sv = { 0, NULL };
	int r = zoo_get_children(z->zh, st->root, 0, &sv);
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
	/* Holds nobody released: a lock freed after it was lost (the core does
	 * not release those). Their nodes end with the sessions below. */
	while (st->holds)
		hold_free(st, st->holds);
	while (st->orphans) {
		orphan *o = st->orphans;
		st->orphans = o->next;
		o->next = NULL;
		unref(st, o->sess);
		o->sess = NULL;
		free(o->dir);
		free(o->owner);
		free(o);
	}
	/* Holds still referencing sessions belong to handles the caller should
	 * have freed first; closing the sessions ends their nodes anyway. */
	pthread_mutex_lock(&st->mu);
	zsess *all = st->sessions;
	st->sessions = NULL;
	pthread_mutex_unlock(&st->mu);
	while (all) {
		zsess *z = all;
		all = z->next;
		close_sess(z);
	}
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st->hosts);
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
	st->base.version = DLOCK_BACKEND_VERSION;
	st->base.kind = KIND;
	st->base.acquire = zk_acquire;
	st->base.release = zk_release;
	st->base.extend = zk_extend;
	st->base.renew = zk_renew;
	st->base.wait = zk_wait;
	st->base.cancel = zk_cancel;
	st->base.status = zk_status;
	st->base.list = zk_list;
	st->base.close = zk_close;
	st->base.flags = DLOCK_BACKEND_F_SESSION; /* ephemeral nodes live with our session */
	st->fixed_session = fixed;
	st->connect_ms = uri->connect_timeout_ms;
	st->default_ttl = uri->ttl_ms;
	pthread_mutex_init(&st->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&st->cv, &ca);
	pthread_condattr_destroy(&ca);

	size_t cap = nh * 270 + 1;
	st->hosts = calloc(1, cap);
	for (size_t i = 0; st->hosts && i < nh; i++) {
		size_t len = strlen(st->hosts);
		bool v6 = strchr(hp[i].host, ':') != NULL;
		snprintf(st->hosts + len, cap - len, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", hp[i].host,
			 v6 ? "]" : "", hp[i].port);
	}
	dlock_free(hp);
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
	rc = get_session(st, session_key(st, st->default_ttl), &z);
	if (rc) {
		zk_close(&st->base);
		return rc;
	}
	*out = &st->base;
	return 0;
}
