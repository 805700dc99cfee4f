/*
 * dlock/errors.h — error codes and the thread-local last error.
 *
 * Every fallible function returns an int: 0 on success, a negative DLOCK_E*
 * code on failure. The details of the most recent failure on the calling
 * thread are in dlock_error_last(). Codes are never renumbered.
 */
#ifndef DLOCK_ERRORS_H
#define DLOCK_ERRORS_H

#include <dlock/common.h>

DLOCK_BEGIN_DECLS

typedef enum dlock_error_code {
	DLOCK_OK = 0,
	DLOCK_EINVAL = -1,         /**< bad argument: URI, name, duration, option, handle */
	DLOCK_ENOMEM = -2,         /**< out of memory */
	DLOCK_ETIMEOUT = -3,       /**< not acquired within the wait */
	DLOCK_ELOCKED = -4,        /**< a try-once (wait = 0) found the lock held */
	DLOCK_ENOTHELD = -5,       /**< release/extend of a lock this handle does not hold */
	DLOCK_ELOST = -6,          /**< the lock was held but its lease ended (lost-lock signal) */
	DLOCK_EUNAVAILABLE = -7,   /**< store unreachable, or it failed to answer in time */
	DLOCK_EAUTH = -8,          /**< authentication or permission failure */
	DLOCK_ENOTSUPPORTED = -9,  /**< the store (or this build) cannot do this */
	DLOCK_ESTORE = -10,        /**< the store answered with an unexpected error */
	DLOCK_EBUSY = -11          /**< the handle is in use (held by another thread, or still held at free) */
} dlock_error_code;

/**
 * Details of the last error on the calling thread.
 * `store_code` is the store's own code as text (a Redis error prefix, an HTTP
 * status, a ZooKeeper code, an SQLSTATE, an SQLite result code), or "".
 */
typedef struct dlock_error {
	int code;                 /**< a dlock_error_code; 0 when no error happened yet */
	const char *message;      /**< human readable, never contains a password; never NULL */
	const char *store;        /**< store kind ("sqlite", "redis", ...) or "" */
	const char *store_code;   /**< the store's own code, or "" */
} dlock_error;

/**
 * The last error recorded on the calling thread. Never NULL: before any error
 * it holds code 0 and message "no error". The pointers stay valid until the
 * next dlock call on this thread. Thread-safe (thread-local).
 */
DLOCK_EXTERN const dlock_error *dlock_error_last(void);

/** Forget the calling thread's last error. */
DLOCK_EXTERN void dlock_error_clear(void);

/**
 * Static text for a code ("lock not held", ...); "unknown error" for codes
 * this version does not know. Thread-safe.
 */
DLOCK_EXTERN const char *dlock_strerror(int code);

/**
 * The symbolic name of a code ("DLOCK_ETIMEOUT"), or "DLOCK_E?" when unknown.
 */
DLOCK_EXTERN const char *dlock_error_name(int code);

DLOCK_END_DECLS

#endif
