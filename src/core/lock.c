#include "core/internal.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Back-off between tries for stores that cannot notify: 1 ms doubling to 50 ms, jittered. */
#define BACKOFF_FIRST_MS 1
#define BACKOFF_MAX_MS 50

int dlock_lock_new(dlock_lock **out, dlock_store *store, const char *name, const dlock_lock_options *opts)
{
	dlock_lock_options dflt = DLOCK_LOCK_OPTIONS_INIT;
	if (!out)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_lock_new: out is NULL");
	*out = NULL;
	if (!store)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_lock_new: store is NULL");
	if (dlock__forked(store))
		return dlock__fork_error(store, "dlock_lock_new");
	int rc = dlock_name_check(name);
	if (rc)
		return rc;
	if (!opts)
		opts = &dflt;
	if (opts->version < 1 || opts->version > DLOCK_LOCK_OPTIONS_VERSION)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "lock options version %u is not supported (this library knows %d)",
				       opts->version, DLOCK_LOCK_OPTIONS_VERSION);
	if (opts->ttl_ms < 0)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "negative TTL (%lld ms)", (long long)opts->ttl_ms);
	if (opts->ttl_ms > 0 && opts->ttl_ms < 10)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "TTL %lld ms is too short (at least 10 ms)",
				       (long long)opts->ttl_ms);
	if (opts->ttl_ms > DLOCK_TTL_MAX_MS)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "TTL %lld ms is too long (at most 366 days)",
				       (long long)opts->ttl_ms);
	if (opts->mode != DLOCK_EXCLUSIVE && opts->mode != DLOCK_SHARED)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "unknown lock mode %d", (int)opts->mode);
	if (opts->mode == DLOCK_SHARED && opts->permits > 1)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "permits > 1 (a semaphore) cannot be combined with shared mode");
	if (opts->permits > 1000000)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "permits %u is too many (at most 1000000)",
				       opts->permits);
	dlock_lock *l = dlock_sys_calloc(1, sizeof(*l));
	if (!l)
		return DLOCK_ENOMEM;
	if (!(l->name = dlock_sys_strdup(name))) {
		free(l);
		return DLOCK_ENOMEM;
	}
	l->store = store;
	/* A caller built against version 1 has a shorter struct. */
	memcpy(&l->opts, opts, opts->version >= 2 ? sizeof *opts : offsetof(dlock_lock_options, on_unreachable));
	l->opts.version = DLOCK_LOCK_OPTIONS_VERSION;
	if (l->opts.permits == 0)
		l->opts.permits = 1;
	l->ttl_ms = opts->ttl_ms > 0 ? opts->ttl_ms : store->default_ttl_ms;
	pthread_mutex_init(&l->mu, NULL);
	atomic_init(&l->refs, 1);
	*out = l;
	return 0;
}

void dlock__lock_fill_request(dlock_lock *l)
{
	dlock_request *r = &l->req;
	void *slot = r->slot;
	memset(r, 0, sizeof(*r));
	r->name = l->name;
	r->owner = l->owner;
	r->mode = l->opts.mode;
	r->permits = l->opts.permits;
	r->fair = l->opts.fair;
	r->ttl_ms = l->ttl_ms;
	r->queue_ttl_ms = DLOCK__QUEUE_TTL_MS;
	r->host = l->store->host;
	r->pid = dlock__pid();
	r->ticket_us = dlock_wall_ms() * 1000 + dlock_sys_rand_between(0, 999);
	r->slot = slot;
}

bool dlock__lock_mark_lost(dlock_lock *l, const char *why)
{
	if (l->state != DLOCK__HELD)
		return false;
	l->state = DLOCK__LOST;
	l->lost_why = why;
	bool fire = !l->lost_fired && l->opts.on_lost;
	l->lost_fired = true;
	return fire;
}

static void new_owner(dlock_lock *l)
{
	dlock_store *s = l->store;
	pthread_mutex_lock(&s->reg_mu);
	uint64_t serial = ++s->next_serial;
	pthread_mutex_unlock(&s->reg_mu);
	snprintf(l->owner, sizeof(l->owner), "%s-%llu", s->client_id, (unsigned long long)serial);
}

/* The deadline of one request started now, cut to `until`. */
static int64_t request_deadline(const dlock_store *s, int64_t until)
{
	int64_t d = dlock_clock_ms() + s->request_timeout_ms;
	return d < until ? d : until;
}

/* call_acquire's answer when the store handle stayed busy past the deadline
 * (positive: never a DLOCK_E* code). */
#define BE_BUSY 1

/* Take the store's backend mutex, waiting no later than `by` (CLOCK_MONOTONIC
 * ms; INT64_MAX: as long as it takes). Every request that holds it is bounded
 * by its own deadline, so the wait is too; this keeps it within ours. */
