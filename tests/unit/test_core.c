/*
 * The core's own logic against a fake store (an in-memory table, not a mock
 * of any real store): reentrancy without round trips, lease deadlines from
 * before the request, renewal batching, the lost signal, the wait loop.
 */
#include "unit/testutil.h"

#include <dlock/sys/backend.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

typedef struct fake {
	dlock_backend base;
	pthread_mutex_t mu;
	char holder[64];       /* one exclusive lock name at most per test */
	uint64_t fence;
	atomic_int acquires, releases, extends, renew_calls, renew_items, max_batch;
	atomic_int acquire_delay_ms;
	atomic_int renew_result;   /* what renew answers for every item */
} fake;

static int f_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry)
{
	fake *f = (fake *)be;
	f->acquires++;
	if (f->acquire_delay_ms)
		usleep((useconds_t)f->acquire_delay_ms * 1000);
	pthread_mutex_lock(&f->mu);
	int rc = 0;
	if (f->holder[0]) {
		rc = DLOCK_ELOCKED;
		*retry = 5;
	} else {
		snprintf(f->holder, sizeof(f->holder), "%s", req->owner);
		*fence = ++f->fence;
	}
	pthread_mutex_unlock(&f->mu);
	return rc;
}

static int f_release(dlock_backend *be, dlock_request *req)
{
	fake *f = (fake *)be;
	f->releases++;
	pthread_mutex_lock(&f->mu);
	int rc = strcmp(f->holder, req->owner) == 0 ? 0 : DLOCK_ENOTHELD;
	if (rc == 0)
		f->holder[0] = '\0';
	pthread_mutex_unlock(&f->mu);
	return rc;
}

static int f_extend(dlock_backend *be, dlock_request *req, int64_t ttl)
{
	fake *f = (fake *)be;
	f->extends++;
	pthread_mutex_lock(&f->mu);
	int rc = strcmp(f->holder, req->owner) == 0 ? 0 : DLOCK_ENOTHELD;
	pthread_mutex_unlock(&f->mu);
	return rc;
}

static int f_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	fake *f = (fake *)be;
	f->renew_calls++;
	f->renew_items += (int)n;
	if ((int)n > f->max_batch)
		f->max_batch = (int)n;
	for (size_t i = 0; i < n; i++)
		results[i] = f->renew_result;
	return 0;
}

static void f_close(dlock_backend *be)
{
	fake *f = (fake *)be;
	pthread_mutex_destroy(&f->mu);
	free(f);
}

static fake *fake_new(void)
{
	fake *f = calloc(1, sizeof(*f));
	f->base.version = DLOCK_BACKEND_VERSION;
	f->base.kind = "fake";
	f->base.acquire = f_acquire;
	f->base.release = f_release;
	f->base.extend = f_extend;
	f->base.renew = f_renew;
	f->base.close = f_close;
	pthread_mutex_init(&f->mu, NULL);
	return f;
}

typedef struct lost_box {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int fired;
	int held_in_cb;
} lost_box;

