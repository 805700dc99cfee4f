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
 * (src/cli/faultproxy.c, built into this program) in a forked child,
 * with one route per worker and store host, and gives each worker the store
 * URI with its hosts replaced by its own routes. Only a pause explains an
 * overlap: under every other fault the lease or the lost signal must keep
 * holds apart, and an overlap is the store's fault.
 *
 * The tests run it on a fake store that grants every request (a test build of
 * this tool, tests/cli/broken_store.c): the checker must catch it.
 */
#include "cli.h"

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

#define FAULTPROXY_MAX_HOSTS 16
#define MAX_CLIENTS 64
#define MAX_FAULTS 256
#define MAX_SHOWN 20 /* violations printed one by one (all are counted) */

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
	"                       member-restart, failover\n"
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
	"Exit codes: 0 no safety property was violated; 1 at least one was (each is\n"
	"printed with the holds involved); 64 bad usage; 69 store unavailable;\n"
	"130 interrupted (SIGINT/SIGTERM) before the end, nothing violated so far.\n";

/* ---- options ---------------------------------------------------------- */

enum {
	F_PAUSE = 1, F_KILL = 2, F_RESTART = 4, F_MEMBER = 8, F_PARTITION = 16, F_LOSE = 32, F_DELAY = 64,
	F_SPAUSE = 128, F_FDELETE = 256, F_MRESTART = 512, F_FAILOVER = 1024,
	F_LAST = F_FAILOVER,
	F_NET = F_PARTITION | F_LOSE | F_DELAY,              /* through the proxy */
	F_SERVER = F_RESTART | F_MEMBER | F_SPAUSE | F_MRESTART | F_FAILOVER, /* need the server script */
};

static const struct { unsigned kind; const char *name; } fault_names[] = {
	{ F_PAUSE, "pause" },         { F_KILL, "kill" },
	{ F_RESTART, "restart" },     { F_MEMBER, "member" },
	{ F_PARTITION, "partition" }, { F_LOSE, "lose-reply" },
	{ F_DELAY, "delay" },         { F_SPAUSE, "server-pause" },
	{ F_FDELETE, "file-delete" }, { F_MRESTART, "member-restart" },
	{ F_FAILOVER, "failover" },
};
#define NKINDS (sizeof fault_names / sizeof *fault_names)

typedef struct check_opts {
	unsigned int clients;
	int64_t duration_ms, ttl_ms, hold_ms, every_ms, pause_ms, delay_ms;
	unsigned faults;
	bool fencing;
	uint64_t seed;
	bool seed_set;
	const char *name, *server_script, *server_dir, *report, *work_dir;
	const cli_global *g;
} check_opts;

enum { O_CLIENTS = 1, O_DURATION, O_TTL, O_HOLD, O_FAULTS, O_EVERY, O_PAUSE, O_FENCING, O_SEED,
       O_NAME, O_SCRIPT, O_SDIR, O_REPORT, O_WORKDIR, O_DELAY };

static const cli_opt opts_table[] = {
	{ "clients", 0, true, O_CLIENTS },   { "duration", 0, true, O_DURATION },
	{ "ttl", 0, true, O_TTL },           { "hold", 0, true, O_HOLD },
	{ "faults", 0, true, O_FAULTS },     { "fault-every", 0, true, O_EVERY },
	{ "pause", 0, true, O_PAUSE },       { "fencing", 0, true, O_FENCING },
	{ "seed", 0, true, O_SEED },         { "name", 0, true, O_NAME },
	{ "server-script", 0, true, O_SCRIPT }, { "server-dir", 0, true, O_SDIR },
	{ "report", 0, true, O_REPORT },     { "work-dir", 0, true, O_WORKDIR },
	{ "delay", 0, true, O_DELAY },
	{ NULL, 0, false, 0 },
};

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
			return cli_usage_error(o->g,
					       "--faults: unknown fault '%s' (pause, kill, restart, member, partition, "
					       "lose-reply, delay, server-pause, file-delete, member-restart, failover)",
					       w);
	}
	return 0;
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

static int64_t t0_us; /* the run's origin on CLOCK_MONOTONIC; inherited by workers */
static volatile sig_atomic_t interrupted; /* SIGINT/SIGTERM/SIGHUP to the parent */

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t now_us(void)
{
	return mono_us() - t0_us;
}

/* Sleep until run time `at_us`; an absolute deadline, so a SIGSTOP in the middle
 * does not stretch it: the sleeper wakes at once after SIGCONT if it is late. */
static void sleep_until(int64_t at_us)
{
	int64_t abs_us = at_us + t0_us;
	struct timespec ts = { (time_t)(abs_us / 1000000), (long)(abs_us % 1000000) * 1000 };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void sleep_ms(int64_t ms)
{
	sleep_until(now_us() + ms * 1000);
}

/* The parent's sleeps during a fault: cut short by SIGINT/SIGTERM, so that a
 * stopped worker is never left behind. */
static void fault_sleep_ms(int64_t ms)
{
	int64_t until = now_us() + ms * 1000;
	while (!interrupted && now_us() < until)
		sleep_ms(until - now_us() > 10000 ? 10 : (until - now_us() + 999) / 1000);
}

/* splitmix64: small, seedable, the same sequence on every machine. */
static uint64_t rnd_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t rnd_below(uint64_t *s, uint64_t n)
{
	return n ? rnd_next(s) % n : 0;
}

/* ---- state shared between the parent and the workers ------------------- */

typedef struct shared_state {
	atomic_int stop;
	atomic_llong holding[MAX_CLIENTS]; /* seq of the hold a worker is in, 0 when none */
	atomic_int reopen[MAX_CLIENTS];    /* file-delete: open the store again before the next try */
} shared_state;

typedef struct run_ctx {
	check_opts *o;
	const char *uri;     /* what workers open; NULL = default store */
	char *worker_uri[MAX_CLIENTS]; /* through the proxy (network faults), else NULL */
	struct proxy *px;    /* the fault proxy, or NULL */
	char *db_path;       /* the SQLite file (file-delete), or NULL */
	bool failed_over;    /* failover happens once: the script restarts no master */
	int log_fd;
	char reg_path[PATH_MAX];
	shared_state *sh;
	int64_t deadline_us;
} run_ctx;

/* The register file: fixed-size binary record, read and written under flock. */
typedef struct reg_state {
	int64_t value;
	uint64_t highest;          /* highest fence seen (on any access) */
	int64_t accepted, rejected;
	int64_t stale_accepted;    /* writes accepted although a higher fence had been seen */
} reg_state;

static void logf_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_line(int fd, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof buf)
		n = sizeof buf - 1;
	/* One write per line: O_APPEND keeps lines of many processes whole. */
	ssize_t w;
	do
		w = write(fd, buf, (size_t)n);
	while (w < 0 && errno == EINTR);
}

/*
 * One access to the register. write=false: read (value into *value);
 * write=true: store *value. Returns 1 accepted, 0 refused (stale fence),
 * -1 on an I/O error. *highest_before gets the highest fence seen before.
 */
static int reg_access(const char *path, bool fencing, bool write_op, uint64_t fence,
		      int64_t *value, uint64_t *highest_before)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int ok = -1;
	while (flock(fd, LOCK_EX) != 0)
		if (errno != EINTR)
			goto out;
	reg_state r;
	if (pread(fd, &r, sizeof r, 0) != (ssize_t)sizeof r)
		goto out;
	*highest_before = r.highest;
	bool stale = fence < r.highest;
	if (fencing && stale) {
		if (write_op)
			r.rejected++;
		ok = 0;
	} else {
		if (fence > r.highest)
			r.highest = fence;
		if (write_op) {
			r.value = *value;
			r.accepted++;
			if (stale)
				r.stale_accepted++;
		} else {
			*value = r.value;
		}
		ok = 1;
	}
	if (pwrite(fd, &r, sizeof r, 0) != (ssize_t)sizeof r)
		ok = -1;
out:
	close(fd); /* drops the flock */
	return ok;
}

static int open_store(const run_ctx *c, int w_slot, dlock_store **out)
{
	return dlock_store_open(out, c->worker_uri[w_slot] ? c->worker_uri[w_slot] : c->uri);
}

/* ---- workers ------------------------------------------------------------ */

typedef struct worker_id {
	int log_fd;
	int slot, inc;
	atomic_llong seq;
} worker_id;

static void on_lost(dlock_lock *lock, void *payload)
{
	(void)lock;
	worker_id *w = payload;
	logf_line(w->log_fd, "L %d %d %lld %lld\n", w->slot, w->inc, (long long)atomic_load(&w->seq),
		  (long long)now_us());
}

