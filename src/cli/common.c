/*
 * common.c — option parsing, exit-code mapping and output helpers shared by
 * the dlock commands.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char cli_global_help[] =
	"Global options (anywhere before '--'):\n"
	"  --store URI    lock store (default: $DLOCK_STORE, else the config file's\n"
	"                 'store = URI', else the embedded SQLite store; -v says which)\n"
	"  --json         machine-readable output\n"
	"  -q, --quiet    only errors on stderr\n"
	"  -v, --verbose  more detail on stderr\n"
	"  -h, --help     this help\n";

static void vmsg(const cli_global *g, const char *fmt, va_list ap)
{
	char buf[2048];
	vsnprintf(buf, sizeof buf, fmt, ap);
	/* One line per message: scripts parse stderr by lines. */
	for (char *p = buf; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	if (g && g->cmd)
		fprintf(stderr, "dlock %s: %s\n", g->cmd, buf);
	else
		fprintf(stderr, "dlock: %s\n", buf);
}

int cli_usage_error(const cli_global *g, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (g && g->cmd)
		cli_error(g, "%s (see 'dlock %s --help')", buf, g->cmd);
	else
		cli_error(g, "%s (see 'dlock --help')", buf);
	return CLI_EXIT_USAGE;
}

/* The last error message of this process (for --json's error object). */
static char last_error[2048];
static const char *last_code; /* DLOCK_E* name of the last library error reported, or NULL */
static char *last_detail;     /* more members of the error object (",\"name\":...") or NULL */

