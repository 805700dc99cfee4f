/*
 * board.c — the wake-up board of a store handle (dlock/sys/backend.h,
 * "Wake-ups"). A waiter arms before each try (reading the generation of its
 * name's bucket and of the whole board) and, refused, sleeps until either
 * moves or its back-off ends. Stores bump one name from their notification
 * channel, one waiter by its owner (a fair queue's new head), or all when
 * the channel was down. Names and owners share buckets: a bump may wake a
 * waiter it did not mean, which then only tries once more.
 */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 256

struct dlock__board {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t all;            /* bumped by wake_all */
	uint64_t gen[NBUCKETS];  /* bumped by wake(name) */
	uint64_t ogen[NBUCKETS]; /* bumped by wake_owner(owner) */
	dlock_store *store;      /* for dlock_backend_renew_now */
};

static unsigned bucket(const char *key)
{
	return key ? (unsigned)(dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, key, strlen(key)) % NBUCKETS) : 0;
}

int dlock__board_new(dlock__board **out)
{
	dlock__board *b = dlock_sys_calloc(1, sizeof(*b));
	if (!b)
		return DLOCK_ENOMEM;
	pthread_mutex_init(&b->mu, NULL);
	dlock_sys_cond_init_monotonic(&b->cv);
	*out = b;
	return 0;
}

void dlock__board_free(dlock__board *b)
{
	if (!b)
		return;
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* Every counter only grows: their sum moves when any of them does. */
static uint64_t generation(const dlock__board *b, unsigned i, unsigned o)
{
	return b->gen[i] + b->ogen[o] + b->all;
}

uint64_t dlock__board_arm(dlock__board *b, const char *name, const char *owner)
{
	unsigned i = bucket(name), o = bucket(owner);
	pthread_mutex_lock(&b->mu);
	uint64_t g = generation(b, i, o);
	pthread_mutex_unlock(&b->mu);
	return g;
}

bool dlock__board_wait(dlock__board *b, const char *name, const char *owner, uint64_t armed, int64_t ms)
{
	unsigned i = bucket(name), o = bucket(owner);
	int64_t end = dlock_clock_ms() + (ms > 0 ? ms : 0);
	pthread_mutex_lock(&b->mu);
	bool moved;
	while (!(moved = generation(b, i, o) != armed)) {
		int64_t left = end - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock_sys_abstime(&ts, left);
		pthread_cond_timedwait(&b->cv, &b->mu, &ts);
	}
	pthread_mutex_unlock(&b->mu);
	return moved;
}

static dlock__board *board_of(dlock_backend *be)
{
	return be ? __atomic_load_n((dlock__board **)&be->core, __ATOMIC_ACQUIRE) : NULL;
}

void dlock__board_attach(dlock_backend *be, dlock__board *b)
{
	__atomic_store_n((dlock__board **)&be->core, b, __ATOMIC_RELEASE);
}

void dlock_backend_wake(dlock_backend *be, const char *name)
{
	dlock__board *b = board_of(be);
	if (!b || !name)
		return;
	unsigned i = bucket(name);
	pthread_mutex_lock(&b->mu);
	b->gen[i]++;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

void dlock_backend_wake_owner(dlock_backend *be, const char *owner)
{
	dlock__board *b = board_of(be);
	if (!b || !owner)
		return;
	unsigned o = bucket(owner);
	pthread_mutex_lock(&b->mu);
	b->ogen[o]++;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

void dlock__board_set_store(dlock__board *b, dlock_store *s)
{
	__atomic_store_n(&b->store, s, __ATOMIC_RELEASE);
}

void dlock_backend_renew_now(dlock_backend *be)
{
	dlock__board *b = board_of(be);
	dlock_store *s = b ? __atomic_load_n(&b->store, __ATOMIC_ACQUIRE) : NULL;
	if (s)
		dlock__renewer_renew_now(s);
}

void dlock_backend_wake_all(dlock_backend *be)
{
	dlock__board *b = board_of(be);
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	b->all++;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

size_t dlock__methods_size(unsigned int version)
{
	/* Each later version appends fields: its entry here is the offset of its
	 * first new field, and the table of an older store is read only that far. */
	(void)version;
	return sizeof(dlock_backend_methods);
}

int dlock__methods_check(const dlock_backend_methods *m)
{
	if (!m)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "backend without methods (see dlock_backend_init)");
	if (m->version < DLOCK_BACKEND_VERSION_MIN || m->version > DLOCK_BACKEND_VERSION)
		return dlock_error_set(DLOCK_EINVAL, m->kind, NULL,
				       "backend methods of version %u: this libdlock takes versions %d to %d%s",
				       m->version, DLOCK_BACKEND_VERSION_MIN, DLOCK_BACKEND_VERSION,
				       m->version > DLOCK_BACKEND_VERSION ? " (the store needs a newer libdlock)"
									  : " (rebuild the store against this one)");
	if (!m->kind || !m->acquire || !m->release || !m->renew || !m->close || (!m->watch != !m->unwatch))
		return dlock_error_set(DLOCK_EINVAL, m->kind, NULL,
				       "backend methods lack kind, acquire, release, renew or close "
				       "(or have only one of watch and unwatch)");
	return 0;
}

int dlock_backend_init(dlock_backend *be, const dlock_backend_methods *m)
{
	if (!be || !m)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_backend_init: NULL argument");
	memset(be, 0, sizeof(*be));
	int rc = dlock__methods_check(m);
	if (rc == 0)
		be->methods = m;
	return rc;
}
