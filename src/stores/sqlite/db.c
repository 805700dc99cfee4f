/*
 * The embedded store's connection: the statements, transactions in the
 * writers' line, files moved or deleted under it, and the fork rule.
 */
#include "sqlite/sq.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* clang-format off */
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
/* clang-format on */

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
		dlock_sys_sleep_ms(1);
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

void dlock__sq_calls_enter(void)
{
	while (atomic_load(&sq_fork_pending))
		dlock_sys_sleep_ms(1);
	atomic_fetch_add(&sq_calls, 1);
}

void dlock__sq_calls_leave(void)
{
	atomic_fetch_sub(&sq_calls, 1);
}

/* In a fork()'s child made during a call inside SQLite: the error; else 0. */
int dlock__sq_fork_check(void)
{
	if (atomic_load(&sq_busy_fork))
		return dlock_error_set(
			DLOCK_EINVAL, "sqlite", NULL,
			"sqlite: this process is a fork() child made while a store call of its parent was "
			"inside SQLite (its mutexes and files may be half changed here): SQLite cannot be "
			"used in this process; fork while no store call runs, or exec");
	return 0;
}

bool dlock__sq_busy_at_fork(void)
{
	return atomic_load(&sq_busy_fork);
}

int dlock__sq_fork_guard(void)
{
	pthread_once(&sq_fork_once, watch_forks);
	return dlock__sq_fork_check();
}

/* Leave the writers' line for good (writeq.h). */
static void line_drop(sqlite_store *b)
{
	dlock__wq_close(b->wq);
	b->wq = NULL;
}

void dlock__sq_disconnect(sqlite_store *b, bool moved)
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
bool dlock__sq_files_moved(const sqlite_store *b)
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

int dlock__sq_check_files(sqlite_store *b, bool always)
{
	if (b->db) {
		int64_t now = dlock_clock_ms();
		if (!always && now - b->checked_at < RECHECK_MS)
			return 0;
		if (!dlock__sq_files_moved(b)) {
			b->checked_at = now;
			return 0;
		}
	}
	dlock__sq_disconnect(b, true);
	return dlock_error_set(
		DLOCK_ENOTHELD, "sqlite", NULL,
		"sqlite: %s was deleted or replaced since it was opened: holds made in the old file are gone",
		b->paths[0]);
}

/* For acquire and status: on moved files, open the path again (bounded by deadline). */
int dlock__sq_reopen_if_moved(sqlite_store *b, int64_t deadline)
{
	if (dlock__sq_check_files(b, false) == 0)
		return 0;
	return dlock__sq_connect_db(b, deadline);
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
	sqlite_store *b = arg;
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
	dlock_sys_sleep_ms(nap < left ? nap : left);
	return 1;
}

/* Every call starts here: its deadline, cut by busy_timeout= if that is shorter. */
void dlock__sq_set_deadline(sqlite_store *b, int64_t deadline)
{
	int64_t cap = b->busy_ms > 0 ? dlock_clock_ms() + b->busy_ms : INT64_MAX;
	b->deadline = deadline < cap ? deadline : cap;
	b->timed_out = false;
}

int dlock__sq_fail(sqlite_store *b, int rc, const char *what)
{
	char code[32];
	snprintf(code, sizeof(code), "%d", rc);
	if (((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) && b->timed_out)
		return dlock_error_set(DLOCK_EUNAVAILABLE, "sqlite", code,
				       "sqlite: %s timed out: another connection holds the database's write lock",
				       what);
	int err = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED ? DLOCK_EUNAVAILABLE
		  : (rc & 0xff) == SQLITE_NOMEM                              ? DLOCK_ENOMEM
		  : (rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_PERM || (rc & 0xff) == SQLITE_READONLY ||
				  (rc & 0xff) == SQLITE_IOERR
			  ? DLOCK_EUNAVAILABLE
			  : DLOCK_ESTORE;
	return dlock_error_set(err, "sqlite", code, "sqlite: %s: %s", what,
			       b->db ? sqlite3_errmsg(b->db) : sqlite3_errstr(rc));
}

/* Reset st and bind ns/name/owner as ?1 ?2 ?3 (owner may be NULL to skip). */
sqlite3_stmt *dlock__sq_prep(sqlite_store *b, int q, const char *name, const char *owner)
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
int dlock__sq_run(sqlite_store *b, sqlite3_stmt *s, const char *what)
{
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW)
		;
	sqlite3_reset(s);
	return rc == SQLITE_DONE ? 0 : dlock__sq_fail(b, rc, what);
}

/*
 * Every write waits in the writers' line (writeq.h) before it asks SQLite for
 * the write lock, once writers of this file have collided: the first busy
 * wait makes the line (or joins the one there); a line found replaced is
 * joined anew. The line's wait keeps the call's deadline, like the busy
 * handler's.
 */
int dlock__sq_line_enter(sqlite_store *b)
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
	return dlock__sq_fail(b, SQLITE_BUSY, "begin");
}