static bool lock_be_by(dlock_store *s, int64_t by)
{
	atomic_fetch_add(&s->fg_waiting, 1);
	bool ok = true;
	if (by == INT64_MAX) {
		pthread_mutex_lock(&s->be_mu);
	} else {
		/* timedlock takes CLOCK_REALTIME (clocklock would take ours, but the
		 * sanitizers do not know it): the time left, from the wall clock now */
		int64_t left = by - dlock_clock_ms();
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t ns = (int64_t)ts.tv_nsec + (left > 0 ? left : 0) % 1000 * 1000000;
		ts.tv_sec += (time_t)((left > 0 ? left : 0) / 1000 + ns / 1000000000);
		ts.tv_nsec = (long)(ns % 1000000000);
		ok = pthread_mutex_timedlock(&s->be_mu, &ts) == 0;
	}
	atomic_fetch_sub(&s->fg_waiting, 1);
	return ok;
}

/* One try. A waiting try of a store with wake-ups arms the board first
 * (*armed: the board's generation from before the try); the store is asked
 * to watch the name only after a refused try (*watched: it agreed), so a
 * lock nobody holds costs its round trips and no subscription. A release
 * between the refusal and the watch taking effect still wakes the waiter:
 * a store's watch wakes the name once it is in place (sys/backend.h). */
static int call_acquire(dlock_lock *l, dlock_grant *out, int64_t until, bool *watched, uint64_t *armed)
{
	dlock_store *s = l->store;
	if (!lock_be_by(s, until))
		return BE_BUSY;
	bool watching = s->mt.watch && l->req.waiting;
	if (watching)
		*armed = dlock__board_arm(s->board, l->name, l->req.owner);
	l->req.deadline_ms = request_deadline(s, until);
	if (dlock_try_too_late(&l->req, s->request_timeout_ms)) {
		/* would most likely only time out and leave an outcome to undo: not
		 * sent (sys/backend.h, "Time"); the wait ends not acquired */
		pthread_mutex_unlock(&s->be_mu);
		return dlock_error_set(DLOCK_ELOCKED, s->mt.kind, NULL, "lock '%s' not acquired by the end of the wait",
				       l->name);
	}
	*out = (dlock_grant){ .retry_ms = -1, .slot = l->req.slot };
	dlock__counted(s);
	int rc = dlock__heard(s, s->mt.acquire(s->be, &l->req, out));
	l->req.slot = out->slot;
	if (watching && rc == DLOCK_ELOCKED) {
		dlock_sys_saved_error saved; /* a watch that fails only costs polling */
		dlock_sys_error_save(&saved);
		*watched = s->mt.watch(s->be, &l->req) == 0 || *watched;
		dlock_sys_error_restore(&saved);
	}
	pthread_mutex_unlock(&s->be_mu);
	return rc;
}

static void call_cancel(dlock_lock *l, int64_t deadline)
{
	dlock_backend *be = l->store->be;
	if (!l->store->mt.cancel)
		return;
	dlock_sys_saved_error saved; /* cancel is cleanup: keep the caller's error */
	dlock_sys_error_save(&saved);
	if (lock_be_by(l->store, deadline)) {
		l->req.deadline_ms = deadline;
		dlock__counted(l->store);
		l->store->mt.cancel(be, &l->req);
		pthread_mutex_unlock(&l->store->be_mu);
	} else {
		/* busy past our bound: the renewer cancels it (the slot goes with it) */
		dlock__orphan_add(l->store, &l->req, DLOCK__ORPHAN_CANCEL, dlock_clock_ms() + l->req.queue_ttl_ms);
	}
	l->req.slot = NULL; /* the store freed (or will free) its per-attempt state */
	dlock_sys_error_restore(&saved);
}

static int release_in_store(dlock_lock *l, int64_t deadline);

/* Whether an acquire's answer may hide a grant the server applied. */
static bool outcome_unknown(int rc)
{
	return rc != 0 && rc != DLOCK_ELOCKED && rc != DLOCK_EINVAL && rc != DLOCK_EAUTH && rc != DLOCK_ENOTSUPPORTED;
}

/* Undo whatever the tries of this acquire call may have left in the store:
 * release by owner now, within `deadline`; if the store does not confirm,
 * the renewer retries it until any lease a try may have set has ended (the
 * latest try started before now). Returns true when the store confirmed
 * that nothing is left. */
