/*
 * check.c — `dlock check`: a safety checker with fault injection, in the
 * spirit of Jepsen's lock tests, run on one machine.
 *
 * Worker processes (forked before any store is opened here, each opening its
 * own store) contend for one exclusive lock and, while they believe they hold
 * it, do a read-modify-write of a *fenced register*: a file outside the store,
 * guarded by flock, holding a value, the highest fence it has seen and its own
 * counters. With --fencing on the register refuses any access (read or write)
 * whose fence is below the highest it has seen — the read counts too: a
 * resource that checks tokens only on write lets a paused holder overwrite a
 * newer holder that has read but not yet written.
 *
 * Between the read and the write a worker sleeps until grant + --hold and then
 * writes without asking whether it still holds the lock: a process stopped by
 * a GC pause (here SIGSTOP) does exactly that when it wakes up.
 *
 * Every worker appends one line per event to one log (O_APPEND, one write(2)
 * per line, so lines from many processes never interleave and a SIGKILL loses
 * nothing already written); times are CLOCK_MONOTONIC microseconds since the
 * run started (one machine, one clock). The parent injects faults on a seeded
 * schedule, then reads the log and checks:
 *   - overlapping exclusive holds: pairs whose believed intervals intersect
 *     (grant → release, or → the lost signal, or → the SIGKILL); an overlap
 *     whose earlier holder was SIGSTOPped by a `pause` fault is "explained"
 *     (leases cannot prevent it: only fences can), any other is a violation;
 *   - fences not strictly increasing in grant order;
 *   - lost updates: accepted writes − final value (from the register itself);
 *   - stale writes accepted: writes accepted although the register had already
 *     seen a higher fence;
 *   - liveness: time from each fault's end to the next grant.
 *
 * Faults on the network (partition, lose-reply, delay) need each worker to
 * talk to the store through a connection of its own that the parent can
 * fault: the parent runs the fault proxy of the tests
 * (src/tools/faultproxy.c, built into this program) in a forked child,
 * with one route per worker and store host, and gives each worker the store
 * URI with its hosts replaced by its own routes. Only a pause explains an
 * overlap: under every other fault the lease or the lost signal must keep
 * holds apart, and an overlap is the store's fault.
 *
 * The seams (issue 30): --ops mixes other holds with the plain ones, each
 * worker taking the kinds in turn: `extend` extends while the hold's renewal
 * is delayed (the worker lags its own proxy routes, or the sqlite3 shell
 * holds SQLite's write lock), `handle` keeps a no_renew hold by its own
 * extends; kill-tool adds holds through `dlock run` (this program run by the
 * worker, its command this program again with DLOCK_CHECK_COMMAND: it logs
 * its grant, ignores SIGTERM and holds), whose command's real death ends the
 * hold. session-kill, evict and failback act on the server with its own
 * client programs (check_faults.c). Every requested fault and op runs at
 * least once: a fault list that cannot fit in --duration is refused before
 * the run (fit_faults), the schedule shrinks its gaps for the kinds still
 * owed, and one that still never ran makes the verdict `incomplete`
 * (check_analyse.c).
 *
 * The tests run it on a fake store that grants every request (a test build of
 * this tool, tests/cli/broken_store.c): the checker must catch it.
 */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "faultproxy_uri.h"

