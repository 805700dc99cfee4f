/*
 * main.c — the dlock tool: global options and command dispatch.
 */
#include "cli.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct sigaction cli_sigpipe_orig;

typedef struct command {
	const char *name;
	int (*fn)(cli_global *g, int argc, char **argv);
	const char *summary;
} command;

static const command commands[] = {
	{ "run", cli_run, "run a command while holding a lock" },
	{ "acquire", cli_acquire, "take a lock and print a handle for scripts" },
	{ "extend", cli_extend, "extend the lease of a handle from 'acquire'" },
	{ "release", cli_release, "release a handle from 'acquire'" },
	{ "status", cli_status, "show holders, fences, TTLs and waiters" },
	{ "break", cli_break, "free another holder's lock (see its --help: when it is safe)" },
	{ "demo", cli_demo, "the access-token race, without and with a lock" },
	{ "check", cli_check, "test a store's safety with faults; report overlaps and lost updates" },
	{ "bench", cli_bench, "measure lock throughput against the store's own floor" },
	{ NULL, NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: dlock [--store URI] [--json] [-q|-v] COMMAND [ARGS...]\n"
		"\n"
		"Distributed locks over SQLite, Redis, Redlock, etcd, ZooKeeper, PostgreSQL,\n"
		"MySQL/MariaDB and Memcached.\n"
		"\n"
		"Commands:\n");
	for (const command *c = commands; c->name; c++)
		fprintf(f, "  %-9s %s\n", c->name, c->summary);
	fprintf(f,
		"\n%s"
		"  --version      print the version\n"
		"\n"
		"Durations: 250ms, 30s, 5m, 1h; a bare number is seconds.\n"
		"Exit codes: 0 ok, 1 failure, 64 bad usage, 69 store unavailable,\n"
		"75 not acquired in time, 76 lock lost while the command ran.\n"
		"'dlock COMMAND --help' describes a command; see also dlock(1).\n",
		cli_global_help);
}

int cli_main(int argc, char **argv)
{
	cli_global g = { 0 };
	/* Writing to a closed pipe must give EPIPE, not kill us while a lock is held. */
	struct sigaction ign = { .sa_handler = SIG_IGN };
	sigemptyset(&ign.sa_mask);
	sigaction(SIGPIPE, &ign, &cli_sigpipe_orig);

	/* The holder process that `acquire` starts (holder.c): not a user command. */
	if (argc == 2 && strcmp(argv[1], CLI_HOLDER_ARGV1) == 0)
		return cli_holder_main();

	int i = 1;
	for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
		if (strcmp(argv[i], "--version") == 0) {
			printf("dlock %s (libdlock %s)\n", DLOCK_VERSION_STRING, dlock_version());
			return 0;
		}
		if (strcmp(argv[i], "--") == 0) {
			int rc = cli_usage_error(&g, "missing COMMAND before '--'");
			cli_json_error(&g, rc);
			return rc;
		}
		int used = 1;
		int rc = cli_global_option(&g, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &used);
		if (rc < 0) {
			usage(stdout);
			return 0;
		}
		if (rc != 0) {
			cli_json_error(&g, rc);
			return rc;
		}
		i += used - 1;
	}
	if (i >= argc) {
		int rc = cli_usage_error(&g, "missing COMMAND");
		cli_json_error(&g, rc);
		return rc;
	}
	const char *name = argv[i];
	if (strcmp(name, "help") == 0) {
		if (i + 1 >= argc) {
			usage(stdout);
			return 0;
		}
		/* "dlock help run" is "dlock run --help". */
		name = argv[i + 1];
		for (const command *c = commands; c->name; c++) {
			if (strcmp(c->name, name) == 0) {
				char *help[] = { (char *)"--help", NULL };
				g.cmd = c->name;
				return c->fn(&g, 1, help);
			}
		}
		int rc = cli_usage_error(&g, "unknown command '%s'", name);
		cli_json_error(&g, rc);
		return rc;
	}
	for (const command *c = commands; c->name; c++) {
		if (strcmp(c->name, name) == 0) {
			g.cmd = c->name;
			int rc = c->fn(&g, argc - i - 1, argv + i + 1);
			if (rc != 0)
				cli_json_error(&g, rc); /* only if dlock itself reported an error */
			return rc;
		}
	}
	/* a near miss: "did you mean" the closest command, two edits away at most */
	const char *best = NULL;
	size_t bestd = 3;
	for (const command *c = commands; c->name; c++) {
		size_t d = cli_edit_distance(name, c->name);
		if (d < bestd) {
			bestd = d;
			best = c->name;
		}
	}
	int rc = best ? cli_usage_error(&g, "unknown command '%s' (did you mean '%s'?)", name, best)
		      : cli_usage_error(&g, "unknown command '%s'", name);
	cli_json_error(&g, rc);
	return rc;
}