static bool undo(dlock_lock *l, int64_t deadline)
{
	dlock_store *s = l->store;
	dlock_sys_saved_error saved;
	dlock_sys_error_save(&saved);
	int rc = DLOCK_EUNAVAILABLE;
	l->req.confirm = 1;
	if (lock_be_by(s, deadline)) {
		l->req.deadline_ms = deadline;
		dlock__counted(s);
		rc = dlock__heard(s, s->mt.release(s->be, &l->req));
		pthread_mutex_unlock(&s->be_mu);
	}
	l->req.slot = NULL;
	bool done = rc == 0 || rc == DLOCK_ENOTHELD;
	if (!done)
		dlock__orphan_add(s, &l->req, DLOCK__ORPHAN_RELEASE, dlock_clock_ms() + l->ttl_ms);
	dlock_sys_error_restore(&saved);
	return done;
}

static int granted(dlock_lock *l, uint64_t fence, int64_t t_lease)
{
	pthread_mutex_lock(&l->mu);
	l->state = DLOCK__HELD;
	l->count = 1;
	l->thread = pthread_self();
	l->fence = fence;
	l->deadline = t_lease + l->ttl_ms - dlock_sys_drift_ms(l->ttl_ms);
	l->unsure_ttl_ms = 0;
	l->unsure_end = 0;
	l->attached = false;
	l->lost_fired = false;
	l->lost_why = NULL;
	l->release_pending = false;
	pthread_mutex_unlock(&l->mu);
	/* Locks without renewal are watched too: their on_lost fires at the deadline. */
	l->reg.lock = l;
	l->reg.next_renew = l->opts.no_renew ? INT64_MAX : t_lease + l->ttl_ms / 3;
	int rc = dlock__renewer_add(l->store, &l->reg);
	if (rc) {
		/* No renewal and no lost signal would watch this hold: give it back. */
		dlock_sys_saved_error saved;
		dlock_sys_error_save(&saved);
		release_in_store(l, INT64_MAX);
		dlock_sys_error_restore(&saved);
		pthread_mutex_lock(&l->mu);
		l->state = DLOCK__IDLE;
		l->count = 0;
		l->fence = 0;
		pthread_mutex_unlock(&l->mu);
	}
	return rc;
}

/* A lost hold is over, but the store may still keep state for it (a held
 * connection, a queue node): release it there, quietly, and forget it. False
 * if a renewal of it still in flight (or its on_lost) outlasts `by`. */
