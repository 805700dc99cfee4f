/*
 * acquire.c — `dlock acquire NAME`: take a lock, hand it over to the calling
 * script as a printed handle, and exit with the lock still held in the store
 * (until `dlock release`, or until the lease runs out without `dlock extend`).
 */
#include "cli.h"

#include <stdlib.h>

static const char help[] =
	"Usage: dlock acquire [--ttl D] [--wait D | --no-wait] [--shared] [--permits N]\n"
	"                     [--fair] NAME\n"
	"\n"
	"Take lock NAME, print its handle on stdout and exit, leaving the lock held\n"
	"until 'dlock release NAME HANDLE' or until the lease (--ttl) runs out. Nothing\n"
	"renews it: call 'dlock extend NAME HANDLE' before the TTL passes.\n"
	"With --json: {\"name\",\"handle\",\"fence\",\"ttl_ms\"}.\n"
	"\n"
	"  --ttl D        lease length (default: the store's, 30s unless its URI says ttl=)\n"
	"  --wait D       wait at most D for the lock (default: forever)\n"
	"  --no-wait      try once; exit 75 at once if the lock is held\n"
	"  --shared       shared (read) lock: many shared holders, no exclusive one\n"
	"  --permits N    semaphore: up to N holders at once\n"
	"  --fair         first come, first served among waiters\n"
	"\n%s"
	"\nExit codes: 0 acquired, 64 bad usage, 69 store unavailable, 75 not acquired\n"
	"in time, 1 other failures.\n";

static const cli_opt opts[] = {
	{ "ttl", 0, true, CLI_OPT_TTL },
	{ "wait", 0, true, CLI_OPT_WAIT },
	{ "no-wait", 0, false, CLI_OPT_NO_WAIT },
	{ "shared", 0, false, CLI_OPT_SHARED },
	{ "permits", 0, true, CLI_OPT_PERMITS },
	{ "fair", 0, false, CLI_OPT_FAIR },
	{ NULL, 0, false, 0 },
};

int cli_acquire(cli_global *g, int argc, char **argv)
{
	cli_lockopts_ctx c = { g, CLI_LOCKOPTS_INIT };
	cli_args a;
	int rc = cli_parse(g, argc, argv, opts, cli_lockopts_on_opt, &c, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	if (rc == 0 && a.dashdash && a.nrest == 1 && a.npos == 0) {
		/* "dlock acquire -- -name" for names that start with '-' */
		a.pos[a.npos++] = a.rest[0];
	} else if (rc == 0 && a.dashdash) {
		rc = cli_usage_error(g, "expected one NAME");
	}
	if (rc == 0 && a.npos != 1)
		rc = cli_usage_error(g, a.npos == 0 ? "missing lock NAME" : "expected one NAME, got %d arguments",
				     a.npos);
	if (rc == 0)
		rc = cli_lockopts_check(g, &c.lo);
	const char *name = rc == 0 ? a.pos[0] : NULL;
	free(a.pos);
	if (rc == 0)
		rc = cli_name(g, name);
	if (rc != 0)
		return rc;

	dlock_store *store = NULL;
	int64_t asked_wait = c.lo.wait_ms; /* the open takes its time out of c.lo.wait_ms */
	if ((rc = cli_store_open_within(g, &store, &c.lo.wait_ms)) != 0)
		return rc;

	/* DLOCK_TEST_HOLDER: tests run the holder path on any store. */
	const char *force = getenv("DLOCK_TEST_HOLDER");
	if (dlock_store_session_bound(store) || (force && *force == '1')) {
		/* The hold would die with our session: a holder process keeps it. */
		dlock_store_close(store);
		return cli_holder_acquire(g, cli_store_choice(g), name, &c.lo, asked_wait);
	}
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	cli_lockopts_apply(&c.lo, &o);
	/* The hold outlives this process: a renewal thread would only die with us. */
	o.no_renew = 1;
	dlock_lock *lock = NULL;
	int err = dlock_lock_new(&lock, store, name, &o);
	if (err != 0) {
		rc = cli_fail(g, err, "bad lock");
		goto out;
	}
	err = dlock_acquire(lock, c.lo.wait_ms);
	if (err != 0) {
		if (err == DLOCK_ETIMEOUT || err == DLOCK_ELOCKED) {
			rc = cli_not_acquired(g, store, name, err, asked_wait, CLI_EXIT_NOTACQUIRED);
		} else {
			rc = cli_fail(g, err, "acquire");
		}
		goto out;
	}
	uint64_t fence = dlock_fence(lock);
	int64_t ttl_left = dlock_ttl_left(lock);
	char *handle = NULL;
	err = dlock_lock_detach(lock, &handle);
	if (err != 0) {
		rc = cli_fail(g, err, "cannot hand the lock over");
		/* dlock_lock_free below releases it: never leave a hold nobody can name. */
		goto out;
	}
	if (g->json) {
		fputs("{\"name\":", stdout);
		cli_json_str(stdout, name);
		fputs(",\"handle\":", stdout);
		cli_json_str(stdout, handle);
		printf(",\"fence\":%llu,\"ttl_ms\":%lld}\n", (unsigned long long)fence, (long long)ttl_left);
	} else {
		printf("%s\n", handle);
	}
	cli_debug(g, "acquired '%s' fence %llu, lease %lld ms", name, (unsigned long long)fence, (long long)ttl_left);
	if (fflush(stdout) != 0) {
		/* The script never saw the handle: give the lock back rather than strand it. */
		cli_error(g, "cannot write the handle; releasing");
		dlock_lock_attach(lock, handle);
		dlock_release(lock);
		rc = CLI_EXIT_FAIL;
	}
	dlock_free(handle);
out:
	dlock_lock_free(lock);
	dlock_store_close(store);
	return rc;
}
