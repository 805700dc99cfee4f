/*
 * run.c — `dlock run NAME -- COMMAND...`: hold a lock while a command runs.
 *
 * Threads and events. Every signal we care about is blocked in every thread
 * (the mask is set before the store is opened, so the library's renewal
 * thread inherits it) and taken by one signal thread with sigwait(). That
 * thread and the lock's on_lost callback (which runs on the renewal thread)
 * only write one byte each into a non-blocking self-pipe; the main thread
 * polls that pipe and reaps the child. No sleeps stand in for events.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char help[] =
	"Usage: dlock run [OPTIONS] NAME [--] COMMAND [ARG...]\n"
	"       dlock run [OPTIONS] NAME -c 'COMMAND STRING'\n"
	"       dlock run [OPTIONS] --hold NAME           (hold until interrupted)\n"
	"       dlock run [OPTIONS] -- NAME [--] COMMAND [ARG...]   (NAME starting with '-')\n"
	"\n"
	"Acquire lock NAME, run COMMAND while holding it (renewing the lease in the\n"
	"background), release it when COMMAND exits, and exit with COMMAND's status\n"
	"(128+N if it died of signal N). Options go before COMMAND; the first word\n"
	"after NAME that is not an option starts COMMAND. COMMAND runs in its own\n"
	"process group with DLOCK_NAME and DLOCK_FENCE (the lock's fencing token) in\n"
	"its environment; stdin, stdout and stderr are passed through. SIGINT,\n"
	"SIGTERM, SIGHUP and SIGQUIT sent to dlock are forwarded to COMMAND's process\n"
	"group; if COMMAND dies of a signal after that, dlock releases the lock and\n"
	"dies of the signal it received (so a shell loop around it stops). Signals\n"
	"that were ignored when dlock started stay ignored.\n"
	"\n"
	"With --hold and no COMMAND, dlock takes the lock, prints its fencing token on\n"
	"stdout (with --json: {\"name\",\"fence\",\"ttl_ms\"}), holds it until\n"
	"SIGINT, SIGTERM, SIGHUP or SIGQUIT, releases it and dies of that signal.\n"
	"Without --hold a missing COMMAND is a usage error (64).\n"
	"\n"
	"COMMAND's whole process group is gone before the lease can end on the store.\n"
	"Once the lease is at risk (less than a third of the TTL left unconfirmed:\n"
	"renewals fail or do not answer), dlock says so, sends SIGTERM to COMMAND's\n"
	"process group, then SIGKILL early enough to land before the lease ends\n"
	"(TTL/10 before the deadline, 20ms to 3s; --kill-after can only make it\n"
	"sooner), waits until the group is gone and exits 76. A loss the store reports\n"
	"is met with SIGKILL at once. If dlock itself is killed (SIGKILL, the OOM\n"
	"killer) or stopped, a watcher process that knows the lease deadline does the\n"
	"same, and on stores whose locks live with a session (PostgreSQL advisory,\n"
	"MySQL get_lock, ZooKeeper) it keeps the store's connection open until the\n"
	"group is gone, so the lock outlives the command. No descriptor that dlock\n"
	"opened reaches COMMAND; those passed to dlock do, as with flock.\n"
	"\n"
	"  --ttl D         lease length (default: the store's, 30s unless its URI says ttl=)\n"
	"  --wait D        wait at most D for the lock (default: forever)\n"
	"  --no-wait       try once; exit 75 at once if the lock is held\n"
	"  -E, --conflict-exit-code N\n"
	"                  exit N (0-255) instead of 75 when the lock was not acquired\n"
	"  -c, --command S run S with /bin/sh -c instead of COMMAND [ARG...]\n"
	"  --hold          no COMMAND: hold the lock until interrupted\n"
	"  --shared        shared (read) lock: many shared holders, no exclusive one\n"
	"  --permits N     semaphore: up to N holders at once\n"
	"  --fair          first come, first served among waiters\n"
	"  --kill-after D  SIGKILL at most this long after SIGTERM (default 10s; the\n"
	"                  lease deadline may make it sooner, never later)\n"
	"\n%s"
	"\nWhile waiting for a store that does not answer, dlock says so on stderr\n"
	"(unless -q) and again every 30s; it keeps trying until --wait ends.\n"
	"\nExit codes: COMMAND's status; 64 bad usage; 69 store unavailable; 75 (or -E)\n"
	"not acquired in time; 76 lock lost while COMMAND ran; 126/127 COMMAND could\n"
	"not be run / not found; 1 other failures.\n";

enum { OPT_KILL_AFTER = 1, OPT_CONFLICT, OPT_COMMAND, OPT_HOLD };

static const cli_opt opts[] = {
	{ "ttl", 0, true, CLI_OPT_TTL },
	{ "wait", 0, true, CLI_OPT_WAIT },
	{ "no-wait", 0, false, CLI_OPT_NO_WAIT },
	{ "shared", 0, false, CLI_OPT_SHARED },
	{ "permits", 0, true, CLI_OPT_PERMITS },
	{ "fair", 0, false, CLI_OPT_FAIR },
	{ "kill-after", 0, true, OPT_KILL_AFTER },
	{ "conflict-exit-code", 'E', true, OPT_CONFLICT },
	{ "command", 'c', true, OPT_COMMAND },
	{ "hold", 0, false, OPT_HOLD },
	{ NULL, 0, false, 0 },
};

typedef struct ctx {
	cli_global *g;
	cli_lockopts lo;
	int64_t kill_after_ms;
	int conflict_code;     /* exit code for "not acquired" */
	const char *shell_cmd; /* -c */
	bool hold;             /* --hold: no COMMAND, hold until interrupted */
} ctx;