static bool forget_lost(dlock_lock *l, int64_t by)
{
	if (!dlock__renewer_remove(l->store, &l->reg, by))
		return false;
	dlock_sys_saved_error saved;
	dlock_sys_error_save(&saved);
	/* A courtesy (the hold is over): on a silent store, a short one; if it
	 * is not confirmed, the renewer retries it until the lease has ended. */
	release_in_store(l, dlock__silent(l->store) ? dlock_clock_ms() + DLOCK__SILENT_TRY_MS : INT64_MAX);
	dlock_sys_error_restore(&saved);
	return true;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* How far past its wait an acquire may return: max(50 ms, 5 %). The clean-up
 * after a timeout (cancel, undo) gets half of it; the rest is the background's. */
static int64_t slack_ms(int64_t wait_ms)
{
	int64_t pct = wait_ms / 20;
	return pct > 50 ? pct : 50;
}

/* One dlock_acquire call that got past its checks: its deadlines and what
 * its tries found (the clean-up acquire_give_up owes). A call is a loop of
 * acquire_try and acquire_nap, ended by a grant or acquire_give_up. */
typedef struct acquire_call {
	dlock_lock *l;
	int64_t wait_ms;
	int64_t until;      /* the wait's end (INT64_MAX: none) */
	int64_t try_until;  /* a try's: a try-once gets one request timeout; a wait, what is left of it */
	int64_t cleanup_by; /* the clean-up's after a refusal or a timeout */
	int64_t now;        /* when the last try ended */
	int rc;             /* the last try's outcome */
	int64_t backoff;
	int64_t unknown_t0;   /* start of the earliest try whose outcome is unknown, or -1 */
	bool registered;      /* the store keeps a waiter registration to cancel */
	bool contended;       /* some try of this call found the lock held */
	bool unreachable;     /* on_unreachable was told so */
	bool watched;         /* the store feeds the board for this wait */
	bool unwatch_owed;    /* a waiting try was refused or failed: the store may keep
				 state for this wait (sys/backend.h, `unwatch`) */
	uint64_t armed;       /* the board's mark when it was armed */
	int64_t hint_since, last_hint; /* a polling store's early-look hints */
} acquire_call;

enum { TRY_GRANTED, TRY_NAP, TRY_GIVE_UP };

/* One try: TRY_GRANTED (the grant in g, its lease from *lease_from),
 * TRY_NAP (refused, or unreachable where that is ridden out, within the
 * wait) or TRY_GIVE_UP (a->rc says why). */
static int acquire_try(acquire_call *a, int attempt, dlock_grant *g, int64_t *lease_from)
{
	dlock_lock *l = a->l;
	int64_t t0 = dlock_clock_ms(); /* the lease counts from before the request */
	int last = a->rc;
	if (attempt > 0 && t0 >= a->until)
		return TRY_GIVE_UP; /* the wait ended while we napped: no try with no time left */
	l->req.waiting = a->wait_ms != 0;
	int rc = call_acquire(l, g, a->try_until, &a->watched, &a->armed);
	a->unwatch_owed |= l->store->mt.watch && l->req.waiting && rc != 0 && rc != BE_BUSY;
	if (rc == BE_BUSY) {
		/* Another request of this store handle held it until our deadline. */
		a->rc = last == DLOCK_ELOCKED ? DLOCK_ELOCKED
					      : dlock_error_set(DLOCK_EUNAVAILABLE, l->store->mt.kind, NULL,
								"timed out: the store handle was busy with "
								"another request");
		return TRY_GIVE_UP;
	}
	int64_t t_lease = a->unknown_t0 >= 0 ? a->unknown_t0 : t0;
	if (rc == 0 && g->lease_from_ms > 0 && g->lease_from_ms < t_lease)
		t_lease = g->lease_from_ms; /* the store's lease began before this try */
	if (rc == 0) {
		int64_t now = dlock_clock_ms();
		if (now < t_lease + l->ttl_ms - dlock_sys_drift_ms(l->ttl_ms)) {
			*lease_from = t_lease;
			return TRY_GRANTED;
		}
		/* The grant came after the lease it may carry had ended: not ours to use. */
		if (!undo(l, request_deadline(l->store, a->cleanup_by > now ? a->cleanup_by : now + 1))) {
			new_owner(l); /* the old owner's release goes on in the background */
			dlock__lock_fill_request(l);
			a->registered = false;
		}
		a->unknown_t0 = -1;
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, l->store->mt.kind, NULL,
				     "lock '%s': the grant arrived after its lease had ended", l->name);
	} else if (outcome_unknown(rc) && a->unknown_t0 < 0) {
		a->unknown_t0 = t0;
	}
	a->rc = rc;
	a->registered |= rc == DLOCK_ELOCKED && l->req.waiting;
	a->contended |= rc == DLOCK_ELOCKED;
	/* No answer on a first try that no server of the store took: the
	 * caller hears at once that the store is unreachable; later in a
	 * wait, or when a server took it (dlock_grant.reached: an election, a
	 * failover), it is ridden out until the wait ends. */
	bool transient = rc == DLOCK_EUNAVAILABLE && (attempt > 0 || g->reached);
	if (l->opts.on_unreachable && a->wait_ms != 0) {
		if (transient) {
			a->unreachable = true;
			l->opts.on_unreachable(l, rc, dlock_error_last()->message, l->opts.payload);
		} else if (a->unreachable && rc == DLOCK_ELOCKED) {
			a->unreachable = false;
			l->opts.on_unreachable(l, 0, NULL, l->opts.payload);
		}
	}
	a->now = dlock_clock_ms();
	if ((rc != DLOCK_ELOCKED && !transient) || a->wait_ms == 0 || a->now >= a->until)
		return TRY_GIVE_UP;
	return TRY_NAP;
}

/* Between two tries (g: the last one's hints): until the board or the
 * store's own wait says the lock may be free, else a back-off (a polling
 * store's early-look hint first); never past the wait's end, and back
 * before the waiter registration expires. */
static void acquire_nap(acquire_call *a, const dlock_grant *g)
{
	dlock_lock *l = a->l;
	int64_t now = a->now, retry = g->retry_ms;
	int64_t nap = min64(a->until - now, g->nap_ms > l->req.queue_ttl_ms / 3 ? g->nap_ms : l->req.queue_ttl_ms / 3);
	int64_t by_retry = retry >= 0 ? min64(nap, retry + 1) : nap;
	if (a->watched && a->rc == DLOCK_ELOCKED) {
		dlock__board_wait(l->store->board, l->name, l->req.owner, a->armed, by_retry);
	} else if (l->store->mt.wait && a->rc == DLOCK_ELOCKED) {
		dlock__counted(l->store);
		dlock_grant w = { .retry_ms = -1, .slot = l->req.slot };
		l->store->mt.wait(l->store->be, &l->req, by_retry, &w);
		l->req.slot = w.slot;
	} else {
		int64_t step = min64(by_retry, dlock_sys_rand_between(a->backoff / 2 + 1, a->backoff));
		a->backoff = min64(a->backoff * 2, a->rc == DLOCK_ELOCKED ? BACKOFF_MAX_MS : 1000);
		if (a->rc == DLOCK_ELOCKED && retry >= 0 && retry < BACKOFF_MAX_MS) {
			/* A polling store's early-look hint (its queue place,
			 * dlock_sys_poll_hint): as asked while the place is new, then
			 * every eighth of the time spent at it, up to the back-off's
			 * cap — a long hold is not polled every millisecond. */
			if (a->hint_since < 0 || retry < a->last_hint)
				a->hint_since = now;
			a->last_hint = retry;
			int64_t spaced = min64((now - a->hint_since) / 8, BACKOFF_MAX_MS);
			step = min64(nap, spaced > retry + 1 ? spaced : retry + 1);
		}
		dlock_sys_sleep_ms(step);
	}
}

