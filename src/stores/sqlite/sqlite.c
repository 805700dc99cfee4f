/*
 * The embedded store: one SQLite file shared by the processes of one machine.
 * WAL mode, BEGIN IMMEDIATE for every decision, expiry on this machine's wall
 * clock (every client of the file runs on the same machine and clock).
 */
#include "support.h"
#include "sqlite/writeq.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <inttypes.h>
#include <time.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define SCHEMA_VERSION 3

enum {
	Q_BEGIN, Q_COMMIT, Q_ROLLBACK,
	Q_PURGE_HOLDERS, Q_PURGE_WAITERS, Q_HOLDERS, Q_ANY_WAITERS, Q_MYSEQ, Q_AHEAD, Q_EXCL_AHEAD, Q_WRITER_WAITING,
	Q_ENQUEUE, Q_FENCE_SET, Q_FENCE_NEW, Q_INSERT_HOLDER, Q_DEQUEUE, Q_RELEASE, Q_EXTEND,
	Q_STATUS_HOLDERS, Q_STATUS_FENCE, Q_STATUS_WAITERS, Q_STATUS_NAMES, Q_HEAD, Q_CUT_HEAD, Q_PEEK, Q_FRONT,
	Q_COUNT
};

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

static const char *const sql[Q_COUNT] = {
	[Q_BEGIN] = "BEGIN IMMEDIATE",
	[Q_COMMIT] = "COMMIT",
	[Q_ROLLBACK] = "ROLLBACK",
	[Q_PURGE_HOLDERS] = "DELETE FROM dlock_holds WHERE ns=?1 AND name=?2 AND owner>'' AND expires<=?3",
	[Q_PURGE_WAITERS] = "DELETE FROM dlock_queue WHERE ns=?1 AND name=?2 AND expires<=?3",
	/*
	 * One read for the whole decision: the name's rows (its fence row and its
	 * holders, counted in C), each with whether the name has waiter rows at
	 * all (a constant subquery, evaluated once). Once a name has been granted
	 * its fence row is always there; before that, Q_ANY_WAITERS.
	 */
	[Q_HOLDERS] = "SELECT owner='', mode, fence, expires,"
		      " EXISTS(SELECT 1 FROM dlock_queue WHERE ns=?1 AND name=?2), permits"
		      " FROM dlock_holds WHERE ns=?1 AND name=?2",
	[Q_ANY_WAITERS] = "SELECT EXISTS(SELECT 1 FROM dlock_queue WHERE ns=?1 AND name=?2)",
	[Q_MYSEQ] = "SELECT seq FROM dlock_queue WHERE ns=?1 AND name=?2 AND owner=?3",
	/* Waiters ahead of seq ?3 (all when ?3 is NULL): how many, counted up to
	 * ?4 only; and whether one wants it exclusive. Index ranges, never a walk
	 * of the whole queue: with 2,000 waiters every refused try counted them. */
	[Q_AHEAD] = "SELECT count(*) FROM (SELECT 1 FROM dlock_queue WHERE ns=?1 AND name=?2"
		    " AND seq<coalesce(?3," SQL_INT64_MAX ") ORDER BY seq LIMIT ?4)",
	[Q_EXCL_AHEAD] = "SELECT EXISTS(SELECT 1 FROM dlock_queue WHERE ns=?1 AND name=?2 AND mode=0"
			 " AND seq<coalesce(?3," SQL_INT64_MAX "))",
	[Q_WRITER_WAITING] = "SELECT EXISTS(SELECT 1 FROM dlock_queue WHERE ns=?1 AND name=?2 AND mode=0 AND owner<>?3)",
	/* refresh only when half the registration has passed (most retries then
	 * write nothing), or cut it when it is longer than its place now wants */
	[Q_ENQUEUE] = "INSERT INTO dlock_queue(ns,name,owner,mode,expires,host,pid) VALUES(?1,?2,?3,?4,?5,?6,?7) "
		      "ON CONFLICT(ns,name,owner) DO UPDATE SET expires=excluded.expires "
		      "WHERE expires < excluded.expires - ?8 OR expires > excluded.expires",
	/* The fence is read by Q_HOLDERS in the same write transaction: no RETURNING
	 * (which builds an ephemeral table on every step). */
	[Q_FENCE_SET] = "UPDATE OR FAIL dlock_holds SET fence=?3 WHERE ns=?1 AND name=?2 AND owner=''",
	[Q_FENCE_NEW] = "INSERT OR FAIL INTO dlock_holds(ns,name,owner,mode,permits,fence,expires) "
			"VALUES(?1,?2,'',0,0,?3," FENCE_ROW_EXPIRES ")",
	[Q_INSERT_HOLDER] = "INSERT OR FAIL INTO dlock_holds(ns,name,owner,mode,permits,fence,expires,host,pid) "
			    "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
	[Q_DEQUEUE] = "DELETE FROM dlock_queue WHERE ns=?1 AND name=?2 AND owner=?3",
	[Q_RELEASE] = "DELETE FROM dlock_holds WHERE ns=?1 AND name=?2 AND owner=?3 AND expires>?4",
	/* A lease only ever grows: a renewal that was sent before an extend
	 * and lands after it (delayed by another writer) cannot shorten it. */
	[Q_EXTEND] = "UPDATE dlock_holds SET expires=max(expires,?4) WHERE ns=?1 AND name=?2 AND owner=?3"
		     " AND expires>?5",
	[Q_STATUS_HOLDERS] = "SELECT owner, host, pid, mode, fence, expires, permits FROM dlock_holds "
			     "WHERE ns=?1 AND name=?2 AND owner>'' AND expires>?3 ORDER BY fence",
	[Q_STATUS_FENCE] = "SELECT fence FROM dlock_holds WHERE ns=?1 AND name=?2 AND owner=''",
	[Q_STATUS_WAITERS] = "SELECT count(*) FROM dlock_queue WHERE ns=?1 AND name=?2 AND expires>?3",
	[Q_STATUS_NAMES] = "SELECT name FROM dlock_holds WHERE ns=?1 AND owner>'' AND expires>?2 UNION "
			   "SELECT name FROM dlock_queue WHERE ns=?1 AND expires>?2 ORDER BY 1",
	/* the first two in line (their own bells are rung when they move up) */
	[Q_HEAD] = "SELECT owner FROM dlock_queue WHERE ns=?1 AND name=?2 ORDER BY seq LIMIT 2",
	/* the front's registration no longer than a front waiter's (note_head) */
	[Q_CUT_HEAD] = "UPDATE dlock_queue SET expires=?4 WHERE ns=?1 AND name=?2 AND owner=?3 AND expires>?4",
	/* a registered waiter's look (peek_held): the first live hold's end, its
	 * own registration's end and how many wait ahead of it (up to 2); no
	 * row: not registered */
	[Q_PEEK] = "SELECT (SELECT min(expires) FROM dlock_holds WHERE ns=?1 AND name=?2 AND owner>'' AND expires>?4),"
		   " q.expires, (SELECT count(*) FROM (SELECT 1 FROM dlock_queue a"
		   " WHERE a.ns=?1 AND a.name=?2 AND a.seq<q.seq LIMIT 2))"
		   " FROM dlock_queue q WHERE q.ns=?1 AND q.name=?2 AND q.owner=?3",
	/* the first ?3 in line (drop_dead_front) */
	[Q_FRONT] = "SELECT owner FROM dlock_queue WHERE ns=?1 AND name=?2 ORDER BY seq LIMIT ?3",
};

/*
 * Schema version 3. The tables have names no earlier version used, and the
 * old names are read-only views: a process of an older library that is
 * still running when a file is migrated fails loudly at its next write
 * ("cannot modify dlock_holders because it is a view") instead of reading
 * the fence rows as holders (phantom holders with an empty owner, forever)
 * and queueing behind them; an older library that opens the file later fails
 * in its schema step (an index on a view) or its version check.
 */
static const char schema_v3[] =
	"CREATE TABLE dlock_holds(ns TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,"
	" mode INTEGER NOT NULL, permits INTEGER NOT NULL, fence INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, PRIMARY KEY(ns,name,owner)) WITHOUT ROWID;"
	"CREATE TABLE dlock_queue(seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL,"
	" name TEXT NOT NULL, owner TEXT NOT NULL, mode INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, UNIQUE(ns,name,owner));";

static const char views_v3[] =
	"CREATE INDEX dlock_queue_by_name ON dlock_queue(ns,name,seq);"
	"CREATE VIEW dlock_holders AS SELECT ns, name, owner, mode, permits, fence, expires, host, pid"
	" FROM dlock_holds WHERE owner>'';"
	"CREATE VIEW dlock_fences AS SELECT ns, name, fence FROM dlock_holds WHERE owner='';"
	"CREATE VIEW dlock_waiters AS SELECT seq, ns, name, owner, mode, expires, host, pid FROM dlock_queue;"
	"DELETE FROM dlock_schema; INSERT INTO dlock_schema(version) VALUES(3);";

/* Indexes for queues of thousands (expiry, writers ahead): not part of the
 * version — a file of version 3 without them works, with older libraries
 * too; they are added when a file is opened without them. */
static const char queue_indexes[] =
	"CREATE INDEX IF NOT EXISTS dlock_queue_by_expiry ON dlock_queue(ns,name,expires);"
	"CREATE INDEX IF NOT EXISTS dlock_queue_by_mode ON dlock_queue(ns,name,mode,seq);";

/* Versions 1 and 2 had tables dlock_holders and dlock_waiters: rename them
 * (their rows, the queue's sequence and its numbering stay). */
static const char rename_v2[] =
	"ALTER TABLE dlock_holders RENAME TO dlock_holds;"
	"DROP INDEX IF EXISTS dlock_waiters_by_name;"
	"ALTER TABLE dlock_waiters RENAME TO dlock_queue;";

/* Version 1 kept fences in a table dlock_fences: into fence rows. */
static const char fences_v1[] =
	"INSERT INTO dlock_holds(ns,name,owner,mode,permits,fence,expires)"
	" SELECT ns, name, '', 0, 0, fence, " FENCE_ROW_EXPIRES " FROM dlock_fences WHERE true"
	" ON CONFLICT(ns,name,owner) DO UPDATE SET fence=max(fence,excluded.fence);"
	"DROP TABLE dlock_fences;";

/* The database and the two files SQLite keeps beside it in WAL mode. */
#define NFILES 3
static const char *const file_suffix[NFILES] = { "", "-wal", "-shm" };

typedef struct file_id {
	dev_t dev;
	ino_t ino;
	bool known;
} file_id;

typedef struct sqlite_backend {
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
	char front[2][DLOCK__OWNER_MAX]; /* the first two in line of a queue that moved in the
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
} sqlite_backend;

/*
 * fork(): SQLite keeps state per process (its mutexes, its table of open
 * files with their lock bookkeeping, shared-memory mappings), and a child
 * gets a copy of it as it was at the fork. A child may use SQLite only when
 * no thread of this library was inside SQLite at the fork: a mutex it held
 * stays locked in the child (a child's open hung in
 * sqlite3WalBeginReadTransaction), and what it was changing is half
 * changed. Otherwise the child's open is refused with an error naming
 * fork(). (A connection inherited and not closed shares its lock
 * bookkeeping with the child's new ones to the same file: documented in
 * docs/stores/sqlite.md.) The prepare handler holds new calls back and
 * waits up to FORK_WAIT_MS for those running to end, so that a fork rarely
 * meets one; the child handler takes the snapshot.
 */
#define FORK_WAIT_MS 100

static atomic_int sq_calls;      /* threads inside SQLite through a store (counted around each method) */
static atomic_bool sq_busy_fork; /* in a fork()'s child: a call was inside SQLite at the fork */
static atomic_bool sq_fork_pending;
static pthread_once_t sq_fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	atomic_store(&sq_fork_pending, true);
	for (int64_t until = dlock_clock_ms() + FORK_WAIT_MS; atomic_load(&sq_calls) > 0 && dlock_clock_ms() < until;)
		dlock__sleep_ms(1);
}

