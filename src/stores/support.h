/*
 * support.h — what a store compiled into libdlock may use besides the public
 * headers (<dlock/sys/backend.h>): allocation and strings, errors, clocks,
 * name resolution by a deadline, status building, and the small helpers more
 * than one store needs. Implemented by the core; not installed.
 *
 * Stores include only this file and <dlock/...> headers: their include path
 * (CMake: the dlock_stores objects) does not reach src/core, so the core's
 * private header (src/core/internal.h) cannot be used by a store.
 *
 * Names in a store: its state is `<kind>_store` (the instance whose first
 * member is the dlock_backend: sqlite_store, redis_store, cluster_store,
 * redlock_store, etcd_store, zookeeper_store, memcached_store, mysql_store,
 * postgres_store) and its methods table `<kind>_methods`; a store of several
 * files prefixes what they share with `dlock__<short>_` (dlock__sq_,
 * dlock__et_, dlock__zk_, dlock__my_, dlock__pg_, dlock__r for Redis),
 * tables of a store's modes included (dlock__pg_advisory_methods).
 */
#ifndef DLOCK_STORES_SUPPORT_H
#define DLOCK_STORES_SUPPORT_H

#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

/* ---- strings and memory (return NULL only on ENOMEM, with the error set) ---- */
char *dlock__strdup(const char *s);
char *dlock__strndup(const char *s, size_t n);
char *dlock__sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *dlock__calloc(size_t n, size_t size);
/* Overwrite a secret (a password, an auth string) with zeros, then free it (NULL is fine). */
void dlock__free_secret(char *s);
/* Lowercase hex of len bytes into out (2*len+1 bytes). */
void dlock__hex(char *out, const void *bytes, size_t len);

/* ---- errors ---- */
int dlock__oom(void);
int dlock__error_vset(int code, const char *store, const char *store_code, const char *fmt,
		      va_list ap);

/* Keep the caller's error across cleanup that may record its own. */
typedef struct dlock__saved_error {
	int code;
	char message[512], store[32], store_code[64];
} dlock__saved_error;
void dlock__error_save(dlock__saved_error *e);
void dlock__error_restore(const dlock__saved_error *e);

/* ---- SIGPIPE ---- */
/*
 * A write to a socket the peer has closed raises SIGPIPE, which kills a
 * program that did not ignore it. Client libraries that write with write(2)
 * rather than send(MSG_NOSIGNAL) (hiredis, OpenSSL's socket BIO) are wrapped
 * so: begin blocks SIGPIPE on this thread, end takes back a SIGPIPE the
 * wrapped writes raised (never one that was pending before) and restores the
 * mask. The write itself then fails with EPIPE, which the store handles.
 */
#include <signal.h>
#include <stdbool.h>
typedef struct dlock__nopipe {
	sigset_t old;
	bool was_pending;
} dlock__nopipe;
void dlock__nopipe_begin(dlock__nopipe *np);
void dlock__nopipe_end(dlock__nopipe *np);

/* ---- idle connections ---- */
/*
 * Idle connections' sockets, looked at without waiting, all in one system
 * call: states[i] for fds[i] is 0 nothing to read (still open, as far as we
 * can tell), 1 something to read, 2 the peer hung up or the socket failed
 * (also for fds[i] < 0). Before reusing kept connections: a server that
 * restarted or dropped us has closed its end (2), and one that owes us no
 * reply has nothing to say (1: most likely its closing words). n <= 64.
 */
void dlock__sock_states(const int *fds, size_t n, int *states);

/* ---- waiting without a wake-up channel ---- */
/*
 * How soon a refused fair waiter of a store that cannot tell it of a release
 * (a polled store) should look again, from how many waiters are ahead of it:
 * the head, which takes the lock at its first look after the release, every
 * millisecond; the next in line every 2 ms; the others, which need about
 * `ahead` handoffs to reach the front, every per_place_ms × ahead (at most
 * 16 ms) — soon enough to be looking fast by the time they are next, few
 * enough looks not to load the server (a store whose look is costly, or
 * contends with the release, asks for a larger per_place_ms). For the
 * acquire's *retry_ms (sys/backend.h).
 */
int64_t dlock__poll_hint(int64_t ahead, int64_t per_place_ms);

/* ---- clock ---- */
/* Sleep ms milliseconds (restarting after signals). */
void dlock__sleep_ms(int64_t ms);
/* Absolute CLOCK_MONOTONIC timespec ms from now, for pthread_cond_timedwait. */
struct timespec;
void dlock__abstime(struct timespec *ts, int64_t ms_from_now);
/* Random integer in [lo, hi], for jitter and tie-breaks (not for secrets). */
int64_t dlock__rand_between(int64_t lo, int64_t hi);
/* The lease margin kept for clock drift: ttl/100 + 2 ms. */
int64_t dlock__drift_ms(int64_t ttl_ms);

/* ---- URIs ---- */
int dlock__uri_parse(dlock_uri **out, const char *text);
void dlock__uri_free(dlock_uri *uri);
/* DLOCK_EINVAL naming the first option no one used, else 0. */
int dlock__uri_check_unused(const dlock_uri *uri);