static int worker_main(const run_ctx *c, int slot, int inc)
{
	const check_opts *o = c->o;
	worker_id w = { c->log_fd, slot, inc, 0 };
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	uint64_t rs = (uint64_t)getpid() * 7919u + (uint64_t)inc;
	dlock_lock_options lo = DLOCK_LOCK_OPTIONS_INIT;
	lo.ttl_ms = o->ttl_ms;
	lo.on_lost = on_lost;
	lo.payload = &w;
	int rc = open_store(c, slot, &store);
	if (rc == 0)
		rc = dlock_lock_new(&lock, store, o->name, &lo);
	if (rc != 0) {
		logf_line(c->log_fd, "E %d %d 0 %lld %d\n", slot, inc, (long long)now_us(), rc);
		dlock_store_close(store);
		sleep_ms(100); /* the parent replaces us: not in a tight loop */
		return CLI_EXIT_FAIL;
	}
	long long seq = 0;
	while (!atomic_load(&c->sh->stop)) {
		int64_t left_ms = (c->deadline_us - now_us()) / 1000;
		if (left_ms <= 0)
			break;
		if (atomic_exchange(&c->sh->reopen[slot], 0)) {
			/* After file-delete: open the store as a process started now would. */
			dlock_lock_free(lock);
			dlock_store_close(store);
			lock = NULL;
			store = NULL;
			rc = open_store(c, slot, &store);
			if (rc == 0)
				rc = dlock_lock_new(&lock, store, o->name, &lo);
			if (rc != 0) {
				logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)now_us(), rc);
				dlock_store_close(store);
				return CLI_EXIT_FAIL; /* replaced by the parent */
			}
		}
		/* With file-delete, waiters look at the reopen flag every ttl/2. */
		int64_t wait_ms = left_ms;
		if ((o->faults & F_FDELETE) && wait_ms > o->ttl_ms / 2)
			wait_ms = o->ttl_ms / 2;
		seq++;
		atomic_store(&w.seq, seq);
		int64_t t_req = now_us();
		rc = dlock_acquire(lock, wait_ms);
		if (rc == DLOCK_ETIMEOUT && wait_ms < left_ms)
			continue;
		if (rc == DLOCK_ETIMEOUT)
			break;
		if (rc != 0) {
			/* The store is down (a restart fault): note it and try again. */
			logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)now_us(), rc);
			sleep_ms(50);
			continue;
		}
		int64_t t_grant = now_us();
		uint64_t fence = dlock_fence(lock);
		logf_line(c->log_fd, "A %d %d %lld %lld %lld %" PRIu64 "\n", slot, inc, seq,
			  (long long)t_req, (long long)t_grant, fence);
		int64_t v = 0;
		uint64_t hb = 0;
		int ok = reg_access(c->reg_path, o->fencing, false, fence, &v, &hb);
		logf_line(c->log_fd, "W %d %d %lld %lld r %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc,
			  seq, (long long)now_us(), ok, fence, (long long)v, hb);
		/* Announced after the read: a pause then falls between read and write. */
		atomic_store(&c->sh->holding[slot], seq);
		/* The work; a SIGSTOP here is the GC pause: on waking, write at once. */
		sleep_until(t_grant + o->hold_ms * 1000);
		if (ok == 1) {
			int64_t nv = v + 1;
			ok = reg_access(c->reg_path, o->fencing, true, fence, &nv, &hb);
			logf_line(c->log_fd, "W %d %d %lld %lld w %d %" PRIu64 " %lld %" PRIu64 "\n", slot,
				  inc, seq, (long long)now_us(), ok, fence, (long long)nv, hb);
		}
		atomic_store(&c->sh->holding[slot], 0);
		/* Logged before the call: the work is done here, and a release that
		 * hangs (a black hole) must not make the hold look longer. */
		logf_line(c->log_fd, "R %d %d %lld %lld 0\n", slot, inc, seq, (long long)now_us());
		dlock_release(lock);
		/* A short think time, so that the releasing worker does not always win again. */
		sleep_ms((int64_t)rnd_below(&rs, (uint64_t)(o->hold_ms / 2 + 1)));
	}
	dlock_lock_free(lock);
	dlock_store_close(store);
	return 0;
}

static pid_t spawn_worker(const run_ctx *c, int slot, int inc)
{
	atomic_store(&c->sh->holding[slot], 0); /* a killed predecessor may have left it set */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		_exit(worker_main(c, slot, inc));
	}
	return pid;
}

/* ---- faults --------------------------------------------------------------- */

typedef struct fault {
	unsigned kind;
	int slot, inc;          /* target worker, -1 for none or every worker */
	int member;             /* member index (member), -1 otherwise */
	int64_t start_us, end_us;
	int64_t heal_to_grant_us; /* -1: no grant after it */
	int64_t split_us;       /* fault end -> end of the last store-at-fault overlap that began
				 * between its start and the next fault's; -1: none */
	long long dropped;      /* bytes the proxy discarded (partition, lose-reply), -1 n/a */
	int ok;                 /* the fault was carried out */
	char note[200];
} fault;

static const char *fault_name(unsigned k)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (fault_names[i].kind == k)
			return fault_names[i].name;
	return "?";
}

/* Run `bash SCRIPT ARG...` with output appended to WORK/server.log; its exit code. */
static int run_script(const char *work, const char *script, const char *a1, const char *a2,
		      const char *a3)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%.4000s/server.log", work);
		int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp("bash", "bash", script, a1, a2, a3, (char *)NULL);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Members for the `member` fault: DIR/members (ZooKeeper, etcd) or DIR/<i>/ (Redis). */
static int count_members(const char *dir, bool *members_file)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%.4000s/members", dir);
	FILE *f = fopen(path, "r");
	int n = 0;
	if (f) {
		char line[PATH_MAX + 64];
		while (fgets(line, sizeof line, f))
			n++;
		fclose(f);
		*members_file = true;
		return n;
	}
	*members_file = false;
	for (;; n++) {
		struct stat st;
		snprintf(path, sizeof path, "%.4000s/%d", dir, n);
		if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
			break;
	}
	return n;
}

static pid_t member_pid(const char *dir, int i)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%.4000s/members", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[PATH_MAX + 64], want[32], name[32], pidfile[PATH_MAX];
	int port;
	pid_t pid = -1;
	snprintf(want, sizeof want, "m%d", i);
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "%31s %d %4095s", name, &port, pidfile) == 3 && strcmp(name, want) == 0) {
			FILE *p = fopen(pidfile, "r");
			int v;
			if (p && fscanf(p, "%d", &v) == 1)
				pid = v;
			if (p)
				fclose(p);
		}
	}
	fclose(f);
	return pid;
}

/* ---- the fault proxy, run in a child of ours ---------------------------------- */

/* src/cli/faultproxy.c, compiled in with FAULTPROXY_MAIN renamed. */
int dlock__faultproxy_main(int argc, char **argv);

typedef struct proxy {
	pid_t pid;
	int ctl;
	int nhosts;  /* routes per worker: route of worker w, host h = w * nhosts + h */
	int nroutes;
	char dir[PATH_MAX], sock[108];
} proxy;

/* Read one line (without its newline) from fd within timeout_ms. */
static int read_line_fd(int fd, char *buf, size_t cap, int timeout_ms)
{
	size_t n = 0;
	int64_t until = mono_us() + (int64_t)timeout_ms * 1000;
	while (n + 1 < cap) {
		int64_t left = (until - mono_us()) / 1000;
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&pfd, 1, (int)left) == 0)
			return -1;
		ssize_t r = read(fd, buf + n, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		if (buf[n] == '\n') {
			buf[n] = '\0';
			return 0;
		}
		n++;
	}
	return -1;
}

/* One control command; 0 when the proxy answered "ok...". */
static int proxy_cmd(proxy *p, const char *cmd, char *reply, size_t cap)
{
	char line[160];
	int n = snprintf(line, sizeof line, "%s\n", cmd);
	if (p->ctl < 0 || send(p->ctl, line, (size_t)n, MSG_NOSIGNAL) != n ||
	    read_line_fd(p->ctl, reply, cap, 10000) < 0)
		return -1;
	return strncmp(reply, "ok", 2) == 0 ? 0 : -1;
}

/* Set the mode of worker `slot`'s routes (-1: every route). */
static int proxy_set(proxy *p, int slot, const char *mode)
{
	char cmd[96], reply[160];
	if (slot < 0) {
		snprintf(cmd, sizeof cmd, "%s", mode);
		return proxy_cmd(p, cmd, reply, sizeof reply);
	}
	for (int h = 0; h < p->nhosts; h++) {
		snprintf(cmd, sizeof cmd, "%s %d", mode, slot * p->nhosts + h);
		if (proxy_cmd(p, cmd, reply, sizeof reply) < 0)
			return -1;
	}
	return 0;
}

/* Bytes discarded so far on worker `slot`'s routes (-1: every route); -1 on error. */
static long long proxy_dropped(proxy *p, int slot)
{
	long long sum = 0;
	int from = slot < 0 ? 0 : slot * p->nhosts, to = slot < 0 ? p->nroutes : from + p->nhosts;
	for (int r = from; r < to; r++) {
		char cmd[32], reply[200];
		long long v;
		snprintf(cmd, sizeof cmd, "stats %d", r);
		if (proxy_cmd(p, cmd, reply, sizeof reply) < 0 || !strstr(reply, "dropped=") ||
		    sscanf(strstr(reply, "dropped="), "dropped=%lld", &v) != 1)
			return -1;
		sum += v;
	}
	return sum;
}

static void proxy_stop(proxy *p)
{
	if (p->ctl >= 0) {
		char reply[64];
		proxy_cmd(p, "quit", reply, sizeof reply);
		close(p->ctl);
		p->ctl = -1;
	}
	if (p->pid > 0) {
		int st;
		pid_t r;
		int64_t until = mono_us() + 5000000;
		while ((r = waitpid(p->pid, &st, WNOHANG)) == 0 && mono_us() < until)
			sleep_ms(10);
		if (r == 0) {
			kill(p->pid, SIGKILL);
			while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR)
				;
		}
		p->pid = -1;
	}
	if (p->sock[0])
		unlink(p->sock);
	if (p->dir[0])
		rmdir(p->dir);
	p->sock[0] = p->dir[0] = '\0';
}

/*
 * Start the proxy with one route per worker and host of `uri` and fill
 * c->worker_uri[]. Returns 0, or -1 with a message in err.
 */
