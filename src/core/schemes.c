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
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct scheme_entry {
	const char *scheme;
	dlock_backend_open_fn open; /* NULL: not in this library */
	const char *build_option;   /* "DLOCK_WITH_REDIS" */
	const char *module;         /* "redis": served by store-redis.so; NULL: not a module */
	bool built;                 /* the build this library belongs to compiled the store */
	const char *needs;          /* its client library, for the messages */
} scheme_entry;

#define IN(s, fn, opt, needs) {s, fn, opt, NULL, true, needs},
#define MODULE(s, opt, kind, on, needs) {s, NULL, opt, kind, on, needs},
#define OUT(s, opt, needs) {s, NULL, opt, NULL, false, needs},

#ifdef DLOCK_WITH_SQLITE
#define SQLITE_E(s, fn) IN(s, fn, "DLOCK_WITH_SQLITE", "sqlite3")
#else
#define SQLITE_E(s, fn) OUT(s, "DLOCK_WITH_SQLITE", "sqlite3")
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
#define REDIS_E(s, fn) MODULE(s, "DLOCK_WITH_REDIS", "redis", REDIS_ON, "hiredis with OpenSSL")
#define ETCD_E(s, fn) MODULE(s, "DLOCK_WITH_ETCD", "etcd", ETCD_ON, "libcurl with json-c")
#define ZOOKEEPER_E(s, fn) MODULE(s, "DLOCK_WITH_ZOOKEEPER", "zookeeper", ZOOKEEPER_ON, "libzookeeper-mt")
#define POSTGRES_E(s, fn) MODULE(s, "DLOCK_WITH_POSTGRES", "postgres", POSTGRES_ON, "libpq")
#define MYSQL_E(s, fn) MODULE(s, "DLOCK_WITH_MYSQL", "mysql", MYSQL_ON, "libmariadb")
#define MEMCACHED_E(s, fn) MODULE(s, "DLOCK_WITH_MEMCACHED", "memcached", MEMCACHED_ON, "libmemcached")
#else
#ifdef DLOCK_WITH_REDIS
#define REDIS_E(s, fn) IN(s, fn, "DLOCK_WITH_REDIS", "hiredis with OpenSSL")
#else
#define REDIS_E(s, fn) OUT(s, "DLOCK_WITH_REDIS", "hiredis with OpenSSL")
#endif
#ifdef DLOCK_WITH_ETCD
#define ETCD_E(s, fn) IN(s, fn, "DLOCK_WITH_ETCD", "libcurl with json-c")
#else
#define ETCD_E(s, fn) OUT(s, "DLOCK_WITH_ETCD", "libcurl with json-c")
#endif
#ifdef DLOCK_WITH_ZOOKEEPER
#define ZOOKEEPER_E(s, fn) IN(s, fn, "DLOCK_WITH_ZOOKEEPER", "libzookeeper-mt")
#else
#define ZOOKEEPER_E(s, fn) OUT(s, "DLOCK_WITH_ZOOKEEPER", "libzookeeper-mt")
#endif
#ifdef DLOCK_WITH_POSTGRES
#define POSTGRES_E(s, fn) IN(s, fn, "DLOCK_WITH_POSTGRES", "libpq")
#else
#define POSTGRES_E(s, fn) OUT(s, "DLOCK_WITH_POSTGRES", "libpq")
#endif
#ifdef DLOCK_WITH_MYSQL
#define MYSQL_E(s, fn) IN(s, fn, "DLOCK_WITH_MYSQL", "libmariadb")
#else
#define MYSQL_E(s, fn) OUT(s, "DLOCK_WITH_MYSQL", "libmariadb")
#endif
#ifdef DLOCK_WITH_MEMCACHED
#define MEMCACHED_E(s, fn) IN(s, fn, "DLOCK_WITH_MEMCACHED", "libmemcached")
#else
#define MEMCACHED_E(s, fn) OUT(s, "DLOCK_WITH_MEMCACHED", "libmemcached")
#endif
#endif

/* clang-format off */
static const scheme_entry schemes[] = {
	DLOCK_SCHEMES_SQLITE(SQLITE_E)
	DLOCK_SCHEMES_REDIS(REDIS_E)
	DLOCK_SCHEMES_ETCD(ETCD_E)
	DLOCK_SCHEMES_ZOOKEEPER(ZOOKEEPER_E)
	DLOCK_SCHEMES_POSTGRES(POSTGRES_E)
	DLOCK_SCHEMES_MYSQL(MYSQL_E)
	DLOCK_SCHEMES_MEMCACHED(MEMCACHED_E)
};
/* clang-format on */

/* Stores registered by the application or by a module (dlock_backend_register):
 * a list that only grows and whose entries never change once published, so
 * it is read without a lock (an opener never waits for a writer, and a child
 * forked during a write still reads it); reg_mu orders the writers. */
typedef struct registered {
	struct registered *next;
	dlock_backend_open_fn open;
	char name[32];
} registered;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(registered *) regs;

static const scheme_entry *builtin(const char *scheme)
{
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strcmp(schemes[i].scheme, scheme) == 0)
			return &schemes[i];
	return NULL;
}

static dlock_backend_open_fn registered_open(const char *scheme)
{
	for (registered *r = atomic_load_explicit(&regs, memory_order_acquire); r; r = r->next)
		if (strcmp(r->name, scheme) == 0)
			return r->open;
	return NULL;
}

#ifndef DLOCK_STORES_BUILTIN
/* Held while a module loads (dlopen, then its init registers, taking
 * reg_mu): two threads' first uses of a scheme load its module once. Taken
 * by an open with no mutex of the core held (internal.h, mutex order). */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
