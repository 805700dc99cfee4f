/*
 * The writers' line of an SQLite database: one process-shared mutex in a
 * small file beside the database ("<db>.writers"), taken before SQLite's
 * write lock and let go after the commit, so that writers of one machine
 * queue in the kernel (a futex: one waiter woken per release) instead of
 * napping in SQLite's busy handler and retrying (1, 2, 5 … 100 ms naps: with
 * hundreds of writers the lock sat free while its next taker slept).
 *
 * Only an order, never safety: every decision is still made inside SQLite's
 * own write lock, so a writer outside the line (an older library, a file
 * made anew under some of us, a line found unusable) only waits as before.
 * The mutex is robust (a holder that dies hands it on) and taken with the
 * call's deadline. The file is trusted only when it is a regular file owned
 * by us or by the database's owner and writable by nobody the database
 * does not let write.
 */
#ifndef DLOCK_SQLITE_WRITEQ_H
#define DLOCK_SQLITE_WRITEQ_H

#include <stdbool.h>
#include <stdint.h>

typedef struct dlock__wq dlock__wq;

/* Open the line of database `db_path` (its file "<db_path>.writers"); with
 * `create`, make it when there is none. NULL when there is none (and not
 * `create`), or it cannot be made, mapped or trusted: the caller goes
 * without. Sets no error. */
dlock__wq *dlock__wq_open(const char *db_path, bool create);

/* Take the line by `deadline_ms` (dlock_clock_ms). 0: taken; 1: the deadline
 * came first; -1: the line is unusable (close it and go without). */
int dlock__wq_enter(dlock__wq *q, int64_t deadline_ms);

/* Let the line go (after the commit or rollback); no-op when not taken. */
void dlock__wq_leave(dlock__wq *q);

/* Whether the file at the path is still this line's (not deleted or made anew). */
bool dlock__wq_current(const dlock__wq *q, const char *db_path);

/* Let go if taken, unmap, free. Accepts NULL. */
void dlock__wq_close(dlock__wq *q);

#endif
