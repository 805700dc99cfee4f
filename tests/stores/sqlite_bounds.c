/* Every call is bounded by its own deadline while another process sits in a
 * write transaction on the file (BEGIN EXCLUSIVE in a plain sqlite3
 * connection): SQLite's wait for the write lock is cut to the time the core
 * gives the call, not SQLite's busy_timeout.
 *   - dlock_acquire(lock, 500) returns within 500 ms + 50 ms, with
 *     DLOCK_ETIMEOUT or DLOCK_EUNAVAILABLE (timeout= 300 ms and the default),
 *     and a try-once (wait 0) after its one timeout= with DLOCK_ELOCKED;
 *   - dlock_release of a held lock returns within timeout= (300 ms) + 50 ms;
 *   - dlock_store_status answers within timeout= + 50 ms (reads do not wait);
 *   - opening a file that needs no setup write does not wait for the write
 *     lock; opening one that does (a migration) ends within connect_timeout
 *     + 50 ms with DLOCK_EUNAVAILABLE;
 *   - a holder whose renewals are blocked gets on_lost no later than its
 *     lease deadline + TU_SCHED_GRACE_MS, and dlock_held() is false from the deadline. */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <pthread.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 300
#define SLACK_MS (50 + TU_SCHED_GRACE_MS) /* the promise + scheduling grace */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long lost_at;

static void on_lost(dlock_lock *l, void *payload)
{
	(void)l;
	(void)payload;
	pthread_mutex_lock(&mu);
	lost_at = tu_now_ms();
	pthread_mutex_unlock(&mu);
}

static long long lost_time(void)
{
	pthread_mutex_lock(&mu);
	long long at = lost_at;
	pthread_mutex_unlock(&mu);
	return at;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Another process takes the write lock of the file and keeps it. */
static int hog_start(sp_child *c, const char *path)
{
	char line[32] = "";
	if (sp_start(c, "exclusive", path, NULL) != 0 || sp_line(c, line, sizeof(line), 5000) != 0 ||
	    strcmp(line, "ready") != 0) {
		fprintf(stderr, "the write-lock holder did not start\n");
		return -1;
	}
	return 0;
}

static void acquire_bound(const char *uri, const char *name)
{
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, name, NULL), 0);
	long long t0 = tu_now_ms();
	int rc = dlock_acquire(l, 500);
	long long took = tu_now_ms() - t0;
	printf("  acquire(500) with the write lock taken (%s): %s after %lld ms\n",
	       strstr(uri, "timeout=") ? "timeout=300ms" : "default timeout", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= 500 + SLACK_MS);
	if (rc == DLOCK_EUNAVAILABLE)
		CHECK(strstr(dlock_error_last()->message, "timed out") != NULL);
	dlock_lock_free(l);
	dlock_store_close(s);
}

