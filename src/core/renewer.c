#include "core/internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Two threads per store, started with its first hold:
 *
 * - the renewer talks to the store: every held lock is renewed at ttl/3,
 *   locks due within half an interval of each other in one batch (the store's renew:
 *   one round trip per server), and releases that failed (orphans) are
 *   retried until they succeed or the lease they may keep has ended;
 * - the watchdog never does I/O: it sleeps until the earliest lease deadline
 *   and marks a lock lost the moment its deadline passes without a confirmed
 *   renewal, however long the renewer is stuck in the network.
 *
 * on_lost callbacks run on runner threads (made before they are needed, see
 * runner_main), so a slow callback delays neither renewal nor another lock's
 * signal, nor a release, free or close of its own lock.
 */

#define RETRY_MAX_MS 1000
#define ORPHAN_RETRY_FIRST_MS 50

/* One signalled on_lost callback: queued until a runner takes it, then
 * running. It keeps a reference of its lock, so that the lock's memory
 * outlives a dlock_lock_free made while the callback runs. */
struct dlock__cb_run {
	cb_run *next;
	dlock_lock *lock;
	bool started;
};

/* A release the store did not confirm, retried in the background. */
struct dlock__orphan {
	dlock__orphan *next;
	dlock_request req;       /* name and owner point at the strings below */
	char *name;
	char owner[DLOCK_SYS_OWNER_MAX];
	dlock__orphan_kind kind;
	int64_t until;           /* CLOCK_MONOTONIC ms: the hold cannot outlive this */
	int64_t next_try;
	int64_t backoff;
};

static dlock__orphan *orphan_new(const dlock_request *req, dlock__orphan_kind kind, int64_t until);

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

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

/* Under reg_mu: sleep on reg_cv until it is signalled or CLOCK_MONOTONIC
 * `until` (INT64_MAX: until signalled); false, without sleeping, once
 * `until` has come. */
static bool reg_sleep(dlock_store *s, int64_t until)
{
	if (until == INT64_MAX) {
		pthread_cond_wait(&s->reg_cv, &s->reg_mu);
		return true;
	}
	int64_t now = dlock_clock_ms();
	if (now >= until)
		return false;
	struct timespec ts;
	dlock_sys_abstime(&ts, until - now);
	pthread_cond_timedwait(&s->reg_cv, &s->reg_mu, &ts);
	return true;
}