static int on_opt(void *p, int id, const char *value)
{
	ctx *c = p;
	if (id == OPT_KILL_AFTER)
		return cli_duration(c->g, "--kill-after", value, &c->kill_after_ms);
	if (id == OPT_CONFLICT) {
		char *end;
		errno = 0;
		long v = strtol(value, &end, 10);
		if (!*value || *end || errno || v < 0 || v > 255)
			return cli_usage_error(c->g, "--conflict-exit-code: expected 0 to 255, got '%s'", value);
		c->conflict_code = (int)v;
		return 0;
	}
	if (id == OPT_HOLD) {
		c->hold = true;
		return 0;
	}
	if (id == OPT_COMMAND) {
		if (c->shell_cmd)
			return cli_usage_error(c->g, "-c given twice");
		c->shell_cmd = value;
		return 0;
	}
	return cli_lockopt(c->g, &c->lo, id, value);
}

/* ---- events: one byte per event through a self-pipe ---- */

#define EV_LOST 100 /* above every signal number */

static int ev_pipe[2] = { -1, -1 };
static atomic_llong lost_wall_ms;
/* Why: dlock_lost_reason of the lock, taken by on_lost (static text). */
static _Atomic(const char *) lost_why;
static _Atomic int64_t lease_deadline; /* CLOCK_MONOTONIC ms, last seen by the main loop */

static sigset_t handled; /* taken by the signal thread */
static atomic_bool sig_stop; /* the signal thread ends at its next signal (a SIGCHLD sent to it) */
static pthread_mutex_t phase_mu = PTHREAD_MUTEX_INITIALIZER;
/* Under phase_mu. Before the lock is held a signal kills us; after, it is forwarded. */
static enum { PHASE_ACQUIRING, PHASE_HOLDING } phase;

static void post(unsigned char ev)
{
	/* Non-blocking: if the pipe is full the main loop has plenty to wake for. */
	ssize_t r = write(ev_pipe[1], &ev, 1);
	(void)r;
}

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs on the library's renewal thread: record when, wake the main loop, return. */
static void on_lost(dlock_lock *lock, void *payload)
{
	(void)payload;
	atomic_store(&lost_why, dlock_lost_reason(lock));
	long long zero = 0;
	atomic_compare_exchange_strong(&lost_wall_ms, &zero, (long long)wall_ms());
	post(EV_LOST);
}

/*
 * Runs inside dlock_acquire on the main thread while a wait goes on: say
 * that the store does not answer, at once and then every REMIND_MS, and
 * when it answers again. A wait that outlasts an outage is not silent.
 */
#define REMIND_MS 30000

typedef struct waitinfo {
	const cli_global *g;
	const char *name;
	int64_t said_at; /* CLOCK_MONOTONIC ms of the last "unreachable" message; 0: none */
	bool down;
} waitinfo;

static void on_unreachable(dlock_lock *lock, int rc, const char *message, void *payload)
{
	(void)lock;
	waitinfo *w = payload;
	int64_t now = cli_mono_ms();
	if (rc == 0) {
		if (w->down)
			cli_info(w->g, "the store answers again; still waiting for lock '%s'", w->name);
		w->down = false;
		w->said_at = 0;
		return;
	}
	w->down = true;
	if (w->said_at && now - w->said_at < REMIND_MS)
		return;
	w->said_at = now;
	cli_info(w->g,
		 "the store is unreachable (%s); still trying to acquire lock '%s' "
		 "(saying so every %ds until it answers)",
		 message && *message ? message : dlock_strerror(rc), w->name, REMIND_MS / 1000);
}

static void *signal_thread(void *arg)
{
	(void)arg;
	for (;;) {
		int sig;
		if (sigwait(&handled, &sig) != 0)
			continue;
		if (atomic_load(&sig_stop))
			return NULL;
		if (sig == SIGCHLD) {
			post((unsigned char)sig);
			continue;
		}
		pthread_mutex_lock(&phase_mu);
		if (phase == PHASE_ACQUIRING) {
			/*
			 * Still waiting for the lock (or never got it): nothing to
			 * forward to, so die of the signal as if we had no handler.
			 * Should the store have granted the lock a moment ago, the
			 * lease simply runs out: nothing renews it once we are gone.
			 */
			struct sigaction sa = { .sa_handler = SIG_DFL };
			sigemptyset(&sa.sa_mask);
			sigaction(sig, &sa, NULL);
			sigset_t one;
			sigemptyset(&one);
			sigaddset(&one, sig);
			pthread_sigmask(SIG_UNBLOCK, &one, NULL);
			raise(sig);
			_exit(128 + sig);
		}
		pthread_mutex_unlock(&phase_mu);
		post((unsigned char)sig);
	}
	return NULL;
}

static void on_sigchld(int sig)
{
	(void)sig; /* never runs: SIGCHLD stays blocked; a handler keeps it from being discarded */
}

/* ---- the command ---- */

/*
 * Find COMMAND on $PATH before taking the lock, so that a typo does not hold
 * a lock for nothing, and so that the forked child only calls execve().
 */
static char *find_command(const char *cmd)
{
	if (strchr(cmd, '/'))
		return strdup(cmd);
	const char *path = getenv("PATH");
	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	size_t clen = strlen(cmd);
	for (const char *p = path;; p++) {
		const char *end = strchr(p, ':');
		size_t dlen = end ? (size_t)(end - p) : strlen(p);
		char *full = malloc(dlen + clen + 3);
		if (!full)
			return NULL;
		if (dlen == 0)
			memcpy(full, ".", 2), dlen = 1;
		else
			memcpy(full, p, dlen);
		full[dlen] = '/';
		memcpy(full + dlen + 1, cmd, clen + 1);
		struct stat st;
		if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0)
			return full;
		free(full);
		if (!end)
			return NULL;
		p = end;
	}
}

/*
 * environ without DLOCK_NAME/DLOCK_FENCE, plus ours. DLOCK_STORE passes
 * unchanged, password included, so that a nested dlock uses the same store:
 * the child would have inherited it without us, and an environment is
 * readable only by its own user (/proc/PID/environ is 0400), unlike argv.
 * A DLOCK_STORE we did not use (--store given) that has user info is left
 * out: we cannot vouch for it.
 */