static int proxy_start(proxy *p, run_ctx *c, char *err, size_t errlen)
{
	char (*targets)[FAULTPROXY_HOST_MAX] = calloc(FAULTPROXY_MAX_HOSTS, sizeof *targets);
	int *ports = NULL, out[2] = { -1, -1 }, rc = -1;
	char **argv = NULL;
	const char *hs = NULL, *he = NULL;
	int n = -1;
	p->pid = -1;
	p->ctl = -1;
	if (!targets) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	n = faultproxy_uri_hosts(c->uri ? c->uri : "", targets, FAULTPROXY_MAX_HOSTS, &hs, &he, err, errlen);
	if (n < 0)
		goto out;
	p->nhosts = n;
	p->nroutes = n * (int)c->o->clients;
	const char *tmp = getenv("TMPDIR");
	snprintf(p->dir, sizeof p->dir, "%.200s/dlock-check-proxy.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (strlen(p->dir) + 5 >= sizeof p->sock)
		snprintf(p->dir, sizeof p->dir, "/tmp/dlock-check-proxy.XXXXXX");
	if (!mkdtemp(p->dir)) {
		snprintf(err, errlen, "cannot make %s: %s", p->dir, strerror(errno));
		p->dir[0] = '\0';
		goto out;
	}
	snprintf(p->sock, sizeof p->sock, "%s/ctl", p->dir);
	ports = calloc((size_t)p->nroutes, sizeof *ports);
	argv = calloc((size_t)p->nroutes + 3, sizeof *argv);
	if (!ports || !argv || pipe2(out, O_CLOEXEC) < 0) {
		snprintf(err, errlen, "cannot start the fault proxy: %s", strerror(errno));
		goto out;
	}
	argv[0] = "faultproxy";
	argv[1] = p->sock;
	for (int r = 0; r < p->nroutes; r++)
		argv[r + 2] = targets[r % n];
	fflush(NULL);
	pid_t parent = getpid();
	p->pid = fork();
	if (p->pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		goto out;
	}
	if (p->pid == 0) {
		/* Dies with us; its stdout (route ports, "ready") goes to the pipe;
		 * routes start in pass whatever the tests' variable says. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		unsetenv("FAULTPROXY_BLACKHOLE");
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_IGN);
		int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out[1], 1) < 0)
			_exit(127);
		fflush(stdout);
		_exit(dlock__faultproxy_main(p->nroutes + 2, argv));
	}
	close(out[1]);
	out[1] = -1;
	char line[64];
	for (int r = 0; r < p->nroutes; r++) {
		char *end;
		long v = 0;
		if (read_line_fd(out[0], line, sizeof line, 10000) < 0 || (v = strtol(line, &end, 10)) <= 0 ||
		    *end || v > 65535) {
			snprintf(err, errlen, "the fault proxy did not start (route %d)", r);
			goto out;
		}
		ports[r] = (int)v;
	}
	if (read_line_fd(out[0], line, sizeof line, 10000) < 0 || strcmp(line, "ready") != 0) {
		snprintf(err, errlen, "the fault proxy did not get ready");
		goto out;
	}
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	snprintf(sun.sun_path, sizeof sun.sun_path, "%s", p->sock);
	if ((p->ctl = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    connect(p->ctl, (struct sockaddr *)&sun, sizeof sun) < 0) {
		snprintf(err, errlen, "cannot reach the fault proxy at %s: %s", p->sock, strerror(errno));
		goto out;
	}
	for (unsigned w = 0; w < c->o->clients; w++)
		if (!(c->worker_uri[w] = faultproxy_uri_rewrite(c->uri, hs, he, ports + w * n, n))) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
	rc = 0;
out:
	if (out[0] >= 0)
		close(out[0]);
	if (out[1] >= 0)
		close(out[1]);
	if (rc != 0)
		proxy_stop(p);
	free(targets);
	free(ports);
	free(argv);
	return rc;
}

/* ---- the server's processes (server-pause) ------------------------------------ */

/* Whether the server script offers the command WORD: a `WORD)` case, or
 * WORD in the a|b|c list of its usage comment (redlock.sh hands its commands
 * on to redis.sh). */
static bool script_offers(const char *script, const char *word)
{
	FILE *f = fopen(script, "r");
	if (!f)
		return false;
	char line[512];
	size_t wl = strlen(word);
	bool found = false;
	while (!found && fgets(line, sizeof line, f)) {
		const char *q = line + strspn(line, " \t");
		if (strncmp(q, word, wl) == 0 && q[wl] == ')') {
			found = true;
		} else if (*q == '#') {
			for (const char *w = strstr(q, word); w && !found; w = strstr(w + 1, word)) {
				char before = w[-1], after = w[wl];
				found = (before == '|' && (after == '|' || after == ' ')) ||
					(before == ' ' && after == '|');
			}
		}
	}
	fclose(f);
	return found;
}

static pid_t pid_from(const char *path)
{
	FILE *f = fopen(path, "r");
	int v = -1;
	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v > 0 && kill(v, 0) == 0 ? (pid_t)v : -1;
}

static void add_pid(pid_t *pids, int *n, int max, pid_t p)
{
	if (p <= 0 || *n >= max)
		return;
	for (int i = 0; i < *n; i++)
		if (pids[i] == p)
			return;
	pids[(*n)++] = p;
}

/*
 * The processes of the servers started in `dir`, read the way the scripts of
 * tests/servers/ keep them: DIR/members (ZooKeeper, etcd), DIR/<i>/redis.pid
 * (Redis, Redlock), DIR/m/redis.pid (the Sentinel setup's master),
 * DIR/memcached.pid, DIR/pid (MariaDB), the postmaster of DIR/data or of the
 * cluster named in DIR/pgroot (PostgreSQL), and every descendant of those
 * (PostgreSQL's backends): a stopped postmaster alone would leave the
 * connections served.
 */
static int server_pids(const char *dir, pid_t *pids, int max)
{
	int n = 0;
	char path[PATH_MAX], line[PATH_MAX + 64];
	snprintf(path, sizeof path, "%.4000s/members", dir);
	FILE *f = fopen(path, "r");
	if (f) {
		char name[32], pidfile[PATH_MAX];
		int port;
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "%31s %d %4095s", name, &port, pidfile) == 3)
				add_pid(pids, &n, max, pid_from(pidfile));
		fclose(f);
	}
	for (int i = 0; i < 64; i++) {
		snprintf(path, sizeof path, "%.4000s/%d/redis.pid", dir, i);
		pid_t p = pid_from(path);
		if (p < 0)
			break;
		add_pid(pids, &n, max, p);
	}
	const char *single[] = { "m/redis.pid", "memcached.pid", "pid", "data/postmaster.pid" };
	for (size_t i = 0; i < sizeof single / sizeof *single; i++) {
		snprintf(path, sizeof path, "%.4000s/%s", dir, single[i]);
		add_pid(pids, &n, max, pid_from(path));
	}
	snprintf(path, sizeof path, "%.4000s/pgroot", dir);
	if ((f = fopen(path, "r"))) {
		if (fgets(line, sizeof line, f)) {
			line[strcspn(line, "\n")] = '\0';
			char pm[PATH_MAX + 32];
			snprintf(pm, sizeof pm, "%.4000s/data/postmaster.pid", line);
			add_pid(pids, &n, max, pid_from(pm));
		}
		fclose(f);
	}
	/* Descendants, to a fixed point (a process list has no tree order). */
	for (int grew = n > 0; grew;) {
		grew = 0;
		DIR *d = opendir("/proc");
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] < '1' || e->d_name[0] > '9')
				continue;
			snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
			FILE *sf = fopen(path, "r");
			if (!sf)
				continue;
			int pid = 0, ppid = 0;
			/* pid (comm) state ppid: comm may hold spaces, so parse after the last ')'. */
			if (fgets(line, sizeof line, sf) && sscanf(line, "%d", &pid) == 1) {
				char *rp = strrchr(line, ')');
				char st;
				if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2) {
					for (int i = 0; i < n; i++)
						if (pids[i] == ppid) {
							int before = n;
							add_pid(pids, &n, max, pid);
							grew |= n > before;
							break;
						}
				}
			}
			fclose(sf);
		}
		if (d)
			closedir(d);
	}
	return n;
}

/* The SQLite database file of the store: from its URI, or the default one. */
static char *sqlite_path(const char *uri)
{
	char *dflt = NULL;
	if (!uri) {
		if (dlock_default_uri(&dflt) != 0)
			return NULL;
		uri = dflt;
	}
	char *path = NULL;
	if (strncmp(uri, "sqlite:", 7) == 0) {
		const char *q = uri + 7;
		if (strncmp(q, "//", 2) == 0)
			q += 2;
		path = strndup(q, strcspn(q, "?#"));
	}
	free(dflt);
	if (path && !*path) {
		free(path);
		path = NULL;
	}
	return path;
}

/* ---- the log, read back ---------------------------------------------------- */

typedef struct hold {
	int slot, inc;
	long long seq;
	int64_t t_req, t_grant, t_read, t_write, t_rel, t_lost, t_end;
	uint64_t fence;
	int read_ok, write_ok;  /* 1 accepted, 0 refused, -1 error, -2 not tried */
	int64_t read_val, write_val;
	bool stale_write;       /* accepted although a higher fence had been seen */
	int rel_rc;
	bool released, killed, paused;
	bool overlapped;
} hold;

typedef struct pair {
	int a, b; /* indexes into holds, a granted first */
	int64_t from_us, to_us;
	bool explained;
} pair;

typedef struct results {
	hold *holds;
	size_t nholds;
	pair *overlaps;
	size_t noverlaps, unexplained;
	pair *fence_bad;
	size_t nfence_bad;
	size_t stale_writes;    /* from the log */
	size_t errors;
	reg_state reg;
	int64_t lost_updates;
	int64_t end_us;
	size_t nfaults;
	fault *faults;
	int64_t worst_heal_us;
	size_t stuck;           /* workers still in a call ttl+hold+10s after the end: killed */
	bool liveness_gap;      /* a fault was followed by no grant at all */
	bool pass;
} results;

static int by_grant(const void *x, const void *y)
{
	const hold *a = x, *b = y;
	return (a->t_grant > b->t_grant) - (a->t_grant < b->t_grant);
}