/* The end of a call without a grant: the store's waiter registration
 * cancelled, a try of unknown outcome undone (by the clean-up's deadline),
 * and the caller's error. */
static int acquire_give_up(acquire_call *a)
{
	dlock_lock *l = a->l;
	int rc = a->rc;
	dlock_sys_saved_error saved;
	dlock_sys_error_save(&saved);
	if (a->unwatch_owed)
		l->store->mt.unwatch(l->store->be, &l->req);
	int64_t now = dlock_clock_ms();
	int64_t by = request_deadline(l->store, a->cleanup_by > now ? a->cleanup_by : now + 1);
	if (a->registered)
		call_cancel(l, by);
	if (a->unknown_t0 >= 0)
		undo(l, by);
	dlock_sys_error_restore(&saved);
	/* A wait that found the lock held and ran out during a try (the try cut
	 * short by the wait's end, or the store gone quiet at the end): the lock
	 * was not acquired within the wait, which is what the caller asked. */
	if (rc == DLOCK_EUNAVAILABLE && a->contended && a->wait_ms != 0 && dlock_clock_ms() >= a->until)
		rc = DLOCK_ELOCKED;
	if (rc != DLOCK_ELOCKED)
		return rc;
	if (a->wait_ms == 0)
		return dlock_error_set(DLOCK_ELOCKED, l->store->mt.kind, NULL, "lock '%s' is held by another owner",
				       l->name);
	return dlock_error_set(DLOCK_ETIMEOUT, l->store->mt.kind, NULL, "lock '%s' not acquired within %lld ms",
			       l->name, (long long)a->wait_ms);
}

int dlock_acquire(dlock_lock *l, int64_t wait_ms)
{
	if (!l)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_acquire: lock is NULL");
	if (dlock__forked(l->store))
		return dlock__fork_error(l->store, "dlock_acquire");
	pthread_mutex_lock(&l->mu);
	if (l->state == DLOCK__HELD) {
		int rc = 0;
		if (!pthread_equal(l->thread, pthread_self()) || l->attached)
			rc = dlock_error_set(DLOCK_EBUSY, NULL, NULL,
					     "lock '%s' is held through this handle by another thread", l->name);
		else if (dlock_clock_ms() >= l->deadline)
			rc = dlock_error_set(DLOCK_ELOST, l->store->mt.kind, NULL,
					     "lock '%s' was lost: its lease ended", l->name);
		else
			l->count++;
		pthread_mutex_unlock(&l->mu);
		return rc;
	}
	bool was_lost = l->state == DLOCK__LOST;
	pthread_mutex_unlock(&l->mu);
	int64_t start = dlock_clock_ms();
	int64_t until = wait_ms < 0 || wait_ms > DLOCK_TTL_MAX_MS ? INT64_MAX : start + wait_ms;
	/* The lost hold's renewal may hang until its own deadline: not past ours. */
	if (was_lost && !forget_lost(l, wait_ms == 0 ? request_deadline(l->store, INT64_MAX) : until))
		return dlock_error_set(DLOCK_EUNAVAILABLE, l->store->mt.kind, NULL,
				       "timed out: the store handle was busy renewing the lost hold of '%s'", l->name);
	pthread_mutex_lock(&l->mu);
	l->state = DLOCK__IDLE;
	pthread_mutex_unlock(&l->mu);

	new_owner(l);
	dlock__lock_fill_request(l);
	acquire_call a = {
		.l = l,
		.wait_ms = wait_ms,
		.until = until,
		.try_until = wait_ms == 0 ? INT64_MAX : until,
		/* A try-once ends within one request timeout, its clean-up
		 * included (what the clean-up cannot finish, the renewer does in
		 * the background). */
		.cleanup_by = wait_ms == 0         ? start + l->store->request_timeout_ms
			      : until == INT64_MAX ? INT64_MAX
						   : until + slack_ms(wait_ms) / 2,
		.rc = DLOCK_EUNAVAILABLE,
		.backoff = BACKOFF_FIRST_MS,
		.unknown_t0 = -1,
		.hint_since = -1,
	};
	for (int attempt = 0;; attempt++) {
		dlock_grant g = { .retry_ms = -1 };
		int64_t lease_from = 0;
		int step = acquire_try(&a, attempt, &g, &lease_from);
		if (step == TRY_GRANTED) {
			if (a.unwatch_owed)
				l->store->mt.unwatch(l->store->be, &l->req);
			return granted(l, g.fence, lease_from);
		}
		if (step == TRY_GIVE_UP)
			return acquire_give_up(&a);
		acquire_nap(&a, &g);
	}
}