static void fork_parent(void)
{
	atomic_store(&sq_fork_pending, false);
}

static void fork_child(void)
{
	if (atomic_load(&sq_calls) > 0)
		atomic_store(&sq_busy_fork, true);
	atomic_store(&sq_calls, 0);
	atomic_store(&sq_fork_pending, false);
}

static void watch_forks(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void calls_enter(void)
{
	while (atomic_load(&sq_fork_pending))
		dlock__sleep_ms(1);
	atomic_fetch_add(&sq_calls, 1);
}

static void calls_leave(void)
{
	atomic_fetch_sub(&sq_calls, 1);
}

/* In a fork()'s child made during a call inside SQLite: the error; else 0. */
static int fork_check(void)
{
	if (atomic_load(&sq_busy_fork))
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
				       "sqlite: this process is a fork() child made while a store call of its parent was "
				       "inside SQLite (its mutexes and files may be half changed here): SQLite cannot be "
				       "used in this process; fork while no store call runs, or exec");
	return 0;
}

/* Leave the writers' line for good (writeq.h). */
static void line_drop(sqlite_backend *b)
{
	dlock__wq_close(b->wq);
	b->wq = NULL;
}

static void disconnect(sqlite_backend *b, bool moved)
{
	for (int i = 0; i < Q_COUNT; i++) {
		sqlite3_finalize(b->st[i]);
		b->st[i] = NULL;
	}
	/* Closing the last connection to a file checkpoints it and deletes the
	 * -wal and -shm by NAME: after a move those names may be another file's. */
	if (b->db && moved)
		sqlite3_db_config(b->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
	sqlite3_close(b->db);
	b->db = NULL;
	line_drop(b);
}

/* Is any of the three files at its path no longer the one we have open? */
static bool files_moved(const sqlite_backend *b)
{
	for (int i = 0; i < NFILES; i++) {
		struct stat st;
		if (b->ids[i].known &&
		    (stat(b->paths[i], &st) != 0 || st.st_dev != b->ids[i].dev || st.st_ino != b->ids[i].ino))
			return true;
	}
	return false;
}

/*
 * Before every call: are we still on the files at the path? A database
 * deleted or replaced under us (or its -wal), and every hold we have in it, is
 * gone for everyone else: others open a new file there. Drop the connection
 * at once (it must not write into, nor checkpoint from, files nobody else
 * reads) and say DLOCK_ENOTHELD, so the core reports our holds lost.
 * Renewal always looks (three stat calls); other calls at most every
 * RECHECK_MS (the stats were ~15 % of an uncontended acquire+release's CPU):
 * a holder learns of the move at its next renewal either way.
 */
#define RECHECK_MS 10

static int check_files(sqlite_backend *b, bool always)
{
	if (b->db) {
		int64_t now = dlock_clock_ms();
		if (!always && now - b->checked_at < RECHECK_MS)
			return 0;
		if (!files_moved(b)) {
			b->checked_at = now;
			return 0;
		}
	}
	disconnect(b, true);
	return dlock_error_set(DLOCK_ENOTHELD, "sqlite", NULL,
			       "sqlite: %s was deleted or replaced since it was opened: holds made in the old file are gone",
			       b->paths[0]);
}

static int connect_db(sqlite_backend *b, int64_t deadline);

/* For acquire and status: on moved files, open the path again (bounded by deadline). */
static int reopen_if_moved(sqlite_backend *b, int64_t deadline)
{
	if (check_files(b, false) == 0)
		return 0;
	return connect_db(b, deadline);
}

/*
 * SQLite's own busy_timeout counts from each wait and knows nothing of the
 * call: this handler waits for the write lock (SQLite's schedule: 1, 2, 5 ...
 * 100 ms naps) only until the deadline of the call in progress.
 */
static int on_busy(void *arg, int count)
{
	static const int naps[] = { 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 };
	const int last = (int)(sizeof(naps) / sizeof(*naps)) - 1;
	sqlite_backend *b = arg;
	if (b->wq)
		b->wq_check = true;
	else
		b->wq_want = true;
	int64_t left = b->deadline - dlock_clock_ms();
	if (left <= 0) {
		b->timed_out = true;
		return 0;
	}
	int64_t nap = naps[count < last ? count : last];
	dlock__sleep_ms(nap < left ? nap : left);
	return 1;
}

/* Every call starts here: its deadline, cut by busy_timeout= if that is shorter. */
static void set_deadline(sqlite_backend *b, int64_t deadline)
{
	int64_t cap = b->busy_ms > 0 ? dlock_clock_ms() + b->busy_ms : INT64_MAX;
	b->deadline = deadline < cap ? deadline : cap;
	b->timed_out = false;
}

static int fail(sqlite_backend *b, int rc, const char *what)
{
	char code[32];
	snprintf(code, sizeof(code), "%d", rc);
	if (((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) && b->timed_out)
		return dlock_error_set(DLOCK_EUNAVAILABLE, "sqlite", code,
				       "sqlite: %s timed out: another connection holds the database's write lock",
				       what);
	int err = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED ? DLOCK_EUNAVAILABLE
		: (rc & 0xff) == SQLITE_NOMEM ? DLOCK_ENOMEM
		: (rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_PERM ||
		  (rc & 0xff) == SQLITE_READONLY || (rc & 0xff) == SQLITE_IOERR ? DLOCK_EUNAVAILABLE
		: DLOCK_ESTORE;
	return dlock_error_set(err, "sqlite", code, "sqlite: %s: %s", what,
			       b->db ? sqlite3_errmsg(b->db) : sqlite3_errstr(rc));
}

/* Reset st and bind ns/name/owner as ?1 ?2 ?3 (owner may be NULL to skip). */
static sqlite3_stmt *prep(sqlite_backend *b, int q, const char *name, const char *owner)
{
	sqlite3_stmt *s = b->st[q];
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	if (name) {
		sqlite3_bind_text(s, 1, b->ns, -1, SQLITE_STATIC);
		sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
	}
	if (owner)
		sqlite3_bind_text(s, 3, owner, -1, SQLITE_STATIC);
	return s;
}

/* Run a statement that returns no rows (or whose rows we ignore). */
static int run(sqlite_backend *b, sqlite3_stmt *s, const char *what)
{
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW)
		;
	sqlite3_reset(s);
	return rc == SQLITE_DONE ? 0 : fail(b, rc, what);
}

/*
 * Every write waits in the writers' line (writeq.h) before it asks SQLite for
 * the write lock, once writers of this file have collided: the first busy
 * wait makes the line (or joins the one there); a line found replaced is
 * joined anew. The line's wait keeps the call's deadline, like the busy
 * handler's.
 */
static int line_enter(sqlite_backend *b)
{
	if (b->wq && b->wq_check) {
		b->wq_check = false;
		if (!dlock__wq_current(b->wq, b->paths[0])) {
			line_drop(b);
			b->wq_want = true;
		}
	}
	if (!b->wq && b->wq_want && dlock_clock_ms() >= b->wq_next) {
		b->wq_want = false;
		if (!(b->wq = dlock__wq_open(b->paths[0], true)))
			b->wq_next = dlock_clock_ms() + 1000;
	}
	if (!b->wq)
		return 0;
	int r = dlock__wq_enter(b->wq, b->deadline);
	if (r < 0) { /* unusable: go without, as before the line */
		line_drop(b);
		b->wq_next = dlock_clock_ms() + 1000;
		return 0;
	}
	if (r == 0)
		return 0;
	b->timed_out = true;
	return fail(b, SQLITE_BUSY, "begin");
}

static int begin(sqlite_backend *b)
{
	int rc = line_enter(b);
	if (!rc && (rc = run(b, prep(b, Q_BEGIN, NULL, NULL), "begin")))
		dlock__wq_leave(b->wq);
	return rc;
}

/* Commit (or roll back on failure) what begin() started, and leave the line. */
static int finish(sqlite_backend *b, int rc)
{
	if (rc == 0 || rc == DLOCK_ELOCKED || rc == DLOCK_ENOTHELD) {
		int c = run(b, prep(b, Q_COMMIT, NULL, NULL), "commit");
		if (c) {
			run(b, prep(b, Q_ROLLBACK, NULL, NULL), "rollback");
			rc = c;
		}
	} else if (!sqlite3_get_autocommit(b->db)) {
		dlock__saved_error saved;
		dlock__error_save(&saved);
		run(b, prep(b, Q_ROLLBACK, NULL, NULL), "rollback");
		dlock__error_restore(&saved);
	}
	dlock__wq_leave(b->wq);
	return rc;
}

static int64_t step_int(sqlite_backend *b, sqlite3_stmt *s, int col, int64_t dflt, int *err)
{
	int rc = sqlite3_step(s);
	int64_t v = dflt;
	if (rc == SQLITE_ROW && sqlite3_column_type(s, col) != SQLITE_NULL)
		v = sqlite3_column_int64(s, col);
	else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		*err = fail(b, rc, "query");
	sqlite3_reset(s);
	return v;
}

/* Holder rows of the name: live shared and other counts, the smallest limit
 * (permits) among the live exclusive holders (INT64_MAX: none), earliest live
 * expiry, the last fence handed out (-1: no fence row yet), whether any waiter
 * rows exist. */
static int read_holders(sqlite_backend *b, const char *n, int64_t now, int64_t *nshared, int64_t *nexcl,
			int64_t *limit, int64_t *first_expiry, int64_t *last_fence, bool *any_waiters)
{
	sqlite3_stmt *s = prep(b, Q_HOLDERS, n, NULL);
	int r;
	int64_t expired = 0, rows = 0;
	*nshared = *nexcl = 0;
	*limit = INT64_MAX;
	*first_expiry = *last_fence = -1;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		rows++;
		int64_t expires = sqlite3_column_int64(s, 3);
		*any_waiters = sqlite3_column_int(s, 4) != 0;
		if (sqlite3_column_int(s, 0)) /* the fence row */
			*last_fence = sqlite3_column_int64(s, 2);
		else if (expires <= now)
			expired++;
		else {
			if (sqlite3_column_int(s, 1) == DLOCK_SHARED) {
				++*nshared;
			} else {
				++*nexcl;
				int64_t p = sqlite3_column_int64(s, 5);
				if (p < *limit)
					*limit = p < 1 ? 1 : p;
			}
			if (*first_expiry < 0 || expires < *first_expiry)
				*first_expiry = expires;
		}
	}
	sqlite3_reset(s);
	if (r != SQLITE_DONE)
		return fail(b, r, "read holders");
	if (rows == 0) { /* never granted: no row to carry the waiter flag */
		int rc = 0;
		*any_waiters = step_int(b, prep(b, Q_ANY_WAITERS, n, NULL), 0, 0, &rc) != 0;
		if (rc)
			return rc;
	}
	if (expired == 0)
		return 0; /* the common case: nothing to delete, no write */
	s = prep(b, Q_PURGE_HOLDERS, n, NULL);
	sqlite3_bind_int64(s, 3, now);
	return run(b, s, "expire holders");
}

/*
 * A fair mutex waiter with two or more ahead of it cannot be next: it is
 * registered for FAR_TTL times the core's queue TTL and tells the core to
 * nap a third of that, since it is rung when it moves up to second place
 * (note_head). The first two in line keep the short registration's naps, so
 * one of them is always awake to notice a dead front; a registration is cut
 * to the short one when its waiter comes to the front, so a waiter that died
 * far back blocks the queue no longer than one that died at the front. With
 * 2,000 waiters, their refreshes (a read every second, a write every other)
 * were most of the store's work.
 */
#define FAR_TTL 10

/* How long a waiter `ahead` places from the front is registered for. */
static int64_t registration_ms(const dlock_request *req, int64_t ahead, bool own_heard)
{
	bool far_ok = req->fair && own_heard && req->mode != DLOCK_SHARED && req->permits == 1;
	return ahead >= 2 && far_ok ? req->queue_ttl_ms * FAR_TTL : req->queue_ttl_ms;
}

static int drop_dead_front(sqlite_backend *b, const dlock_request *req, int64_t *dropped);

/* The queue of req->name moved (inside the transaction, or after a
 * statement of its own): waiters at its front that are known dead leave
 * (drop_dead_front), the first two in line go into b->front, to ring after
 * it, and the front's registration is cut to a front waiter's. */
static int note_head(sqlite_backend *b, const dlock_request *req, int64_t now)
{
	int64_t dropped;
	int rc = drop_dead_front(b, req, &dropped), r = SQLITE_DONE, i = 0;
	memset(b->front, 0, sizeof b->front);
	if (rc)
		return rc;
	sqlite3_stmt *s = prep(b, Q_HEAD, req->name, NULL);
	while (i < 2 && (r = sqlite3_step(s)) == SQLITE_ROW) {
		const unsigned char *o = sqlite3_column_text(s, 0);
		snprintf(b->front[i++], sizeof b->front[0], "%s", o ? (const char *)o : "");
	}
	if (i < 2 && r != SQLITE_DONE)
		rc = fail(b, r, "read the queue's head");
	sqlite3_reset(s);
	if (!rc && b->front[0][0]) {
		s = prep(b, Q_CUT_HEAD, req->name, b->front[0]);
		sqlite3_bind_int64(s, 4, now + req->queue_ttl_ms);
		rc = run(b, s, "cut the front's registration");
	}
	return rc;
}

/* Expired waiter registrations of req->name go, and for a fair waiter the
 * dead at the front (the queue's head is noted when it moved). */
static int purge_waiters(sqlite_backend *b, const dlock_request *req, int64_t now)
{
	sqlite3_stmt *s = prep(b, Q_PURGE_WAITERS, req->name, NULL);
	sqlite3_bind_int64(s, 3, now);
	int rc = run(b, s, "expire waiters");
	int64_t moved = rc ? 0 : sqlite3_changes(b->db);
	if (!rc && !moved && req->fair)
		rc = drop_dead_front(b, req, &moved);
	if (!rc && moved > 0)
		rc = note_head(b, req, now);
	return rc;
}

/* Where req->owner stands in its name's queue: the waiters ahead of it,
 * counted up to `cap`, and (`excl`) whether one of them wants it exclusive
 * (every waiter is ahead when it has no row: *queued false). */
static int queue_place(sqlite_backend *b, const dlock_request *req, int64_t cap, bool excl, int64_t *ahead,
		       bool *excl_ahead, bool *queued)
{
	int rc = 0;
	sqlite3_stmt *s = prep(b, Q_MYSEQ, req->name, req->owner);
	int64_t myseq = step_int(b, s, 0, -1, &rc);
	if (rc)
		return rc;
	*queued = myseq >= 0;
	s = prep(b, Q_AHEAD, req->name, NULL);
	if (myseq >= 0)
		sqlite3_bind_int64(s, 3, myseq);
	sqlite3_bind_int64(s, 4, cap);
	*ahead = step_int(b, s, 0, 0, &rc);
	*excl_ahead = false;
	if (!rc && excl) {
		s = prep(b, Q_EXCL_AHEAD, req->name, NULL);
		if (myseq >= 0)
			sqlite3_bind_int64(s, 3, myseq);
		*excl_ahead = step_int(b, s, 0, 0, &rc) != 0;
	}
	return rc;
}

/* What one decision has read of the name's queue, so that a refusal after
 * the queue rules neither purges nor counts again in the same transaction. */
typedef struct queue_look {
	bool purged;     /* expired registrations are gone */
	bool placed;     /* ahead and excl_ahead are read */
	int64_t ahead;   /* waiters ahead of the requester, counted up to 2 at least */
	bool excl_ahead; /* one of them wants it exclusive (read for a reader only) */
} queue_look;

/* Where req->owner stands, into q (once per decision): the waiters ahead
 * counted up to `cap` (at least 2), and for a reader whether a writer is
 * among them. */
static int look_place(sqlite_backend *b, const dlock_request *req, int64_t cap, queue_look *q)
{
	bool queued, shared = req->mode == DLOCK_SHARED;
	if (q->placed)
		return 0;
	int rc = queue_place(b, req, cap > 2 ? cap : 2, shared, &q->ahead, &q->excl_ahead, &queued);
	q->placed = rc == 0;
	return rc;
}

/* Expired registrations gone, once per decision. */
static int look_purged(sqlite_backend *b, const dlock_request *req, int64_t now, queue_look *q)
{
	if (q->purged)
		return 0;
	int rc = purge_waiters(b, req, now);
	q->purged = rc == 0;
	return rc;
}

/* The queue rules, only when the name has waiter rows at all. */
static int queue_rules(sqlite_backend *b, dlock_request *req, int64_t now, int64_t nexcl, int64_t limit,
		       bool *conflict, queue_look *q)
{
	const char *n = req->name;
	int rc = look_purged(b, req, now, q);
	if (rc)
		return rc;
	/* Fair order, and readers yield to waiting writers. */
	if (req->fair) {
		if ((rc = look_place(b, req, limit, q)))
			return rc;
		*conflict = req->mode == DLOCK_SHARED ? q->excl_ahead : q->ahead + nexcl >= limit;
	} else if (req->mode == DLOCK_SHARED) {
		*conflict = step_int(b, prep(b, Q_WRITER_WAITING, n, req->owner), 0, 0, &rc) > 0;
	}
	return rc;
}

static bool bell_behind(sqlite_backend *b, const char *owner, bool behind, bool *own_heard);

/* A refused fair waiter: how many wait ahead of it (at least up to 2; 0 or
 * 1 for a reader: whether an exclusive one does)? With others ahead only its
 * own bell need wake it (see "doorbells"). *again: look again at once
 * (bell_behind); *own_heard: its own bell is watched. */
static int mark_behind(sqlite_backend *b, const dlock_request *req, queue_look *q, int64_t *ahead, bool *again,
		       bool *own_heard)
{
	int rc = look_place(b, req, 2, q);
	*ahead = req->mode == DLOCK_SHARED ? q->excl_ahead : q->ahead;
	if (!rc)
		*again = bell_behind(b, req->owner, *ahead > 0, own_heard);
	return rc;
}

/*
 * The next fence after `last` (-1: the name has no counter in this file):
 * never below this machine's wall clock in microseconds. Grants of one
 * file are write transactions, far more than a microsecond apart, so every
 * fence a file gave is at most the clock at its grant; a file made anew or
 * put in place later (deleted, cleaned, restored from a copy) starts above
 * all of them (docs/stores/sqlite.md, "Fences").
 */
static int64_t fence_after(int64_t last)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
	return last + 1 > us ? last + 1 : us;
}