static hold *find_hold(results *r, int slot, int inc, long long seq)
{
	/* Recent holds are the likely match: search backwards. */
	for (size_t i = r->nholds; i-- > 0;)
		if (r->holds[i].slot == slot && r->holds[i].inc == inc && r->holds[i].seq == seq)
			return &r->holds[i];
	return NULL;
}

static int read_log(const char *path, results *r)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t cap = 0;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		char t;
		int slot, inc;
		long long seq, a, b;
		if (sscanf(line, "%c %d %d %lld %lld", &t, &slot, &inc, &seq, &a) != 5)
			continue;
		if (t == 'A') {
			unsigned long long fence;
			if (sscanf(line, "A %*d %*d %*d %*d %lld %llu", &b, &fence) != 2)
				continue;
			if (r->nholds == cap) {
				cap = cap ? cap * 2 : 256;
				hold *n = realloc(r->holds, cap * sizeof *n);
				if (!n) {
					fclose(f);
					return -1;
				}
				r->holds = n;
			}
			hold *h = &r->holds[r->nholds++];
			memset(h, 0, sizeof *h);
			h->slot = slot;
			h->inc = inc;
			h->seq = seq;
			h->t_req = a;
			h->t_grant = b;
			h->fence = fence;
			h->read_ok = h->write_ok = -2;
			h->t_lost = h->t_rel = h->t_read = h->t_write = -1;
			continue;
		}
		if (t == 'E') {
			r->errors++;
			continue;
		}
		hold *h = find_hold(r, slot, inc, seq);
		if (!h)
			continue;
		if (t == 'W') {
			char op;
			int ok;
			unsigned long long fence, hb;
			long long v;
			if (sscanf(line, "W %*d %*d %*d %*d %c %d %llu %lld %llu", &op, &ok, &fence, &v, &hb) != 5)
				continue;
			if (op == 'r') {
				h->t_read = a;
				h->read_ok = ok;
				h->read_val = v;
			} else {
				h->t_write = a;
				h->write_ok = ok;
				h->write_val = v;
				h->stale_write = ok == 1 && fence < hb;
			}
		} else if (t == 'L') {
			if (h->t_lost < 0)
				h->t_lost = a;
		} else if (t == 'R') {
			int rc = 0;
			sscanf(line, "R %*d %*d %*d %*d %d", &rc);
			h->t_rel = a;
			h->rel_rc = rc;
			h->released = true;
		}
	}
	fclose(f);
	return 0;
}

static void analyse(results *r, const check_opts *o)
{
	/* The end of what each holder believed: release, lost signal, or death. */
	for (size_t i = 0; i < r->nholds; i++) {
		hold *h = &r->holds[i];
		int64_t end = h->released ? h->t_rel : r->end_us;
		if (h->t_lost >= 0 && h->t_lost < end)
			end = h->t_lost;
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *f = &r->faults[k];
			if (f->slot != h->slot || f->inc != h->inc)
				continue;
			if (f->kind == F_KILL && f->ok && !h->released && f->start_us >= h->t_grant &&
			    f->start_us < end) {
				end = f->start_us;
				h->killed = true;
			}
		}
		if (end < h->t_grant)
			end = h->t_grant;
		h->t_end = end;
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *f = &r->faults[k];
			if (f->kind == F_PAUSE && f->ok && f->slot == h->slot && f->inc == h->inc &&
			    f->start_us >= h->t_grant && f->start_us <= h->t_end)
				h->paused = true;
		}
	}
	qsort(r->holds, r->nholds, sizeof *r->holds, by_grant);

	size_t cap_o = 0, cap_f = 0;
	uint64_t max_fence = 0;
	size_t max_at = 0;
	for (size_t i = 0; i < r->nholds; i++) {
		hold *b = &r->holds[i];
		/* Every earlier grant whose believed interval reaches past our grant. */
		for (size_t j = 0; j < i; j++) {
			hold *a = &r->holds[j];
			if (a->t_end <= b->t_grant)
				continue;
			if (r->noverlaps == cap_o) {
				cap_o = cap_o ? cap_o * 2 : 64;
				pair *n = realloc(r->overlaps, cap_o * sizeof *n);
				if (!n)
					break;
				r->overlaps = n;
			}
			pair *p = &r->overlaps[r->noverlaps++];
			p->a = (int)j;
			p->b = (int)i;
			p->from_us = b->t_grant;
			p->to_us = a->t_end < b->t_end ? a->t_end : b->t_end;
			/* A paused holder's lease ran out while it was stopped: no lease can
			 * prevent that overlap; only the fence can make it harmless. */
			p->explained = a->paused;
			if (!p->explained)
				r->unexplained++;
			a->overlapped = b->overlapped = true;
		}
		if (i > 0 && b->fence <= max_fence) {
			if (r->nfence_bad == cap_f) {
				cap_f = cap_f ? cap_f * 2 : 16;
				pair *n = realloc(r->fence_bad, cap_f * sizeof *n);
				if (n)
					r->fence_bad = n;
			}
			if (r->nfence_bad < cap_f) {
				pair *p = &r->fence_bad[r->nfence_bad++];
				p->a = (int)max_at;
				p->b = (int)i;
				p->from_us = p->to_us = b->t_grant;
				p->explained = false;
			}
		}
		if (i == 0 || b->fence > max_fence) {
			max_fence = b->fence;
			max_at = i;
		}
		if (b->stale_write)
			r->stale_writes++;
	}
	r->lost_updates = r->reg.accepted - r->reg.value;

	r->worst_heal_us = 0;
	for (size_t k = 0; k < r->nfaults; k++) {
		fault *f = &r->faults[k];
		f->heal_to_grant_us = -1;
		for (size_t i = 0; i < r->nholds; i++) {
			if (r->holds[i].t_grant >= f->end_us) {
				f->heal_to_grant_us = r->holds[i].t_grant - f->end_us;
				break;
			}
		}
		if (f->heal_to_grant_us < 0 && f->ok)
			r->liveness_gap = true;
		/* How long the store stayed split: a bounded window (the holder learns
		 * of the fault at its next renewal) or for good (two worlds). */
		int64_t until = k + 1 < r->nfaults ? r->faults[k + 1].start_us : INT64_MAX;
		f->split_us = -1;
		for (size_t i = 0; i < r->noverlaps; i++) {
			const pair *p = &r->overlaps[i];
			if (!p->explained && p->from_us >= f->start_us && p->from_us < until &&
			    p->to_us - f->end_us > f->split_us)
				f->split_us = p->to_us - f->end_us;
		}
		if (f->heal_to_grant_us > r->worst_heal_us)
			r->worst_heal_us = f->heal_to_grant_us;
	}
	(void)o;
	r->pass = r->unexplained == 0 && r->nfence_bad == 0 && r->lost_updates == 0 &&
		  r->stale_writes == 0 && r->reg.stale_accepted == 0;
}

/* ---- output --------------------------------------------------------------- */

static double ms(int64_t us)
{
	return (double)us / 1000.0;
}

static void hold_text(char *buf, size_t len, const hold *h)
{
	snprintf(buf, len, "worker %d hold %lld (fence %" PRIu64 ", %.1f-%.1f ms%s%s)", h->slot,
		 h->seq, h->fence, ms(h->t_grant), ms(h->t_end), h->paused ? ", paused" : "",
		 h->killed ? ", killed" : h->t_lost >= 0 && h->t_lost <= h->t_end ? ", lost" : "");
}

/* The violations one by one (at most MAX_SHOWN of each kind; all are
 * counted), one line each: for the terminal and for the report. */
static void violation_lines(const results *r, void (*emit)(void *ctx, const char *line), void *ctx)
{
	char a[160], b[160], line[512];
	size_t shown_n = 0;
	for (size_t i = 0; i < r->noverlaps && shown_n < MAX_SHOWN; i++) {
		const pair *p = &r->overlaps[i];
		hold_text(a, sizeof a, &r->holds[p->a]);
		hold_text(b, sizeof b, &r->holds[p->b]);
		snprintf(line, sizeof line, "%s: %s and %s overlap for %.1f ms",
			 p->explained ? "overlap after pause" : "OVERLAP", a, b, ms(p->to_us - p->from_us));
		emit(ctx, line);
		shown_n++;
	}
	for (size_t i = 0; i < r->nfence_bad && i < MAX_SHOWN; i++) {
		hold_text(a, sizeof a, &r->holds[r->fence_bad[i].a]);
		hold_text(b, sizeof b, &r->holds[r->fence_bad[i].b]);
		snprintf(line, sizeof line, "FENCE ORDER: %s was granted after %s with a fence not greater", b, a);
		emit(ctx, line);
	}
	shown_n = 0;
	for (size_t i = 0; i < r->nholds && shown_n < MAX_SHOWN; i++) {
		if (!r->holds[i].stale_write)
			continue;
		hold_text(a, sizeof a, &r->holds[i]);
		snprintf(line, sizeof line, "STALE WRITE: %s wrote %lld at %.1f ms after a higher fence had been used", a,
			 (long long)r->holds[i].write_val, ms(r->holds[i].t_write));
		emit(ctx, line);
		shown_n++;
	}
	if (r->lost_updates) {
		snprintf(line, sizeof line, "LOST UPDATES: %lld writes were accepted but the register holds %lld",
			 (long long)r->reg.accepted, (long long)r->reg.value);
		emit(ctx, line);
	}
}

static void print_line(void *ctx, const char *line)
{
	(void)ctx;
	printf("  %s\n", line);
}