void cli_error(const cli_global *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmsg(g, fmt, ap);
	va_end(ap);
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	last_code = NULL; /* cli_fail sets it after us */
	free(last_detail);
	last_detail = NULL;
	for (char *p = last_error; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
}

void cli_json_error(const cli_global *g, int exit_status)
{
	if (!g || !g->json || !last_error[0])
		return;
	printf("{\"error\":{\"exit\":%d,\"code\":", exit_status);
	if (last_code)
		cli_json_str(stdout, last_code);
	else
		fputs("null", stdout);
	fputs(",\"command\":", stdout);
	cli_json_str(stdout, g->cmd ? g->cmd : "");
	fputs(",\"message\":", stdout);
	cli_json_str(stdout, last_error);
	if (last_detail)
		fputs(last_detail, stdout);
	fputs("}}\n", stdout);
	fflush(stdout);
	last_error[0] = '\0';
	free(last_detail);
	last_detail = NULL;
}

void cli_json_holders(FILE *f, const dlock_lock_status *l)
{
	fputc('[', f);
	for (size_t j = 0; j < l->nholders; j++) {
		const dlock_holder *h = &l->holders[j];
		/* Never h->owner: it is the secret of the holder's handle. */
		fputs(j ? ",{\"id\":" : "{\"id\":", f);
		cli_json_str(f, h->id);
		fputs(",\"host\":", f);
		cli_json_str(f, h->host);
		fprintf(f, ",\"pid\":%d,\"mode\":\"%s\",\"fence\":%llu,\"ttl_left_ms\":%lld", h->pid,
			h->mode == DLOCK_SHARED ? "shared" : "exclusive", (unsigned long long)h->fence,
			(long long)h->ttl_left_ms);
		if (h->copies_of)
			fprintf(f, ",\"copies\":%u,\"copies_of\":%u", h->copies, h->copies_of);
		fputc('}', f);
	}
	fputc(']', f);
}

int cli_not_acquired(const cli_global *g, dlock_store *store, const char *name, int err, int64_t wait_ms, int code)
{
	char how[64], who[512] = "another";
	if (err == DLOCK_ELOCKED) {
		snprintf(how, sizeof how, "--no-wait");
	} else {
		char d[32];
		snprintf(how, sizeof how, "not acquired within %s", cli_fmt_duration(d, sizeof d, wait_ms));
	}
	/* Who holds it now (one more request; it may have gone since). */
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[1] = { name };
	char *detail = NULL;
	size_t dlen = 0;
	FILE *df = g->json ? open_memstream(&detail, &dlen) : NULL;
	if (df) {
		fputs(",\"name\":", df);
		cli_json_str(df, name);
	}
	/* Only after a refusal at once (--no-wait): the store has just answered.
	 * A wait that ran out may have ended with the store gone quiet, and
	 * its report must not wait a request timeout more for it. */
	bool known = store && err == DLOCK_ELOCKED && dlock_store_status(store, names, 1, &st, &n) == 0 && n == 1;
	if (known && st[0].nholders > 0) {
		const dlock_holder *h = &st[0].holders[0];
		char ttl[32] = "";
		if (h->ttl_left_ms >= 0) {
			char d[32];
			snprintf(ttl, sizeof ttl, ", %s left", cli_fmt_duration(d, sizeof d, h->ttl_left_ms));
		}
		int w = snprintf(who, sizeof who, "%s:%d (fence %llu%s)", h->host && *h->host ? h->host : "?", h->pid,
				 (unsigned long long)h->fence, ttl);
		if (st[0].nholders > 1 && w > 0 && (size_t)w < sizeof who)
			snprintf(who + w, sizeof who - (size_t)w, " and %zu other holder%s", st[0].nholders - 1,
				 st[0].nholders == 2 ? "" : "s");
		if (df) {
			fputs(",\"holders\":", df);
			cli_json_holders(df, &st[0]);
		}
	} else if (df) {
		/* none now (gone since, or a queue's refusal), or not known */
		fputs(known ? ",\"holders\":[]" : ",\"holders\":null", df);
	}
	dlock_status_free(st, n);
	if (df && fclose(df) == 0) {
		free(last_detail);
		last_detail = detail;
	} else if (df) {
		free(detail);
	}
	dlock_error_clear();
	snprintf(last_error, sizeof last_error, "lock '%s' is held by %s (%s)", name, who, how);
	last_code = dlock_error_name(err);
	cli_info(g, "%s", last_error);
	return code;
}

void cli_info(const cli_global *g, const char *fmt, ...)
{
	if (g && g->verbosity < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vmsg(g, fmt, ap);
	va_end(ap);
}

void cli_debug(const cli_global *g, const char *fmt, ...)
{
	if (!g || g->verbosity < 1)
		return;
	va_list ap;
	va_start(ap, fmt);
	vmsg(g, fmt, ap);
	va_end(ap);
}

int cli_exit_code(int rc)
{
	switch (rc) {
	case 0:
		return CLI_EXIT_OK;
	case DLOCK_EINVAL:
		return CLI_EXIT_USAGE;
	case DLOCK_EUNAVAILABLE:
	case DLOCK_EAUTH:
	case DLOCK_ENOTSUPPORTED:
		return CLI_EXIT_UNAVAILABLE;
	case DLOCK_ETIMEOUT:
	case DLOCK_ELOCKED:
		return CLI_EXIT_NOTACQUIRED;
	default:
		return CLI_EXIT_FAIL;
	}
}

int cli_fail(const cli_global *g, int rc, const char *what)
{
	const dlock_error *e = dlock_error_last();
	const char *msg = (e->code == rc && e->message && *e->message) ? e->message : dlock_strerror(rc);
	cli_error(g, "%s: %s", what, msg);
	last_code = dlock_error_name(rc);
	return cli_exit_code(rc);
}

static const cli_opt *find_long(const cli_opt *opts, const char *name, size_t len)
{
	for (const cli_opt *o = opts; o && o->name; o++)
		if (strlen(o->name) == len && memcmp(o->name, name, len) == 0)
			return o;
	return NULL;
}

static const cli_opt *find_short(const cli_opt *opts, char c)
{
	for (const cli_opt *o = opts; o && o->name; o++)
		if (o->short_name && o->short_name == c)
			return o;
	return NULL;
}

enum { G_STORE = 1, G_JSON, G_QUIET, G_VERBOSE, G_HELP };
/* clang-format off */
static const cli_opt global_opts[] = {
	{ "store", 0, true, G_STORE },
	{ "json", 0, false, G_JSON },
	{ "quiet", 'q', false, G_QUIET },
	{ "verbose", 'v', false, G_VERBOSE },
	{ "help", 'h', false, G_HELP },
	{ NULL, 0, false, 0 },
};
/* clang-format on */

/*
 * Split one option word into its table entry and inline value. Returns the
 * entry or NULL; *inline_value is set for "--name=value".
 */
static const cli_opt *lookup(const cli_opt *opts, const char *arg, const char **inline_value)
{
	*inline_value = NULL;
	if (arg[1] == '-') {
		const char *name = arg + 2;
		const char *eq = strchr(name, '=');
		size_t len = eq ? (size_t)(eq - name) : strlen(name);
		const cli_opt *o = find_long(opts, name, len);
		if (o && eq)
			*inline_value = eq + 1;
		return o;
	}
	if (arg[2] != '\0')
		return NULL; /* no clustering of short options: -qv is unknown */
	return find_short(opts, arg[1]);
}

static int apply_global(cli_global *g, int id, const char *value, bool *help)
{
	switch (id) {
	case G_STORE:
		g->store = value;
		break;
	case G_JSON:
		g->json = true;
		break;
	case G_QUIET:
		g->verbosity = -1;
		break;
	case G_VERBOSE:
		g->verbosity = 1;
		break;
	case G_HELP:
		*help = true;
		break;
	}
	return 0;
}

size_t cli_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 64 || lb > 64)
		return (size_t)-1;
	size_t row[65];
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* What a user of flock(1) or timeout(1) may type, and ours for it. */
static const struct {
	const char *habit, *ours;
} habits[] = {
	{ "-n", "--no-wait" },
	{ "--nb", "--no-wait" },
	{ "--nonblock", "--no-wait" },
	{ "-w", "--wait" },
	{ "--timeout", "--wait" },
	{ "-x", "(exclusive is the default)" },
	{ "-e", "(exclusive is the default)" },
	{ "--exclusive", "(exclusive is the default)" },
	{ "-s", "--shared" },
	{ "-c", "-c / --command (run only)" },
};

/* " (did you mean --wait?)" for an unknown option, or "". */
static void option_hint(char *buf, size_t len, const cli_opt *opts, const char *arg)
{
	buf[0] = '\0';
	char word[80];
	snprintf(word, sizeof word, "%.*s", (int)strcspn(arg, "="), arg);
	for (size_t i = 0; i < sizeof habits / sizeof habits[0]; i++)
		if (strcmp(word, habits[i].habit) == 0) {
			if (habits[i].ours[0] == '(')
				snprintf(buf, len, " %s", habits[i].ours);
			else
				snprintf(buf, len, " (did you mean %s?)", habits[i].ours);
			return;
		}
	if (strncmp(word, "--", 2) != 0)
		return;
	const char *best = NULL;
	size_t bestd = 3; /* at most two edits away */
	const cli_opt *tables[2] = { opts, global_opts };
	for (int t = 0; t < 2; t++)
		for (const cli_opt *o = tables[t]; o && o->name; o++) {
			size_t d = cli_edit_distance(word + 2, o->name);
			if (d < bestd) {
				bestd = d;
				best = o->name;
			}
		}
	if (best)
		snprintf(buf, len, " (did you mean --%s?)", best);
}

/*
 * One option word at argv[i]: resolve against the command's table, then the
 * global one. *consumed is how many words it used (1 or 2).
 */
static int one_option(cli_global *g, const cli_opt *opts, cli_opt_fn fn, void *ctx, const char *arg, const char *next,
		      int *consumed, bool *help)
{
	const char *inl;
	const cli_opt *o = lookup(opts, arg, &inl);
	bool global = false;
	if (!o) {
		o = lookup(global_opts, arg, &inl);
		global = true;
	}
	if (!o) {
		char hint[128];
		option_hint(hint, sizeof hint, opts, arg);
		return cli_usage_error(g, "unknown option '%s'%s", arg, hint);
	}
	const char *value = NULL;
	*consumed = 1;
	if (o->has_value) {
		if (inl) {
			value = inl;
		} else if (next) {
			value = next;
			*consumed = 2;
		} else {
			return cli_usage_error(g, "option '%s' needs a value", arg);
		}
	} else if (inl) {
		return cli_usage_error(g, "option '--%s' takes no value", o->name);
	}
	if (global)
		return apply_global(g, o->id, value, help);
	return fn ? fn(ctx, o->id, value) : 0;
}

int cli_parse_option(cli_global *g, const cli_opt *opts, cli_opt_fn fn, void *ctx, const char *arg, const char *next,
		     int *used, bool *help)
{
	return one_option(g, opts, fn, ctx, arg, next, used, help);
}

int cli_global_option(cli_global *g, const char *arg, const char *next, int *used)
{
	bool help = false;
	int rc = one_option(g, NULL, NULL, NULL, arg, next, used, &help);
	if (rc == 0 && help)
		return -1;
	return rc;
}

int cli_parse(cli_global *g, int argc, char **argv, const cli_opt *opts, cli_opt_fn fn, void *ctx, cli_args *args)
{
	memset(args, 0, sizeof *args);
	args->pos = calloc((size_t)argc + 1, sizeof *args->pos);
	if (!args->pos) {
		cli_error(g, "out of memory");
		return CLI_EXIT_FAIL;
	}
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			args->dashdash = true;
			args->rest = argv + i + 1;
			args->nrest = argc - i - 1;
			break;
		}
		if (a[0] == '-' && a[1] != '\0') {
			int used = 1;
			int rc = one_option(g, opts, fn, ctx, a, i + 1 < argc ? argv[i + 1] : NULL, &used, &args->help);
			if (rc != 0)
				return rc;
			i += used - 1;
			continue;
		}
		args->pos[args->npos++] = argv[i];
	}
	return 0;
}

