/*
 * dlock/store.h — opening a lock store, inspecting it, and small helpers
 * shared by every program that talks to one (durations, names).
 *
 * A dlock_store is thread-safe: many threads may create and use locks on one
 * store at the same time. It owns a random 128-bit client id and, once a lock
 * with renewal is held, a background renewal thread.
 *
 * Processes and fork(): a store handle and the lock handles made from it
 * belong to the process that opened the store. A fork()'s child inherits a
 * copy of them but not their threads, and their connections and sessions
 * stay the parent's; so in the child every call on an inherited handle
 * (dlock_lock_new, dlock_acquire, dlock_release, dlock_extend,
 * dlock_lock_detach, dlock_lock_attach, dlock_store_status) fails with
 * DLOCK_EINVAL and a message naming fork() — never a grant under the
 * parent's identity — dlock_held() and dlock_fence() answer 0, and nothing
 * of the parent's is renewed, released or closed from the child.
 * dlock_lock_free and dlock_store_close in the child only free memory: they
 * send nothing (a polite close would end the parent's session). A store the
 * child opens itself is a new owner with a client id of its own. The parent
 * is unaffected: its locks stay held and renewed. Prefer to open stores after
 * fork(), or exec; fork while no other thread is inside a call of the
 * library (as always in a threaded program, a client library may hold an
 * internal mutex of its own at the fork).
 */
#ifndef DLOCK_STORE_H
#define DLOCK_STORE_H

#include <dlock/common.h>

DLOCK_BEGIN_DECLS

/** Longest lock name accepted, in bytes. */
#define DLOCK_NAME_MAX 512

/**
 * Open a store from a URI.
 *
 *   sqlite:///abs/path.db   sqlite:relative.db   sqlite:   (default file)
 *   redis://[user:pass@]host:port[/db]
 *   redlock://host:port,host:port,host:port[?drift=0.01]
 *   etcd://host:port[,host:port...]   etcds://...
 *   zk://host:port[,host:port...][/chroot]
 *   postgres://user:pass@host:port/db[?mode=table|advisory]
 *   mysql://user:pass@host:port/db[?mode=table|get_lock]
 *   memcached://host:port
 *
 * Query options every store accepts: `ttl` (default lease for locks opened
 * with ttl_ms = 0; a duration such as 30s), `prefix` (namespace, default
 * "dlock"), `connect_timeout` (a duration, default 5s: the bound of the whole
 * open), `timeout` (the bound of one request — a release, an extend, a
 * renewal, one try of an acquire; default the smaller of connect_timeout and
 * 2s). An unknown option is DLOCK_EINVAL before any connection, naming the
 * options the scheme takes. A NULL or empty `uri` opens the default store (dlock_default_uri).
 *
 * @param out  receives the store; the caller frees it with dlock_store_close
 * @param uri  copied; may contain a password, which is never echoed
 * @return 0; DLOCK_EINVAL for a malformed URI, unknown scheme or option;
 *         DLOCK_ENOTSUPPORTED for a store this build was compiled without
 *         or whose module (LIBDIR/dlock/store-<kind>.so) is not installed;
 *         DLOCK_EUNAVAILABLE if the store cannot be reached;
 *         DLOCK_EAUTH if it refused our credentials; DLOCK_ENOMEM.
 */
DLOCK_EXTERN int dlock_store_open(dlock_store **out, const char *uri);

/**
 * dlock_store_open that returns within `timeout_ms` (+ a few ms) whatever the
 * network does: the URI's connect_timeout is cut to it. For a caller with a
 * deadline of its own (`dlock acquire --wait 1s` opens, then waits for what
 * is left). A timeout_ms <= 0 is the same as dlock_store_open.
 * @return as dlock_store_open; DLOCK_EUNAVAILABLE when the time ran out.
 */
DLOCK_EXTERN int dlock_store_open_timeout(dlock_store **out, const char *uri, int64_t timeout_ms);

/**
 * Close a store. Locks still held through it are released first (best
 * effort) and stop being renewed. Lock handles made from the store must be
 * freed before it. Accepts NULL.
 * Bounded: what is left for the store (those releases, and the releases and
 * waiter cancels the background was still retrying) gets one request
 * timeout in all, and none if the store left the last request unanswered:
 * then an unconfirmed release is left to its lease and a cancel to the
 * waiter queue's TTL (nothing stays held past the lease it had), and close
 * does not wait on the dead link. The store's own close (its sockets, a
 * session's end) follows, each store bounding it by its request timeout.
 * It does not wait for on_lost callbacks still running (see dlock/lock.h):
 * they finish later on their own threads, which free the handle's memory
 * last. The renewer's own connection still being opened is waited for
 * within one request timeout (none if the store left the last request
 * unanswered); one still opening after that is closed when it is done.
 * In a fork()'s child, of a store the parent opened: frees this process's
 * copy without a word to the store (no release, no disconnect); the
 * parent's locks and session carry on.
 */
