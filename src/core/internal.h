/*
 * Private to the core (src/core): what its files share. Stores never include
 * this file (their include path does not reach it); what they may use is in
 * src/stores/support.h, which this file includes.
 */
#ifndef DLOCK_CORE_INTERNAL_H
#define DLOCK_CORE_INTERNAL_H

#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include "stores/support.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#define DLOCK__DEFAULT_TTL_MS 30000
#define DLOCK__DEFAULT_CONNECT_TIMEOUT_MS 5000
#define DLOCK__DEFAULT_REQUEST_TIMEOUT_MS 2000
/* A waiter's registration in the store lives this long without a retry. */
#define DLOCK__QUEUE_TTL_MS 3000

/* ---- the simulated clock (clock.c), for the core's tests ----
 * dlock__clock_simulate(true, t) stops dlock_clock_ms at t: from then on it
 * moves only when dlock__clock_advance moves it, dlock_sys_sleep_ms waits for
 * it, and the timed waits built on dlock_sys_abstime (the renewer's, the
 * watchdog's, the board's) look at it again at least each millisecond of
 * real time. Waits on a mutex (lock_be_by's timedlock) stay on the real
 * clock. dlock__clock_simulate(false, 0) gives the real clock back. Lease
 * deadlines, renewal times and the lost signal then come at exact,
 * load-independent times. */
void dlock__clock_simulate(bool on, int64_t start_ms);
void dlock__clock_advance(int64_t ms);

/* ---- URIs ---- */
/* The URI text with any password replaced by "***" (malloc'd). */
char *dlock__uri_redact(const char *text);

/* ---- scheme table (schemes.c) ---- */
/* The open function of a URI scheme: a store built into this libdlock, one
 * registered with dlock_backend_register, or one of a store module, which is
 * loaded (LIBDIR/dlock/store-<kind>.so) on the first use of its schemes.
 * 0; DLOCK_EINVAL for an unknown scheme; DLOCK_ENOTSUPPORTED (message set)
 * for a store this build left out or whose module cannot be loaded. */
int dlock__scheme_open(const char *scheme, dlock_backend_open_fn *out);
/* Parse `text`, find its scheme (built in or registered) and open a backend
 * (connect_timeout cut to timeout_ms when > 0); the URI's ttl and request
 * timeout come back too (either pointer may be NULL). */
int dlock__backend_open(const char *text, int64_t timeout_ms, dlock_backend **out, int64_t *ttl_ms,
			int64_t *request_timeout_ms);
/* The warning the last open on this thread left (dlock_sys_open_warning), into
 * buf ("" if none), clearing it. */
void dlock__open_warning_take(char *buf, size_t size);

/* The one check of a methods table (version, required methods), for
 * dlock_backend_init and the open of a store over a backend: 0, or
 * DLOCK_EINVAL with the reason. (board.c) */
int dlock__methods_check(const dlock_backend_methods *m);
/* How much of a methods table of `version` (checked) exists: the core copies
 * that much and reads the rest as NULL (sys/backend.h, "Versions"). */
size_t dlock__methods_size(unsigned int version);

/* ---- the wake-up board of a store handle (board.c) ---- */
typedef struct dlock__board dlock__board;
int dlock__board_new(dlock__board **out);
void dlock__board_free(dlock__board *b);
/* Let be's wake-ups reach b (before the store handle is used). */
void dlock__board_attach(dlock_backend *be, dlock__board *b);
/* The store handle dlock_backend_renew_now renews. */
void dlock__board_set_store(dlock__board *b, dlock_store *s);
/* The generation of name, of owner's waiter (and of the whole board), before a try. */
uint64_t dlock__board_arm(dlock__board *b, const char *name, const char *owner);
/* Sleep until that generation moves past `armed` or ms pass; whether it moved. */
bool dlock__board_wait(dlock__board *b, const char *name, const char *owner, uint64_t armed, int64_t ms);

/* ---- processes ---- */
/* Store and lock handles belong to the process that opened the store. The
 * generation counts the fork()s on the way to this process (bumped in each
 * child by a pthread_atfork handler), so comparing it is one atomic load. */
unsigned long dlock__fork_gen(void);
/* This process's id (cached; reset in a fork's child). */
int dlock__pid(void);