int cli_duration(const cli_global *g, const char *opt, const char *text, int64_t *ms)
{
	if (dlock_duration_parse(ms, text) != 0)
		return cli_usage_error(g, "%s: bad duration '%s' (use e.g. 250ms, 30s, 5m, 1h30m, 1d)", opt, text);
	return 0;
}

int cli_uint(const cli_global *g, const char *opt, const char *text, unsigned long max, unsigned int *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(text, &end, 10);
	if (text[0] < '0' || text[0] > '9' || *end || errno || v < 1 || v > max)
		return cli_usage_error(g, "%s: expected a whole number from 1 to %lu, got '%s'", opt, max, text);
	*out = (unsigned int)v;
	return 0;
}

int cli_name(const cli_global *g, const char *name)
{
	if (!name || !*name)
		return cli_usage_error(g, "empty lock name");
	if (dlock_name_check(name) != 0)
		return cli_usage_error(g, "bad lock name: %s", dlock_error_last()->message);
	return 0;
}

/*
 * The store choice, made once per process (cli_store_pick): --store, else
 * DLOCK_STORE, else a config file, else the local SQLite file. An empty
 * URI anywhere is an error, never the local file: an unset variable in a
 * script, or cron's empty environment, must not turn a cluster-wide
 * singleton into one per node.
 */