static int decide(sqlite_backend *b, dlock_request *req, int64_t now, uint64_t *fence,
		  int64_t *retry_ms)
{
	const char *n = req->name;
	int64_t nexcl = 0, nshared = 0, limit, first_expiry = -1, last_fence = -1;
	bool queued = false;
	int rc = read_holders(b, n, now, &nshared, &nexcl, &limit, &first_expiry, &last_fence, &queued);
	if (rc)
		return rc;

	/* The smallest limit among the holders and the requester applies: a
	 * mutex (permits 1) excludes every semaphore caller and the reverse. */
	if ((int64_t)req->permits < limit)
		limit = req->permits;
	bool conflict;
	if (req->mode == DLOCK_SHARED)
		conflict = nexcl > 0;
	else
		conflict = nshared > 0 || nexcl >= limit;
	queue_look q = { 0 };
	if (!conflict && queued && (rc = queue_rules(b, req, now, nexcl, limit, &conflict, &q)))
		return rc;

	sqlite3_stmt *s;
	if (conflict) {
		bool again = false, own_heard = false;
		if (req->waiting) {
			int64_t ahead = 0;
			if ((rc = look_purged(b, req, now, &q)))
				return rc;
			/* where it will stand, before its registration (a new one goes last) */
			if (req->fair && b->bells && (rc = mark_behind(b, req, &q, &ahead, &again, &own_heard)))
				return rc;
			int64_t ttl = registration_ms(req, ahead, own_heard);
			s = prep(b, Q_ENQUEUE, n, req->owner);
			sqlite3_bind_int(s, 4, (int)req->mode);
			sqlite3_bind_int64(s, 5, now + ttl);
			sqlite3_bind_text(s, 6, req->host, -1, SQLITE_STATIC);
			sqlite3_bind_int(s, 7, req->pid);
			sqlite3_bind_int64(s, 8, ttl / 2);
			if ((rc = run(b, s, "enqueue waiter")))
				return rc;
			if (ahead >= 2 && ttl > req->queue_ttl_ms)
				req->nap_ms = ttl / 3;
		}
		if (first_expiry >= 0)
			*retry_ms = first_expiry > now ? first_expiry - now : 0;
		if (again)
			*retry_ms = 0;
		return DLOCK_ELOCKED;
	}

	/* Still inside BEGIN IMMEDIATE: nobody can have moved the counter since it was read. */
	int64_t f = last_fence < INT64_MAX ? fence_after(last_fence) : 0;
	if (f <= 0)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: fence counter out of range");
	s = prep(b, last_fence < 0 ? Q_FENCE_NEW : Q_FENCE_SET, n, NULL); /* new: the name's first grant */
	sqlite3_bind_int64(s, 3, f);
	if ((rc = run(b, s, "advance fence")))
		return rc;
	if (sqlite3_changes(b->db) != 1)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: fence counter did not advance");
	s = prep(b, Q_INSERT_HOLDER, n, req->owner);
	sqlite3_bind_int(s, 4, (int)req->mode);
	sqlite3_bind_int(s, 5, (int)req->permits);
	sqlite3_bind_int64(s, 6, f);
	sqlite3_bind_int64(s, 7, now + req->ttl_ms);
	sqlite3_bind_text(s, 8, req->host, -1, SQLITE_STATIC);
	sqlite3_bind_int(s, 9, req->pid);
	if ((rc = run(b, s, "insert holder")))
		return rc;
	if (queued && (rc = run(b, prep(b, Q_DEQUEUE, n, req->owner), "dequeue waiter")))
		return rc;
	if (queued && (rc = note_head(b, req, now)) != 0)
		return rc;
	*fence = (uint64_t)f;
	return 0;
}