static char **child_env(const char *name, uint64_t fence, const cli_global *g, dlock_store *store)
{
	(void)store;
	size_t n = 0;
	while (environ && environ[n])
		n++;
	char **env = calloc(n + 3, sizeof *env);
	if (!env)
		return NULL;
	const char *se = getenv("DLOCK_STORE");
	bool from_env = !g->store && se && *se;
	bool drop = !from_env && se && strchr(se, '@');
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "DLOCK_NAME=", 11) != 0 && strncmp(environ[i], "DLOCK_FENCE=", 12) != 0 &&
		    !(drop && strncmp(environ[i], "DLOCK_STORE=", 12) == 0))
			env[k++] = environ[i];
	size_t nlen = strlen(name) + sizeof "DLOCK_NAME=";
	env[k] = malloc(nlen);
	env[k + 1] = malloc(48);
	if (!env[k] || !env[k + 1]) {
		free(env[k]);
		free(env[k + 1]);
		free(env);
		return NULL;
	}
	snprintf(env[k], nlen, "DLOCK_NAME=%s", name);
	snprintf(env[k + 1], 48, "DLOCK_FENCE=%llu", (unsigned long long)fence);
	return env;
}

static void free_env(char **env)
{
	if (!env)
		return;
	/* Ours start at DLOCK_NAME= (environ's own DLOCK_NAME was left out). */
	size_t i = 0;
	while (env[i] && strncmp(env[i], "DLOCK_NAME=", 11) != 0)
		i++;
	for (; env[i]; i++)
		free(env[i]);
	free(env);
}

typedef struct child {
	pid_t pid;        /* also the process group id */
	int status;       /* from waitpid, once exited */
	bool exited;
	bool tty;         /* we handed the terminal's foreground to the child */
} child;

/* ---- descriptors: the caller's reach COMMAND, dlock's own never ---- */

static int std_fds[] = { 0, 1, 2 };
static int *inherited = std_fds; /* open when dlock started, ascending */
static size_t n_inherited = 3;

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Before dlock opens anything: which descriptors the caller handed us (as
 * flock does, they reach COMMAND). Without /proc, the standard three. */
static void note_inherited(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	size_t cap = 16, n = 0;
	int *v = malloc(cap * sizeof *v);
	struct dirent *e;
	while (v && (e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || atoi(e->d_name) == dirfd(d))
			continue;
		if (n == cap) {
			int *nv = realloc(v, 2 * cap * sizeof *v);
			if (!nv) {
				free(v);
				v = NULL;
				break;
			}
			v = nv;
			cap *= 2;
		}
		v[n++] = atoi(e->d_name);
	}
	closedir(d);
	if (!v)
		return;
	qsort(v, n, sizeof *v, cmp_int);
	inherited = v;
	n_inherited = n;
}

/* Async-signal-safe: descriptors a..b close on exec. */
static void cloexec_range(unsigned a, unsigned b)
{
	if (a > b || close_range(a, b, CLOSE_RANGE_CLOEXEC) == 0)
		return;
	for (unsigned fd = a; fd <= b && fd < 65536; fd++) { /* kernels before 5.11 */
		int fl = fcntl((int)fd, F_GETFD);
		if (fl >= 0)
			fcntl((int)fd, F_SETFD, fl | FD_CLOEXEC);
	}
}

/*
 * In the forked child: everything dlock opened (store sockets, files, pipes,
 * whatever a store library made without close-on-exec, now or on a reconnect
 * a moment ago) closes on exec; what the caller gave dlock stays.
 */
static void cloexec_ours(void)
{
	unsigned lo = 0;
	for (size_t i = 0; i < n_inherited; i++) {
		unsigned fd = (unsigned)inherited[i];
		if (fd > lo)
			cloexec_range(lo, fd - 1);
		lo = fd + 1;
	}
	cloexec_range(lo, ~0U);
}

/* In the forked child: only async-signal-safe calls until execve. */
static struct sigaction sigchld_orig;

static void exec_child(const char *path, char **argv, char **env, const sigset_t *mask, bool tty, int errfd,
		       pid_t parent)
{
	setpgid(0, 0);
	/*
	 * Should dlock die (SIGKILL, the OOM killer), the command hears of it at
	 * once; the watcher (deadman_main) takes care of the rest of its group.
	 * If dlock died before the prctl, getppid() has changed already.
	 */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != parent)
		_exit(127);
	if (tty)
		tcsetpgrp(STDIN_FILENO, getpid()); /* SIGTTOU is blocked here */
	/* Ignored dispositions survive exec: hand over the ones dlock found. */
	sigaction(SIGCHLD, &sigchld_orig, NULL);
	sigaction(SIGPIPE, &cli_sigpipe_orig, NULL);
	sigprocmask(SIG_SETMASK, mask, NULL);
	cloexec_ours();
	execve(path, argv, env);
	int e = errno;
	ssize_t r = write(errfd, &e, sizeof e);
	(void)r;
	_exit(127);
}

/*
 * Start the command: vfork, so that neither dlock's page tables nor its
 * threads' TLBs pay for a copy the command drops at its exec (the child
 * runs on our memory, suspending us, until execve or _exit, and makes
 * system calls only). In a function of its own so that no variable of the
 * caller lives across the vfork.
 */
static pid_t spawn(const char *path, char **argv, char **env, const sigset_t *mask, bool tty, int errfd, pid_t parent)
{
	pid_t pid = vfork();
	if (pid == 0)
		exec_child(path, argv, env, mask, tty, errfd, parent); /* never returns */
	return pid;
}

/* A member of the group exists (a zombie counts: dlock reaps its own). */
static bool group_alive(pid_t pgid)
{
	return kill(-pgid, 0) == 0 || errno == EPERM;
}

/*
 * A member of the group still runs (zombies do not count: once dlock is gone
 * nobody may reap them at once). Reads /proc without malloc: the watcher is a
 * fork of a threaded process. Without /proc, group_alive.
 */