static struct {
	bool done;
	int rc;          /* 0, or the exit code of the failed choice (message printed) */
	const char *uri; /* NULL: the local SQLite file */
	char *conf_uri;  /* the URI read from a config file (uri points here) */
	char from[1200]; /* where the choice came from, for -v and status */
} pick;

static bool blank(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	return *s == '\0';
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = '\0';
	return s;
}

/*
 * Read a config file (docs/cli.md, "Choosing the store"): `store = URI`
 * lines, blank lines, lines starting with '#'. 0 with *uri (malloc'd) and
 * *line; 1: no such file (ENOENT, unless must_exist) or it names no store;
 * CLI_EXIT_USAGE: unreadable or malformed (message printed).
 */
static int read_config(const cli_global *g, const char *path, const char *why, bool must_exist, char **uri, int *line)
{
	*uri = NULL;
	FILE *f = fopen(path, "re");
	if (!f) {
		if (errno == ENOENT && !must_exist)
			return 1;
		cli_error(g, "cannot read the config file %s (%s): %s", path, why, strerror(errno));
		return CLI_EXIT_USAGE;
	}
	char *buf = NULL;
	size_t cap = 0;
	int rc = 1, n = 0;
	while (getline(&buf, &cap, f) >= 0) {
		n++;
		char *l = trim(buf);
		if (!*l || *l == '#')
			continue;
		char *eq = strchr(l, '=');
		if (eq)
			*eq = '\0';
		char *key = trim(l);
		if (!eq || strcmp(key, "store") != 0) {
			cli_error(g, "%s line %d: %s (the only setting is 'store = URI'; '#' starts a comment line)",
				  path, n, eq ? "unknown setting" : "expected 'store = URI'");
			rc = CLI_EXIT_USAGE;
			break;
		}
		char *value = trim(eq + 1);
		if (*uri) {
			cli_error(g, "%s line %d: the store is named twice (first on line %d)", path, n, *line);
			rc = CLI_EXIT_USAGE;
			break;
		}
		if (!*value) {
			cli_error(g,
				  "%s line %d: empty store URI (name a store, e.g. 'store = redis://host:6379', "
				  "or remove the line for the local SQLite file)",
				  path, n);
			rc = CLI_EXIT_USAGE;
			break;
		}
		if (!(*uri = strdup(value))) {
			cli_error(g, "out of memory");
			rc = CLI_EXIT_FAIL;
			break;
		}
		*line = n;
		rc = 0;
	}
	if (rc == 0 && ferror(f)) {
		cli_error(g, "cannot read the config file %s (%s): %s", path, why, strerror(errno));
		rc = CLI_EXIT_USAGE;
	}
	if (rc != 0) {
		free(*uri);
		*uri = NULL;
	}
	free(buf);
	fclose(f);
	return rc;
}

