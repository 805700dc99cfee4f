/*
 * The embedded store's parts (sqlite.c holds its methods and open): what
 * db.c, schema.c, queue.c and bells.c share. Internal to the store.
 */
#ifndef DLOCK_SQLITE_SQ_H
#define DLOCK_SQLITE_SQ_H

#include "support.h"
#include "sqlite/writeq.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* clang-format off */
enum {
	Q_BEGIN, Q_COMMIT, Q_ROLLBACK,
	Q_PURGE_HOLDERS, Q_PURGE_WAITERS, Q_HOLDERS, Q_ANY_WAITERS, Q_MYSEQ, Q_AHEAD, Q_EXCL_AHEAD, Q_WRITER_WAITING,
	Q_ENQUEUE, Q_FENCE_SET, Q_FENCE_NEW, Q_INSERT_HOLDER, Q_DEQUEUE, Q_RELEASE, Q_EXTEND,
	Q_STATUS_HOLDERS, Q_STATUS_FENCE, Q_STATUS_WAITERS, Q_STATUS_NAMES, Q_HEAD, Q_CUT_HEAD, Q_PEEK, Q_FRONT,
	Q_COUNT
};
/* clang-format on */

/*
 * A name's fence counter is a row of dlock_holds with owner '' (owner tokens
 * are never empty) and an expiry no clock reaches, so it sits in the same
 * B-tree page as the name's holders: a grant dirties one page, not two. Every
 * query about holders says owner>''. "OR FAIL" on the writes inside BEGIN
 * IMMEDIATE: a single-row statement has nothing of its own to undo, so SQLite
 * needs no statement journal for it (ABORT would allocate and copy one).
 */
#define SQL_INT64_MAX "9223372036854775807"
#define FENCE_ROW_EXPIRES SQL_INT64_MAX

/* The database and the two files SQLite keeps beside it in WAL mode. */
#define NFILES 3

typedef struct file_id {
	dev_t dev;
	ino_t ino;
	bool known;
} file_id;

typedef struct sqlite_store {
	dlock_backend base;
	sqlite3 *db;   /* NULL once the files moved, until the next acquire or status reopens them */
	char *ns;
	char *paths[NFILES];
	file_id ids[NFILES]; /* of the files this connection has open */
	int64_t busy_ms;     /* busy_timeout=: a further cap on one wait for the write lock */
	int64_t request_timeout_ms;
	int64_t deadline;    /* of the call in progress (dlock_clock_ms): the busy handler's limit */
	bool timed_out;      /* the busy handler gave up at the deadline */
	int64_t checked_at;  /* dlock_clock_ms of the last look at the files */
	sqlite3_stmt *st[Q_COUNT];
	struct bells *bells; /* wake-ups of waiters (watch), NULL until the first */
	char front[2][DLOCK_SYS_OWNER_MAX]; /* the first two in line of a queue that moved in the
					    transaction under way: their bells ring after the commit */
	bool make_dirs;      /* the default store's file: create its directories */
	bool foreign_ok;     /* foreign=ok: the file may have another application's tables */
	uid_t db_uid;        /* the database file's owner, group and mode (at the last open): */
	gid_t db_gid;        /* what the bells directory and files follow and are checked */
	mode_t db_mode;      /* against */
	dlock__wq *wq;       /* the writers' line (writeq.h), NULL: none (yet) */
	bool wq_want;        /* writers collided (the busy handler ran): make or join the line */
	bool wq_check;       /* someone outside our line held the write lock: is the line still the file's? */
	int64_t wq_next;     /* dlock_clock_ms before which no line is made again after a failure */
} sqlite_store;

