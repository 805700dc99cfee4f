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
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char help[] =
	"Usage: dlock run [OPTIONS] NAME [--] COMMAND [ARG...]\n"
	"       dlock run [OPTIONS] NAME -c 'COMMAND STRING'\n"
	"       dlock run [OPTIONS] NAME                  (hold until interrupted)\n"
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
	"With no COMMAND (and no '--'), dlock takes the lock, prints its fencing\n"
	"token on stdout (with --json: {\"name\",\"fence\",\"ttl_ms\"}), holds it\n"
	"until SIGINT, SIGTERM, SIGHUP or SIGQUIT, releases it and dies of that signal.\n"
	"\n"
	"If the lock is lost while COMMAND runs (the lease could not be renewed in\n"
	"time), dlock says so and when, sends SIGTERM to COMMAND's process group,\n"
	"SIGKILL after --kill-after, and exits 76. If dlock itself is killed, a\n"
	"watcher process does the same to COMMAND's process group at once.\n"
	"\n"
	"  --ttl D         lease length (default: the store's, 30s unless its URI says ttl=)\n"
	"  --wait D        wait at most D for the lock (default: forever)\n"
	"  --no-wait       try once; exit 75 at once if the lock is held\n"
	"  -E, --conflict-exit-code N\n"
	"                  exit N (0-255) instead of 75 when the lock was not acquired\n"
	"  -c, --command S run S with /bin/sh -c instead of COMMAND [ARG...]\n"
	"  --shared        shared (read) lock: many shared holders, no exclusive one\n"
	"  --permits N     semaphore: up to N holders at once\n"
	"  --fair          first come, first served among waiters\n"
	"  --kill-after D  after a lost lock, SIGKILL this long after SIGTERM (default 10s)\n"
	"\n%s"
	"\nWhile waiting for a store that does not answer, dlock says so on stderr\n"
	"(unless -q) and again every 30s; it keeps trying until --wait ends.\n"
	"\nExit codes: COMMAND's status; 64 bad usage; 69 store unavailable; 75 (or -E)\n"
	"not acquired in time; 76 lock lost while COMMAND ran; 126/127 COMMAND could\n"
	"not be run / not found; 1 other failures.\n";

enum { OPT_KILL_AFTER = 1, OPT_CONFLICT, OPT_COMMAND };

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
	{ NULL, 0, false, 0 },
};

