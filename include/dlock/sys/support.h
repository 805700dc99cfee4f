/*
 * dlock/sys/support.h — what the core lends every store, built in or loaded
 * as a module: allocation and strings, errors, clocks, name resolution by a
 * deadline, status building, and the small helpers more than one store
 * needs. A store written outside this repository keeps the contract's rules
 * (sys/backend.h: never block past the deadline the core hands it, a refused
 * fair waiter's poll hint, no password in a message) with these, exactly as
 * the stores of libdlock do; they are exported by libdlock and stable as the
 * contract is (functions are only added).
 */
#ifndef DLOCK_SYS_SUPPORT_H
#define DLOCK_SYS_SUPPORT_H

#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/select.h> /* sigset_t, also in strict C11 */
#include <sys/time.h>

DLOCK_BEGIN_DECLS

/* ---- strings and memory (return NULL only on ENOMEM, with the error set) ---- */
DLOCK_EXTERN char *dlock_sys_strdup(const char *s);
DLOCK_EXTERN char *dlock_sys_strndup(const char *s, size_t n);
DLOCK_EXTERN char *dlock_sys_sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
DLOCK_EXTERN void *dlock_sys_calloc(size_t n, size_t size);
/* Overwrite a secret (a password, an auth string) with zeros, then free it (NULL is fine). */
DLOCK_EXTERN void dlock_sys_free_secret(char *s);
/* Lowercase hex of len bytes into out (2*len+1 bytes). */
DLOCK_EXTERN void dlock_sys_hex(char *out, const void *bytes, size_t len);

/* ---- errors ---- */
DLOCK_EXTERN int dlock_sys_oom(void);
DLOCK_EXTERN int dlock_sys_error_vset(int code, const char *store, const char *store_code, const char *fmt, va_list ap);

/* Keep the caller's error across cleanup that may record its own. */
typedef struct dlock_sys_saved_error {
	int code;
	char message[512], store[32], store_code[64];
} dlock_sys_saved_error;
DLOCK_EXTERN void dlock_sys_error_save(dlock_sys_saved_error *e);
DLOCK_EXTERN void dlock_sys_error_restore(const dlock_sys_saved_error *e);

/* ---- SIGPIPE ---- */
/*
 * A write to a socket the peer has closed raises SIGPIPE, which kills a
 * program that did not ignore it. Client libraries that write with write(2)
 * rather than send(MSG_NOSIGNAL) (hiredis, OpenSSL's socket BIO) are wrapped
 * so: begin blocks SIGPIPE on this thread, end takes back a SIGPIPE the
 * wrapped writes raised (never one that was pending before) and restores the
 * mask. The write itself then fails with EPIPE, which the store handles.
 */
typedef struct dlock_sys_nopipe {
	sigset_t old;
	bool was_pending;
} dlock_sys_nopipe;
DLOCK_EXTERN void dlock_sys_nopipe_begin(dlock_sys_nopipe *np);
DLOCK_EXTERN void dlock_sys_nopipe_end(dlock_sys_nopipe *np);

/* ---- idle connections ---- */
/*
 * Idle connections' sockets, looked at without waiting, all in one system
 * call: states[i] for fds[i] is 0 nothing to read (still open, as far as we
 * can tell), 1 something to read, 2 the peer hung up or the socket failed
 * (also for fds[i] < 0). Before reusing kept connections: a server that
 * restarted or dropped us has closed its end (2), and one that owes us no
 * reply has nothing to say (1: most likely its closing words). n <= 64.
 */
DLOCK_EXTERN void dlock_sys_sock_states(const int *fds, size_t n, int *states);

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
DLOCK_EXTERN int64_t dlock_sys_poll_hint(int64_t ahead, int64_t per_place_ms);

/* ---- clock ---- */
/* Sleep ms milliseconds (restarting after signals). */
DLOCK_EXTERN void dlock_sys_sleep_ms(int64_t ms);
/* Absolute CLOCK_MONOTONIC timespec ms from now, for pthread_cond_timedwait. */
struct timespec;
DLOCK_EXTERN void dlock_sys_abstime(struct timespec *ts, int64_t ms_from_now);
/* Random integer in [lo, hi], for jitter and tie-breaks (not for secrets). */
DLOCK_EXTERN int64_t dlock_sys_rand_between(int64_t lo, int64_t hi);
/* The lease margin kept for clock drift: ttl/100 + 2 ms. */
DLOCK_EXTERN int64_t dlock_sys_drift_ms(int64_t ttl_ms);

/* ---- URIs ---- */
DLOCK_EXTERN int dlock_sys_uri_parse(dlock_uri **out, const char *text);
DLOCK_EXTERN void dlock_sys_uri_free(dlock_uri *uri);
/* DLOCK_EINVAL naming the first option no one used and those asked for
 * (dlock_uri_param), else 0. A store calls it once it has read its options,
 * before it connects (an unknown option is a usage error, not a reason to
 * reach a server); the core calls it again after the open. */