/* ---- the store object (core) ---- */
typedef struct dlock__reg dlock__reg;
typedef struct dlock__cb_run cb_run;
typedef struct dlock__runner dlock__runner;
typedef struct dlock__orphan dlock__orphan;

/*
 * Mutex order, outermost first (a later one may be taken under an earlier
 * one, never the reverse):
 *   be_mu     calls into be, and `closed`
 *   rbe_mu    rbe, and calls into it (never held together with be_mu)
 *   reg_mu    the renewal registry, orphans, on_lost queue and runners
 *   l->mu     one lock's state, deadline and request (struct dlock_lock)
 * Leaves (nothing is taken under them): a board's mutex (board.c), the
 * watch thread's (watch.c), the resolver's (resolve.c) and the scheme
 * registry's (schemes.c). They may be taken under be_mu or rbe_mu (the
 * board is armed there; store methods watch sockets and resolve hosts there,
 * and take mutexes of their own). A method may also take reg_mu there,
 * through dlock_backend_renew_now(); the core never nests be_mu and reg_mu.
 * One exception: open_rbe() takes rbe_mu under reg_mu to set rbe. That is
 * safe because rbe_mu is held across a store call only once rbe is set, and
 * rbe is set once, by that one opener.
 * The module loader's load_mu (schemes.c) is taken by the first open of a
 * store module's scheme, with no mutex above held (the renewer's open_rbe
 * opens a scheme whose module is loaded already, which reads the registry
 * without a lock); under it, dlopen and the registry's mutex.
 * Rules:
 * - Hold reg_mu and l->mu only briefly: never across a store method, I/O or
 *   a wait on a store. Renewals, orphan retries and close drop reg_mu
 *   before they take be_mu or rbe_mu, and take it again after.
 * - be_mu and rbe_mu are held across store methods (each bounded by its
 *   deadline), but not across wait, unwatch or a sleep on the board.
 * - No core mutex is held while calling on_lost (a runner thread) or
 *   on_unreachable: they may call back into the lock and its store.
 * - dlock_backend_unwatch_all() waits for the watch thread's renewal, which
 *   takes reg_mu: never call a store's close under reg_mu. The core closes
 *   stores with no mutex held.
 * - reg_cv and cb_cv are waited on with reg_mu alone; the board's and the
 *   watch thread's condition variables with their own mutex alone.
 */
struct dlock_store {
	dlock_backend *be;
	dlock_backend_methods mt; /* what the core calls: be->methods as far as its version reaches, the rest zero */
	pthread_mutex_t be_mu;  /* serialises calls into be (all but wait, unwatch) */
	dlock__board *board;    /* wake-ups the store feeds (be->core) */
	/* DLOCK_BACKEND_F_RENEW_APART: the renewer's own instance, opened from
	 * open_text (the URI as given, secrets included; NULL for a backend
	 * handed in) when first needed, under its own mutex */
	char warning[512];      /* dlock_store_warning ("" if none) */
	char *open_text;
	dlock_backend *rbe;     /* set once by the opener thread, under rbe_mu */
	pthread_mutex_t rbe_mu;
	int64_t rbe_retry_at;   /* renewer thread only */
	pthread_t rbe_opener;   /* opens rbe without delaying a renewal */
	bool rbe_opener_started; /* renewer thread only (and close, after it stopped) */
	_Atomic bool rbe_opening;
	char *uri;              /* redacted */
	char client_id[33];
	char host[256];
	int64_t default_ttl_ms;
	int64_t request_timeout_ms; /* bound of one request (URI timeout=) */
	uint64_t next_serial;   /* owner serials, under reg_mu */