typedef struct ctx {
	cli_global *g;
	cli_lockopts lo;
	int64_t kill_after_ms;
	int conflict_code;     /* exit code for "not acquired" */
	const char *shell_cmd; /* -c */
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
			return cli_usage_error(c->g, "--conflict-exit-code: expected 0 to 255, got '%s'",
					       value);
		c->conflict_code = (int)v;
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
static _Atomic int64_t lease_deadline; /* CLOCK_MONOTONIC ms, last seen by the main loop */

static sigset_t handled; /* taken by the signal thread */
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
	(void)lock;
	(void)payload;
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
	cli_info(w->g, "the store is unreachable (%s); still trying to acquire lock '%s' "
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
		if (strncmp(environ[i], "DLOCK_NAME=", 11) != 0 &&
		    strncmp(environ[i], "DLOCK_FENCE=", 12) != 0 &&
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

/* In the forked child: only async-signal-safe calls until execve. */
static struct sigaction sigchld_orig;

static void exec_child(const char *path, char **argv, char **env, const sigset_t *mask, bool tty,
		       int errfd, pid_t parent)
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
	execve(path, argv, env);
	int e = errno;
	ssize_t r = write(errfd, &e, sizeof e);
	(void)r;
	_exit(127);
}

static bool group_alive(pid_t pgid)
{
	return kill(-pgid, 0) == 0 || errno == EPERM;
}

/* Say that the lock was lost, and when: the lease deadline (if we were
 * stopped past it, we hear of the loss late). */
static void report_lost(const cli_global *g, const char *name, int64_t kill_after, bool command)
{
	char when[64], d[32];
	int64_t at = (int64_t)atomic_load(&lost_wall_ms);
	int64_t late = cli_mono_ms() - atomic_load(&lease_deadline);
	if (at == 0 || (atomic_load(&lease_deadline) > 0 && late > 0 && wall_ms() - late < at))
		at = wall_ms() - (late > 0 ? late : 0);
	cli_fmt_time(when, sizeof when, at);
	if (!command) {
		cli_error(g, "lock '%s' was LOST at %s (lease not renewed in time)", name, when);
		return;
	}
	cli_error(g,
		  "lock '%s' was LOST at %s (lease not renewed in time); "
		  "sending SIGTERM to the command, SIGKILL after %s",
		  name, when, cli_fmt_duration(d, sizeof d, kill_after));
}

/*
 * Drain the self-pipe: forward signals to the child's group (and remember
 * the last one in *sig), act on a loss.
 */
static void drain(const cli_global *g, child *ch, bool *lost, int64_t *kill_at, int64_t kill_after,
		  const char *name, int *sig)
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
				report_lost(g, name, kill_after, ch != NULL);
				if (ch && ch->pid > 0 && !ch->exited) {
					kill(-ch->pid, SIGTERM);
					kill(-ch->pid, SIGCONT); /* a stopped group must see the TERM */
				}
				*kill_at = cli_mono_ms() + kill_after;
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
 * The dead man's switch: a small process of our own that ends the command's
 * process group at the lease deadline unless we keep moving the deadline
 * forward, or at once when dlock itself is gone (killed, OOM): it holds the
 * read end of a pipe whose only writer is dlock, and sees EOF when dlock
 * dies. It runs even while dlock itself is stopped (SIGSTOP, a debugger):
 * the command never runs on past a lease nobody renews.
 */
typedef struct deadman {
	_Atomic int64_t deadline; /* CLOCK_MONOTONIC ms, as dlock_ttl_left sees it */
	_Atomic int done;         /* the command is over: stand down */
	_Atomic int fired;        /* the switch sent SIGTERM at the deadline */
	_Atomic pid_t pgid;       /* the command's process group; 0 until it exists */
} deadman;

static int dm_alive_fd = -1; /* dlock's end of the pipe the switch watches */

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
	 * control ^C) does not take the switch along. And no copies of dlock's
	 * descriptors: store connections must close when dlock dies.
	 */
	setpgid(0, 0);
	if (alive_fd > 3)
		close_range(3, (unsigned)alive_fd - 1, 0);
	close_range((unsigned)alive_fd + 1, ~0U, 0);
	bool orphaned = false;
	for (;;) {
		int64_t d = atomic_load(&dm->deadline), now = cli_mono_ms();
		if (atomic_load(&dm->done))
			_exit(0);
		if (!orphaned && now < d) {
			struct pollfd pfd = { .fd = alive_fd, .events = POLLIN };
			int64_t t = d - now;
			if (poll(&pfd, 1, (int)(t > 60000 ? 60000 : t)) > 0)
				orphaned = true; /* EOF: nobody writes to it, dlock is gone */
			continue;
		}
		pid_t pgid = atomic_load(&dm->pgid);
		if (pgid <= 0)
			_exit(0); /* no command yet: PR_SET_PDEATHSIG ends it if it is forked */
		if (!orphaned)
			atomic_store(&dm->fired, 1);
		kill(-pgid, SIGTERM);
		kill(-pgid, SIGCONT);
		int64_t until = cli_mono_ms() + kill_after;
		while (cli_mono_ms() < until && !atomic_load(&dm->done) && group_alive(pgid))
			sleep_until_ms(cli_mono_ms() + 20 < until ? cli_mono_ms() + 20 : until);
		if (!atomic_load(&dm->done) && group_alive(pgid))
			kill(-pgid, SIGKILL);
		_exit(0);
	}
}

