/*
 * dlock/lock.h — lock handles: acquire, release, extend, fences, the
 * lost-lock signal, and handles that outlive the process (for scripts).
 *
 * A dlock_lock belongs to the thread that acquires it: reentrant acquires
 * are counted per handle and cost no round trip. Other threads may call
 * dlock_held() and dlock_fence() on it at any time.
 *
 * It belongs to the process that opened its store, too: in a fork()'s child
 * every call on an inherited lock handle fails with DLOCK_EINVAL ("... is a
 * fork() child ...: open a new store in the child"), dlock_held() is 0 and
 * dlock_lock_free only frees memory (see dlock/store.h, "Processes").
 */
#ifndef DLOCK_LOCK_H
#define DLOCK_LOCK_H

#include <dlock/common.h>

DLOCK_BEGIN_DECLS

/**
 * Called once when a held lock is lost: at its lease deadline if no renewal
 * was confirmed by then (whatever the network does — the signal never waits
 * for I/O), or at once when the store says the hold is no longer ours. It
 * runs on a runner thread of the store, never on the watchdog: the first
 * runner is made with the store's other threads at the first acquire (which
 * fails with DLOCK_ENOMEM if it cannot be), and a runner that takes a
 * callback first makes a spare, so a slow or blocking callback delays
 * neither renewal nor another lock's signal. (Only if no spare thread can be
 * made does the next callback wait for a runner; its lock is marked lost on
 * time all the same.) It may call dlock_lock_free on its own lock.
 *
 * A callback still running never holds up its own lock: dlock_release,
 * dlock_acquire and dlock_lock_free of that lock, and dlock_store_close,
 * return within their usual bounds without waiting for it. The lock
 * handle's memory stays valid until the callback returns (it is reference
 * counted: dlock_lock_free does not wait, the callback's runner frees it
 * afterwards), so the callback may go on calling dlock_held, dlock_fence or
 * dlock_lock_name on it. After dlock_store_close the callback's runner ends
 * when the callback returns and frees the store's memory last; a
 * dlock_lock_free of its lock then frees memory only (nothing is sent: the
 * store is closed and the lease ends the hold).
 */
typedef void (*dlock_lost_fn)(dlock_lock *lock, void *payload);

/**
 * Called on the thread that waits in dlock_acquire, from inside that call,
 * while a wait is under way: with `rc` DLOCK_EUNAVAILABLE and the store's
 * message each time a try found the store unreachable (the wait goes on: such answers are ridden out until it
 * ends), and once with `rc` 0 and a NULL message when the store answers
 * again. It must return quickly and must not call the library with this
 * lock. For telling a user why a wait takes long (`dlock run` does).
 */
typedef void (*dlock_wait_fn)(dlock_lock *lock, int rc, const char *message, void *payload);

#define DLOCK_LOCK_OPTIONS_VERSION 2

/** Longest lease accepted: 366 days. */
#define DLOCK_TTL_MAX_MS ((int64_t)366 * 24 * 3600 * 1000)

/**
 * Options of a lock handle. Start from DLOCK_LOCK_OPTIONS_INIT; new fields
 * are only ever appended (and `version` raised).
 */
typedef struct dlock_lock_options {
	unsigned int version;  /**< DLOCK_LOCK_OPTIONS_VERSION */
	int64_t ttl_ms;        /**< lease; 0 = the store's default (30 s unless the URI says ttl=) */
	dlock_mode mode;       /**< DLOCK_EXCLUSIVE or DLOCK_SHARED */
	/** Semaphore size (exclusive mode only; 0 means 1, at most 1000000): 1 is
	 * a mutex, N > 1 lets up to N holders share the name. Holders of one name
	 * need not agree on N; on every store a request is granted only if
	 * (holders + 1) <= the smallest permits among every live holder and the
	 * requester. So a mutex (1) excludes every semaphore holder and caller,
	 * and with two holders of 2 a caller of 3 is refused. Shared (read) locks
	 * keep their own rules. Stores without semaphores (redlock, MySQL
	 * mode=get_lock) return DLOCK_ENOTSUPPORTED for N > 1. */
	unsigned int permits;
	int fair;              /**< non-zero: grant in request order (FIFO) */
	int no_renew;          /**< non-zero: no background renewal: the lease runs out
				    (on_lost still fires at its deadline) */
	dlock_lost_fn on_lost; /**< optional lost-lock callback */
	void *payload;         /**< passed to on_lost (and on_unreachable) */
	/* version 2 */
	dlock_wait_fn on_unreachable; /**< optional: a wait's tries find the store unreachable */
} dlock_lock_options;

