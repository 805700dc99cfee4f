/*
 * The embedded store's file: its creation (private, its directories) and its
 * schema (versions 1 to 3 migrated in place; another application's file
 * refused).
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

#define SCHEMA_VERSION 3

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
	" SELECT ns, name, '', 0, 0, fence, " FENCE_ROW_EXPIRES
	" FROM dlock_fences WHERE true"
	" ON CONFLICT(ns,name,owner) DO UPDATE SET fence=max(fence,excluded.fence);"
	"DROP TABLE dlock_fences;";

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
bool dlock__sq_schema_current(sqlite3 *db)
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
int dlock__sq_setup_schema(sqlite3 *db, char **err)
{
	int r = setup_tables(db, err);
	return r == SQLITE_OK ? sqlite3_exec(db, queue_indexes, NULL, NULL, err) : r;
}

/* mkdir -p for the parent directories of path, mode 0700. */
int dlock__sq_make_parents(const char *path)
{
	char *p = dlock_sys_strdup(path);
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
int dlock__sq_parent_exists(const char *path)
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
				       "directories are created)",
				       dir);
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
int dlock__sq_open_db(sqlite3 **db, const char *path)
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
int dlock__sq_foreign_object(sqlite3 *db, char *buf, size_t len)
{
	sqlite3_stmt *s = NULL;
	int r = sqlite3_prepare_v2(
		db,
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
