/*
 * dlock/sys/backend.h — the interface a lock store implements.
 *
 * The core (src/core) owns everything stores share: URI parsing, reentrancy,
 * lease deadlines, the renewal thread, the lost-lock signal, fence
 * bookkeeping and the wait loop with back-off. A store only speaks its
 * protocol: try to take a lock once, release, extend, renew a batch, and
 * optionally block until the store says something changed.
 *
 * Versions. This is version 5 of the contract (DLOCK_BACKEND_VERSION), and
 * versions mean "at least": the core takes a methods table of any version
 * from DLOCK_BACKEND_VERSION_MIN to its own. Two rules keep that true from
 * version 5 on:
 *  1. Fields are only ever appended to dlock_backend_methods, dlock_request
 *     and dlock_grant; none is removed, reordered or retyped, and no
 *     method's meaning changes. A new method or option is a new field.
 *  2. The core reads a table only as far as its version reaches (a field
 *     added later counts as NULL or 0 for an older table) and zeroes a
 *     request's and a grant's newer fields, which an older store never
 *     looks at. So a store built against version 5 keeps working with
 *     every later libdlock; one built against a later version is refused
 *     by an older libdlock, with a message naming both versions.
 * Version 5 is the first with these rules: versions 1 to 4 changed method
 * signatures (version 5 made requests read-only and moved acquire's
 * outputs into dlock_grant) and are refused.
 *
 * A store is two things, as a sqlite3_file and its sqlite3_io_methods: a
 * `static const dlock_backend_methods` table per way the store works (one
 * per mode where a store has two), made with DLOCK_BACKEND_METHODS_INIT, and
 * an instance whose first member is a dlock_backend that dlock_backend_init
 * points at its table. The core checks the table's version and required
 * methods when the store is opened. An optional method left NULL means
 * DLOCK_ENOTSUPPORTED unless its comment says otherwise.
 *
 * Inputs and outputs. A method reads the request (const dlock_request *),
 * which the core owns and fills; acquire (and `wait`, for a grant it got
 * while waiting) answers in a dlock_grant, which the core clears before each
 * call (see dlock_grant). A store's per-hold state travels in
 * dlock_grant.slot: the core passes what the last acquire or wait left
 * there as req->slot, and forgets it after release and cancel, which free
 * it (or hand it to whatever the store keeps).
 *
 * What the core guarantees to every method, so that no store checks it:
 * req->permits >= 1 (1 in shared mode); req->queue_ttl_ms > 0;
 * req->ttl_ms > 0; req->name is a valid lock name (dlock_name_check);
 * uri->connect_timeout_ms > 0, uri->request_timeout_ms > 0, uri->ttl_ms > 0
 * and uri->prefix != NULL at open; `status` always receives at least one
 * name (enumeration is `list`'s job); `renew` never more than
 * `renew_max` requests. The core writes the messages of DLOCK_ELOCKED (not
 * acquired) and DLOCK_ENOTHELD from release/extend (a store returns the bare
 * code; a message it sets is replaced); every other error's message is the
 * store's (dlock_error_set).
 *
 * Threading: the core calls the methods of one instance under one mutex of
 * its store, except `wait`, `unwatch` and `forget`, which it calls WITHOUT
 * that mutex (so a blocked waiter does not stop renewal): they may run in
 * several threads at once and concurrently with any other method. A table with
 * DLOCK_BACKEND_F_RENEW_APART lets the core open a second instance from the
 * same URI for its renewal thread, so that a long acquire never delays a
 * renewal: renew (and the releases the core retries in the background) then
 * come from an instance that did not make the grant.
 *
 * Wake-ups. The core keeps a wake-up board per store handle: a
 * waiter arms it before each try and, when refused, has the store watch the
 * name and sleeps on the board until the store says that the name may have
 * changed or until its back-off ends. A
 * store with a notification channel (Redis pub/sub, PostgreSQL LISTEN,
 * watches) implements `watch`/`unwatch` and feeds the board from its
 * channel with dlock_backend_wake (one name), dlock_backend_wake_owner (one
 * waiter: a fair queue's new head) and dlock_backend_wake_all (the channel
 * was down: anything may have changed). A store whose wake-up
 * is itself a blocking call (MySQL's GET_LOCK on a doorbell) implements
 * `wait` instead. A store with neither is polled with back-off.
 *
 * Time. The core owns time: every call that carries a request
 * carries `req->deadline_ms`, an absolute CLOCK_MONOTONIC instant
 * (dlock_clock_ms) by which the call must return whatever the network or
 * the server does. A store bounds every socket wait of the call by it
 * (non-blocking I/O and poll, or its client library's per-call timeout cut
 * to the time left) and, when it runs out, returns DLOCK_EUNAVAILABLE with a
 * "timed out" message and leaves the connection where no late reply can be
 * taken for the answer to a later request (drop it; reconnect next call).
 * `wait` is bounded by its timeout_ms; `status` and `list` by the store's
 * request timeout (dlock_uri.request_timeout_ms) from when they are called;
 * the open function by dlock_uri.connect_timeout_ms for the whole open
 * (connect, handshake, authentication, setup). Host names count: client
 * libraries resolve with a blocking getaddrinfo that no timeout of theirs
 * bounds, so a store resolves every name by the deadline first (the core's
 * dlock_sys_resolve) and hands its library the numeric addresses, keeping the
 * name where the library checks TLS certificates against it.
 *
 * An acquire keeps the deadline it is given, never a later one of its own:
 * a try-once (req->waiting == 0) comes with one whole request timeout
 * (counted when the core calls, after any wait for the store handle), and a
 * waiting try with what is left of its wait. A waiting try left with less
 * than dlock_try_too_late() allows (with the store's request timeout) would
 * most likely only time out and leave an unknown outcome to undo: the core
 * does not send it, and reports the wait as not acquired in time, so a
 * store is never called with less (it needs no check of its own). A store
 * whose try takes several round trips divides the time it has (Redlock
 * keeps a share for its undo).
 *
 * Processes. A store handle and its locks belong to the process
 * that opened the store. In a fork()'s child the core refuses every call on
 * an inherited handle itself (DLOCK_EINVAL): a store never sees a request
 * from a child with the parent's connections, and needs no fork check of its
 * own. When the child frees the handle the core calls `forget`, never
 * `close`.
 *
 * Unknown outcomes. An acquire that returns anything but 0,
 * DLOCK_ELOCKED, DLOCK_EINVAL, DLOCK_EAUTH or DLOCK_ENOTSUPPORTED may have
 * been applied by the server (its reply was lost). The core then:
 *  - counts the lease of a later grant from the start of the EARLIEST try of
 *    that acquire call whose outcome was unknown (a store's "owner already
 *    holds" answer may carry the expiry that earlier try set), and refuses a
 *    grant whose reply arrives after that start + ttl − drift;
 *  - undoes an acquire call that ends without a grant by calling `release`
 *    (confirm = 1) for its owner, and keeps retrying that release in the
 *    background until it succeeds or the lease it may have set has ended.
 * So `release` must accept an owner that holds nothing (DLOCK_ENOTHELD,
 * changing nothing) and may be called with slot == NULL for a hold whose
 * earlier release failed. A store whose hold lives on a session or a
 * connection (DLOCK_BACKEND_F_SESSION) ends that session or connection when a
 * release cannot be confirmed, so that nothing outlives it.
 *
 * Extend and renewal. The store's lease of a hold is never shorter than
 * the one its client counts (DESIGN.md §1, extend). Two requests of one hold
 * whose answers cross would break it on a store that sets now + ttl: a
 * renewal sent with the old ttl, delayed, then an extend to a longer ttl,
 * answered first; the renewal lands last and cuts the lease to the old ttl
 * while the client counts the new one. Three rules close it:
 *  1. The core never has two of a hold's renew/extend requests in flight:
 *     dlock_extend waits (within one request timeout) for the renewal in
 *     flight, and the renewer sends none of a hold while it is extended.
 *  2. What the client counts never exceeds what a request of unknown
 *     outcome could leave. Such a request (no answer by its deadline: it
 *     may still land at any later time) of ttl Tu lands at some time t >=
 *     the send of every later request; it sets t + Tu, so after a later
 *     request confirmed at t0 the store keeps at least t0 + min(T, Tu).
 *     The core counts every later confirmed renewal or extend of the hold
 *     with min(T, the least such Tu) from its send, and an extend that
 *     itself got no answer cuts the deadline to its send + its ttl.
 *  3. A store whose protocol allows it keeps the later expiry: renew and
 *     extend set max(current expiry, now + ttl) (the renewal script of
 *     Redis, Cluster and Redlock; PostgreSQL's and MySQL's tables), so a
 *     request landing arbitrarily late, or a request the core never knew
 *     of (another process's `dlock extend` of the same handle), cannot cut
 *     a lease. There an extend to a shorter ttl only shortens what the
 *     client counts. Rules 1 and 2 keep the stores that do not (an etcd
 *     key moves onto a lease of the new TTL, which a late keepalive of its
 *     old lease cannot shorten; ZooKeeper's lease is its session;
 *     Memcached's `replace` sets now + ttl, a conditional write would cost
 *     a `gets` + `cas` round trip) safe from the hold's own requests.
 *
 * Permits. Every store's acquire applies one rule to exclusive requests
 * (dlock/lock.h, `permits`): grant only if (live exclusive holders + 1) <=
 * min(req->permits, the permits of every live exclusive holder of the
 * name). A mutex (permits 1) therefore excludes semaphores both ways, and
 * holders of different permits limit each other. A store records each
 * holder's permits beside its hold, so that every later caller's decision
 * sees them. Shared requests keep their rules (no exclusive holder;
 * writer preference). A store that cannot apply the rule returns
 * DLOCK_ENOTSUPPORTED for permits > 1.
 */
