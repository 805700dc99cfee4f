/*
 * schemes.c — from a URI's scheme to the store that serves it.
 *
 * The SQLite store is always part of libdlock. Every other store is either
 * compiled into libdlock too (DLOCK_STORES_BUILTIN: the static library, or a
 * build with -DDLOCK_STATIC_STORES=ON) or a module of its own,
 * store-<kind>.so in the folder dlock/ beside the libdlock that runs, which
 * is loaded on the first use of one of its schemes and registers them with
 * dlock_backend_register (src/stores/module.c). A program that only uses the
 * embedded store, or one other store, thus loads no client library it does
 * not use.
 */
#include "core/internal.h"
#include "stores/schemes.h"

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct scheme_entry {
	const char *scheme;
	dlock_backend_open_fn open; /* NULL: not in this library */
	const char *build_option;   /* "DLOCK_WITH_REDIS" */
	const char *module;         /* "redis": served by store-redis.so; NULL: not a module */
	bool built;                 /* the build this library belongs to compiled the store */
} scheme_entry;

#define IN(s, fn, opt) {s, fn, opt, NULL, true},
#define MODULE(s, opt, kind, on) {s, NULL, opt, kind, on},
#define OUT(s, opt) {s, NULL, opt, NULL, false},

#ifdef DLOCK_WITH_SQLITE
#define SQLITE_E(s, fn) IN(s, fn, "DLOCK_WITH_SQLITE")
#else
#define SQLITE_E(s, fn) OUT(s, "DLOCK_WITH_SQLITE")
#endif

#ifdef DLOCK_WITH_REDIS
#define REDIS_ON true
#else
#define REDIS_ON false
#endif
#ifdef DLOCK_WITH_ETCD
#define ETCD_ON true
#else
#define ETCD_ON false
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
#define ZOOKEEPER_ON true
#else
#define ZOOKEEPER_ON false
#endif
#ifdef DLOCK_WITH_POSTGRES
#define POSTGRES_ON true
#else
#define POSTGRES_ON false
#endif
#ifdef DLOCK_WITH_MYSQL
#define MYSQL_ON true
#else
#define MYSQL_ON false
#endif
#ifdef DLOCK_WITH_MEMCACHED
#define MEMCACHED_ON true
#else
#define MEMCACHED_ON false
#endif

#ifndef DLOCK_STORES_BUILTIN
#define REDIS_E(s, fn) MODULE(s, "DLOCK_WITH_REDIS", "redis", REDIS_ON)
#define ETCD_E(s, fn) MODULE(s, "DLOCK_WITH_ETCD", "etcd", ETCD_ON)
#define ZOOKEEPER_E(s, fn) MODULE(s, "DLOCK_WITH_ZOOKEEPER", "zookeeper", ZOOKEEPER_ON)
#define POSTGRES_E(s, fn) MODULE(s, "DLOCK_WITH_POSTGRES", "postgres", POSTGRES_ON)
#define MYSQL_E(s, fn) MODULE(s, "DLOCK_WITH_MYSQL", "mysql", MYSQL_ON)
#define MEMCACHED_E(s, fn) MODULE(s, "DLOCK_WITH_MEMCACHED", "memcached", MEMCACHED_ON)
#else
#ifdef DLOCK_WITH_REDIS
#define REDIS_E(s, fn) IN(s, fn, "DLOCK_WITH_REDIS")
#else
#define REDIS_E(s, fn) OUT(s, "DLOCK_WITH_REDIS")
#endif
#ifdef DLOCK_WITH_ETCD
#define ETCD_E(s, fn) IN(s, fn, "DLOCK_WITH_ETCD")
#else
#define ETCD_E(s, fn) OUT(s, "DLOCK_WITH_ETCD")
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
#define ZOOKEEPER_E(s, fn) IN(s, fn, "DLOCK_WITH_ZOOKEEPER")
#else
#define ZOOKEEPER_E(s, fn) OUT(s, "DLOCK_WITH_ZOOKEEPER")
#endif
#ifdef DLOCK_WITH_POSTGRES
#define POSTGRES_E(s, fn) IN(s, fn, "DLOCK_WITH_POSTGRES")
#else
#define POSTGRES_E(s, fn) OUT(s, "DLOCK_WITH_POSTGRES")
#endif
#ifdef DLOCK_WITH_MYSQL
#define MYSQL_E(s, fn) IN(s, fn, "DLOCK_WITH_MYSQL")
#else
#define MYSQL_E(s, fn) OUT(s, "DLOCK_WITH_MYSQL")
#endif
#ifdef DLOCK_WITH_MEMCACHED
#define MEMCACHED_E(s, fn) IN(s, fn, "DLOCK_WITH_MEMCACHED")
#else
#define MEMCACHED_E(s, fn) OUT(s, "DLOCK_WITH_MEMCACHED")
#endif
#endif

static const scheme_entry schemes[] = {
	DLOCK_SCHEMES_SQLITE(SQLITE_E)
	DLOCK_SCHEMES_REDIS(REDIS_E)
	DLOCK_SCHEMES_ETCD(ETCD_E)
	DLOCK_SCHEMES_ZOOKEEPER(ZOOKEEPER_E)
	DLOCK_SCHEMES_POSTGRES(POSTGRES_E)
	DLOCK_SCHEMES_MYSQL(MYSQL_E)
	DLOCK_SCHEMES_MEMCACHED(MEMCACHED_E)
};