/* ---- doorbells: waking waiters without polling ----
 *
 * Every client of a file is on this machine, so a release can wake the
 * waiters of the same name in other processes through the file system: a
 * directory "<db>.bells" beside the database holds one file per bucket of
 * names (64); a release, or a waiter leaving the queue, opens and closes
 * its bucket's file for writing ("rings"), and each waiting store handle
 * watches the bell files it listens to with inotify (not the directory: a
 * ring wakes only its listeners) and wakes the core's board for the names
 * it waits on in that bucket. A ring costs two system calls and is
 * skipped while no waiter has made the directory. A dead holder rings
 * nothing: its waiters come back when its lease ends (the acquire's
 * retry time). A ring that is missed or spurious costs one try, never
 * safety: every decision is still the database's.
 *
 * A fair waiter behind others cannot be granted before they are, so it does
 * not listen to its bucket (every release would wake it for nothing, and a
 * herd of refused write transactions is what slowed fair mode): it listens
 * only to a bell of its own, "o<hash of its owner>", which is rung when it
 * moves up to the front or to second place — by the grant that took the
 * waiter before it out of the queue, by that waiter's leaving, or by the
 * removal of an expired registration ahead (note_head). A waiter learns
 * where it stands from each refused try. A fair waiter's own bell is also
 * its presence (presence_take): the waiters at the front whose processes
 * died leave the queue at the next release, grant, cancel or fair try
 * (drop_dead_front), and the live one after them is rung. Without a
 * presence (no bells, an older library) a dead waiter is waited out by its
 * registration, as before (a waiter far back naps longer: FAR_TTL). */
#define NBELLS 64

typedef struct bell_watch {
	struct bell_watch *next;
	char *name;
	char owner[DLOCK__OWNER_MAX];
	unsigned bucket;
	int own_wd;    /* inotify watch of its own bell file, -1: none (yet, or its file was removed) */
	int live_fd;   /* its own bell file, open with a shared flock: its presence (-1: none) */
	bool behind;   /* a fair waiter with others ahead: only its own bell wakes it */
} bell_watch;

typedef struct bells {
	pthread_mutex_t mu;
	bell_watch *watches;  /* under mu */
	int bucket_wd[NBELLS]; /* the bucket files' watches (in the hub's instance), -1: not watched */
	sqlite_backend *b;    /* the handle it wakes */
	struct bells *next;   /* in the hub's list (under hub.mu) */
	bool started;         /* in the hub */
} bells;

/*
 * The hub: ONE inotify instance and one thread for the bells of every store
 * handle of the process, however many wait (a user has 128 instances by
 * default, and programs that are not ours need them too). Each event goes
 * to every handle's bells, which match it against their own watches. Two
 * handles watching one bell file get the same watch descriptor: `refs`
 * counts its users, and only the last one's leaving removes the watch.
 * Locks: hub.mu (the list, the instance's life) before a bells' mu before
 * hub.ref_mu. The thread ends when the last handle's bells go.
 */
typedef struct hub_ref {
	int wd, n;
} hub_ref;

static struct {
	pthread_mutex_t mu, ref_mu;
	bells *list;
	int ifd, stop[2];
	pthread_t thread;
	bool running;
	pid_t pid;        /* of the process that made it: a fork()'s child starts anew */
	hub_ref *refs;    /* under ref_mu */
	size_t nrefs, caprefs;
} hub = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, NULL, -1, { -1, -1 }, 0, false, 0, NULL, 0, 0 };

/* Watch a bell file (a path) in the hub's instance: its descriptor, or -1. */
static int hub_watch(const char *path)
{
	pthread_mutex_lock(&hub.ref_mu);
	int wd = inotify_add_watch(hub.ifd, path, IN_CLOSE_WRITE | IN_DONT_FOLLOW);
	if (wd >= 0) {
		size_t i = 0;
		while (i < hub.nrefs && hub.refs[i].wd != wd)
			i++;
		if (i == hub.nrefs) {
			if (hub.nrefs == hub.caprefs) {
				size_t cap = hub.caprefs ? 2 * hub.caprefs : 64;
				hub_ref *r = realloc(hub.refs, cap * sizeof(*r));
				if (!r) { /* cannot count it: do without this watch */
					inotify_rm_watch(hub.ifd, wd);
					pthread_mutex_unlock(&hub.ref_mu);
					errno = ENOMEM;
					return -1;
				}
				hub.refs = r;
				hub.caprefs = cap;
			}
			hub.refs[hub.nrefs++] = (hub_ref){ wd, 0 };
		}
		hub.refs[i].n++;
	}
	pthread_mutex_unlock(&hub.ref_mu);
	return wd;
}

/* One user of watch wd leaves (`gone`: the kernel removed it, IN_IGNORED). */
static void hub_unwatch(int wd, bool gone)
{
	pthread_mutex_lock(&hub.ref_mu);
	for (size_t i = 0; i < hub.nrefs; i++)
		if (hub.refs[i].wd == wd) {
			if (gone || --hub.refs[i].n <= 0) {
				if (!gone)
					inotify_rm_watch(hub.ifd, wd);
				hub.refs[i] = hub.refs[--hub.nrefs];
			}
			break;
		}
	pthread_mutex_unlock(&hub.ref_mu);
}

/* In a fork()'s child: the parent's hub (its thread is not here; its locks
 * may have been held at the fork) is forgotten, its descriptors closed. */
static void hub_after_fork(void)
{
	if (hub.pid == 0 || hub.pid == getpid())
		return;
	pthread_mutex_init(&hub.mu, NULL);
	pthread_mutex_init(&hub.ref_mu, NULL);
	if (hub.ifd >= 0)
		close(hub.ifd);
	for (int i = 0; i < 2; i++)
		if (hub.stop[i] >= 0)
			close(hub.stop[i]);
	free(hub.refs);
	hub.refs = NULL;
	hub.nrefs = hub.caprefs = 0;
	hub.ifd = hub.stop[0] = hub.stop[1] = -1;
	hub.list = NULL;
	hub.running = false;
	hub.pid = 0;
}

static char *bells_dir(const sqlite_backend *b)
{
	return dlock__sprintf("%s.bells", b->paths[0]);
}

/* The modes of the bells directory and its files follow the database's:
 * its owner, and the group or others where the file lets them write (they
 * ring and listen too). Set explicitly, not left to the umask (a group of
 * a 0660 database lost its bits and polled). A directory others may write
 * is sticky: nobody removes another user's bell. */
static mode_t bells_dir_mode(mode_t db)
{
	mode_t m = 0700 | (db & 0020 ? 0070 : 0) | (db & 0002 ? 0007 : 0);
	return m & 0077 ? m | S_ISVTX : m;
}

static mode_t bell_file_mode(mode_t db)
{
	return 0600 | (db & 0020 ? 0060 : 0) | (db & 0002 ? 0006 : 0);
}

/*
 * The bells directory, opened as one we may trust — checked like the
 * writers' line (writeq.c): "<db>.bells" itself not a symbolic link
 * (O_NOFOLLOW: a link another user planted sent root's rings, and its
 * removals of stale bells, into a directory of the link's choosing), a
 * directory, owned by someone who may write the database anyway (us, its
 * owner, its group's members when the group may write it: the directory
 * has its group; anyone when others may), and writable by nobody the
 * database does not let write. With `make`, made first when
 * missing, and a directory of ours given the database's bits. A descriptor,
 * or -1 (missing and not made, or not trusted: no bells, the core polls).
 */