#ifndef DLOCK_SYS_BACKEND_H
#define DLOCK_SYS_BACKEND_H

#include <dlock/common.h>
#include <dlock/store.h>

DLOCK_BEGIN_DECLS

#define DLOCK_BACKEND_VERSION 5
/** The oldest version of a methods table this libdlock takes (see "Versions"). */
#define DLOCK_BACKEND_VERSION_MIN 5

/** One `key=value` query option of a URI. */
typedef struct dlock_uri_option {
	char *key;
	char *value;
	int used; /**< set by dlock_uri_param(); unused options are an error */
} dlock_uri_option;

/** A parsed store URI. Strings are percent-decoded and owned by the core. */
typedef struct dlock_uri {
	char *scheme;    /**< "sqlite", "redis", ... (lowercase) */
	char *user;      /**< NULL when absent */
	char *password;  /**< NULL when absent; never print it */
	char *hosts;     /**< the authority after any user info: "h:p,h:p"; NULL when the URI has no "//" */
	/** What follows the authority (starts with '/'), or the opaque part ("relative.db"); "" if none. */
	char *path;
	size_t nparams;
	dlock_uri_option *params;
	/* Options common to every store, already parsed by the core: */
	int64_t ttl_ms;             /**< default lease (30000 unless ttl=) */
	int64_t connect_timeout_ms; /**< 5000 unless connect_timeout= */
	const char *prefix;         /**< namespace, "dlock" unless prefix= */
	int64_t request_timeout_ms; /**< bound of one request when the core gives no
				         deadline (status, list): timeout=, default
				         min(connect_timeout, 2 s) */
} dlock_uri;