static const char help[] =
	"Usage: dlock check [OPTIONS]\n"
	"\n"
	"Test what the store really guarantees: --clients worker processes contend\n"
	"for one exclusive lock and, while holding it, read and then write a fenced\n"
	"register (a file outside the store that refuses tokens lower than the\n"
	"highest it has seen). Faults are injected on a seeded schedule. Then the\n"
	"log is checked for overlapping holds, fences out of order, lost updates,\n"
	"stale writes accepted, and the time from each fault's end to the next grant.\n"
	"Network faults (partition, lose-reply, delay) go through a fault proxy that\n"
	"check runs itself, one route per worker and store host. Only a pause excuses\n"
	"an overlap: under any other fault, an overlap is the store's.\n"
	"\n"
	"Options:\n"
	"  --clients N          worker processes (default 3, at most 64)\n"
	"  --duration D         how long to run (default 10s)\n"
	"  --ttl D              lease of the lock (default 1s)\n"
	"  --hold D             how long a worker holds the lock (default 100ms)\n"
	"  --faults LIST        comma-separated (default none): pause, kill, restart, member,\n"
	"                       partition, lose-reply, delay, server-pause, file-delete,\n"
	"                       member-restart, failover, kill-tool, session-kill, evict, failback;\n"
	"                       each runs at least once: a list that cannot fit in --duration, or\n"
	"                       a kind the store cannot take, is refused before the run (64)\n"
	"                         pause:     SIGSTOP a holder for --pause (longer than the TTL), then SIGCONT\n"
	"                         kill:      SIGKILL a holder; a new worker takes its place\n"
	"                         restart:   restart the store server (needs --server-script/--server-dir)\n"
	"                         member:    kill one member of an ensemble, wait --pause, start it again\n"
	"                                    (ZooKeeper restart-member, Redis/Redlock kill+restart I)\n"
	"                         partition: black-hole one worker's connections to the store (a holder's\n"
	"                                    if any) for --pause, then pass again\n"
	"                         lose-reply: forward one worker's requests but drop the replies for\n"
	"                                    ttl/4..ttl (seeded): applied but unanswered\n"
	"                         delay:     add --delay each way to one worker's or every worker's\n"
	"                                    connections for --pause\n"
	"                         server-pause: SIGSTOP every server process for --pause, then SIGCONT\n"
	"                                    (needs --server-script/--server-dir)\n"
	"                         file-delete: unlink the SQLite database file (and -wal, -shm) under\n"
	"                                    a holder (sqlite stores only)\n"
	"                         member-restart: kill and at once restart every Redis master one at a\n"
	"                                    time, ttl/2 apart (Redlock; data survives only with AOF)\n"
	"                         failover:  kill the master and let Sentinel promote the replica, once\n"
	"                                    per run (tests/servers/redis-sentinel.sh)\n"
	"                         kill-tool: SIGKILL a worker's `dlock run` whose command ignores SIGTERM;\n"
	"                                    the command's real death ends its hold (workers hold through\n"
	"                                    `dlock run` half the time)\n"
	"                         session-kill: kill the holder's server session (PostgreSQL\n"
	"                                    pg_terminate_backend, MySQL KILL; psql/mariadb in PATH)\n"
	"                         evict:     fill memcached with other keys until it evicts (memcached\n"
	"                                    started without -M)\n"
	"                         failback:  demote the Redis master to a replica of --replica, let it\n"
	"                                    resync, promote it back (needs --replica; --master unless\n"
	"                                    the store is one redis:// server)\n"
	"  --ops LIST           holds besides the plain one, mixed with it (default none):\n"
	"                         extend:    extend (dlock_extend to 6 x ttl) just after the renewal\n"
	"                                    is due while that renewal is delayed (the worker's link\n"
	"                                    lagged ttl/4, or SQLite's write lock held by another\n"
	"                                    process), then hold past the first lease\n"
	"                         handle:    no_renew holds (acquire/release handles) the holder\n"
	"                                    extends itself every ttl/3 for ttl + hold\n"
	"  --replica HOST:PORT  failback: the master's replica\n"
	"  --master HOST:PORT   failback: the master (default: the store's one host)\n"
	"  --fault-every D      time between faults (default 2*ttl + 4*hold, at least 500ms)\n"
	"  --pause D            how long a pause, partition, delay, server-pause or member's\n"
	"                       downtime lasts (default 2*ttl)\n"
	"  --delay D            the delay fault's added latency each way (default ttl/4)\n"
	"  --fencing on|off     the register checks fences (default on)\n"
	"  --seed N             seed of the fault schedule (default: from the clock; printed)\n"
	"  --name NAME          the lock name (default dlock-check/HOST/PID)\n"
	"  --server-script F    tests/servers/<kind>.sh that started the server\n"
	"  --server-dir DIR     the DIR that script was started with\n"
	"  --report FILE.html   write a self-contained HTML report with an SVG timeline\n"
	"  --work-dir DIR       keep the event log and register in DIR (default: a temp dir,\n"
	"                       removed afterwards)\n"
	"\n%s"
	"\nWith --json: one object with the counts, the faults and the verdict.\n"
	"Exit codes: 0 no safety property was violated and every requested fault and\n"
	"op ran; 1 at least one was violated (each is printed with the holds\n"
	"involved), or a requested fault never ran (verdict incomplete, with why); 64\n"
	"bad usage; 69 store unavailable;\n"
	"130 interrupted (SIGINT/SIGTERM) before the end, nothing violated so far.\n";