/* The config files in their order: DLOCK_CONFIG alone when set, else the
 * user's, then the system's. 0 (pick made, or none named a store: pick.uri
 * NULL) or an exit code. */
static int pick_config(const cli_global *g)
{
	const char *env = getenv("DLOCK_CONFIG");
	if (env) {
		if (blank(env)) {
			cli_error(g, "DLOCK_CONFIG is set but empty: name a config file there, or unset it");
			return CLI_EXIT_USAGE;
		}
		int line = 0;
		int rc = read_config(g, env, "DLOCK_CONFIG", true, &pick.conf_uri, &line);
		if (rc == 0)
			snprintf(pick.from, sizeof pick.from, "config file %s line %d, named by DLOCK_CONFIG", env,
				 line);
		else if (rc == 1)
			snprintf(pick.from, sizeof pick.from,
				 "the default: no --store or DLOCK_STORE, and config file %s names no store", env);
		return rc == 1 ? 0 : rc;
	}
	char user[1024] = "";
	const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	if (xdg && xdg[0] == '/') /* the XDG spec: relative values are ignored */
		snprintf(user, sizeof user, "%s/dlock/dlock.conf", xdg);
	else if (home && home[0] == '/')
		snprintf(user, sizeof user, "%s/.config/dlock/dlock.conf", home);
	const char *paths[] = { user, "/etc/dlock/dlock.conf" };
	for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
		if (!paths[i][0])
			continue;
		int line = 0;
		int rc = read_config(g, paths[i], i == 0 ? "the user's" : "the system's", false, &pick.conf_uri, &line);
		if (rc == 0) {
			snprintf(pick.from, sizeof pick.from, "config file %s line %d", paths[i], line);
			return 0;
		}
		if (rc != 1)
			return rc;
	}
	snprintf(pick.from, sizeof pick.from, "the default: no --store, DLOCK_STORE or config file names a store");
	return 0;
}

