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
	return dlock_error_set(DLOCK_EINVAL, s->mt.kind, NULL,
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

/* Whether be's head points at a table this core takes (dlock_backend_init
 * checks the same; a backend handed in may not have used it). A backend
 * refused is closed when it has a close method. */
static int check_methods(dlock_backend *be)
{
	const dlock_backend_methods *m = be->methods;
	int rc = dlock__methods_check(m);
	if (rc != 0 && m && m->close)
		m->close(be);
	return rc;
}

static int store_init(dlock_store **out, dlock_backend *be, const char *display_uri, int64_t default_ttl_ms,
		      int64_t request_timeout_ms, const char *open_text)
{
	dlock_store *s = dlock_sys_calloc(1, sizeof(*s));
	if (!s) {
		be->methods->close(be);
		return DLOCK_ENOMEM;
	}
	s->be = be;
	memcpy(&s->mt, be->methods, dlock__methods_size(be->methods->version));
	s->uri = dlock__uri_redact(display_uri ? display_uri : s->mt.kind);
	if (open_text && (s->mt.flags & DLOCK_BACKEND_F_RENEW_APART))
		s->open_text = dlock_sys_strdup(open_text);
	if (!s->uri || (open_text && (s->mt.flags & DLOCK_BACKEND_F_RENEW_APART) && !s->open_text) ||
	    dlock__board_new(&s->board) != 0) {
		s->mt.close(be);
		free(s->uri);
		free(s->open_text);
		free(s);
		return DLOCK_ENOMEM;
	}
	dlock__board_attach(be, s->board);
	dlock__board_set_store(s->board, s);
	s->default_ttl_ms = default_ttl_ms > 0 ? default_ttl_ms : DLOCK__DEFAULT_TTL_MS;
	s->request_timeout_ms = request_timeout_ms > 0 ? request_timeout_ms : DLOCK__DEFAULT_REQUEST_TIMEOUT_MS;
	unsigned char id[16];
	dlock_random(id, sizeof(id));
	dlock_sys_hex(s->client_id, id, sizeof(id));
	if (gethostname(s->host, sizeof(s->host) - 1) != 0)
		strcpy(s->host, "unknown");
	s->opener_pid = dlock__pid(); /* registers the fork handler first */
	s->fork_gen = dlock__fork_gen();
	pthread_mutex_init(&s->be_mu, NULL);
	pthread_mutex_init(&s->rbe_mu, NULL);
	pthread_mutex_init(&s->reg_mu, NULL);
	dlock_sys_cond_init_monotonic(&s->reg_cv);
	pthread_cond_init(&s->cb_cv, NULL);
	*out = s;
	return 0;
}

int dlock_store_open_backend(dlock_store **out, dlock_backend *be, const char *display_uri, int64_t default_ttl_ms)
{
	if (!out || !be)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_open_backend: NULL argument");
	*out = NULL;
	int rc = check_methods(be);
	return rc ? rc : store_init(out, be, display_uri, default_ttl_ms, 0, NULL);
}

int dlock__backend_open(const char *text, int64_t timeout_ms, dlock_backend **out, int64_t *ttl_ms,
			int64_t *request_timeout_ms)
{
	*out = NULL;
	dlock_uri *uri;
	int rc = dlock_sys_uri_parse(&uri, text);
	if (rc)
		return rc;
	dlock_backend_open_fn open_fn;
	rc = dlock__scheme_open(uri->scheme, &open_fn);
	if (rc == 0) {
		dlock_backend *be = NULL;
		if (timeout_ms > 0 && timeout_ms < uri->connect_timeout_ms)
			uri->connect_timeout_ms = timeout_ms;
		char stale[8];
		dlock__open_warning_take(stale, sizeof(stale)); /* not this open's */
		rc = open_fn(&be, uri);
		if (rc == 0 && (rc = check_methods(be)) != 0)
			be = NULL;
		if (rc == 0 && (rc = dlock_sys_uri_check_unused(uri)) != 0)
			be->methods->close(be);
		else if (rc == 0)
			*out = be;
		if (ttl_ms)
			*ttl_ms = uri->ttl_ms;
		if (request_timeout_ms)
			*request_timeout_ms = uri->request_timeout_ms;
	}
	dlock_sys_uri_free(uri);
	return rc;
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
	dlock_backend *be = NULL;
	int64_t ttl = 0, req_timeout = 0;
	int rc = dlock__backend_open(text, timeout_ms, &be, &ttl, &req_timeout);
	char warning[sizeof((*out)->warning)];
	dlock__open_warning_take(warning, sizeof(warning));
	if (rc == 0)
		rc = store_init(out, be, text, ttl, req_timeout, text);
	if (rc == 0)
		memcpy((*out)->warning, warning, sizeof(warning));
	free(dflt);
	return rc;
}

static void free_text(char *t)
{
	if (t) {
		memset(t, 0, strlen(t)); /* it may hold a password */
		free(t);
	}
}

void dlock_store_close(dlock_store *s)
{
	if (!s)
		return;
	if (dlock__forked(s)) {
		/* The parent's: no thread of it to stop here, and no word to its
		 * server (a close would end the parent's session). Only memory. */
		/* A call in progress at the fork (its mutex taken by a thread that
		 * is not here) may have left a backend half changed: keep it whole. */
		if (s->mt.forget && pthread_mutex_trylock(&s->be_mu) == 0)
			s->mt.forget(s->be);
		else
			dlock__forget(s->be);
		if (s->rbe && s->mt.forget && pthread_mutex_trylock(&s->rbe_mu) == 0)
			s->mt.forget(s->rbe);
		else if (s->rbe)
			dlock__forget(s->rbe);
		dlock__forget(s->board); /* its mutex may have been held at the fork */
		if (dlock__renewer_forget(s)) {
			free(s->uri);
			free_text(s->open_text);
			free(s);
		} else {
			dlock__forget(s);
		}
		return;
	}
	dlock__renewer_join_opener(s, dlock__renewer_stop(s));
	pthread_mutex_lock(&s->be_mu);
	s->closed = true; /* an on_lost still running may free its lock: no I/O then */
	pthread_mutex_unlock(&s->be_mu);
	if (s->rbe)
		s->mt.close(s->rbe);
	s->mt.close(s->be);
	dlock__board_free(s->board);
	dlock__renewer_release_store(s);
}

void dlock__store_free_mem(dlock_store *s)
{
	pthread_mutex_destroy(&s->be_mu);
	pthread_mutex_destroy(&s->rbe_mu);
	pthread_mutex_destroy(&s->reg_mu);
	pthread_cond_destroy(&s->reg_cv);
	pthread_cond_destroy(&s->cb_cv);
	free(s->uri);
	free_text(s->open_text);
	free(s);
}

const char *dlock_store_kind(const dlock_store *s)
{
	return s ? s->mt.kind : "";
}

const char *dlock_store_uri(const dlock_store *s)
{
	return s ? s->uri : "";
}

int dlock_store_session_bound(const dlock_store *s)
{
	return s && (s->mt.flags & DLOCK_BACKEND_F_SESSION) ? 1 : 0;
}

const char *dlock_store_warning(const dlock_store *s)
{
	return s && s->warning[0] ? s->warning : NULL;
}

const char *dlock_store_client_id(const dlock_store *s)
{
	return s ? s->client_id : "";
}

uint64_t dlock_store_requests(const dlock_store *s)
{
	return s ? atomic_load_explicit(&((dlock_store *)s)->requests, memory_order_relaxed) : 0;
}

int dlock_store_wakes_waiters(const dlock_store *s)
{
	return s && (s->mt.watch || s->mt.wait) ? 1 : 0;
}

/* "sqlite://" + an absolute path, or "sqlite:" + a relative one, escaping what a URI would misread. */
static char *sqlite_uri(const char *dir, const char *rest)
{
	char *path = dlock_sys_sprintf("%s%s", dir, rest);
	if (!path)
		return NULL;
	size_t n = strlen(path);
	char *esc = dlock_sys_calloc(3 * n + 1, 1);
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
	char *uri = dlock_sys_sprintf("sqlite:%s%s", path[0] == '/' ? "//" : "", esc);
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
