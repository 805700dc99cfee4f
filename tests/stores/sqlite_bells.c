/* SQLite doorbells (docs/stores/sqlite.md, "Waiting"): a waiter in one
 * process is woken by a release in another at once, not when its back-off
 * ends. The holder's lease is long (30 s) and a waiter's registration is
 * refreshed every queue TTL / 3 (1 s), so a waiter that only polled would be
 * granted up to 1 s after the release; a rung one within milliseconds. Three
 * handoffs, each woken well before its 1 s nap would have ended; and the
 * bell directory is made only once someone waits. */
#include "unit/testutil.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The holder, ROUNDS times: when told, take `job` and say so; when told
 * again, release it and say when. */
static int holder(const char *uri, int in, int out, int rounds)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0)
		return 1;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	dlock_lock *l;
	if (dlock_lock_new(&l, s, "job", &o) != 0)
		return 1;
	for (int i = 0; i < rounds; i++) {
		char c;
		if (read(in, &c, 1) != 1 || dlock_acquire(l, 20000) != 0)
			return 1;
		if (write(out, "h", 1) != 1 || read(in, &c, 1) != 1)
			return 1;
		long long t = mono_ms();
		if (dlock_release(l) != 0 || write(out, &t, sizeof t) != (ssize_t)sizeof t)
			return 1;
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	char path[600], uri[700], bells[700];
	snprintf(path, sizeof(path), "%s/bells.db", argv[1]);
	snprintf(bells, sizeof(bells), "%s.bells", path);
	unlink(path);
	for (int i = 0; i < 64; i++) { /* a directory left by an earlier run */
		char f[720];
		snprintf(f, sizeof(f), "%s/%02x", bells, i);
		unlink(f);
	}
	rmdir(bells);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	const int rounds = 3;
	int to_child[2], from_child[2];
	if (pipe(to_child) || pipe(from_child))
		return 2;
	dlock_store *s;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return tu_done("sqlite.bells");
	dlock_lock *w;
	CHECK_RC(dlock_lock_new(&w, s, "job", NULL), 0);
	/* no waiter yet: a release rings nothing and makes no directory */
	CHECK_RC(dlock_acquire(w, 0), 0);
	CHECK_RC(dlock_release(w), 0);
	struct stat st;
	CHECK(stat(bells, &st) != 0);

	pid_t pid = fork();
	if (pid == 0)
		_exit(holder(uri, to_child[0], from_child[1], rounds));
	for (int i = 0; i < rounds; i++) {
		char c;
		CHECK(write(to_child[1], "a", 1) == 1);
		CHECK(read(from_child[0], &c, 1) == 1 && c == 'h');
		/* the child holds: tell it to release as soon as we wait (it sees
		 * our registration in the database first) */
		dlock_store *peek;
		CHECK_RC(dlock_store_open(&peek, uri), 0);
		pid_t rel = fork();
		if (rel == 0) {
			/* a third process watches for our registration, then lets go */
			dlock_store *p2;
			if (dlock_store_open(&p2, uri) != 0)
				_exit(1);
			const char *names[] = { "job" };
			for (long long until = mono_ms() + 10000; mono_ms() < until;) {
				dlock_lock_status *ls;
				size_t n;
				if (dlock_store_status(p2, names, 1, &ls, &n) == 0) {
					size_t waiting = n ? ls[0].waiters : 0;
					dlock_status_free(ls, n);
					if (waiting > 0)
						break;
				}
				usleep(2000);
			}
			dlock_store_close(p2);
			_exit(write(to_child[1], "r", 1) == 1 ? 0 : 1);
		}
		dlock_store_close(peek);
		CHECK_RC(dlock_acquire(w, 15000), 0);
		long long granted = mono_ms(), released = 0;
		CHECK(read(from_child[0], &released, sizeof released) == (ssize_t)sizeof released);
		int rst = -1;
		waitpid(rel, &rst, 0);
		CHECK(WIFEXITED(rst) && WEXITSTATUS(rst) == 0);
		printf("handoff %d: granted %lld ms after the release in another process\n", i + 1,
		       granted - released);
		CHECK(granted - released < 400 + TU_SCHED_GRACE_MS); /* rung: not the 1 s nap */
		CHECK_RC(dlock_release(w), 0);
	}
	CHECK(stat(bells, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
	int cst = -1;
	waitpid(pid, &cst, 0);
	CHECK(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
	dlock_lock_free(w);
	dlock_store_close(s);
	return tu_done("sqlite.bells");
}
