/*
 * memstore.c — a lock store built outside libdlock, as a newcomer would
 * write one (docs/api.md, "Writing a store"). It keeps its locks in this
 * process's memory: useful only to show the contract, and as the example the
 * test suite builds against the public headers alone.
 *
 *   mem://NAME     every handle opened with the same NAME shares one table
 *
 * What it implements: exclusive locks (permits 1), leases, fences, owner-only
 * release, renewal, status and list. Shared mode and semaphores answer
 * DLOCK_ENOTSUPPORTED. Nothing here blocks, so no call can overrun the
 * deadline the core hands it.
 */
#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOCKS 64

typedef struct entry {
	char name[DLOCK_NAME_MAX + 1];
	char owner[64];       /* "" when free */
	uint64_t fence;       /* last fence granted for the name */
	int64_t expires;      /* CLOCK_MONOTONIC ms */
	int64_t ttl_ms;
} entry;

/* One table for the whole process: handles of mem:// share it. */
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static entry table[MAX_LOCKS];

typedef struct mem_store {
	dlock_backend base; /* first: the core sees this */
} mem_store;

/* The entry of `name` (under table_mu), made when `create`; NULL when full or absent. */
static entry *find(const char *name, int create)
{
	entry *empty = NULL;
	for (int i = 0; i < MAX_LOCKS; i++) {
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
		if (!empty && !table[i].name[0])
			empty = &table[i];
	}
	if (create && empty)
		snprintf(empty->name, sizeof(empty->name), "%s", name);
	return create ? empty : NULL;
}

static int live(const entry *e, int64_t now)
{
	return e->owner[0] && e->expires > now;
}

static int mem_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	(void)be;
	if (req->mode != DLOCK_EXCLUSIVE || req->permits != 1)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, "mem", NULL, "mem: exclusive mutexes only");
	int64_t now = dlock_clock_ms();
	int rc = 0;
	pthread_mutex_lock(&table_mu);
	entry *e = find(req->name, 1);
	if (!e) {
		rc = dlock_error_set(DLOCK_ESTORE, "mem", NULL, "mem: the table is full");
	} else if (live(e, now) && strcmp(e->owner, req->owner) != 0) {
		out->retry_ms = e->expires - now;
		rc = DLOCK_ELOCKED; /* the core words the message */
	} else {
		if (!live(e, now) || strcmp(e->owner, req->owner) != 0) { /* a new grant, not a retried one */
			snprintf(e->owner, sizeof(e->owner), "%s", req->owner);
			e->fence++;
		}
		e->ttl_ms = req->ttl_ms;
		e->expires = now + req->ttl_ms;
		out->fence = e->fence;
	}
	pthread_mutex_unlock(&table_mu);
	return rc;
}

static int mem_release(dlock_backend *be, const dlock_request *req)
{
	(void)be;
	int rc = DLOCK_ENOTHELD; /* an owner that holds nothing changes nothing */
	pthread_mutex_lock(&table_mu);
	entry *e = find(req->name, 0);
	if (e && live(e, dlock_clock_ms()) && strcmp(e->owner, req->owner) == 0) {
		e->owner[0] = '\0';
		rc = 0;
	}
	pthread_mutex_unlock(&table_mu);
	return rc;
}

static int mem_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	(void)be;
	int64_t now = dlock_clock_ms();
	pthread_mutex_lock(&table_mu);
	for (size_t i = 0; i < n; i++) {
		entry *e = find(reqs[i]->name, 0);
		if (e && live(e, now) && strcmp(e->owner, reqs[i]->owner) == 0) {
			e->ttl_ms = reqs[i]->ttl_ms;
			e->expires = now + reqs[i]->ttl_ms;
			results[i] = 0;
		} else {
			results[i] = DLOCK_ENOTHELD;
		}
	}
	pthread_mutex_unlock(&table_mu);
	return 0;
}

static char *copy(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = malloc(n);
	return p ? memcpy(p, s, n) : NULL;
}

static int mem_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		      size_t *count)
{
	(void)be;
	dlock_lock_status *st = calloc(nnames, sizeof(*st));
	if (!st)
		return DLOCK_ENOMEM;
	int rc = 0;
	int64_t now = dlock_clock_ms();
	pthread_mutex_lock(&table_mu);
	for (size_t i = 0; i < nnames && !rc; i++) {
		entry *e = find(names[i], 0);
		st[i].permits = 1;
		if (!(st[i].name = copy(names[i])))
			rc = DLOCK_ENOMEM;
		if (!rc && e) {
			st[i].last_fence = e->fence;
			if (live(e, now)) {
				dlock_holder *h = calloc(1, sizeof(*h));
				if (!h || !(h->owner = copy(e->owner)) || !(h->host = copy(""))) {
					rc = DLOCK_ENOMEM; /* dlock_status_free frees what is there */
				}
				if (h) {
					h->mode = DLOCK_EXCLUSIVE;
					h->fence = e->fence;
					h->ttl_left_ms = e->expires - now;
					st[i].holders = h;
					st[i].nholders = 1;
				}
			}
		}
	}
	pthread_mutex_unlock(&table_mu);
	*out = st;
	*count = nnames;
	return rc;
}