static int bells_dir_open(const sqlite_backend *b, bool make)
{
	char *dir = bells_dir(b);
	if (!dir)
		return -1;
	mode_t mode = bells_dir_mode(b->db_mode);
	if (make)
		(void)mkdir(dir, 0700);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	free(dir);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		goto refuse;
	if (make && st.st_uid == geteuid() && (st.st_mode & 07777) != mode &&
	    (fchmod(fd, mode) != 0 || fstat(fd, &st) != 0))
		goto refuse;
	bool owner_ok = st.st_uid == geteuid() || st.st_uid == b->db_uid ||
			(b->db_mode & 0020 && st.st_gid == b->db_gid) || b->db_mode & 0002;
	if (S_ISDIR(st.st_mode) && owner_ok && !(st.st_mode & 0022 & ~(b->db_mode & 0022)))
		return fd;
refuse:
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Open bell `file` in the directory `dir` (made when missing and `create`,
 * with the database's bits); -1 and errno. */
static int bell_open(const sqlite_backend *b, int dir, const char *file, int how, bool create)
{
	int flags = how | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	int fd = openat(dir, file, flags);
	if (fd >= 0 || errno != ENOENT || !create)
		return fd;
	fd = openat(dir, file, flags | O_CREAT | O_EXCL, 0600);
	if (fd >= 0)
		(void)fchmod(fd, bell_file_mode(b->db_mode));
	else if (errno == EEXIST) /* made meanwhile by another */
		fd = openat(dir, file, flags);
	return fd;
}

static unsigned bell_bucket(const sqlite_backend *b, const char *name)
{
	uint64_t h = dlock__fnv1a64(DLOCK__FNV64_OFFSET, b->ns, strlen(b->ns) + 1);
	return (unsigned)(dlock__fnv1a64(h, name, strlen(name)) % NBELLS);
}

static uint64_t owner_bell(const sqlite_backend *b, const char *owner)
{
	uint64_t h = dlock__fnv1a64(DLOCK__FNV64_OFFSET, b->ns, strlen(b->ns) + 1);
	return dlock__fnv1a64(h, owner, strlen(owner));
}

/* The file name of an owner's own bell. */
static void bell_name(const sqlite_backend *b, const char *owner, char *f, size_t n)
{
	snprintf(f, n, "o%016" PRIx64, owner_bell(b, owner));
}

/*
 * A fair waiter's presence: its own bell file, made with one byte in it and
 * held open with a shared flock() for as long as it waits. The kernel lets
 * go of the lock the moment its process dies (however it dies), so a waiter
 * at the front of a queue is known dead at once instead of after its
 * registration: a byte in the file and no lock on it. The file is made
 * under a temporary name, written, locked, then linked in: nobody sees it at
 * its name unlocked while its waiter lives. An empty file (an older library
 * made it, without the lock) or none says nothing: the registration's TTL
 * decides, as before. A fork()'s child that keeps the descriptor keeps the
 * lock: its dead parent then counts as alive until its registration ends.
 */
static int presence_take(const sqlite_backend *b, int dir, const char *file)
{
	char tmp[64];
	snprintf(tmp, sizeof tmp, "t%s.%d.%08llx", file, (int)getpid(),
		 (unsigned long long)dlock__rand_between(0, 0xffffffff));
	int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	bool ok = fchmod(fd, bell_file_mode(b->db_mode)) == 0 && write(fd, "w", 1) == 1;
	close(fd);
	fd = ok ? openat(dir, tmp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
	if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0 && linkat(dir, tmp, dir, file, 0) != 0) {
		bool there = errno == EEXIST; /* made by an earlier watch of this waiter: lock that one */
		close(fd);
		fd = there ? openat(dir, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
		if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) {
			close(fd);
			fd = -1;
		}
	}
	unlinkat(dir, tmp, 0);
	return fd;
}

/* Is the waiter `owner` known dead (its presence, above, unlocked)? */
static bool waiter_gone(const sqlite_backend *b, int dir, const char *owner)
{
	char f[24];
	bell_name(b, owner, f, sizeof f);
	int fd = openat(dir, f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return false;
	struct stat st;
	bool gone = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
		    flock(fd, LOCK_EX | LOCK_NB) == 0;
	close(fd); /* and our lock with it */
	return gone;
}

/* Waiters at the front of req->name's queue that are known dead leave it
 * now, however many died there (inside the write transaction): the queue
 * waits out no dead registration, short or long. *dropped: how many. */
#define FRONT_BATCH 16
#define FRONT_MAX 4096

static int drop_dead_front(sqlite_backend *b, const dlock_request *req, int64_t *dropped)
{
	*dropped = 0;
	int dir = bells_dir_open(b, false);
	if (dir < 0) { /* no bells: no presence either */
		dlock_error_clear();
		return 0;
	}
	int rc = 0;
	bool alive = false;
	while (!rc && !alive && *dropped < FRONT_MAX) {
		char owners[FRONT_BATCH][DLOCK__OWNER_MAX];
		int n = 0, r;
		sqlite3_stmt *s = prep(b, Q_FRONT, req->name, NULL);
		sqlite3_bind_int(s, 3, FRONT_BATCH);
		while (n < FRONT_BATCH && (r = sqlite3_step(s)) == SQLITE_ROW) {
			const unsigned char *o = sqlite3_column_text(s, 0);
			snprintf(owners[n++], sizeof owners[0], "%s", o ? (const char *)o : "");
		}
		if (n < FRONT_BATCH && r != SQLITE_DONE)
			rc = fail(b, r, "read the queue's front");
		sqlite3_reset(s);
		for (int i = 0; i < n && !rc && !alive; i++) {
			if (!(alive = !waiter_gone(b, dir, owners[i])) &&
			    !(rc = run(b, prep(b, Q_DEQUEUE, req->name, owners[i]), "drop a dead waiter")))
				++*dropped;
		}
		if (n < FRONT_BATCH)
			break;
	}
	close(dir);
	return rc;
}

/* Ring a bell file (best effort; nothing when no waiter made the directory).
 * A waiter's own bell (`own`) is rung only while it exists: its waiter made
 * it, and watches it, before the try that registered it, and removes it when
 * its wait ends. Not made here, nor removed after the ring: a second ring
 * before the waiter looked again would then go to a new file nobody watches
 * (a grant rings the second in line, and the next grant the same waiter at
 * the front). */
static void ring_file(const sqlite_backend *b, const char *file, bool own)
{
	int dir = bells_dir_open(b, false);
	if (dir >= 0) {
		int fd = bell_open(b, dir, file, O_WRONLY, !own);
		if (fd >= 0)
			close(fd);
		close(dir);
	}
	dlock_error_clear(); /* an allocation that failed above is not the caller's error */
}

/* Ring the bucket of `name`: its waiters at the front (and unfair ones) look. */
static void ring(const sqlite_backend *b, const char *name)
{
	char f[8];
	snprintf(f, sizeof f, "%02x", bell_bucket(b, name));
	ring_file(b, f, false);
}

/* Ring the bells of the first two in line of a queue that moved (note_head). */
static void ring_front(sqlite_backend *b)
{
	for (int i = 0; i < 2 && b->front[i][0]; i++) {
		char f[24];
		bell_name(b, b->front[i], f, sizeof f);
		ring_file(b, f, true);
	}
	memset(b->front, 0, sizeof b->front);
}

/* The events of one read, for one handle's bells (under bl->mu). */
static void bells_dispatch(bells *bl, const char *buf, ssize_t n)
{
	bool rung[NBELLS] = { false }, lost[NBELLS] = { false }, all = false;
	int own[64], gone[64];
	size_t nown = 0, ngone = 0;
	for (const char *q = buf; q < buf + n;) {
		const struct inotify_event *ev = (const struct inotify_event *)q;
		q += sizeof(*ev) + ev->len;
		if (ev->mask & IN_Q_OVERFLOW) {
			all = true;
			continue;
		}
		bool bucket = false;
		for (unsigned v = 0; v < NBELLS && !bucket; v++)
			if (bl->bucket_wd[v] == ev->wd) {
				bucket = true;
				if (ev->mask & IN_IGNORED) {
					/* the file went (deleted): its listeners look now,
					 * and their next try makes and watches it again */
					bl->bucket_wd[v] = -1;
					lost[v] = true;
				} else {
					rung[v] = true;
				}
			}
		if (bucket)
			continue;
		if (ev->mask & IN_IGNORED) /* an own bell removed: rung, or deleted by someone */
			ngone < 64 ? (void)(gone[ngone++] = ev->wd) : (void)(all = true);
		else if (ev->mask & IN_CLOSE_WRITE)
			nown < 64 ? (void)(own[nown++] = ev->wd) : (void)(all = true);
	}
	for (bell_watch *w = bl->watches; w; w = w->next) {
		bool mine = false;
		for (size_t i = 0; i < nown && !mine; i++)
			mine = w->own_wd >= 0 && own[i] == w->own_wd;
		for (size_t i = 0; i < ngone; i++)
			if (w->own_wd >= 0 && gone[i] == w->own_wd) {
				w->own_wd = -1;
				mine = true; /* its file was removed: look, and watch a new one */
			}
		if (mine)
			dlock_backend_wake_owner(&bl->b->base, w->owner);
		else if (all || lost[w->bucket] || (rung[w->bucket] && !w->behind))
			dlock_backend_wake(&bl->b->base, w->name);
	}
}

/* The thread's descriptors come in its argument (int[2], freed here): the
 * last handle's leaving resets hub's fields before it joins the thread. */
static void *hub_main(void *arg)
{
	int ifd = ((int *)arg)[0], stop = ((int *)arg)[1];
	free(arg);
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		struct pollfd p[2] = { { ifd, POLLIN, 0 }, { stop, POLLIN, 0 } };
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		ssize_t n = read(ifd, buf, sizeof buf);
		if (n <= 0)
			continue;
		pthread_mutex_lock(&hub.mu);
		for (const char *q = buf; q < buf + n;) { /* watches the kernel removed */
			const struct inotify_event *ev = (const struct inotify_event *)q;
			q += sizeof(*ev) + ev->len;
			if (ev->mask & IN_IGNORED)
				hub_unwatch(ev->wd, true);
		}
		for (bells *bl = hub.list; bl; bl = bl->next) {
			pthread_mutex_lock(&bl->mu);
			bells_dispatch(bl, buf, n);
			pthread_mutex_unlock(&bl->mu);
		}
		pthread_mutex_unlock(&hub.mu);
	}
	return NULL;
}

/* A waiter makes its own bell file and removes it when it stops waiting;
 * one that died waiting leaves it.
 * Such files untouched for an hour are removed when a handle starts its
 * bells: a live waiter whose file goes makes a new one at its next try. */
#define STALE_BELL_S 3600

static void sweep_stale_bells(int dir)
{
	int fd = dup(dir);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	time_t now = time(NULL);
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		struct stat st;
		bool own = e->d_name[0] == 'o' && strlen(e->d_name) == 17, tmp = e->d_name[0] == 't';
		if ((own || tmp) && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(st.st_mode) && now - st.st_mtime > STALE_BELL_S) {
			/* not the bell of a waiter still waiting (its presence locked) */
			int f = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
			if (f >= 0 && flock(f, LOCK_EX | LOCK_NB) == 0)
				unlinkat(dirfd(d), e->d_name, 0);
			if (f >= 0)
				close(f);
		}
	}
	closedir(d);
}

/* Start the bells (once per handle): into the hub, started with the
 * first. 0 or an error (the core then polls). */
static int bells_start(sqlite_backend *b)
{
	if (b->bells)
		return b->bells->started ? 0 : DLOCK_ESTORE;
	bells *bl = dlock__calloc(1, sizeof(*bl));
	if (!bl)
		return DLOCK_ENOMEM;
	pthread_mutex_init(&bl->mu, NULL);
	for (unsigned v = 0; v < NBELLS; v++)
		bl->bucket_wd[v] = -1;
	bl->b = b;
	b->bells = bl;
	int dir = bells_dir_open(b, true);
	if (dir < 0)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL,
				       "sqlite: %s.bells is not a directory of this database's owner (or it "
				       "cannot be made): waiters poll", b->paths[0]);
	sweep_stale_bells(dir);
	close(dir);
	pthread_mutex_lock(&hub.mu);
	hub_after_fork();
	int e = 0;
	if (!hub.running) {
		int *fds = NULL;
		if ((hub.ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0 || pipe2(hub.stop, O_CLOEXEC) != 0 ||
		    !(fds = malloc(2 * sizeof(int))) || (fds[0] = hub.ifd, fds[1] = hub.stop[0], false) ||
		    pthread_create(&hub.thread, NULL, hub_main, fds) != 0) {
			e = errno ? errno : EAGAIN;
			free(fds);
			if (hub.ifd >= 0)
				close(hub.ifd);
			for (int i = 0; i < 2; i++)
				if (hub.stop[i] >= 0)
					close(hub.stop[i]);
			hub.ifd = hub.stop[0] = hub.stop[1] = -1;
		} else {
			hub.running = true;
			hub.pid = getpid();
		}
	}
	if (!e) {
		bl->next = hub.list;
		hub.list = bl;
		bl->started = true;
	}
	pthread_mutex_unlock(&hub.mu);
	if (e)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: cannot watch for wake-ups: %s",
				       strerror(e));
	return 0;
}

/* Forget the bells (close; or fork's child: `in_parent` false, the hub is
 * the parent's). The last handle's leaving stops the hub. */
static void bells_free(sqlite_backend *b, bool in_parent)
{
	bells *bl = b->bells;
	if (!bl)
		return;
	pthread_mutex_lock(&hub.mu);
	hub_after_fork();
	bool stop = false;
	pthread_t thread;
	int fds[3] = { -1, -1, -1 };
	if (bl->started && in_parent) {
		for (bells **p = &hub.list; *p; p = &(*p)->next)
			if (*p == bl) {
				*p = bl->next;
				break;
			}
		/* out of the list: the thread no longer looks at it */
		for (unsigned v = 0; v < NBELLS; v++)
			if (bl->bucket_wd[v] >= 0)
				hub_unwatch(bl->bucket_wd[v], false);
		for (bell_watch *w = bl->watches; w; w = w->next)
			if (w->own_wd >= 0)
				hub_unwatch(w->own_wd, false);
		if (!hub.list && hub.running) {
			stop = true;
			thread = hub.thread;
			fds[0] = hub.ifd;
			fds[1] = hub.stop[0];
			fds[2] = hub.stop[1];
			hub.ifd = hub.stop[0] = hub.stop[1] = -1;
			hub.running = false;
			free(hub.refs);
			hub.refs = NULL;
			hub.nrefs = hub.caprefs = 0;
		}
	}
	pthread_mutex_unlock(&hub.mu);
	if (stop) {
		(void)!write(fds[2], "x", 1);
		pthread_join(thread, NULL);
		for (int i = 0; i < 3; i++)
			close(fds[i]);
	}
	while (bl->watches) {
		bell_watch *w = bl->watches;
		bl->watches = w->next;
		/* a fork()'s child only closes its copy: the parent's lock stays */
		if (w->live_fd >= 0)
			close(w->live_fd);
		free(w->name);
		free(w);
	}
	if (in_parent)
		pthread_mutex_destroy(&bl->mu);
	free(bl);
	b->bells = NULL;
}

