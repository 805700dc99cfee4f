/*
 * bench_floor.c — the floors of `dlock bench`, from the module dlock-floor.so
 * (bench.h): loaded once, on the first floor a bench opens, and kept.
 */
#include "bench.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const bench_floor_module *module;
static char module_why[PATH_MAX + 200];

/* Try one path; on failure, say why in module_why (the last reason wins). */
static const bench_floor_module *try_load(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(module_why, sizeof module_why, "%s", dlerror());
		return NULL;
	}
	const bench_floor_module *m = dlsym(h, BENCH_FLOOR_SYMBOL);
	if (!m || m->version != BENCH_FLOOR_VERSION) {
		snprintf(module_why, sizeof module_why, "%s: not a dlock floor module of version %d", path,
			 BENCH_FLOOR_VERSION);
		dlclose(h);
		return NULL;
	}
	return m;
}

static void load(void)
{
	const char *env = getenv("DLOCK_FLOOR_MODULE");
	if (env && *env) {
		module = try_load(env); /* asked for this one: no other */
		return;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash && (size_t)(slash - exe) + 1 + sizeof BENCH_FLOOR_FILE <= sizeof exe) {
			strcpy(slash + 1, BENCH_FLOOR_FILE);
			if (access(exe, F_OK) == 0 && (module = try_load(exe)))
				return;
		}
	}
#ifdef DLOCK_FLOOR_INSTALLED
	if (!module)
		module = try_load(DLOCK_FLOOR_INSTALLED);
#endif
	if (!module && !module_why[0])
		snprintf(module_why, sizeof module_why, "%s not found", BENCH_FLOOR_FILE);
}

int bench_floor_open(bench_floor **out, const char *uri, char *err, size_t errlen)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, load);
	*out = NULL;
	if (!module) {
		snprintf(err, errlen, "no floor module (%s)", module_why);
		return 1;
	}
	return module->open(out, uri, err, errlen);
}

const char *bench_floor_what(const bench_floor *f)
{
	return f && module ? module->what(f) : "none";
}

int bench_floor_step(bench_floor *f, char *err, size_t errlen)
{
	return module->step(f, err, errlen);
}

long long bench_floor_server_ops(bench_floor *f)
{
	return f && module ? module->server_ops(f) : -1;
}

long long bench_floor_server_scripts(bench_floor *f)
{
	return f && module ? module->server_scripts(f) : -1;
}

long long bench_floor_server_commands(bench_floor *f)
{
	return f && module ? module->server_commands(f) : -1;
}

void bench_floor_close(bench_floor *f)
{
	if (f && module)
		module->close(f);
}