DLOCK_EXTERN void dlock_store_close(dlock_store *store);

/** The store's kind: "sqlite", "redis", ... Never NULL. */
DLOCK_EXTERN const char *dlock_store_kind(const dlock_store *store);

/** The URI the store was opened with, with any password replaced by "***"
 *  (as dlock_uri_redact does). */
DLOCK_EXTERN const char *dlock_store_uri(const dlock_store *store);

/**
 * `uri` with every secret replaced by "***": the password of the user info
 * (up to the last '@' of the authority, so a raw '@' in a password is masked
 * too) and the values of the query options password=, pass= and token=.
 * The one masking function: everything dlock prints about a URI goes
 * through it. Works on text that is not a valid URI (returns it unchanged
 * where it finds no secret).
 * @return a string to free with dlock_free; NULL for NULL or out of memory.
 */
DLOCK_EXTERN char *dlock_uri_redact(const char *uri);

/**
 * Non-zero when a hold lives only as long as this process's session or
 * connection (ZooKeeper, MySQL get_lock mode, PostgreSQL advisory mode):
 * such holds cannot be detached (dlock_lock_detach gives
 * DLOCK_ENOTSUPPORTED); a program that must hand one over keeps a process
 * alive that holds it, as `dlock acquire` does.
 */
DLOCK_EXTERN int dlock_store_session_bound(const dlock_store *store);

/** This store handle's client id: 32 lowercase hex digits (random per open:
 *  a store opened in a fork()'s child has its own). */
DLOCK_EXTERN const char *dlock_store_client_id(const dlock_store *store);

/**
 * How many requests this handle's core has sent the store since it was
 * opened: acquire tries, releases, cancels, extends, renewal batches (one per
 * batch), status and break calls, blocking waits (stores that wait inside
 * the server). Not counted: what a store does by itself to keep a session or
 * a subscription alive (ZooKeeper pings, etcd lease keep-alives, a Redis
 * subscription). For monitoring, and to see what waiting costs: a waiter of
 * a store that wakes waiters (dlock_store_wakes_waiters) makes one try when
 * woken and one per refresh of its waiter registration (every second), not
 * one per back-off step. Safe from any thread; 0 for NULL.
 */
DLOCK_EXTERN uint64_t dlock_store_requests(const dlock_store *store);

/**
 * Non-zero when the store tells waiters of a release (SQLite doorbells,
 * Redis pub/sub, etcd and ZooKeeper watches, PostgreSQL LISTEN, MySQL
 * get_lock mode's blocking wait); zero when waiters poll with back-off
 * (Memcached, MySQL table mode: see their pages in docs/stores/).
 */
DLOCK_EXTERN int dlock_store_wakes_waiters(const dlock_store *store);

/**
 * What this store handle's connection does not protect, or NULL: the store
 * sends its password or its lock traffic to a host that is not this machine
 * (as written: not localhost, 127.x.x.x, ::1 or a Unix socket) over a
 * connection that does not verify the server (PostgreSQL sslmode other than
 * verify-ca/verify-full, MySQL without ssl=verify, Redis, etcd and
 * ZooKeeper with a password over plain TCP), so a man in the middle could
 * read or change it. The text names the option that verifies, where there
 * is one. `dlock` prints it once on stderr. Valid until the store is closed.
 */
DLOCK_EXTERN const char *dlock_store_warning(const dlock_store *store);

/**
 * The default store URI: sqlite:// on $DLOCK_HOME/dlock.db, else
 * $XDG_STATE_HOME/dlock/dlock.db, else ~/.local/state/dlock/dlock.db.
 * @param out receives a string to free with dlock_free.
 */
DLOCK_EXTERN int dlock_default_uri(char **out);

/** Length of a public holder id (dlock_holder.id), in hex digits. */
#define DLOCK_HOLDER_ID_LEN 16

/**
 * One holder of a lock, as reported by dlock_store_status.
 *
 * `owner` is SECRET: it is the owner token a handle carries, and whoever
 * knows it can extend or release that hold (a handle is "dl1.<mode>.
 * <permits>.<fence>.<ttl>.<owner>"). Never print or log it; show `id`.
 * `id` is public: a one-way function of the owner (the first 64 bits of
 * SHA-256 over a fixed tag and the owner, in hex), the same for one hold
 * on every call and in every process, and no way back to the owner.
 * dlock_store_break frees a hold named by it.
 */
