#include "testutil/testutil.h"

#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int tu_failures;

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

int tu_reap(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
