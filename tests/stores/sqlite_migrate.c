/* Files of older schemas are migrated on open, and older libraries cannot
 * use them afterwards (issue 20 row 5).
 *
 * A file of schema version 1 (fences in table dlock_fences) and one of
 * version 2 (fence rows beside the holders in table dlock_holders) are opened
 * by this library: fences continue from where they were, and releasing leaves
 * them there. An older process that was already running (simulated by a
 * plain sqlite3 connection that prepared that version's statements before the
 * migration) must then fail loudly on every write, and never see, nor make
 * anyone else see, a phantom holder with an empty owner: its acquire fails at
 * its first write, its reads show only real holders, it enqueues no waiter.
 * An older library that opens the file afterwards is refused. */
#include "testutil/testutil.h"
#include <stdbool.h>

#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char v1[] =
	"PRAGMA journal_mode=WAL;"
	"CREATE TABLE dlock_schema(version INTEGER NOT NULL);"
	"CREATE TABLE dlock_holders(ns TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,"
	" mode INTEGER NOT NULL, permits INTEGER NOT NULL, fence INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, PRIMARY KEY(ns,name,owner)) WITHOUT ROWID;"
	"CREATE TABLE dlock_fences(ns TEXT NOT NULL, name TEXT NOT NULL, fence INTEGER NOT NULL,"
	" PRIMARY KEY(ns,name)) WITHOUT ROWID;"
	"CREATE TABLE dlock_waiters(seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL,"
	" name TEXT NOT NULL, owner TEXT NOT NULL, mode INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, UNIQUE(ns,name,owner));"
	"CREATE INDEX dlock_waiters_by_name ON dlock_waiters(ns,name,seq);"
	"INSERT INTO dlock_schema VALUES(1);"
	"INSERT INTO dlock_fences VALUES('dlock','old',41);";

/* Version 2: the fence counter is the row of dlock_holders with owner ''. */
static const char v2[] =
	"PRAGMA journal_mode=WAL;"
	"CREATE TABLE dlock_schema(version INTEGER NOT NULL);"
	"CREATE TABLE dlock_holders(ns TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,"
	" mode INTEGER NOT NULL, permits INTEGER NOT NULL, fence INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, PRIMARY KEY(ns,name,owner)) WITHOUT ROWID;"
	"CREATE TABLE dlock_waiters(seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL,"
	" name TEXT NOT NULL, owner TEXT NOT NULL, mode INTEGER NOT NULL, expires INTEGER NOT NULL,"
	" host TEXT, pid INTEGER, UNIQUE(ns,name,owner));"
	"CREATE INDEX dlock_waiters_by_name ON dlock_waiters(ns,name,seq);"
	"CREATE VIEW dlock_fences AS SELECT ns, name, fence FROM dlock_holders WHERE owner='';"
	"INSERT INTO dlock_schema VALUES(2);"
	"INSERT INTO dlock_holders VALUES('dlock','old','',"
	"0,0,7,9223372036854775807,NULL,NULL);";

/* The statements of an old library (both versions wrote these): its acquire
 * starts by purging expired holders, reads the holders of the name, and when
 * refused enqueues itself; status reads holder rows. */
enum { O_PURGE, O_HOLDERS, O_ENQUEUE, O_STATUS, O_INSERT, O_EXTEND, O_COUNT };
/* clang-format off */
static const char *const old_sql[O_COUNT] = {
	[O_PURGE] = "DELETE FROM dlock_holders WHERE ns='dlock' AND name=?1 AND expires<=?2",
	[O_HOLDERS] = "SELECT mode, count(*), min(expires) FROM dlock_holders WHERE ns='dlock' AND name=?1 GROUP BY mode",
	[O_ENQUEUE] = "INSERT INTO dlock_waiters(ns,name,owner,mode,expires,host,pid) VALUES('dlock',?1,'old-1',0,?2,'h',1) "
		      "ON CONFLICT(ns,name,owner) DO UPDATE SET expires=excluded.expires",
	[O_STATUS] = "SELECT owner FROM dlock_holders WHERE ns='dlock' AND name=?1 AND expires>?2",
	[O_INSERT] = "INSERT INTO dlock_holders(ns,name,owner,mode,permits,fence,expires,host,pid) "
		     "VALUES('dlock',?1,'old-2',0,1,1000,?2,'h',1)",
	[O_EXTEND] = "UPDATE dlock_holders SET expires=?2 WHERE ns='dlock' AND name=?1 AND owner='old-2'",
};
/* clang-format on */