typedef struct dlock_holder {
	char *owner;          /**< SECRET: the holder's owner token (client id and a serial) */
	char *host;           /**< host name of the holder's machine, or "" */
	int pid;              /**< process id of the holder, or 0 */
	dlock_mode mode;
	uint64_t fence;       /**< the fence this holder was granted */
	int64_t ttl_left_ms;  /**< lease left, as the store sees it; -1 if unknown */
	unsigned int copies;    /**< stores that keep a hold on several servers (Redlock): how
				     many have this hold now; 0 where there is one copy */
	unsigned int copies_of; /**< ... out of how many servers (0 where there is one copy).
				     copies == copies_of / 2 + 1 is a bare quorum: one more
				     lost copy and another client can be granted */
	char *id;             /**< public holder id: DLOCK_HOLDER_ID_LEN lowercase hex
				     digits (appended after 0.1.0, which
				     changed sizeof(dlock_holder): rebuild programs that
				     index holders; "" when the store reports no owner). Safe to show; cannot be turned into a handle */
} dlock_holder;

/** The state of one lock name, as reported by dlock_store_status. */
typedef struct dlock_lock_status {
	char *name;
	unsigned int permits;  /**< >1 for a semaphore, else 1 */
	uint64_t last_fence;   /**< the highest fence granted so far for this name */
	size_t nholders;
	dlock_holder *holders;
	size_t waiters;        /**< clients known to be waiting (0 if unknown) */
} dlock_lock_status;

/**
 * Report the state of locks. With names == NULL (or nnames == 0) report every
 * lock that has holders or waiters; otherwise report exactly the given names
 * (a free name has nholders == 0). Not every store can list all names: those
 * return DLOCK_ENOTSUPPORTED for names == NULL.
 *
 * @param out    receives an array of *count entries; free with dlock_status_free
 */
DLOCK_EXTERN int dlock_store_status(dlock_store *store, const char *const *names, size_t nnames,
				    dlock_lock_status **out, size_t *count);

/** Free what dlock_store_status returned. Accepts NULL. */
DLOCK_EXTERN void dlock_status_free(dlock_lock_status *status, size_t count);

/**
 * Free another client's hold of lock `name`: the holder whose public id
 * (dlock_holder.id) is `holder_id`. The store's own owner-checked release
 * is used, so only that hold goes; the holder is not told, and its next
 * renewal or extend finds the lock gone (DLOCK_ELOST / DLOCK_ENOTHELD).
 * Safe only when that holder can no longer write, or every write it makes
 * is checked against fences: otherwise two clients may write at once.
 * Thread-safe.
 *
 * @param freed  NULL, or receives a copy of the holder that was freed, as
 *               status reported it just before; its strings are the
 *               caller's (dlock_holder_clear); zeroed on failure
 * @return 0; DLOCK_ENOTHELD when `name` has no holder with that id (already
 *         gone, or a wrong id); DLOCK_EINVAL for a bad name or an id that is
 *         not DLOCK_HOLDER_ID_LEN hex digits; DLOCK_ENOTSUPPORTED when the
 *         store cannot free a hold from another connection (PostgreSQL
 *         advisory and MySQL get_lock holds live on their holder's
 *         connection) or cannot report status; DLOCK_EUNAVAILABLE when the
 *         store does not answer within its request timeout.
 */
DLOCK_EXTERN int dlock_store_break(dlock_store *store, const char *name, const char *holder_id, dlock_holder *freed);

/** Free the strings of a dlock_holder filled by dlock_store_break. Accepts NULL. */
DLOCK_EXTERN void dlock_holder_clear(dlock_holder *holder);

/**
 * Parse a duration: "250ms", "30s", "5m", "1h", "1d", "1.5s", or a sequence
 * of such parts as in Go ("1h30m", "1m30s", "1d12h"); a bare number alone is
 * seconds. No sign, no spaces.
 * @return 0 and *ms; DLOCK_EINVAL (with a message naming the problem).
 */
DLOCK_EXTERN int dlock_duration_parse(int64_t *ms, const char *text);

/**
 * Check a lock name: 1 to DLOCK_NAME_MAX bytes of valid UTF-8 without control
 * characters. @return 0 or DLOCK_EINVAL with a message naming the problem.
 */
DLOCK_EXTERN int dlock_name_check(const char *name);

DLOCK_END_DECLS

#endif