/* ---- db.c: the connection, statements, transactions and the fork rule ---- */
/* Count a thread into SQLite through a store method (the fork rule). */
void dlock__sq_calls_enter(void);
/* And out again. */
void dlock__sq_calls_leave(void);
/* In a fork()'s child made during a call inside SQLite: the error; else 0. */
int dlock__sq_fork_check(void);
/* Close the connection (its statements, the writers' line); `moved`: the files were replaced. */
void dlock__sq_disconnect(sqlite_store *b, bool moved);
/* Whether any of the three files at its path is no longer the one open. */
bool dlock__sq_files_moved(const sqlite_store *b);
/* Look at the files (every RECHECK_MS, or `always`); on a move, disconnect: 0 or an error. */
int dlock__sq_check_files(sqlite_store *b, bool always);
/* For acquire and status: on moved files, open the path again (by deadline). */
int dlock__sq_reopen_if_moved(sqlite_store *b, int64_t deadline);
/* Every call starts here: its deadline, cut by busy_timeout= if shorter. */
void dlock__sq_set_deadline(sqlite_store *b, int64_t deadline);
/* The store error for SQLite code rc during `what` (the deadline's "timed out" when it ran out). */
int dlock__sq_fail(sqlite_store *b, int rc, const char *what);
/* Reset statement q and bind ns/name/owner as ?1 ?2 ?3 (owner NULL: not bound). */
sqlite3_stmt *dlock__sq_prep(sqlite_store *b, int q, const char *name, const char *owner);
/* Run a statement that returns no rows (or whose rows are ignored). */
int dlock__sq_run(sqlite_store *b, sqlite3_stmt *s, const char *what);
/* Take the writers' line (writeq.h) once writers of this file have collided. */
int dlock__sq_line_enter(sqlite_store *b);
/* BEGIN IMMEDIATE, in the writers' line. */
int dlock__sq_begin(sqlite_store *b);
/* Commit (or roll back on failure) what dlock__sq_begin() started, and leave the line. */
int dlock__sq_finish(sqlite_store *b, int rc);
/* Step s and read column col as an integer (dflt when there is no row; *err on failure). */
int64_t dlock__sq_step_int(sqlite_store *b, sqlite3_stmt *s, int col, int64_t dflt, int *err);
/* Under the open's deadline: open the file, set it up (WAL, schema), prepare. */
int dlock__sq_connect_db(sqlite_store *b, int64_t deadline);

/* ---- schema.c: the file and its schema ---- */
/* Whether the file already has this version's schema (a read). */
bool dlock__sq_schema_current(sqlite3 *db);
/* The tables at the current version, then the queue's indexes. */
int dlock__sq_setup_schema(sqlite3 *db, char **err);
/* mkdir -p for the parent directories of path, mode 0700. */
int dlock__sq_make_parents(const char *path);
/* For a file named in the URI: 0 when its directory is there, else the error. */
int dlock__sq_parent_exists(const char *path);
/* Open (or create, private) the database file; only SQLite opens it. */
int dlock__sq_open_db(sqlite3 **db, const char *path);
/* A schema object of another application in the file (into buf), refused unless foreign=ok. */
int dlock__sq_foreign_object(sqlite3 *db, char *buf, size_t len);

/* ---- queue.c: holders, the waiters' queue and the decision ---- */
/* The queue of req->name moved: drop its dead front, note the first two to ring, cut the front's registration. */
int dlock__sq_note_head(sqlite_store *b, const dlock_request *req, int64_t now);
/* The decision of one acquire try, inside BEGIN IMMEDIATE. */
int dlock__sq_decide(sqlite_store *b, const dlock_request *req, int64_t now, dlock_grant *out);
/* A registered mutex waiter's try refused by a read while the name is held (true: out->retry_ms set). */
bool dlock__sq_peek_held(sqlite_store *b, const dlock_request *req, int64_t now, dlock_grant *out);

/* ---- bells.c: wake-ups through the file system ---- */
/* Waiters at the front of req->name's queue whose processes died leave it (*dropped: how many). */
int dlock__sq_drop_dead_front(sqlite_store *b, const dlock_request *req, int64_t *dropped);
/* Ring the bucket of `name`: its waiters at the front (and unfair ones) look. */
void dlock__sq_ring(const sqlite_store *b, const char *name);
/* Ring the bells of the first two in line of a queue that moved (note_head). */
void dlock__sq_ring_front(sqlite_store *b);
/* Forget the bells (close; or a fork()'s child: `in_parent` false). */
void dlock__sq_bells_free(sqlite_store *b, bool in_parent);
/* The `watch` method: listen to the bell of req->name (or its own, behind others). */
int dlock__sq_watch(dlock_backend *be, const dlock_request *req);
/* The `unwatch` method. */
void dlock__sq_unwatch(dlock_backend *be, const dlock_request *req);
/* After a refused try of a fair waiter: whether it has others ahead (see bells.c). */
bool dlock__sq_bell_behind(sqlite_store *b, const dlock_request *req, bool behind, bool *own_heard);
/* In a fork()'s child: whether a call was inside SQLite at the fork. */
bool dlock__sq_busy_at_fork(void);
/* The open's first step: the fork handlers in place, then dlock__sq_fork_check(). */
int dlock__sq_fork_guard(void);

#endif
