/*
 * support.h — for the stores of this repository: the open function of each
 * (named in schemes.h) and the naming rule. What a store may use besides
 * its own files is public: <dlock/sys/backend.h> (the contract) and
 * <dlock/sys/support.h> (what the core lends every store), so a store here
 * is built as an outside one is, and most are modules of their own
 * (src/stores/module.c). Not installed.
 *
 * Stores include only this file and <dlock/...> headers: their include path
 * (CMake: the dlock_store_<kind> objects) does not reach src/core, so the
 * core's private header (src/core/internal.h) cannot be used by a store.
 *
 * Names in a store: its state is `<kind>_store` (the instance whose first
 * member is the dlock_backend: sqlite_store, redis_store, cluster_store,
 * redlock_store, etcd_store, zookeeper_store, memcached_store, mysql_store,
 * postgres_store) and its methods table `<kind>_methods`; a store of several
 * files prefixes what they share with `dlock__<short>_` (dlock__sq_,
 * dlock__et_, dlock__zk_, dlock__my_, dlock__pg_, dlock__r for Redis),
 * tables of a store's modes included (dlock__pg_advisory_methods).
 */
#ifndef DLOCK_STORES_SUPPORT_H
#define DLOCK_STORES_SUPPORT_H

#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <dlock/sys/support.h>

/* Store open functions, one per store file (src/stores/<name>.c). */
int dlock__sqlite_open(dlock_backend **out, dlock_uri *uri);
int dlock__redis_open(dlock_backend **out, dlock_uri *uri);
int dlock__redlock_open(dlock_backend **out, dlock_uri *uri);
int dlock__redis_cluster_open(dlock_backend **out, dlock_uri *uri);
int dlock__etcd_open(dlock_backend **out, dlock_uri *uri);
int dlock__zk_open(dlock_backend **out, dlock_uri *uri);
int dlock__postgres_open(dlock_backend **out, dlock_uri *uri);
int dlock__mysql_open(dlock_backend **out, dlock_uri *uri);
int dlock__memcached_open(dlock_backend **out, dlock_uri *uri);

#endif