/** The value of query option `key` (marking it used), or NULL. */
DLOCK_EXTERN const char *dlock_uri_param(dlock_uri *uri, const char *key);

/** One host:port of a host list. */
typedef struct dlock_hostport {
	char host[256];
	int port;
} dlock_hostport;

/**
 * Split uri->hosts ("h1:p1,h2,[::1]:p3") into entries; a missing port is
 * `default_port`. *out is freed with dlock_free.
 * @return 0; DLOCK_EINVAL (no host, bad port); DLOCK_ENOMEM.
 */
DLOCK_EXTERN int dlock_uri_hosts(const dlock_uri *uri, int default_port, dlock_hostport **out, size_t *count);

/** One hold (or attempt) as the core hands it to a store. */
typedef struct dlock_request {
	const char *name;      /**< validated lock name, without the store prefix */
	const char *owner;     /**< unique token of this hold: "<client id hex>-<serial>" */
	dlock_mode mode;
	unsigned int permits;  /**< 1 for a mutex, N > 1 for a semaphore of N; the core
				    guarantees permits >= 1, and 1 in shared mode.
				    See "Permits" above for the rule acquire applies */
	int fair;              /**< grant in request order */
	int64_t ttl_ms;        /**< lease to set on acquire / extend / renew */
	int waiting;           /**< the caller will wait if refused: register as a waiter
				    (fair queue, writer preference, status) */
	int64_t queue_ttl_ms;  /**< a waiter registration lives this long without another try */
	const char *host;      /**< for status: this machine's host name */
	int pid;               /**< for status: this process id */
	void *slot;            /**< the store's own per-hold state, as the last acquire
				    or wait of this hold left it in dlock_grant.slot
				    (NULL: none); the core keeps it until release or
				    cancel (connection-held locks) */
	int64_t ticket_us;     /**< one per acquire call, the same for all its tries: the
				    wall clock (µs) when it began, plus a random tie-break
				    below 1 ms. A fair queue ordered by a client-side ticket
				    (Redlock) keeps a waiter's place with it */
	int confirm;           /**< release: the caller needs the store's answer (a hold
				    attached from a handle, which may not exist); a store
				    that can send a release without waiting for its reply
				    must not do so then */
	int64_t deadline_ms;   /**< CLOCK_MONOTONIC ms (dlock_clock_ms) by which this
				    call must return; set by the core before every call
				    (see "Time" above). For renew, the same for the batch */
} dlock_request;