/* Release l's hold in the store within `deadline` (INT64_MAX: one request
 * timeout from now). */
static int release_in_store(dlock_lock *l, int64_t deadline)
{
	dlock_backend *be = l->store->be;
	lock_be_by(l->store, INT64_MAX);
	if (l->store->closed) {
		/* an on_lost that outlived dlock_store_close frees its lock: the
		 * store is gone, and what it kept ends with its lease */
		pthread_mutex_unlock(&l->store->be_mu);
		l->req.slot = NULL;
		return 0;
	}
	l->req.confirm = l->attached;
	pthread_mutex_lock(&l->mu);
	if (!l->attached && l->state != DLOCK__IDLE) {
		/* No later than the lease's end (but a short try at least): by then
		 * the lease has ended the hold, and a release still waiting for a
		 * silent store would hold up the caller for nothing. */
		int64_t lease_by = l->deadline > dlock_clock_ms() + DLOCK__SILENT_TRY_MS
					   ? l->deadline
					   : dlock_clock_ms() + DLOCK__SILENT_TRY_MS;
		deadline = min64(deadline, lease_by);
	}
	pthread_mutex_unlock(&l->mu);
	l->req.deadline_ms = request_deadline(l->store, deadline);
	dlock__counted(l->store);
	int rc = dlock__heard(l->store, l->store->mt.release(be, &l->req));
	pthread_mutex_unlock(&l->store->be_mu);
	l->req.slot = NULL;
	if (rc == DLOCK_ENOTHELD) /* the core words it (sys/backend.h) */
		dlock_error_set(DLOCK_ENOTHELD, l->store->mt.kind, NULL,
				"lock '%s': the store has no hold of this owner (released or expired)", l->name);
	if (rc != 0 && rc != DLOCK_ENOTHELD && rc != DLOCK_EINVAL) {
		/* Not confirmed: the renewer retries until the hold's lease would have ended. */
		pthread_mutex_lock(&l->mu);
		/* The store's expiry: our deadline plus its drift margin, plus the
		 * longest a confirmed renewal may have taken to apply. */
		int64_t until = l->state == DLOCK__HELD && !l->attached
					? l->deadline + dlock_sys_drift_ms(l->ttl_ms) + l->store->request_timeout_ms
					: dlock_clock_ms() + l->ttl_ms;
		pthread_mutex_unlock(&l->mu);
		dlock__orphan_add(l->store, &l->req, DLOCK__ORPHAN_RELEASE, until);
	}
	return rc;
}

/* dlock_release again after a release the store did not confirm. */
static int release_again(dlock_lock *l)
{
	dlock_store *s = l->store;
	dlock__orphan *o;
	if (!dlock__orphan_take(s, l->owner, &o))
		return 0; /* confirmed in the background, or its lease has ended */
	dlock_request req = *dlock__orphan_request(o);
	lock_be_by(s, INT64_MAX);
	req.deadline_ms = request_deadline(s, INT64_MAX);
	dlock__counted(s);
	int rc = dlock__heard(s, s->mt.release(s->be, &req));
	pthread_mutex_unlock(&s->be_mu);
	if (rc == 0 || rc == DLOCK_ENOTHELD) {
		dlock__orphan_free(o);
		return 0;
	}
	dlock__orphan_put(s, o);
	return rc;
}