static void print_text(const check_opts *o, const char *shown, const results *r)
{
	size_t reads_refused = 0;
	for (size_t i = 0; i < r->nholds; i++)
		reads_refused += r->holds[i].read_ok == 0;
	printf("dlock check: store %s, %u clients, %.1fs, ttl %.0fms, hold %.0fms, fencing %s, seed %" PRIu64 "\n",
	       shown, o->clients, ms(r->end_us) / 1000.0, (double)o->ttl_ms, (double)o->hold_ms,
	       o->fencing ? "on" : "off", o->seed);
	printf("  grants %zu, writes accepted %lld, refused %lld (reads refused %zu), errors %zu, faults %zu\n",
	       r->nholds, (long long)r->reg.accepted, (long long)r->reg.rejected, reads_refused, r->errors, r->nfaults);
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *f = &r->faults[k];
		char heal[96] = "no grant after it";
		if (f->heal_to_grant_us >= 0)
			snprintf(heal, sizeof heal, "next grant %.0fms later", ms(f->heal_to_grant_us));
		if (f->split_us >= 0)
			snprintf(heal + strlen(heal), sizeof heal - strlen(heal), ", OVERLAPS until %.0fms after",
				 ms(f->split_us));
		char target[32] = "server";
		if (f->slot >= 0)
			snprintf(target, sizeof target, "worker %d", f->slot);
		else if (f->member >= 0)
			snprintf(target, sizeof target, "member %d", f->member);
		if (f->slot < 0 && (f->kind & F_NET))
			snprintf(target, sizeof target, "every worker");
		printf("  fault %-14s %-12s %.0f-%.0fms: %s%s%s\n", fault_name(f->kind), target, ms(f->start_us),
		       ms(f->end_us), f->ok ? heal : "FAILED: ", f->ok && f->note[0] ? "; " : "", f->note);
	}
	printf("\n  %-40s %8s\n", "property", "count");
	printf("  %-40s %8zu%s\n", "overlapping holds (store at fault)", r->unexplained,
	       r->unexplained ? "  VIOLATED" : "");
	printf("  %-40s %8zu\n", "overlaps after a pause (lease ran out)", r->noverlaps - r->unexplained);
	printf("  %-40s %8zu%s\n", "fences out of grant order", r->nfence_bad, r->nfence_bad ? "  VIOLATED" : "");
	printf("  %-40s %8lld%s\n", "lost updates", (long long)r->lost_updates,
	       r->lost_updates ? "  VIOLATED" : "");
	printf("  %-40s %8zu%s\n", "stale writes accepted", r->stale_writes,
	       r->stale_writes ? "  VIOLATED" : "");
	printf("  %-40s %8.0f\n", "worst fault end -> next grant (ms)", ms(r->worst_heal_us));
	if (r->stuck)
		printf("  %-40s %8zu\n", "workers stuck in a call at the end", r->stuck);
	violation_lines(r, print_line, NULL);
	printf("\nverdict: %s\n", r->pass ? "PASS: no safety property was violated"
					 : "FAIL: at least one safety property was violated");
}

/* The run as one JSON object; `full` adds every hold (for the report). */
static void print_json(FILE *f, const check_opts *o, const char *shown, const results *r, bool full)
{
	fputs("{\"store\":", f);
	cli_json_str(f, shown);
	fputs(",\"name\":", f);
	cli_json_str(f, o->name);
	fprintf(f,
		",\"clients\":%u,\"duration_ms\":%.1f,\"ttl_ms\":%lld,\"hold_ms\":%lld,\"fencing\":%s,"
		"\"seed\":%" PRIu64 ",\"grants\":%zu,\"writes\":{\"accepted\":%lld,\"refused\":%lld,"
		"\"stale_accepted\":%zu},\"final_value\":%lld,\"errors\":%zu,"
		"\"overlaps\":%zu,\"overlaps_after_pause\":%zu,\"fence_order_violations\":%zu,"
		"\"lost_updates\":%lld,\"stale_writes_accepted\":%zu,\"worst_heal_to_grant_ms\":%.1f,\"workers_stuck\":%zu,"
		"\"faults\":[",
		o->clients, ms(r->end_us), (long long)o->ttl_ms, (long long)o->hold_ms,
		o->fencing ? "true" : "false", o->seed, r->nholds, (long long)r->reg.accepted,
		(long long)r->reg.rejected, r->stale_writes, (long long)r->reg.value, r->errors,
		r->unexplained, r->noverlaps - r->unexplained, r->nfence_bad, (long long)r->lost_updates,
		r->stale_writes, ms(r->worst_heal_us), r->stuck);
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *x = &r->faults[k];
		fprintf(f, "%s{\"kind\":\"%s\",\"worker\":%d,\"member\":%d,\"start_ms\":%.1f,\"end_ms\":%.1f,"
			   "\"ok\":%s,\"heal_to_grant_ms\":%.1f,\"split_ms\":%.1f,\"dropped_bytes\":%lld,\"note\":",
			k ? "," : "", fault_name(x->kind), x->slot, x->member, ms(x->start_us), ms(x->end_us),
			x->ok ? "true" : "false", x->heal_to_grant_us < 0 ? -1.0 : ms(x->heal_to_grant_us),
			x->split_us < 0 ? -1.0 : ms(x->split_us), x->dropped);
		cli_json_str(f, x->note);
		fputc('}', f);
	}
	fputs("],\"violations\":[", f);
	size_t n = 0;
	for (size_t i = 0; i < r->noverlaps; i++) {
		const pair *p = &r->overlaps[i];
		if (p->explained)
			continue;
		const hold *a = &r->holds[p->a], *b = &r->holds[p->b];
		fprintf(f, "%s{\"kind\":\"overlap\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"grant_ms\":%.1f,"
			   "\"end_ms\":%.1f},\"b\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"grant_ms\":%.1f,\"end_ms\":%.1f}}",
			n++ ? "," : "", a->slot, a->fence, ms(a->t_grant), ms(a->t_end), b->slot, b->fence,
			ms(b->t_grant), ms(b->t_end));
		if (n >= 100)
			break; /* all are counted above; a sample is enough here */
	}
	for (size_t i = 0; i < r->nfence_bad; i++) {
		const hold *a = &r->holds[r->fence_bad[i].a], *b = &r->holds[r->fence_bad[i].b];
		fprintf(f, "%s{\"kind\":\"fence_order\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"grant_ms\":%.1f},"
			   "\"b\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"grant_ms\":%.1f}}",
			n++ ? "," : "", a->slot, a->fence, ms(a->t_grant), b->slot, b->fence, ms(b->t_grant));
	}
	for (size_t i = 0; i < r->nholds; i++) {
		const hold *h = &r->holds[i];
		if (!h->stale_write)
			continue;
		fprintf(f, "%s{\"kind\":\"stale_write\",\"a\":{\"worker\":%d,\"fence\":%" PRIu64 ",\"write_ms\":%.1f}}",
			n++ ? "," : "", h->slot, h->fence, ms(h->t_write));
	}
	fputc(']', f);
	if (full) {
		fputs(",\"holds\":[", f);
		for (size_t i = 0; i < r->nholds; i++) {
			const hold *h = &r->holds[i];
			fprintf(f, "%s{\"w\":%d,\"inc\":%d,\"fence\":%" PRIu64 ",\"req\":%.1f,\"grant\":%.1f,"
				   "\"end\":%.1f,\"write\":%.1f,\"write_ok\":%d,\"stale\":%s,\"paused\":%s,"
				   "\"killed\":%s,\"lost\":%s}",
				i ? "," : "", h->slot, h->inc, h->fence, ms(h->t_req), ms(h->t_grant),
				ms(h->t_end), h->t_write < 0 ? -1.0 : ms(h->t_write), h->write_ok,
				h->stale_write ? "true" : "false", h->paused ? "true" : "false",
				h->killed ? "true" : "false",
				h->t_lost >= 0 && h->t_lost <= h->t_end ? "true" : "false");
		}
		fputs("],\"overlap_pairs\":[", f);
		for (size_t i = 0; i < r->noverlaps; i++)
			fprintf(f, "%s[%d,%d,%.1f,%.1f,%s]", i ? "," : "", r->overlaps[i].a, r->overlaps[i].b,
				ms(r->overlaps[i].from_us), ms(r->overlaps[i].to_us),
				r->overlaps[i].explained ? "true" : "false");
		fputc(']', f);
	}
	fprintf(f, ",\"verdict\":\"%s\"}\n", r->pass ? "pass" : "fail");
}

/* ---- the HTML report (readable without JavaScript) ---------------------------- */

static void html_line(void *ctx, const char *line)
{
	FILE *f = ctx;
	fputs("<li>", f);
	cli_html(f, line);
	fputs("</li>\n", f);
}

static void html_row(FILE *f, const char *what, long long v, bool safety)
{
	fputs("<tr><td>", f);
	cli_html(f, what);
	fprintf(f, "</td><td class=\"n%s\">%lld</td></tr>\n", safety ? (v ? " bad" : " good") : "", v);
}

/* The body: summary, verdict table, violation lines, static SVG timeline
 * (wider for longer runs, in a box that scrolls), faults table. */