/* Under reg_mu: the callback of c has returned; forget it. */
static void cb_done(dlock_store *s, cb_run *c)
{
	for (cb_run **p = &s->cbs; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	free(c);
}

/* A callback runner thread. Joinable: dlock_store_close joins the idle
 * ones (no thread of a closed store is left behind but those still inside a
 * callback, which close detaches); one that leaves while the store is open
 * (a second idle one) detaches itself. */
struct dlock__runner {
	dlock__runner *next;
	dlock_store *s;
	pthread_t t;
	bool busy, exited, detached;
};

static void *runner_main(void *arg);

/* Under reg_mu: one more callback runner thread, waiting for work. */
static bool spawn_runner(dlock_store *s)
{
	dlock__runner *r = calloc(1, sizeof(*r));
	if (!r)
		return false;
	r->s = s;
	if (pthread_create(&r->t, NULL, runner_main, r) != 0) {
		free(r);
		return false;
	}
	r->next = s->runners;
	s->runners = r;
	s->cb_threads++;
	s->cb_idle++;
	return true;
}

static void unlink_runner(dlock_store *s, dlock__runner *r)
{
	for (dlock__runner **p = &s->runners; *p; p = &(*p)->next) {
		if (*p == r) {
			*p = r->next;
			break;
		}
	}
}

/*
 * Callback runners: made before they are needed (with the store's other
 * threads), so that a signal never waits for a thread to be created and never
 * runs on the watchdog. A runner that takes a callback first makes a spare
 * when it was the last one idle, so that the next signal finds one waiting
 * even while this callback blocks; if no spare can be made, the next callback
 * waits for the first runner free (its lock is already marked lost: only the
 * call is late). At most one runner stays idle. A runner still inside a
 * callback at dlock_store_close outlives it: the last such frees the store's
 * memory.
 */
static void *runner_main(void *arg)
{
	dlock__runner *me = arg;
	dlock_store *s = me->s;
	pthread_mutex_lock(&s->reg_mu);
	for (;;) {
		cb_run *c = NULL;
		for (cb_run *p = s->cbs; p; p = p->next)
			if (!p->started)
				c = p; /* the oldest: the list is newest first */
		if (!c) {
			if (s->renewer_stop || s->cb_idle > 1)
				break;
			pthread_cond_wait(&s->cb_cv, &s->reg_mu);
			continue;
		}
		c->started = true;
		me->busy = true;
		if (--s->cb_idle == 0 && !s->renewer_stop)
			spawn_runner(s);
		pthread_mutex_unlock(&s->reg_mu);
		dlock_lock *l = c->lock;
		l->opts.on_lost(l, l->opts.payload);
		dlock__lock_unref(l);
		pthread_mutex_lock(&s->reg_mu);
		cb_done(s, c);
		me->busy = false;
		s->cb_idle++;
	}
	s->cb_idle--;
	s->cb_threads--;
	bool last = false;
	if (me->detached) { /* by close: the store is gone but for its memory */
		free(me);
		last = --s->mem_users == 0 && s->mem_handoff;
	} else if (!s->renewer_stop) {
		unlink_runner(s, me);
		pthread_detach(me->t);
		free(me);
	} else {
		me->exited = true; /* close joins it */
		pthread_cond_broadcast(&s->reg_cv);
	}
	pthread_mutex_unlock(&s->reg_mu);
	if (last)
		dlock__store_free_mem(s);
	return NULL;
}

/* Under reg_mu, the store stopping: join the runners that leave, detach
 * those still inside a callback (they keep the store's memory). */
static void reap_runners(dlock_store *s)
{
	while (s->runners) {
		dlock__runner *r = s->runners;
		if (r->exited) {
			unlink_runner(s, r);
			pthread_join(r->t, NULL);
			free(r);
		} else if (r->busy) {
			unlink_runner(s, r);
			r->detached = true;
			s->mem_users++;
			pthread_detach(r->t);
		} else {
			pthread_cond_wait(&s->reg_cv, &s->reg_mu); /* an idle one leaving */
		}
	}
}

/* Under reg_mu: the lock of reg is gone (if `now` > 0: only if its deadline
 * has passed by then, checked again under its mutex). Mark it lost, unlink it
 * and hand its on_lost to a runner (never run here). */
static void lost(dlock_store *s, dlock__reg *reg, int64_t now, const char *why)
{
	dlock_lock *l = reg->lock;
	pthread_mutex_lock(&l->mu);
	if (now > 0 && (l->state != DLOCK__HELD || now < l->deadline)) {
		pthread_mutex_unlock(&l->mu);
		return;
	}
	bool fire = dlock__lock_mark_lost(l, why);
	pthread_mutex_unlock(&l->mu);
	unlink_reg(s, reg);
	if (!fire)
		return;
	cb_run *c = calloc(1, sizeof(*c));
	if (!c)
		return; /* out of memory: the lock is marked lost, the call is skipped */
	atomic_fetch_add(&l->refs, 1);
	c->lock = l;
	c->next = s->cbs;
	s->cbs = c;
	pthread_cond_signal(&s->cb_cv);
}

static int64_t lock_deadline(dlock_lock *l, bool *held)
{
	pthread_mutex_lock(&l->mu);
	int64_t d = l->deadline;
	*held = l->state == DLOCK__HELD;
	pthread_mutex_unlock(&l->mu);
	return d;
}

static int64_t lock_ttl(dlock_lock *l)
{
	pthread_mutex_lock(&l->mu);
	int64_t t = l->ttl_ms;
	pthread_mutex_unlock(&l->mu);
	return t;
}

static void *watchdog_main(void *arg)
{
	dlock_store *s = arg;
	pthread_mutex_lock(&s->reg_mu);
	while (!s->renewer_stop) {
		int64_t now = dlock_clock_ms();
		int64_t next = INT64_MAX;
		bool again = false;
		for (dlock__reg *r = s->regs; r; r = r->next) {
			bool held;
			int64_t d = lock_deadline(r->lock, &held);
			if (!held) {
				/* lost through extend: nothing to watch or renew any more */
				unlink_reg(s, r);
				again = true;
				break;
			}
			if (now >= d) {
				lost(s, r, now, DLOCK__LOST_DEADLINE);
				again = true; /* the list may have changed */
				break;
			}
			next = min64(next, d);
		}
		if (again)
			continue;
		s->watchdog_wake = next;
		reg_sleep(s, next);
	}
	pthread_mutex_unlock(&s->reg_mu);
	return NULL;
}

/* A hold being extended is not renewed: the extend and a renewal in flight
 * would race on the store (sys/backend.h, "Extend and renewal"). */
static bool due(dlock__reg *r, int64_t now)
{
	return !r->extending && r->next_renew != INT64_MAX && r->next_renew - now <= lock_ttl(r->lock) / 6;
}

/* The renewer's own instance (DLOCK_BACKEND_F_RENEW_APART), opened on a
 * thread of its own: renewals go to the store handle's instance until it is
 * there, so that opening it (connect, handshake, setup: round trips over a
 * possibly slow link) never delays one. */
static void *open_rbe(void *arg)
{
	dlock_store *s = arg;
	dlock_backend *be = NULL;
	if (dlock__backend_open(s->open_text, 0, &be, NULL, NULL) == 0 && be->methods != s->be->methods) {
		be->methods->close(be); /* another mode than the handle's: not ours to use */
		be = NULL;
	}
	pthread_mutex_lock(&s->reg_mu);
	bool orphaned = s->opener_orphaned;
	if (be && !orphaned) {
		dlock__board_attach(be, s->board);
		pthread_mutex_lock(&s->rbe_mu);
		s->rbe = be;
		pthread_mutex_unlock(&s->rbe_mu);
	}
	atomic_store(&s->rbe_opening, false);
	pthread_cond_broadcast(&s->reg_cv); /* close may be waiting for us */
	pthread_mutex_unlock(&s->reg_mu);
	if (!orphaned)
		return NULL;
	/* The store was closed while we opened (see dlock__renewer_join_opener). */
	if (be)
		be->methods->close(be);
	pthread_mutex_lock(&s->reg_mu);
	bool last = --s->mem_users == 0 && s->mem_handoff;
	pthread_mutex_unlock(&s->reg_mu);
	if (last)
		dlock__store_free_mem(s);
	return NULL;
}

/* Join a finished opener; start one when the instance is missing. */
static void rbe_tend(dlock_store *s)
{
	if (!s->open_text || atomic_load(&s->rbe_opening))
		return;
	if (s->rbe_opener_started) {
		pthread_join(s->rbe_opener, NULL);
		s->rbe_opener_started = false;
		pthread_mutex_lock(&s->rbe_mu);
		bool failed = !s->rbe;
		pthread_mutex_unlock(&s->rbe_mu);
		if (failed)
			s->rbe_retry_at = dlock_clock_ms() + 10000;
	}
	pthread_mutex_lock(&s->rbe_mu);
	bool have = s->rbe != NULL;
	pthread_mutex_unlock(&s->rbe_mu);
	/* Not while the store leaves requests unanswered: such an open would
	 * only wait out its connect_timeout, and close could not wait for it
	 * (a thread left inside a client library at exit meets its clean-up). */
	if (have || dlock_clock_ms() < s->rbe_retry_at || dlock__silent(s))
		return;
	atomic_store(&s->rbe_opening, true);
	if (pthread_create(&s->rbe_opener, NULL, open_rbe, s) == 0) {
		s->rbe_opener_started = true;
	} else {
		atomic_store(&s->rbe_opening, false);
		s->rbe_retry_at = dlock_clock_ms() + 10000;
	}
}

/* The instance renewals go to now, with its mutex locked. */
static dlock_backend *renew_instance(dlock_store *s, pthread_mutex_t **mu)
{
	rbe_tend(s);
	pthread_mutex_lock(&s->rbe_mu);
	dlock_backend *be = s->rbe;
	if (be) {
		*mu = &s->rbe_mu; /* kept locked */
		return be;
	}
	pthread_mutex_unlock(&s->rbe_mu);
	*mu = &s->be_mu;
	pthread_mutex_lock(*mu);
	return s->be;
}

/* After the renewer stopped: the opener too, waited for within what is left
 * of close's bound (none if the store left the last request unanswered: a
 * connect to a silent store may take the whole connect_timeout). One still
 * opening after that is not waited for: it closes what it opens itself, and
 * keeps the store's memory until then. Waiting is the rule because a thread
 * left running inside a TLS library when the program exits meets that
 * library's exit-time clean-up (a crash, seen in conformance.redis-tls). */
void dlock__renewer_join_opener(dlock_store *s, int64_t by)
{
	if (!s->rbe_opener_started)
		return;
	s->rbe_opener_started = false;
	pthread_mutex_lock(&s->reg_mu);
	while (atomic_load(&s->rbe_opening) && reg_sleep(s, by)) {
	}
	bool opening = atomic_load(&s->rbe_opening);
	if (opening) {
		s->opener_orphaned = true;
		s->mem_users++;
	}
	pthread_mutex_unlock(&s->reg_mu);
	if (opening)
		pthread_detach(s->rbe_opener);
	else
		pthread_join(s->rbe_opener, NULL);
}

static void renew_batch(dlock_store *s, int64_t now)
{
	size_t n = 0;
	for (dlock__reg *r = s->regs; r; r = r->next)
		if (due(r, now))
			n++;
	if (n == 0)
		return;
	dlock__reg **regs = calloc(n, sizeof(*regs));
	const dlock_request **reqs = calloc(n, sizeof(*reqs));
	dlock_request *copies = calloc(n, sizeof(*copies));
	int *results = calloc(n, sizeof(*results));
	if (!regs || !reqs || !copies || !results) {
		free(regs);
		free(reqs);
		free(copies);
		free(results);
		return; /* try again next tick; the watchdog still protects us */
	}
	size_t i = 0;
	for (dlock__reg *r = s->regs; r && i < n; r = r->next) {
		if (due(r, now)) {
			r->in_batch = true;
			regs[i] = r;
			/* The store sees a copy: dlock_extend changes the lock's under l->mu. */
			pthread_mutex_lock(&r->lock->mu);
			copies[i] = r->lock->req;
			pthread_mutex_unlock(&r->lock->mu);
			reqs[i] = &copies[i];
			i++;
		}
	}
	n = i;
	pthread_mutex_unlock(&s->reg_mu);

	int64_t t0 = dlock_clock_ms();
	pthread_mutex_t *mu;
	dlock_backend *be = renew_instance(s, &mu);
	for (i = 0; i < n; i++) {
		/* Not past the hold's own deadline: by then the watchdog has called
		 * it lost, and a renewal still in flight would only hold up a
		 * release, a free or a close of it. */
		pthread_mutex_lock(&regs[i]->lock->mu);
		int64_t d = regs[i]->lock->deadline;
		pthread_mutex_unlock(&regs[i]->lock->mu);
		copies[i].deadline_ms = t0 + s->request_timeout_ms;
		if (d > t0 && d < copies[i].deadline_ms)
			copies[i].deadline_ms = d;
	}
	size_t step = s->mt.renew_max ? s->mt.renew_max : n;
	for (i = 0; i < n; i += step) {
		size_t k = n - i < step ? n - i : step;
		dlock__counted(s);
		int all = s->mt.renew(be, reqs + i, k, results + i);
		dlock__heard(s, all ? all : results[i]);
		for (size_t j = 0; all && j < k; j++)
			results[i + j] = all;
	}
	pthread_mutex_unlock(mu);
	int64_t t1 = dlock_clock_ms();

	pthread_mutex_lock(&s->reg_mu);
	for (i = 0; i < n; i++) {
		dlock__reg *r = regs[i];
		dlock_lock *l = r->lock;
		int rc = results[i];
		r->in_batch = false;
		pthread_mutex_lock(&l->mu);
		bool held = l->state == DLOCK__HELD && r->lock->registered;
		int64_t ttl = copies[i].ttl_ms; /* what the store was asked for */
		if (l->state == DLOCK__LOST && rc == 0) {
			/* Confirmed after the watchdog had called it lost: the store now
			 * keeps it one more lease for nobody. Give it back. */
			dlock__orphan *o = orphan_new(&l->req, DLOCK__ORPHAN_RELEASE, t0 + ttl + s->request_timeout_ms);
			if (o) {
				o->next = s->orphans;
				s->orphans = o;
			}
		}
		if (held && rc == 0) {
			/* A request of this hold with a shorter ttl whose outcome is
			 * unknown may still land after this one: count only that. */
			int64_t eff = l->unsure_ttl_ms > 0 && l->unsure_ttl_ms < ttl ? l->unsure_ttl_ms : ttl;
			int64_t d = t0 + eff - dlock_sys_drift_ms(eff);
			if (d > l->deadline)
				l->deadline = d;
			r->next_renew = t0 + eff / 3;
		} else if (held && rc != DLOCK_ENOTHELD && rc != DLOCK_ELOST) {
			if (l->unsure_ttl_ms == 0 || ttl < l->unsure_ttl_ms)
				l->unsure_ttl_ms = ttl;
			if (l->unsure_end == 0 || t0 + ttl < l->unsure_end)
				l->unsure_end = t0 + ttl;
			int64_t retry = ttl / 10;
			r->next_renew = t1 + min64(retry, RETRY_MAX_MS);
		}
		pthread_mutex_unlock(&l->mu);
		if (held && (rc == DLOCK_ENOTHELD || rc == DLOCK_ELOST))
			lost(s, r, 0, DLOCK__LOST_GONE);
	}
	pthread_cond_broadcast(&s->reg_cv);
	free(regs);
	free(reqs);
	free(copies);
	free(results);
}

static void orphan_free(dlock__orphan *o)
{
	free(o->name);
	free(o);
}

/* One try at an orphan (without reg_mu), by `by` at the latest: a cancel is
 * made once (a waiter's registration expires anyway) and answers 0; a
 * release answers the store. */
static int orphan_call(dlock_store *s, dlock__orphan *o, int64_t by)
{
	int rc = 0;
	pthread_mutex_lock(&s->be_mu);
	o->req.deadline_ms = min64(dlock_clock_ms() + s->request_timeout_ms, by);
	dlock__counted(s);
	if (o->kind == DLOCK__ORPHAN_CANCEL) {
		s->mt.cancel(s->be, &o->req);
	} else {
		o->req.slot = NULL;
		rc = dlock__heard(s, s->mt.release(s->be, &o->req));
	}
	pthread_mutex_unlock(&s->be_mu);
	return rc;
}

/* Under reg_mu: retry the releases that are due; drop those done or moot. */
static void retry_orphans(dlock_store *s, int64_t now)
{
	/* While the store keeps failing, or a caller waits for the backend, stand back. */
	if (now < s->orphan_pause_until || atomic_load(&s->fg_waiting) > 0)
		return;
	for (dlock__orphan **p = &s->orphans; *p;) {
		dlock__orphan *o = *p;
		if (now >= o->until && o->kind == DLOCK__ORPHAN_RELEASE) {
			*p = o->next;
			orphan_free(o);
			continue;
		}
		if (o->next_try > now) {
			p = &o->next;
			continue;
		}
		*p = o->next; /* ours while we talk to the store */
		s->orphan_busy = o->owner;
		pthread_mutex_unlock(&s->reg_mu);
		dlock_sys_saved_error saved;
		dlock_sys_error_save(&saved);
		int rc = orphan_call(s, o, INT64_MAX);
		dlock_sys_error_restore(&saved);
		pthread_mutex_lock(&s->reg_mu);
		s->orphan_busy = NULL;
		if (rc == 0 || rc == DLOCK_ENOTHELD || rc == DLOCK_EINVAL || o->kind == DLOCK__ORPHAN_CANCEL) {
			orphan_free(o);
		} else {
			o->next_try = dlock_clock_ms() + o->backoff;
			/* the others would fail the same way: none before this one's next try */
			s->orphan_pause_until = o->next_try;
			o->backoff = min64(o->backoff * 2, RETRY_MAX_MS);
			o->next = s->orphans;
			s->orphans = o;
			pthread_cond_broadcast(&s->reg_cv);
			return;
		}
		pthread_cond_broadcast(&s->reg_cv);
		p = &s->orphans; /* the list may have changed while unlocked */
		now = dlock_clock_ms();
		if (atomic_load(&s->fg_waiting) > 0)
			return;
	}
}

static void *renewer_main(void *arg)
{
	dlock_store *s = arg;
	pthread_mutex_lock(&s->reg_mu);
	while (!s->renewer_stop) {
		int64_t now = dlock_clock_ms();
		renew_batch(s, now);
		retry_orphans(s, dlock_clock_ms());
		now = dlock_clock_ms();
		int64_t next = INT64_MAX;
		for (dlock__reg *r = s->regs; r; r = r->next)
			if (!r->extending) /* extend_end wakes us */
				next = min64(next, r->next_renew);
		for (dlock__orphan *o = s->orphans; o; o = o->next) {
			int64_t t = o->kind == DLOCK__ORPHAN_CANCEL ? o->next_try : min64(o->next_try, o->until);
			if (t < s->orphan_pause_until)
				t = s->orphan_pause_until;
			if (atomic_load(&s->fg_waiting) > 0 && t < now + ORPHAN_RETRY_FIRST_MS)
				t = now + ORPHAN_RETRY_FIRST_MS; /* after the caller that waits for the backend */
			next = min64(next, t);
		}
		if (s->renewer_stop)
			break;
		s->renewer_wake = next;
		reg_sleep(s, next);
	}
	pthread_mutex_unlock(&s->reg_mu);
	return NULL;
}

/*
 * A store saw a hold's session or connection end (a socket hung up): renew
 * every hold now rather than at its time, so that a lost one is reported at
 * once. A hold whose renewal is in flight keeps the time that renewal sets.
 */
void dlock__renewer_renew_now(dlock_store *s)
{
	pthread_mutex_lock(&s->reg_mu);
	int64_t now = dlock_clock_ms();
	bool any = false;
	for (dlock__reg *r = s->regs; r; r = r->next)
		if (r->next_renew != INT64_MAX && r->next_renew > now && !r->in_batch) {
			r->next_renew = now;
			any = true;
		}
	if (any)
		pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
}

/* Under reg_mu. */
static int start_threads(dlock_store *s)
{
	if (s->cb_threads == 0 && !spawn_runner(s))
		return dlock_error_set(DLOCK_ENOMEM, NULL, NULL, "cannot start the lost-signal thread");
	if (!s->renewer_started) {
		if (pthread_create(&s->renewer, NULL, renewer_main, s) != 0)
			return dlock_error_set(DLOCK_ENOMEM, NULL, NULL, "cannot start the renewal thread");
		s->renewer_started = true;
	}
	if (!s->watchdog_started) {
		if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0)
			return dlock_error_set(DLOCK_ENOMEM, NULL, NULL, "cannot start the lease watchdog thread");
		s->watchdog_started = true;
	}
	return 0;
}