/* Store open functions, one per store file (src/stores/<name>.c). */
int dlock__sqlite_open(dlock_backend **out, dlock_uri *uri);
int dlock__redis_open(dlock_backend **out, dlock_uri *uri);
int dlock__redlock_open(dlock_backend **out, dlock_uri *uri);
int dlock__redis_cluster_open(dlock_backend **out, dlock_uri *uri);
int dlock__etcd_open(dlock_backend **out, dlock_uri *uri);
int dlock__zk_open(dlock_backend **out, dlock_uri *uri);
int dlock__postgres_open(dlock_backend **out, dlock_uri *uri);
int dlock__mysql_open(dlock_backend **out, dlock_uri *uri);
int dlock__memcached_open(dlock_backend **out, dlock_uri *uri);

/* ---- status helpers for stores ---- */
/* Grow *arr (of *count entries) by one zeroed entry; returns it or NULL (ENOMEM). */
dlock_lock_status *dlock__status_add(dlock_lock_status **arr, size_t *count);
dlock_holder *dlock__status_add_holder(dlock_lock_status *st);

/* Room for an owner token ("<client id hex>-<serial>") and its NUL. */
#define DLOCK__OWNER_MAX 64

/* ---- transport warnings (dlock_store_warning) ---- */
/* Whether host names this machine as written: empty, a Unix socket path,
 * "localhost", 127.x.x.x or ::1. A name that resolves to loopback is not. */
bool dlock__host_is_local(const char *host);
/* From a store's open function: this store handle sends its password or its
 * lock traffic over a connection nobody verifies (say which option
 * verifies). The core keeps the last one of the open; see
 * dlock_store_warning. */
void dlock__open_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Replace the secret in msg (of `size` bytes) by "***" wherever it stands as
 * a word of its own: server messages passed on must never be the first to
 * show a password, and a short one ("p") must not turn "packet" into
 * "***acket". */
void dlock__scrub(char *msg, size_t size, const char *secret);

/* ---- small helpers shared by stores ---- */
/* FNV-1a, 64 bits: h = DLOCK__FNV64_OFFSET to start, then chain. */
#define DLOCK__FNV64_OFFSET 14695981039346656037ULL
uint64_t dlock__fnv1a64(uint64_t h, const void *p, size_t n);
/* ms (>= 0) as a struct timeval, for client libraries' timeouts. */
struct timeval dlock__ms_timeval(int64_t ms);
/* Initialise cv on CLOCK_MONOTONIC (pair it with dlock__abstime). 0 or an errno. */
int dlock__cond_init_monotonic(pthread_cond_t *cv);
/* *dst = copy of the optional value v (NULL stays NULL). 0 or DLOCK_ENOMEM. */
int dlock__opt_dup(char **dst, const char *v);

/* A growable NUL-terminated string. Zero-initialise; `limit` (0: none) caps
 * its length. Appends after a failure do nothing; `failed` says why
 * (1: out of memory, 2: over the limit). Free p with free(). */
typedef struct dlock__sbuf {
	char *p;
	size_t len, cap, limit;
	int failed;
} dlock__sbuf;
/* Append n bytes; 0, or -1 once failed. */
int dlock__sb_put(dlock__sbuf *s, const void *bytes, size_t n);
/* Append printf-formatted text; 0, or -1 once failed. */
int dlock__sb_add(dlock__sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- name resolution by a deadline (resolve.c) ---- */
#define DLOCK__ADDRS_MAX 8
#define DLOCK__ADDR_LEN 46 /* INET6_ADDRSTRLEN */
typedef struct dlock__addrs {
	size_t n;
	char addr[DLOCK__ADDRS_MAX][DLOCK__ADDR_LEN]; /* numeric, in getaddrinfo's order, no duplicates */
	bool timed_out; /* the lookup did not answer by the deadline */
} dlock__addrs;
/* Resolve host (TCP, IPv4 and IPv6) to numeric addresses by deadline_ms
 * (CLOCK_MONOTONIC ms), whatever the DNS does: the lookup runs on a thread
 * of its own that the caller stops waiting for at the deadline (it is shared
 * with later calls for the same name while it runs; an answer is reused for
 * 5 s, a failure for 1 s). A numeric host returns
 * itself without a thread. n == 0 with 0 returned: host is empty, a socket
 * path ('/...') or longer than any name: give it to the library as it is.
 * Returns 0; DLOCK_EUNAVAILABLE "timed out resolving HOST" (store code
 * ETIMEDOUT) or "cannot resolve HOST: ..." (store code EAI_AGAIN / EAI);
 * DLOCK_ENOMEM. `store` names the store in the error. Thread-safe. */
int dlock__resolve(dlock__addrs *out, const char *host, int64_t deadline_ms, const char *store);
/* Start resolving host without waiting (a store about to resolve several
 * hosts one after another lets their lookups overlap). Never fails visibly. */
void dlock__resolve_prefetch(const char *host);
/* Resolve n hosts, looked up at once, into out[i] (rcs[i]: as dlock__resolve).
 * An ensemble needs only some of them: once any has answered by half the
 * time left, the others are not waited for; else every one gets until
 * deadline_ms. Returns how many resolved; 0 leaves the last error set. */
size_t dlock__resolve_all(dlock__addrs *out, int *rcs, const char *const *hosts, size_t n, int64_t deadline_ms,
			  const char *store);
/* a->addr joined by sep into buf (truncated to size); the length it needed. */
size_t dlock__addrs_join(char *buf, size_t size, const dlock__addrs *a, const char *sep);

#endif