/* Watch bell `file` for rings into *wd, unless *wd is a watch already
 * (the file is created empty if missing, which rings nothing: opened for
 * reading). A watch of the file, not of the directory: a ring wakes only
 * the processes listening to that bell. */
static int watch_bell(const sqlite_backend *b, const char *file, int *wd, int *live)
{
	if (*wd >= 0)
		return 0;
	/* the directory at the path now (made again if it vanished), checked */
	int dir = bells_dir_open(b, true);
	int fd = dir < 0 ? -1 : live ? presence_take(b, dir, file) : bell_open(b, dir, file, O_RDONLY, true);
	if (fd >= 0 && live) { /* kept: the presence of its waiter */
		if (*live >= 0)
			close(*live);
		*live = fd;
		fd = dup(fd);
	}
	if (fd >= 0) {
		close(fd);
		/* through the checked directory's descriptor, not its name */
		char f[64];
		snprintf(f, sizeof f, "/proc/self/fd/%d/%s", dir, file);
		*wd = hub_watch(f);
	}
	int e = errno;
	if (dir >= 0)
		close(dir);
	return *wd >= 0 ? 0
			: dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: cannot watch a doorbell: %s",
					  dir < 0 ? "the bells directory is not trusted" : strerror(e));
}

/* Watch bucket v's bell file (a no-op when watched already). (under bl->mu) */
static int watch_bucket(const sqlite_backend *b, unsigned v)
{
	char bucket[8];
	snprintf(bucket, sizeof bucket, "%02x", v);
	return watch_bell(b, bucket, &b->bells->bucket_wd[v], NULL);
}

/* Does a waiter of this handle listen to bucket v? (under bl->mu) */
static bool bucket_heard(const bells *bl, unsigned v)
{
	for (const bell_watch *w = bl->watches; w; w = w->next)
		if (w->bucket == v && !w->behind)
			return true;
	return false;
}

/* The bucket's watch goes when a fair waiter falls behind and no other
 * waiter here listens to it: the kernel then wakes only the processes that
 * do (with 1,000 fair waiters, every release woke 1,000 bell threads for one
 * front waiter). Its IN_IGNORED matches no watch any more: nothing is woken
 * for it. It stays when a wait ends (the next wait of the handle, the
 * common case, would make it again: two system calls per acquire). (under
 * bl->mu) */
static void bucket_unheard(bells *bl, unsigned v)
{
	if (bl->bucket_wd[v] >= 0 && !bucket_heard(bl, v)) {
		hub_unwatch(bl->bucket_wd[v], false);
		bl->bucket_wd[v] = -1;
	}
}

static int sq_watch(dlock_backend *be, const dlock_request *req)
{
	sqlite_backend *b = (sqlite_backend *)be;
	int rc = bells_start(b);
	if (rc)
		return rc;
	bells *bl = b->bells;
	pthread_mutex_lock(&bl->mu);
	bell_watch *w;
	for (w = bl->watches; w; w = w->next)
		if (strcmp(w->owner, req->owner) == 0)
			break;
	if (w && strcmp(w->name, req->name) != 0) { /* a handle reused for another name */
		char *n = dlock__strdup(req->name);
		if (n) {
			free(w->name);
			w->name = n;
			w->bucket = bell_bucket(b, req->name);
		}
	} else if (!w && (w = calloc(1, sizeof(*w))) != NULL) {
		if ((w->name = dlock__strdup(req->name)) != NULL) {
			snprintf(w->owner, sizeof(w->owner), "%s", req->owner);
			w->bucket = bell_bucket(b, req->name);
			w->own_wd = -1;
			w->live_fd = -1;
			w->next = bl->watches;
			bl->watches = w;
		} else {
			free(w);
			w = NULL;
		}
	}
	rc = w ? 0 : DLOCK_ENOMEM;
	if (w) {
		char own[24];
		/* only a fair waiter may be rung alone (when it comes to the front) */
		if (!(rc = watch_bucket(b, w->bucket)) && req->fair) {
			bell_name(b, w->owner, own, sizeof own);
			rc = watch_bell(b, own, &w->own_wd, &w->live_fd);
		}
	}
	pthread_mutex_unlock(&bl->mu);
	return rc;
}

static void sq_unwatch(dlock_backend *be, const dlock_request *req)
{
	sqlite_backend *b = (sqlite_backend *)be;
	bells *bl = b->bells;
	if (!bl)
		return;
	pthread_mutex_lock(&bl->mu);
	for (bell_watch **p = &bl->watches; *p; p = &(*p)->next) {
		if (strcmp((*p)->owner, req->owner) == 0) {
			bell_watch *w = *p;
			*p = w->next;
			if (w->own_wd >= 0) { /* its bell: take it away (its presence with it) */
				char f[24];
				bell_name(b, w->owner, f, sizeof f);
				hub_unwatch(w->own_wd, false);
				int dir = bells_dir_open(b, false);
				if (dir >= 0) {
					unlinkat(dir, f, 0);
					close(dir);
				}
			}
			if (w->live_fd >= 0)
				close(w->live_fd);
			free(w->name);
			free(w);
			break;
		}
	}
	pthread_mutex_unlock(&bl->mu);
}

/*
 * After a refused try of a watched waiter: whether it has others ahead.
 * True when it came to the front and its bucket was watched again just now:
 * a release between its look and that watch rang unheard, so it must look
 * again at once.
 */
static bool bell_behind(sqlite_backend *b, const char *owner, bool behind, bool *own_heard)
{
	bells *bl = b->bells;
	bool again = false;
	*own_heard = false;
	if (!bl)
		return false;
	pthread_mutex_lock(&bl->mu);
	for (bell_watch *w = bl->watches; w; w = w->next)
		if (strcmp(w->owner, owner) == 0) {
			w->behind = behind;
			*own_heard = w->own_wd >= 0;
			if (behind)
				bucket_unheard(bl, w->bucket);
			else if (bl->bucket_wd[w->bucket] < 0)
				again = watch_bucket(b, w->bucket) == 0;
		}
	pthread_mutex_unlock(&bl->mu);
	return again;
}

/*
 * A registered mutex waiter's try while the name is held by a live lease and
 * its registration needs no refresh yet: refused by a read, without the
 * write lock (a decision in BEGIN IMMEDIATE would write nothing either). With
 * 2,000 waiters, their write transactions starved a release of the write
 * lock past its deadline. True when refused so (*retry_ms set); false: decide
 * in full (also when the read fails).
 */
static bool peek_held(sqlite_backend *b, dlock_request *req, int64_t now, int64_t *retry_ms)
{
	if (!req->waiting || req->mode == DLOCK_SHARED || req->permits != 1)
		return false;
	/* The first try of an acquire call (within 1 ms of its ticket, which is
	 * the call's start plus under 1 ms) is not registered yet: the peek would
	 * cost a read transaction and find nothing to refuse with. */
	if (now * 1000 - req->ticket_us < 1000)
		return false;
	sqlite3_stmt *s = prep(b, Q_PEEK, req->name, req->owner);
	sqlite3_bind_int64(s, 4, now);
	bool held = false;
	if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) {
		int64_t ahead = sqlite3_column_int64(s, 2), left = sqlite3_column_int64(s, 1) - now;
		bool again = false, own_heard = false;
		if (req->fair)
			again = bell_behind(b, req->owner, ahead > 0, &own_heard);
		/* refused by a read while the registration fits its place: not
		 * half gone, nor longer than the place wants (a decision cuts it) */
		int64_t ttl = registration_ms(req, ahead, own_heard);
		if (left >= ttl / 2 && left <= ttl) {
			held = true;
			*retry_ms = again ? 0 : sqlite3_column_int64(s, 0) - now;
			if (ahead >= 2 && ttl > req->queue_ttl_ms)
				req->nap_ms = ttl / 3;
		}
	}
	sqlite3_reset(s);
	return held;
}

static int acquire_in(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, req->deadline_ms);
	int rc = reopen_if_moved(b, b->deadline);
	if (rc)
		return rc;
	if (peek_held(b, req, dlock_wall_ms(), retry_ms))
		return DLOCK_ELOCKED;
	if ((rc = begin(b))) {
		/* Nothing was written: the outcome is known. Say "not now" (the
		 * core backs off and tries again until the wait ends) rather than
		 * a failure the core must treat as maybe applied and undo. */
		if (rc == DLOCK_EUNAVAILABLE && b->timed_out)
			rc = dlock_error_set(DLOCK_ELOCKED, "sqlite", "5",
					     "sqlite: lock '%s' not tried: another connection kept the database's "
					     "write lock until the deadline", req->name);
		return rc;
	}
	memset(b->front, 0, sizeof b->front);
	rc = finish(b, decide(b, req, dlock_wall_ms(), fence, retry_ms));
	if (rc == 0 || rc == DLOCK_ELOCKED)
		ring_front(b); /* committed: the first two in line moved up */
	return rc;
}

static int release_in(dlock_backend *be, dlock_request *req)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, req->deadline_ms);
	int rc = check_files(b, false);
	if (rc)
		return rc;
	/* One write transaction: the delete, and whether a waiter is queued. */
	if ((rc = begin(b)))
		return rc;
	sqlite3_stmt *s = prep(b, Q_RELEASE, req->name, req->owner);
	sqlite3_bind_int64(s, 4, dlock_wall_ms());
	if ((rc = run(b, s, "release")))
		return finish(b, rc);
	if (sqlite3_changes(b->db) == 0)
		return finish(b, DLOCK_ENOTHELD); /* the core words it */
	/* Ring only for a queued waiter: a waiter's try registers it in the same
	 * write transaction as it saw the hold, so one that saw this hold is in
	 * the queue now (a read failure rings: a spurious ring costs one try). */
	int err = 0;
	bool waiters = step_int(b, prep(b, Q_ANY_WAITERS, req->name, NULL), 0, 1, &err) != 0 || err;
	/* Dead waiters at the front leave now: the live one after them is rung
	 * (its own bell) instead of waiting out their registrations. */
	int64_t dropped = 0;
	memset(b->front, 0, sizeof b->front);
	if (waiters && !err && (rc = drop_dead_front(b, req, &dropped)) == 0 && dropped > 0)
		rc = note_head(b, req, dlock_wall_ms());
	else if (waiters && !err && !rc) {
		/* the front is rung on its own bell too, not only through the
		 * bucket: a fair front waiter whose bucket watch was missing when
		 * the bucket rang slept a whole nap (issue 31, 5b) */
		sqlite3_stmt *s2 = prep(b, Q_HEAD, req->name, NULL);
		if (sqlite3_step(s2) == SQLITE_ROW) {
			const unsigned char *o = sqlite3_column_text(s2, 0);
			snprintf(b->front[0], sizeof b->front[0], "%s", o ? (const char *)o : "");
		}
		sqlite3_reset(s2);
	}
	if (rc) { /* only an order: the release stands */
		dlock_error_clear();
		rc = 0;
	}
	if ((rc = finish(b, 0)))
		return rc;
	if (waiters)
		ring(b, req->name);
	ring_front(b);
	dlock_error_clear();
	return 0;
}

