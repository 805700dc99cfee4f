#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

dlock_lock_status *dlock__status_add(dlock_lock_status **arr, size_t *count)
{
	dlock_lock_status *n = realloc(*arr, (*count + 1) * sizeof(**arr));
	if (!n) {
		dlock__oom();
		return NULL;
	}
	*arr = n;
	memset(&n[*count], 0, sizeof(n[0]));
	n[*count].permits = 1;
	return &n[(*count)++];
}

dlock_holder *dlock__status_add_holder(dlock_lock_status *st)
{
	dlock_holder *n = realloc(st->holders, (st->nholders + 1) * sizeof(*n));
	if (!n) {
		dlock__oom();
		return NULL;
	}
	st->holders = n;
	memset(&n[st->nholders], 0, sizeof(n[0]));
	n[st->nholders].ttl_left_ms = -1;
	return &n[st->nholders++];
}

static void status_free_one(dlock_lock_status *st)
{
	for (size_t j = 0; j < st->nholders; j++) {
		free(st->holders[j].owner);
		free(st->holders[j].host);
	}
	free(st->holders);
	free(st->name);
}

void dlock_status_free(dlock_lock_status *st, size_t count)
{
	if (!st)
		return;
	for (size_t i = 0; i < count; i++)
		status_free_one(&st[i]);
	free(st);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* be->status for every name be->list gives: valid lock names, once each. */
static int status_listed(dlock_backend *be, dlock_lock_status **out, size_t *count)
{
	char **all = NULL;
	size_t n = 0, u = 0;
	int rc = be->list(be, &all, &n);
	if (!rc && n) {
		qsort(all, n, sizeof(*all), cmp_name);
		for (size_t i = 0; i < n; i++) {
			if ((u && !strcmp(all[u - 1], all[i])) || dlock_name_check(all[i]) != 0)
				free(all[i]); /* a duplicate, or a key under the prefix that is not ours */
			else
				all[u++] = all[i];
		}
		rc = u ? be->status(be, (const char *const *)all, u, out, count) : 0;
	} else {
		u = n;
	}
	for (size_t i = 0; i < u; i++)
		free(all[i]);
	free(all);
	if (!rc)
		dlock_error_clear(); /* a name check that failed above is not this call's error */
	return rc;
}

int dlock_store_status(dlock_store *s, const char *const *names, size_t nnames,
		       dlock_lock_status **out, size_t *count)
{
	if (!s || !out || !count)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_store_status: NULL argument");
	*out = NULL;
	*count = 0;
	if (dlock__forked(s))
		return dlock__fork_error(s, "dlock_store_status");
	if (!names)
		nnames = 0;
	for (size_t i = 0; i < nnames; i++) {
		int rc = dlock_name_check(names[i]);
		if (rc)
			return rc;
	}
	if (!s->be->status)
		return dlock_error_set(DLOCK_ENOTSUPPORTED, s->be->kind, NULL,
				       "the %s store cannot report lock status", s->be->kind);
	pthread_mutex_lock(&s->be_mu);
	int rc = !nnames && s->be->list ? status_listed(s->be, out, count)
					: s->be->status(s->be, nnames ? names : NULL, nnames, out, count);
	pthread_mutex_unlock(&s->be_mu);
	if (rc) {
		dlock_status_free(*out, *count);
		*out = NULL;
		*count = 0;
		return rc;
	}
	if (nnames == 0) {
		/* Listing every lock: stores may report names that have gone idle since
		 * they were listed; keep only those with holders or waiters. */
		size_t kept = 0;
		for (size_t i = 0; i < *count; i++) {
			dlock_lock_status *st = &(*out)[i];
			if (st->nholders || st->waiters)
				(*out)[kept++] = *st;
			else
				status_free_one(st);
		}
		*count = kept;
	}
	return 0;
}