/* clang-format off */
static const struct { unsigned kind; const char *name; } fault_names[] = {
	{ F_PAUSE, "pause" },         { F_KILL, "kill" },
	{ F_RESTART, "restart" },     { F_MEMBER, "member" },
	{ F_PARTITION, "partition" }, { F_LOSE, "lose-reply" },
	{ F_DELAY, "delay" },         { F_SPAUSE, "server-pause" },
	{ F_FDELETE, "file-delete" }, { F_MRESTART, "member-restart" },
	{ F_FAILOVER, "failover" },   { F_KILLTOOL, "kill-tool" },
	{ F_SESSKILL, "session-kill" }, { F_EVICT, "evict" },
	{ F_FAILBACK, "failback" },
};
#define NKINDS (sizeof fault_names / sizeof *fault_names)

enum { O_CLIENTS = 1, O_DURATION, O_TTL, O_HOLD, O_FAULTS, O_EVERY, O_PAUSE, O_FENCING, O_SEED,
       O_NAME, O_SCRIPT, O_SDIR, O_REPORT, O_WORKDIR, O_DELAY, O_OPS, O_REPLICA, O_MASTER };

static const cli_opt opts_table[] = {
	{ "clients", 0, true, O_CLIENTS },   { "duration", 0, true, O_DURATION },
	{ "ttl", 0, true, O_TTL },           { "hold", 0, true, O_HOLD },
	{ "faults", 0, true, O_FAULTS },     { "fault-every", 0, true, O_EVERY },
	{ "pause", 0, true, O_PAUSE },       { "fencing", 0, true, O_FENCING },
	{ "seed", 0, true, O_SEED },         { "name", 0, true, O_NAME },
	{ "server-script", 0, true, O_SCRIPT }, { "server-dir", 0, true, O_SDIR },
	{ "report", 0, true, O_REPORT },     { "work-dir", 0, true, O_WORKDIR },
	{ "delay", 0, true, O_DELAY },       { "ops", 0, true, O_OPS },
	{ "replica", 0, true, O_REPLICA },   { "master", 0, true, O_MASTER },
	{ NULL, 0, false, 0 },
};
/* clang-format on */

static int parse_faults(check_opts *o, const char *v)
{
	o->faults = 0;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", v);
	char *save = NULL;
	for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		size_t k = 0;
		while (k < NKINDS && strcmp(w, fault_names[k].name) != 0)
			k++;
		if (k < NKINDS)
			o->faults |= fault_names[k].kind;
		else if (strcmp(w, "none") != 0)
			return cli_usage_error(
				o->g,
				"--faults: unknown fault '%s' (pause, kill, restart, member, partition, "
				"lose-reply, delay, server-pause, file-delete, member-restart, failover, "
				"kill-tool, session-kill, evict, failback)",
				w);
	}
	return 0;
}

static int parse_ops(check_opts *o, const char *v)
{
	o->ops = 0;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", v);
	char *save = NULL;
	for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (strcmp(w, "extend") == 0)
			o->ops |= OP_EXTEND;
		else if (strcmp(w, "handle") == 0)
			o->ops |= OP_HANDLE;
		else if (strcmp(w, "none") != 0 && strcmp(w, "plain") != 0)
			return cli_usage_error(o->g, "--ops: unknown op '%s' (extend, handle)", w);
	}
	return 0;
}

static const char *const kind_names[K_NKINDS] = { "plain", "extend", "handle", "run" };

const char *check_kind_name(int k)
{
	return k >= 0 && k < K_NKINDS ? kind_names[k] : "?";
}

static int on_opt(void *ctx, int id, const char *v)
{
	check_opts *o = ctx;
	const cli_global *g = o->g;
	switch (id) {
	case O_CLIENTS:
		return cli_uint(g, "--clients", v, MAX_CLIENTS, &o->clients);
	case O_DURATION:
		return cli_duration(g, "--duration", v, &o->duration_ms);
	case O_TTL:
		return cli_duration(g, "--ttl", v, &o->ttl_ms);
	case O_HOLD:
		return cli_duration(g, "--hold", v, &o->hold_ms);
	case O_FAULTS:
		return parse_faults(o, v);
	case O_EVERY:
		return cli_duration(g, "--fault-every", v, &o->every_ms);
	case O_PAUSE:
		return cli_duration(g, "--pause", v, &o->pause_ms);
	case O_DELAY:
		return cli_duration(g, "--delay", v, &o->delay_ms);
	case O_OPS:
		return parse_ops(o, v);
	case O_REPLICA:
		o->replica = v;
		return 0;
	case O_MASTER:
		o->master = v;
		return 0;
	case O_FENCING:
		if (strcmp(v, "on") == 0)
			o->fencing = true;
		else if (strcmp(v, "off") == 0)
			o->fencing = false;
		else
			return cli_usage_error(g, "--fencing: expected on or off, got '%s'", v);
		return 0;
	case O_SEED: {
		char *end;
		errno = 0;
		unsigned long long s = strtoull(v, &end, 10);
		if (!*v || *v == '-' || *end || errno)
			return cli_usage_error(g, "--seed: expected a whole number, got '%s'", v);
		o->seed = s;
		o->seed_set = true;
		return 0;
	}
	case O_NAME:
		o->name = v;
		return cli_name(g, v);
	case O_SCRIPT:
		o->server_script = v;
		return 0;
	case O_SDIR:
		o->server_dir = v;
		return 0;
	case O_REPORT: {
		/* a report that cannot be written fails now, not after the run */
		int fd = open(v, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0)
			return cli_usage_error(g, "--report %s: cannot write it: %s", v, strerror(errno));
		close(fd);
		o->report = v;
		return 0;
	}
	case O_WORKDIR:
		o->work_dir = v;
		return 0;
	}
	return 0;
}

