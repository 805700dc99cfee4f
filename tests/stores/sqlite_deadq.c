/* A fair SQLite queue with dead waiters at its head (issue 31, row 5):
 *  - dead_head: six fair waiters in other processes, the first four
 *    SIGKILLed while the name is held; at the release the fifth is granted
 *    within one queue TTL (3 s), however many died ahead of it (28.6 s
 *    before: each dead one was waited out in turn, the far ones with their
 *    30 s registrations);
 *  - second_registration: the second in line is registered for a front
 *    waiter's 3 s, read from the file (it had the far 30 s: "two or more
 *    ahead" was counted from one); the third keeps the far 30 s.
 * Usage: sqlite_deadq DIR CASE */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define QUEUE_TTL_MS 3000

static char path[600], uri[700];

/* The parent's store and its hold of "q". */
static dlock_store *s;
static dlock_lock *h;

static bool hold(void)
{
	sp_remove_db(path);
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(s ? dlock_lock_new(&h, s, "q", NULL) : -1, 0);
	if (h)
		CHECK_RC(dlock_acquire(h, 0), 0);
	return h && dlock_held(h);
}

static void unhold(void)
{
	dlock_lock_free(h);
	dlock_store_close(s);
	h = NULL;
	s = NULL;
}

/* n fair waiters in other processes, in this order in the queue. */
static int queue_up(sp_child *w, int n)
{
	int k = 0;
	for (; k < n; k++) {
		if (sp_start(&w[k], "fairwait", uri, "q") != 0)
			break;
		/* not inherited by the next ones: its stdin's end must close */
		fcntl(w[k].in, F_SETFD, FD_CLOEXEC);
		fcntl(w[k].out, F_SETFD, FD_CLOEXEC);
		if (!tu_await_waiters(s, "q", (size_t)k + 1, 10000)) {
			k++;
			break;
		}
	}
	CHECK(k == n && tu_waiters(s, "q") == (size_t)n);
	return k;
}

static void dead_head(void)
{
	if (!hold())
		return unhold();
	sp_child w[6];
	int n = queue_up(w, 6);
	for (int i = 0; i < 4 && i < n; i++) {
		kill(w[i].pid, SIGKILL);
		CHECK(sp_finish(&w[i]) == 128 + SIGKILL);
	}
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_release(h), 0);
	char line[64] = "";
	/* waited for up to the bound and 2 s more: a failure is seen quickly */
	int got = n == 6 ? sp_line(&w[4], line, sizeof line, QUEUE_TTL_MS + 2000 + (int)TU_SCHED_GRACE_MS) : -1;
	long long took = tu_now_ms() - t0, grace = TU_SCHED_GRACE_MS;
	printf("four dead at the head: the fifth granted %lld ms after the release (bound %d + %lld ms)\n", took,
	       QUEUE_TTL_MS, grace);
	CHECK(got == 0 && strncmp(line, "held ", 5) == 0);
	CHECK(took <= QUEUE_TTL_MS + grace);
	/* and the sixth after it */
	if (n == 6) {
		CHECK(sp_finish(&w[4]) == 0);
		CHECK(sp_line(&w[5], line, sizeof line, 10000) == 0 && strncmp(line, "held ", 5) == 0);
		CHECK(sp_finish(&w[5]) == 0);
	}
	unhold();
}

static void second_registration(void)
{
	if (!hold())
		return unhold();
	sp_child w[3];
	int n = queue_up(w, 3);
	long long first = sp_queue_left(path, "q", 0), second = sp_queue_left(path, "q", 1);
	long long third = sp_queue_left(path, "q", 2);
	printf("registrations: the front's %lld ms left, the second's %lld ms, the third's %lld ms\n", first, second,
	       third);
	CHECK(first > 0 && first <= QUEUE_TTL_MS);
	CHECK(second > 0 && second <= QUEUE_TTL_MS);
	CHECK(third > QUEUE_TTL_MS * 5 && third <= QUEUE_TTL_MS * 10);
	CHECK_RC(dlock_release(h), 0);
	for (int i = 0; i < n; i++) {
		char line[64] = "";
		CHECK(sp_line(&w[i], line, sizeof line, 10000) == 0 && strncmp(line, "held ", 5) == 0);
		CHECK(sp_finish(&w[i]) == 0);
	}
	unhold();
}

int main(int argc, char **argv)
{
	int code = sp_role(argc, argv);
	if (code >= 0)
		return code;
	if (argc != 3)
		return 2;
	mkdir(argv[1], 0700);
	snprintf(path, sizeof(path), "%s/deadq.db", argv[1]);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	static const tu_case cases[] = {
		{ "dead_head", dead_head },
		{ "second_registration", second_registration },
	};
	if (tu_run_cases(cases, sizeof cases / sizeof *cases, argc, argv, 2) != 1)
		return 2;
	sp_remove_db(path);
	return tu_done("sqlite.dead_queue");
}