int cli_store_pick(const cli_global *g, const char **uri, const char **from)
{
	if (!pick.done) {
		pick.done = true;
		const char *env = getenv("DLOCK_STORE");
		if (g->store) {
			snprintf(pick.from, sizeof pick.from, "--store");
			pick.uri = g->store;
			if (blank(g->store)) {
				cli_error(g,
					  "empty store URI given with --store: name a store (e.g. --store "
					  "redis://host:6379), or leave --store out");
				pick.rc = CLI_EXIT_USAGE;
			}
		} else if (env) {
			snprintf(pick.from, sizeof pick.from, "DLOCK_STORE");
			pick.uri = env;
			if (blank(env)) {
				cli_error(g,
					  "DLOCK_STORE is set but empty: name a store there, or unset it (then "
					  "the config file names the store, else the local SQLite file is used)");
				pick.rc = CLI_EXIT_USAGE;
			}
		} else {
			pick.rc = pick_config(g);
			pick.uri = pick.conf_uri;
		}
		if (pick.rc)
			pick.uri = NULL;
	}
	if (uri)
		*uri = pick.uri;
	if (from)
		*from = pick.from;
	return pick.rc;
}

const char *cli_store_choice(const cli_global *g)
{
	const char *uri = NULL;
	cli_store_pick(g, &uri, NULL);
	return uri;
}

int64_t cli_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cli_store_open(const cli_global *g, dlock_store **out)
{
	return cli_store_open_within(g, out, NULL);
}

int cli_store_open_within(const cli_global *g, dlock_store **out, int64_t *wait_ms)
{
	const char *uri = NULL, *from = NULL;
	int rc = cli_store_pick(g, &uri, &from);
	if (rc != 0) {
		*out = NULL;
		last_code = dlock_error_name(DLOCK_EINVAL);
		return rc;
	}
	int64_t t0 = cli_mono_ms();
	rc = dlock_store_open_timeout(out, uri, wait_ms && *wait_ms > 0 ? *wait_ms : 0);
	if (wait_ms && *wait_ms > 0) {
		int64_t left = *wait_ms - (cli_mono_ms() - t0);
		*wait_ms = left > 0 ? left : 1; /* what the open left of the wait */
	}
	if (rc != 0) {
		*out = NULL;
		char what[1300];
		snprintf(what, sizeof what, "cannot open store (from %s)", from);
		return cli_fail(g, rc, what);
	}
	cli_debug(g, "store %s (%s) from %s", dlock_store_uri(*out), dlock_store_kind(*out), from);
	static bool warned; /* once per process */
	const char *w = dlock_store_warning(*out);
	if (w && !warned && g->verbosity >= 0) {
		warned = true;
		fprintf(stderr, "dlock: warning: %s\n", w);
	}
	return 0;
}

int cli_lockopt(const cli_global *g, cli_lockopts *lo, int id, const char *value)
{
	switch (id) {
	case CLI_OPT_TTL:
		if (cli_duration(g, "--ttl", value, &lo->ttl_ms))
			return CLI_EXIT_USAGE;
		if (lo->ttl_ms <= 0)
			return cli_usage_error(g, "--ttl must be more than 0");
		return 0;
	case CLI_OPT_WAIT:
		lo->wait_set = true;
		return cli_duration(g, "--wait", value, &lo->wait_ms);
	case CLI_OPT_NO_WAIT:
		lo->no_wait = true;
		lo->wait_ms = 0;
		return 0;
	case CLI_OPT_SHARED:
		lo->shared = true;
		return 0;
	case CLI_OPT_PERMITS:
		return cli_uint(g, "--permits", value, 1000000, &lo->permits);
	case CLI_OPT_FAIR:
		lo->fair = true;
		return 0;
	}
	return 0;
}