int dlock__sq_begin(sqlite_store *b)
{
	int rc = dlock__sq_line_enter(b);
	if (!rc && (rc = dlock__sq_run(b, dlock__sq_prep(b, Q_BEGIN, NULL, NULL), "begin")))
		dlock__wq_leave(b->wq);
	return rc;
}

/* Commit (or roll back on failure) what dlock__sq_begin() started, and leave the line. */
int dlock__sq_finish(sqlite_store *b, int rc)
{
	if (rc == 0 || rc == DLOCK_ELOCKED || rc == DLOCK_ENOTHELD) {
		int c = dlock__sq_run(b, dlock__sq_prep(b, Q_COMMIT, NULL, NULL), "commit");
		if (c) {
			dlock__sq_run(b, dlock__sq_prep(b, Q_ROLLBACK, NULL, NULL), "rollback");
			rc = c;
		}
	} else if (!sqlite3_get_autocommit(b->db)) {
		dlock_sys_saved_error saved;
		dlock_sys_error_save(&saved);
		dlock__sq_run(b, dlock__sq_prep(b, Q_ROLLBACK, NULL, NULL), "rollback");
		dlock_sys_error_restore(&saved);
	}
	dlock__wq_leave(b->wq);
	return rc;
}

int64_t dlock__sq_step_int(sqlite_store *b, sqlite3_stmt *s, int col, int64_t dflt, int *err)
{
	int rc = sqlite3_step(s);
	int64_t v = dflt;
	if (rc == SQLITE_ROW && sqlite3_column_type(s, col) != SQLITE_NULL)
		v = sqlite3_column_int64(s, col);
	else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		*err = dlock__sq_fail(b, rc, "query");
	sqlite3_reset(s);
	return v;
}

/* Under the open's deadline: open the file, set it up (WAL, schema), prepare. */
int dlock__sq_connect_db(sqlite_store *b, int64_t deadline)
{
	const char *path = b->paths[0];
	dlock__sq_set_deadline(b, deadline);
	int rc = b->make_dirs ? dlock__sq_make_parents(path) : dlock__sq_parent_exists(path);
	if (rc)
		return rc;
	int r = dlock__sq_open_db(&b->db, path);
	if (r != SQLITE_OK) {
		rc = dlock__sq_fail(b, r, "open");
		goto out;
	}
	sqlite3_busy_handler(b->db, on_busy, b);
	if (!b->foreign_ok) {
		char obj[300];
		if ((r = dlock__sq_foreign_object(b->db, obj, sizeof obj)) != SQLITE_OK) {
			rc = dlock__sq_fail(b, r, "read the schema");
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
		if (r == SQLITE_OK && dlock__sq_schema_current(b->db))
			break; /* nothing to write: no wait for the write lock */
		if (r == SQLITE_OK)
			r = sqlite3_exec(b->db, "BEGIN IMMEDIATE;", NULL, NULL, &err);
		if (r == SQLITE_OK) {
			r = dlock__sq_setup_schema(b->db, &err);
			sqlite3_exec(b->db, r == SQLITE_OK ? "COMMIT;" : "ROLLBACK;", NULL, NULL, NULL);
		}
		bool busy = (r & 0xff) == SQLITE_BUSY || (r & 0xff) == SQLITE_LOCKED;
		if (!busy || dlock_clock_ms() >= deadline)
			break;
		sqlite3_free(err);
		err = NULL;
		dlock_sys_sleep_ms(dlock_sys_rand_between(5, 25));
	}
	if (r != SQLITE_OK) {
		rc = err && strstr(err, "dlock schema version")
			     ? dlock_error_set(DLOCK_ENOTSUPPORTED, "sqlite", NULL, "sqlite: %s: %s", path, err)
			     : dlock__sq_fail(b, r, "create schema");
		sqlite3_free(err);
		goto out;
	}
	sqlite3_free(err);
	for (int i = 0; i < Q_COUNT; i++) {
		r = sqlite3_prepare_v3(b->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &b->st[i], NULL);
		if (r != SQLITE_OK) {
			rc = dlock__sq_fail(b, r, "prepare");
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
		dlock__sq_disconnect(b, true);
	return rc;
}