/* ---- time, randomness ------------------------------------------------- */

int64_t check_t0_us; /* the run's origin on CLOCK_MONOTONIC; inherited by workers */
volatile sig_atomic_t check_interrupted; /* SIGINT/SIGTERM/SIGHUP to the parent */

static void on_signal(int sig)
{
	(void)sig;
	check_interrupted = 1;
}

int64_t check_mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t check_now_us(void)
{
	return check_mono_us() - check_t0_us;
}

/* Sleep until run time `at_us`; an absolute deadline, so a SIGSTOP in the middle
 * does not stretch it: the sleeper wakes at once after SIGCONT if it is late. */
void check_sleep_until(int64_t at_us)
{
	int64_t abs_us = at_us + check_t0_us;
	struct timespec ts = { (time_t)(abs_us / 1000000), (long)(abs_us % 1000000) * 1000 };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

void check_sleep_ms(int64_t ms)
{
	check_sleep_until(check_now_us() + ms * 1000);
}

/* The parent's sleeps during a fault: cut short by SIGINT/SIGTERM, so that a
 * stopped worker is never left behind. */
void check_fault_sleep_ms(int64_t ms)
{
	int64_t until = check_now_us() + ms * 1000;
	while (!check_interrupted && check_now_us() < until)
		check_sleep_ms(until - check_now_us() > 10000 ? 10 : (until - check_now_us() + 999) / 1000);
}

/* splitmix64: small, seedable, the same sequence on every machine. */
static uint64_t rnd_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

uint64_t check_rnd_below(uint64_t *s, uint64_t n)
{
	return n ? rnd_next(s) % n : 0;
}

const char *check_fault_name(unsigned k)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (fault_names[i].kind == k)
			return fault_names[i].name;
	return "?";
}

/* The schedule's arithmetic (ms): how long a fault of kind k lasts at most,
 * the time it may take to find a holder to aim at (a hold, and the parent's
 * 10 ms steps), the time after a fault for the lock to be granted again (a
 * lease that ran out during it plus a hold), and the shortest gap between
 * two faults the schedule uses to fit every kind in. */
static int64_t fault_len_ms(const check_opts *o, unsigned k)
{
	if (k & (F_PAUSE | F_PARTITION | F_DELAY | F_SPAUSE | F_MEMBER))
		return o->pause_ms;
	if (k & (F_LOSE | F_MRESTART))
		return o->ttl_ms;
	return 0;
}

static int64_t aim_ms(const check_opts *o)
{
	return o->hold_ms + 20;
}

static int64_t recover_ms(const check_opts *o)
{
	return 2 * o->ttl_ms + o->hold_ms;
}

static int64_t min_gap_ms(const check_opts *o)
{
	return o->every_ms < recover_ms(o) ? o->every_ms : recover_ms(o);
}

/* From the start of the first of these kinds to the end of the run, one of
 * each at the shortest gaps. */
static int64_t tail_ms(const check_opts *o, const unsigned *k, int n)
{
	int64_t ms = recover_ms(o);
	for (int i = 0; i < n; i++)
		ms += aim_ms(o) + fault_len_ms(o, k[i]) + (i ? min_gap_ms(o) : 0);
	return ms;
}

/* Refuse before the run a --faults list whose kinds cannot each run once in
 * --duration: else the last ones would be skipped for want of time. */
