#include "testutil/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int tu_failures;

static _Atomic long long sched_late_us;
static _Atomic long long window_late_us; /* since tu_lag_start */
static bool sampled_on_call; /* measure at each call (not under valgrind) */

/* Before main: under valgrind (one thread at a time, 20-50x slower) a
 * second is the measure; elsewhere each call measures three naps now and
 * keeps the latest wake-up of the run. Not a thread napping in the
 * background: a test program that forks without exec (sqlite.fresh_file,
 * the fork cases) then had its children hang in ASan's allocator 3 times in
 * 6 here (clang 14), and ThreadSanitizer forbids threads in such children. */
__attribute__((constructor)) static void sched_measure_init(void)
{
	const char *pre = getenv("LD_PRELOAD");
	if (pre && strstr(pre, "vgpreload")) {
		atomic_store(&sched_late_us, 1000000);
		return;
	}
	sampled_on_call = true;
}

long long tu_sched_late_ms(void)
{
	for (int i = 0; sampled_on_call && i < 3; i++) { /* three 10 ms naps, now */
		struct timespec a, b, nap = { 0, 10 * 1000000L };
		clock_gettime(CLOCK_MONOTONIC, &a);
		nanosleep(&nap, NULL);
		clock_gettime(CLOCK_MONOTONIC, &b);
		long long late = (long long)(b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000 - 10000;
		if (late > atomic_load(&sched_late_us))
			atomic_store(&sched_late_us, late);
		if (late > atomic_load(&window_late_us))
			atomic_store(&window_late_us, late);
	}
	return (atomic_load(&sched_late_us) + 999) / 1000;
}

void tu_lag_start(void)
{
	atomic_store(&window_late_us, 0);
	if (sampled_on_call)
		tu_sched_late_ms(); /* three naps at the window's start too */
}

long long tu_lag_ms(void)
{
	if (sampled_on_call)
		tu_sched_late_ms(); /* three naps now */
	return 2 * ((atomic_load(&window_late_us) + 999) / 1000) + 10;
}

long long tu_sched_grace_ms(void)
{
	return 50 + 2 * tu_sched_late_ms();
}

int tu_done(const char *suite)
{
	if (tu_failures) {
		fprintf(stderr, "%s: %d check(s) FAILED\n", suite, tu_failures);
		return 1;
	}
	printf("%s: all checks passed\n", suite);
	return 0;
}

long long tu_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

size_t tu_waiters(dlock_store *s, const char *name)
{
	const char *names[1] = { name };
	dlock_lock_status *st = NULL;
	size_t n = 0, w = 0;
	if (dlock_store_status(s, names, 1, &st, &n) == 0 && n == 1)
		w = st[0].waiters;
	dlock_status_free(st, n);
	return w;
}

int tu_await_waiters(dlock_store *s, const char *name, size_t want, long ms)
{
	for (long long until = tu_now_ms() + ms;;) {
		if (tu_waiters(s, name) == want)
			return 1;
		if (tu_now_ms() >= until)
			return 0;
		usleep(2000);
	}
}

int tu_first_line(const char *path, char *out, size_t n)
{
	FILE *f = path ? fopen(path, "r") : NULL;
	int ok = f && fgets(out, (int)n, f);
	if (f)
		fclose(f);
	if (!ok)
		return -1;
	out[strcspn(out, "\r\n")] = '\0';
	return 0;
}

void tu_uri_from_env(char *out, size_t n, const char *prog)
{
	if (tu_first_line(getenv("DLOCK_TEST_URI_FILE"), out, n) != 0) {
		fprintf(stderr, "%s: set DLOCK_TEST_URI_FILE (server not started?)\n", prog);
		exit(2);
	}
}

void tu_server_dir(char *out, size_t n)
{
	const char *file = getenv("DLOCK_TEST_URI_FILE");
	snprintf(out, n, "%s", file ? file : "");
	char *slash = strrchr(out, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(out, n, ".");
}

size_t tu_run_cases(const tu_case *cases, size_t n, int argc, char **argv, int first)
{
	size_t ran = 0;
	for (size_t i = 0; i < n; i++) {
		int want = argc <= first;
		for (int a = first; a < argc; a++)
			want |= strcmp(argv[a], cases[i].name) == 0;
		if (!want)
			continue;
		int before = tu_failures;
		long long t0 = tu_now_ms();
		cases[i].fn();
		printf("%-24s %s (%lld ms)\n", cases[i].name, tu_failures == before ? "ok" : "FAILED",
		       tu_now_ms() - t0);
		ran++;
	}
	return ran;
}

pid_t tu_spawn_self(char *const argv[], void (*in_child)(void *ctx), void *ctx)
{
	/* The path, not /proc/self/exe itself: under valgrind that is valgrind's
	 * own binary, while readlink of it gives this program (valgrind says so). */
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return -1;
	exe[n] = '\0';
	fflush(NULL);
	pid_t p = fork();
	if (p != 0)
		return p;
	if (in_child)
		in_child(ctx);
	execv(exe, argv);
	_exit(98);
}

/* A wait status as tu_reap reports it. */
static int reaped(int st)
{
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int tu_reap(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return reaped(st);
}

int tu_reap_within(pid_t pid, long long ms)
{
	long long until = tu_now_ms() + ms;
	int st = 0;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -1;
		if (tu_now_ms() > until) {
			fprintf(stderr, "child %d still running after %lld ms: killed\n", (int)pid, ms);
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return 200;
		}
		usleep(2000);
	}
	return reaped(st);
}

/* Whether every thread of process `pid` (0: this one, less the calling
 * thread) is in one of the states `states` (letters of /proc's stat). */
static bool tasks_in(pid_t pid, const char *states)
{
	char dir[64];
	if (pid)
		snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	else
		snprintf(dir, sizeof(dir), "/proc/self/task");
	DIR *d = opendir(dir);
	if (!d)
		return true;
	bool all = true;
	struct dirent *e;
	char self[32] = "";
	if (!pid)
		snprintf(self, sizeof(self), "%ld", (long)syscall(SYS_gettid));
	while (all && (e = readdir(d))) {
		if (e->d_name[0] == '.' || strcmp(e->d_name, self) == 0)
			continue;
		char p[400], buf[512] = "";
		snprintf(p, sizeof(p), "%s/%s/stat", dir, e->d_name);
		FILE *f = fopen(p, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = '\0';
		const char *st = strrchr(buf, ')');
		if (st && st[1] == ' ' && !strchr(states, st[2]))
			all = false;
	}
	closedir(d);
	return all;
}

int tu_stop(pid_t pid)
{
	if (kill(pid, SIGSTOP) != 0)
		return -1;
	long long until = tu_now_ms() + 5000;
	while (!tasks_in(pid, "tTZX")) {
		if (tu_now_ms() > until) {
			fprintf(stderr, "process %d not stopped 5 s after SIGSTOP\n", (int)pid);
			return 1;
		}
		usleep(500);
	}
	return 0;
}

bool tu_gone(pid_t pid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return kill(pid, 0) != 0 && errno == ESRCH;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
	if (n == 0 || !p || p[1] != ' ' || p[2] != 'Z')
		return n == 0;
	/* a zombie leader whose other threads still exit is not gone yet: they
	 * may still hold its ports and files */
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	int tasks = 0;
	for (struct dirent *e; d && (e = readdir(d)) != NULL;)
		tasks += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return tasks <= 1;
}

int tu_kill(pid_t pid)
{
	/* a pidfd turns readable when the process has ended (an event); where
	 * there is none, its end is polled for */
#ifdef SYS_pidfd_open
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);
#else
	int fd = -1;
#endif
	if (kill(pid, SIGKILL) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	long long until = tu_now_ms() + 5000;
	int gone = 0;
	while (!gone && tu_now_ms() < until) {
		if (fd >= 0) {
			struct pollfd p = { fd, POLLIN, 0 };
			gone = poll(&p, 1, (int)(until - tu_now_ms())) == 1;
		} else {
			gone = tu_gone(pid);
			if (!gone)
				usleep(1000);
		}
	}
	if (fd >= 0)
		close(fd);
	if (!gone)
		fprintf(stderr, "process %d still there 5 s after SIGKILL\n", (int)pid);
	return gone ? 0 : 1;
}

void tu_quiesce_before_fork(void)
{
	long long until = tu_now_ms() + 5000;
	for (int quiet = 0; quiet < 5 && tu_now_ms() < until;) {
		quiet = tasks_in(0, "S") ? quiet + 1 : 0;
		usleep(1000);
	}
	fflush(NULL);
}