static int extend_one(sqlite_backend *b, dlock_request *req, int64_t ttl_ms, int64_t now)
{
	sqlite3_stmt *s = prep(b, Q_EXTEND, req->name, req->owner);
	sqlite3_bind_int64(s, 4, now + ttl_ms);
	sqlite3_bind_int64(s, 5, now);
	int rc = run(b, s, "extend");
	if (rc)
		return rc;
	if (sqlite3_changes(b->db) == 0)
		return dlock_error_set(DLOCK_ENOTHELD, "sqlite", NULL,
				       "lock '%s' is not held by this owner (expired or released)", req->name);
	return 0;
}

static int extend_in(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, req->deadline_ms);
	int rc = check_files(b, false);
	if (rc || (rc = line_enter(b)))
		return rc;
	rc = extend_one(b, req, ttl_ms, dlock_wall_ms());
	dlock__wq_leave(b->wq);
	return rc;
}

static int renew_in(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	sqlite_backend *b = (sqlite_backend *)be;
	if (n == 0)
		return 0;
	set_deadline(b, reqs[0]->deadline_ms); /* the same for the batch */
	int rc = check_files(b, true);
	if (rc == DLOCK_ENOTHELD) {
		for (size_t i = 0; i < n; i++)
			results[i] = DLOCK_ENOTHELD;
		return 0;
	}
	if ((rc = begin(b)))
		return rc;
	int64_t now = dlock_wall_ms();
	for (size_t i = 0; i < n; i++) {
		results[i] = extend_one(b, reqs[i], reqs[i]->ttl_ms, now);
		if (results[i] != 0 && results[i] != DLOCK_ENOTHELD)
			return finish(b, results[i]);
	}
	return finish(b, 0);
}

static int cancel_in(dlock_backend *be, dlock_request *req)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, req->deadline_ms);
	if (check_files(b, false))
		return 0; /* the queue we were in went with the old file */
	int rc = line_enter(b);
	if (rc)
		return rc;
	rc = run(b, prep(b, Q_DEQUEUE, req->name, req->owner), "cancel waiter");
	int dequeued = rc == 0 ? sqlite3_changes(b->db) : 0;
	bool noted = dequeued > 0 && note_head(b, req, dlock_wall_ms()) == 0;
	dlock__wq_leave(b->wq);
	if (dequeued > 0) {
		ring(b, req->name); /* the queue moved: the next in line may go now */
		if (noted)
			ring_front(b);
	}
	return rc;
}

static char *col_text(sqlite3_stmt *s, int col)
{
	const unsigned char *t = sqlite3_column_text(s, col);
	return dlock__strdup(t ? (const char *)t : "");
}

static int status_one(sqlite_backend *b, const char *name, int64_t now, dlock_lock_status **out,
		      size_t *count)
{
	dlock_lock_status *st = dlock__status_add(out, count);
	if (!st || !(st->name = dlock__strdup(name)))
		return DLOCK_ENOMEM;
	int rc = 0, r;
	sqlite3_stmt *s = prep(b, Q_STATUS_HOLDERS, name, NULL);
	sqlite3_bind_int64(s, 3, now);
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		dlock_holder *h = dlock__status_add_holder(st);
		if (!h) {
			sqlite3_reset(s);
			return DLOCK_ENOMEM;
		}
		h->owner = col_text(s, 0);
		h->host = col_text(s, 1);
		h->pid = sqlite3_column_int(s, 2);
		h->mode = sqlite3_column_int(s, 3) == DLOCK_SHARED ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		h->fence = (uint64_t)sqlite3_column_int64(s, 4);
		h->ttl_left_ms = sqlite3_column_int64(s, 5) - now;
		st->permits = (unsigned)sqlite3_column_int(s, 6);
		if (!h->owner || !h->host) {
			sqlite3_reset(s);
			return DLOCK_ENOMEM;
		}
	}
	sqlite3_reset(s);
	if (r != SQLITE_DONE)
		return fail(b, r, "status");
	st->last_fence = (uint64_t)step_int(b, prep(b, Q_STATUS_FENCE, name, NULL), 0, 0, &rc);
	s = prep(b, Q_STATUS_WAITERS, name, NULL);
	sqlite3_bind_int64(s, 3, now);
	st->waiters = (size_t)step_int(b, s, 0, 0, &rc);
	return rc;
}

static int status_in(dlock_backend *be, const char *const *names, size_t nnames,
		     dlock_lock_status **out, size_t *count)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, dlock_clock_ms() + b->request_timeout_ms);
	int rc = reopen_if_moved(b, b->deadline);
	int64_t now = dlock_wall_ms();
	for (size_t i = 0; i < nnames && !rc; i++)
		rc = status_one(b, names[i], now, out, count);
	return rc;
}

static int list_in(dlock_backend *be, char ***names, size_t *count)
{
	sqlite_backend *b = (sqlite_backend *)be;
	set_deadline(b, dlock_clock_ms() + b->request_timeout_ms);
	int rc = reopen_if_moved(b, b->deadline);
	if (rc)
		return rc;
	char **list = NULL;
	size_t n = 0;
	sqlite3_stmt *s = prep(b, Q_STATUS_NAMES, NULL, NULL);
	sqlite3_bind_text(s, 1, b->ns, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, dlock_wall_ms());
	int r;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		char **nl = realloc(list, (n + 1) * sizeof(*nl));
		if (!nl || !(nl[n] = col_text(s, 0))) {
			if (nl)
				list = nl;
			rc = dlock__oom();
			break;
		}
		list = nl;
		n++;
	}
	sqlite3_reset(s);
	if (!rc && r != SQLITE_DONE)
		rc = fail(b, r, "status");
	*names = list;
	*count = n;
	return rc;
}

static void sq_close(dlock_backend *be)
{
	sqlite_backend *b = (sqlite_backend *)be;
	/* A close after the files moved must not checkpoint and delete the
	 * -wal and -shm by name either. (A fork()'s child never gets here with
	 * the parent's connection: the core does not call an inherited store.) */
	if (b->db) {
		calls_enter();
		disconnect(b, files_moved(b));
		calls_leave();
	} else {
		disconnect(b, false);
	}
	bells_free(b, true);
	for (int i = 0; i < NFILES; i++)
		free(b->paths[i]);
	free(b->ns);
	free(b);
}

/* In a fork()'s child, of the parent's connection: SQLite keeps its file
 * and shared-memory lock bookkeeping per process, and the child inherited
 * the parent's. Left open, a connection the child opens later on the same
 * file would trust locks this process does not hold. Closing it without a
 * checkpoint only closes descriptors and unmaps (the core calls this only
 * when no statement was running at the fork: no transaction to roll back). */
static void sq_forget(dlock_backend *be)
{
	sqlite_backend *b = (sqlite_backend *)be;
	if (b->db && atomic_load(&sq_busy_fork)) {
		/* SQLite's state may be half changed: not touched (the process
		 * cannot use SQLite any more; fork_check says so) */
		b->db = NULL;
		for (int i = 0; i < Q_COUNT; i++)
			b->st[i] = NULL;
	}
	disconnect(b, true);
	bells_free(b, false); /* its thread is the parent's */
	sq_close(be); /* now only frees */
}

/* The type ("table", "view") of schema object `name`, or "" (into buf). */
static int object_type(sqlite3 *db, const char *name, char *buf, size_t len)
{
	sqlite3_stmt *s = NULL;
	int r = sqlite3_prepare_v2(db, "SELECT type FROM sqlite_master WHERE name=?1", -1, &s, NULL);
	if (r != SQLITE_OK)
		return r;
	sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
	buf[0] = '\0';
	if ((r = sqlite3_step(s)) == SQLITE_ROW)
		snprintf(buf, len, "%s", (const char *)sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	return r == SQLITE_ROW || r == SQLITE_DONE ? SQLITE_OK : r;
}

/* Does the file already have this version's schema? (A read: WAL readers do not wait.) */
static bool schema_current(sqlite3 *db)
{
	sqlite3_stmt *s = NULL;
	bool ok = sqlite3_prepare_v2(db,
				     "SELECT max(version), (SELECT count(*) FROM sqlite_master WHERE type='index' AND"
				     " name IN ('dlock_queue_by_expiry','dlock_queue_by_mode')) FROM dlock_schema",
				     -1, &s, NULL) == SQLITE_OK &&
		  sqlite3_step(s) == SQLITE_ROW && sqlite3_column_int64(s, 0) == SCHEMA_VERSION &&
		  sqlite3_column_int64(s, 1) == 2;
	sqlite3_finalize(s);
	return ok;
}

/* Inside the setup transaction: create a new file's tables, bring a version-1
 * or 2 file to version 3, refuse a newer one. */
static int setup_tables(sqlite3 *db, char **err)
{
	char type[16];
	int r = object_type(db, "dlock_schema", type, sizeof(type));
	if (r != SQLITE_OK)
		return r;
	if (!*type) { /* a new file */
		r = sqlite3_exec(db, "CREATE TABLE dlock_schema(version INTEGER NOT NULL);", NULL, NULL, err);
		if (r == SQLITE_OK)
			r = sqlite3_exec(db, schema_v3, NULL, NULL, err);
		return r == SQLITE_OK ? sqlite3_exec(db, views_v3, NULL, NULL, err) : r;
	}
	sqlite3_stmt *s = NULL;
	if ((r = sqlite3_prepare_v2(db, "SELECT max(version) FROM dlock_schema", -1, &s, NULL)) != SQLITE_OK)
		return r;
	int64_t version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
	sqlite3_finalize(s);
	if (version == SCHEMA_VERSION)
		return SQLITE_OK;
	if (version > SCHEMA_VERSION || version < 1) {
		*err = sqlite3_mprintf("the file has dlock schema version %lld; this library knows %d",
				       (long long)version, SCHEMA_VERSION);
		return SQLITE_ERROR;
	}
	if ((r = object_type(db, "dlock_fences", type, sizeof(type))) != SQLITE_OK)
		return r;
	bool fence_table = strcmp(type, "table") == 0;
	if (strcmp(type, "view") == 0 && (r = sqlite3_exec(db, "DROP VIEW dlock_fences;", NULL, NULL, err)))
		return r;
	if ((r = sqlite3_exec(db, rename_v2, NULL, NULL, err)) != SQLITE_OK)
		return r;
	if (fence_table && (r = sqlite3_exec(db, fences_v1, NULL, NULL, err)) != SQLITE_OK)
		return r;
	return sqlite3_exec(db, views_v3, NULL, NULL, err);
}

/* The tables at version 3, then the queue's indexes (whatever the version
 * found: a file of version 3 may lack them). */
static int setup_schema(sqlite3 *db, char **err)
{
	int r = setup_tables(db, err);
	return r == SQLITE_OK ? sqlite3_exec(db, queue_indexes, NULL, NULL, err) : r;
}

/* mkdir -p for the parent directories of path, mode 0700. */
static int make_parents(const char *path)
{
	char *p = dlock__strdup(path);
	if (!p)
		return DLOCK_ENOMEM;
	for (char *c = p + 1; *c; c++) {
		if (*c != '/')
			continue;
		*c = '\0';
		if (mkdir(p, 0700) != 0 && errno != EEXIST) {
			int e = errno;
			int rc = dlock_error_set(DLOCK_EUNAVAILABLE, "sqlite", NULL,
						 "sqlite: cannot create directory %s: %s", p, strerror(e));
			free(p);
			return rc;
		}
		*c = '/';
	}
	free(p);
	return 0;
}

/* For a file named in the URI: its directory must be there already (a typo
 * in a path must not leave directories behind, e.g. from `dlock status`). */
static int parent_exists(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return 0;
	char dir[4096];
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
				       "sqlite: directory %s does not exist (only the default store's "
				       "directories are created)", dir);
	return 0;
}