int dlock_release(dlock_lock *l)
{
	if (!l)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_release: lock is NULL");
	if (dlock__forked(l->store))
		return dlock__fork_error(l->store, "dlock_release");
	pthread_mutex_lock(&l->mu);
	dlock__state st = l->state;
	if (st == DLOCK__IDLE && l->release_pending) {
		pthread_mutex_unlock(&l->mu);
		int rc = release_again(l);
		pthread_mutex_lock(&l->mu);
		if (rc == 0)
			l->release_pending = false;
		pthread_mutex_unlock(&l->mu);
		return rc;
	}
	if (st == DLOCK__IDLE) {
		pthread_mutex_unlock(&l->mu);
		return dlock_error_set(DLOCK_ENOTHELD, NULL, NULL, "lock '%s' is not held by this handle", l->name);
	}
	if (st == DLOCK__HELD && !pthread_equal(l->thread, pthread_self())) {
		pthread_mutex_unlock(&l->mu);
		return dlock_error_set(DLOCK_EBUSY, NULL, NULL,
				       "lock '%s' is held through this handle by another thread", l->name);
	}
	if (st == DLOCK__HELD && l->count > 1) {
		l->count--;
		pthread_mutex_unlock(&l->mu);
		return 0;
	}
	bool attached = l->attached;
	bool expired = st == DLOCK__HELD && !attached && dlock_clock_ms() >= l->deadline;
	pthread_mutex_unlock(&l->mu);

	dlock__renewer_remove(l->store, &l->reg, INT64_MAX);
	int rc = release_in_store(l, INT64_MAX);
	pthread_mutex_lock(&l->mu);
	l->state = DLOCK__IDLE;
	l->count = 0;
	l->fence = 0;
	l->attached = false;
	l->release_pending = rc != 0 && rc != DLOCK_ENOTHELD && rc != DLOCK_EINVAL;
	pthread_mutex_unlock(&l->mu);
	if (st == DLOCK__LOST || expired)
		return dlock_error_set(DLOCK_ELOST, l->store->mt.kind, NULL,
				       "lock '%s' was lost before release: its lease ended", l->name);
	if (rc == DLOCK_ENOTHELD && !attached)
		return dlock_error_set(DLOCK_ELOST, l->store->mt.kind, NULL,
				       "lock '%s' was lost before release: the store no longer has our hold", l->name);
	return rc;
}

int dlock_extend(dlock_lock *l, int64_t ttl_ms)
{
	if (!l)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "dlock_extend: lock is NULL");
	if (dlock__forked(l->store))
		return dlock__fork_error(l->store, "dlock_extend");
	if (ttl_ms < 0 || (ttl_ms > 0 && ttl_ms < 10) || ttl_ms > DLOCK_TTL_MAX_MS)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "bad TTL %lld ms (0, or 10 ms to 366 days)",
				       (long long)ttl_ms);
	pthread_mutex_lock(&l->mu);
	dlock__state st = l->state;
	pthread_mutex_unlock(&l->mu);
	if (st == DLOCK__IDLE)
		return dlock_error_set(DLOCK_ENOTHELD, NULL, NULL, "lock '%s' is not held by this handle", l->name);
	if (st == DLOCK__LOST)
		return dlock_error_set(DLOCK_ELOST, NULL, NULL, "lock '%s' was lost: its lease ended", l->name);
	if (ttl_ms == 0)
		ttl_ms = l->ttl_ms;
	dlock_store *s = l->store;
	dlock_backend *be = s->be;
	/* Never beside a renewal of this hold: one sent before us with the old
	 * ttl and answered after us would set the store's expiry back (a store
	 * that keeps the later expiry is safe anyway; the others are not). */
	if (!dlock__renewer_extend_begin(s, &l->reg, request_deadline(s, INT64_MAX)))
		return dlock_error_set(DLOCK_EUNAVAILABLE, l->store->mt.kind, NULL,
				       "timed out: a renewal of lock '%s' was still in flight", l->name);
	int64_t t0 = dlock_clock_ms();
	/* The store sees a copy: the renewer copies l->req under l->mu too. */
	pthread_mutex_lock(&l->mu);
	dlock_request req = l->req;
	pthread_mutex_unlock(&l->mu);
	lock_be_by(s, INT64_MAX);
	req.deadline_ms = request_deadline(s, INT64_MAX);
	dlock__counted(s);
	int rc;
	if (s->mt.extend) {
		rc = s->mt.extend(be, &req, ttl_ms);
	} else {
		const dlock_request *one = &req;
		int result = DLOCK_EUNAVAILABLE;
		req.ttl_ms = ttl_ms;
		rc = s->mt.renew(be, &one, 1, &result);
		if (rc == 0)
			rc = result;
	}
	dlock__heard(s, rc);
	pthread_mutex_unlock(&s->be_mu);
	int64_t next_renew = INT64_MAX;
	pthread_mutex_lock(&l->mu);
	if (rc == 0)
		l->req.ttl_ms = ttl_ms;
	if (rc == 0 && l->state == DLOCK__HELD) {
		/* A shorter-ttl request of this hold with an unknown outcome may
		 * land after ours and set now + its ttl: count no more than that. */
		int64_t eff = l->unsure_ttl_ms > 0 && l->unsure_ttl_ms < ttl_ms ? l->unsure_ttl_ms : ttl_ms;
		l->ttl_ms = ttl_ms;
		l->deadline = t0 + eff - dlock_sys_drift_ms(eff);
		/* nor past what such a request could have set from its send */
		if (l->unsure_end > 0 && l->unsure_end - dlock_sys_drift_ms(eff) < l->deadline)
			l->deadline = l->unsure_end - dlock_sys_drift_ms(eff);
		next_renew = t0 + eff / 3;
	} else if (rc == DLOCK_ENOTHELD && l->attached) {
		l->state = DLOCK__IDLE; /* the handle named a hold that is not (or no longer) there */
		l->count = 0;
		l->fence = 0;
		l->attached = false;
	} else if (rc == DLOCK_ENOTHELD) {
		l->state = DLOCK__LOST;
		l->lost_fired = true; /* the caller hears it now, not through on_lost */
		l->lost_why = DLOCK__LOST_GONE;
		rc = dlock_error_set(DLOCK_ELOST, l->store->mt.kind, NULL,
				     "lock '%s' was lost: the store no longer has our hold", l->name);
	} else if (rc == 0) {
		rc = dlock_error_set(DLOCK_ELOST, l->store->mt.kind, NULL, "lock '%s' was lost: its lease ended",
				     l->name);
	} else if (l->state == DLOCK__HELD && rc != DLOCK_EINVAL) {
		/* Unknown outcome: it may land later, setting t0 + ttl_ms at the least. */
		int64_t d = t0 + ttl_ms - dlock_sys_drift_ms(ttl_ms);
		if (d < l->deadline)
			l->deadline = d;
		if (l->unsure_ttl_ms == 0 || ttl_ms < l->unsure_ttl_ms)
			l->unsure_ttl_ms = ttl_ms;
		if (l->unsure_end == 0 || t0 + ttl_ms < l->unsure_end)
			l->unsure_end = t0 + ttl_ms;
		next_renew = t0 + ttl_ms / 3;
	}
	pthread_mutex_unlock(&l->mu);
	dlock__renewer_extend_end(s, &l->reg, next_renew);
	return rc;
}

