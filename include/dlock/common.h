/*
 * dlock/common.h — export macro and basic types shared by every public header.
 */
#ifndef DLOCK_COMMON_H
#define DLOCK_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && defined(DLOCK_BUILDING)
#define DLOCK_EXTERN __attribute__((visibility("default")))
#else
#define DLOCK_EXTERN
#endif

#ifdef __cplusplus
#define DLOCK_BEGIN_DECLS extern "C" {
#define DLOCK_END_DECLS }
#else
#define DLOCK_BEGIN_DECLS
#define DLOCK_END_DECLS
#endif

DLOCK_BEGIN_DECLS

/** Opaque handle on one lock store (see dlock/store.h). */
typedef struct dlock_store dlock_store;
/** Opaque handle on one named lock of a store (see dlock/lock.h). */
typedef struct dlock_lock dlock_lock;

/** Lock modes. */
typedef enum dlock_mode {
	DLOCK_EXCLUSIVE = 0, /**< one holder (or up to `permits` holders when permits > 1) */
	DLOCK_SHARED = 1     /**< many readers, excluded by any exclusive holder (read-write lock) */
} dlock_mode;

/**
 * Free memory that the library returned to the caller as a plain string
 * (handles, redacted URIs). Accepts NULL.
 */
DLOCK_EXTERN void dlock_free(void *ptr);

DLOCK_END_DECLS

#endif
