/* A fork()'s child that opens its own SQLite store (issue 31, row 8). The
 * parent forks while one of its threads is inside SQLite: a waiting
 * acquire in SQLite's busy handler (another process holds the database's
 * write lock). The child closes the inherited store, as documented, and
 * opens its own on the same file: the open must end within its
 * connect_timeout (plus the scheduling delay measured in this run) — with
 * a store that works, or with the error naming fork() — never hang. It hung
 * in sqlite3WalBeginReadTransaction: the parent's connection, busy at the
 * fork, was left open in the child, and the child's new connection shared
 * its lock bookkeeping. A child forked while no call runs opens and is
 * granted as before.
 * Usage: sqlite_forkopen DIR */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CONNECT_MS 2000

static char path[600], uri[700], child_uri[800];

/* A thread of the parent inside SQLite: an acquire waiting for the write lock. */
static void *busy_acquire(void *arg)
{
	dlock_lock *l = arg;
	if (dlock_acquire(l, 8000) == 0)
		dlock_release(l);
	return NULL;
}

/* In the child: close the inherited store, open one of its own and take a
 * lock with it (`take`; else only read its status: another process holds
 * the write lock). Exit 0: opened (and granted); 3: refused with the fork
 * rule's error; 4: anything else. */
static int child(dlock_store *inherited, dlock_lock *l, const char *name, bool take)
{
	dlock_lock_free(l);
	dlock_store_close(inherited);
	dlock_store *own = NULL;
	long long t0 = tu_now_ms();
	int rc = dlock_store_open(&own, child_uri);
	long long took = tu_now_ms() - t0;
	if (rc != 0) {
		const char *m = dlock_error_last()->message;
		fprintf(stderr, "child: open refused after %lld ms: %s\n", took, m);
		return strstr(m, "fork()") ? 3 : 4;
	}
	dlock_lock *x = NULL;
	if (take) {
		rc = dlock_lock_new(&x, own, name, NULL);
		if (rc == 0)
			rc = dlock_acquire(x, 0);
		if (rc == 0)
			rc = dlock_release(x);
		dlock_lock_free(x);
	} else {
		const char *names[] = { name };
		dlock_lock_status *st = NULL;
		size_t n = 0;
		rc = dlock_store_status(own, names, 1, &st, &n);
		dlock_status_free(st, n);
	}
	fprintf(stderr, "child: opened in %lld ms, %s: %s\n", took, take ? "acquire" : "status", dlock_error_name(rc));
	dlock_store_close(own);
	return rc == 0 ? 0 : 4;
}

/* Fork; the child's exit code, or 200 when it ran past `ms` (killed). */
static int fork_child(dlock_store *s, dlock_lock *l, const char *name, bool take, long long ms, long long *took)
{
	fflush(NULL);
	long long t0 = tu_now_ms();
	pid_t p = fork();
	if (p == 0)
		_exit(child(s, l, name, take));
	if (p < 0)
		return -1;
	int rc = tu_reap_within(p, ms);
	*took = tu_now_ms() - t0;
	return rc;
}

int main(int argc, char **argv)
{
	int code = sp_main(argc, argv);
	if (code >= 0)
		return code;
	snprintf(path, sizeof(path), "%s/forkopen.db", argv[1]);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	snprintf(child_uri, sizeof(child_uri), "sqlite://%s?connect_timeout=%dms", path, CONNECT_MS);
	dlock_store *s = NULL;
	dlock_lock *l = NULL, *busy = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	CHECK_RC(s ? dlock_lock_new(&l, s, "quiet", NULL) : -1, 0);
	CHECK_RC(s ? dlock_lock_new(&busy, s, "busy", NULL) : -1, 0);
	if (!l || !busy)
		return tu_done("sqlite.fork_open");

	/* Forked while no call runs: the child opens its own and is granted. */
	CHECK_RC(dlock_acquire(l, 0), 0);
	long long took = 0;
	tu_quiesce_before_fork();
	int rc = fork_child(s, l, "quiet-child", true, CONNECT_MS + 3000 + TU_SCHED_GRACE_MS, &took);
	printf("forked with no call running: child exit %d after %lld ms\n", rc, took);
	CHECK(rc == 0);
	CHECK_RC(dlock_release(l), 0);

	/* Forked while a thread is inside SQLite (the busy handler). */
	sp_child ex;
	char line[32] = "";
	CHECK_RC(sp_start(&ex, "exclusive", path, NULL), 0);
	CHECK(sp_line(&ex, line, sizeof line, 10000) == 0 && strcmp(line, "ready") == 0);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, busy_acquire, busy) == 0);
	int bad = 0, refused = 0;
	for (int i = 0; i < 5; i++) {
		usleep(100000); /* not an event: only spreads the forks over the busy wait */
		rc = fork_child(s, busy, "busy-child", false, CONNECT_MS + 3000 + TU_SCHED_GRACE_MS, &took);
		long long bound = CONNECT_MS + TU_SCHED_GRACE_MS;
		printf("forked during a busy wait: child exit %d after %lld ms (bound %lld)\n", rc, took, bound);
		refused += rc == 3;
		if (!(rc == 0 || rc == 3) || took > bound)
			bad++;
	}
	printf("%d of 5 children refused with the fork error\n", refused);
	CHECK(bad == 0);
	/* the waiting thread is inside SQLite (its busy handler) for most of
	 * its wait: a child forked then must not use SQLite */
	CHECK(refused > 0);
	sp_finish(&ex);
	pthread_join(t, NULL);
	dlock_lock_free(busy);
	dlock_lock_free(l);
	dlock_store_close(s);
	sp_remove_db(path);
	return tu_done("sqlite.fork_open");
}