int dlock__renewer_add(dlock_store *s, dlock__reg *reg)
{
	static uint64_t ids;
	pthread_mutex_lock(&s->reg_mu);
	int rc = start_threads(s);
	if (rc) {
		pthread_mutex_unlock(&s->reg_mu);
		return rc;
	}
	reg->id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
	reg->in_batch = false;
	reg->extending = false;
	reg->prev = NULL;
	reg->next = s->regs;
	if (s->regs)
		s->regs->prev = reg;
	s->regs = reg;
	reg->lock->registered = true;
	bool held;
	int64_t d = lock_deadline(reg->lock, &held);
	/* Wake a thread only if it would sleep past this lock's first event. */
	if (reg->next_renew < s->renewer_wake || d < s->watchdog_wake)
		pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
	return 0;
}

bool dlock__renewer_remove(dlock_store *s, dlock__reg *reg, int64_t by)
{
	pthread_mutex_lock(&s->reg_mu);
	bool on_renewer = s->renewer_started && pthread_equal(pthread_self(), s->renewer);
	while (reg->in_batch && !on_renewer) {
		if (!reg_sleep(s, by)) {
			pthread_mutex_unlock(&s->reg_mu);
			return false;
		}
	}
	if (reg->lock && reg->lock->registered)
		unlink_reg(s, reg);
	pthread_mutex_unlock(&s->reg_mu);
	return true;
}

