/*
 * cli.h — what the dlock tool's command files share: global options, a small
 * option parser, the exit-code contract (docs/cli.md) and output helpers.
 * Internal to src/cli; uses only the public libdlock API.
 */
#ifndef DLOCK_CLI_H
#define DLOCK_CLI_H

#include <dlock/dlock.h>

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes: the contract scripts depend on (see docs/cli.md). */
enum {
	CLI_EXIT_OK = 0,
	CLI_EXIT_FAIL = 1,        /* e.g. release with a handle that does not hold the lock */
	CLI_EXIT_USAGE = 64,      /* bad usage or input */
	CLI_EXIT_UNAVAILABLE = 69,/* store unreachable, auth refused, not supported */
	CLI_EXIT_NOTACQUIRED = 75,/* not acquired within --wait, or at once with --no-wait */
	CLI_EXIT_LOST = 76        /* lock lost while COMMAND ran */
};

/* Options every command accepts (before or after the command name). */
typedef struct cli_global {
	const char *store;  /* --store URI, else $DLOCK_STORE, else NULL (default store) */
	bool json;          /* --json: machine-readable output on stdout */
	int verbosity;      /* -q: -1, default 0, -v: 1 */
	const char *cmd;    /* "run", "acquire", ... for messages */
} cli_global;

/* One option a command accepts. `name` is the long name without "--". */
typedef struct cli_opt {
	const char *name;
	char short_name;    /* 0: none */
	bool has_value;
	int id;             /* passed back to the command's handler */
} cli_opt;

/*
 * Called for each option found; `value` is NULL for flags. Return 0, or
 * CLI_EXIT_USAGE after printing a message with cli_usage_error().
 */
typedef int (*cli_opt_fn)(void *ctx, int id, const char *value);

typedef struct cli_args {
	char **pos;         /* positional arguments before "--" */
	int npos;
	char **rest;        /* arguments after "--" (only when `dashdash` was set) */
	int nrest;
	bool dashdash;      /* a "--" was seen */
	bool help;          /* --help or -h was given */
} cli_args;

/*
 * Parse argv[0..argc) (the words after the command name) against `opts` and
 * the global options (which update *g). Options may come anywhere before a
 * "--"; "--opt=value" and "--opt value" both work. Everything after "--" lands
 * in args->rest. Returns 0 or CLI_EXIT_USAGE (the message is printed).
 * args->pos/rest point into argv; args->pos is malloc'd (free it).
 */
int cli_parse(cli_global *g, int argc, char **argv, const cli_opt *opts, cli_opt_fn fn, void *ctx, cli_args *args);

/*
 * One option word `arg` (starting with '-') against `opts`, then the global
 * options; `next` is the word after it (a value) or NULL. *used: how many
 * words it took (1 or 2); *help is set by --help/-h. For commands with a
 * grammar of their own (run). Returns 0 or CLI_EXIT_USAGE (message printed).
 */
int cli_parse_option(cli_global *g, const cli_opt *opts, cli_opt_fn fn, void *ctx, const char *arg, const char *next,
		     int *used, bool *help);

/* Global options only: used by main() before the command name. */
int cli_global_option(cli_global *g, const char *arg, const char *next, int *used);