	/* renewal registry, renewal thread and lease watchdog (renewer.c) */
	pthread_mutex_t reg_mu;
	pthread_cond_t reg_cv;  /* any change of the below; both threads recompute */
	dlock__reg *regs;
	bool renewer_started, watchdog_started, renewer_stop;
	pthread_t renewer, watchdog;
	cb_run *cbs;            /* on_lost callbacks signalled and not yet returned */
	pthread_cond_t cb_cv;   /* a callback to run, or the store closed (runners wait on it) */
	int cb_threads, cb_idle; /* callback runner threads, and how many of them wait */
	struct dlock__runner *runners; /* joinable runners (renewer.c) */
	int mem_users;          /* detached threads still using s: runners, an orphaned opener */
	bool opener_orphaned;   /* closed while the opener of rbe was still opening */
	bool mem_handoff;       /* closed while mem_users > 0: the last of them frees s */
	bool closed;            /* under be_mu: dlock_store_close closed be */
	dlock__orphan *orphans; /* releases to retry in the background */
	const char *orphan_busy; /* owner of the orphan the renewer retries now */
	int64_t orphan_pause_until; /* a retry failed: no other before this */
	_Atomic int fg_waiting; /* callers waiting for be_mu: background retries let them go first */
	int64_t renewer_wake;   /* when the sleeping renewer wakes up by itself */
	int64_t watchdog_wake;  /* when the sleeping watchdog wakes up by itself */
	unsigned long fork_gen; /* dlock__fork_gen() at open: the handle is that process's */
	int opener_pid;
	_Atomic uint64_t requests; /* dlock_store_requests */
	/* CLOCK_MONOTONIC ms when the store first left a request of the core
	 * unanswered since its last answer (0: the last request was answered) */
	_Atomic int64_t silent_since;
};

/* How long a courtesy request (the release of a lost hold, close's last
 * tries) may take while the store is silent: what it would undo ends with
 * its lease anyway. */
#define DLOCK__SILENT_TRY_MS 50

/* Note what a request of the core got back (rc); returns rc. */
static inline int dlock__heard(dlock_store *s, int rc)
{
	if (rc == DLOCK_EUNAVAILABLE) {
		int64_t zero = 0;
		atomic_compare_exchange_strong(&s->silent_since, &zero, dlock_clock_ms());
	} else {
		atomic_store(&s->silent_since, 0);
	}
	return rc;
}

/* Whether the store left the core's last request unanswered. */
static inline bool dlock__silent(dlock_store *s)
{
	return atomic_load(&s->silent_since) != 0;
}

/* One request of the core to the store (dlock_store_requests). */
static inline void dlock__counted(dlock_store *s)
{
	atomic_fetch_add_explicit(&s->requests, 1, memory_order_relaxed);
}

/* A held lock as the renewal thread sees it; owned by the lock, linked while held. */
struct dlock__reg {
	dlock__reg *next, *prev; /* doubly linked: unlinking is O(1) */
	uint64_t id;            /* unique per hold (never reused) */
	dlock_lock *lock;
	int64_t next_renew;     /* CLOCK_MONOTONIC ms */
	bool in_batch;          /* the renewer is talking to the store about it */
	bool extending;         /* dlock_extend is: the renewer leaves it alone */
};

/* Start renewing (and watching the deadline of) reg's lock. DLOCK_ENOMEM
 * when the store's threads cannot be started (nothing is registered then). */
int dlock__renewer_add(dlock_store *store, dlock__reg *reg);
/* dlock_backend_renew_now: every hold of the store is due for renewal now. */
void dlock__renewer_renew_now(dlock_store *store);
/* Take a hold off the renewer, once its renewal in flight is over; false if
 * that is not before `by` (INT64_MAX: wait). Never waits for its on_lost. */
bool dlock__renewer_remove(dlock_store *store, dlock__reg *reg, int64_t by);
/* Stop the renewer and the watchdog and release what they kept (bounded by
 * the request timeout); on_lost callbacks still running are not waited for.
 * Returns the end of close's bound (CLOCK_MONOTONIC ms). */
int64_t dlock__renewer_stop(dlock_store *store);
/* dlock_store_close's last step: free s now, or let the last callback runner
 * thread free it when it returns (the callbacks still use its mutexes). */
void dlock__renewer_release_store(dlock_store *s);
/* Free the memory of a store handle (store.c). */
void dlock__store_free_mem(dlock_store *s);
/* dlock_extend's turn on a hold: wait (until `by`) for its renewal in flight
 * and keep the renewer off it until extend_end; false when that renewal is
 * still in flight at `by` (nothing is changed then). A hold not registered
 * (attached from a handle) has no renewal: true at once. */