static void on_lost(dlock_lock *lock, void *payload)
{
	lost_box *b = payload;
	pthread_mutex_lock(&b->mu);
	b->fired++;
	b->held_in_cb = dlock_held(lock);
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

static int wait_lost(lost_box *b, int ms)
{
	long long until = tu_now_ms() + ms;
	pthread_mutex_lock(&b->mu);
	while (!b->fired && tu_now_ms() < until) {
		pthread_mutex_unlock(&b->mu);
		usleep(2000);
		pthread_mutex_lock(&b->mu);
	}
	int fired = b->fired;
	pthread_mutex_unlock(&b->mu);
	return fired;
}

static void test_reentrancy(void)
{
	fake *f = fake_new();
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "a", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	uint64_t fence = dlock_fence(l);
	CHECK(fence == 1);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(f->acquires == 1);           /* no round trip for reentrant holds */
	CHECK(dlock_fence(l) == fence);
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_release(l), 0);
	CHECK(f->releases == 0 && dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	CHECK(f->releases == 1 && !dlock_held(l) && dlock_fence(l) == 0);
	CHECK_RC(dlock_release(l), DLOCK_ENOTHELD);
	CHECK(f->releases == 1);

	/* Another handle on the same name is a different owner: refused, then a higher fence. */
	dlock_lock *l2;
	CHECK_RC(dlock_lock_new(&l2, s, "a", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_acquire(l2, 0), DLOCK_ELOCKED);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(l2, 120), DLOCK_ETIMEOUT);
	CHECK(tu_now_ms() - t0 >= 120);
	CHECK_RC(dlock_release(l), 0);
	CHECK_RC(dlock_acquire(l2, 0), 0);
	CHECK(dlock_fence(l2) > fence);
	dlock_lock_free(l2); /* frees a held lock: released */
	CHECK(f->releases == 3);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void test_bad_options(void)
{
	fake *f = fake_new();
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	dlock_lock *l = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = -5;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "negative TTL") != NULL && l == NULL);
	o = (dlock_lock_options)DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = DLOCK_TTL_MAX_MS + 1;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "too long") != NULL);
	o = (dlock_lock_options)DLOCK_LOCK_OPTIONS_INIT;
	o.version = 99;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), DLOCK_EINVAL);
	o = (dlock_lock_options)DLOCK_LOCK_OPTIONS_INIT;
	o.mode = DLOCK_SHARED;
	o.permits = 3;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), DLOCK_EINVAL);
	CHECK_RC(dlock_lock_new(&l, s, "", NULL), DLOCK_EINVAL);
	CHECK_RC(dlock_lock_new(&l, NULL, "a", NULL), DLOCK_EINVAL);
	CHECK_RC(dlock_acquire(NULL, 0), DLOCK_EINVAL);
	CHECK_RC(dlock_release(NULL), DLOCK_EINVAL);
	CHECK(dlock_held(NULL) == 0 && dlock_fence(NULL) == 0);
	dlock_lock_free(NULL);
	dlock_store_close(NULL);
	CHECK(f->acquires == 0);
	dlock_store_close(s);
}

