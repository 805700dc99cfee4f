/* Tiny test helpers shared by the unit, store and CLI test programs. */
#ifndef DLOCK_TESTUTIL_H
#define DLOCK_TESTUTIL_H

#include <dlock/dlock.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

extern int tu_failures;

/* How late a timer-driven event (on_lost at the lease deadline) may be seen
 * in this run: scheduling, not the library. Not a fixed grace: each call
 * naps 10 ms three times and keeps the latest wake-up of the run; the grace
 * is 50 ms plus twice that, so that a loaded machine gets the room it
 * showed and an idle one keeps tight bounds (under valgrind: a second).
 * Each call takes ~30 ms: call it after the timed part, not inside it. */
long long tu_sched_grace_ms(void);
/* The latest wake-up seen so far (three naps now), ms. */
long long tu_sched_late_ms(void);
#define TU_SCHED_GRACE_MS tu_sched_grace_ms()
/* The same measure over a window, for a bound tighter than the run's: the
 * window starts at tu_lag_start() (three naps); tu_lag_ms() (three more)
 * is twice the latest wake-up seen since, plus one nap (10 ms). */
void tu_lag_start(void);
long long tu_lag_ms(void);

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s: %s)\n", __FILE__, \
				__LINE__, #cond, dlock_error_name(dlock_error_last()->code),       \
				dlock_error_last()->message);                              \
			tu_failures++;                                                     \
		}                                                                          \
	} while (0)

#define CHECK_RC(expr, want)                                                               \
	do {                                                                               \
		int rc_ = (expr);                                                          \
		if (rc_ != (want)) {                                                       \
			fprintf(stderr, "%s:%d: %s returned %s, wanted %s (%s)\n", __FILE__,   \
				__LINE__, #expr, dlock_error_name(rc_), dlock_error_name(want),   \
				dlock_error_last()->message);                              \
			tu_failures++;                                                     \
		}                                                                          \
	} while (0)

/* Exit status for main: prints a summary line. */
int tu_done(const char *suite);

/* Milliseconds on CLOCK_MONOTONIC. */
long long tu_now_ms(void);

/* The waiters dlock_store_status reports for `name` (0 when it cannot say). */
size_t tu_waiters(dlock_store *s, const char *name);

/* Look (what the test observes, not what it waits for) every 2 ms until
 * `name` has exactly `want` waiters, for at most `ms`: 1, or 0 when it did not. */
int tu_await_waiters(dlock_store *s, const char *name, size_t want, long ms);

/* The first line of the file named by $DLOCK_TEST_URI_FILE (a server
 * script's DIR/uri) into out; exit(2) with a message naming `prog` when it
 * cannot be read. */
void tu_uri_from_env(char *out, size_t n, const char *prog);

/* The first line of the file at path (without its newline) into out. @return 0; -1 when unreadable. */
int tu_first_line(const char *path, char *out, size_t n);

/* The directory of $DLOCK_TEST_URI_FILE (the server script's DIR: its other
 * files), into out; "." when the variable is unset or has no '/'. */
void tu_server_dir(char *out, size_t n);

/* Run this program again as a child: fork, then (after in_child(ctx), when
 * given: dup2s, closing pipe ends) exec this program (the path /proc/self/exe
 * names) with argv (argv[0]
 * is the child's name, the test's own words follow). Stdio is flushed
 * first. A fresh process inherits no store, thread or connection of the
 * parent. -1 when fork failed; the child exits 98 when exec failed. */
#include <sys/types.h>
pid_t tu_spawn_self(char *const argv[], void (*in_child)(void *ctx), void *ctx);

/* Before a test's own fork() (no exec): wait (up to 5 s) until every other
 * thread of this process is asleep (state S in /proc/self/task) for a few
 * looks in a row, then flush stdio. The ASan runtime of clang before 18
 * does not lock its allocator across fork(): a child that allocates could
 * wait forever on a lock a parent thread held at the fork. This narrows
 * that window and no more (a thread woken by a socket after the last look
 * still can, and did: 4 of 80 looped runs of conformance.postgres.fork
 * hung under load); hence make check builds with clang 19, whose runtime
 * locks its allocator across fork() as glibc's malloc does. */
void tu_quiesce_before_fork(void);

/* SIGSTOP pid and wait (up to 5 s) until every thread of it is stopped
 * (state T in /proc/PID/task): the signal stops one thread first and the
 * others after it, and on a loaded machine a thread still running can
 * answer a request sent after kill() returned. 0 once stopped; 1 when the
 * signal was sent but a thread still ran 5 s later (a message says so); -1
 * when the signal could not be sent. */
int tu_stop(pid_t pid);

/* Whether pid has ended: no such process, or a zombie not reaped yet (this
 * machine's init reaps orphans up to two seconds late; kill(pid, 0) still
 * succeeds on a zombie). */
bool tu_gone(pid_t pid);

/* SIGKILL pid (not a child of ours) and wait (up to 5 s) until it is gone:
 * 0 once gone, 1 when it still ran 5 s later, -1 when the signal could not
 * be sent. */
int tu_kill(pid_t pid);

/* Wait for pid (through EINTR): its exit status, 128 + the signal that
 * ended it, or -1 when it cannot be waited for. */
int tu_reap(pid_t pid);

/* The same within `ms`: a child still running then is killed and 200 is
 * returned (a hung child fails); -1 when it cannot be waited for. */
int tu_reap_within(pid_t pid, long long ms);

/* A program's cases: run those named in argv[first..argc) (every one when
 * none is named), each printed with ok/FAILED (by tu_failures) and its time.
 * Returns how many ran. */
typedef struct tu_case {
	const char *name;
	void (*fn)(void);
} tu_case;
size_t tu_run_cases(const tu_case *cases, size_t n, int argc, char **argv, int first);

#endif
