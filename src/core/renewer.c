#include "core/internal.h"

#include <stdlib.h>
#include <time.h>

/*
 * The renewal thread of a store. Every held lock is renewed at ttl/3; locks
 * due within half an interval of each other go to the store in one batch
 * (be->renew: one round trip per server). A lock whose lease deadline passes
 * without a confirmed renewal, or that the store says is no longer ours, is
 * marked lost and its on_lost runs here, before the store can give it away
 * (the deadline is ttl minus a drift margin, counted from before the request).
 */

#define RETRY_MAX_MS 1000

static void unlink_reg(dlock_store *s, dlock__reg *reg)
{
	if (!reg->lock->registered)
		return;
	if (reg->prev)
		reg->prev->next = reg->next;
	else
		s->regs = reg->next;
	if (reg->next)
		reg->next->prev = reg->prev;
	reg->next = reg->prev = NULL;
	reg->lock->registered = false;
}

/* Under reg_mu: run on_lost of reg's lock without reg_mu held. */
static void fire_lost(dlock_store *s, dlock__reg *reg)
{
	dlock_lock *l = reg->lock;
	s->cb_running = reg->id;
	pthread_mutex_unlock(&s->reg_mu);
	l->opts.on_lost(l, l->opts.payload);
	pthread_mutex_lock(&s->reg_mu);
	s->cb_running = 0;
	pthread_cond_broadcast(&s->reg_cv);
}

/* Under reg_mu: mark every lock past its deadline lost. Returns true if it ran a callback. */
static bool expire(dlock_store *s, int64_t now)
{
	for (dlock__reg *r = s->regs; r; r = r->next) {
		dlock_lock *l = r->lock;
		pthread_mutex_lock(&l->mu);
		bool gone = l->state == DLOCK__HELD && now >= l->deadline;
		bool fire = gone && dlock__lock_mark_lost(l);
		pthread_mutex_unlock(&l->mu);
		if (gone) {
			unlink_reg(s, r);
			if (fire)
				fire_lost(s, r);
			return true; /* the list may have changed */
		}
	}
	return false;
}

static void renew_batch(dlock_store *s, int64_t now)
{
	size_t n = 0;
	for (dlock__reg *r = s->regs; r; r = r->next)
		if (r->next_renew != INT64_MAX && r->next_renew - now <= r->lock->ttl_ms / 6)
			n++;
	if (n == 0)
		return;
	dlock__reg **regs = calloc(n, sizeof(*regs));
	dlock_request **reqs = calloc(n, sizeof(*reqs));
	int *results = calloc(n, sizeof(*results));
	if (!regs || !reqs || !results) {
		free(regs);
		free(reqs);
		free(results);
		return; /* try again next tick; the deadline still protects us */
	}
	size_t i = 0;
	for (dlock__reg *r = s->regs; r && i < n; r = r->next) {
		if (r->next_renew != INT64_MAX && r->next_renew - now <= r->lock->ttl_ms / 6) {
			r->in_batch = true;
			regs[i] = r;
			reqs[i] = &r->lock->req;
			i++;
		}
	}
	pthread_mutex_unlock(&s->reg_mu);

	int64_t t0 = dlock_clock_ms();
	dlock_backend *be = s->be;
	pthread_mutex_lock(&s->be_mu);
	for (i = 0; i < n; i++)
		reqs[i]->deadline_ms = t0 + s->request_timeout_ms;
	int all = 0;
	if (be->renew) {
		all = be->renew(be, reqs, n, results);
	} else {
		for (i = 0; i < n; i++)
			results[i] = be->extend(be, reqs[i], reqs[i]->ttl_ms);
	}
	pthread_mutex_unlock(&s->be_mu);
	int64_t t1 = dlock_clock_ms();

	pthread_mutex_lock(&s->reg_mu);
	for (i = 0; i < n; i++) {
		dlock__reg *r = regs[i];
		dlock_lock *l = r->lock;
		int rc = all ? all : results[i];
		r->in_batch = false;
		pthread_mutex_lock(&l->mu);
		bool fire = false, gone = false;
		if (l->state != DLOCK__HELD) {
			/* released meanwhile */
		} else if (rc == 0) {
			l->deadline = t0 + l->ttl_ms - dlock__drift_ms(l->ttl_ms);
			r->next_renew = t0 + l->ttl_ms / 3;
		} else if (rc == DLOCK_ENOTHELD || rc == DLOCK_ELOST) {
			gone = true;
			fire = dlock__lock_mark_lost(l);
		} else {
			int64_t retry = l->ttl_ms / 10;
			r->next_renew = t1 + (retry < RETRY_MAX_MS ? retry : RETRY_MAX_MS);
		}
		pthread_mutex_unlock(&l->mu);
		if (gone) {
			unlink_reg(s, r);
			if (fire)
				fire_lost(s, r);
		}
	}
	pthread_cond_broadcast(&s->reg_cv);
	free(regs);
	free(reqs);
	free(results);
}