/* Start the switch (before the command); NULL (no switch) if it cannot be. */
static deadman *deadman_start(int64_t deadline, int64_t kill_after, pid_t *pid)
{
	int alive[2];
	if (pipe2(alive, O_CLOEXEC) != 0)
		return NULL;
	deadman *dm = mmap(NULL, sizeof(*dm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (dm == MAP_FAILED) {
		close(alive[0]);
		close(alive[1]);
		return NULL;
	}
	atomic_store(&dm->deadline, deadline);
	atomic_store(&dm->done, 0);
	atomic_store(&dm->fired, 0);
	atomic_store(&dm->pgid, 0);
	*pid = fork();
	if (*pid == 0) {
		close(alive[1]);
		deadman_main(dm, alive[0], kill_after); /* never returns */
	}
	close(alive[0]);
	if (*pid < 0) {
		close(alive[1]);
		munmap(dm, sizeof(*dm));
		return NULL;
	}
	dm_alive_fd = alive[1];
	return dm;
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

static int supervise(const cli_global *g, child *ch, int64_t kill_after, const char *name,
		     bool *lost, dlock_lock *lock, deadman *dm, int *sig)
{
	int64_t kill_at = -1;
	bool killed = false;
	for (;;) {
		/* Keep the dead man's switch at the lease deadline, renewed or not. */
		int64_t lease_left = dlock_ttl_left(lock);
		if (!*lost && lease_left > 0) {
			atomic_store(&lease_deadline, cli_mono_ms() + lease_left);
			if (dm)
				atomic_store(&dm->deadline, cli_mono_ms() + lease_left);
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
		/* After a loss, stay until the command's whole process group is gone. */
		if (ch->exited && (!*lost || !group_alive(ch->pid)))
			break;
		int timeout = -1;
		if (dm && !*lost) /* renewals move the deadline every ttl/3: follow them */
			timeout = (int)(lease_left / 6 > 10 ? (lease_left / 6 < 1000 ? lease_left / 6 : 1000) : 10);
		if (*lost) {
			int64_t left = (killed ? kill_at + 5000 : kill_at) - cli_mono_ms();
			if (killed && left <= 0)
				break; /* SIGKILLed and still there: unkillable (D state); give up */
			timeout = left < 0 ? 0 : (int)(left > 100000 ? 100000 : left);
			/* Group members that are not (yet) our children send no SIGCHLD. */
			if (ch->exited && timeout > 100)
				timeout = 100;
		}
		struct pollfd pfd = { .fd = ev_pipe[0], .events = POLLIN };
		int pr = poll(&pfd, 1, timeout);
		if (pr < 0 && errno != EINTR)
			return -1;
		if (pr > 0)
			drain(g, ch, lost, &kill_at, kill_after, name, sig);
		if (*lost && !killed && cli_mono_ms() >= kill_at) {
			char d[32];
			if (group_alive(ch->pid)) {
				cli_error(g, "the command is still running %s after SIGTERM: sending SIGKILL",
					  cli_fmt_duration(d, sizeof d, kill_after));
				kill(-ch->pid, SIGKILL);
			}
			killed = true;
		}
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
			int rc = cli_parse_option(c->g, opts, on_opt, c, w, i + 1 < argc ? argv[i + 1] : NULL,
						  &used, &ra->help);
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
			int rc = cli_parse_option(c->g, opts, on_opt, c, w, i + 1 < argc ? argv[i + 1] : NULL,
						  &used, &ra->help);
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
	if (!c->shell_cmd && ra->ncmd == 0 && ra->dashdash)
		return cli_usage_error(c->g, "missing COMMAND after '%s' (to hold the lock until "
					     "interrupted, give no '--' and no COMMAND)",
				       ra->name);
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
		int64_t ignore = 0;
		if (pr > 0)
			drain(g, NULL, lost, &ignore, 0, name, sig);
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
	ctx c = { g, CLI_LOCKOPTS_INIT, 10000, CLI_EXIT_NOTACQUIRED, NULL };
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

	pthread_t sig_thread;
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	char **env = NULL;
	child ch = { 0 };
	bool lost = false;
	int sig = 0; /* the last terminating signal we received and forwarded */
	deadman *dm = NULL;
	pid_t dm_pid = -1;
	if (pipe2(ev_pipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
	    pthread_create(&sig_thread, NULL, signal_thread, NULL) != 0) {
		cli_error(g, "cannot set up signal handling: %s", strerror(errno));
		free(path);
		return CLI_EXIT_FAIL;
	}

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
		char d[32];
		cli_info(g, "lock '%s' is held by another (%s)", name,
			 err == DLOCK_ELOCKED ? "--no-wait" : cli_fmt_duration(d, sizeof d, c.lo.wait_ms));
		rc = c.conflict_code;
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
	int errp[2];
	if (pipe2(errp, O_CLOEXEC) != 0) {
		cli_error(g, "pipe: %s", strerror(errno));
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	if (!dlock_held(lock)) {
		close(errp[0]);
		close(errp[1]);
		lost = true;
		cli_error(g, "lock '%s' was lost before the command started", name);
		goto out;
	}
	/* The switch first, so that the command never runs without one. */
	dm = deadman_start(cli_mono_ms() + dlock_ttl_left(lock), c.kill_after_ms, &dm_pid);
	fflush(NULL);
	pid_t self = getpid();
	ch.pid = fork();
	if (ch.pid < 0) {
		cli_error(g, "fork: %s", strerror(errno));
		close(errp[0]);
		close(errp[1]);
		rc = CLI_EXIT_FAIL;
		goto out;
	}
	if (ch.pid == 0)
		exec_child(path, cmd, env, &old_mask, ch.tty, errp[1], self);
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
	} else if (supervise(g, &ch, c.kill_after_ms, name, &lost, lock, dm, &sig) != 0) {
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
	int64_t ignore = 0;
	drain(g, &ch, &lost, &ignore, c.kill_after_ms, name, &sig);
	if (dm && atomic_load(&dm->fired) && !lost) {
		lost = true; /* the switch ended the command at the deadline: that is a loss */
		report_lost(g, name, c.kill_after_ms, true);
	}
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
	if (lost)
		rc = CLI_EXIT_LOST;
	dlock_lock_free(lock);
	dlock_store_close(store);
	/* sigwait() is a cancellation point; the thread holds nothing there. */
	pthread_cancel(sig_thread);
	pthread_join(sig_thread, NULL);
	free_env(env);
	free(path);
	if (sig && !lost && rc != CLI_EXIT_FAIL)
		return die_of(sig);
	return rc;
}