static void write_report(FILE *f, const check_opts *o, const char *shown, const results *r)
{
	fputs("<div id=\"summary\"><p>store ", f);
	cli_html(f, shown);
	fputs(" \u2014 lock ", f);
	cli_html(f, o->name);
	fprintf(f, " \u2014 %u clients, %.1f s, ttl %lld ms, hold %lld ms, fencing %s, seed %" PRIu64 "</p>\n",
		o->clients, ms(r->end_us) / 1000.0, (long long)o->ttl_ms, (long long)o->hold_ms,
		o->fencing ? "on" : "off", o->seed);
	fprintf(f, "<div class=\"verdict %s\">%s</div></div>\n", r->pass ? "good" : "bad",
		r->pass ? "PASS: no safety property was violated" : "FAIL: a safety property was violated");
	size_t reads_refused = 0;
	for (size_t i = 0; i < r->nholds; i++)
		reads_refused += r->holds[i].read_ok == 0;
	fputs("<div id=\"verdicts\"><table><tr><th>property</th><th>count</th></tr>\n", f);
	html_row(f, "overlapping holds (store at fault)", (long long)r->unexplained, true);
	html_row(f, "overlaps after a pause (lease ran out while stopped)", (long long)(r->noverlaps - r->unexplained), false);
	html_row(f, "fences out of grant order", (long long)r->nfence_bad, true);
	html_row(f, "lost updates", (long long)r->lost_updates, true);
	html_row(f, "stale writes accepted", (long long)r->stale_writes, true);
	html_row(f, "grants", (long long)r->nholds, false);
	html_row(f, "writes accepted", (long long)r->reg.accepted, false);
	html_row(f, "writes refused (stale fence)", (long long)r->reg.rejected, false);
	html_row(f, "reads refused (stale fence)", (long long)reads_refused, false);
	html_row(f, "final register value", (long long)r->reg.value, false);
	html_row(f, "worst fault end \u2192 next grant (ms)", (long long)(r->worst_heal_us / 1000), false);
	html_row(f, "store errors seen by workers", (long long)r->errors, false);
	fputs("</table></div>\n", f);
	fputs("<h2>Violations</h2>\n<ul id=\"violation-lines\">\n", f);
	violation_lines(r, html_line, f);
	if (r->noverlaps == 0 && r->nfence_bad == 0 && r->stale_writes == 0 && r->lost_updates == 0)
		fputs("<li>none</li>\n", f);
	fputs("</ul>\n<h2>Timeline</h2>\n", f);
	cli_check_report_legend(f);

	/* geometry: 60 px per second at least, so a long run is wide and scrolls */
	double end = ms(r->end_us);
	for (size_t i = 0; i < r->nholds; i++)
		end = ms(r->holds[i].t_end) > end ? ms(r->holds[i].t_end) : end;
	for (size_t k = 0; k < r->nfaults; k++)
		end = ms(r->faults[k].end_us) > end ? ms(r->faults[k].end_us) : end;
	if (end <= 0)
		end = 1;
	const double L = 90, R = 20, RH = 30, TOP = 24;
	double W = end / 1000.0 * 60 > 1200 ? end / 1000.0 * 60 : 1200;
	double H = TOP + o->clients * RH + 30;
#define X(v) (L + (W - L - R) * (v) / end)
	fprintf(f, "<div id=\"timeline\"><svg id=\"timeline-svg\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
		   "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" preserveAspectRatio=\"none\">\n",
		W, H, W, H);
	double step = pow(10, floor(log10(end / 5)));
	if (end / step > 12)
		step *= 2;
	if (end / step > 12)
		step *= 2.5;
	while (end / step > 12 * W / 1200)
		step *= 2;
	for (double v = 0; v <= end; v += step) {
		fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#eee\"/>", X(v), X(v), TOP - 4,
			H - 24);
		if (v >= 1000)
			fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g s</text>\n", X(v), H - 8, v / 1000);
		else
			fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g ms</text>\n", X(v), H - 8, v);
	}
	for (unsigned i = 0; i < o->clients; i++)
		fprintf(f, "<text x=\"6\" y=\"%.0f\">worker %u</text><line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" "
			   "stroke=\"#f3f3f3\"/>\n",
			TOP + i * RH + RH / 2 + 4, i, L, W - R, TOP + (i + 1) * RH, TOP + (i + 1) * RH);
	for (size_t k = 0; k < r->nfaults; k++) {
		const fault *x = &r->faults[k];
		bool all = x->slot < 0;
		double y = all ? TOP : TOP + x->slot * RH, hh = all ? o->clients * RH : RH;
		double w = X(ms(x->end_us)) - X(ms(x->start_us));
		fprintf(f, "<rect class=\"fault\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"#bbb\" "
			   "fill-opacity=\"0.45\"><title>%s: %.0f\u2013%.0f ms",
			X(ms(x->start_us)), y, w > 2 ? w : 2, hh, fault_name(x->kind), ms(x->start_us), ms(x->end_us));
		if (!x->ok) {
			fputs(" (failed: ", f);
			cli_html(f, x->note);
			fputc(')', f);
		}
		fprintf(f, "</title></rect><text x=\"%.1f\" y=\"%.0f\">%s</text>\n", X(ms(x->start_us)) + 2, TOP - 8,
			fault_name(x->kind));
	}
	for (size_t i = 0; i < r->nholds; i++) {
		const hold *x = &r->holds[i];
		double y = TOP + x->slot * RH + 5, w = X(ms(x->t_end)) - X(ms(x->t_grant));
		if (w < 1.5)
			w = 1.5;
		char text[160];
		hold_text(text, sizeof text, x);
		fprintf(f, "<rect class=\"hold\" data-fence=\"%" PRIu64 "\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" "
			   "rx=\"2\" fill=\"%s\"><title>%s</title></rect>",
			x->fence, X(ms(x->t_grant)), y, w, RH - 10, x->killed ? "#777" : x->paused ? "#d9a030" : "#4a7fc1",
			text);
		char label[24];
		int n = snprintf(label, sizeof label, "%" PRIu64, x->fence);
		if (w > 7 * n + 4)
			fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#fff\">%s</text>",
				X(ms(x->t_grant)) + w / 2, y + RH / 2, label);
		if (x->t_write >= 0) {
			const char *c = x->stale_write ? "#f0f" : x->write_ok == 1 ? "#2a2" : "#000";
			fprintf(f, "<line class=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
				   "stroke-width=\"2.5\"/>",
				x->stale_write ? "write stale" : x->write_ok == 1 ? "write" : "write refused",
				X(ms(x->t_write)), X(ms(x->t_write)), y - 3, y + RH - 7, c);
		}
		if (x->read_ok == 0 && x->t_read >= 0)
			fprintf(f, "<circle class=\"marker refused\" cx=\"%.1f\" cy=\"%.0f\" r=\"3\" fill=\"#000\">"
				   "<title>read refused: fence %" PRIu64 " is stale</title></circle>",
				X(ms(x->t_read)), y - 2, x->fence);
		fputc('\n', f);
	}
	for (size_t i = 0; i < r->noverlaps; i++) {
		const pair *p = &r->overlaps[i];
		for (int k = 0; k < 2; k++) {
			const hold *x = &r->holds[k ? p->b : p->a];
			double w = X(ms(p->to_us)) - X(ms(p->from_us));
			fprintf(f, "<rect class=\"overlap\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"#e00\" "
				   "fill-opacity=\"0.75\"><title>overlap of fences %" PRIu64 " and %" PRIu64
				   " from %.1f to %.1f ms%s</title></rect>\n",
				X(ms(p->from_us)), TOP + x->slot * RH + 5, w > 1.5 ? w : 1.5, RH - 10,
				r->holds[p->a].fence, r->holds[p->b].fence, ms(p->from_us), ms(p->to_us),
				p->explained ? " (holder was paused: its lease ran out)" : "");
		}
	}
	for (size_t i = 0; i < r->nfence_bad; i++) {
		const hold *a = &r->holds[r->fence_bad[i].a], *b = &r->holds[r->fence_bad[i].b];
		double cx = X(ms(b->t_grant)), cy = TOP + b->slot * RH + 3;
		fprintf(f, "<path class=\"marker fence-order\" d=\"M%.1f %.1f l-5 -8 h10 z\" fill=\"#f80\"><title>fence %" PRIu64
			   " granted after fence %" PRIu64 " (worker %d): out of order</title></path>\n",
			cx, cy, b->fence, a->fence, a->slot);
	}
#undef X
	fputs("</svg></div>\n", f);
	if (r->nfaults) {
		fputs("<h2>Faults</h2>\n<table id=\"faults\"><tr><th>fault</th><th>target</th><th>start ms</th><th>end ms</th>"
		      "<th>end \u2192 next grant ms</th><th>note</th></tr>\n",
		      f);
		for (size_t k = 0; k < r->nfaults; k++) {
			const fault *x = &r->faults[k];
			char target[32] = "server";
			if (x->slot >= 0)
				snprintf(target, sizeof target, "worker %d", x->slot);
			else if (x->member >= 0)
				snprintf(target, sizeof target, "member %d", x->member);
			else if (x->kind & F_NET)
				snprintf(target, sizeof target, "every worker");
			fprintf(f, "<tr><td>%s</td><td>%s</td><td class=\"n\">%.0f</td><td class=\"n\">%.0f</td><td class=\"n\">",
				fault_name(x->kind), target, ms(x->start_us), ms(x->end_us));
			if (x->heal_to_grant_us < 0)
				fputs("none", f);
			else
				fprintf(f, "%.0f", ms(x->heal_to_grant_us));
			fputs("</td><td>", f);
			if (!x->ok)
				fputs("FAILED: ", f);
			cli_html(f, x->note);
			fputs("</td></tr>\n", f);
		}
		fputs("</table>\n", f);
	}
}

/* ---- the run ----------------------------------------------------------------- */

static bool pick_holder(run_ctx *c, uint64_t *rs, int *slot)
{
	int cand[MAX_CLIENTS], n = 0;
	for (unsigned i = 0; i < c->o->clients; i++)
		if (atomic_load(&c->sh->holding[i]) != 0)
			cand[n++] = (int)i;
	if (n == 0)
		return false;
	*slot = cand[rnd_below(rs, (uint64_t)n)];
	return true;
}

/* Collect exited workers; one that failed on its own (store down during a
 * restart) is replaced, a bounded number of times so a dead store cannot make
 * us fork in a loop. */
static void reap(run_ctx *c, pid_t *pids, int *incs, bool respawn)
{
	int st;
	pid_t p;
	while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
		for (unsigned i = 0; i < c->o->clients; i++) {
			if (pids[i] != p)
				continue;
			pids[i] = 0;
			bool failed = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
			if (respawn && failed && incs[i] < 100 && now_us() < c->deadline_us)
				pids[i] = spawn_worker(c, (int)i, ++incs[i]);
		}
	}
}

