#include "core/internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * fork(): the child gets a copy of every store handle, its connections
 * (shared sockets, sessions, TLS state) and none of its threads. Using them
 * would make the child a second holder under the parent's identity, and
 * closing them politely would end the parent's session. So a handle belongs
 * to the process that opened it; in a child every call on it fails, and
 * freeing it only frees memory.
 */
static atomic_ulong fork_gen;
static atomic_int self_pid;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void forked(void)
{
	atomic_fetch_add(&fork_gen, 1);
	atomic_store(&self_pid, 0);
}

static void watch_forks(void)
{
	pthread_atfork(NULL, NULL, forked);
}

unsigned long dlock__fork_gen(void)
{
	return atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

int dlock__pid(void)
{
	pthread_once(&fork_once, watch_forks);
	int pid = atomic_load(&self_pid);
	if (!pid)
		atomic_store(&self_pid, pid = (int)getpid());
	return pid;
}

int dlock__fork_error(const dlock_store *s, const char *fn)
{
	return dlock_error_set(DLOCK_EINVAL, s->be->kind, NULL,
			       "%s: this process (pid %d) is a fork() child of the one that opened the store "
			       "(pid %d); store and lock handles do not cross fork(): open a new store in the child",
			       fn, dlock__pid(), s->opener_pid);
}

/* Memory a child cannot free: a lock-free stack, so that no mutex a thread
 * of the parent held at the fork is needed. */
typedef struct forgotten {
	struct forgotten *next;
	void *p;
} forgotten;
static _Atomic(forgotten *) forgotten_head;

void dlock__forget(void *p)
{
	forgotten *f = p ? malloc(sizeof(*f)) : NULL;
	if (!f)
		return;
	f->p = p;
	f->next = atomic_load(&forgotten_head);
	while (!atomic_compare_exchange_weak(&forgotten_head, &f->next, f))
		;
}

static int store_init(dlock_store **out, dlock_backend *be, const char *display_uri,
		      int64_t default_ttl_ms, int64_t request_timeout_ms)
{
	dlock_store *s = dlock__calloc(1, sizeof(*s));
	if (!s) {
		be->close(be);
		return DLOCK_ENOMEM;
	}
	s->be = be;
	s->uri = dlock__uri_redact(display_uri ? display_uri : be->kind);
	if (!s->uri) {
		be->close(be);
		free(s);
		return DLOCK_ENOMEM;
	}
	s->default_ttl_ms = default_ttl_ms > 0 ? default_ttl_ms : DLOCK__DEFAULT_TTL_MS;
	s->request_timeout_ms = request_timeout_ms > 0 ? request_timeout_ms : DLOCK__DEFAULT_REQUEST_TIMEOUT_MS;
	unsigned char id[16];
	dlock_random(id, sizeof(id));
	dlock__hex(s->client_id, id, sizeof(id));
	if (gethostname(s->host, sizeof(s->host) - 1) != 0)
		strcpy(s->host, "unknown");
	s->opener_pid = dlock__pid(); /* registers the fork handler first */
	s->fork_gen = dlock__fork_gen();
	pthread_mutex_init(&s->be_mu, NULL);
	pthread_mutex_init(&s->reg_mu, NULL);
	dlock__cond_init_monotonic(&s->reg_cv);
	*out = s;
	return 0;
}

int dlock_store_open_backend(dlock_store **out, dlock_backend *be, const char *display_uri,
			     int64_t default_ttl_ms)
{
	if (!out || !be)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_open_backend: NULL argument");
	*out = NULL;
	if (be->version < 1 || be->version > DLOCK_BACKEND_VERSION || !be->acquire || !be->release ||
	    !be->extend || !be->close) {
		int v = (int)be->version;
		if (be->close)
			be->close(be);
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "backend version %d or its required methods are not supported", v);
	}
	return store_init(out, be, display_uri, default_ttl_ms, 0);
}

int dlock_store_open(dlock_store **out, const char *text)
{
	return dlock_store_open_timeout(out, text, 0);
}

