/* A file of schema version 1 (fences in table dlock_fences) is migrated on
 * open: fences continue from where they were, the fence upsert of a version-1
 * library no longer prepares (so such a library refuses the file), and
 * releasing leaves the fence where it was. */
#include "unit/testutil.h"

#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
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

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	char path[600], uri[700];
	snprintf(path, sizeof(path), "%s/v1.db", argv[1]);
	unlink(path);
	sqlite3 *db = NULL;
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db, v1, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);

	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("sqlite.migrate");
	CHECK(grant(s, "old") == 42);
	CHECK(grant(s, "old") == 43); /* released: the fence stays and grows */
	CHECK(grant(s, "new") == 1);
	CHECK(grant(s, "new") == 2);
	dlock_store_close(s);
	/* A second open of the migrated file changes nothing. */
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK(grant(s, "old") == 44);
	dlock_store_close(s);

	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	sqlite3_stmt *st = NULL;
	/* The version-1 fence statement: must not prepare any more. */
	CHECK(sqlite3_prepare_v2(db, "INSERT INTO dlock_fences(ns,name,fence) VALUES('dlock','old',1) "
				 "ON CONFLICT(ns,name) DO UPDATE SET fence=fence+1 RETURNING fence",
				 -1, &st, NULL) != SQLITE_OK);
	sqlite3_finalize(st);
	st = NULL;
	/* Its status read still works, through the view. */
	CHECK(sqlite3_prepare_v2(db, "SELECT fence FROM dlock_fences WHERE ns='dlock' AND name='old'", -1, &st,
				 NULL) == SQLITE_OK);
	CHECK(st && sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int64(st, 0) == 44);
	sqlite3_finalize(st);
	/* A file from a newer library is refused, not rewritten. */
	CHECK(sqlite3_exec(db, "UPDATE dlock_schema SET version=3", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_ENOTSUPPORTED);
	dlock_store_close(s);
	return tu_done("sqlite.migrate");
}
