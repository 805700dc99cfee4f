/* The database file deleted or replaced under a holder (issue 20 row 2).
 * A process holds a lock (TTL 1500 ms, renewed every 500 ms) with an on_lost
 * callback; then, one case each: the database file is unlinked; the file and
 * its -wal and -shm are unlinked (a cleaned state directory); another dlock
 * file is renamed over it; only its -wal is unlinked. Each time on_lost must
 * fire within one renewal interval (plus 300 ms of slack), before the lease
 * would end, and dlock_held() turn false; another process is then granted
 * the name on the file now at the path, and the first process's next
 * acquire (which reopens the path) sees that holder and changes nothing.
 * A database with a second hard link is refused under either name. */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Renewal every 500 ms. The earliest the lease itself could end after the
 * fault is TTL - TTL/3 - drift (~980 ms): an on_lost before that was the
 * renewal seeing the fault, not the lease running out. */
#define TTL_MS 1500

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long long lost_at;

static void on_lost(dlock_lock *l, void *payload)
{
	(void)l;
	(void)payload;
	pthread_mutex_lock(&mu);
	lost_at = tu_now_ms();
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* The time on_lost fired, waiting for it at most timeout_ms; 0 if it did not. */
static long long wait_lost(long long timeout_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&mu);
	while (!lost_at && pthread_cond_timedwait(&cv, &mu, &ts) == 0)
		;
	long long at = lost_at;
	pthread_mutex_unlock(&mu);
	return at;
}

static void unlink_suffix(const char *path, const char *suffix)
{
	char p[700];
	snprintf(p, sizeof(p), "%s%s", path, suffix);
	unlink(p);
}

static void one_case(const char *dir, const char *fault)
{
	char path[600], uri[700], other[600], other_uri[700];
	snprintf(path, sizeof(path), "%s/moved-%s.db", dir, fault);
	snprintf(other, sizeof(other), "%s/moved-%s.new.db", dir, fault);
	unlink_suffix(path, "");
	unlink_suffix(path, "-wal");
	unlink_suffix(path, "-shm");
	unlink(other);
	snprintf(uri, sizeof(uri), "sqlite://%s?ttl=%dms", path, TTL_MS);
	snprintf(other_uri, sizeof(other_uri), "sqlite://%s", other);
	pthread_mutex_lock(&mu);
	lost_at = 0;
	pthread_mutex_unlock(&mu);

	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.on_lost = on_lost;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "job", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(dlock_fence(l) > 0);

	if (!strcmp(fault, "rename")) /* a valid dlock file of its own, made by another process */
		CHECK(sp_run("status", other_uri, NULL) == 0);
	long long t0 = tu_now_ms();
	if (!strcmp(fault, "unlink")) {
		CHECK(unlink(path) == 0);
	} else if (!strcmp(fault, "clean")) {
		CHECK(unlink(path) == 0);
		unlink_suffix(path, "-wal");
		unlink_suffix(path, "-shm");
	} else if (!strcmp(fault, "rename")) {
		CHECK(rename(other, path) == 0);
	} else if (!strcmp(fault, "wal")) {
		char p[700];
		snprintf(p, sizeof(p), "%s-wal", path);
		CHECK(unlink(p) == 0);
	}
	long long at = wait_lost(2 * TTL_MS);
	CHECK(at != 0);
	CHECK(!dlock_held(l));
	if (at) {
		CHECK(at - t0 <= TTL_MS / 3 + 300);
		fprintf(stderr, "%s: on_lost %lld ms after the fault\n", fault, at - t0);
	} else {
		fprintf(stderr, "%s: on_lost did not fire within %d ms; held=%d\n", fault, 2 * TTL_MS, dlock_held(l));
	}

	/* Another process is granted on the file now at the path. */
	sp_child c;
	char line[64] = "";
	CHECK(sp_start(&c, "hold", uri, "job") == 0);
	CHECK(sp_line(&c, line, sizeof(line), 5000) == 0);
	CHECK(strncmp(line, "held ", 5) == 0);
	/* The first process sees that holder now, and changes nothing. */
	CHECK(!dlock_held(l));
	CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOCKED);
	dlock_lock_status *st = NULL;
	size_t n = 0;
	CHECK_RC(dlock_store_status(s, NULL, 0, &st, &n), 0);
	CHECK(n == 1 && st[0].nholders == 1 && st[0].holders[0].owner[0] != '\0');
	dlock_status_free(st, n);
	CHECK(sp_finish(&c) == 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK(dlock_held(l));
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	unlink(other);
}

int main(int argc, char **argv)
{
	int early = sp_main(argc, argv);
	if (early >= 0)
		return early;
	const char *faults[] = { "unlink", "clean", "rename", "wal" };
	for (size_t i = 0; i < sizeof(faults) / sizeof(*faults); i++)
		one_case(argv[1], faults[i]);

	/* A database with a second hard link is refused by either name: SQLite
	 * would keep a -wal per name, and the two names would not see each other. */
	char path[600], link_path[600], uri[700];
	snprintf(path, sizeof(path), "%s/linked.db", argv[1]);
	snprintf(link_path, sizeof(link_path), "%s/linked-too.db", argv[1]);
	unlink(path);
	unlink(link_path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	dlock_store_close(s);
	CHECK(link(path, link_path) == 0);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_EUNAVAILABLE);
	CHECK(strstr(dlock_error_last()->message, "hard link") != NULL);
	dlock_store_close(s);
	snprintf(uri, sizeof(uri), "sqlite://%s", link_path);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_EUNAVAILABLE);
	dlock_store_close(s);
	return tu_done("sqlite.moved");
}
