#include "sqlite_proc.h"
#include "testutil/testutil.h"

#include <dlock/dlock.h>
#include <poll.h>
#include <stdbool.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static void wait_stdin_eof(void)
{
	char c;
	while (read(0, &c, 1) > 0)
		;
}

static int role_status(const char *uri)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "status: open: %s\n", dlock_error_last()->message);
		return 2;
	}
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int rc = dlock_store_status(s, NULL, 0, &st, &n);
	dlock_status_free(st, n);
	dlock_store_close(s);
	return rc == 0 ? 0 : 2;
}

static int role_try(const char *uri, const char *name)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "try: open: %s\n", dlock_error_last()->message);
		return 2;
	}
	dlock_lock *l;
	int rc = dlock_lock_new(&l, s, name, NULL);
	if (rc == 0)
		rc = dlock_acquire(l, 0);
	int code = rc == 0 ? 0 : rc == DLOCK_ELOCKED ? 1 : 2;
	if (code == 2)
		fprintf(stderr, "try: %s\n", dlock_error_last()->message);
	if (rc == 0)
		dlock_release(l);
	dlock_lock_free(l);
	dlock_store_close(s);
	return code;
}

/* hold (fair: fairwait): acquire, print "held FENCE" or "failed RC", hold
 * until stdin closes, release. */
static int role_hold(const char *uri, const char *name, bool fair)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0) {
		fprintf(stderr, "hold: open: %s\n", dlock_error_last()->message);
		return 2;
	}
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.fair = fair;
	if (fair)
		o.ttl_ms = 30000;
	dlock_lock *l;
	int rc = dlock_lock_new(&l, s, name, &o);
	if (rc == 0)
		rc = dlock_acquire(l, fair ? 60000 : 5000);
	if (rc != 0) {
		fprintf(stderr, "hold: %s\n", dlock_error_last()->message);
		printf("failed %d\n", rc);
	} else {
		printf("held %llu\n", (unsigned long long)dlock_fence(l));
	}
	fflush(stdout);
	wait_stdin_eof();
	if (rc == 0 && dlock_release(l) != 0)
		rc = 3;
	dlock_lock_free(l);
	dlock_store_close(s);
	return rc == 0 ? 0 : 2;
}

static int role_exclusive(const char *path)
{
	sqlite3 *db = NULL;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
		return 2;
	sqlite3_busy_timeout(db, 5000);
	if (sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK) {
		fprintf(stderr, "exclusive: %s\n", sqlite3_errmsg(db));
		sqlite3_close(db);
		return 2;
	}
	printf("ready\n");
	fflush(stdout);
	wait_stdin_eof();
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	sqlite3_close(db);
	return 0;
}

int sp_role(int argc, char **argv)
{
	if (argc < 3 || strcmp(argv[1], "--child") != 0)
		return -1;
	const char *role = argv[2];
	if (!strcmp(role, "status") && argc == 4)
		return role_status(argv[3]);
	if (!strcmp(role, "try") && argc == 5)
		return role_try(argv[3], argv[4]);
	if (!strcmp(role, "hold") && argc == 5)
		return role_hold(argv[3], argv[4], false);
	if (!strcmp(role, "fairwait") && argc == 5)
		return role_hold(argv[3], argv[4], true);
	if (!strcmp(role, "exclusive") && argc == 4)
		return role_exclusive(argv[3]);
	fprintf(stderr, "unknown child role %s\n", role);
	return 64;
}

/* In the child: stdin from in, stdout to out. */
static void plumb(void *ctx)
{
	int **io = ctx;
	if (io[0]) {
		dup2(io[0][0], 0);
		close(io[0][0]);
		close(io[0][1]);
	}
	if (io[1]) {
		dup2(io[1][1], 1);
		close(io[1][0]);
		close(io[1][1]);
	}
}

static pid_t spawn(const char *role, const char *a1, const char *a2, int in[2], int out[2])
{
	char *argv[] = { "child", "--child", (char *)role, (char *)a1, (char *)a2, NULL };
	int *io[2] = { in, out };
	return tu_spawn_self(argv, plumb, io);
}

#define reap tu_reap

int sp_run(const char *role, const char *a1, const char *a2)
{
	pid_t pid = spawn(role, a1, a2, NULL, NULL);
	return pid < 0 ? -1 : reap(pid);
}

int sp_start(sp_child *c, const char *role, const char *a1, const char *a2)
{
	int in[2], out[2];
	if (pipe(in) != 0)
		return -1;
	if (pipe(out) != 0) {
		close(in[0]);
		close(in[1]);
		return -1;
	}
	c->pid = spawn(role, a1, a2, in, out);
	close(in[0]);
	close(out[1]);
	c->in = in[1];
	c->out = out[0];
	return c->pid < 0 ? -1 : 0;
}

int sp_line(sp_child *c, char *buf, size_t len, int timeout_ms)
{
	size_t n = 0;
	while (n + 1 < len) {
		struct pollfd p = { .fd = c->out, .events = POLLIN };
		if (poll(&p, 1, timeout_ms) != 1)
			return -1;
		if (read(c->out, buf + n, 1) != 1)
			return -1;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = '\0';
	return 0;
}

int sp_finish(sp_child *c)
{
	close(c->in);
	close(c->out);
	return reap(c->pid);
}

int sp_main(int argc, char **argv)
{
	int role = sp_role(argc, argv);
	if (role >= 0)
		return role;
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	return -1;
}

void sp_remove_db(const char *path)
{
	const char *sfx[] = { "", "-wal", "-shm", ".writers" };
	for (size_t i = 0; i < sizeof(sfx) / sizeof(*sfx); i++) {
		char p[1100];
		snprintf(p, sizeof(p), "%s%s", path, sfx[i]);
		unlink(p);
	}
}

long long sp_queue_left(const char *path, const char *name, int k)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	long long left = -1;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, "SELECT expires FROM dlock_queue WHERE name=?1 ORDER BY seq LIMIT 1 OFFSET ?2", -1,
			       &st, NULL) == SQLITE_OK) {
		sqlite3_busy_timeout(db, 5000);
		sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
		sqlite3_bind_int(st, 2, k);
		if (sqlite3_step(st) == SQLITE_ROW) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			left = sqlite3_column_int64(st, 0) - ((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
		}
	}
	sqlite3_finalize(st);
	sqlite3_close(db);
	return left;
}
