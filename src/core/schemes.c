#include "core/internal.h"

#include <string.h>

#define STORE(s, fn, opt) { s, fn, opt }

#ifdef DLOCK_WITH_SQLITE
#define SQLITE_OPEN dlock__sqlite_open
#else
#define SQLITE_OPEN NULL
#endif
#ifdef DLOCK_WITH_REDIS
#define REDIS_OPEN dlock__redis_open
#else
#define REDIS_OPEN NULL
#endif
#ifdef DLOCK_WITH_REDLOCK
#define REDLOCK_OPEN dlock__redlock_open
#else
#define REDLOCK_OPEN NULL
#endif
#ifdef DLOCK_WITH_ETCD
#define ETCD_OPEN dlock__etcd_open
#else
#define ETCD_OPEN NULL
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
#define ZK_OPEN dlock__zk_open
#else
#define ZK_OPEN NULL
#endif
#ifdef DLOCK_WITH_POSTGRES
#define POSTGRES_OPEN dlock__postgres_open
#else
#define POSTGRES_OPEN NULL
#endif
#ifdef DLOCK_WITH_MYSQL
#define MYSQL_OPEN dlock__mysql_open
#else
#define MYSQL_OPEN NULL
#endif
#ifdef DLOCK_WITH_MEMCACHED
#define MEMCACHED_OPEN dlock__memcached_open
#else
#define MEMCACHED_OPEN NULL
#endif

static const dlock__scheme schemes[] = {
	STORE("sqlite", SQLITE_OPEN, "DLOCK_WITH_SQLITE"),
	STORE("redis", REDIS_OPEN, "DLOCK_WITH_REDIS"),
	STORE("rediss", REDIS_OPEN, "DLOCK_WITH_REDIS"),
	STORE("redis+sentinel", REDIS_OPEN, "DLOCK_WITH_REDIS"),
	STORE("redlock", REDLOCK_OPEN, "DLOCK_WITH_REDIS"),
	STORE("etcd", ETCD_OPEN, "DLOCK_WITH_ETCD"),
	STORE("etcds", ETCD_OPEN, "DLOCK_WITH_ETCD"),
	STORE("zk", ZK_OPEN, "DLOCK_WITH_ZOOKEEPER"),
	STORE("postgres", POSTGRES_OPEN, "DLOCK_WITH_POSTGRES"),
	STORE("postgresql", POSTGRES_OPEN, "DLOCK_WITH_POSTGRES"),
	STORE("mysql", MYSQL_OPEN, "DLOCK_WITH_MYSQL"),
	STORE("mariadb", MYSQL_OPEN, "DLOCK_WITH_MYSQL"),
	STORE("memcached", MEMCACHED_OPEN, "DLOCK_WITH_MEMCACHED"),
};

const dlock__scheme *dlock__scheme_find(const char *scheme)
{
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strcmp(schemes[i].scheme, scheme) == 0)
			return &schemes[i];
	return NULL;
}