static int mem_list(dlock_backend *be, char ***names, size_t *n)
{
	(void)be;
	*names = calloc(MAX_LOCKS, sizeof(char *));
	*n = 0;
	if (!*names)
		return DLOCK_ENOMEM;
	int rc = 0;
	int64_t now = dlock_clock_ms();
	pthread_mutex_lock(&table_mu);
	for (int i = 0; i < MAX_LOCKS && !rc; i++) {
		if (!live(&table[i], now))
			continue;
		if (!((*names)[*n] = copy(table[i].name)))
			rc = DLOCK_ENOMEM;
		else
			(*n)++;
	}
	pthread_mutex_unlock(&table_mu);
	return rc;
}

static void mem_close(dlock_backend *be)
{
	free(be);
}

static const dlock_backend_methods mem_methods = {
	DLOCK_BACKEND_METHODS_INIT("mem"),
	.acquire = mem_acquire,
	.release = mem_release,
	.renew = mem_renew,
	.status = mem_status,
	.list = mem_list,
	.close = mem_close,
};

static int mem_open(dlock_backend **out, dlock_uri *uri)
{
	(void)uri; /* no options of its own: the core refuses unknown ones */
	mem_store *m = calloc(1, sizeof(*m));
	if (!m)
		return DLOCK_ENOMEM;
	int rc = dlock_backend_init(&m->base, &mem_methods);
	if (rc) {
		free(m);
		return rc;
	}
	*out = &m->base;
	return 0;
}

#ifdef MEMSTORE_MODULE
/* ---- as a module (store-mem.so): `conformance --load store-mem.so mem://x`
 * runs the store suite on it, which loads it and calls this, as libdlock
 * does with its own store modules ---- */
int dlock_store_module_init(void) /* declared in <dlock/sys/backend.h> */
{
	return dlock_backend_register("mem", mem_open);
}
#else
/* ---- a program using it through the public API ---- */

#define TRY(expr, want)                                                                            \
	do {                                                                                       \
		int rc_ = (expr);                                                                  \
		if (rc_ != (want)) {                                                               \
			fprintf(stderr, "%s:%d: %s returned %d, wanted %d: %s\n", __FILE__, __LINE__, \
				#expr, rc_, (want), dlock_error_last()->message);                  \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

int main(void)
{
	TRY(dlock_backend_register("mem", mem_open), 0);
	dlock_store *s1, *s2;
	TRY(dlock_store_open(&s1, "mem://demo?ttl=2s"), 0);
	TRY(dlock_store_open(&s2, "mem://demo"), 0);
	dlock_lock *a, *b;
	TRY(dlock_lock_new(&a, s1, "job", NULL), 0);
	TRY(dlock_lock_new(&b, s2, "job", NULL), 0);
	TRY(dlock_acquire(a, 0), 0);
	uint64_t fence = dlock_fence(a);
	TRY(dlock_acquire(b, 0), DLOCK_ELOCKED);       /* another owner: refused */
	TRY(dlock_acquire(b, 100), DLOCK_ETIMEOUT);    /* a wait that runs out */
	TRY(dlock_extend(a, 5000), 0);
	dlock_lock_status *st;
	size_t n;
	TRY(dlock_store_status(s2, NULL, 0, &st, &n), 0); /* list, then status */
	int listed = n == 1 && st[0].nholders == 1 && st[0].holders[0].fence == fence;
	dlock_status_free(st, n);
	if (!listed) {
		fprintf(stderr, "status did not list the held lock\n");
		return 1;
	}
	TRY(dlock_release(a), 0);
	TRY(dlock_acquire(b, 1000), 0);
	if (dlock_fence(b) <= fence) {
		fprintf(stderr, "fence did not grow\n");
		return 1;
	}
	TRY(dlock_release(b), 0);
	printf("memstore: fences %llu then %llu; exclusion, waits, extend, status and list work\n",
	       (unsigned long long)fence, (unsigned long long)dlock_fence(b));
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s1);
	dlock_store_close(s2);
	return 0;
}
#endif