/**
 * What one acquire try answers besides its return code (and what `wait`
 * answers when it got a grant). The core zeroes it before each call, except
 * `retry_ms` (-1) and `slot` (req->slot).
 */
typedef struct dlock_grant {
	uint64_t fence;        /**< on 0: the grant's fence, strictly greater than
				    every earlier grant of the name */
	int64_t retry_ms;      /**< on DLOCK_ELOCKED: -1 (as the core sets it:
				    unknown), or how long until the blocking lease
				    ends, or, for a store without a wake-up channel,
				    how soon to look again. The core's next try
				    of a polled wait comes by then while the hint is
				    new, then every eighth of the time the same hint
				    lasted, up to its back-off cap */
	int64_t lease_from_ms; /**< on 0: 0 when the hold's lease counts from the
				    try's start; a store whose grant rides on a lease
				    it last confirmed before that (a shared lease kept
				    alive recently, and not kept alive again for this
				    try) sets the dlock_clock_ms time the lease counts
				    from: the core ends the hold's lease, and renews it,
				    that much earlier. Never later than the server's
				    own count */
	int64_t nap_ms;        /**< on DLOCK_ELOCKED: 0, or how long the core may wait
				    before the next try when that is longer than a
				    third of queue_ttl_ms — set by a store that
				    registered this waiter for longer than queue_ttl_ms
				    and will wake it itself when it must look sooner (a
				    fair waiter far back in its queue). The wait's end
				    and the store's wake-ups still come first */
	int reached;           /**< on DLOCK_EUNAVAILABLE: 1 when a server of the
				    store took the try's requests (answered, or
				    accepted them and stayed silent) though none served
				    it in time — the store is there but not serving
				    yet (a leader election, a failover, a slot
				    migration). A first try that no server took fails
				    a wait at once; one a server took is ridden out
				    like a later try's failure, until the wait's
				    deadline */
	void *slot;            /**< in: req->slot; out: the store's per-hold state
				    from now on (see dlock_request.slot) */
} dlock_grant;

typedef struct dlock_backend dlock_backend;
typedef struct dlock_backend_methods dlock_backend_methods;

/**
 * The head of every store instance (its first member). The store sets it
 * with dlock_backend_init; the core owns `core`.
 */
struct dlock_backend {
	const dlock_backend_methods *methods;
	void *core; /**< the core's (wake-up board); NULL until the store is opened */
};

/** A store's methods: one `static const` table per mode of the store. */
struct dlock_backend_methods {
	unsigned int version; /**< DLOCK_BACKEND_VERSION (DLOCK_BACKEND_METHODS_INIT sets it) */
	const char *kind;     /**< "sqlite", "redis", ... */
	unsigned int flags;   /**< DLOCK_BACKEND_F_* */
	size_t renew_max;     /**< most requests per `renew` call (0: no limit) */

