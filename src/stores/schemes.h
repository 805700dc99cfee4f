/*
 * schemes.h — which URI schemes each store serves, one list per store
 * module: X(scheme, open function). The core's scheme table
 * (src/core/schemes.c) is built from these lists, and so is a module's
 * entry (module.c), so a scheme is named in one place.
 */
#ifndef DLOCK_STORES_SCHEMES_H
#define DLOCK_STORES_SCHEMES_H

#define DLOCK_SCHEMES_SQLITE(X) X("sqlite", dlock__sqlite_open)
/* redis/ holds both Redis stores: one server, Sentinel or Cluster, and Redlock */
#define DLOCK_SCHEMES_REDIS(X)                                                                      \
	X("redis", dlock__redis_open)                                                               \
	X("rediss", dlock__redis_open)                                                              \
	X("redis+sentinel", dlock__redis_open)                                                      \
	X("redis+cluster", dlock__redis_cluster_open)                                               \
	X("rediss+cluster", dlock__redis_cluster_open)                                              \
	X("redlock", dlock__redlock_open)
#define DLOCK_SCHEMES_ETCD(X) X("etcd", dlock__etcd_open) X("etcds", dlock__etcd_open)
#define DLOCK_SCHEMES_ZOOKEEPER(X) X("zk", dlock__zk_open)
#define DLOCK_SCHEMES_POSTGRES(X) X("postgres", dlock__postgres_open) X("postgresql", dlock__postgres_open)
#define DLOCK_SCHEMES_MYSQL(X) X("mysql", dlock__mysql_open) X("mariadb", dlock__mysql_open)
#define DLOCK_SCHEMES_MEMCACHED(X) X("memcached", dlock__memcached_open)

#endif