bool dlock__renewer_extend_begin(dlock_store *store, dlock__reg *reg, int64_t by);
/* The extend is over: the renewer's next renewal of it comes by next_renew. */
void dlock__renewer_extend_end(dlock_store *store, dlock__reg *reg, int64_t next_renew);
/* Wait (until `by`) for the thread opening the renewer's own instance
 * (after renewer_stop); detach it if it is still opening then. */
void dlock__renewer_join_opener(dlock_store *s, int64_t by);

/* Releases the store did not confirm: retried by the renewer (slot NULL,
 * confirm set) until 0/ENOTHELD or CLOCK_MONOTONIC `until`. req is copied.
 * A cancel the caller could not make in time is made by the renewer once
 * (with the request's slot, which goes with it). */
typedef enum { DLOCK__ORPHAN_RELEASE, DLOCK__ORPHAN_CANCEL } dlock__orphan_kind;
int dlock__orphan_add(dlock_store *store, const dlock_request *req, dlock__orphan_kind kind, int64_t until);
/* Take the pending release of `owner` out of the queue (1), or 0 if none. */
int dlock__orphan_take(dlock_store *store, const char *owner, dlock__orphan **out);
const dlock_request *dlock__orphan_request(dlock__orphan *o);
/* Put a taken orphan back for the renewer to retry. */
void dlock__orphan_put(dlock_store *store, dlock__orphan *o);
void dlock__orphan_free(dlock__orphan *o);

/* Whether s was opened by another process: this one is a fork() child of it
 * and must not use it (no mutex of it, no I/O on its connections). */
static inline bool dlock__forked(const dlock_store *s)
{
	return s->fork_gen != dlock__fork_gen();
}
/* DLOCK_EINVAL saying that `fn` was called on an inherited store handle. */
int dlock__fork_error(const dlock_store *s, const char *fn);
/* Keep memory the child cannot free without its owner's I/O (a backend, a
 * store's per-hold state) reachable until exit, so that leak checkers do not
 * count it. */
void dlock__forget(void *p);
/* In a fork's child: free the renewer's queues of an inherited store if no
 * thread of the parent held them at the fork; false if it had to leave them. */
bool dlock__renewer_forget(dlock_store *s);

/* Lock internals shared between lock.c and renewer.c */

typedef enum { DLOCK__IDLE, DLOCK__HELD, DLOCK__LOST } dlock__state;

struct dlock_lock {
	dlock_store *store;
	char *name;
	dlock_lock_options opts;
	int64_t ttl_ms;
	pthread_mutex_t mu;      /* guards the fields below against the renewer */
	dlock__state state;
	unsigned long count;     /* reentrant holds */
	pthread_t thread;        /* holder thread */
	char owner[DLOCK_SYS_OWNER_MAX];
	uint64_t fence;
	int64_t deadline;        /* CLOCK_MONOTONIC ms; lease end minus drift */
	int64_t unsure_ttl_ms;   /* least ttl of this hold's renewals and extends
				    whose outcome is unknown (0: none): such a
				    request may still land and, on a store that sets
				    now + ttl, cut the lease to it (sys/backend.h) */
	int64_t unsure_end;      /* least send + ttl of those (0: none) */
	bool attached;           /* from dlock_lock_attach: not renewed */
	bool release_pending;    /* a release failed: `owner` is in the orphan queue */
	bool lost_fired;
	const char *lost_why;    /* static text: why the hold was lost (dlock_lost_reason) */
	dlock_request req;       /* what the store sees for this hold */
	dlock__reg reg;
	bool registered;
	atomic_int refs;         /* the handle's owner, plus each on_lost not yet returned */
};

/* Drop one reference of l; the last frees its memory. */
void dlock__lock_unref(dlock_lock *l);

/* Fill lock->req from the lock's options and current owner. */
void dlock__lock_fill_request(dlock_lock *lock);
/* Mark a lock lost (under lock->mu); returns true if the callback must fire. */
bool dlock__lock_mark_lost(dlock_lock *lock, const char *why);
/* Why a hold was lost (dlock_lost_reason): its lease ran out unconfirmed, or
 * the store no longer has it. */
#define DLOCK__LOST_DEADLINE "its lease ran out: no renewal was confirmed before the deadline"
#define DLOCK__LOST_GONE                                                                                \
	"the store no longer has the hold (released or broken by another client, expired on the store, or " \
	"the store's data was lost)"

#endif
