/* netutil: helpers shared by the network and fault tests of tests/stores
 * (mysql_net.c, postgres_net.c, postgres_hang.c, postgres_advisory.c,
 * redlock_net.c, memcached_store.c, ...): opening a store or a lock or
 * failing the test at once, one "on_lost" box, the status counts they
 * assert on, and an acquire in a thread of its own.
 *
 * Built as the static library dlock_testutil (tests/stores/CMakeLists.txt) on
 * top of dlock_testutil. Not thread-safe unless a function says so. */
#ifndef DLOCK_TEST_NETUTIL_H
#define DLOCK_TEST_NETUTIL_H

#include <dlock/dlock.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Open the store at `uri`; on failure print the URI's error and exit(1). */
dlock_store *nu_open(const char *uri);

/* nu_open of the URI printf(fmt, ...) makes (at most 2047 bytes). */
dlock_store *nu_openf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Flags of nu_lock. */
enum {
	NU_LOST = 1,     /* on_lost = nu_on_lost (records in nu_lost_at) */
	NU_NO_RENEW = 2, /* options.no_renew */
};

/* A lock on `name` with ttl_ms `ttl` and `flags`; exit(1) on failure. */
dlock_lock *nu_lock(dlock_store *s, const char *name, int64_t ttl, unsigned flags);

/* A lock on `name` with ttl_ms `ttl` whose on_lost is `lost` (payload NULL;
 * may be NULL); exit(1) on failure. */
dlock_lock *nu_lock_cb(dlock_store *s, const char *name, int64_t ttl, dlock_lost_fn lost);

/* The on_lost box: tu_now_ms() of the first on_lost of a NU_LOST lock since
 * the test last set it to 0; 0 while none came. Thread-safe. */
extern atomic_llong nu_lost_at;
void nu_on_lost(dlock_lock *l, void *payload);

/* Wait until nu_lost_at is set or limit_ms passes; returns nu_lost_at. */
long long nu_wait_lost(long long limit_ms);

/* Waiters of `name` as store `s` sees them; -1 when status fails. */
long nu_waiters(dlock_store *s, const char *name);

/* 1 if status of `name` on `s` shows a holder whose owner is of the store
 * client `client_id` (dlock_store_client_id), else 0 (also on error). */
int nu_held_by(dlock_store *s, const char *name, const char *client_id);

/* An acquire in a thread of its own (a lock handle belongs to the thread that
 * acquires it: release_after releases it there when granted). Set lock,
 * wait and release_after, then nu_bg_start; read the results after
 * nu_bg_join, or `ended` (0 until the acquire returned, set before the
 * release) at any time. */
typedef struct nu_bg {
	dlock_lock *lock;
	int64_t wait;
	int release_after;
	int rc;
	long long started;
	atomic_llong ended;
	pthread_t t;
} nu_bg;

void nu_bg_start(nu_bg *b);
void nu_bg_join(nu_bg *b);

/*
 * A session the server ends while its holder runs frees the lock at once, so
 * the holder must hear of it at once too, not at its next renewal (TTL/3
 * later: 10 s here): postgres.session_kill (mode=advisory,
 * pg_terminate_backend) and mysql.session_kill (mode=get_lock, KILL).
 * nu_session_kill takes `nholds` locks (ttl 30 s) on k->uri, has k->kill
 * end the last one's session, and checks that its on_lost comes within a
 * bound made of what this run measures: k->kill's own time (from *t0 until
 * the server is done with the session), three admin round trips (k->ping:
 * the renewal that finds the connection dead is one) and ten times the
 * scheduling delay (oversleep of 1 ms naps: the watching thread, the
 * renewer and the on_lost thread wake in turn), plus 100 ms. The other
 * holds (sessions of their own) stay held; everything is released after.
 */
typedef struct nu_session_killer {
	const char *uri;   /* the store the holds are taken on */
	const char *tag;   /* lock names: "<tag>-<pid>-<nholds>-<i>" */
	const char *waits; /* what kill's time is, in the report ("kill", "free") */
	void (*ping)(void); /* one round trip of the test's admin connection */
	/* End the session holding `l` (named `name`): set *t0 = tu_now_ms() when
	 * the kill is sent; return once the server is done with the session
	 * (CHECKs its own steps). */
	void (*kill)(dlock_lock *l, const char *name, long long *t0);
} nu_session_killer;

void nu_session_kill(const nu_session_killer *k, int nholds);

#endif