bool dlock__renewer_extend_begin(dlock_store *s, dlock__reg *reg, int64_t by)
{
	pthread_mutex_lock(&s->reg_mu);
	while (reg->lock && reg->lock->registered && reg->in_batch) {
		if (!reg_sleep(s, by)) {
			pthread_mutex_unlock(&s->reg_mu);
			return false;
		}
	}
	reg->extending = true;
	pthread_mutex_unlock(&s->reg_mu);
	return true;
}

void dlock__renewer_extend_end(dlock_store *s, dlock__reg *reg, int64_t next_renew)
{
	pthread_mutex_lock(&s->reg_mu);
	reg->extending = false;
	if (reg->lock && reg->lock->registered && reg->next_renew != INT64_MAX && next_renew < reg->next_renew)
		reg->next_renew = next_renew;
	/* the renewer may have skipped it, the watchdog may need an earlier deadline */
	pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
}

int dlock__orphan_add(dlock_store *s, const dlock_request *req, dlock__orphan_kind kind, int64_t until)
{
	dlock__orphan *o = orphan_new(req, kind, until);
	if (!o)
		return DLOCK_ENOMEM;
	pthread_mutex_lock(&s->reg_mu);
	int rc = start_threads(s);
	if (rc) {
		pthread_mutex_unlock(&s->reg_mu);
		orphan_free(o);
		return rc;
	}
	o->next = s->orphans;
	s->orphans = o;
	pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
	return 0;
}