/* Wait (briefly) for someone to hold the lock: a fault aimed at a holder. */
static int aim_at_holder(run_ctx *c, uint64_t *rs)
{
	int slot = -1;
	int64_t until = now_us() + (c->o->ttl_ms + c->o->hold_ms) * 1000;
	while (!pick_holder(c, rs, &slot) && now_us() < until)
		sleep_ms(5);
	return slot;
}

/* A network fault through the proxy: `mode` on worker `slot`'s routes (-1:
 * all) for ms, then pass again. */
static void net_fault(run_ctx *c, int slot, const char *mode, int64_t ms, fault *f)
{
	struct proxy *px = c->px;
	long long d0 = proxy_dropped(px, slot);
	f->start_us = now_us();
	if (proxy_set(px, slot, mode) != 0) {
		snprintf(f->note, sizeof f->note, "the fault proxy refused '%s'", mode);
		proxy_set(px, slot, "pass");
		f->end_us = now_us();
		return;
	}
	f->start_us = now_us();
	fault_sleep_ms(ms);
	f->end_us = now_us();
	long long d1 = proxy_dropped(px, slot);
	if (proxy_set(px, slot, "pass") != 0) {
		snprintf(f->note, sizeof f->note, "the fault proxy did not return to pass");
		return;
	}
	f->dropped = d0 >= 0 && d1 >= 0 ? d1 - d0 : -1;
	f->ok = 1;
}

/* Every process of the server: SIGSTOP (stop=true) or SIGCONT, through the
 * script where it offers pause/resume (Redis, Redlock: every master), else
 * by the pids the scripts keep in DIR. Returns how many it reached. */
static int pause_servers(run_ctx *c, bool stop, pid_t *pids, int npids)
{
	const check_opts *o = c->o;
	bool mfile;
	int n = count_members(o->server_dir, &mfile);
	if (!mfile && n > 0 && script_offers(o->server_script, "pause")) {
		int done = 0;
		for (int i = 0; i < n; i++) {
			char idx[16];
			snprintf(idx, sizeof idx, "%d", i);
			done += run_script(o->work_dir, o->server_script, stop ? "pause" : "resume", o->server_dir,
					   idx) == 0;
		}
		return done;
	}
	int done = 0;
	for (int i = 0; i < npids; i++)
		done += kill(pids[i], stop ? SIGSTOP : SIGCONT) == 0;
	return done;
}

/* Carry out one fault; fills f. */
static void do_fault(run_ctx *c, unsigned kind, uint64_t *rs, pid_t *pids, int *incs, fault *f)
{
	const check_opts *o = c->o;
	memset(f, 0, sizeof *f);
	f->kind = kind;
	f->slot = f->inc = f->member = -1;
	f->dropped = -1;
	if (kind == F_PAUSE || kind == F_KILL || kind == F_PARTITION || kind == F_FDELETE) {
		int slot = aim_at_holder(c, rs);
		if (slot < 0 && kind == F_PARTITION)
			slot = (int)rnd_below(rs, o->clients); /* a waiter's link fails too */
		f->start_us = now_us();
		if (slot < 0 || pids[slot] <= 0) {
			snprintf(f->note, sizeof f->note, "no holder to aim at");
			f->end_us = f->start_us;
			return;
		}
		f->slot = slot;
		f->inc = incs[slot];
		if (kind == F_PARTITION) {
			net_fault(c, slot, "blackhole", o->pause_ms, f);
			if (f->ok)
				snprintf(f->note, sizeof f->note, "black hole for %lldms, %lld bytes discarded",
					 (long long)o->pause_ms, f->dropped);
			return;
		}
		if (kind == F_FDELETE) {
			const char *sfx[] = { "", "-wal", "-shm", "-journal" };
			char path[PATH_MAX];
			f->start_us = now_us();
			int rc = unlink(c->db_path), e = errno;
			for (size_t i = 1; i < sizeof sfx / sizeof *sfx; i++) {
				snprintf(path, sizeof path, "%.4000s%s", c->db_path, sfx[i]);
				unlink(path);
			}
			f->end_us = now_us();
			f->ok = rc == 0;
			/* Everyone but the holder opens the store again, as processes
			 * started now would: they make a new file, the holder must
			 * learn that its lock is gone. */
			for (unsigned i = 0; i < o->clients; i++)
				if ((int)i != slot)
					atomic_store(&c->sh->reopen[i], 1);
			if (rc == 0)
				snprintf(f->note, sizeof f->note, "deleted %.120s (and -wal, -shm); the others reopen",
					 c->db_path);
			else
				snprintf(f->note, sizeof f->note, "unlink %.120s: %s", c->db_path, strerror(e));
			return;
		}
		if (kind == F_PAUSE) {
			kill(pids[slot], SIGSTOP);
			f->start_us = now_us();
			fault_sleep_ms(o->pause_ms);
			f->end_us = now_us();
			kill(pids[slot], SIGCONT);
		} else {
			f->start_us = now_us();
			kill(pids[slot], SIGKILL);
			int st;
			while (waitpid(pids[slot], &st, 0) < 0 && errno == EINTR)
				;
			f->end_us = now_us();
			pids[slot] = spawn_worker(c, slot, ++incs[slot]);
		}
		f->ok = 1;
		return;
	}
	if (kind == F_LOSE) {
		int slot = (int)rnd_below(rs, o->clients);
		int64_t len = o->ttl_ms / 4 + (int64_t)rnd_below(rs, (uint64_t)(o->ttl_ms * 3 / 4 + 1));
		f->slot = slot;
		f->inc = incs[slot];
		net_fault(c, slot, "drop", len, f);
		if (f->ok)
			snprintf(f->note, sizeof f->note, "replies dropped for %lldms, %lld bytes discarded",
				 (long long)len, f->dropped);
		return;
	}
	if (kind == F_DELAY) {
		int slot = rnd_below(rs, 2) ? (int)rnd_below(rs, o->clients) : -1;
		char mode[48];
		snprintf(mode, sizeof mode, "delay %lld", (long long)o->delay_ms);
		f->slot = slot;
		f->inc = slot >= 0 ? incs[slot] : -1;
		net_fault(c, slot, mode, o->pause_ms, f);
		f->dropped = -1;
		if (f->ok)
			snprintf(f->note, sizeof f->note, "%lldms each way for %lldms, %s", (long long)o->delay_ms,
				 (long long)o->pause_ms, slot < 0 ? "every worker" : "one worker");
		return;
	}
	f->start_us = now_us();
	if (!o->server_script || !o->server_dir) {
		snprintf(f->note, sizeof f->note, "needs --server-script and --server-dir");
		f->end_us = f->start_us;
		return;
	}
	if (kind == F_RESTART) {
		/* Redis needs a kill before its restart; others refuse `kill` (harmless). */
		run_script(o->work_dir, o->server_script, "kill", o->server_dir, NULL);
		int rc = run_script(o->work_dir, o->server_script, "restart", o->server_dir, NULL);
		f->end_us = now_us();
		f->ok = rc == 0;
		if (rc != 0)
			snprintf(f->note, sizeof f->note, "%s restart exited %d (see server.log)",
				 o->server_script, rc);
		return;
	}
	if (kind == F_SPAUSE) {
		pid_t sp[256];
		int np = server_pids(o->server_dir, sp, 256);
		f->start_us = now_us();
		int n = pause_servers(c, true, sp, np);
		f->start_us = now_us();
		if (n > 0)
			fault_sleep_ms(o->pause_ms);
		f->end_us = now_us();
		int m = pause_servers(c, false, sp, np);
		f->ok = n > 0 && m == n;
		snprintf(f->note, sizeof f->note, "%d server process%s stopped for %lldms%s", n, n == 1 ? "" : "es",
			 (long long)o->pause_ms, m == n ? "" : "; NOT ALL CONTINUED");
		if (n == 0)
			snprintf(f->note, sizeof f->note, "no server process found in %.120s", o->server_dir);
		return;
	}
	if (kind == F_FAILOVER) {
		int rc = run_script(o->work_dir, o->server_script, "kill-master", o->server_dir, NULL);
		f->end_us = now_us();
		f->ok = rc == 0;
		c->failed_over = true;
		if (rc == 0)
			snprintf(f->note, sizeof f->note, "master killed; Sentinel promotes the replica");
		else
			snprintf(f->note, sizeof f->note, "kill-master exited %d (see server.log)", rc);
		return;
	}
	bool mfile;
	int n = count_members(o->server_dir, &mfile);
	if (n < 1 || (kind == F_MRESTART && mfile)) {
		snprintf(f->note, sizeof f->note, "no %s listed in %.120s", kind == F_MRESTART ? "Redis masters" : "members",
			 o->server_dir);
		f->end_us = f->start_us;
		return;
	}
	char idx[16];
	int rc;
	if (kind == F_MRESTART) {
		/* A rolling restart without the delayed-restart rule: each master comes
		 * back at once, empty unless it runs with AOF, ttl/2 after the previous
		 * one (time for a renewal round in between). */
		int first = (int)rnd_below(rs, (uint64_t)n), bad = 0;
		size_t off = (size_t)snprintf(f->note, sizeof f->note, "restarted masters");
		for (int k = 0; k < n && !interrupted; k++) {
			int i = (first + k) % n;
			if (k > 0)
				fault_sleep_ms(o->ttl_ms / 2);
			snprintf(idx, sizeof idx, "%d", i);
			run_script(o->work_dir, o->server_script, "kill", o->server_dir, idx);
			rc = run_script(o->work_dir, o->server_script, "restart", o->server_dir, idx);
			bad += rc != 0;
			if (off < sizeof f->note)
				off += (size_t)snprintf(f->note + off, sizeof f->note - off, " %d%s", i, rc ? "(FAILED)" : "");
		}
		char conf[PATH_MAX], line[256];
		snprintf(conf, sizeof conf, "%.4000s/0/redis.conf", o->server_dir);
		FILE *cf = fopen(conf, "r");
		bool aof = false;
		while (cf && fgets(line, sizeof line, cf))
			aof |= strncmp(line, "appendonly yes", 14) == 0;
		if (cf)
			fclose(cf);
		if (off < sizeof f->note)
			snprintf(f->note + off, sizeof f->note - off, aof ? " (with AOF)" : " (no persistence)");
		f->end_us = now_us();
		f->ok = bad == 0;
		return;
	}
	if (mfile) {
		int i = 1 + (int)rnd_below(rs, (uint64_t)n);
		f->member = i;
		snprintf(idx, sizeof idx, "%d", i);
		pid_t p = member_pid(o->server_dir, i);
		if (p > 0)
			kill(p, SIGKILL);
		fault_sleep_ms(o->pause_ms);
		rc = run_script(o->work_dir, o->server_script, "restart-member", o->server_dir, idx);
	} else {
		int i = (int)rnd_below(rs, (uint64_t)n);
		f->member = i;
		snprintf(idx, sizeof idx, "%d", i);
		run_script(o->work_dir, o->server_script, "kill", o->server_dir, idx);
		fault_sleep_ms(o->pause_ms);
		rc = run_script(o->work_dir, o->server_script, "restart", o->server_dir, idx);
	}
	f->end_us = now_us();
	f->ok = rc == 0;
	if (rc != 0)
		snprintf(f->note, sizeof f->note, "restarting member %s exited %d (see server.log)", idx, rc);
}

