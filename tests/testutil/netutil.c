#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

atomic_llong nu_lost_at;

dlock_store *nu_open(const char *uri)
{
	dlock_store *s = NULL;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "open: %s\n", dlock_error_last()->message);
		exit(1);
	}
	return s;
}

dlock_store *nu_openf(const char *fmt, ...)
{
	char u[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(u, sizeof(u), fmt, ap);
	va_end(ap);
	return nu_open(u);
}

dlock_lock *nu_lock_cb(dlock_store *s, const char *name, int64_t ttl, dlock_lost_fn lost)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.on_lost = lost;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0) {
		fprintf(stderr, "lock_new %s: %s\n", name, dlock_error_last()->message);
		exit(1);
	}
	return l;
}

dlock_lock *nu_lock(dlock_store *s, const char *name, int64_t ttl, unsigned flags)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = ttl;
	o.no_renew = (flags & NU_NO_RENEW) != 0;
	if (flags & NU_LOST)
		o.on_lost = nu_on_lost;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, &o) != 0) {
		fprintf(stderr, "lock_new %s: %s\n", name, dlock_error_last()->message);
		exit(1);
	}
	return l;
}

void nu_on_lost(dlock_lock *l, void *payload)
{
	(void)l;
	(void)payload;
	long long zero = 0;
	atomic_compare_exchange_strong(&nu_lost_at, &zero, tu_now_ms());
}

long long nu_wait_lost(long long limit_ms)
{
	long long until = tu_now_ms() + limit_ms;
	while (!atomic_load(&nu_lost_at) && tu_now_ms() < until)
		usleep(2000);
	return atomic_load(&nu_lost_at);
}

long nu_waiters(dlock_store *s, const char *name)
{
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	if (dlock_store_status(s, names, 1, &st, &n) != 0)
		return -1;
	long w = n ? (long)st[0].waiters : 0;
	dlock_status_free(st, n);
	return w;
}

int nu_held_by(dlock_store *s, const char *name, const char *client_id)
{
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	if (dlock_store_status(s, names, 1, &st, &n) != 0)
		return 0;
	int found = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t h = 0; h < st[i].nholders; h++)
			found |= strncmp(st[i].holders[h].owner, client_id, strlen(client_id)) == 0;
	dlock_status_free(st, n);
	return found;
}

static void *bg_main(void *arg)
{
	nu_bg *b = arg;
	b->started = tu_now_ms();
	b->rc = dlock_acquire(b->lock, b->wait);
	atomic_store(&b->ended, tu_now_ms());
	if (b->rc == 0 && b->release_after)
		dlock_release(b->lock);
	return NULL;
}

void nu_bg_start(nu_bg *b)
{
	b->rc = -1;
	b->started = 0;
	atomic_store(&b->ended, 0);
	if (pthread_create(&b->t, NULL, bg_main, b) != 0) {
		fprintf(stderr, "pthread_create failed\n");
		exit(1);
	}
}

void nu_bg_join(nu_bg *b)
{
	pthread_join(b->t, NULL);
}

static long long admin_rtt_ms(const nu_session_killer *k)
{
	long long worst = 0;
	for (int i = 0; i < 5; i++) {
		long long t0 = tu_now_ms();
		k->ping();
		long long t = tu_now_ms() - t0;
		worst = t > worst ? t : worst;
	}
	return worst;
}

static long long nap_oversleep_ms(void)
{
	long long worst = 0;
	for (int i = 0; i < 20; i++) {
		long long t0 = tu_now_ms();
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
		long long t = tu_now_ms() - t0 - 1;
		worst = t > worst ? t : worst;
	}
	return worst;
}

void nu_session_kill(const nu_session_killer *k, int nholds)
{
	const int64_t ttl = 30000;
	char name[4][96];
	dlock_lock *l[4];
	if (nholds < 1 || nholds > 4) {
		fprintf(stderr, "nu_session_kill: 1 to 4 holds\n");
		exit(1);
	}
	dlock_store *s = nu_open(k->uri);
	for (int i = 0; i < nholds; i++) {
		snprintf(name[i], sizeof name[i], "%s-%d-%d-%d", k->tag, (int)getpid(), nholds, i);
		l[i] = nu_lock(s, name[i], ttl, i == nholds - 1 ? NU_LOST : 0);
		CHECK_RC(dlock_acquire(l[i], 0), 0);
	}
	atomic_store(&nu_lost_at, 0);
	long long rtt = admin_rtt_ms(k), sched = nap_oversleep_ms();
	long long t0 = 0;
	k->kill(l[nholds - 1], name[nholds - 1], &t0);
	long long killed = tu_now_ms() - t0;
	long long bound = killed + 3 * rtt + 10 * sched + 100;
	long long lost = nu_wait_lost(ttl);
	long long took = lost ? lost - t0 : -1;
	printf("  %d hold(s), session of one killed: on_lost after %lld ms (bound %lld: %s %lld, "
	       "rtt %lld, sched %lld; next renewal was due in ~%lld ms)\n",
	       nholds, took, bound, k->waits, killed, rtt, sched, (long long)(ttl / 3));
	CHECK(t0 != 0);
	CHECK(lost != 0);
	CHECK(took <= bound);
	CHECK(!dlock_held(l[nholds - 1]));
	/* The other holds (sessions of their own) are still held. */
	for (int i = 0; i < nholds - 1; i++)
		CHECK(dlock_held(l[i]));
	for (int i = 0; i < nholds; i++) {
		int rc = dlock_release(l[i]);
		CHECK(i == nholds - 1 ? (rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD) : rc == 0);
		dlock_lock_free(l[i]);
	}
	dlock_store_close(s);
}