static void test_deadline_from_before_request(void)
{
	fake *f = fake_new();
	f->acquire_delay_ms = 100;
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 1000;
	o.no_renew = 1;
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	/* 1000 ms lease minus drift (12 ms) minus the 100 ms the request took. */
	int64_t left = dlock_ttl_left(l);
	CHECK(left <= 1000 - 12 - 100 && left > 700);
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void test_renewal_batching_and_lost(void)
{
	fake *f = fake_new();
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	/* The fake holds one name; a second name through a second fake would hide batching,
	 * so both locks are renewed by one store: give each its own name but let the fake grant
	 * by resetting holder between acquires. */
	lost_box box = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 300;
	o.on_lost = on_lost;
	o.payload = &box;
	dlock_lock *a, *b;
	CHECK_RC(dlock_lock_new(&a, s, "a", &o), 0);
	CHECK_RC(dlock_lock_new(&b, s, "b", &o), 0);
	CHECK_RC(dlock_acquire(a, 0), 0);
	f->holder[0] = '\0';
	CHECK_RC(dlock_acquire(b, 0), 0);
	/* Wait for at least three renewal rounds (every 100 ms). */
	long long until = tu_now_ms() + 2000;
	while (f->renew_calls < 3 && tu_now_ms() < until)
		usleep(5000);
	CHECK(f->renew_calls >= 3);
	CHECK(f->max_batch == 2);                    /* both locks in one call */
	CHECK(dlock_held(a) && dlock_held(b));       /* renewed past the first 300 ms */
	CHECK(box.fired == 0);

	/* The store says "not yours": lost at once, callback fires, held() turns false. */
	f->renew_result = DLOCK_ENOTHELD;
	CHECK(wait_lost(&box, 2000) >= 1);
	until = tu_now_ms() + 1000;
	while (box.fired < 2 && tu_now_ms() < until)
		usleep(2000);
	CHECK(box.fired == 2 && box.held_in_cb == 0);
	CHECK(!dlock_held(a) && !dlock_held(b));
	CHECK_RC(dlock_release(a), DLOCK_ELOST);
	CHECK_RC(dlock_extend(b, 0), DLOCK_ELOST);
	dlock_lock_free(a);
	dlock_lock_free(b);
	dlock_store_close(s);
}

static void test_lost_when_store_silent(void)
{
	fake *f = fake_new();
	f->renew_result = DLOCK_EUNAVAILABLE; /* transient: retried until the deadline */
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	lost_box box = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 400;
	o.on_lost = on_lost;
	o.payload = &box;
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), 0);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(wait_lost(&box, 3000) == 1);
	long long at = tu_now_ms() - t0;
	/* lost no later than the lease (400 ms) and not before its deadline (400 - 6) */
	CHECK(at >= 394 - 5 && at <= 400 + 50);
	CHECK(f->renew_calls >= 2); /* it kept trying */
	CHECK(!dlock_held(l));
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void test_no_renew_still_signals(void)
{
	fake *f = fake_new();
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	lost_box box = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 150;
	o.no_renew = 1;
	o.on_lost = on_lost;
	o.payload = &box;
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(wait_lost(&box, 3000) == 1);
	CHECK(f->renew_calls == 0 && f->extends == 0); /* never renewed */
	CHECK(!dlock_held(l));
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void free_in_callback(dlock_lock *lock, void *payload)
{
	dlock_lock_free(lock);
	*(atomic_int *)payload = 1;
}

static void test_free_from_callback(void)
{
	fake *f = fake_new();
	f->renew_result = DLOCK_ENOTHELD;
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	atomic_int done = 0;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 60;
	o.on_lost = free_in_callback;
	o.payload = &done;
	dlock_lock *l;
	CHECK_RC(dlock_lock_new(&l, s, "a", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	long long until = tu_now_ms() + 2000;
	while (!done && tu_now_ms() < until)
		usleep(2000);
	CHECK(done == 1);
	dlock_store_close(s);
}

static void test_handles(void)
{
	fake *f = fake_new();
	dlock_store *s;
	CHECK_RC(dlock_store_open_backend(&s, &f->base, "fake://", 30000), 0);
	dlock_lock *l, *m;
	CHECK_RC(dlock_lock_new(&l, s, "a", NULL), 0);
	CHECK_RC(dlock_lock_new(&m, s, "a", NULL), 0);
	char *h = NULL;
	CHECK_RC(dlock_lock_detach(l, &h), DLOCK_ENOTHELD);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_lock_detach(l, &h), 0);
	CHECK(h && strncmp(h, "dl1.x.1.1.30000.", 16) == 0);
	CHECK(!dlock_held(l));
	dlock_lock_free(l); /* detached: not released */
	CHECK(f->releases == 0 && f->holder[0]);
	CHECK_RC(dlock_lock_attach(m, "garbage"), DLOCK_EINVAL);
	/* found by fuzz_handle: a TTL that overflows the deadline */
	CHECK_RC(dlock_lock_attach(m, "dl1.x.1.7.99999999999999999999999.0123456789abcdef0123456789abcdef-12"),
		 DLOCK_EINVAL);
	CHECK_RC(dlock_lock_attach(m, "dl1.s.3.1.30000.0123456789abcdef0123456789abcdef-1"), DLOCK_EINVAL);
	/* a shared handle on an exclusive-looking lock: the handle's mode wins; not ours in the store */
	CHECK_RC(dlock_lock_attach(m, "dl1.s.1.1.30000.0123456789abcdef0123456789abcdef-1"), 0);
	CHECK_RC(dlock_release(m), DLOCK_ENOTHELD);
	CHECK_RC(dlock_lock_attach(m, "dl1.x.1.1.30000.0123456789abcdef0123456789abcdef-1"), 0);
	CHECK_RC(dlock_extend(m, 0), DLOCK_ENOTHELD); /* not the owner: the store refuses */
	CHECK_RC(dlock_release(m), DLOCK_ENOTHELD);
	CHECK(f->holder[0]);                            /* nothing changed */
	CHECK_RC(dlock_lock_attach(m, h), 0);
	CHECK(dlock_fence(m) == 1);
	CHECK_RC(dlock_extend(m, 5000), 0);
	CHECK_RC(dlock_release(m), 0);
	CHECK(f->holder[0] == '\0');
	dlock_free(h);
	dlock_lock_free(m);
	dlock_store_close(s);
}

int main(void)
{
	test_reentrancy();
	test_bad_options();
	test_deadline_from_before_request();
	test_renewal_batching_and_lost();
	test_lost_when_store_silent();
	test_no_renew_still_signals();
	test_free_from_callback();
	test_handles();
	return tu_done("unit.core");
}
