/*
 * status.c — `dlock status [NAME...]`: who holds what, with which fence, for
 * how long, and how many wait. A table for people, --json for programs.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char help[] =
	"Usage: dlock status [NAME...]\n"
	"\n"
	"Show locks: name, mode, holders (public id, host, pid), fence, TTL left and the\n"
	"number of waiters. Without NAME, every lock that has holders or waiters (not\n"
	"every store can list them: name the locks there). A named lock nobody holds\n"
	"shows as 'free'. Passwords in the store URI are never shown, nor anything a\n"
	"handle could be made from: a holder's ID is a one-way hash of its owner\n"
	"token ('dlock break NAME --holder ID' frees that holder).\n"
	"\n"
	"The first line names the store (password hidden) and where the choice came\n"
	"from: --store, DLOCK_STORE, a config file (and line), or the local SQLite file.\n"
	"\n"
	"With --json: {\"store\":URI,\"store_from\":TEXT,\"locks\":[{\"name\",\"permits\",\"last_fence\",\n"
	"\"waiters\",\"holders\":[{\"id\",\"host\",\"pid\",\"mode\",\"fence\",\"ttl_left_ms\"}]}]}\n"
	"(ttl_left_ms is -1 when the store cannot tell; Redlock adds \"copies\" and\n"
	"\"copies_of\": on how many masters the hold stands).\n"
	"\n%s"
	"\nExit codes: 0 ok, 64 bad usage, 69 store unavailable or cannot list locks.\n";

static void print_json(dlock_store *store, const char *from, const dlock_lock_status *st, size_t n)
{
	fputs("{\"store\":", stdout);
	cli_json_str(stdout, dlock_store_uri(store));
	fputs(",\"store_from\":", stdout);
	cli_json_str(stdout, from);
	fputs(",\"locks\":[", stdout);
	for (size_t i = 0; i < n; i++) {
		const dlock_lock_status *l = &st[i];
		fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
		cli_json_str(stdout, l->name);
		printf(",\"permits\":%u,\"last_fence\":%llu,\"waiters\":%zu,\"holders\":", l->permits,
		       (unsigned long long)l->last_fence, l->waiters);
		cli_json_holders(stdout, l);
		fputs("}", stdout);
	}
	fputs("]}\n", stdout);
}

static int width_of(const char *s, int min)
{
	int w = (int)strlen(s ? s : "");
	return w > min ? w : min;
}

static void print_table(dlock_store *store, const char *from, const dlock_lock_status *st, size_t n, bool tty,
			int verbosity)
{
	/* Bold header only for people; pipes get plain text (and NO_COLOR wins). */
	bool bold = tty && !getenv("NO_COLOR");
	int wname = 4, wholder = 6, wfence = 8; /* fences may be clock-sized (SQLite: 16 digits) */
	char buf[512];
	for (size_t i = 0; i < n; i++) {
		wname = width_of(st[i].name, wname);
		snprintf(buf, sizeof buf, "%llu", (unsigned long long)st[i].last_fence);
		wfence = width_of(buf, wfence);
		for (size_t j = 0; j < st[i].nholders; j++) {
			const dlock_holder *h = &st[i].holders[j];
			snprintf(buf, sizeof buf, "%s:%d", h->host && *h->host ? h->host : "?", h->pid);
			wholder = width_of(buf, wholder);
			snprintf(buf, sizeof buf, "%llu", (unsigned long long)h->fence);
			wfence = width_of(buf, wfence);
		}
	}
	if (wname > 60)
		wname = 60;
	if (verbosity >= 0)
		printf("store %s (from %s)\n", dlock_store_uri(store), from);
	if (n == 0) {
		printf("no locks held or waited for\n");
		return;
	}
	printf("%s%-*s  %-10s  %*s  %9s  %-*s  %7s  %s%s\n", bold ? "\033[1m" : "", wname, "NAME", "MODE", wfence,
	       "FENCE", "TTL LEFT", wholder, "HOLDER", "WAITERS", "ID", bold ? "\033[0m" : "");
	for (size_t i = 0; i < n; i++) {
		const dlock_lock_status *l = &st[i];
		char mode[32];
		if (l->nholders == 0) {
			char fence[32];
			snprintf(fence, sizeof fence, "%llu", (unsigned long long)l->last_fence);
			printf("%-*s  %-10s  %*s  %9s  %-*s  %7zu  %s\n", wname, l->name, "free", wfence,
			       l->last_fence ? fence : "-", "-", wholder, "-", l->waiters, "-");
			continue;
		}
		for (size_t j = 0; j < l->nholders; j++) {
			const dlock_holder *h = &l->holders[j];
			char ttl[32], holder[300];
			if (h->mode == DLOCK_SHARED)
				snprintf(mode, sizeof mode, "shared");
			else if (l->permits > 1)
				snprintf(mode, sizeof mode, "sem/%u", l->permits);
			else
				snprintf(mode, sizeof mode, "exclusive");
			if (h->ttl_left_ms < 0)
				snprintf(ttl, sizeof ttl, "?");
			else
				snprintf(ttl, sizeof ttl, "%.1fs", (double)h->ttl_left_ms / 1000.0);
			snprintf(holder, sizeof holder, "%s:%d", h->host && *h->host ? h->host : "?", h->pid);
			if (j == 0)
				printf("%-*s  %-10s  %*llu  %9s  %-*s  %7zu  %s\n", wname, l->name, mode, wfence,
				       (unsigned long long)h->fence, ttl, wholder, holder, l->waiters,
				       h->id ? h->id : "");
			else
				printf("%-*s  %-10s  %*llu  %9s  %-*s  %7s  %s\n", wname, "", mode, wfence,
				       (unsigned long long)h->fence, ttl, wholder, holder, "", h->id ? h->id : "");
			if (h->copies_of && h->copies <= h->copies_of / 2 + 1)
				printf("%-*s  ! on %u of %u servers: a bare quorum (one more lost copy and another "
				       "client can be granted)\n",
				       wname, "", h->copies, h->copies_of);
		}
	}
}

int cli_status(cli_global *g, int argc, char **argv)
{
	cli_args a;
	int rc = cli_parse(g, argc, argv, NULL, NULL, NULL, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	for (int i = 0; rc == 0 && a.dashdash && i < a.nrest; i++)
		a.pos[a.npos++] = a.rest[i];
	for (int i = 0; rc == 0 && i < a.npos; i++)
		rc = cli_name(g, a.pos[i]);
	if (rc != 0) {
		free(a.pos);
		return rc;
	}

	dlock_store *store = NULL;
	if ((rc = cli_store_open(g, &store)) != 0) {
		free(a.pos);
		return rc;
	}
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int err = dlock_store_status(store, a.npos ? (const char *const *)a.pos : NULL, (size_t)a.npos, &st, &n);
	free(a.pos);
	if (err == DLOCK_ENOTSUPPORTED && a.npos == 0) {
		cli_error(g, "the %s store cannot list its locks; name them: dlock status NAME...",
			  dlock_store_kind(store));
		rc = CLI_EXIT_UNAVAILABLE;
	} else if (err != 0) {
		rc = cli_fail(g, err, "status");
	} else {
		const char *from = "";
		cli_store_pick(g, NULL, &from);
		if (g->json)
			print_json(store, from, st, n);
		else
			print_table(store, from, st, n, isatty(STDOUT_FILENO), g->verbosity);
	}
	dlock_status_free(st, n);
	dlock_store_close(store);
	if (rc == 0 && fflush(stdout) != 0)
		rc = CLI_EXIT_FAIL;
	return rc;
}
