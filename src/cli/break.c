/*
 * break.c — `dlock break NAME [--holder ID]`: an operator frees a hold that
 * is not theirs (a crashed script's lock with a long TTL). Holders are named
 * by the public id `status` shows; the store's owner-checked release frees
 * exactly that hold. The holder is not told.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char help[] =
	"Usage: dlock break [--holder ID] NAME\n"
	"\n"
	"Free lock NAME although this is not its holder: with --holder ID only the\n"
	"holder with that ID (as 'dlock status' shows it), else every holder (listed\n"
	"on stderr before they are freed). Prints each holder freed (with --json\n"
	"{\"name\",\"freed\":[{\"id\",\"host\",\"pid\",\"fence\"}]}).\n"
	"\n"
	"Safe only when the holder can no longer write to what the lock protects\n"
	"(its process is gone or stopped for good), or every write it makes carries\n"
	"its fence and the resource rejects old fences. Otherwise the next holder\n"
	"and the old one may write at the same time.\n"
	"\n"
	"  --holder ID    free only this holder (16 hex digits from 'dlock status')\n"
	"\n%s"
	"\nExit codes: 0 freed, 1 nothing freed (no such holder, or the lock is free),\n"
	"64 bad usage, 69 store unavailable or it cannot free another connection's\n"
	"hold (PostgreSQL advisory, MySQL get_lock).\n";

enum { OPT_HOLDER = 1 };

static const cli_opt opts[] = {
	{ "holder", 0, true, OPT_HOLDER },
	{ NULL, 0, false, 0 },
};

typedef struct ctx {
	const char *holder;
} ctx;

static int on_opt(void *p, int id, const char *value)
{
	ctx *c = p;
	if (id == OPT_HOLDER)
		c->holder = value;
	return 0;
}

static void describe(char *buf, size_t len, const dlock_holder *h)
{
	snprintf(buf, len, "%s (%s:%d, fence %llu)", h->id ? h->id : "?", h->host && *h->host ? h->host : "?", h->pid,
		 (unsigned long long)h->fence);
}

static void print_freed(const cli_global *g, const char *name, const dlock_holder *h, size_t n)
{
	if (g->json) {
		fputs("{\"name\":", stdout);
		cli_json_str(stdout, name);
		fputs(",\"freed\":[", stdout);
		for (size_t i = 0; i < n; i++) {
			fputs(i ? ",{\"id\":" : "{\"id\":", stdout);
			cli_json_str(stdout, h[i].id);
			fputs(",\"host\":", stdout);
			cli_json_str(stdout, h[i].host);
			printf(",\"pid\":%d,\"fence\":%llu}", h[i].pid, (unsigned long long)h[i].fence);
		}
		fputs("]}\n", stdout);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		char d[128];
		describe(d, sizeof d, &h[i]);
		printf("freed '%s' holder %s\n", name, d);
	}
}

int cli_break(cli_global *g, int argc, char **argv)
{
	ctx c = { NULL };
	cli_args a;
	int rc = cli_parse(g, argc, argv, opts, on_opt, &c, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	for (int i = 0; rc == 0 && a.dashdash && i < a.nrest; i++)
		a.pos[a.npos++] = a.rest[i];
	if (rc == 0 && a.npos != 1)
		rc = cli_usage_error(g, a.npos == 0 ? "missing lock NAME" : "expected one NAME, got %d arguments",
				     a.npos);
	const char *name = rc == 0 ? a.pos[0] : NULL;
	free(a.pos);
	if (rc == 0)
		rc = cli_name(g, name);
	if (rc == 0 && c.holder) {
		size_t len = strlen(c.holder);
		if (len != DLOCK_HOLDER_ID_LEN || strspn(c.holder, "0123456789abcdef") != len)
			rc = cli_usage_error(g,
					     "--holder: expected %d lowercase hex digits as 'dlock status' "
					     "shows them",
					     DLOCK_HOLDER_ID_LEN);
	}
	if (rc != 0)
		return rc;

	dlock_store *store = NULL;
	if ((rc = cli_store_open(g, &store)) != 0)
		return rc;
	dlock_lock_status *st = NULL;
	size_t n = 0, nfreed = 0;
	dlock_holder *freed = NULL;
	const char *names[1] = { name };
	int err = dlock_store_status(store, names, 1, &st, &n);
	if (err != 0) {
		rc = cli_fail(g, err, "status");
		goto out;
	}
	size_t nh = n ? st[0].nholders : 0;
	if (c.holder) {
		size_t i = 0;
		while (i < nh && strcmp(st[0].holders[i].id, c.holder) != 0)
			i++;
		if (i == nh) {
			cli_error(g, "lock '%s' has no holder %s; nothing freed", name, c.holder);
			rc = CLI_EXIT_FAIL;
			goto out;
		}
	} else if (nh == 0) {
		cli_error(g, "lock '%s' has no holder; nothing freed", name);
		rc = CLI_EXIT_FAIL;
		goto out;
	} else {
		for (size_t i = 0; i < nh; i++) {
			char d[128];
			describe(d, sizeof d, &st[0].holders[i]);
			cli_info(g, "freeing '%s' holder %s", name, d);
		}
	}
	if (!(freed = calloc(nh, sizeof *freed))) {
		cli_error(g, "out of memory");
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	for (size_t i = 0; i < nh; i++) {
		const char *id = st[0].holders[i].id;
		if (c.holder && strcmp(id, c.holder) != 0)
			continue;
		err = dlock_store_break(store, name, id, &freed[nfreed]);
		if (err == 0) {
			nfreed++;
		} else if (err == DLOCK_ENOTHELD) {
			cli_info(g, "holder %s of '%s' is gone already", id, name);
			if (!rc)
				rc = CLI_EXIT_FAIL;
		} else {
			rc = cli_fail(g, err, "break");
		}
	}
	if (nfreed > 0 && rc == CLI_EXIT_FAIL && !c.holder)
		rc = 0; /* every holder is gone: some went by themselves */
	print_freed(g, name, freed, nfreed);
	if (fflush(stdout) != 0 && rc == 0)
		rc = CLI_EXIT_FAIL;
out:
	for (size_t i = 0; i < nfreed; i++)
		dlock_holder_clear(&freed[i]);
	free(freed);
	dlock_status_free(st, n);
	dlock_store_close(store);
	return rc;
}