typedef struct old_proc {
	sqlite3 *db;
	sqlite3_stmt *st[O_COUNT];
} old_proc;

/* An old process that is running: its statements are prepared before the migration. */
static void old_start(old_proc *o, const char *path)
{
	memset(o, 0, sizeof(*o));
	CHECK(sqlite3_open_v2(path, &o->db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK);
	sqlite3_busy_timeout(o->db, 2000);
	for (int i = 0; i < O_COUNT; i++)
		CHECK(sqlite3_prepare_v3(o->db, old_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &o->st[i], NULL) ==
		      SQLITE_OK);
}

static void old_stop(old_proc *o)
{
	for (int i = 0; i < O_COUNT; i++)
		sqlite3_finalize(o->st[i]);
	sqlite3_close(o->db);
}

/* Step statement i of the old process for `name`; its result code. Rows of
 * O_HOLDERS/O_STATUS are counted into *rows, empty owners into *phantoms. */
static int old_step(old_proc *o, int i, const char *name, int *rows, int *phantoms)
{
	sqlite3_stmt *s = o->st[i];
	sqlite3_reset(s);
	sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, (sqlite3_int64)time(NULL) * 1000 + (i == O_INSERT || i == O_EXTEND ? 60000 : 0));
	int r;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		if (rows)
			++*rows;
		if (phantoms && i == O_STATUS && sqlite3_column_bytes(s, 0) == 0)
			++*phantoms;
		if (phantoms && i == O_HOLDERS && sqlite3_column_int64(s, 1) > 0)
			*phantoms += (int)sqlite3_column_int64(s, 1);
	}
	sqlite3_reset(s);
	return r;
}

/* What the old, running process can still do to `name` once nobody holds it. */
static void old_after_migration(old_proc *o, dlock_store *s, const char *name)
{
	int rows = 0, phantoms = 0;
	/* Its reads show no holder with an empty owner. */
	old_step(o, O_STATUS, name, &rows, &phantoms);
	CHECK(phantoms == 0);
	rows = phantoms = 0;
	old_step(o, O_HOLDERS, name, &rows, &phantoms);
	CHECK(phantoms == 0);
	if (phantoms)
		fprintf(stderr, "an old process sees %d phantom holder(s) of '%s'\n", phantoms, name);
	/* Its acquire fails loudly at its first write, and so does every other write. */
	CHECK(old_step(o, O_PURGE, name, NULL, NULL) == SQLITE_ERROR);
	CHECK(old_step(o, O_ENQUEUE, name, NULL, NULL) == SQLITE_ERROR);
	CHECK(old_step(o, O_INSERT, name, NULL, NULL) == SQLITE_ERROR);
	CHECK(old_step(o, O_EXTEND, name, NULL, NULL) == SQLITE_ERROR);
	/* So the name has neither a phantom holder nor a waiter for this library. */
	const char *names[] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, names, 1, &st, &n), 0);
	CHECK(n == 1 && st[0].nholders == 0 && st[0].waiters == 0);
	dlock_status_free(st, n);
}

static uint64_t grant(dlock_store *s, const char *name)
{
	dlock_lock *l = NULL;
	uint64_t f = 0;
	CHECK_RC(dlock_lock_new(&l, s, name, NULL), 0);
	if (!l)
		return 0;
	CHECK_RC(dlock_acquire(l, 0), 0);
	f = dlock_fence(l);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	return f;
}

/* f is above *last (which becomes f). */
static bool grew(uint64_t *last, uint64_t f)
{
	bool up = f > *last;
	*last = f;
	return up;
}