	/**
	 * Required. Try once to take the lock for req->owner.
	 * @return 0 and out->fence; DLOCK_ELOCKED when someone else holds it
	 *         (and, if known, out->retry_ms, out->nap_ms); another code on
	 *         failure (DLOCK_EUNAVAILABLE with out->reached when a server
	 *         took the try). See dlock_grant.
	 * When req->waiting and refused, register req->owner as a waiter for
	 * req->queue_ttl_ms (fair order, writer preference, waiter counts).
	 */
	int (*acquire)(dlock_backend *be, const dlock_request *req, dlock_grant *out);

	/**
	 * Required. Release req->owner's hold. @return 0; DLOCK_ENOTHELD (changed
	 * nothing). Unless req->confirm, a store may return 0 once the release
	 * is sent, before the server answers, if the server applies it before
	 * anything this backend sends later (Redis with release=pipelined).
	 */
	int (*release)(dlock_backend *be, const dlock_request *req);

	/**
	 * Required. Renew holds (each to its own reqs[i]->ttl_ms from now; where
	 * the protocol allows, to the later of that and the expiry it has: see
	 * "Extend and renewal") in as few round trips as possible; results[i] = 0, DLOCK_ENOTHELD (no longer
	 * ours: the core reports it lost) or a transient error (retried until
	 * the lease deadline). The core also extends one lock with it (n = 1).
	 * @return 0, or an error that applies to all.
	 */
	int (*renew)(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results);

	/**
	 * Optional: a cheaper way than `renew` to set one hold's lease to ttl_ms
	 * from now (the later expiry kept, as renew). @return 0; DLOCK_ENOTHELD.
	 */
	int (*extend)(dlock_backend *be, const dlock_request *req, int64_t ttl_ms);

	/**
	 * Optional (with `unwatch`): make changes of req->name reach the board
	 * (dlock_backend_wake) from now on, for req->owner's wait. Called under
	 * the store mutex right after each refused waiting try (the core armed
	 * the board before that try), never for a try that was granted or that
	 * did not wait, so a lock nobody holds costs no subscription. It must
	 * not wait for the network: start a subscription in the store's
	 * notification thread, which wakes the name once it is in place, so
	 * that a release between the refusal and the subscription is not
	 * missed; a second call for the same wait only says it goes on.
	 * @return 0; an error makes the core poll with back-off.
	 */
	int (*watch)(dlock_backend *be, const dlock_request *req);

	/**
	 * Optional: req->owner's wait is over (granted or given up). Called once
	 * at the end of a wait in which a try was refused or failed, whether or
	 * not watch was called or succeeded (a store may note a wait during a
	 * refused try, as SQLite's fair queue does): forget it, and do nothing
	 * for a request it never saw. Without the mutex.
	 */
	void (*unwatch)(dlock_backend *be, const dlock_request *req);

	/**
	 * Optional, instead of watch: block until the store signals that
	 * req->name may be free or until timeout_ms passes. Without the mutex.
	 * A store whose wait can itself take the lock (MySQL's GET_LOCK) leaves
	 * that in out->slot for the next acquire to complete; out->slot is
	 * req->slot on entry and nothing else of *out is read.
	 * @return 0 (woken or timed out — the core tries again either way).
	 */
	int (*wait)(dlock_backend *be, const dlock_request *req, int64_t timeout_ms, dlock_grant *out);

	/** Optional. Leave the waiters of req->name (the caller gave up). */
	int (*cancel)(dlock_backend *be, const dlock_request *req);

	/** Optional. See dlock_store_status; `names` has nnames >= 1 entries. */
	int (*status)(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		      size_t *count);

	/**
	 * Optional. For dlock_store_status without names: list the names that
	 * may have holders or waiters; the core then calls status with them
	 * (dropping duplicates, names that are not valid lock names, and idle
	 * locks). *names (of *n): strings from malloc in an array from malloc,
	 * freed by the core, also on error. Without it, status needs names.
	 * @return 0; an error (nothing is reported).
	 */
	int (*list)(dlock_backend *be, char ***names, size_t *n);

	/** Required. Close connections and free the instance. */
	void (*close)(dlock_backend *be);

