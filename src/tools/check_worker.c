/* check_worker.c — a `dlock check` worker: acquire, read and write the
 * register with the fence, hold, release; every step logged (check.h). */
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
		  (long long)check_now_us());
}

/* ---- the seams: extend under a delayed renewal, handles, `dlock run` ---- */

/* Connect to the fault proxy's control socket (the worker's own connection). */
static int proxy_connect(const run_ctx *c)
{
	if (!c->px || !c->px->sock[0])
		return -1;
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	snprintf(sun.sun_path, sizeof sun.sun_path, "%s", c->px->sock);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* One proxy command on every route of the worker; 0 when each said ok. */
static int proxy_own(const run_ctx *c, int fd, int slot, const char *mode)
{
	for (int h = 0; h < c->px->nhosts; h++) {
		char line[96], reply[128];
		int n = snprintf(line, sizeof line, "%s %d\n", mode, slot * c->px->nhosts + h);
		if (send(fd, line, (size_t)n, MSG_NOSIGNAL) != n)
			return -1;
		size_t k = 0;
		while (k + 1 < sizeof reply) {
			struct pollfd pfd = { .fd = fd, .events = POLLIN };
			if (poll(&pfd, 1, 5000) <= 0 || read(fd, reply + k, 1) != 1)
				return -1;
			if (reply[k] == '\n')
				break;
			k++;
		}
		if (strncmp(reply, "ok", 2) != 0)
			return -1;
	}
	return 0;
}

/* SQLite: hold the database's write lock from another process for `ms`
 * (the sqlite3 shell: BEGIN IMMEDIATE, sleep, COMMIT), started now and left
 * to run; its pid, or -1. */
static pid_t sqlite_stall(const char *db, int64_t ms)
{
	int p[2];
	if (!db || pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p[0], 0);
		int devnull = open("/dev/null", O_WRONLY);
		if (devnull >= 0) {
			dup2(devnull, 1);
			dup2(devnull, 2);
		}
		execlp("sqlite3", "sqlite3", "-batch", db, (char *)NULL);
		_exit(127);
	}
	close(p[0]);
	if (pid > 0) {
		char script[160];
		int n = snprintf(script, sizeof script, ".timeout 2000\nBEGIN IMMEDIATE;\n.shell sleep %.3f\nCOMMIT;\n",
				 (double)ms / 1000.0);
		if (write(p[1], script, (size_t)n) != n) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			pid = -1;
		}
	}
	close(p[1]);
	return pid;
}

/* An extend while the renewal of the hold is delayed: the worker's link is
 * lagged from grant + ttl/6 to grant + 5 ttl/12, around the renewal (due at
 * grant + ttl/3, sent up to half an interval early in a batch): what is sent
 * then arrives 2 ttl/5 late, still within the lease, and after the extend,
 * sent at once on another connection, which overtakes it. On SQLite another
 * process holds the write lock over the same span, so the renewal and the
 * extend both wait and race for it. Then dlock_extend(6 x ttl). Returns the
 * extend's code; *delayed tells whether the delay was in place. */