/* How many of the queue's two indexes the file has. */
static int queue_indexes(sqlite3 *db)
{
	sqlite3_stmt *st = NULL;
	int n = -1;
	if (sqlite3_prepare_v2(db,
			       "SELECT count(*) FROM sqlite_master WHERE type='index' AND name IN "
			       "('dlock_queue_by_expiry','dlock_queue_by_mode')",
			       -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW)
		n = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return n;
}

static void migrate_case(const char *dir, const char *version, const char *sql, uint64_t fence)
{
	char path[600], uri[700];
	snprintf(path, sizeof(path), "%s/%s.db", dir, version);
	unlink(path);
	sqlite3 *db = NULL;
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);

	/* An old process is running; it holds "held" (for a minute). */
	old_proc o;
	old_start(&o, path);
	CHECK(old_step(&o, O_INSERT, "held", NULL, NULL) == SQLITE_DONE);

	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s) {
		old_stop(&o);
		return;
	}
	/* fences carry on above the old ones (a new counter starts at the
	 * clock: docs/stores/sqlite.md, "Fences") */
	uint64_t last_old = fence, last_new = 0;
	CHECK(grew(&last_old, grant(s, "old")));
	CHECK(grew(&last_old, grant(s, "old"))); /* released: the fence stays and grows */
	CHECK(grew(&last_new, grant(s, "new")));
	CHECK(grew(&last_new, grant(s, "new")));
	/* The old process's hold survives the migration (until it ends)... */
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "held", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	dlock_lock_free(l);
	/* ...but the old process cannot do anything more, and shows no phantom. */
	old_after_migration(&o, s, "old");
	old_after_migration(&o, s, "new");
	old_after_migration(&o, s, "never");
	int rows = 0, phantoms = 0;
	old_step(&o, O_STATUS, "held", &rows, &phantoms);
	CHECK(rows == 1 && phantoms == 0);
	CHECK(grew(&last_old, grant(s, "old")));
	old_stop(&o);
	dlock_store_close(s);

	/* A second open of the migrated file changes nothing. */
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK(grew(&last_old, grant(s, "old")));
	dlock_store_close(s);

	/* The queue's indexes are there; a version 3 file without them (made by
	 * an earlier library of the same version) gets them at its next open. */
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(queue_indexes(db) == 2);
	CHECK(sqlite3_exec(db, "DROP INDEX dlock_queue_by_expiry; DROP INDEX dlock_queue_by_mode;", NULL, NULL, NULL) ==
	      SQLITE_OK);
	CHECK(queue_indexes(db) == 0);
	sqlite3_close(db);
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK(grew(&last_old, grant(s, "old")));
	dlock_store_close(s);

	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(queue_indexes(db) == 2);
	sqlite3_stmt *st = NULL;
	/* An old library that opens the file now is refused: its schema step
	 * (an index on its waiter table) and its statements fail. */
	CHECK(sqlite3_exec(db, "CREATE INDEX IF NOT EXISTS dlock_waiters_by_name ON dlock_waiters(ns,name,seq)", NULL,
			   NULL, NULL) != SQLITE_OK);
	CHECK(sqlite3_prepare_v2(db,
				 "INSERT INTO dlock_fences(ns,name,fence) VALUES('dlock','old',1) "
				 "ON CONFLICT(ns,name) DO UPDATE SET fence=fence+1 RETURNING fence",
				 -1, &st, NULL) != SQLITE_OK);
	sqlite3_finalize(st);
	st = NULL;
	CHECK(sqlite3_prepare_v2(db, old_sql[O_PURGE], -1, &st, NULL) != SQLITE_OK);
	sqlite3_finalize(st);
	st = NULL;
	/* Its status reads still work, through views. */
	CHECK(sqlite3_prepare_v2(db, "SELECT fence FROM dlock_fences WHERE ns='dlock' AND name='old'", -1, &st, NULL) ==
	      SQLITE_OK);
	CHECK(st && sqlite3_step(st) == SQLITE_ROW && (uint64_t)sqlite3_column_int64(st, 0) == last_old);
	sqlite3_finalize(st);
	/* A file from a newer library is refused, not rewritten. */
	CHECK(sqlite3_exec(db, "UPDATE dlock_schema SET version=99", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_ENOTSUPPORTED);
	dlock_store_close(s);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	migrate_case(argv[1], "v1", v1, 41);
	migrate_case(argv[1], "v2", v2, 7);
	return tu_done("sqlite.migrate");
}