	/**
	 * Optional. Called instead of `close` when a fork()'s child frees a store
	 * handle it inherited: the backend, its connections and its sessions are
	 * the parent's, and the parent goes on using them. Free what is this
	 * process's own without a word to any server: no request, no polite
	 * disconnect (a PostgreSQL Terminate, a ZooKeeper close, a MySQL
	 * COM_QUIT, a TLS close_notify would end the PARENT's session or
	 * stream), and no change to files or shared memory the parent uses.
	 * Closing a socket descriptor is fine (the parent's copy keeps the
	 * connection open). Called only if no call into the backend other than
	 * `wait` was in progress at the fork (its state is consistent). Without
	 * it, or when a call was in progress, the core frees nothing of the
	 * backend: its memory stays allocated (and reachable) until the process
	 * exits or execs. The core never calls any other method in the child.
	 */
	void (*forget)(dlock_backend *be);
};

/** Start a methods table: `static const dlock_backend_methods m = { DLOCK_BACKEND_METHODS_INIT("redis"), .acquire = ... };` */
#define DLOCK_BACKEND_METHODS_INIT(kind_) .version = DLOCK_BACKEND_VERSION, .kind = (kind_)

/**
 * Point `be` at `methods` (clearing the head first). @return 0, or
 * DLOCK_EINVAL when the table is of another version or lacks a required
 * method (acquire, release, renew, close; unwatch with watch).
 */
DLOCK_EXTERN int dlock_backend_init(dlock_backend *be, const dlock_backend_methods *methods);

/**
 * Wake-ups for the core's board (see "Wake-ups"): something changed on lock
 * `name` (a release, an expiry, a waiter leaving, a subscription now in
 * place): its waiters try again. Thread-safe, never blocks on I/O; does
 * nothing before the store handle exists.
 */
DLOCK_EXTERN void dlock_backend_wake(dlock_backend *be, const char *name);
/** The waiter whose request carries `owner` tries again (a fair queue named
 * it the next holder): the other waiters of its name sleep on. */
DLOCK_EXTERN void dlock_backend_wake_owner(dlock_backend *be, const char *owner);
/** Every waiter of this store handle tries again (the channel was down). */
DLOCK_EXTERN void dlock_backend_wake_all(dlock_backend *be);
/**
 * A hold's session or connection may have ended (the server closed a held
 * connection: a session kill, a restart): renew every hold of this store
 * handle now instead of at its time, so that the core reports a lost one at
 * once rather than at its next renewal. Thread-safe, never blocks on I/O;
 * does nothing before the store handle exists.
 */
DLOCK_EXTERN void dlock_backend_renew_now(dlock_backend *be);

/**
 * Watch a held connection's socket for a hang-up, for a store whose holds
 * live on their connection (DLOCK_BACKEND_F_SESSION): a session the server
 * ends (a kill, a restart) frees its locks at once, and another client may
 * take them; the holder must hear of it now, not at its next renewal.
 * Call it once the hold is granted, with the socket of the hold's
 * connection. The core polls the socket (POLLRDHUP; it never reads it, so
 * the store's statements on it are undisturbed) in a thread of its own; on
 * a hang-up, an error or a socket closed meanwhile, the socket leaves the
 * watch and the core calls dlock_backend_renew_now(be) from that thread:
 * the renewal finds the connection dead and the core reports the hold lost.
 * A socket already watched for `be` stays watched once.
 * Thread-safe, never blocks on I/O.
 * @return 0; DLOCK_EINVAL (be NULL, fd < 0); DLOCK_ENOMEM (not watched: the
 *         hang-up is then seen at the hold's next renewal).
 */
DLOCK_EXTERN int dlock_backend_watch_fd(dlock_backend *be, int fd);
/**
 * Stop watching `fd` for `be`: call it before the hold's connection is
 * released or closed (so that a later socket of the same number is not
 * taken for it). A hang-up being handled may still renew `be` once.
 * Nothing for fd < 0 or a socket not watched. Thread-safe, never blocks.
 */
DLOCK_EXTERN void dlock_backend_unwatch_fd(dlock_backend *be, int fd);
/**
 * Stop watching every socket of `be`, and wait for a renewal that a hang-up
 * of one of them started: after it returns the core never calls
 * dlock_backend_renew_now(be) for a watched socket. A store that watches
 * sockets calls it in `close` before freeing `be`. Thread-safe.
 */
DLOCK_EXTERN void dlock_backend_unwatch_all(dlock_backend *be);

