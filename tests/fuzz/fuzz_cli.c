/*
 * libFuzzer: the dlock tool's argument parsing (src/cli/common.c, linked in
 * without main): words split at NUL bytes go through cli_global_option (as
 * main does before the command name) and cli_parse with the lock options of
 * run/acquire, then the checks the commands make (lock name, durations,
 * permits). Usage errors are fine; crashes, leaks and reads past a word are not.
 */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_WORDS 64

enum { OPT_NAME = 1, OPT_HANDLE };

/* clang-format off */
static const cli_opt opts[] = {
	{ "ttl", 't', true, CLI_OPT_TTL },
	{ "wait", 'w', true, CLI_OPT_WAIT },
	{ "no-wait", 'n', false, CLI_OPT_NO_WAIT },
	{ "shared", 0, false, CLI_OPT_SHARED },
	{ "permits", 0, true, CLI_OPT_PERMITS },
	{ "fair", 0, false, CLI_OPT_FAIR },
	{ "handle", 0, true, OPT_HANDLE },
	{ NULL, 0, false, 0 },
};
/* clang-format on */

typedef struct ctx {
	cli_global *g;
	cli_lockopts lo;
	const char *handle;
} ctx;

static int on_opt(void *ud, int id, const char *value)
{
	ctx *c = ud;
	if (id == OPT_HANDLE) {
		c->handle = value;
		return 0;
	}
	return cli_lockopt(c->g, &c->lo, id, value);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* The parser's usage messages go to the stdio stream only; fd 2 (and so
	 * the sanitizer's reports) stays where it was. */
	FILE *null = fopen("/dev/null", "w");
	if (null)
		stderr = null;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 16384)
		return 0;
	/* Words: NUL-separated, each its own allocation so ASan sees reads past one. */
	char *words[MAX_WORDS + 1];
	int n = 0;
	size_t start = 0;
	for (size_t i = 0; i <= size && n < MAX_WORDS; i++) {
		if (i == size || data[i] == 0) {
			words[n] = malloc(i - start + 1);
			if (!words[n])
				break;
			memcpy(words[n], data + start, i - start);
			words[n][i - start] = '\0';
			n++;
			start = i + 1;
		}
	}
	words[n] = NULL;

	cli_global g = { 0 };
	g.cmd = "fuzz";
	int i = 0;
	while (i < n && words[i][0] == '-' && words[i][1] != '\0' && strcmp(words[i], "--") != 0) {
		int used = 1;
		int rc = cli_global_option(&g, words[i], i + 1 < n ? words[i + 1] : NULL, &used);
		if (rc != 0)
			break;
		if (used < 1 || used > 2 || i + used > n)
			abort();
		i += used;
	}
	ctx c = { &g, CLI_LOCKOPTS_INIT, NULL };
	cli_args args;
	int rc = cli_parse(&g, n - i, words + i, opts, on_opt, &c, &args);
	if (rc == 0) {
		if (args.npos + (args.dashdash ? 1 + args.nrest : 0) > n - i)
			abort();
		if (cli_lockopts_check(&g, &c.lo) == 0) {
			dlock_lock_options lo = { 0 };
			cli_lockopts_apply(&c.lo, &lo);
			if (lo.permits < 1)
				abort();
		}
		if (args.npos > 0)
			cli_name(&g, args.pos[0]);
		char buf[64];
		cli_fmt_duration(buf, sizeof buf, c.lo.wait_ms);
		if (strlen(buf) >= sizeof buf)
			abort();
	} else if (rc != CLI_EXIT_USAGE) {
		abort();
	}
	free(args.pos);
	for (int w = 0; w < n; w++)
		free(words[w]);
	return 0;
}
