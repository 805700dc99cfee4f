/*
 * release.c — `dlock release NAME HANDLE`: give back a hold that
 * `dlock acquire` handed to a script. The store checks the owner, so a wrong
 * handle changes nothing and exits 1.
 */
#include "cli.h"

#include <stdlib.h>

static const char help[] =
	"Usage: dlock release NAME HANDLE\n"
	"\n"
	"Release the hold HANDLE (printed by 'dlock acquire' or 'dlock extend') on\n"
	"lock NAME. Only the holder's own handle can release: any other handle exits 1\n"
	"and leaves the lock as it is. With --json prints {\"name\",\"released\":true}.\n"
	"\n"
	"  --shared, --permits N\n"
	"                 the mode the lock was acquired with, if the handle needs it\n"
	"\n%s"
	"\nExit codes: 0 released, 1 not held by HANDLE (already released, expired,\n"
	"or another holder's lock), 64 bad usage or malformed handle, 69 store\n"
	"unavailable.\n";

static const cli_opt opts[] = {
	{ "shared", 0, false, CLI_OPT_SHARED },
	{ "permits", 0, true, CLI_OPT_PERMITS },
	{ NULL, 0, false, 0 },
};

static void not_held(const cli_global *g, const char *name)
{
	cli_error(g,
		  "lock '%s' is not held by this handle (released, expired, or another holder's); "
		  "nothing changed",
		  name);
}

static void print_released(const cli_global *g, const char *name)
{
	if (!g->json)
		return;
	fputs("{\"name\":", stdout);
	cli_json_str(stdout, name);
	fputs(",\"released\":true}\n", stdout);
}

/* A handle of a holder process (stores whose holds die with their session). */
static int release_holder(const cli_global *g, const char *name, const char *handle)
{
	cli_holder_reply r;
	int rc = cli_holder_request(g, name, handle, "release", 0, &r);
	if (rc != 0)
		return rc;
	if (r.code == DLOCK_ENOTHELD || r.code == DLOCK_ELOST) {
		not_held(g, name);
		return CLI_EXIT_FAIL;
	}
	if (r.code != 0) {
		cli_error(g, "release: %s", r.text);
		return cli_exit_code(r.code);
	}
	print_released(g, name);
	return fflush(stdout) == 0 ? 0 : CLI_EXIT_FAIL;
}

int cli_release(cli_global *g, int argc, char **argv)
{
	cli_lockopts_ctx c = { g, CLI_LOCKOPTS_INIT };
	const char *name, *handle;
	int rc = cli_parse_name_handle(g, argc, argv, opts, cli_lockopts_on_opt, &c, &c.lo, help, &name, &handle);
	if (rc != 0)
		return rc == CLI_HELP_SHOWN ? 0 : rc;

	if (cli_holder_handle(handle))
		return release_holder(g, name, handle);
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	if ((rc = cli_store_open(g, &store)) != 0)
		return rc;
	if ((rc = cli_handle_attach(g, store, name, handle, &c.lo, &lock)) != 0)
		goto out;
	int err = dlock_release(lock);
	if (err == DLOCK_ENOTHELD || err == DLOCK_ELOST) {
		not_held(g, name);
		rc = CLI_EXIT_FAIL;
	} else if (err != 0) {
		rc = cli_fail(g, err, "release");
	} else {
		print_released(g, name);
	}
	cli_debug(g, "release '%s': %s", name, err ? dlock_strerror(err) : "ok");
out:
	/* After a failed release the hold must not be retried by dlock_lock_free. */
	cli_handle_drop(lock);
	dlock_store_close(store);
	return rc;
}