#define DLOCK_LOCK_OPTIONS_INIT \
	{ DLOCK_LOCK_OPTIONS_VERSION, 0, DLOCK_EXCLUSIVE, 1, 0, 0, NULL, NULL, NULL }

/**
 * Make a lock handle for `name` on `store`. Nothing is sent to the store.
 * @param out   receives the handle; free with dlock_lock_free
 * @param name  copied; checked with dlock_name_check
 * @param opts  copied; NULL for the defaults
 * @return 0; DLOCK_EINVAL (bad name, negative ttl, permits with shared
 *         mode, unknown options version; a store opened by the parent of
 *         this fork()'s child); DLOCK_ENOMEM.
 */
DLOCK_EXTERN int dlock_lock_new(dlock_lock **out, dlock_store *store, const char *name, const dlock_lock_options *opts);

/**
 * Free a handle. A lock still held is released first (all reentrant holds).
 * Accepts NULL. Safe to call from the lock's own on_lost callback. Does not
 * wait for an on_lost of this lock that is still running: the memory is
 * freed when that callback returns.
 * In a fork()'s child, of a handle made before the fork: frees memory only
 * (the hold is the parent's and stays held).
 */
DLOCK_EXTERN void dlock_lock_free(dlock_lock *lock);

/**
 * Acquire the lock.
 * @param wait_ms  0 = try once; > 0 = wait at most that long; < 0 = forever
 *                 (so does a wait longer than DLOCK_TTL_MAX_MS)
 * @return 0 (held; the lease deadline counts from before the request was
 *         sent — from before the EARLIEST try of this call whose reply was
 *         lost, since the store may have applied it); DLOCK_ELOCKED (wait 0
 *         and held by another); DLOCK_ETIMEOUT (the wait ended and some
 *         try found the lock held, even if the last try went unanswered);
 *         DLOCK_EUNAVAILABLE (the store never said the lock was held);
 *         DLOCK_EBUSY (held through this handle by another thread);
 *         DLOCK_ELOST (reentrant acquire after the lease ended);
 *         DLOCK_EINVAL (a handle inherited through fork(): see above);
 *         other codes from the store.
 * A store that does not answer a first try gives DLOCK_EUNAVAILABLE at once;
 * once a wait is under way, such answers are ridden out until it ends.
 * Bounded whatever the network does: with wait_ms > 0 it returns within
 * wait_ms + max(50 ms, 5 %); a try-once within the store's request timeout
 * (URI `timeout=`). A grant whose reply arrives after the lease it carries
 * has ended is refused. A call that ends without a grant undoes what its
 * tries may have left in the store (in the background if the store does not
 * answer at once).
 * If this handle already holds the lock on this thread, the hold count grows
 * and 0 is returned with no round trip; the fence stays the same.
 */
DLOCK_EXTERN int dlock_acquire(dlock_lock *lock, int64_t wait_ms);

/**
 * Release one hold. The lock is freed in the store after as many releases as
 * acquires.
 * Returns within twice the store's request timeout (URI `timeout=`): its
 * own request, after at most one other request of the store handle in
 * flight (a renewal or a retried release, each bounded by it). Its own
 * request waits no longer than the hold's lease (a release after the lease
 * has ended is moot; at least a short try is made), and a renewal in flight
 * ends by the lease deadline too. Never waits for a running on_lost.
 * @return 0; DLOCK_ENOTHELD (not held by this handle — nothing changes in
 *         the store); DLOCK_ELOST (the lease had ended: the lock was lost);
 *         DLOCK_EUNAVAILABLE (the store did not confirm). After
 *         DLOCK_EUNAVAILABLE the handle no longer holds the lock, renewal
 *         has stopped, and the store's threads retry the release in the
 *         background until it is confirmed or the lease has ended; calling
 *         dlock_release again retries it at once (0 when it is confirmed or
 *         already done).
 */