static void *renewer_main(void *arg)
{
	dlock_store *s = arg;
	pthread_mutex_lock(&s->reg_mu);
	while (!s->renewer_stop) {
		int64_t now = dlock_clock_ms();
		if (expire(s, now))
			continue;
		renew_batch(s, now);
		now = dlock_clock_ms();
		int64_t next = INT64_MAX;
		for (dlock__reg *r = s->regs; r; r = r->next) {
			dlock_lock *l = r->lock;
			pthread_mutex_lock(&l->mu);
			int64_t d = l->deadline;
			pthread_mutex_unlock(&l->mu);
			if (r->next_renew < next)
				next = r->next_renew;
			if (d < next)
				next = d;
		}
		if (s->renewer_stop)
			break;
		s->renewer_wake = next;
		if (next == INT64_MAX) {
			pthread_cond_wait(&s->reg_cv, &s->reg_mu);
		} else if (next > now) {
			struct timespec ts;
			dlock__abstime(&ts, next - now);
			pthread_cond_timedwait(&s->reg_cv, &s->reg_mu, &ts);
		}
	}
	pthread_mutex_unlock(&s->reg_mu);
	return NULL;
}

void dlock__renewer_add(dlock_store *s, dlock__reg *reg)
{
	static uint64_t ids; /* under each store's reg_mu; uniqueness per store suffices */
	pthread_mutex_lock(&s->reg_mu);
	reg->id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
	reg->in_batch = false;
	reg->prev = NULL;
	reg->next = s->regs;
	if (s->regs)
		s->regs->prev = reg;
	s->regs = reg;
	reg->lock->registered = true;
	if (!s->renewer_started) {
		if (pthread_create(&s->renewer, NULL, renewer_main, s) == 0)
			s->renewer_started = true;
	}
	/* Wake the renewer only if it would sleep past this lock's first renewal. */
	if (reg->next_renew < s->renewer_wake)
		pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
}

void dlock__renewer_remove(dlock_store *s, dlock__reg *reg)
{
	pthread_mutex_lock(&s->reg_mu);
	bool on_renewer = s->renewer_started && pthread_equal(pthread_self(), s->renewer);
	if (!on_renewer) {
		while ((reg->id && s->cb_running == reg->id) || reg->in_batch)
			pthread_cond_wait(&s->reg_cv, &s->reg_mu);
	}
	if (reg->lock && reg->lock->registered)
		unlink_reg(s, reg);
	pthread_mutex_unlock(&s->reg_mu);
}

void dlock__renewer_stop(dlock_store *s)
{
	pthread_mutex_lock(&s->reg_mu);
	s->renewer_stop = true;
	pthread_cond_broadcast(&s->reg_cv);
	bool started = s->renewer_started;
	pthread_mutex_unlock(&s->reg_mu);
	if (started)
		pthread_join(s->renewer, NULL);
	/* Locks still held (their handles should have been freed first): release, best effort. */
	while (s->regs) {
		dlock__reg *r = s->regs;
		unlink_reg(s, r);
		pthread_mutex_lock(&s->be_mu);
		r->lock->req.deadline_ms = dlock_clock_ms() + s->request_timeout_ms;
		s->be->release(s->be, &r->lock->req);
		pthread_mutex_unlock(&s->be_mu);
		pthread_mutex_lock(&r->lock->mu);
		r->lock->state = DLOCK__IDLE;
		pthread_mutex_unlock(&r->lock->mu);
	}
}