static int fit_faults(const check_opts *o)
{
	unsigned k[NKINDS];
	int n = 0;
	for (unsigned b = F_PAUSE; b <= F_LAST; b <<= 1)
		if (o->faults & b)
			k[n++] = b;
	if (n == 0)
		return 0;
	int64_t need = o->every_ms / 2 + tail_ms(o, k, n);
	if (need <= o->duration_ms)
		return 0;
	char names[400] = "", lens[600] = "";
	size_t nl = 0, ll = 0;
	for (int i = 0; i < n; i++) {
		nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", i ? "," : "", check_fault_name(k[i]));
		ll += (size_t)snprintf(lens + ll, sizeof lens - ll, "%s%s %lldms", i ? ", " : "",
				       check_fault_name(k[i]), (long long)fault_len_ms(o, k[i]));
		if (nl >= sizeof names || ll >= sizeof lens)
			break;
	}
	return cli_usage_error(o->g,
			       "--faults %s: not every kind can run in --duration %.1fs: one of each takes %.1fs "
			       "(the first at %lldms; each lasts up to: %s, after up to %lldms to find a holder; "
			       "%lldms between two and %lldms after the last for the lock to be granted again); "
			       "give --duration %.1fs or more, fewer faults, or a shorter --pause or --ttl",
			       names, (double)o->duration_ms / 1000.0, (double)((need + 99) / 100) / 10.0,
			       (long long)(o->every_ms / 2), lens, (long long)aim_ms(o), (long long)min_gap_ms(o),
			       (long long)recover_ms(o), (double)((need + 99) / 100) / 10.0);
}

static void rm_work(const char *dir)
{
	const char *files[] = { "log", "register", "server.log" };
	char path[PATH_MAX];
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		snprintf(path, sizeof path, "%.4000s/%s", dir, files[i]);
		unlink(path);
	}
	for (int i = 0; i < MAX_CLIENTS; i++) {
		snprintf(path, sizeof path, "%.4000s/cmd.%d", dir, i);
		unlink(path);
	}
	rmdir(dir);
}

/* Undo the work dir's set-up for a run refused after it (the proxy and the
 * workers' URIs are the caller's). */
static void undo_setup(run_ctx *c, const check_opts *o, bool own_dir, char *shown)
{
	close(c->log_fd);
	munmap(c->sh, sizeof *c->sh);
	if (own_dir)
		rm_work(o->work_dir);
	free(c->db_path);
	free(c->self);
	free(shown);
}