static dlock__orphan *orphan_new(const dlock_request *req, dlock__orphan_kind kind, int64_t until)
{
	dlock__orphan *o = calloc(1, sizeof(*o));
	if (!o || !(o->name = strdup(req->name))) {
		free(o);
		return NULL;
	}
	o->req = *req;
	snprintf(o->owner, sizeof(o->owner), "%s", req->owner);
	o->req.name = o->name;
	o->req.owner = o->owner;
	o->kind = kind;
	if (kind == DLOCK__ORPHAN_RELEASE)
		o->req.slot = NULL;
	o->req.confirm = 1;
	o->until = until;
	o->backoff = ORPHAN_RETRY_FIRST_MS;
	/* Not at once: the caller that just failed to get an answer is likely to
	 * close the store next, and close would wait for a try in flight. */
	o->next_try = dlock_clock_ms() + ORPHAN_RETRY_FIRST_MS;
	return o;
}

int dlock__orphan_take(dlock_store *s, const char *owner, dlock__orphan **out)
{
	*out = NULL;
	pthread_mutex_lock(&s->reg_mu);
	for (;;) {
		bool busy;
		for (dlock__orphan **p = &s->orphans; *p; p = &(*p)->next) {
			if ((*p)->kind == DLOCK__ORPHAN_RELEASE && strcmp((*p)->owner, owner) == 0) {
				*out = *p;
				*p = (*p)->next;
				pthread_mutex_unlock(&s->reg_mu);
				return 1;
			}
		}
		/* The renewer may be retrying it right now (unlinked while it talks). */
		busy = s->renewer_started && s->orphan_busy && strcmp(s->orphan_busy, owner) == 0;
		if (!busy)
			break;
		pthread_cond_wait(&s->reg_cv, &s->reg_mu);
	}
	pthread_mutex_unlock(&s->reg_mu);
	return 0;
}