/* Stores registered by the application or by a module (dlock_backend_register):
 * a list that only grows and whose entries never change, so a found entry
 * stays valid without the mutex. */
typedef struct registered {
	struct registered *next;
	dlock_backend_open_fn open;
	char name[32];
} registered;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static registered *regs;
/* Held while a module loads (its init registers, taking reg_mu), so that two
 * threads' first uses of a scheme load its module once. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static const scheme_entry *builtin(const char *scheme)
{
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strcmp(schemes[i].scheme, scheme) == 0)
			return &schemes[i];
	return NULL;
}

static dlock_backend_open_fn registered_open(const char *scheme)
{
	dlock_backend_open_fn fn = NULL;
	pthread_mutex_lock(&reg_mu);
	for (registered *r = regs; r && !fn; r = r->next)
		if (strcmp(r->name, scheme) == 0)
			fn = r->open;
	pthread_mutex_unlock(&reg_mu);
	return fn;
}

/* Where store-<kind>.so is: $DLOCK_MODULE_DIR (ignored in a set-user-ID
 * program), else the folder dlock/ beside the libdlock that runs (a build
 * tree and every install prefix find their own), else the one this library
 * was built for. */
static int module_path(char *buf, size_t size, const char *kind)
{
	const char *dir = secure_getenv("DLOCK_MODULE_DIR");
	int n = -1;
	Dl_info info;
	if (dir && *dir) {
		n = snprintf(buf, size, "%s/store-%s.so", dir, kind);
	} else if (dladdr((void *)&dlock__scheme_open, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
		const char *slash = strrchr(info.dli_fname, '/');
		n = snprintf(buf, size, "%.*s/dlock/store-%s.so", (int)(slash - info.dli_fname), info.dli_fname,
			     kind);
	} else {
#ifdef DLOCK_MODULE_INSTALLED_DIR
		n = snprintf(buf, size, "%s/store-%s.so", DLOCK_MODULE_INSTALLED_DIR, kind);
#endif
	}
	return n > 0 && (size_t)n < size ? 0 : -1;
}

/* Load e's module (under load_mu); 0, or DLOCK_ENOTSUPPORTED saying why. */
static int module_load(const scheme_entry *e)
{
	char path[4096];
	if (module_path(path, sizeof(path), e->module) != 0)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "cannot tell where the %s store's module is (set DLOCK_MODULE_DIR)", e->module);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *why = dlerror();
		if (!e->built)
			return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
					       "this dlock was built without the %s store (%s=OFF: its client "
					       "library was not found at build time)", e->module, e->build_option);
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "the %s store is not installed: it is a module of its own, and %s "
				       "(install the package that has store-%s.so, e.g. dlock-store-%s)",
				       e->module, why ? why : path, e->module, e->module);
	}
	int (*init)(void) = (int (*)(void))dlsym(h, "dlock_store_module_init");
	if (!init)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "%s is not a dlock store module (no dlock_store_module_init)", path);
	/* The handle is kept: a loaded store may have threads and open handles
	 * until the program ends. A scheme the application registered first
	 * stays its own: the module's registration of it fails, harmlessly. */
	(void)init();
	return 0;
}

int dlock__scheme_open(const char *scheme, dlock_backend_open_fn *out)
{
	*out = NULL;
	const scheme_entry *e = builtin(scheme);
	if (e && e->open) {
		*out = e->open;
		return 0;
	}
	if ((*out = registered_open(scheme)) != NULL)
		return 0;
	if (!e)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "unknown store scheme '%s:' (known: sqlite, redis, rediss, redis+sentinel, "
				       "redis+cluster, redlock, etcd, etcds, zk, postgres, mysql, mariadb, "
				       "memcached, and any registered with dlock_backend_register)", scheme);
	if (!e->module)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, scheme, NULL,
				       "this dlock was built without the %s store (%s=OFF: its client "
				       "library was not found at build time)", scheme, e->build_option);
	pthread_mutex_lock(&load_mu);
	int rc = 0;
	if ((*out = registered_open(scheme)) == NULL && (rc = module_load(e)) == 0 &&
	    (*out = registered_open(scheme)) == NULL)
		rc = dlock_error_set(DLOCK_ENOTSUPPORTED, scheme, NULL,
				     "the %s store's module was loaded but did not register '%s:'", e->module, scheme);
	pthread_mutex_unlock(&load_mu);
	return rc;
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
	const scheme_entry *e = builtin(scheme);
	if (e && e->open)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "dlock_backend_register: '%s' is a scheme of libdlock's own", scheme);
	pthread_mutex_lock(&reg_mu);
	registered *r;
	for (r = regs; r; r = r->next)
		if (strcmp(r->name, scheme) == 0)
			break;
	if (r) {
		dlock_backend_open_fn had = r->open;
		pthread_mutex_unlock(&reg_mu);
		return had == open ? 0
				   : dlock_error_set(DLOCK_EINVAL, NULL, NULL,
						     "dlock_backend_register: '%s' is registered already", scheme);
	}
	if ((r = calloc(1, sizeof(*r))) != NULL) {
		memcpy(r->name, scheme, n + 1);
		r->open = open;
		r->next = regs;
		regs = r;
	}
	pthread_mutex_unlock(&reg_mu);
	return r ? 0 : dlock_sys_oom();
}