/* The kind whose module this thread is loading: its init may register the
 * schemes of libdlock's own that the module serves (no one else may). */
static _Thread_local const char *loading;

/* Where store-<kind>.so is: $DLOCK_MODULE_DIR (ignored in a set-user-ID
 * program) first, else the folder dlock/ beside the libdlock that runs (a
 * build tree and every install prefix find their own), else the one this
 * library was built for. */
static int module_path(char *buf, size_t size, const char *kind)
{
	const char *dir = secure_getenv("DLOCK_MODULE_DIR");
	int n = -1;
	Dl_info info;
	char *lib = NULL;
	if (dir && *dir)
		n = snprintf(buf, size, "%s/store-%s.so", dir, kind);
	else if (dladdr((void *)&dlock__scheme_open, &info) && info.dli_fname &&
		 (lib = realpath(info.dli_fname, NULL)) != NULL && strrchr(lib, '/'))
		n = snprintf(buf, size, "%.*s/dlock/store-%s.so", (int)(strrchr(lib, '/') - lib), lib, kind);
#ifdef DLOCK_MODULE_INSTALLED_DIR
	else
		n = snprintf(buf, size, "%s/store-%s.so", DLOCK_MODULE_INSTALLED_DIR, kind);
#endif
	free(lib);
	return n > 0 && (size_t)n < size ? 0 : -1;
}

/* Load e's module (under load_mu); 0, or DLOCK_ENOTSUPPORTED saying why. */
static int module_load(const scheme_entry *e)
{
	char path[4096];
	if (module_path(path, sizeof(path), e->module) != 0)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "cannot tell where the %s store's module is (set DLOCK_MODULE_DIR)", e->module);
	if (access(path, F_OK) != 0)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "the %s store is not installed: it is a module of its own, %s, which is "
				       "missing (install the package dlock-store-%s, or build dlock where %s is found)",
				       e->module, path, e->module, e->needs);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *why = dlerror();
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL,
				       "the %s store's module cannot be loaded: %s (it needs %s installed)", e->module,
				       why ? why : path, e->needs);
	}
	dlock_store_module_init_fn init = (dlock_store_module_init_fn)dlsym(h, DLOCK_STORE_MODULE_INIT);
	if (!init) {
		dlclose(h);
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL, "%s is not a dlock store module (no %s)",
				       path, DLOCK_STORE_MODULE_INIT);
	}
	/* The handle is kept: a loaded store may have threads and open handles
	 * until the program ends. */
	loading = e->module;
	int rc = init();
	loading = NULL;
	if (rc != 0)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, e->scheme, NULL, "the %s store's module %s: %s", e->module,
				       path, dlock_error_last()->message);
	return 0;
}
#endif

/* A child forked while another thread registered a store must not inherit
 * reg_mu locked: fork waits for it (it is held only for a list update).
 * load_mu is held across dlopen, which may wait for fork's own lock (a
 * library's constructor registering fork handlers): fork does not wait for
 * it, and the child, whose only thread was not loading, starts with it free
 * (a module the parent was still loading is loaded again there). */
static void fork_prepare(void)
{
	pthread_mutex_lock(&reg_mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&reg_mu);
}

static void fork_child(void)
{
	pthread_mutex_init(&reg_mu, NULL);
#ifndef DLOCK_STORES_BUILTIN
	pthread_mutex_init(&load_mu, NULL);
#endif
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_handlers(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
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
				       "redis+cluster, rediss+cluster, redlock, etcd, etcds, zk, postgres, "
				       "postgresql, mysql, mariadb, memcached, and any registered with "
				       "dlock_backend_register)",
				       scheme);
	/* every entry a built-in table leaves without an open function is here */
	if (!e->module || !e->built)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, scheme, NULL,
				       "this dlock was built without the %s store (%s=OFF: %s not found at build "
				       "time)",
				       e->module ? e->module : scheme, e->build_option, e->needs);
#ifdef DLOCK_STORES_BUILTIN
	/* not reached: a built-in table has no module entries */
	return dlock_error_set(DLOCK_ENOTSUPPORTED, scheme, NULL, "no %s store in this build", scheme);
#else
	pthread_once(&fork_once, fork_handlers);
	pthread_mutex_lock(&load_mu);
	int rc = 0;
	if ((*out = registered_open(scheme)) == NULL && (rc = module_load(e)) == 0 &&
	    (*out = registered_open(scheme)) == NULL)
		rc = dlock_error_set(DLOCK_ENOTSUPPORTED, scheme, NULL,
				     "the %s store's module was loaded but did not register '%s:'", e->module, scheme);
	pthread_mutex_unlock(&load_mu);
	return rc;
#endif
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
					       "letters, digits, '+', '-' and '.'",
					       scheme);
	}
	/* libdlock's own schemes are its own in every build: built in, or
	 * registered by their module's init while it loads (and by no one else). */
	const scheme_entry *e = builtin(scheme);
#ifdef DLOCK_STORES_BUILTIN
	bool own_module = false;
#else
	bool own_module = e && e->module && loading && strcmp(loading, e->module) == 0;
#endif
	pthread_once(&fork_once, fork_handlers);
	if (e && !own_module)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "dlock_backend_register: '%s' is a scheme of libdlock's own", scheme);
	pthread_mutex_lock(&reg_mu);
	registered *r;
	for (r = atomic_load_explicit(&regs, memory_order_relaxed); r; r = r->next)
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
		r->next = atomic_load_explicit(&regs, memory_order_relaxed);
		atomic_store_explicit(&regs, r, memory_order_release);
	}
	pthread_mutex_unlock(&reg_mu);
	return r ? 0 : dlock_sys_oom();
}
