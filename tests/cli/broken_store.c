/*
 * broken_store.c — a test build of the dlock tool with one more store,
 * `broken://HOST:PORT`, registered through dlock_backend_register: it grants
 * every request to everyone (fences still rise, from a counter that forked
 * workers share), never talks to HOST:PORT, and renews and releases
 * anything. `dlock check` must catch it (tests/cli/check.sh); HOST:PORT only
 * gives check's fault proxy routes to fault.
 */
#include "cli.h"

#include <dlock/sys/backend.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Shared by the processes `dlock check` forks after main mapped it. */
static atomic_ullong *fences;

typedef struct broken_backend {
	dlock_backend base;
} broken_backend;

static int broken_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	(void)be;
	(void)req;
	out->fence = atomic_fetch_add(fences, 1) + 1;
	return 0;
}

static int broken_release(dlock_backend *be, const dlock_request *req)
{
	(void)be;
	(void)req;
	return 0;
}

static int broken_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	(void)be;
	(void)reqs;
	for (size_t i = 0; i < n; i++)
		results[i] = 0;
	return 0;
}

static void broken_close(dlock_backend *be)
{
	free(be);
}

static const dlock_backend_methods broken_methods = {
	DLOCK_BACKEND_METHODS_INIT("broken"),
	.acquire = broken_acquire,
	.release = broken_release,
	.renew = broken_renew,
	.close = broken_close,
};

static int broken_open(dlock_backend **out, dlock_uri *uri)
{
	(void)uri;
	broken_backend *b = calloc(1, sizeof *b);
	if (!b)
		return dlock_error_set(DLOCK_ENOMEM, "broken", NULL, "out of memory");
	int rc = dlock_backend_init(&b->base, &broken_methods);
	if (rc) {
		free(b);
		return rc;
	}
	*out = &b->base;
	return 0;
}

int main(int argc, char **argv)
{
	fences = mmap(NULL, sizeof *fences, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (fences == MAP_FAILED || dlock_backend_register("broken", broken_open) != 0)
		return 70;
	return cli_main(argc, argv);
}