/**
 * Holds live only as long as this process's session or connection
 * (ZooKeeper ephemeral nodes, MySQL GET_LOCK, PostgreSQL advisory locks):
 * dlock_lock_detach cannot hand them to another process.
 */
#define DLOCK_BACKEND_F_SESSION 1u
/* Flag 2u is unused: it was DLOCK_BACKEND_F_CONCURRENT, which the core never
 * honoured (every instance's methods run under its store's mutex). */
/**
 * A hold does not belong to the instance that made it (its state is in the
 * store, keyed by owner; req->slot is not needed to renew or release it):
 * the core may renew and retry releases from a second instance.
 */
#define DLOCK_BACKEND_F_RENEW_APART 4u

/** How a store's open function looks: parse what it needs from `uri`. */
typedef int (*dlock_backend_open_fn)(dlock_backend **out, dlock_uri *uri);

/**
 * Make `scheme` ("mystore", lowercase letters, digits, '+', '-', '.') open
 * with `open` in dlock_store_open, as sqlite3_vfs_register does for VFSes:
 * a store built outside libdlock. A scheme of libdlock's own cannot be
 * replaced, whether its store is built in or a module not loaded yet.
 * Thread-safe; registrations last until the process exits.
 * @return 0; DLOCK_EINVAL (bad or built-in scheme); DLOCK_ENOMEM.
 */
DLOCK_EXTERN int dlock_backend_register(const char *scheme, dlock_backend_open_fn open);

/**
 * A store built as a module (a shared object that links libdlock) exports
 * one function, dlock_store_module_init: it registers the module's schemes
 * with dlock_backend_register and returns 0, or -1 with the error set.
 * libdlock loads its own store modules so (LIBDIR/dlock/store-<kind>.so, on
 * the first use of one of their schemes; only their init may register a
 * scheme of libdlock's own), and the conformance suite an outside one
 * (`conformance --load store-mine.so mine://...`). Declared here so that a
 * module's definition is exported even when it builds with hidden
 * visibility.
 */
#define DLOCK_STORE_MODULE_INIT "dlock_store_module_init"
typedef int (*dlock_store_module_init_fn)(void);
#if defined(__GNUC__)
__attribute__((visibility("default")))
#endif
int dlock_store_module_init(void);

/**
 * Open a store over a backend you made yourself (tests use a fake store).
 * The store takes ownership of `be` (closing it on dlock_store_close, or at
 * once on failure). `display_uri` is what dlock_store_uri returns.
 */
DLOCK_EXTERN int dlock_store_open_backend(dlock_store **out, dlock_backend *be, const char *display_uri,
					  int64_t default_ttl_ms);

/**
 * Record an error for the calling thread and return `code`, for stores:
 *   return dlock_error_set(DLOCK_EUNAVAILABLE, "redis", "ECONNREFUSED", "connect %s: %s", ...);
 * `store` and `store_code` may be NULL. Never put a password in the message.
 */
DLOCK_EXTERN int dlock_error_set(int code, const char *store, const char *store_code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/** Milliseconds on CLOCK_MONOTONIC. */
DLOCK_EXTERN int64_t dlock_clock_ms(void);

/** The least time a waiting acquire try is sent with (see "Time"). */
#define DLOCK_TRY_MIN_MS 50

/**
 * Whether the waiting try `req` has too little time left to be sent: less
 * than DLOCK_TRY_MIN_MS before req->deadline_ms, or than half the store's
 * request timeout when that is smaller. Never true for a try-once. The core
 * applies it before every acquire (see "Time").
 */
static inline int dlock_try_too_late(const dlock_request *req, int64_t request_timeout_ms)
{
	int64_t least = request_timeout_ms / 2 < DLOCK_TRY_MIN_MS ? request_timeout_ms / 2 : DLOCK_TRY_MIN_MS;
	return req->waiting && req->deadline_ms - dlock_clock_ms() < least;
}

/** Milliseconds since the epoch on CLOCK_REALTIME. */
DLOCK_EXTERN int64_t dlock_wall_ms(void);

/** Fill buf with random bytes (getrandom; never fails silently: aborts if the kernel cannot). */
DLOCK_EXTERN void dlock_random(void *buf, size_t len);

DLOCK_END_DECLS

#endif