static bool group_running(pid_t pgid)
{
	if (!group_alive(pgid))
		return false;
	int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return true;
	char buf[4096];
	bool found = false;
	ssize_t n;
	while (!found && (n = getdents64(dfd, buf, sizeof buf)) > 0) {
		for (ssize_t off = 0; off < n && !found;) {
			struct dirent64 *e = (struct dirent64 *)(void *)(buf + off);
			off += e->d_reclen;
			if (e->d_name[0] < '1' || e->d_name[0] > '9')
				continue;
			char path[64], st[512];
			snprintf(path, sizeof path, "/proc/%ld/stat", strtol(e->d_name, NULL, 10));
			int fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			ssize_t r = read(fd, st, sizeof st - 1);
			close(fd);
			if (r <= 0)
				continue;
			st[r] = '\0';
			char *p = strrchr(st, ')'); /* "pid (comm) S ppid pgrp ..." */
			char state;
			long ppid, pgrp;
			if (p && sscanf(p + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3 && pgrp == pgid &&
			    state != 'Z' && state != 'X')
				found = true;
		}
	}
	close(dfd);
	return found;
}

/*
 * The escalation, from the lease deadline `d` the client knows (CLOCK_MONOTONIC
 * ms, moved by every renewal) and the lease length `ttl`. A healthy renewer
 * keeps more than 2/3 of the TTL left (it renews at ttl/3); below a third, two
 * renewals went unconfirmed and the lease is at risk: SIGTERM. SIGKILL at
 * kill_margin before the deadline, so that it lands (and the group is gone)
 * before the store can end the lease — the client's deadline is itself
 * earlier than the store's (it counts from before the acquire was sent, minus
 * a drift margin). --kill-after only brings SIGKILL closer to the SIGTERM.
 */
static int64_t term_time(int64_t d, int64_t ttl)
{
	return d - ttl / 3;
}

static int64_t kill_margin(int64_t ttl)
{
	int64_t m = ttl / 10;
	return m < 20 ? 20 : m > 3000 ? 3000 : m;
}

static int64_t kill_time(int64_t d, int64_t ttl, int64_t termed, int64_t kill_after)
{
	int64_t k = d - kill_margin(ttl);
	return termed + kill_after < k ? termed + kill_after : k;
}

/* Say that the lock was lost, and when: the lease deadline (if we were
 * stopped past it, we hear of the loss late). */
static void report_lost(const cli_global *g, const char *name, bool command)
{
	char when[64];
	int64_t at = (int64_t)atomic_load(&lost_wall_ms);
	int64_t late = cli_mono_ms() - atomic_load(&lease_deadline);
	if (at == 0 || (atomic_load(&lease_deadline) > 0 && late > 0 && wall_ms() - late < at))
		at = wall_ms() - (late > 0 ? late : 0);
	cli_fmt_time(when, sizeof when, at);
	const char *why = atomic_load(&lost_why);
	if (!why) /* the switch ended it at the deadline */
		why = "its lease ran out: no renewal was confirmed before the deadline";
	cli_error(g, "lock '%s' was LOST at %s: %s%s", name, when, why,
		  command ? "; sending SIGKILL to the command" : "");
}

/* Where the command stands in the escalation. */
typedef struct escalation {
	int64_t deadline; /* CLOCK_MONOTONIC ms: the lease deadline last known */
	int64_t ttl;      /* the longest lease seen left: the TTL the client knows */
	int64_t termed;   /* when SIGTERM went (0: not yet) */
	bool killed;      /* SIGKILL went */
} escalation;

static void group_signal(pid_t pgid, int sig)
{
	kill(-pgid, sig);
	kill(-pgid, SIGCONT); /* a stopped group must see it */
}

/*
 * Drain the self-pipe: forward signals to the child's group (and remember
 * the last one in *sig), act on a loss: the store may grant the lock to
 * another at any moment, so the group is SIGKILLed at once.
 */
static void drain(const cli_global *g, child *ch, bool *lost, escalation *es, const char *name, int *sig)
{
	unsigned char buf[64];
	ssize_t n;
	while ((n = read(ev_pipe[0], buf, sizeof buf)) > 0) {
		for (ssize_t i = 0; i < n; i++) {
			int ev = buf[i];
			if (ev == EV_LOST) {
				if (*lost)
					continue;
				*lost = true;
				bool running = ch && ch->pid > 0 && !ch->exited;
				report_lost(g, name, running);
				if (running && es && !es->killed) {
					if (!es->termed)
						es->termed = cli_mono_ms();
					group_signal(ch->pid, SIGKILL);
					es->killed = true;
				}
			} else if (ev != SIGCHLD) {
				*sig = ev;
				if (ch && ch->pid > 0 && !ch->exited) {
					cli_debug(g, "forwarding signal %d to the command", ev);
					kill(-ch->pid, ev);
				}
			}
		}
	}
}

/*
 * The dead man's switch: a small process of our own that runs the same
 * escalation on the command's process group from the lease deadline dlock
 * last published (after each renewal it sees), should dlock not: when
 * dlock is gone (killed, OOM: it holds one end of a socket whose other end
 * is only dlock's, and sees EOF) it starts at once; while dlock is stopped
 * (SIGSTOP, a debugger) at the deadline's own times. It keeps copies of
 * dlock's store connections open until the group is gone: on a store whose
 * lock lives with a session, the server cannot free it while the command
 * still runs.
 *
 * It is forked first thing, while dlock is small and has no thread (a fork
 * of the process that holds the lock, with its store, its heap and four
 * threads, cost 5 ms of a 20 ms run in page-table copies, copy-on-write
 * faults and TLB shoot-downs), and armed once the lock is held: the
 * deadline is published, and dlock's descriptors (its store connections)
 * are passed over the socket (SCM_RIGHTS).
 */
typedef struct deadman {
	_Atomic int64_t deadline; /* CLOCK_MONOTONIC ms, as dlock_ttl_left sees it */
	_Atomic int64_t ttl;      /* escalation.ttl */
	_Atomic int done;         /* the command is over: stand down */
	_Atomic int fired;        /* the switch sent SIGTERM at the deadline */
	_Atomic pid_t pgid;       /* the command's process group; 0 until it exists */
} deadman;

#define DM_UNARMED INT64_MAX /* deadman.deadline before deadman_arm */
#define DM_FDS_MAX 250       /* descriptors per message (the kernel takes 253) */

/* One byte, with n descriptors attached (none: a bare wake-up). */
static bool send_batch(int sock, const int *fds, size_t n)
{
	char byte = 0;
	char ctl[CMSG_SPACE(sizeof(int) * DM_FDS_MAX)];
	memset(ctl, 0, sizeof ctl);
	struct iovec iov = { &byte, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (n > 0) {
		m.msg_control = ctl;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	}
	ssize_t r;
	while ((r = sendmsg(sock, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	return r == 1;
}

/* n descriptors in one message; if that fails (one of them closed since it
 * was listed: a store thread's reconnect), one by one, so that the others
 * still go. False if any did not. */
static bool send_fds(int sock, const int *fds, size_t n)
{
	if (send_batch(sock, fds, n))
		return true;
	if (n < 2)
		return false;
	bool ok = true;
	for (size_t i = 0; i < n; i++)
		ok &= send_batch(sock, fds + i, 1);
	return ok;
}

static int dm_alive_fd = -1; /* dlock's end of the socket the switch watches */

/* In the switch: take what dlock sent (descriptors to keep, which wake it to
 * read the deadline again). False on EOF: dlock is gone. */
static bool deadman_receive(int fd)
{
	for (;;) {
		char byte;
		char ctl[CMSG_SPACE(sizeof(int) * DM_FDS_MAX)];
		struct iovec iov = { &byte, 1 };
		struct msghdr m = {
			.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl
		};
		ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n == 0)
			return false;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR;
		/* the descriptors are now ours too: kept open until we exit */
	}
}

static void sleep_until_ms(int64_t when)
{
	struct timespec ts = { (time_t)(when / 1000), (long)(when % 1000) * 1000000 };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void deadman_main(deadman *dm, int alive_fd, int64_t kill_after)
{
	/*
	 * A group of our own: a signal to dlock's group (kill -- -PGID, a job
	 * control ^C) does not take the switch along. The caller's descriptors
	 * (a pipe a shell reads to its end) are not ours to keep; dlock's own
	 * (store connections) are, until the group is gone.
	 */
	setpgid(0, 0);
	for (size_t i = 0; i < n_inherited; i++)
		if (inherited[i] != alive_fd)
			close(inherited[i]);
	bool orphaned = false;
	for (;;) {
		int64_t d = atomic_load(&dm->deadline), now = cli_mono_ms();
		int64_t ttl = atomic_load(&dm->ttl);
		if (atomic_load(&dm->done))
			_exit(0);
		if (d == DM_UNARMED && orphaned)
			_exit(0); /* dlock went before it held the lock: no command to end */
		int64_t t = d == DM_UNARMED ? INT64_MAX : term_time(d, ttl);
		if (!orphaned && now < t) {
			struct pollfd pfd = { .fd = alive_fd, .events = POLLIN };
			int wait = t == INT64_MAX ? -1 : (int)(t - now > 60000 ? 60000 : t - now);
			if (poll(&pfd, 1, wait) > 0 && !deadman_receive(alive_fd))
				orphaned = true; /* EOF: dlock is gone */
			continue;
		}
		pid_t pgid = atomic_load(&dm->pgid);
		if (pgid <= 0)
			_exit(0); /* no command yet: PR_SET_PDEATHSIG ends it if it is forked */
		if (!orphaned)
			atomic_store(&dm->fired, 1);
		int64_t termed = cli_mono_ms();
		group_signal(pgid, SIGTERM);
		/* Until the group is really gone; SIGKILL again while it is not. */
		while (!atomic_load(&dm->done) && group_running(pgid)) {
			int64_t k = kill_time(atomic_load(&dm->deadline), ttl, termed, kill_after);
			now = cli_mono_ms();
			if (now >= k)
				group_signal(pgid, SIGKILL);
			sleep_until_ms(now >= k || k - now > 20 ? now + 20 : k);
		}
		_exit(0);
	}
}

/* Start the switch, unarmed (first thing, see above); NULL (no switch) if it
 * cannot be. */
static deadman *deadman_start(int64_t kill_after, pid_t *pid)
{
	int alive[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, alive) != 0)
		return NULL;
	deadman *dm = mmap(NULL, sizeof(*dm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (dm == MAP_FAILED) {
		close(alive[0]);
		close(alive[1]);
		return NULL;
	}
	atomic_store(&dm->deadline, DM_UNARMED);
	atomic_store(&dm->ttl, 0);
	atomic_store(&dm->done, 0);
	atomic_store(&dm->fired, 0);
	atomic_store(&dm->pgid, 0);
	*pid = fork();
	if (*pid == 0) {
		close(alive[1]);
		deadman_main(dm, alive[0], kill_after); /* never returns */
	}
	close(alive[0]);
	/* Both sides set its group (as for the command): the switch may not have
	 * run at all yet when dlock's group is killed (`kill -9 -- -PGID` on a
	 * loaded machine), and it must not go with it. */
	if (*pid > 0)
		setpgid(*pid, *pid);
	if (*pid < 0) {
		close(alive[1]);
		munmap(dm, sizeof(*dm));
		return NULL;
	}
	dm_alive_fd = alive[1];
	return dm;
}

/* The lock is held: publish its deadline and hand the switch dlock's own
 * descriptors (every one not inherited, the store's connections among
 * them). False if they could not all be sent (the switch still ends the
 * command at the deadline). */
static bool deadman_arm(deadman *dm, int64_t deadline, int64_t ttl)
{
	atomic_store(&dm->ttl, ttl);
	atomic_store(&dm->deadline, deadline);
	int fds[DM_FDS_MAX];
	size_t n = 0;
	bool ok = true;
	DIR *d = opendir("/proc/self/fd");
	for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		int fd = atoi(e->d_name);
		if (fd == dirfd(d) || fd == dm_alive_fd ||
		    bsearch(&fd, inherited, n_inherited, sizeof *inherited, cmp_int))
			continue;
		fds[n++] = fd;
		if (n == DM_FDS_MAX) {
			ok &= send_fds(dm_alive_fd, fds, n);
			n = 0;
		}
	}
	if (d)
		closedir(d);
	/* the last batch, or a bare byte: either wakes the switch to read the deadline */
	ok &= send_fds(dm_alive_fd, fds, n);
	return ok && d;
}

static void deadman_stop(deadman *dm, pid_t pid)
{
	if (!dm)
		return;
	atomic_store(&dm->done, 1);
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	close(dm_alive_fd);
	dm_alive_fd = -1;
	munmap(dm, sizeof(*dm));
}

/* Our own stop/continue, when the child was stopped from the terminal (^Z). */
static void follow_stop(child *ch)
{
	tcsetpgrp(STDIN_FILENO, getpgrp());
	kill(getpid(), SIGSTOP);
	/* Continued (fg): give the terminal back and wake the child. */
	tcsetpgrp(STDIN_FILENO, ch->pid);
	kill(-ch->pid, SIGCONT);
}

static int supervise(const cli_global *g, child *ch, int64_t kill_after, const char *name, bool *lost, dlock_lock *lock,
		     deadman *dm, escalation *es, int *sig)
{
	for (;;) {
		/* Keep the deadline (ours and the switch's) at the lease's, renewed or not. */
		int64_t lease_left = dlock_ttl_left(lock), now = cli_mono_ms();
		if (!*lost && lease_left > 0) {
			es->deadline = now + lease_left;
			if (lease_left > es->ttl)
				es->ttl = lease_left;
			atomic_store(&lease_deadline, es->deadline);
			if (dm) {
				atomic_store(&dm->ttl, es->ttl);
				atomic_store(&dm->deadline, es->deadline);
			}
		}
		/* Reap our child and, as subreaper, orphaned descendants of it. */
		int st;
		pid_t r;
		while ((r = waitpid(-1, &st, WNOHANG | (ch->tty ? WUNTRACED : 0))) > 0) {
			if (r != ch->pid || ch->exited)
				continue;
			if (WIFSTOPPED(st)) {
				follow_stop(ch);
				continue;
			}
			ch->exited = true;
			ch->status = st;
		}
		/* After a loss or a SIGTERM for one, stay until the whole group is gone. */
		if (ch->exited && (!(*lost || es->termed) || !group_alive(ch->pid)))
			break;
		now = cli_mono_ms();
		if (!es->termed && now >= term_time(es->deadline, es->ttl)) {
			char d[32];
			cli_error(g,
				  "lock '%s' is at risk: its lease was not renewed and ends in %s; "
				  "sending SIGTERM to the command, SIGKILL before the lease ends",
				  name, cli_fmt_duration(d, sizeof d, es->deadline > now ? es->deadline - now : 0));
			group_signal(ch->pid, SIGTERM);
			es->termed = now;
		}
		if (es->termed && !es->killed && now >= kill_time(es->deadline, es->ttl, es->termed, kill_after)) {
			char d[32];
			if (group_alive(ch->pid)) {
				cli_error(g, "the command is still running %s after SIGTERM: sending SIGKILL",
					  cli_fmt_duration(d, sizeof d, now - es->termed));
				group_signal(ch->pid, SIGKILL);
			}
			es->killed = true;
		}
		/* Wake for the next step, and to follow renewals (every ttl/3). */
		int64_t next = es->termed ? (es->killed ? now + 100
							: kill_time(es->deadline, es->ttl, es->termed, kill_after))
					  : term_time(es->deadline, es->ttl);
		int64_t follow = lease_left / 6 > 10 ? (lease_left / 6 < 1000 ? lease_left / 6 : 1000) : 10;
		if (!*lost && next > now + follow)
			next = now + follow;
		if (es->killed && ch->exited && now - es->termed > kill_after + 5000 && group_alive(ch->pid))
			break; /* SIGKILLed and still there: unkillable (D state); give up */
		/* Group members that are not (yet) our children send no SIGCHLD. */
		if ((*lost || es->termed) && ch->exited && next > now + 100)
			next = now + 100;
		int64_t timeout = next - now;
		struct pollfd pfd = { .fd = ev_pipe[0], .events = POLLIN };
		int pr = poll(&pfd, 1, (int)(timeout < 0 ? 0 : timeout > 100000 ? 100000 : timeout));
		if (pr < 0 && errno != EINTR)
			return -1;
		if (pr > 0)
			drain(g, ch, lost, es, name, sig);
	}
	return 0;
}

/* What the command line asked for, after the options. */
typedef struct run_args {
	const char *name;
	char **cmd;     /* COMMAND [ARG...], NULL-terminated (argv's own end) */
	int ncmd;
	bool dashdash;  /* a "--" was given (so this is not the hold form) */
	bool help;
} run_args;

/*
 * [OPTIONS] [--] NAME [OPTIONS] [--] [COMMAND [ARG...]]. Options may come
 * before and after NAME; the first word after NAME that is not an option
 * starts COMMAND (as with flock, `--` is needed only for a COMMAND that
 * starts with '-'). After a "--" before NAME no options follow, and one more
 * "--" may separate NAME from COMMAND: `dlock run -- -odd -- true`.
 */
static int parse_args(ctx *c, int argc, char **argv, run_args *ra)
{
	memset(ra, 0, sizeof *ra);
	bool ended = false;
	int i = 0;
	for (; i < argc && !ra->name; i++) {
		const char *w = argv[i];
		if (!ended && strcmp(w, "--") == 0) {
			ended = ra->dashdash = true;
		} else if (!ended && w[0] == '-' && w[1] != '\0') {
			int used = 1;
			int rc = cli_parse_option(c->g, opts, on_opt, c, w, i + 1 < argc ? argv[i + 1] : NULL, &used,
						  &ra->help);
			if (rc != 0)
				return rc;
			i += used - 1;
		} else {
			ra->name = w;
		}
	}
	if (ended) {
		if (i < argc && strcmp(argv[i], "--") == 0)
			i++;
	} else {
		for (; i < argc; i++) {
			const char *w = argv[i];
			if (strcmp(w, "--") == 0) {
				ra->dashdash = true;
				i++;
				break;
			}
			if (w[0] != '-' || w[1] == '\0')
				break;
			int used = 1;
			int rc = cli_parse_option(c->g, opts, on_opt, c, w, i + 1 < argc ? argv[i + 1] : NULL, &used,
						  &ra->help);
			if (rc != 0)
				return rc;
			i += used - 1;
		}
	}
	ra->cmd = argv + i;
	ra->ncmd = argc - i;
	if (ra->help)
		return 0;
	if (!ra->name)
		return cli_usage_error(c->g, "missing lock NAME");
	if (c->shell_cmd && ra->ncmd > 0)
		return cli_usage_error(c->g, "-c and COMMAND exclude each other (got '%s')", ra->cmd[0]);
	if (c->hold && (c->shell_cmd || ra->ncmd > 0))
		return cli_usage_error(c->g, "--hold takes no COMMAND (got '%s')",
				       c->shell_cmd ? c->shell_cmd : ra->cmd[0]);
	if (c->hold && ra->dashdash)
		return cli_usage_error(c->g, "--hold takes no '--' and no COMMAND");
	/* A script's `dlock run job "$@"` with an empty "$@" would hold the
	 * lock forever: holding without a command is asked for by name. */
	if (!c->hold && !c->shell_cmd && ra->ncmd == 0)
		return cli_usage_error(c->g,
				       "missing COMMAND after '%s' (to hold the lock until interrupted, "
				       "use --hold: dlock run --hold %s)",
				       ra->name, ra->name);
	return 0;
}

/* The hold form: wait for a terminating signal or a loss. */
static int hold(const cli_global *g, const char *name, bool *lost, int *sig)
{
	while (!*lost && !*sig) {
		struct pollfd pfd = { .fd = ev_pipe[0], .events = POLLIN };
		int pr = poll(&pfd, 1, -1);
		if (pr < 0 && errno != EINTR)
			return -1;
		if (pr > 0)
			drain(g, NULL, lost, NULL, name, sig);
	}
	return 0;
}

/*
 * Die of `sig` with its default action, as the caller's shell expects of a
 * program that was interrupted (it stops a loop around us), after our own
 * cleanup. No core file for SIGQUIT: nothing of ours went wrong.
 */
static int die_of(int sig)
{
	fflush(NULL);
	if (sig == SIGQUIT) {
		struct rlimit no = { 0, 0 };
		setrlimit(RLIMIT_CORE, &no);
	}
	struct sigaction sa = { .sa_handler = SIG_DFL };
	sigemptyset(&sa.sa_mask);
	sigaction(sig, &sa, NULL);
	sigset_t one;
	sigemptyset(&one);
	sigaddset(&one, sig);
	raise(sig);
	pthread_sigmask(SIG_UNBLOCK, &one, NULL);
	return 128 + sig; /* not reached */
}

int cli_run(cli_global *g, int argc, char **argv)
{
	ctx c = { g, CLI_LOCKOPTS_INIT, 10000, CLI_EXIT_NOTACQUIRED, NULL, false };
	note_inherited(); /* before anything of ours is open */
	run_args ra;
	int rc = parse_args(&c, argc, argv, &ra);
	if (rc == 0 && ra.help) {
		printf(help, cli_global_help);
		return 0;
	}
	if (rc == 0)
		rc = cli_lockopts_check(g, &c.lo);
	const char *name = ra.name;
	if (rc == 0)
		rc = cli_name(g, name);
	if (rc != 0)
		return rc;
	char *sh_argv[] = { (char *)"sh", (char *)"-c", (char *)c.shell_cmd, NULL };
	char **cmd = c.shell_cmd ? sh_argv : ra.ncmd > 0 ? ra.cmd : NULL;
	char *path = NULL;
	if (cmd) {
		path = c.shell_cmd ? strdup("/bin/sh") : find_command(cmd[0]);
		if (!path) {
			cli_error(g, "%s: command not found", cmd[0]);
			return 127;
		}
	}

	/*
	 * Block before any thread exists so that every thread inherits the mask.
	 * A terminating signal that was ignored when we started (a script's
	 * background job has SIGINT and SIGQUIT ignored) stays ignored, for us
	 * and for the command.
	 */
	static const int terminating[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
	sigemptyset(&handled);
	for (size_t i = 0; i < sizeof terminating / sizeof *terminating; i++) {
		struct sigaction cur;
		if (sigaction(terminating[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
			continue;
		sigaddset(&handled, terminating[i]);
	}
	sigaddset(&handled, SIGCHLD);
	sigset_t block = handled, old_mask;
	sigaddset(&block, SIGTTOU); /* so that we may hand the terminal over and back */
	struct sigaction sa = { .sa_handler = on_sigchld };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, &sigchld_orig);
	pthread_sigmask(SIG_BLOCK, &block, &old_mask);
	/*
	 * Orphaned descendants become our children, so that after a loss we can
	 * reap the whole process group instead of leaving zombies behind.
	 */
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	/* The switch first, while we are small and alone (see deadman). */
	pid_t dm_pid = -1;
	deadman *dm = cmd ? deadman_start(c.kill_after_ms, &dm_pid) : NULL;
	pthread_t sig_thread;
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	char **env = NULL;
	child ch = { 0 };
	bool lost = false, at_risk = false;
	int sig = 0; /* the last terminating signal we received and forwarded */
	if (pipe2(ev_pipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
	    pthread_create(&sig_thread, NULL, signal_thread, NULL) != 0) {
		cli_error(g, "cannot set up signal handling: %s", strerror(errno));
		deadman_stop(dm, dm_pid);
		free(path);
		return CLI_EXIT_FAIL;
	}

	int64_t asked_wait = c.lo.wait_ms; /* the open takes its time out of c.lo.wait_ms */
	if ((rc = cli_store_open_within(g, &store, &c.lo.wait_ms)) != 0)
		goto out;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	cli_lockopts_apply(&c.lo, &o);
	o.on_lost = on_lost;
	waitinfo wi = { g, name, 0, false };
	o.on_unreachable = on_unreachable;
	o.payload = &wi;
	int err = dlock_lock_new(&lock, store, name, &o);
	if (err != 0) {
		rc = cli_fail(g, err, "bad lock");
		goto out;
	}
	err = dlock_acquire(lock, c.lo.wait_ms);
	if (err == DLOCK_ETIMEOUT || err == DLOCK_ELOCKED) {
		rc = cli_not_acquired(g, store, name, err, asked_wait, c.conflict_code);
		goto out;
	}
	if (err != 0) {
		rc = cli_fail(g, err, "acquire");
		goto out;
	}
	if (wi.down)
		cli_info(g, "the store answers again");
	uint64_t fence = dlock_fence(lock);
	pthread_mutex_lock(&phase_mu);
	phase = PHASE_HOLDING;
	pthread_mutex_unlock(&phase_mu);
	cli_debug(g, "acquired '%s' with fence %llu", name, (unsigned long long)fence);

	if (!cmd) {
		/* The hold form: say that we hold it, then wait to be told to let go. */
		if (g->json) {
			fputs("{\"name\":", stdout);
			cli_json_str(stdout, name);
			printf(",\"fence\":%llu,\"ttl_ms\":%lld}\n", (unsigned long long)fence,
			       (long long)dlock_ttl_left(lock));
		} else {
			printf("%llu\n", (unsigned long long)fence);
		}
		fflush(stdout);
		if (isatty(STDERR_FILENO))
			cli_info(g, "holding '%s' (fence %llu) until interrupted: Ctrl-C, or kill -TERM %d", name,
				 (unsigned long long)fence, (int)getpid());
		cli_debug(g, "holding '%s' until SIGINT/SIGTERM", name);
		if (hold(g, name, &lost, &sig) != 0) {
			cli_error(g, "poll: %s", strerror(errno));
			rc = CLI_EXIT_FAIL;
		}
		goto release;
	}

	env = child_env(name, fence, g, store);
	if (!env) {
		cli_error(g, "out of memory");
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	/* Share the terminal like a shell: the child's group becomes its foreground. */
	ch.tty = isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp();
	if (!dlock_held(lock)) {
		lost = true;
		cli_error(g, "lock '%s' was lost before the command started", name);
		goto out;
	}
	/*
	 * The switch first, so that the command never runs without one; and
	 * before the exec-error pipe, which must close when the command execs.
	 */
	escalation es = { cli_mono_ms() + dlock_ttl_left(lock), dlock_ttl_left(lock), 0, false };
	if (dm && !deadman_arm(dm, es.deadline, es.ttl))
		cli_debug(g, "the switch did not get every descriptor: it still ends the command at the deadline");
	int errp[2];
	if (pipe2(errp, O_CLOEXEC) != 0) {
		cli_error(g, "pipe: %s", strerror(errno));
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	fflush(NULL);
	pid_t self = getpid();
	ch.pid = spawn(path, cmd, env, &old_mask, ch.tty, errp[1], self);
	if (ch.pid < 0) {
		cli_error(g, "fork: %s", strerror(errno));
		close(errp[0]);
		close(errp[1]);
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	/* Both sides set the group: whichever runs first, kill(-pid) works after this. */
	setpgid(ch.pid, ch.pid);
	if (dm)
		atomic_store(&dm->pgid, ch.pid);
	if (ch.tty)
		tcsetpgrp(STDIN_FILENO, ch.pid);
	close(errp[1]);
	int exec_errno = 0;
	ssize_t nr;
	while ((nr = read(errp[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR)
		;
	close(errp[0]);
	if (nr == (ssize_t)sizeof exec_errno) {
		waitpid(ch.pid, &ch.status, 0);
		ch.exited = true;
		cli_error(g, "cannot run %s: %s", cmd[0], strerror(exec_errno));
		rc = exec_errno == ENOENT ? 127 : 126;
	} else if (supervise(g, &ch, c.kill_after_ms, name, &lost, lock, dm, &es, &sig) != 0) {
		cli_error(g, "poll: %s", strerror(errno));
		rc = CLI_EXIT_FAIL;
	} else if (WIFSIGNALED(ch.status)) {
		rc = 128 + WTERMSIG(ch.status);
	} else {
		rc = WEXITSTATUS(ch.status);
	}
	if (ch.tty)
		tcsetpgrp(STDIN_FILENO, getpgrp());
	/* A loss reported just as the child exited is still a loss. */
	drain(g, &ch, &lost, &es, name, &sig);
	if (dm && atomic_load(&dm->fired) && !lost) {
		lost = true; /* the switch ended the command at the deadline: that is a loss */
		report_lost(g, name, true);
	}
	/* Ended for a lease at risk: exit 76 as for a loss; release what may still be ours. */
	at_risk = es.termed != 0;
	deadman_stop(dm, dm_pid);
	dm = NULL;
	/*
	 * Die of the signal we forwarded if the command died of a signal (a
	 * command that caught it and exited gets its status passed on, as a
	 * shell does). On a terminal, ^C and ^\ reach only the command's group:
	 * its death by them is ours too.
	 */
	if (ch.exited && WIFSIGNALED(ch.status)) {
		int cs = WTERMSIG(ch.status);
		if (!sig && ch.tty && (cs == SIGINT || cs == SIGQUIT))
			sig = cs;
	} else {
		sig = 0;
	}
release:
	if (!lost) {
		if (at_risk && !dlock_held(lock))
			goto out;
		err = dlock_release(lock);
		if (err == DLOCK_ELOST) {
			lost = true;
			cli_error(g, "lock '%s' was lost while the command ran (found at release)", name);
		} else if (err != 0) {
			cli_fail(g, err, "release (the lease will run out by itself)");
		}
	}
out:
	deadman_stop(dm, dm_pid);
	if (lost || at_risk)
		rc = CLI_EXIT_LOST;
	dlock_lock_free(lock);
	dlock_store_close(store);
	/* Not pthread_cancel: its unwinder is a library to load (libgcc_s,
	 * ~2 ms of every run). SIGCHLD is blocked everywhere: sent to the
	 * thread, it is its sigwait's to take. */
	atomic_store(&sig_stop, true);
	pthread_kill(sig_thread, SIGCHLD);
	pthread_join(sig_thread, NULL);
	free_env(env);
	free(path);
	if (sig && !lost && rc != CLI_EXIT_FAIL)
		return die_of(sig);
	return rc;
}