int cli_check(cli_global *g, int argc, char **argv)
{
	const char *as_cmd = getenv("DLOCK_CHECK_COMMAND");
	if (as_cmd)
		return check_as_command(as_cmd);
	check_opts o = { 0 };
	o.g = g;
	o.clients = 3;
	o.duration_ms = 10000;
	o.ttl_ms = 1000;
	o.hold_ms = 100;
	o.fencing = true;
	o.every_ms = -1;
	o.pause_ms = -1;
	o.delay_ms = -1;
	cli_args a;
	int rc = cli_parse(g, argc, argv, opts_table, on_opt, &o, &a);
	if (rc == 0 && a.help) {
		printf(help, cli_global_help);
		free(a.pos);
		return 0;
	}
	if (rc == 0 && (a.npos || a.dashdash))
		rc = cli_usage_error(g, "check takes no arguments (options only)");
	free(a.pos);
	if (rc != 0)
		return rc;
	if (o.ttl_ms < 50)
		return cli_usage_error(g, "--ttl must be at least 50ms");
	if (o.duration_ms < 100)
		return cli_usage_error(g, "--duration must be at least 100ms");
	if (o.pause_ms < 0)
		o.pause_ms = 2 * o.ttl_ms;
	if (o.every_ms < 0)
		o.every_ms = 2 * o.ttl_ms + 4 * o.hold_ms;
	if (o.every_ms < 500)
		o.every_ms = 500;
	if ((o.faults & F_PAUSE) && o.pause_ms <= o.ttl_ms)
		cli_info(g, "warning: --pause %lldms is not longer than --ttl: pauses will not outlast leases",
			 (long long)o.pause_ms);
	if (o.delay_ms < 0)
		o.delay_ms = o.ttl_ms / 4;
	if (o.delay_ms > 3600000)
		return cli_usage_error(g, "--delay must be at most 1h");
	if (o.faults & F_KILLTOOL)
		o.ops |= OP_RUN;
	if ((o.faults & F_SERVER) && (!o.server_script || !o.server_dir))
		return cli_usage_error(g,
				       "--faults restart/member/server-pause/member-restart/failover need "
				       "--server-script and --server-dir");
	if ((o.faults & F_FAILOVER) && !check_script_offers(o.server_script, "kill-master"))
		return cli_usage_error(g,
				       "--faults failover: %s has no kill-master (use tests/servers/redis-sentinel.sh)",
				       o.server_script);
	if (o.faults & F_MRESTART) {
		bool mfile;
		if (check_count_members(o.server_dir, &mfile) < 1 || mfile ||
		    !check_script_offers(o.server_script, "restart"))
			return cli_usage_error(g,
					       "--faults member-restart: not available here: needs Redis masters "
					       "started by tests/servers/redis.sh or redlock.sh (DIR/0/, DIR/1/, ...)");
	}
	if (o.faults & F_SPAUSE) {
		pid_t sp[256];
		bool mfile;
		int nm = check_count_members(o.server_dir, &mfile);
		if (check_server_pids(o.server_dir, sp, 256) == 0 &&
		    !(nm > 0 && !mfile && check_script_offers(o.server_script, "pause")))
			return cli_usage_error(g,
					       "--faults server-pause: not available here: no server process found "
					       "in %s and %s has no pause",
					       o.server_dir, o.server_script);
	}
	if (!o.seed_set) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		o.seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
	}
	char host[128] = "host", defname[256];
	gethostname(host, sizeof host - 1);
	if (!o.name) {
		snprintf(defname, sizeof defname, "dlock-check/%s/%d", host, (int)getpid());
		o.name = defname;
	}

	run_ctx c = { 0 };
	c.o = &o;
	c.uri = cli_store_choice(g);
	/* Open once so a bad store fails before any worker starts; close it
	 * again: a store with threads must not cross fork(). */
	dlock_store *store = NULL;
	if ((rc = cli_store_open(g, &store)) != 0)
		return rc;
	char *shown = strdup(dlock_store_uri(store));
	dlock_store_close(store);
	if ((rc = check_seam_prepare(&c, shown)) != 0) {
		free(shown);
		free(c.db_path);
		free(c.self);
		return rc;
	}
	if (o.faults & F_FDELETE) {
		if (!c.db_path && shown && strncmp(shown, "sqlite:", 7) == 0)
			c.db_path = check_sqlite_path(c.uri);
		if (!c.db_path) {
			free(shown);
			return cli_usage_error(
				g, "--faults file-delete: not available on this store: it needs an sqlite store");
		}
	}
	char tmpdir[PATH_MAX];
	bool own_dir = !o.work_dir;
	if (own_dir) {
		const char *tmp = getenv("TMPDIR");
		snprintf(tmpdir, sizeof tmpdir, "%.4000s/dlock-check.XXXXXX", tmp && *tmp ? tmp : "/tmp");
		o.work_dir = mkdtemp(tmpdir);
		if (!o.work_dir) {
			cli_error(g, "cannot make a temp dir %s: %s", tmpdir, strerror(errno));
			free(c.db_path);
			free(c.self);
			free(shown);
			return CLI_EXIT_FAIL;
		}
	} else if (strlen(o.work_dir) > 4000) {
		free(c.db_path);
		free(c.self);
		free(shown);
		return cli_usage_error(g, "--work-dir: path too long");
	} else if (mkdir(o.work_dir, 0755) != 0 && errno != EEXIST) {
		cli_error(g, "--work-dir %s: %s", o.work_dir, strerror(errno));
		free(c.db_path);
		free(c.self);
		free(shown);
		return CLI_EXIT_FAIL;
	}
	char log_path[PATH_MAX];
	snprintf(log_path, sizeof log_path, "%.4000s/log", o.work_dir);
	snprintf(c.reg_path, sizeof c.reg_path, "%.4000s/register", o.work_dir);
	c.log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	int reg_fd = open(c.reg_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	reg_state zero = { 0 };
	c.sh = mmap(NULL, sizeof *c.sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (c.log_fd < 0 || reg_fd < 0 || write(reg_fd, &zero, sizeof zero) != (ssize_t)sizeof zero ||
	    c.sh == MAP_FAILED || !shown) {
		cli_error(g, "cannot set up the work dir %s: %s", o.work_dir, strerror(errno));
		if (c.log_fd >= 0)
			close(c.log_fd);
		if (reg_fd >= 0)
			close(reg_fd);
		free(c.db_path);
		free(c.self);
		free(shown);
		return CLI_EXIT_FAIL;
	}
	close(reg_fd);
	memset(c.sh, 0, sizeof *c.sh);
	proxy px = { .pid = -1, .ctl = -1 };
	/* --ops extend lags a worker's own link at its renewal: through the
	 * proxy, unless the store is SQLite (its write lock is held instead). */
	if ((o.faults & F_NET) || ((o.ops & OP_EXTEND) && !c.db_path)) {
		char err[400];
		if (check_proxy_start(&px, &c, err, sizeof err) != 0) {
			if (!(o.faults & F_NET))
				snprintf(err + strlen(err), sizeof err - strlen(err),
					 " (--ops extend delays renewals through it)");
			undo_setup(&c, &o, own_dir, shown);
			char names[64] = "";
			for (unsigned k = F_PARTITION; k <= F_DELAY; k <<= 1)
				if (o.faults & k)
					snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
						 names[0] ? "," : "", check_fault_name(k));
			return cli_usage_error(g, "--%s %s: not available on this store: %s",
					       names[0] ? "faults" : "ops", names[0] ? names : "extend", err);
		}
		c.px = &px;
	}
	if ((rc = fit_faults(&o)) != 0) {
		check_proxy_stop(&px);
		for (unsigned i = 0; i < o.clients; i++)
			free(c.worker_uri[i]);
		undo_setup(&c, &o, own_dir, shown);
		return rc;
	}

	cli_info(g, "%u workers on %s for %.1fs (ttl %lldms, hold %lldms, fencing %s, seed %" PRIu64 "); work dir %s",
		 o.clients, shown, (double)o.duration_ms / 1000.0, (long long)o.ttl_ms, (long long)o.hold_ms,
		 o.fencing ? "on" : "off", o.seed, o.work_dir);

	check_t0_us = check_mono_us();
	c.deadline_us = o.duration_ms * 1000;
	pid_t pids[MAX_CLIENTS] = { 0 };
	int incs[MAX_CLIENTS] = { 0 };
	for (unsigned i = 0; i < o.clients; i++)
		pids[i] = check_spawn_worker(&c, (int)i, 0);

	unsigned kinds[NKINDS];
	int nkinds = 0;
	for (unsigned k = F_PAUSE; k <= F_LAST; k <<= 1)
		if (o.faults & k)
			kinds[nkinds++] = k;
	/* Every requested kind runs once before any runs twice (a seeded order),
	 * and the gaps shrink (down to min_gap_ms) when the time left would not
	 * hold the kinds still owed: a kind the schedule never drew would be
	 * skipped silently. One that could not be carried out (no holder to aim
	 * at) stays owed, for up to three tries. */
	unsigned owed[NKINDS];
	int nowed = nkinds, tries[NKINDS] = { 0 };
	memcpy(owed, kinds, sizeof owed);
	fault *faults = calloc(MAX_FAULTS, sizeof *faults);
	size_t nfaults = 0;
	/* Two streams: the schedule (kinds, times) repeats exactly for a seed even
	 * though which worker holds the lock at a fault's time does not. */
	uint64_t rs = o.seed, rt = o.seed ^ 0x5DEECE66Dull;
	int64_t next_fault = (o.every_ms / 2 + (int64_t)check_rnd_below(&rs, (uint64_t)o.every_ms / 4 + 1)) * 1000;
	if (nowed && next_fault > c.deadline_us - tail_ms(&o, owed, nowed) * 1000)
		next_fault = c.deadline_us - tail_ms(&o, owed, nowed) * 1000;
	struct sigaction sa = { .sa_handler = on_signal }, old_int, old_term, old_hup;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	sigaction(SIGHUP, &sa, &old_hup);
	while (check_now_us() < c.deadline_us && !check_interrupted) {
		check_reap(&c, pids, incs, true);
		/* A fault ends early enough to see the next grant after it: a lease
		 * that ran out during it plus a hold (else heal_to_grant is -1 for
		 * want of time, not of liveness). */
		unsigned fit[NKINDS];
		int nfit = 0;
		const unsigned *from = nowed ? owed : kinds;
		for (int k = 0; k < (nowed ? nowed : nkinds); k++)
			if (check_now_us() + (fault_len_ms(&o, from[k]) + recover_ms(&o)) * 1000 < c.deadline_us)
				fit[nfit++] = from[k];
		if (nfit && faults && nfaults < MAX_FAULTS && check_now_us() >= next_fault) {
			unsigned kind = fit[check_rnd_below(&rs, (uint64_t)nfit)];
			check_do_fault(&c, kind, &rt, pids, incs, &faults[nfaults]);
			cli_debug(g, "fault %s at %.0fms: %s", check_fault_name(kind),
				  check_us_to_ms(faults[nfaults].start_us),
				  faults[nfaults].ok ? "done" : faults[nfaults].note);
			for (int k = 0; k < nowed; k++) {
				if (owed[k] != kind)
					continue;
				if (faults[nfaults].ok || ++tries[k] >= 3 || kind == F_FAILOVER) {
					owed[k] = owed[--nowed];
					tries[k] = tries[nowed];
				}
				break;
			}
			nfaults++;
			if (c.failed_over) /* once: no master is left to fail over */
				for (int k = 0; k < nkinds; k++)
					if (kinds[k] == F_FAILOVER)
						kinds[k] = kinds[--nkinds];
			next_fault = check_now_us() +
				     (o.every_ms + (int64_t)check_rnd_below(&rs, (uint64_t)o.every_ms / 4 + 1)) * 1000;
			if (nowed) {
				/* Behind its schedule (a holder found late), the gap
				 * shrinks below min_gap_ms rather than drop a kind. */
				int64_t latest = c.deadline_us - tail_ms(&o, owed, nowed) * 1000;
				if (next_fault > latest)
					next_fault = latest;
			}
			continue;
		}
		check_sleep_ms(10);
	}
	atomic_store(&c.sh->stop, 1);
	if (check_interrupted) {
		cli_error(g, "interrupted: stopping the workers; results so far follow");
		for (unsigned i = 0; i < o.clients; i++)
			if (pids[i] > 0) {
				kill(pids[i], SIGCONT);
				kill(pids[i], SIGTERM);
			}
	}
	/* Workers finish their hold and leave; one stuck past ttl+hold+10s is killed. */
	int64_t give_up = check_now_us() + (2 * o.ttl_ms + o.hold_ms + 10000) * 1000;
	size_t stuck = 0;
	for (;;) {
		check_reap(&c, pids, incs, false);
		bool any = false;
		for (unsigned i = 0; i < o.clients; i++)
			any |= pids[i] > 0;
		if (!any)
			break;
		if (check_now_us() > give_up) {
			for (unsigned i = 0; i < o.clients; i++)
				if (pids[i] > 0) {
					cli_error(g,
						  "worker %u did not stop (a call into the store hangs?); killing it",
						  i);
					kill(pids[i], SIGKILL);
					stuck++;
				}
			give_up = INT64_MAX;
		}
		check_sleep_ms(10);
	}
	int64_t end_us = check_now_us();
	close(c.log_fd);
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	sigaction(SIGHUP, &old_hup, NULL);

	results r = { 0 };
	r.end_us = end_us;
	r.stuck = stuck;
	r.faults = faults;
	r.nfaults = nfaults;
	int fd = open(c.reg_path, O_RDONLY | O_CLOEXEC);
	bool reg_ok = fd >= 0 && pread(fd, &r.reg, sizeof r.reg, 0) == (ssize_t)sizeof r.reg;
	if (fd >= 0)
		close(fd);
	if (!reg_ok || check_read_log(log_path, &r) != 0) {
		cli_error(g, "cannot read back %s: %s", o.work_dir, strerror(errno));
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	r.extends = atomic_load(&c.sh->extends);
	r.delayed = atomic_load(&c.sh->delayed);
	check_analyse(&r, &o);
	if (r.nholds == 0 && r.errors > 0) {
		cli_error(g, "no worker ever got the lock (%zu errors; see %s/log)", r.errors, o.work_dir);
		own_dir = false;
	}
	if (g->json)
		check_print_json(stdout, &o, shown, &r, false);
	else
		check_print_text(&o, shown, &r);
	if (o.report) {
		char *buf = NULL;
		size_t len = 0;
		FILE *mf = open_memstream(&buf, &len);
		FILE *rf = NULL;
		if (mf) {
			check_print_json(mf, &o, shown, &r, true);
			fclose(mf);
		}
		if (buf)
			rf = fopen(o.report, "w");
		if (rf) {
			cli_check_report_begin(rf);
			check_write_report(rf, &o, shown, &r);
		}
		if (!rf || cli_check_report_end(rf, buf) != 0 || fclose(rf) != 0) {
			cli_error(g, "--report %s: %s", o.report, strerror(errno));
			rc = CLI_EXIT_FAIL;
		} else {
			cli_info(g, "report written to %s", o.report);
		}
		free(buf);
	}
	if (rc == 0)
		rc = r.pass ? CLI_EXIT_OK : CLI_EXIT_FAIL;
	if (check_interrupted && rc == CLI_EXIT_OK)
		rc = 128 + SIGINT;
out:
	check_proxy_stop(&px);
	for (unsigned i = 0; i < o.clients; i++)
		free(c.worker_uri[i]);
	free(c.db_path);
	free(c.self);
	if (own_dir)
		rm_work(o.work_dir);
	free(r.holds);
	free(r.overlaps);
	free(r.fence_bad);
	free(faults);
	munmap(c.sh, sizeof *c.sh);
	free(shown);
	return rc;
}