DLOCK_EXTERN int dlock_sys_uri_check_unused(const dlock_uri *uri);

/* ---- status helpers for stores ---- */
/* Grow *arr (of *count entries) by one zeroed entry; returns it or NULL (ENOMEM). */
DLOCK_EXTERN dlock_lock_status *dlock_sys_status_add(dlock_lock_status **arr, size_t *count);
DLOCK_EXTERN dlock_holder *dlock_sys_status_add_holder(dlock_lock_status *st);

/* Room for an owner token ("<client id hex>-<serial>") and its NUL. */
#define DLOCK_SYS_OWNER_MAX 64

/* ---- transport warnings (dlock_store_warning) ---- */
/* Whether host names this machine as written: empty, a Unix socket path,
 * "localhost", 127.x.x.x or ::1. A name that resolves to loopback is not. */
DLOCK_EXTERN bool dlock_sys_host_is_local(const char *host);
/* From a store's open function: this store handle sends its password or its
 * lock traffic over a connection nobody verifies (say which option
 * verifies). The core keeps the last one of the open; see
 * dlock_store_warning. */
DLOCK_EXTERN void dlock_sys_open_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Replace the secret in msg (of `size` bytes) by "***" wherever it stands as
 * a word of its own: server messages passed on must never be the first to
 * show a password, and a short one ("p") must not turn "packet" into
 * "***acket". */
DLOCK_EXTERN void dlock_sys_scrub(char *msg, size_t size, const char *secret);

/* ---- small helpers shared by stores ---- */
/* FNV-1a, 64 bits: h = DLOCK_SYS_FNV64_OFFSET to start, then chain. */
#define DLOCK_SYS_FNV64_OFFSET 14695981039346656037ULL
DLOCK_EXTERN uint64_t dlock_sys_fnv1a64(uint64_t h, const void *p, size_t n);
/* ms (>= 0) as a struct timeval, for client libraries' timeouts. */
DLOCK_EXTERN struct timeval dlock_sys_ms_timeval(int64_t ms);
/* Initialise cv on CLOCK_MONOTONIC (pair it with dlock_sys_abstime). 0 or an errno. */
DLOCK_EXTERN int dlock_sys_cond_init_monotonic(pthread_cond_t *cv);
/* *dst = copy of the optional value v (NULL stays NULL). 0 or DLOCK_ENOMEM. */
DLOCK_EXTERN int dlock_sys_opt_dup(char **dst, const char *v);

/* A growable NUL-terminated string. Zero-initialise; `limit` (0: none) caps
 * its length. Appends after a failure do nothing; `failed` says why
 * (1: out of memory, 2: over the limit). Free p with free(). */
typedef struct dlock_sys_sbuf {
	char *p;
	size_t len, cap, limit;
	int failed;
} dlock_sys_sbuf;
/* Append n bytes; 0, or -1 once failed. */
DLOCK_EXTERN int dlock_sys_sb_put(dlock_sys_sbuf *s, const void *bytes, size_t n);
/* Append printf-formatted text; 0, or -1 once failed. */
DLOCK_EXTERN int dlock_sys_sb_add(dlock_sys_sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- name resolution by a deadline (resolve.c) ---- */
#define DLOCK_SYS_ADDRS_MAX 8
#define DLOCK_SYS_ADDR_LEN 46 /* INET6_ADDRSTRLEN */
typedef struct dlock_sys_addrs {
	size_t n;
	char addr[DLOCK_SYS_ADDRS_MAX][DLOCK_SYS_ADDR_LEN]; /* numeric, in getaddrinfo's order, no duplicates */
	bool timed_out; /* the lookup did not answer by the deadline */
} dlock_sys_addrs;
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
DLOCK_EXTERN int dlock_sys_resolve(dlock_sys_addrs *out, const char *host, int64_t deadline_ms, const char *store);
/* Start resolving host without waiting (a store about to resolve several
 * hosts one after another lets their lookups overlap). Never fails visibly. */
DLOCK_EXTERN void dlock_sys_resolve_prefetch(const char *host);
/* Resolve n hosts, looked up at once, into out[i] (rcs[i]: as dlock_sys_resolve).
 * An ensemble needs only some of them: once any has answered by half the
 * time left, the others are not waited for; else every one gets until
 * deadline_ms. Returns how many resolved; 0 leaves the last error set. */
DLOCK_EXTERN size_t dlock_sys_resolve_all(dlock_sys_addrs *out, int *rcs, const char *const *hosts, size_t n,
					  int64_t deadline_ms, const char *store);
/* a->addr joined by sep into buf (truncated to size); the length it needed. */
DLOCK_EXTERN size_t dlock_sys_addrs_join(char *buf, size_t size, const dlock_sys_addrs *a, const char *sep);

DLOCK_END_DECLS

#endif