const dlock_request *dlock__orphan_request(dlock__orphan *o)
{
	return &o->req;
}

void dlock__orphan_put(dlock_store *s, dlock__orphan *o)
{
	pthread_mutex_lock(&s->reg_mu);
	o->next_try = dlock_clock_ms() + o->backoff;
	o->next = s->orphans;
	s->orphans = o;
	pthread_cond_broadcast(&s->reg_cv);
	pthread_mutex_unlock(&s->reg_mu);
}

void dlock__orphan_free(dlock__orphan *o)
{
	if (o)
		orphan_free(o);
}

int64_t dlock__renewer_stop(dlock_store *s)
{
	pthread_mutex_lock(&s->reg_mu);
	s->renewer_stop = true;
	pthread_cond_broadcast(&s->reg_cv);
	bool started = s->renewer_started, dog = s->watchdog_started;
	pthread_mutex_unlock(&s->reg_mu);
	if (started)
		pthread_join(s->renewer, NULL);
	if (dog)
		pthread_join(s->watchdog, NULL);
	pthread_mutex_lock(&s->reg_mu);
	/* Idle runners leave (joined); busy ones when their callback returns
	 * (not waited for). */
	pthread_cond_broadcast(&s->cb_cv);
	reap_runners(s);
	pthread_mutex_unlock(&s->reg_mu);
	/* What is left gets one shared bound: a request timeout; none at all if
	 * the store left the last request unanswered (it would not answer these
	 * either: a release is left to its lease, a cancel to the queue's TTL —
	 * the store is only handed the cancel, with no time left, to free its
	 * per-attempt state). */
	int64_t by = dlock_clock_ms() + (dlock__silent(s) ? 0 : s->request_timeout_ms);
	/* Locks still held (their handles should have been freed first): release, best effort. */
	while (s->regs) {
		dlock__reg *r = s->regs;
		unlink_reg(s, r);
		pthread_mutex_lock(&s->be_mu);
		r->lock->req.deadline_ms = min64(dlock_clock_ms() + s->request_timeout_ms, by);
		dlock__counted(s);
		dlock__heard(s, s->mt.release(s->be, &r->lock->req));
		pthread_mutex_unlock(&s->be_mu);
		r->lock->req.slot = NULL; /* the store freed it (sys/backend.h) */
		pthread_mutex_lock(&r->lock->mu);
		r->lock->state = DLOCK__IDLE;
		pthread_mutex_unlock(&r->lock->mu);
	}
	/* One last try for releases still unconfirmed. */
	while (s->orphans) {
		dlock__orphan *o = s->orphans;
		s->orphans = o->next;
		/* A cancel is always handed over (the store frees its slot), with
		 * no time left if need be; a release only while time is left. */
		int64_t now = dlock_clock_ms();
		if (o->kind == DLOCK__ORPHAN_CANCEL || (now < o->until && now < by))
			orphan_call(s, o, by);
		orphan_free(o);
	}
	return by;
}

bool dlock__renewer_forget(dlock_store *s)
{
	/* Taken by a thread of the parent at the fork (no thread here will
	 * ever give it back): the queues may be half changed. Leave them. */
	if (pthread_mutex_trylock(&s->reg_mu) != 0)
		return false;
	while (s->orphans) {
		dlock__orphan *o = s->orphans;
		s->orphans = o->next;
		dlock__forget(o->req.slot); /* a cancel's per-attempt state: the store's */
		orphan_free(o);
	}
	while (s->runners) { /* the parent's threads */
		dlock__runner *r = s->runners;
		s->runners = r->next;
		free(r);
	}
	while (s->cbs) { /* their runners are the parent's threads */
		cb_run *c = s->cbs;
		s->cbs = c->next;
		free(c);
	}
	pthread_mutex_unlock(&s->reg_mu);
	return true;
}

void dlock__renewer_release_store(dlock_store *s)
{
	pthread_mutex_lock(&s->reg_mu);
	bool later = s->mem_users > 0;
	s->mem_handoff = later;
	pthread_cond_broadcast(&s->cb_cv);
	pthread_mutex_unlock(&s->reg_mu);
	if (!later)
		dlock__store_free_mem(s);
}