int cli_lockopts_check(const cli_global *g, const cli_lockopts *lo)
{
	if (lo->wait_set && lo->no_wait)
		return cli_usage_error(g, "--wait and --no-wait exclude each other");
	if (lo->shared && lo->permits > 1)
		return cli_usage_error(g, "--permits and --shared exclude each other");
	return 0;
}

void cli_lockopts_apply(const cli_lockopts *lo, dlock_lock_options *opts)
{
	opts->ttl_ms = lo->ttl_ms;
	opts->mode = lo->shared ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
	opts->permits = lo->permits;
	opts->fair = lo->fair ? 1 : 0;
}

const char *cli_fmt_duration(char *buf, size_t len, int64_t ms)
{
	if (ms < 0)
		snprintf(buf, len, "forever");
	else if (ms % 1000 == 0)
		snprintf(buf, len, "%llds", (long long)(ms / 1000));
	else if (ms < 10000)
		snprintf(buf, len, "%lldms", (long long)ms);
	else
		snprintf(buf, len, "%.1fs", (double)ms / 1000.0);
	return buf;
}

void cli_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		switch (*p) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\r':
			fputs("\\r", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		default:
			if (*p < 0x20)
				fprintf(f, "\\u%04x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

const char *cli_fmt_time(char *buf, size_t len, int64_t wall_ms)
{
	time_t secs = (time_t)(wall_ms / 1000);
	struct tm tm;
	gmtime_r(&secs, &tm);
	char base[32];
	strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", base, (int)(wall_ms % 1000));
	return buf;
}

int cli_handle_attach(const cli_global *g, dlock_store *store, const char *name, const char *handle,
		      const cli_lockopts *lo, dlock_lock **out)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	cli_lockopts_apply(lo, &o);
	o.no_renew = 1;
	*out = NULL;
	/* dlock_lock_attach takes mode and permits from the handle itself. */
	dlock_lock *lock = NULL;
	int err = dlock_lock_new(&lock, store, name, &o);
	if (err != 0)
		return cli_fail(g, err, "bad lock");
	err = dlock_lock_attach(lock, handle);
	if (err != 0) {
		int rc = err == DLOCK_EINVAL ? cli_usage_error(g, "bad handle: %s", dlock_error_last()->message)
					     : cli_fail(g, err, "handle");
		dlock_lock_free(lock);
		return rc;
	}
	*out = lock;
	return 0;
}

void cli_handle_drop(dlock_lock *lock)
{
	char *h = NULL;
	/* Detach, not release: a failed extend must not free the caller's lock. */
	if (lock && dlock_lock_detach(lock, &h) == 0)
		dlock_free(h);
	dlock_lock_free(lock);
}

int cli_parse_name_handle(cli_global *g, int argc, char **argv, const cli_opt *opts, cli_opt_fn fn, void *ctx,
			  const cli_lockopts *lo, const char *help, const char **name, const char **handle)
{
	cli_args a;
	int rc = cli_parse(g, argc, argv, opts, fn, ctx, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return CLI_HELP_SHOWN;
	}
	for (int i = 0; rc == 0 && a.dashdash && i < a.nrest; i++)
		a.pos[a.npos++] = a.rest[i];
	if (rc == 0 && a.npos != 2)
		rc = cli_usage_error(g, "expected NAME HANDLE, got %d argument%s", a.npos, a.npos == 1 ? "" : "s");
	if (rc == 0)
		rc = cli_lockopts_check(g, lo);
	*name = rc == 0 ? a.pos[0] : NULL;
	*handle = rc == 0 ? a.pos[1] : NULL;
	free(a.pos);
	if (rc == 0)
		rc = cli_name(g, *name);
	return rc;
}

int cli_lockopts_on_opt(void *ctx, int id, const char *value)
{
	cli_lockopts_ctx *c = ctx;
	return cli_lockopt(c->g, &c->lo, id, value);
}