int dlock_held(const dlock_lock *cl)
{
	dlock_lock *l = (dlock_lock *)cl;
	if (!l || dlock__forked(l->store)) /* the parent's hold, not ours */
		return 0;
	pthread_mutex_lock(&l->mu);
	int held = l->state == DLOCK__HELD && (l->attached || dlock_clock_ms() < l->deadline);
	pthread_mutex_unlock(&l->mu);
	return held;
}

const char *dlock_lost_reason(const dlock_lock *cl)
{
	dlock_lock *l = (dlock_lock *)cl;
	if (!l)
		return NULL;
	pthread_mutex_lock(&l->mu);
	const char *why = l->state == DLOCK__LOST ? l->lost_why : NULL;
	pthread_mutex_unlock(&l->mu);
	return why;
}

uint64_t dlock_fence(const dlock_lock *cl)
{
	dlock_lock *l = (dlock_lock *)cl;
	if (!l || dlock__forked(l->store)) /* the parent's hold, not ours */
		return 0;
	pthread_mutex_lock(&l->mu);
	uint64_t f = l->state == DLOCK__HELD && (l->attached || dlock_clock_ms() < l->deadline) ? l->fence : 0;
	pthread_mutex_unlock(&l->mu);
	return f;
}

int64_t dlock_ttl_left(const dlock_lock *cl)
{
	dlock_lock *l = (dlock_lock *)cl;
	if (!l || dlock__forked(l->store)) /* the parent's hold, not ours */
		return 0;
	pthread_mutex_lock(&l->mu);
	int64_t left = l->state == DLOCK__HELD ? l->deadline - dlock_clock_ms() : 0;
	pthread_mutex_unlock(&l->mu);
	return left > 0 ? left : 0;
}

const char *dlock_lock_name(const dlock_lock *l)
{
	return l ? l->name : "";
}

void dlock_lock_free(dlock_lock *l)
{
	if (!l)
		return;
	if (dlock__forked(l->store)) {
		/* A fork's child: the hold is the parent's. No release, and not even
		 * its mutex (a thread of the parent may have held it at the fork). */
		dlock__forget(l->req.slot);
		free(l->name);
		free(l);
		return;
	}
	pthread_mutex_lock(&l->mu);
	dlock__state st = l->state;
	l->count = 1;
	l->thread = pthread_self();
	pthread_mutex_unlock(&l->mu);
	if (st == DLOCK__HELD)
		dlock_release(l);
	else if (st == DLOCK__LOST)
		forget_lost(l, INT64_MAX); /* the lock goes away: wait for its renewal */
	dlock__lock_unref(l); /* an on_lost still running keeps the memory */
}

void dlock__lock_unref(dlock_lock *l)
{
	if (atomic_fetch_sub(&l->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&l->mu);
	free(l->name);
	free(l);
}