int dlock_store_open_timeout(dlock_store **out, const char *text, int64_t timeout_ms)
{
	if (!out)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_open: out is NULL");
	*out = NULL;
	char *dflt = NULL;
	if (!text || !*text) {
		int rc = dlock_default_uri(&dflt);
		if (rc)
			return rc;
		text = dflt;
	}
	dlock_uri *uri;
	int rc = dlock__uri_parse(&uri, text);
	if (rc) {
		free(dflt);
		return rc;
	}
	const dlock__scheme *sc = dlock__scheme_find(uri->scheme);
	if (!sc) {
		rc = dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				     "unknown store scheme '%s:' (known: sqlite, redis, rediss, redis+sentinel, "
				     "redlock, etcd, etcds, zk, postgres, mysql, mariadb, memcached)", uri->scheme);
	} else if (!sc->open) {
		rc = dlock_error_set(DLOCK_ENOTSUPPORTED, uri->scheme, NULL,
				     "this dlock was built without the %s store (%s=OFF: its client "
				     "library was not found at build time)", uri->scheme, sc->build_option);
	} else {
		dlock_backend *be = NULL;
		if (timeout_ms > 0 && timeout_ms < uri->connect_timeout_ms)
			uri->connect_timeout_ms = timeout_ms;
		rc = sc->open(&be, uri);
		if (rc == 0 && (rc = dlock__uri_check_unused(uri)) != 0)
			be->close(be);
		else if (rc == 0)
			rc = store_init(out, be, text, uri->ttl_ms, uri->request_timeout_ms);
	}
	dlock__uri_free(uri);
	free(dflt);
	return rc;
}

void dlock_store_close(dlock_store *s)
{
	if (!s)
		return;
	if (dlock__forked(s)) {
		/* The parent's: no thread of it to stop here, and no word to its
		 * server (a close would end the parent's session). Only memory. */
		dlock_backend *be = s->be;
		/* A call in progress at the fork (be_mu taken by a thread that is
		 * not here) may have left the backend half changed: keep it whole. */
		if (be->version >= 3 && be->forget && pthread_mutex_trylock(&s->be_mu) == 0)
			be->forget(be);
		else
			dlock__forget(be);
		if (dlock__renewer_forget(s)) {
			free(s->uri);
			free(s);
		} else {
			dlock__forget(s);
		}
		return;
	}
	dlock__renewer_stop(s);
	s->be->close(s->be);
	pthread_mutex_destroy(&s->be_mu);
	pthread_mutex_destroy(&s->reg_mu);
	pthread_cond_destroy(&s->reg_cv);
	free(s->uri);
	free(s);
}

const char *dlock_store_kind(const dlock_store *s)
{
	return s ? s->be->kind : "";
}

const char *dlock_store_uri(const dlock_store *s)
{
	return s ? s->uri : "";
}

int dlock_store_session_bound(const dlock_store *s)
{
	return s && (s->be->flags & DLOCK_BACKEND_F_SESSION) ? 1 : 0;
}

const char *dlock_store_client_id(const dlock_store *s)
{
	return s ? s->client_id : "";
}

/* "sqlite://" + an absolute path, or "sqlite:" + a relative one, escaping what a URI would misread. */
static char *sqlite_uri(const char *dir, const char *rest)
{
	char *path = dlock__sprintf("%s%s", dir, rest);
	if (!path)
		return NULL;
	size_t n = strlen(path);
	char *esc = dlock__calloc(3 * n + 1, 1);
	if (!esc) {
		free(path);
		return NULL;
	}
	char *o = esc;
	for (const char *c = path; *c; c++) {
		if (*c == '%' || *c == '?' || *c == '#')
			o += sprintf(o, "%%%02X", (unsigned char)*c);
		else
			*o++ = *c;
	}
	char *uri = dlock__sprintf("sqlite:%s%s", path[0] == '/' ? "//" : "", esc);
	free(path);
	free(esc);
	return uri;
}

int dlock_default_uri(char **out)
{
	const char *home = getenv("DLOCK_HOME"), *xdg = getenv("XDG_STATE_HOME");
	if (!out)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_default_uri: out is NULL");
	if (home && *home)
		*out = sqlite_uri(home, "/dlock.db");
	else if (xdg && *xdg)
		*out = sqlite_uri(xdg, "/dlock/dlock.db");
	else if ((home = getenv("HOME")) && *home)
		*out = sqlite_uri(home, "/.local/state/dlock/dlock.db");
	else
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "no default store: set DLOCK_HOME or HOME, or give a store URI");
	return *out ? 0 : DLOCK_ENOMEM;
}