static int extend_delayed(const run_ctx *c, dlock_lock *lock, int ctl, int slot, int64_t t_grant, bool *delayed)
{
	const check_opts *o = c->o;
	int64_t from = t_grant + o->ttl_ms * 1000 / 6, to = t_grant + o->ttl_ms * 1000 * 5 / 12;
	int64_t lag_ms = o->ttl_ms * 2 / 5 > 1 ? o->ttl_ms * 2 / 5 : 1;
	*delayed = false;
	check_sleep_until(from);
	pid_t stall = -1;
	char mode[48];
	snprintf(mode, sizeof mode, "lag %lld", (long long)lag_ms);
	if (ctl >= 0)
		*delayed = proxy_own(c, ctl, slot, mode) == 0;
	else if (c->db_path)
		*delayed = (stall = sqlite_stall(c->db_path, lag_ms)) > 0;
	check_sleep_until(to);
	if (ctl >= 0 && *delayed && proxy_own(c, ctl, slot, "pass") != 0)
		*delayed = false;
	int rc = dlock_extend(lock, 6 * o->ttl_ms);
	if (stall > 0) {
		int st;
		while (waitpid(stall, &st, 0) < 0 && errno == EINTR)
			;
		*delayed = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	return rc;
}

/* The kind of a worker's hold number seq: the plain and the requested kinds
 * (`dlock run` with kill-tool) in turn, each worker starting at another, so
 * that every kind comes up early even in a short run. */
static int pick_kind(const check_opts *o, int slot, long long seq)
{
	int k[K_NKINDS], n = 0;
	k[n++] = K_PLAIN;
	if (o->ops & OP_EXTEND)
		k[n++] = K_EXTEND;
	if (o->ops & OP_HANDLE)
		k[n++] = K_HANDLE;
	if (o->ops & OP_RUN)
		k[n++] = K_RUN;
	return k[(unsigned long long)(seq + slot) % (unsigned)n];
}

/* A hold of `dlock run`: SELF [--store URI] run --ttl T --wait W NAME -- SELF
 * check, the command told by DLOCK_CHECK_COMMAND what to log. The worker
 * waits for the tool; the parent may SIGKILL it (kill-tool). */
static int run_tool(const run_ctx *c, int slot, int inc, long long seq, int64_t wait_ms)
{
	const check_opts *o = c->o;
	const char *uri = c->worker_uri[slot] ? c->worker_uri[slot] : c->uri;
	char ttl[32], wait[32], spec[PATH_MAX * 2 + 160];
	snprintf(ttl, sizeof ttl, "%lldms", (long long)o->ttl_ms);
	snprintf(wait, sizeof wait, "%lldms", (long long)(wait_ms > 0 ? wait_ms : 1));
	snprintf(spec, sizeof spec, "%d %d %lld %lld %lld %d %.2000s/log %.2000s", slot, inc, seq,
		 (long long)check_t0_us, (long long)(2 * o->ttl_ms + o->hold_ms) * 1000, o->fencing ? 1 : 0,
		 o->work_dir, c->reg_path);
	const char *argv[16];
	int n = 0;
	argv[n++] = c->self;
	if (uri) {
		argv[n++] = "--store";
		argv[n++] = uri;
	}
	argv[n++] = "-q";
	argv[n++] = "run";
	argv[n++] = "--ttl";
	argv[n++] = ttl;
	argv[n++] = "--wait";
	argv[n++] = wait;
	argv[n++] = o->name;
	argv[n++] = "--";
	argv[n++] = c->self;
	argv[n++] = "check";
	argv[n] = NULL;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		setenv("DLOCK_CHECK_COMMAND", spec, 1);
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
		}
		execv(c->self, (char *const *)argv);
		_exit(127);
	}
	if (pid < 0)
		return -1;
	atomic_store(&c->sh->tool[slot], (int)pid);
	/* Watch the tool and its command (from WORK/cmd.SLOT, written once it
	 * runs): a command that did not end on its own (the file is still
	 * there), killed by the tool or left behind by a killed tool, is seen
	 * dead here: "D" with the time, the end of its hold. */
	char cmdp[PATH_MAX + 16];
	snprintf(cmdp, sizeof cmdp, "%.4000s/cmd.%d", o->work_dir, slot);
	int st = 0, cmd = 0;
	bool tool_done = false;
	long long cseq = -1;
	int cinc = inc;
	for (;;) {
		if (!tool_done) {
			pid_t w = waitpid(pid, &st, WNOHANG);
			tool_done = w == pid || (w < 0 && errno != EINTR);
		}
		if (cmd <= 0) {
			FILE *pf = fopen(cmdp, "r");
			if (pf && fscanf(pf, "%d %lld %d", &cmd, &cseq, &cinc) != 3)
				cmd = 0;
			if (pf)
				fclose(pf);
		}
		bool cmd_dead = true;
		if (cmd > 0) {
			char path[64], line[512], state = 'Z';
			snprintf(path, sizeof path, "/proc/%d/stat", cmd);
			FILE *sf = fopen(path, "r");
			if (sf && fgets(line, sizeof line, sf)) {
				char *rp = strrchr(line, ')');
				if (!rp || sscanf(rp + 1, " %c", &state) != 1)
					state = 'Z';
			}
			if (sf)
				fclose(sf);
			cmd_dead = state == 'Z' || state == 'X';
		}
		if (tool_done && cmd_dead)
			break;
		check_sleep_ms(2);
	}
	if (cmd > 0 && access(cmdp, F_OK) == 0) {
		logf_line(c->log_fd, "D %d %d %lld %lld\n", slot, cinc, cseq, (long long)check_now_us());
		unlink(cmdp);
	}
	atomic_store(&c->sh->tool[slot], 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* `dlock check` as the command of a worker's `dlock run` (check.h). */
int check_as_command(const char *spec)
{
	int slot, inc, fencing;
	long long seq, t0, hold_us;
	char logp[PATH_MAX], regp[PATH_MAX];
	if (sscanf(spec, "%d %d %lld %lld %lld %d %4095s %4095s", &slot, &inc, &seq, &t0, &hold_us, &fencing, logp,
		   regp) != 8)
		return CLI_EXIT_USAGE;
	check_t0_us = t0;
	signal(SIGTERM, SIG_IGN); /* the command that outlives the lease unless SIGKILLed */
	int fd = open(logp, O_WRONLY | O_APPEND | O_CLOEXEC);
	const char *fs = getenv("DLOCK_FENCE");
	if (fd < 0 || !fs)
		return CLI_EXIT_FAIL;
	uint64_t fence = strtoull(fs, NULL, 10);
	int64_t t_grant = check_now_us();
	/* where the parent finds us: WORK/cmd.SLOT = "pid seq inc" */
	char pidp[PATH_MAX + 32], tmp[PATH_MAX + 40];
	snprintf(pidp, sizeof pidp, "%.*s/cmd.%d", (int)(strlen(logp) - 4), logp, slot);
	snprintf(tmp, sizeof tmp, "%s.tmp", pidp);
	FILE *pf = fopen(tmp, "w");
	if (pf) {
		fprintf(pf, "%d %lld %d\n", (int)getpid(), seq, inc);
		fclose(pf);
		rename(tmp, pidp);
	}
	logf_line(fd, "A %d %d %lld %lld %lld %" PRIu64 " %d\n", slot, inc, seq, (long long)t_grant, (long long)t_grant,
		  fence, K_RUN);
	int64_t v = 0;
	uint64_t hb = 0;
	int ok = check_reg_access(regp, fencing, false, fence, &v, &hb);
	logf_line(fd, "W %d %d %lld %lld r %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc, seq,
		  (long long)check_now_us(), ok, fence, (long long)v, hb);
	check_sleep_until(t_grant + hold_us);
	if (ok == 1) {
		int64_t nv = v + 1;
		ok = check_reg_access(regp, fencing, true, fence, &nv, &hb);
		logf_line(fd, "W %d %d %lld %lld w %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc, seq,
			  (long long)check_now_us(), ok, fence, (long long)nv, hb);
	}
	logf_line(fd, "R %d %d %lld %lld 0\n", slot, inc, seq, (long long)check_now_us());
	unlink(pidp);
	return 0;
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
	dlock_lock_options lh = lo; /* acquire/release handles: nobody renews */
	lh.no_renew = 1;
	dlock_lock *hlock = NULL;
	int ctl = (o->ops & OP_EXTEND) ? proxy_connect(c) : -1;
	int rc = open_store(c, slot, &store);
	if (rc == 0)
		rc = dlock_lock_new(&lock, store, o->name, &lo);
	if (rc == 0 && (o->ops & OP_HANDLE))
		rc = dlock_lock_new(&hlock, store, o->name, &lh);
	if (rc != 0) {
		logf_line(c->log_fd, "E %d %d 0 %lld %d\n", slot, inc, (long long)check_now_us(), rc);
		dlock_lock_free(lock);
		dlock_store_close(store);
		check_sleep_ms(100); /* the parent replaces us: not in a tight loop */
		return CLI_EXIT_FAIL;
	}
	long long seq = 0;
	while (!atomic_load(&c->sh->stop)) {
		int64_t left_ms = (c->deadline_us - check_now_us()) / 1000;
		if (left_ms <= 0)
			break;
		if (atomic_exchange(&c->sh->reopen[slot], 0)) {
			/* After file-delete: open the store as a process started now would. */
			dlock_lock_free(lock);
			dlock_lock_free(hlock);
			dlock_store_close(store);
			lock = hlock = NULL;
			store = NULL;
			rc = open_store(c, slot, &store);
			if (rc == 0)
				rc = dlock_lock_new(&lock, store, o->name, &lo);
			if (rc == 0 && (o->ops & OP_HANDLE))
				rc = dlock_lock_new(&hlock, store, o->name, &lh);
			if (rc != 0) {
				logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq,
					  (long long)check_now_us(), rc);
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
		int kind = pick_kind(o, slot, seq);
		if (kind == K_RUN) {
			rc = run_tool(c, slot, inc, seq, wait_ms);
			/* 0: the command ran; not granted in time, lost, or killed by
			 * the kill-tool fault: not an error; anything else (the store
			 * down): noted, try again */
			if (rc != 0 && rc != CLI_EXIT_NOTACQUIRED && rc != CLI_EXIT_LOST && rc < 128 &&
			    !atomic_load(&c->sh->stop))
				logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq,
					  (long long)check_now_us(), -rc);
			if (rc != 0)
				check_sleep_ms(20);
			continue;
		}
		/* An extended hold has a handle of its own for each hold: an extend
		 * keeps its TTL for the handle's later holds too. */
		dlock_lock *elock = NULL;
		if (kind == K_EXTEND && (rc = dlock_lock_new(&elock, store, o->name, &lo)) != 0) {
			logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)check_now_us(), rc);
			check_sleep_ms(50);
			continue;
		}
		dlock_lock *l = kind == K_HANDLE ? hlock : kind == K_EXTEND ? elock : lock;
		int64_t t_req = check_now_us();
		rc = dlock_acquire(l, wait_ms);
		if (rc != 0)
			dlock_lock_free(elock);
		if (rc == DLOCK_ETIMEOUT && wait_ms < left_ms)
			continue;
		if (rc == DLOCK_ETIMEOUT)
			break;
		if (rc != 0) {
			/* The store is down (a restart fault): note it and try again. */
			logf_line(c->log_fd, "E %d %d %lld %lld %d\n", slot, inc, seq, (long long)check_now_us(), rc);
			check_sleep_ms(50);
			continue;
		}
		int64_t t_grant = check_now_us();
		uint64_t fence = dlock_fence(l);
		logf_line(c->log_fd, "A %d %d %lld %lld %lld %" PRIu64 " %d\n", slot, inc, seq, (long long)t_req,
			  (long long)t_grant, fence, kind);
		int64_t v = 0;
		uint64_t hb = 0;
		int ok = check_reg_access(c->reg_path, o->fencing, false, fence, &v, &hb);
		logf_line(c->log_fd, "W %d %d %lld %lld r %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc, seq,
			  (long long)check_now_us(), ok, fence, (long long)v, hb);
		/* Announced after the read: a pause then falls between read and write. */
		atomic_store(&c->sh->holding[slot], seq);
		/* The work; a SIGSTOP here is the GC pause: on waking, write at once.
		 * An extended hold outlives the first lease (till grant + 2 × ttl +
		 * hold); a handle's holder extends it itself every ttl/3 for ttl + hold. */
		int64_t until = t_grant + o->hold_ms * 1000;
		if (kind == K_EXTEND) {
			bool delayed = false;
			int erc = extend_delayed(c, l, ctl, slot, t_grant, &delayed);
			if (delayed)
				atomic_fetch_add(&c->sh->delayed, 1);
			logf_line(c->log_fd, "X %d %d %lld %lld %d %d\n", slot, inc, seq, (long long)check_now_us(),
				  erc, delayed ? 1 : 0);
			if (erc == 0)
				atomic_fetch_add(&c->sh->extends, 1);
			else
				logf_line(c->log_fd, "L %d %d %lld %lld\n", slot, inc, seq, (long long)check_now_us());
			until = t_grant + (2 * o->ttl_ms + o->hold_ms) * 1000;
		} else if (kind == K_HANDLE) {
			until = t_grant + (o->ttl_ms + o->hold_ms) * 1000;
			for (int64_t t = t_grant + o->ttl_ms * 1000 / 3; t < until; t += o->ttl_ms * 1000 / 3) {
				check_sleep_until(t);
				int erc = dlock_extend(l, o->ttl_ms);
				logf_line(c->log_fd, "X %d %d %lld %lld %d 0\n", slot, inc, seq,
					  (long long)check_now_us(), erc);
				if (erc != 0) {
					logf_line(c->log_fd, "L %d %d %lld %lld\n", slot, inc, seq,
						  (long long)check_now_us());
					break;
				}
				atomic_fetch_add(&c->sh->extends, 1);
			}
		}
		check_sleep_until(until);
		if (ok == 1) {
			int64_t nv = v + 1;
			ok = check_reg_access(c->reg_path, o->fencing, true, fence, &nv, &hb);
			logf_line(c->log_fd, "W %d %d %lld %lld w %d %" PRIu64 " %lld %" PRIu64 "\n", slot, inc, seq,
				  (long long)check_now_us(), ok, fence, (long long)nv, hb);
		}
		atomic_store(&c->sh->holding[slot], 0);
		/* Logged before the call: the work is done here, and a release that
		 * hangs (a black hole) must not make the hold look longer. */
		logf_line(c->log_fd, "R %d %d %lld %lld 0\n", slot, inc, seq, (long long)check_now_us());
		dlock_release(l);
		dlock_lock_free(elock);
		/* A short think time, so that the releasing worker does not always win again. */
		check_sleep_ms((int64_t)check_rnd_below(&rs, (uint64_t)(o->hold_ms / 2 + 1)));
	}
	dlock_lock_free(lock);
	dlock_lock_free(hlock);
	dlock_store_close(store);
	if (ctl >= 0)
		close(ctl);
	return 0;
}

pid_t check_spawn_worker(const run_ctx *c, int slot, int inc)
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