static pthread_mutex_t umask_mu = PTHREAD_MUTEX_INITIALIZER;

/*
 * Only SQLite opens the file. On Linux a close() of ANY descriptor of a file
 * drops every POSIX lock the process holds on it, those of our other
 * connections to it included (another store handle of this process): another
 * process could then checkpoint and delete the WAL under them (SQLite's
 * "how to corrupt", 2.2). A new file is made private by creating it under a
 * umask of 077 (SQLite's -wal and -shm files copy the database's mode).
 */
static int open_db(sqlite3 **db, const char *path)
{
	int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
	struct stat st;
	if (stat(path, &st) == 0)
		return sqlite3_open_v2(path, db, flags, NULL);
	/* umask is the process's: other threads creating files meanwhile get 0600 too. */
	pthread_mutex_lock(&umask_mu);
	mode_t old = umask(077);
	int r = sqlite3_open_v2(path, db, flags, NULL);
	umask(old);
	pthread_mutex_unlock(&umask_mu);
	return r;
}

/*
 * Before anything is written: a file with schema objects that are not
 * dlock's (nor SQLite's own) belongs to another application — a --store
 * pointed at the wrong file. Switching it to WAL and adding tables would
 * change it for that application (WAL files beside it, readers that must
 * be able to write the -shm): refused, nothing changed, unless the URI says
 * foreign=ok. Into buf: the first such object ("table 'users'"), "" when none.
 */
static int foreign_object(sqlite3 *db, char *buf, size_t len)
{
	sqlite3_stmt *s = NULL;
	int r = sqlite3_prepare_v2(db,
				   "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'dlock\\_%' ESCAPE '\\'"
				   " AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type='table' DESC, name LIMIT 1",
				   -1, &s, NULL);
	if (r != SQLITE_OK)
		return r;
	buf[0] = '\0';
	if ((r = sqlite3_step(s)) == SQLITE_ROW)
		snprintf(buf, len, "%s '%s'", (const char *)sqlite3_column_text(s, 0),
			 (const char *)sqlite3_column_text(s, 1));
	sqlite3_finalize(s);
	return r == SQLITE_ROW || r == SQLITE_DONE ? SQLITE_OK : r;
}

/* Under the open's deadline: open the file, set it up (WAL, schema), prepare. */
static int connect_db(sqlite_backend *b, int64_t deadline)
{
	const char *path = b->paths[0];
	set_deadline(b, deadline);
	int rc = b->make_dirs ? make_parents(path) : parent_exists(path);
	if (rc)
		return rc;
	int r = open_db(&b->db, path);
	if (r != SQLITE_OK) {
		rc = fail(b, r, "open");
		goto out;
	}
	sqlite3_busy_handler(b->db, on_busy, b);
	if (!b->foreign_ok) {
		char obj[300];
		if ((r = foreign_object(b->db, obj, sizeof obj)) != SQLITE_OK) {
			rc = fail(b, r, "read the schema");
			goto out;
		}
		if (obj[0]) {
			rc = dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
					     "sqlite: %s is not a dlock database: it has %s of another application "
					     "(nothing was changed; dlock would switch it to WAL and add its tables). "
					     "Use a file of its own, or add ?foreign=ok to the URI to share this one",
					     path, obj);
			goto out;
		}
	}
	char *err = NULL;
	/* Switching a new file to WAL does not always go through the busy
	 * handler: when several processes open a fresh file at once, retry. */
	for (;;) {
		r = sqlite3_exec(b->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL, &err);
		if (r == SQLITE_OK && schema_current(b->db))
			break; /* nothing to write: no wait for the write lock */
		if (r == SQLITE_OK)
			r = sqlite3_exec(b->db, "BEGIN IMMEDIATE;", NULL, NULL, &err);
		if (r == SQLITE_OK) {
			r = setup_schema(b->db, &err);
			sqlite3_exec(b->db, r == SQLITE_OK ? "COMMIT;" : "ROLLBACK;", NULL, NULL, NULL);
		}
		bool busy = (r & 0xff) == SQLITE_BUSY || (r & 0xff) == SQLITE_LOCKED;
		if (!busy || dlock_clock_ms() >= deadline)
			break;
		sqlite3_free(err);
		err = NULL;
		dlock__sleep_ms(dlock__rand_between(5, 25));
	}
	if (r != SQLITE_OK) {
		rc = err && strstr(err, "dlock schema version")
			     ? dlock_error_set(DLOCK_ENOTSUPPORTED, "sqlite", NULL, "sqlite: %s: %s", path, err)
			     : fail(b, r, "create schema");
		sqlite3_free(err);
		goto out;
	}
	sqlite3_free(err);
	for (int i = 0; i < Q_COUNT; i++) {
		r = sqlite3_prepare_v3(b->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &b->st[i], NULL);
		if (r != SQLITE_OK) {
			rc = fail(b, r, "prepare");
			goto out;
		}
	}
	/* The files' identities, now that SQLite has all three open (the setup
	 * wrote through the WAL); the database's is checked against SQLite's own
	 * descriptor, so a file replaced during the open is not taken for ours. */
	nlink_t links = 1;
	for (int i = 0; i < NFILES; i++) {
		struct stat st;
		b->ids[i].known = stat(b->paths[i], &st) == 0;
		b->ids[i].dev = st.st_dev;
		b->ids[i].ino = st.st_ino;
		if (i == 0 && b->ids[0].known) {
			links = st.st_nlink;
			b->db_uid = st.st_uid;
			b->db_gid = st.st_gid;
			b->db_mode = st.st_mode;
		}
	}
	/* SQLite names the -wal and -shm after the name it was given: processes
	 * opening one database through two hard links would keep two WALs. */
	if (links > 1) {
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, "sqlite", NULL,
				     "sqlite: %s has %lu hard links: processes opening it by different names "
				     "would not see each other's locks; remove the extra links",
				     path, (unsigned long)links);
		goto out;
	}
	b->checked_at = dlock_clock_ms();
	int moved_now = 0;
	if (sqlite3_file_control(b->db, "main", SQLITE_FCNTL_HAS_MOVED, &moved_now) != SQLITE_OK)
		moved_now = 0; /* a VFS without the check: our stat of the path stands */
	if (moved_now || !b->ids[0].known)
		rc = dlock_error_set(DLOCK_EUNAVAILABLE, "sqlite", NULL,
				     "sqlite: %s was deleted or replaced while it was being opened", path);
out:
	if (rc)
		disconnect(b, true);
	return rc;
}

/* The methods that call into SQLite, counted (fork_check). */
static int sq_acquire(dlock_backend *be, dlock_request *req, uint64_t *fence, int64_t *retry_ms)
{
	calls_enter();
	int rc = acquire_in(be, req, fence, retry_ms);
	calls_leave();
	return rc;
}

static int sq_release(dlock_backend *be, dlock_request *req)
{
	calls_enter();
	int rc = release_in(be, req);
	calls_leave();
	return rc;
}

static int sq_extend(dlock_backend *be, dlock_request *req, int64_t ttl_ms)
{
	calls_enter();
	int rc = extend_in(be, req, ttl_ms);
	calls_leave();
	return rc;
}

static int sq_renew(dlock_backend *be, dlock_request *const *reqs, size_t n, int *results)
{
	calls_enter();
	int rc = renew_in(be, reqs, n, results);
	calls_leave();
	return rc;
}

static int sq_cancel(dlock_backend *be, dlock_request *req)
{
	calls_enter();
	int rc = cancel_in(be, req);
	calls_leave();
	return rc;
}

static int sq_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
		     size_t *count)
{
	calls_enter();
	int rc = status_in(be, names, nnames, out, count);
	calls_leave();
	return rc;
}

static int sq_list(dlock_backend *be, char ***names, size_t *count)
{
	calls_enter();
	int rc = list_in(be, names, count);
	calls_leave();
	return rc;
}

/* Not DLOCK_BACKEND_F_RENEW_APART: each instance watches its own file for
 * being moved or replaced (reopen_if_moved), which a second one opened
 * later by path would not see the same way. */
static const dlock_backend_methods sqlite_methods = {
	DLOCK_BACKEND_METHODS_INIT("sqlite"),
	.acquire = sq_acquire,
	.release = sq_release,
	.renew = sq_renew,
	.extend = sq_extend,
	.watch = sq_watch,
	.unwatch = sq_unwatch,
	.cancel = sq_cancel,
	.status = sq_status,
	.list = sq_list,
	.close = sq_close,
	.forget = sq_forget,
};

int dlock__sqlite_open(dlock_backend **out, dlock_uri *uri)
{
	if (uri->hosts && *uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
				       "sqlite URIs name a file, not a host: use sqlite:///abs/path.db or sqlite:rel.db");
	pthread_once(&sq_fork_once, watch_forks);
	int forked = fork_check();
	if (forked)
		return forked;
	int64_t deadline = dlock_clock_ms() + uri->connect_timeout_ms;
	/* The default store's path (its directories are created), if there is one. */
	char *dflt = NULL;
	const char *path = uri->path;
	{
		char *text = NULL;
		dlock_uri *parsed = NULL;
		int rc = dlock_default_uri(&text);
		if (rc == 0)
			rc = dlock__uri_parse(&parsed, text);
		free(text);
		if (rc == 0 && !(dflt = dlock__strdup(parsed->path)))
			rc = DLOCK_ENOMEM;
		dlock__uri_free(parsed);
		if (rc && (!*path || rc == DLOCK_ENOMEM)) {
			free(dflt);
			return rc;
		}
		dlock_error_clear();
		if (!*path)
			path = dflt;
	}
	const char *fo = dlock_uri_param(uri, "foreign");
	if (fo && strcmp(fo, "ok") != 0) {
		free(dflt);
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
				       "sqlite: bad foreign '%s' (foreign=ok shares a database that has other tables)", fo);
	}
	int64_t busy_ms = 0; /* none: each call's own deadline */
	const char *v = dlock_uri_param(uri, "busy_timeout");
	if (v && (dlock_duration_parse(&busy_ms, v) != 0 || busy_ms <= 0)) {
		free(dflt);
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL, "sqlite: bad busy_timeout '%s'", v);
	}

	sqlite_backend *b = dlock__calloc(1, sizeof(*b));
	if (!b) {
		free(dflt);
		return DLOCK_ENOMEM;
	}
	dlock_backend_init(&b->base, &sqlite_methods);
	b->make_dirs = dflt && strcmp(path, dflt) == 0;
	b->foreign_ok = fo != NULL;
	b->busy_ms = busy_ms;
	b->request_timeout_ms = uri->request_timeout_ms;
	int rc = DLOCK_ENOMEM;
	if (!(b->ns = dlock__strdup(uri->prefix)))
		goto fail;
	for (int i = 0; i < NFILES; i++)
		if (!(b->paths[i] = dlock__sprintf("%s%s", path, file_suffix[i])))
			goto fail;
	calls_enter();
	rc = connect_db(b, deadline);
	calls_leave();
	if (rc)
		goto fail;
	free(dflt);
	*out = &b->base;
	return 0;
fail:
	free(dflt);
	sq_close(&b->base);
	return rc;
}