/* Print "dlock CMD: <message> (see 'dlock CMD --help')" to stderr; return 64. */
int cli_usage_error(const cli_global *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "dlock CMD: <message>" to stderr (always, even with -q). */
void cli_error(const cli_global *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "dlock CMD: <message>" to stderr unless -q. */
void cli_info(const cli_global *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "dlock CMD: <message>" to stderr only with -v. */
void cli_debug(const cli_global *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The exit code for a libdlock return code (docs/cli.md, "Exit codes"). */
int cli_exit_code(int rc);

/*
 * With --json: print the last error this process reported (cli_error,
 * cli_fail, cli_usage_error) as one JSON object on stdout,
 * {"error":{"exit":N,"code":"DLOCK_..."|null,"command":"...","message":"..."}},
 * a conflict's (cli_not_acquired) with "name" and "holders" as well.
 * Nothing when no error was reported (a command's own exit status).
 */
void cli_json_error(const cli_global *g, int exit_status);

/* Levenshtein distance of two short words ((size_t)-1 past 64 characters). */
size_t cli_edit_distance(const char *a, const char *b);

/* The holders of one lock as a JSON array (status --json's "holders"). */
void cli_json_holders(FILE *f, const dlock_lock_status *l);

/*
 * Report that lock NAME was not acquired (err: DLOCK_ELOCKED for a try,
 * DLOCK_ETIMEOUT for a wait of wait_ms, as asked) and return `code`. After
 * a try, the message names the holder, from one status request to the
 * store ("lock 'x' is held by build1:4711 (fence 7, 12.0s left)
 * (--no-wait)"); with --json the error object (cli_json_error) also has
 * "name" and "holders" (as status --json gives them; null when not asked:
 * after a wait, whose end may be the store's silence).
 */
int cli_not_acquired(const cli_global *g, dlock_store *store, const char *name, int err, int64_t wait_ms, int code);

/*
 * Report a failed libdlock call: prints "dlock CMD: WHAT: <last error>" and
 * returns cli_exit_code(rc). Call it right after the failing call, before
 * any other dlock function overwrites the thread's last error.
 */
int cli_fail(const cli_global *g, int rc, const char *what);

/* Parse a duration option ("250ms", "30s", bare seconds) or print a usage error. */
int cli_duration(const cli_global *g, const char *opt, const char *text, int64_t *ms);

/* Parse a positive integer option in [1, max] or print a usage error. */
int cli_uint(const cli_global *g, const char *opt, const char *text, unsigned long max, unsigned int *out);

/* Check a lock name argument (non-empty, valid) or print a usage error. */
int cli_name(const cli_global *g, const char *name);

/* Open the store chosen by --store / $DLOCK_STORE / default; prints errors. */
/* Milliseconds on CLOCK_MONOTONIC. */
int64_t cli_mono_ms(void);
int cli_store_open(const cli_global *g, dlock_store **out);
/* The same within a wait: the open takes at most *wait_ms (if > 0), which is
 * then cut to what is left of it (at least 1 ms), for the acquire. */
int cli_store_open_within(const cli_global *g, dlock_store **out, int64_t *wait_ms);

/* Lock options shared by run and acquire. */
typedef struct cli_lockopts {
	int64_t ttl_ms;     /* 0: store default */
	int64_t wait_ms;    /* <0 forever (default), 0 try once */
	bool shared;
	unsigned int permits;
	bool fair;
	bool wait_set, no_wait;
} cli_lockopts;

enum { CLI_OPT_TTL = 1000, CLI_OPT_WAIT, CLI_OPT_NO_WAIT, CLI_OPT_SHARED, CLI_OPT_PERMITS, CLI_OPT_FAIR };

#define CLI_LOCKOPTS_INIT { 0, -1, false, 1, false, false, false }

/* Handle one of the CLI_OPT_* lock options; returns 0 or CLI_EXIT_USAGE. */
int cli_lockopt(const cli_global *g, cli_lockopts *lo, int id, const char *value);
/* Cross-checks (--wait with --no-wait, --permits with --shared). */
int cli_lockopts_check(const cli_global *g, const cli_lockopts *lo);

/* The parse context of commands whose only options are lock options. */
typedef struct cli_lockopts_ctx {
	cli_global *g;
	cli_lockopts lo;
} cli_lockopts_ctx;
/* cli_opt_fn for a cli_lockopts_ctx: hands each option to cli_lockopt. */
int cli_lockopts_on_opt(void *ctx, int id, const char *value);

/*
 * For commands that take exactly NAME HANDLE (extend, release): parse, print
 * `help` for --help (return CLI_HELP_SHOWN), check the lock options and the
 * name. *name and *handle point into argv. Returns 0, CLI_HELP_SHOWN or an
 * exit code (the message is printed).
 */
#define CLI_HELP_SHOWN (-1)
int cli_parse_name_handle(cli_global *g, int argc, char **argv, const cli_opt *opts, cli_opt_fn fn, void *ctx,
			  const cli_lockopts *lo, const char *help, const char **name, const char **handle);
void cli_lockopts_apply(const cli_lockopts *lo, dlock_lock_options *opts);

/*
 * For extend/release: a lock handle on NAME that has taken over HANDLE (from
 * `dlock acquire`). *out is NULL on failure (message printed, exit code
 * returned). The hold is never renewed; call cli_handle_drop() (not
 * dlock_release) to let go of it locally without touching the store.
 */
int cli_handle_attach(const cli_global *g, dlock_store *store, const char *name, const char *handle,
		      const cli_lockopts *lo, dlock_lock **out);

/* Forget an attached hold locally (the store keeps it) and free the handle. */
void cli_handle_drop(dlock_lock *lock);

/*
 * The store: --store, else $DLOCK_STORE, else the first config file that
 * names one ($DLOCK_CONFIG alone when set, else $XDG_CONFIG_HOME/dlock/dlock.conf
 * (~/.config), then /etc/dlock/dlock.conf), else the local SQLite file
 * (*uri NULL). *from says where the choice came from (for -v and status).
 * Made once per process. 0, or CLI_EXIT_USAGE (an empty URI, a bad config
 * file; the message is printed).
 */
int cli_store_pick(const cli_global *g, const char **uri, const char **from);

/* cli_store_pick's URI, or NULL for the default store (or a failed pick:
 * cli_store_open reports it). */
const char *cli_store_choice(const cli_global *g);

/*
 * Holder processes for stores whose holds die with their session (holder.c):
 * `acquire` leaves one behind; `extend`/`release` with its handle talk to it.
 */
bool cli_holder_handle(const char *handle);
int cli_holder_acquire(const cli_global *g, const char *uri, const char *name, const cli_lockopts *lo,
		       int64_t asked_wait_ms);
/*
 * `acquire` starts the holder by executing dlock again as "dlock
 * CLI_HOLDER_ARGV1" (an argv without the store URI or anything secret) and
 * hands it the URI and options through a pipe on fd 3 (it reports on fd 4).
 */
#define CLI_HOLDER_ARGV1 "--lock-holder-process"
/* The whole tool (main.c): entry.c's main calls it; a test build of the tool
 * registers a fake store first (tests/cli/broken_store.c). */
int cli_main(int argc, char **argv);
int cli_holder_main(void);
typedef struct cli_holder_reply {
	int code;            /* a dlock code: 0, DLOCK_ENOTHELD, ... */
	int64_t ttl_left_ms;
	uint64_t fence;
	char text[512];      /* the new handle (extend), or a message */
} cli_holder_reply;
/* Send op ("extend"/"release") to the holder of `handle`; 0 with *out, or an exit code. */
int cli_holder_request(const cli_global *g, const char *name, const char *handle, const char *op, int64_t ttl_ms,
		       cli_holder_reply *out);

/* "1.5s", "250ms", "forever" — for messages. Writes into buf. */
const char *cli_fmt_duration(char *buf, size_t len, int64_t ms);

/* Write s as a JSON string literal (with quotes). */
void cli_json_str(FILE *f, const char *s);

/* ISO 8601 UTC time with milliseconds of wall-clock ms since the epoch. */
const char *cli_fmt_time(char *buf, size_t len, int64_t wall_ms);

/* Commands: argv are the words after the command name. */
int cli_run(cli_global *g, int argc, char **argv);
int cli_acquire(cli_global *g, int argc, char **argv);
int cli_extend(cli_global *g, int argc, char **argv);
int cli_release(cli_global *g, int argc, char **argv);
int cli_status(cli_global *g, int argc, char **argv);
int cli_break(cli_global *g, int argc, char **argv);
int cli_demo(cli_global *g, int argc, char **argv);
int cli_check(cli_global *g, int argc, char **argv);
/* check_report.c: write the HTML report of `check` around its JSON (0 or -1). */
/* The frame of `dlock check --report` (check_report.c): the head and styles,
 * the legend, and the end (the run as JSON, the zoom script). */
void cli_check_report_begin(FILE *out);
void cli_check_report_legend(FILE *out);
int cli_check_report_end(FILE *out, const char *json);
/* s with <, >, & and " escaped for HTML. */
void cli_html(FILE *out, const char *s);
int cli_bench(cli_global *g, int argc, char **argv);

/* SIGPIPE as dlock found it (main ignores it); `run` restores it for its command. */
extern struct sigaction cli_sigpipe_orig;

/* Lines of --help text shared by every command. */
extern const char cli_global_help[];

#endif