DLOCK_EXTERN int dlock_release(dlock_lock *lock);

/**
 * Extend the lease now to `ttl_ms` from now (0 = the handle's ttl); later
 * renewals use the new ttl. The store's lease is never shorter than the one
 * the handle then counts (dlock_ttl_left): the extend waits for a renewal of
 * this hold already in flight (within one request timeout) and no renewal
 * of it is sent while the extend is; on 0 the handle counts `ttl_ms` from
 * before the request, or less when an earlier renewal or extend of this hold
 * with a shorter ttl never got its answer (it may still land and, on a
 * store that sets now + ttl, cut the lease to its ttl: the handle then
 * counts, and renews at a third of, that shorter ttl until the hold ends).
 * Stores keep the later of their expiry and now + ttl where they can
 * (sys/backend.h): there a shorter `ttl_ms` shortens what the handle counts
 * and how often it renews, not the lease the store already gave.
 * Not thread-safe with other calls on the same handle.
 * @return 0; DLOCK_ENOTHELD (not held by this handle); DLOCK_ELOST (the
 *         lease had ended, or the store no longer has the hold);
 *         DLOCK_EUNAVAILABLE (no answer, or a renewal of the hold still in
 *         flight after one request timeout: the lease the handle counts is
 *         then cut to `ttl_ms` from before the request if that is sooner,
 *         since the request may still land); DLOCK_EINVAL (bad ttl).
 */
DLOCK_EXTERN int dlock_extend(dlock_lock *lock, int64_t ttl_ms);

/**
 * Whether the handle holds the lock now: acquired, not released, and the
 * lease deadline (CLOCK_MONOTONIC, minus a drift margin) not passed without
 * a confirmed renewal. Thread-safe. 0 in a fork()'s child for a handle made
 * before the fork (the hold is the parent's).
 */
DLOCK_EXTERN int dlock_held(const dlock_lock *lock);

/**
 * Why the handle's hold was lost, once it was (from its on_lost callback
 * on, or after dlock_extend answered DLOCK_ELOST): "its
 * lease ran out: no renewal was confirmed before the deadline", or "the
 * store no longer has the hold (released or broken by another client,
 * expired on the store, or the store's data was lost)". Static text; NULL
 * while the handle holds the lock, never held it or released it, and again
 * after a new acquire. Thread-safe.
 */
DLOCK_EXTERN const char *dlock_lost_reason(const dlock_lock *lock);

/** The fencing token of the current hold, or 0 when not held. Thread-safe. */
DLOCK_EXTERN uint64_t dlock_fence(const dlock_lock *lock);

/** The lock's name (as given to dlock_lock_new). */
DLOCK_EXTERN const char *dlock_lock_name(const dlock_lock *lock);

/** Milliseconds left of the lease as this process knows it; 0 when not held. */
DLOCK_EXTERN int64_t dlock_ttl_left(const dlock_lock *lock);

/**
 * Hand a held lock over to someone outside this process (a shell script):
 * renewal stops, the hold stays in the store until its lease ends, and the
 * handle no longer holds it locally. *handle receives an opaque printable
 * string (free with dlock_free) that dlock_lock_attach accepts.
 * @return 0; DLOCK_ENOTHELD.
 */
DLOCK_EXTERN int dlock_lock_detach(dlock_lock *lock, char **handle);

/**
 * Take over a hold described by a string from dlock_lock_detach, so that
 * dlock_extend and dlock_release act on it. Nothing is sent to the store:
 * the store checks the owner on extend/release, so a wrong handle gets
 * DLOCK_ENOTHELD there and never touches another holder's lock. The hold is
 * not renewed in the background.
 * The handle's mode and permits replace those of the lock's options (the
 * handle describes a hold that exists), so a script need not repeat them.
 * @return 0; DLOCK_EINVAL (malformed handle); DLOCK_EBUSY (this handle
 *         already holds).
 */
DLOCK_EXTERN int dlock_lock_attach(dlock_lock *lock, const char *handle);

DLOCK_END_DECLS

#endif
