/*
 * extend.c — `dlock extend NAME HANDLE`: push out the lease of a hold that
 * `dlock acquire` handed to a script, and print the (new) handle.
 */
#include "cli.h"

#include <stdlib.h>

static const char help[] =
	"Usage: dlock extend [--ttl D] NAME HANDLE\n"
	"\n"
	"Set the lease of the hold HANDLE (printed by 'dlock acquire') on lock NAME to\n"
	"D from now, and print the handle to use from now on (on stdout; with --json\n"
	"{\"name\",\"handle\",\"fence\",\"ttl_ms\"}). The store checks the owner: a\n"
	"handle that does not hold NAME exits 1 and changes nothing.\n"
	"\n"
	"  --ttl D        new lease from now (default: the TTL of the hold)\n"
	"  --shared, --permits N\n"
	"                 the mode the lock was acquired with, if the handle needs it\n"
	"\n%s"
	"\nExit codes: 0 extended, 1 not held by HANDLE (expired or released),\n"
	"64 bad usage or malformed handle, 69 store unavailable.\n";

static const cli_opt opts[] = {
	{ "ttl", 0, true, CLI_OPT_TTL },
	{ "shared", 0, false, CLI_OPT_SHARED },
	{ "permits", 0, true, CLI_OPT_PERMITS },
	{ NULL, 0, false, 0 },
};

static void print_hold(const cli_global *g, const char *name, const char *handle, uint64_t fence, int64_t ttl_left)
{
	if (g->json) {
		fputs("{\"name\":", stdout);
		cli_json_str(stdout, name);
		fputs(",\"handle\":", stdout);
		cli_json_str(stdout, handle);
		printf(",\"fence\":%llu,\"ttl_ms\":%lld}\n", (unsigned long long)fence, (long long)ttl_left);
	} else {
		printf("%s\n", handle);
	}
}

/* A handle of a holder process (stores whose holds die with their session). */
static int extend_holder(const cli_global *g, const char *name, const char *handle, int64_t ttl)
{
	cli_holder_reply r;
	int rc = cli_holder_request(g, name, handle, "extend", ttl, &r);
	if (rc != 0)
		return rc;
	if (r.code == DLOCK_ENOTHELD || r.code == DLOCK_ELOST) {
		cli_error(g, "lock '%s' is not held by this handle (released or expired); nothing changed", name);
		return CLI_EXIT_FAIL;
	}
	if (r.code != 0) {
		cli_error(g, "extend: %s", r.text);
		return cli_exit_code(r.code);
	}
	print_hold(g, name, r.text, r.fence, r.ttl_left_ms);
	return fflush(stdout) == 0 ? 0 : CLI_EXIT_FAIL;
}

int cli_extend(cli_global *g, int argc, char **argv)
{
	cli_lockopts_ctx c = { g, CLI_LOCKOPTS_INIT };
	const char *name, *handle;
	int rc = cli_parse_name_handle(g, argc, argv, opts, cli_lockopts_on_opt, &c, &c.lo, help, &name, &handle);
	if (rc != 0)
		return rc == CLI_HELP_SHOWN ? 0 : rc;

	if (cli_holder_handle(handle))
		return extend_holder(g, name, handle, c.lo.ttl_ms);
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	if ((rc = cli_store_open(g, &store)) != 0)
		return rc;
	if ((rc = cli_handle_attach(g, store, name, handle, &c.lo, &lock)) != 0)
		goto out;
	int err = dlock_extend(lock, c.lo.ttl_ms);
	if (err == DLOCK_ENOTHELD || err == DLOCK_ELOST) {
		cli_error(g, "lock '%s' is not held by this handle (released or expired); nothing changed", name);
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	if (err != 0) {
		rc = cli_fail(g, err, "extend");
		goto out;
	}
	uint64_t fence = dlock_fence(lock);
	int64_t ttl_left = dlock_ttl_left(lock);
	char *nh = NULL;
	if ((err = dlock_lock_detach(lock, &nh)) != 0) {
		rc = cli_fail(g, err, "extend");
		goto out;
	}
	print_hold(g, name, nh, fence, ttl_left);
	dlock_free(nh);
	cli_debug(g, "extended '%s': lease %lld ms", name, (long long)ttl_left);
	if (fflush(stdout) != 0)
		rc = CLI_EXIT_FAIL;
out:
	cli_handle_drop(lock);
	dlock_store_close(store);
	return rc;
}