static void rm_work(const char *dir)
{
	const char *files[] = { "log", "register", "server.log" };
	char path[PATH_MAX];
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		snprintf(path, sizeof path, "%.4000s/%s", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
}

int cli_check(cli_global *g, int argc, char **argv)
{
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
	if ((o.faults & F_SERVER) && (!o.server_script || !o.server_dir))
		return cli_usage_error(g, "--faults restart/member/server-pause/member-restart/failover need "
					  "--server-script and --server-dir");
	if ((o.faults & F_FAILOVER) && !script_offers(o.server_script, "kill-master"))
		return cli_usage_error(g, "--faults failover: %s has no kill-master (use tests/servers/redis-sentinel.sh)",
				       o.server_script);
	if (o.faults & F_MRESTART) {
		bool mfile;
		if (count_members(o.server_dir, &mfile) < 1 || mfile || !script_offers(o.server_script, "restart"))
			return cli_usage_error(g, "--faults member-restart: not available here: needs Redis masters "
						  "started by tests/servers/redis.sh or redlock.sh (DIR/0/, DIR/1/, ...)");
	}
	if (o.faults & F_SPAUSE) {
		pid_t sp[256];
		bool mfile;
		int nm = count_members(o.server_dir, &mfile);
		if (server_pids(o.server_dir, sp, 256) == 0 && !(nm > 0 && !mfile && script_offers(o.server_script, "pause")))
			return cli_usage_error(g, "--faults server-pause: not available here: no server process found "
						  "in %s and %s has no pause", o.server_dir, o.server_script);
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
	if (o.faults & F_FDELETE) {
		if (shown && strncmp(shown, "sqlite:", 7) == 0)
			c.db_path = sqlite_path(c.uri);
		if (!c.db_path) {
			free(shown);
			return cli_usage_error(g, "--faults file-delete: not available on this store: it needs an sqlite store");
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
			free(shown);
			return CLI_EXIT_FAIL;
		}
	} else if (strlen(o.work_dir) > 4000) {
		free(c.db_path);
		free(shown);
		return cli_usage_error(g, "--work-dir: path too long");
	} else if (mkdir(o.work_dir, 0755) != 0 && errno != EEXIST) {
		cli_error(g, "--work-dir %s: %s", o.work_dir, strerror(errno));
		free(c.db_path);
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
		free(shown);
		return CLI_EXIT_FAIL;
	}
	close(reg_fd);
	memset(c.sh, 0, sizeof *c.sh);
	proxy px = { .pid = -1, .ctl = -1 };
	if (o.faults & F_NET) {
		char err[400];
		if (proxy_start(&px, &c, err, sizeof err) != 0) {
			close(c.log_fd);
			munmap(c.sh, sizeof *c.sh);
			if (own_dir)
				rm_work(o.work_dir);
			free(c.db_path);
			free(shown);
			return cli_usage_error(g, "--faults partition/lose-reply/delay: not available on this store: %s",
					       err);
		}
		c.px = &px;
	}

	cli_info(g, "%u workers on %s for %.1fs (ttl %lldms, hold %lldms, fencing %s, seed %" PRIu64
		 "); work dir %s",
		 o.clients, shown, (double)o.duration_ms / 1000.0, (long long)o.ttl_ms,
		 (long long)o.hold_ms, o.fencing ? "on" : "off", o.seed, o.work_dir);

	t0_us = mono_us();
	c.deadline_us = o.duration_ms * 1000;
	pid_t pids[MAX_CLIENTS] = { 0 };
	int incs[MAX_CLIENTS] = { 0 };
	for (unsigned i = 0; i < o.clients; i++)
		pids[i] = spawn_worker(&c, (int)i, 0);

	unsigned kinds[NKINDS];
	int nkinds = 0;
	for (unsigned k = F_PAUSE; k <= F_LAST; k <<= 1)
		if (o.faults & k)
			kinds[nkinds++] = k;
	fault *faults = calloc(MAX_FAULTS, sizeof *faults);
	size_t nfaults = 0;
	/* Two streams: the schedule (kinds, times) repeats exactly for a seed even
	 * though which worker holds the lock at a fault's time does not. */
	uint64_t rs = o.seed, rt = o.seed ^ 0x5DEECE66Dull;
	int64_t next_fault = (o.every_ms / 2 + (int64_t)rnd_below(&rs, (uint64_t)o.every_ms / 4 + 1)) * 1000;
	struct sigaction sa = { .sa_handler = on_signal }, old_int, old_term, old_hup;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	sigaction(SIGHUP, &sa, &old_hup);
	while (now_us() < c.deadline_us && !interrupted) {
		reap(&c, pids, incs, true);
		/* A fault ends early enough to see the next grant after it: a lease
		 * that ran out during it plus a hold (else heal_to_grant is -1 for
		 * want of time, not of liveness). */
		if (nkinds && faults && nfaults < MAX_FAULTS && now_us() >= next_fault &&
		    now_us() + (o.pause_ms + 2 * o.ttl_ms + o.hold_ms) * 1000 < c.deadline_us) {
			unsigned kind = kinds[rnd_below(&rs, (uint64_t)nkinds)];
			do_fault(&c, kind, &rt, pids, incs, &faults[nfaults]);
			cli_debug(g, "fault %s at %.0fms: %s", fault_name(kind), ms(faults[nfaults].start_us),
				  faults[nfaults].ok ? "done" : faults[nfaults].note);
			nfaults++;
			if (c.failed_over) /* once: no master is left to fail over */
				for (int k = 0; k < nkinds; k++)
					if (kinds[k] == F_FAILOVER)
						kinds[k] = kinds[--nkinds];
			next_fault = now_us() + (o.every_ms + (int64_t)rnd_below(&rs, (uint64_t)o.every_ms / 4 + 1)) * 1000;
			continue;
		}
		sleep_ms(10);
	}
	atomic_store(&c.sh->stop, 1);
	if (interrupted) {
		cli_error(g, "interrupted: stopping the workers; results so far follow");
		for (unsigned i = 0; i < o.clients; i++)
			if (pids[i] > 0) {
				kill(pids[i], SIGCONT);
				kill(pids[i], SIGTERM);
			}
	}
	/* Workers finish their hold and leave; one stuck past ttl+hold+10s is killed. */
	int64_t give_up = now_us() + (2 * o.ttl_ms + o.hold_ms + 10000) * 1000;
	size_t stuck = 0;
	for (;;) {
		reap(&c, pids, incs, false);
		bool any = false;
		for (unsigned i = 0; i < o.clients; i++)
			any |= pids[i] > 0;
		if (!any)
			break;
		if (now_us() > give_up) {
			for (unsigned i = 0; i < o.clients; i++)
				if (pids[i] > 0) {
					cli_error(g, "worker %u did not stop (a call into the store hangs?); killing it", i);
					kill(pids[i], SIGKILL);
					stuck++;
				}
			give_up = INT64_MAX;
		}
		sleep_ms(10);
	}
	int64_t end_us = now_us();
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
	if (!reg_ok || read_log(log_path, &r) != 0) {
		cli_error(g, "cannot read back %s: %s", o.work_dir, strerror(errno));
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	analyse(&r, &o);
	if (r.nholds == 0 && r.errors > 0) {
		cli_error(g, "no worker ever got the lock (%zu errors; see %s/log)", r.errors, o.work_dir);
		own_dir = false;
	}
	if (g->json)
		print_json(stdout, &o, shown, &r, false);
	else
		print_text(&o, shown, &r);
	if (o.report) {
		char *buf = NULL;
		size_t len = 0;
		FILE *mf = open_memstream(&buf, &len);
		FILE *rf = NULL;
		if (mf) {
			print_json(mf, &o, shown, &r, true);
			fclose(mf);
		}
		if (buf)
			rf = fopen(o.report, "w");
		if (rf) {
			cli_check_report_begin(rf);
			write_report(rf, &o, shown, &r);
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
	if (interrupted && rc == CLI_EXIT_OK)
		rc = 128 + SIGINT;
out:
	proxy_stop(&px);
	for (unsigned i = 0; i < o.clients; i++)
		free(c.worker_uri[i]);
	free(c.db_path);
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
