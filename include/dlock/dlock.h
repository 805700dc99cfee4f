/*
 * dlock/dlock.h — the umbrella header of libdlock, distributed locks for C.
 *
 *   #include <dlock/dlock.h>
 *
 * See dlock/store.h (stores, URIs), dlock/lock.h (locks), dlock/errors.h
 * (error codes), dlock/version.h, and dlock/sys/backend.h (writing a store).
 */
#ifndef DLOCK_DLOCK_H
#define DLOCK_DLOCK_H

#include <dlock/common.h>
#include <dlock/version.h>
#include <dlock/errors.h>
#include <dlock/store.h>
#include <dlock/lock.h>

#endif
