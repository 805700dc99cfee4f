#include "core/internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Handles that outlive the process: "dl1.<mode>.<permits>.<fence>.<ttl ms>.<owner>"
 * where owner is "<32 hex>-<serial>". The store checks the owner on every
 * extend/release, so a forged or stale handle can only ever fail.
 */

int dlock_lock_detach(dlock_lock *l, char **handle)
{
	if (!l || !handle)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_lock_detach: NULL argument");
	*handle = NULL;
	if (dlock__forked(l->store))
		return dlock__fork_error(l->store, "dlock_lock_detach");
	pthread_mutex_lock(&l->mu);
	bool held = l->state == DLOCK__HELD;
	pthread_mutex_unlock(&l->mu);
	if (!held)
		return dlock_error_set(DLOCK_ENOTHELD, NULL, NULL, "lock '%s' is not held by this handle", l->name);
	if (dlock_store_session_bound(l->store))
		return dlock_error_set(DLOCK_ENOTSUPPORTED, l->store->mt.kind, NULL,
				       "locks of the %s store live with this process's session and cannot be "
				       "handed to another process",
				       l->store->mt.kind);
	char *h = dlock_sys_sprintf("dl1.%c.%u.%" PRIu64 ".%" PRId64 ".%s", l->opts.mode == DLOCK_SHARED ? 's' : 'x',
				    l->opts.permits, l->fence, l->ttl_ms, l->owner);
	if (!h)
		return DLOCK_ENOMEM;
	dlock__renewer_remove(l->store, &l->reg, INT64_MAX);
	pthread_mutex_lock(&l->mu);
	l->state = DLOCK__IDLE;
	l->count = 0;
	l->fence = 0;
	pthread_mutex_unlock(&l->mu);
	*handle = h;
	return 0;
}

static bool owner_ok(const char *o)
{
	size_t i;
	for (i = 0; i < 32; i++)
		if (!((o[i] >= '0' && o[i] <= '9') || (o[i] >= 'a' && o[i] <= 'f')))
			return false;
	if (o[32] != '-' || !o[33])
		return false;
	for (i = 33; o[i]; i++)
		if (o[i] < '0' || o[i] > '9' || i > 53)
			return false;
	return true;
}

int dlock_lock_attach(dlock_lock *l, const char *handle)
{
	if (!l || !handle)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_lock_attach: NULL argument");
	if (dlock__forked(l->store))
		return dlock__fork_error(l->store, "dlock_lock_attach");
	char mode = 0, owner[64] = "";
	unsigned permits = 0;
	uint64_t fence = 0;
	int64_t ttl = 0;
	int used = 0;
	if (strlen(handle) > 128 ||
	    sscanf(handle, "dl1.%c.%u.%" SCNu64 ".%" SCNd64 ".%63[0-9a-f-]%n", &mode, &permits, &fence, &ttl, owner,
		   &used) != 5 ||
	    handle[used] != '\0' || (mode != 'x' && mode != 's') || permits < 1 || ttl < 10 || ttl > DLOCK_TTL_MAX_MS ||
	    !owner_ok(owner))
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "malformed lock handle (expected what 'dlock acquire' printed)");
	if (mode == 's' && permits != 1)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "malformed lock handle (a shared hold with permits)");
	pthread_mutex_lock(&l->mu);
	if (l->state == DLOCK__HELD) {
		pthread_mutex_unlock(&l->mu);
		return dlock_error_set(DLOCK_EBUSY, NULL, NULL, "this lock handle already holds '%s'", l->name);
	}
	snprintf(l->owner, sizeof(l->owner), "%s", owner);
	/* The handle describes an existing hold: its mode and permits win. */
	l->opts.mode = mode == 's' ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
	l->opts.permits = permits;
	l->ttl_ms = ttl;
	l->state = DLOCK__HELD;
	l->attached = true;
	l->count = 1;
	l->thread = pthread_self();
	l->fence = fence;
	l->deadline = dlock_clock_ms() + ttl - dlock_sys_drift_ms(ttl);
	l->lost_fired = false;
	l->lost_why = NULL;
	dlock__lock_fill_request(l);
	pthread_mutex_unlock(&l->mu);
	return 0;
}
