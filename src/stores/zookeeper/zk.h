/*
 * What the files of the ZooKeeper store share (zookeeper.c has the store's
 * design: layout, sessions, locking). ops.c: errors and requests bounded by
 * the caller's deadline; parse.c: node names (parse.h, fuzzed); session.c:
 * sessions; holds.c: holds, orphans and their sweeper, placing and judging
 * our node; lock.c: the lock methods; status.c: status and list;
 * zookeeper.c: options, open, close and the method table.
 */
#ifndef DLOCK_STORES_ZOOKEEPER_ZK_H
#define DLOCK_STORES_ZOOKEEPER_ZK_H

#include "../support.h"
#include "parse.h"

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
#define SEQ_DIGITS 10

typedef struct zookeeper_store zookeeper_store;

/* One ZooKeeper session. Referenced by the store's table (while current),
 * by each hold placed in it, by orphans and by running waits. */
typedef struct zsess {
	zookeeper_store *st;
	struct zsess *next;
	zhandle_t *zh;
	int64_t want_ms;  /* requested timeout: the table key */
	int negotiated;   /* timeout the server granted, ms */
	int state;        /* last session state the watcher saw */
	bool expired;     /* expired, auth failed or closed: never usable again */
	bool auth_failed;
	bool current;     /* new holds with this key go here */
	int64_t probed;   /* when the sweeper last sent a probe */
	char *servers;    /* every server of the connect string (a move leaves one out) */
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
 * it instead (dlock__zk_find_own adopts the node). Under st->mu, like the sweep's
 * completions, which run on libzookeeper's completion thread. */
typedef struct orphan {
	struct orphan *next;
	zookeeper_store *st;
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
	struct hold *prev, *next; /* every hold of the store (see dlock__zk_close) */
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

struct zookeeper_store {
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
	bool closing;           /* dlock__zk_close is closing the sessions */
	bool ever_connected;    /* some session was connected: the ensemble was reachable */
	bool sweeper_started;   /* the sweeper thread (see dlock__zk_sweeper_main) */
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
	zookeeper_store *st;
	struct zop *prev, *next; /* every live op of the store (see dlock__zk_close) */
	int refs;    /* the waiter's and the completion's, under st->mu */
	bool done;
	int rc;
	struct Stat stat;
	struct String_vector kids; /* our copy */
	char *value;               /* created path, or node data */
	int vlen;
} zop;

int dlock__zk_zerr(int rc, const char *what, const char *path);

/* The request may or may not have been applied. (libzookeeper fails the
 * requests in flight with ZRUNTIMEINCONSISTENCY when it drops a connection
 * over a reply out of order: a request lost on a link that works again.) */
bool dlock__zk_lost_conn(int rc);

/* ...and there may be time to ask again once reconnected. */
bool dlock__zk_retryable(int rc);

/* A sweep's answer that settles the question (anything else: try again). */
bool dlock__zk_settled(int rc);

bool dlock__zk_plain(unsigned char c);

const char *dlock__zk_kind_word(node_kind k);

int dlock__zk_by_seq(const void *a, const void *b);

const char *dlock__zk_base_name(const char *path);

zop *dlock__zk_op_new(zookeeper_store *st);

void dlock__zk_op_free_locked(zop *op);

/* Under st->mu. */
void dlock__zk_op_unref_locked(zop *op);

void dlock__zk_cb_void(int rc, const void *data);

void dlock__zk_cb_stat(int rc, const struct Stat *stat, const void *data);

void dlock__zk_cb_created(int rc, const char *value, const struct Stat *stat, const void *data);

void dlock__zk_cb_kids(int rc, const struct String_vector *strings, const struct Stat *stat, const void *data);

void dlock__zk_cb_data(int rc, const char *value, int len, const struct Stat *stat, const void *data);

/* After zoo_a*: a request the library refused will have no completion. */
zop *dlock__zk_op_sent(zookeeper_store *st, zop *op, int r);

/* Wait until every op (sent on zh) is done or the deadline passes; a
 * server that went silent meanwhile is left (dlock__zk_check_server).
 * @return all done. */
bool dlock__zk_ops_wait(zookeeper_store *st, zhandle_t *zh, zop *const *ops, size_t n, int64_t deadline);

/* The least wait whose server is checked is 4 x CHECK_MIN_MS (a new
 * session's handle: 2 x, to answer); a connected session's server gets
 * PROBE_MIN_MS to show it is alive, or the wait's first 7/8 if shorter. */
#define CHECK_MIN_MS 100
#define PROBE_MIN_MS 500

/*
 * A request on zh is still out by a quarter of its wait. Is its server
 * alive? A process that stopped (SIGSTOP, a hung JVM, a frozen VM) keeps
 * taking connections in its kernel but never answers: libzookeeper notices
 * only after 2/3 of the session timeout with nothing received, longer than a
 * request's wait, and meanwhile every call and renewal of the session fails
 * although the other members could serve. So a second, plain connection
 * asks the server "srvr" (a four-letter word; one refused by the whitelist
 * is answered too, with a refusal). Any answer, a close or a reset by
 * `until` shows a live (or dead, which the client sees itself) server and
 * nothing is done: a slow link or a slow write is waited for. No answer: the
 * session is moved to its other servers — zoo_set_servers without this one,
 * and every connection of the process to it shut down (libzookeeper keeps a
 * connected socket whatever the list says): the client reconnects with the
 * same session id, which lives on as long as its timeout has not passed,
 * ephemeral nodes included; the requests out on the old connection fail as
 * lost, which every caller handles as an outcome in doubt. Returns early
 * when every op is done.
 */
void dlock__zk_check_server(zookeeper_store *st, zhandle_t *zh, zop *const *ops, size_t n, int64_t until);

/* The same question for a server (as zoo_get_current_server names it),
 * answered by `until`: true when it took the connection (or it is still
 * pending) and said nothing. */
bool dlock__zk_server_silent(const char *server, int64_t until);

/* The op's result (ZDEADLINE if it is still out), after dlock__zk_ops_wait. A done op
 * is no longer touched by its completion: its fields may be read freely. */
int dlock__zk_op_rc(zookeeper_store *st, zop *op);

void dlock__zk_op_put(zookeeper_store *st, zop *op);

int dlock__zk_op_wait1(zookeeper_store *st, zhandle_t *zh, zop *op, int64_t deadline);

/* The bounded forms of the synchronous calls. */
int dlock__zk_z_children(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline,
			 struct String_vector *out, int32_t *cversion);

int dlock__zk_z_exists(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline, struct Stat *stat);

int dlock__zk_z_delete(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline);

void dlock__zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx);

/* Under st->mu: drop a reference; returns the session to close (after
 * unlocking) when it was the last. */
zsess *dlock__zk_unref_locked(zsess *z);

/* Under st->mu, on any thread (also libzookeeper's completion thread, which
 * cannot close its own handle): the last reference goes to the graveyard. */
void dlock__zk_unref_later_locked(zsess *z);

void dlock__zk_close_sess(zsess *z);

/* Close the sessions the completion thread let go (from a caller's thread). */
void dlock__zk_reap(zookeeper_store *st);

void dlock__zk_unref(zookeeper_store *st, zsess *z);

bool dlock__zk_wait_connected(zookeeper_store *st, zsess *z, int64_t deadline);

bool dlock__zk_sess_dead(zookeeper_store *st, zsess *z);

bool dlock__zk_sess_connected(zookeeper_store *st, zsess *z);

/* The session timeout a hold of ttl_ms needs: never shorter than the ttl, so
 * the holder's own deadline passes before the server can expire it. */
int64_t dlock__zk_session_key(zookeeper_store *st, int64_t ttl_ms);

/* A connected session with timeout key `want` (made, or remade after expiry,
 * as needed), by `deadline`. Borrowed: valid while the caller holds the
 * core's store mutex. */
int dlock__zk_get_session(zookeeper_store *st, int64_t want, int64_t deadline, zsess **out);

/* The session for a hold of ttl_ms, refusing a ttl the server's session
 * timeout cannot cover. */
int dlock__zk_session_for(zookeeper_store *st, int64_t ttl_ms, int64_t deadline, zsess **out);

char *dlock__zk_dir_of(zookeeper_store *st, const char *name);

void dlock__zk_hold_free(zookeeper_store *st, hold *h);

/* Under st->mu (the orphan is unlinked). */
void dlock__zk_orphan_free_locked(orphan *o);

/* Under st->mu, on any thread: list o's name and delete the owner's nodes,
 * asynchronously. Requests of one session run in order, so the listing sees
 * every create or delete of the owner that was sent before it. */
void dlock__zk_sweep_start_locked(orphan *o);

/* h was confirmed by a request sent after `since` (>= the core's own start
 * of that request): its lease now ends at since + ttl_ms, never before the
 * core's deadline for it. A renewal (`again`) does not bring back a lease
 * the sweeper already ended. @return whether h is leased now. */
bool dlock__zk_lease_set(zookeeper_store *st, hold *h, int64_t since, int64_t ttl_ms, bool again);

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
void *dlock__zk_sweeper_main(void *arg);

/* The node(s) of h's owner are in doubt (a create or delete whose outcome is
 * unknown) and no hold will use them: hand them to the sweep. Takes over h. */
void dlock__zk_orphan_hold(zookeeper_store *st, hold *h);

/* A new hold of an owner that left an orphan (a retry of the same acquire):
 * take the orphan back so dlock__zk_find_own adopts its node and keeps its place in
 * line, after any sweep of it in flight is over. @return ZOK (h->doubt set
 * when there was one), or ZDEADLINE. */
int dlock__zk_claim_orphan(zookeeper_store *st, hold *h, int64_t deadline);

/* Does child name c belong to owner? ("_c_<owner>-<kind>-<seq>") */
bool dlock__zk_owned_by(const char *c, const char *owner);

/* Delete every node of `owner` under dir, by `deadline`.
 * @return ZOK, ZNONODE (no dir), or an error (ZDEADLINE: in doubt). */
int dlock__zk_delete_owned(zookeeper_store *st, zhandle_t *zh, const char *dir, const char *owner, int64_t deadline,
			   int *deleted);

/* Find our own node after a lost connection (h->node NULL afterwards if
 * none; h->doubt cleared once the listing answered). */
int dlock__zk_find_own(zookeeper_store *st, hold *h, int64_t deadline);

/* Make sure h has a node in ZooKeeper: create it, or after a lost
 * connection (h->doubt) find the one our earlier create made. On failure
 * h->doubt says whether a node of ours may exist anyway. */
int dlock__zk_place_node(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline);

/* @return as evaluate_list, or 2 when the listing did not answer by the deadline. */
int dlock__zk_evaluate(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline, bool *granted);

/* The fast path of a first try: create our node and list its siblings in
 * one round trip. ZooKeeper runs a session's requests in order, so the list
 * already contains the node the create made.
 * @return 0 with h->node set and *granted decided; 1 when it could not be
 * used (no parent yet, or a lost connection: the careful path takes over,
 * h->doubt saying a node of ours may exist); 2 when the node was made but
 * its listing did not answer by the deadline; or an error (h->doubt set
 * when the create's outcome is unknown). */
int dlock__zk_create_and_list(zookeeper_store *st, hold *h, const dlock_request *req, int64_t deadline, bool *granted);

/* Delete h's node (a refused try, a cancelled wait) and free h; what could
 * not be deleted in time goes to the sweep. */
void dlock__zk_discard_hold(zookeeper_store *st, hold *h, int64_t deadline);

/* req->slot when it is a hold of req->owner; a hold of another owner (left
 * from an earlier hold of the same lock handle: lost, attached) is discarded
 * and NULL returned — for acquire (which answers the new slot) and release
 * (after which the core forgets it) only. */
hold *dlock__zk_current_hold(zookeeper_store *st, const dlock_request *req, int64_t deadline);

int dlock__zk_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out);

int dlock__zk_release(dlock_backend *be, const dlock_request *req);

int dlock__zk_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms);

int dlock__zk_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results);

int dlock__zk_cancel(dlock_backend *be, const dlock_request *req);

int dlock__zk_wait(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out);

/* The core lists through dlock__zk_list, so names is never NULL here. Bounded by
 * the request timeout from the start of the call. */
int dlock__zk_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count);

/* The name nodes under the root (a name node with nobody in it, about to be
 * reaped, shows as an idle lock: the core drops it). */
int dlock__zk_list(dlock_backend *be, char ***names, size_t *n);

void dlock__zk_close(dlock_backend *be);

#endif
