#include "core/internal.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define STORE(s, fn, opt) { s, fn, opt }

#ifdef DLOCK_WITH_SQLITE
#define SQLITE_OPEN dlock__sqlite_open
#else
#define SQLITE_OPEN NULL
#endif
#ifdef DLOCK_WITH_REDIS
#define REDIS_OPEN dlock__redis_open
#define REDIS_CLUSTER_OPEN dlock__redis_cluster_open
#else
#define REDIS_OPEN NULL
#define REDIS_CLUSTER_OPEN NULL
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
	STORE("redis+cluster", REDIS_CLUSTER_OPEN, "DLOCK_WITH_REDIS"),
	STORE("rediss+cluster", REDIS_CLUSTER_OPEN, "DLOCK_WITH_REDIS"),
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

/* Stores registered by the application (dlock_backend_register): a list that
 * only grows and whose entries never change, so a found entry stays valid
 * without the mutex. */
typedef struct registered {
	struct registered *next;
	dlock__scheme sc;
	char name[32];
} registered;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static registered *regs;

static const dlock__scheme *builtin(const char *scheme)
{
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strcmp(schemes[i].scheme, scheme) == 0)
			return &schemes[i];
	return NULL;
}

const dlock__scheme *dlock__scheme_find(const char *scheme)
{
	const dlock__scheme *sc = builtin(scheme);
	if (sc)
		return sc;
	pthread_mutex_lock(&reg_mu);
	for (registered *r = regs; r && !sc; r = r->next)
		if (strcmp(r->name, scheme) == 0)
			sc = &r->sc;
	pthread_mutex_unlock(&reg_mu);
	return sc;
}

int dlock_backend_register(const char *scheme, dlock_backend_open_fn open)
{
	size_t n = scheme ? strlen(scheme) : 0;
	if (!open || n == 0 || n >= sizeof(((registered *)0)->name) || !islower((unsigned char)scheme[0]))
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "dlock_backend_register: a scheme of 1 to 31 characters starting "
				       "with a lowercase letter, and an open function");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)scheme[i];
		if (!(islower(c) || isdigit(c) || c == '+' || c == '-' || c == '.'))
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
					       "dlock_backend_register: scheme '%s' may only have lowercase "
					       "letters, digits, '+', '-' and '.'", scheme);
	}
	if (builtin(scheme))
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "dlock_backend_register: '%s' is a scheme of libdlock's own", scheme);
	pthread_mutex_lock(&reg_mu);
	registered *r;
	for (r = regs; r; r = r->next)
		if (strcmp(r->name, scheme) == 0)
			break;
	if (r) {
		dlock_backend_open_fn had = r->sc.open;
		pthread_mutex_unlock(&reg_mu);
		return had == open ? 0
				   : dlock_error_set(DLOCK_EINVAL, NULL, NULL,
						     "dlock_backend_register: '%s' is registered already", scheme);
	}
	if ((r = calloc(1, sizeof(*r))) != NULL) {
		memcpy(r->name, scheme, n + 1);
		r->sc.scheme = r->name;
		r->sc.open = open;
		r->sc.build_option = "";
		r->next = regs;
		regs = r;
	}
	pthread_mutex_unlock(&reg_mu);
	return r ? 0 : dlock__oom();
}