int main(int argc, char **argv)
{
	int early = sp_main(argc, argv);
	if (early >= 0)
		return early;
	char path[600], uri[700], uri_default[700];
	snprintf(path, sizeof(path), "%s/bounds.db", argv[1]);
	unlink(path);
	snprintf(uri, sizeof(uri), "sqlite://%s?timeout=%dms", path, TIMEOUT_MS);
	snprintf(uri_default, sizeof(uri_default), "sqlite://%s", path);

	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("sqlite.bounds");
	dlock_lock *held = NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000; /* no renewal during the test: nothing else waits for the store */
	CHECK_RC(dlock_lock_new(&held, s, "held", &o), 0);
	CHECK_RC(dlock_acquire(held, 0), 0);

	sp_child hog;
	if (hog_start(&hog, path) != 0) {
		CHECK(0);
		return tu_done("sqlite.bounds");
	}
	acquire_bound(uri, "wanted");
	acquire_bound(uri_default, "wanted");

	/* A try-once: refused ("not now": nothing was written, so nothing to
	 * undo) once its one request timeout has passed. */
	dlock_lock *once = NULL;
	CHECK_RC(dlock_lock_new(&once, s, "once", NULL), 0);
	long long t1 = tu_now_ms();
	CHECK_RC(dlock_acquire(once, 0), DLOCK_ELOCKED);
	long long took1 = tu_now_ms() - t1;
	printf("  try-once with the write lock taken: %lld ms\n", took1);
	CHECK(took1 >= TIMEOUT_MS - 5 && took1 <= TIMEOUT_MS + SLACK_MS);
	dlock_lock_free(once);

	/* Status reads: WAL readers do not wait for the writer. */
	long long t0 = tu_now_ms();
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, NULL, 0, &st, &n), 0);
	long long took = tu_now_ms() - t0;
	CHECK(took <= TIMEOUT_MS + SLACK_MS);
	CHECK(n == 1);
	dlock_status_free(st, n);

	/* An open that needs no write does not wait for the write lock. */
	dlock_store *s2 = NULL;
	t0 = tu_now_ms();
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	took = tu_now_ms() - t0;
	printf("  open of a set-up file with the write lock taken: %lld ms\n", took);
	CHECK(took <= TIMEOUT_MS + SLACK_MS);
	dlock_store_close(s2);

	/* Release of a held lock: within timeout=. */
	t0 = tu_now_ms();
	int rc = dlock_release(held);
	took = tu_now_ms() - t0;
	printf("  release with the write lock taken: %s after %lld ms\n", dlock_error_name(rc), took);
	CHECK(rc == DLOCK_EUNAVAILABLE);
	CHECK(took <= TIMEOUT_MS + SLACK_MS);
	CHECK(sp_finish(&hog) == 0);
	dlock_lock_free(held);

	/* An open that must write (a version-1 file to migrate): within connect_timeout. */
	char old[600], old_uri[700];
	snprintf(old, sizeof(old), "%s/bounds-v1.db", argv[1]);
	unlink(old);
	sqlite3 *db = NULL;
	CHECK(sqlite3_open(old, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(
		      db,
		      "PRAGMA journal_mode=WAL; CREATE TABLE dlock_schema(version INTEGER NOT NULL);"
		      "INSERT INTO dlock_schema VALUES(1);"
		      "CREATE TABLE dlock_holders(ns TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,"
		      " mode INTEGER NOT NULL, permits INTEGER NOT NULL, fence INTEGER NOT NULL,"
		      " expires INTEGER NOT NULL, host TEXT, pid INTEGER, PRIMARY KEY(ns,name,owner)) WITHOUT ROWID;"
		      "CREATE TABLE dlock_fences(ns TEXT NOT NULL, name TEXT NOT NULL, fence INTEGER NOT NULL,"
		      " PRIMARY KEY(ns,name)) WITHOUT ROWID;"
		      "CREATE TABLE dlock_waiters(seq INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL,"
		      " name TEXT NOT NULL, owner TEXT NOT NULL, mode INTEGER NOT NULL, expires INTEGER NOT NULL,"
		      " host TEXT, pid INTEGER, UNIQUE(ns,name,owner));",
		      NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	snprintf(old_uri, sizeof(old_uri), "sqlite://%s?connect_timeout=400ms", old);
	if (hog_start(&hog, old) == 0) {
		s2 = NULL;
		t0 = tu_now_ms();
		rc = dlock_store_open(&s2, old_uri);
		took = tu_now_ms() - t0;
		printf("  open needing a write with the write lock taken: %s after %lld ms\n", dlock_error_name(rc),
		       took);
		CHECK(rc == DLOCK_EUNAVAILABLE);
		CHECK(took <= 400 + SLACK_MS);
		dlock_store_close(s2);
		CHECK(sp_finish(&hog) == 0);
	} else {
		CHECK(0);
	}

	/* A holder whose renewals are blocked: on_lost by its lease deadline. */
	dlock_lock *h = NULL;
	o.ttl_ms = 1000;
	o.on_lost = on_lost;
	CHECK_RC(dlock_lock_new(&h, s, "renewed", &o), 0);
	CHECK_RC(dlock_acquire(h, 0), 0);
	if (hog_start(&hog, path) == 0) {
		/* The deadline is where dlock_ttl_left points; a renewal that
		 * completed just before the hog moves it, so keep the latest. */
		long long deadline = 0, held_until = 0, limit = tu_now_ms() + 3000;
		while (!lost_time() && tu_now_ms() < limit) {
			long long now = tu_now_ms();
			long long left = dlock_ttl_left(h);
			if (left > 0 && now + left > deadline)
				deadline = now + left;
			if (dlock_held(h))
				held_until = now;
			sleep_ms(1);
		}
		long long at = lost_time();
		CHECK(at != 0);
		if (at) {
			printf("  renewals blocked: on_lost %+lld ms from the lease deadline\n", at - deadline);
			CHECK(at <= deadline + TU_SCHED_GRACE_MS);
		}
		CHECK(held_until <= deadline);
		CHECK(!dlock_held(h));
		CHECK(sp_finish(&hog) == 0);
	} else {
		CHECK(0);
	}
	dlock_lock_free(h);
	dlock_store_close(s);
	return tu_done("sqlite.bounds");
}
