/* Other processes for the SQLite store tests: the test program runs itself
 * again (exec of /proc/self/exe, so nothing of the parent's SQLite or dlock
 * state is inherited) in one of a few roles. */
#ifndef DLOCK_TEST_SQLITE_PROC_H
#define DLOCK_TEST_SQLITE_PROC_H

#include <sys/types.h>

/*
 * Roles, as `prog --child ROLE ARGS...`:
 *   status URI          open the store, dlock_store_status of every name, close (exit 0)
 *   try URI NAME        acquire with wait 0: exit 0 granted (and released), 1 DLOCK_ELOCKED, 2 other
 *   hold URI NAME       acquire (wait 5 s), print "held FENCE", hold until stdin closes, release
 *   fairwait URI NAME   the same with a fair lock (lease 30 s) and a wait of 60 s
 *   exclusive PATH      a plain sqlite3 connection: BEGIN EXCLUSIVE, print "ready", sit in the
 *                       transaction until stdin closes, ROLLBACK
 */

typedef struct sp_child {
	pid_t pid;
	int in;  /* its stdin (write end) */
	int out; /* its stdout (read end) */
} sp_child;

/* In main: when argv asks for a role, run it and return its exit code; else -1. */
int sp_role(int argc, char **argv);

/* The start of each test's main: a role when argv asks for one (its exit
 * code), 2 unless argv is `prog DIR`; else DIR is made and -1 returned. */
int sp_main(int argc, char **argv);

/* Remove a database and the files beside it (-wal, -shm, .writers). */
void sp_remove_db(const char *path);

/* Run a role to its end; its exit code (128+signal when killed). */
int sp_run(const char *role, const char *a1, const char *a2);

/* Start a role with pipes to its stdin and from its stdout. */
int sp_start(sp_child *c, const char *role, const char *a1, const char *a2);

/* Read one line of its output within timeout_ms; 0, or -1 (EOF, timeout). */
int sp_line(sp_child *c, char *buf, size_t len, int timeout_ms);

/* Close its stdin and wait for it; its exit code. */
int sp_finish(sp_child *c);

/* How long the waiter registration at place `k` (0: the front) of lock
 * `name` in the SQLite file at `path` has left, ms (its `expires` against
 * the wall clock); -1 when there is none or the file cannot be read. */
long long sp_queue_left(const char *path, const char *name, int k);

#endif
