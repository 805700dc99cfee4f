/* Two store handles on one SQLite file in one process, and other processes
 * (issue 20 row 1). The first handle holds a lock with a short lease and
 * renews it; a second handle of the same process opens the file, sees the
 * hold, and is closed; other processes then open and close the file as
 * `dlock status` does. Nothing of that may drop the first handle's file locks:
 * for as many leases as it keeps renewing, no other process is granted the
 * name, the holder's renewals land where everyone reads them, and after its
 * release another process is granted with the next fence. A fork()'s child
 * cannot release the parent's hold through the handles it inherited. */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TTL_MS 1500 /* renewed every 500 ms: room for a loaded machine */

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	int early = sp_main(argc, argv);
	if (early >= 0)
		return early;
	char path[600], uri[700];
	snprintf(path, sizeof(path), "%s/two.db", argv[1]);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s?ttl=%dms", path, TTL_MS);

	dlock_store *s1 = NULL, *s2 = NULL;
	CHECK_RC(dlock_store_open(&s1, uri), 0);
	if (!s1)
		return tu_done("sqlite.two_handles");
	struct stat st;
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);

	dlock_lock *held = NULL, *other = NULL;
	CHECK_RC(dlock_lock_new(&held, s1, "job", NULL), 0);
	CHECK_RC(dlock_acquire(held, 0), 0);
	uint64_t fence = dlock_fence(held);
	CHECK(fence > 0);

	/* A second handle of the same process: sees the hold, then goes away. */
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	if (s2) {
		CHECK_RC(dlock_lock_new(&other, s2, "job", NULL), 0);
		CHECK_RC(dlock_acquire(other, 0), DLOCK_ELOCKED);
		dlock_lock_free(other);
		dlock_store_close(s2);
	}
	/* Other processes open and close the file (checkpoint on close). */
	CHECK(sp_run("status", uri, NULL) == 0);
	CHECK(sp_run("status", uri, NULL) == 0);

	/* Several leases pass; the holder keeps renewing. Every so often another
	 * process tries: it must never be granted while we hold. At least four
	 * tries, however long a sanitized child takes to start (~350 ms on a
	 * loaded machine: four leases' time alone then fit only three). */
	long long until = tu_now_ms() + 4 * TTL_MS;
	int tries = 0, granted = 0;
	while (tu_now_ms() < until || tries < 4) {
		sleep_ms(TTL_MS / 2);
		int rc = sp_run("try", uri, "job");
		tries++;
		granted += rc == 0;
		CHECK(rc == 1);
		CHECK(dlock_held(held));
		if (rc != 1)
			break;
	}
	CHECK(tries >= 4);
	if (granted)
		fprintf(stderr, "another process was granted 'job' while this one held it (%d of %d tries)\n", granted,
			tries);
	CHECK(sp_run("status", uri, NULL) == 0);

	/* After our release another process is granted, with the next fence. */
	CHECK_RC(dlock_release(held), 0);
	sp_child c;
	char line[64] = "";
	CHECK(sp_start(&c, "hold", uri, "job") == 0);
	CHECK(sp_line(&c, line, sizeof(line), 5000) == 0);
	unsigned long long second = 0;
	CHECK(sscanf(line, "held %llu", &second) == 1 && second > fence);
	if (second <= fence)
		fprintf(stderr, "second grant: '%s' (wanted a fence above %llu)\n", line, (unsigned long long)fence);
	CHECK_RC(dlock_acquire(held, 0), DLOCK_ELOCKED);
	CHECK(sp_finish(&c) == 0);
	CHECK_RC(dlock_acquire(held, 0), 0);
	CHECK(dlock_fence(held) > second);

	/* A fork()'s child (no exec) has the parent's handles: it must not use
	 * the parent's connection nor release the parent's hold (every call on
	 * them is refused), and freeing them ends nothing of the parent's; it
	 * may open a store of its own and look and take locks there. (The
	 * renewer sleeps: TTL 1500 ms, just renewed, so no mutex of the store
	 * is held across the fork.) */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int bad = 0;
		bad += dlock_release(held) != DLOCK_EINVAL;
		dlock_lock *mine = NULL;
		bad += dlock_lock_new(&mine, s1, "job", NULL) != DLOCK_EINVAL;
		const char *names[] = { "job" };
		dlock_lock_status *js = NULL;
		size_t jn = 0;
		bad += dlock_store_status(s1, names, 1, &js, &jn) != DLOCK_EINVAL;
		dlock_lock_free(held);
		dlock_store_close(s1); /* the inherited connection, without a checkpoint */
		dlock_store *own = NULL;
		bad += dlock_store_open(&own, uri) != 0;
		bad += own && dlock_lock_new(&mine, own, "job", NULL) != 0;
		bad += mine && dlock_acquire(mine, 0) != DLOCK_ELOCKED;
		bad += own && (dlock_store_status(own, names, 1, &js, &jn) != 0 || jn != 1 || js[0].nholders != 1);
		if (bad)
			fprintf(stderr, "fork child: %d wrong answer(s); last error: %s\n", bad,
				dlock_error_last()->message);
		dlock_status_free(js, jn);
		dlock_lock_free(mine);
		dlock_store_close(own);
		_exit(bad ? 1 : 0);
	}
	int wst = 0;
	CHECK(pid > 0 && waitpid(pid, &wst, 0) == pid && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
	CHECK(dlock_held(held));
	CHECK(sp_run("try", uri, "job") == 1);
	CHECK_RC(dlock_release(held), 0);
	dlock_lock_free(held);
	dlock_store_close(s1);
	return tu_done("sqlite.two_handles");
}
