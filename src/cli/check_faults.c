/* check_faults.c — the faults of `dlock check`, the fault proxy it runs in a
 * child, and the processes of the servers it pauses or restarts (check.h). */
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
int check_count_members(const char *dir, bool *members_file)
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

/* Read one line (without its newline) from fd within timeout_ms. */
static int read_line_fd(int fd, char *buf, size_t cap, int timeout_ms)
{
	size_t n = 0;
	int64_t until = check_mono_us() + (int64_t)timeout_ms * 1000;
	while (n + 1 < cap) {
		int64_t left = (until - check_mono_us()) / 1000;
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

void check_proxy_stop(proxy *p)
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
		int64_t until = check_mono_us() + 5000000;
		while ((r = waitpid(p->pid, &st, WNOHANG)) == 0 && check_mono_us() < until)
			check_sleep_ms(10);
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
int check_proxy_start(proxy *p, run_ctx *c, char *err, size_t errlen)
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
		check_proxy_stop(p);
	free(targets);
	free(ports);
	free(argv);
	return rc;
}

/* ---- the server's processes (server-pause) ------------------------------------ */

/* Whether the server script offers the command WORD: a `WORD)` case, or
 * WORD in the a|b|c list of its usage comment (redlock.sh hands its commands
 * on to redis.sh). */
bool check_script_offers(const char *script, const char *word)
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
int check_server_pids(const char *dir, pid_t *pids, int max)
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
char *check_sqlite_path(const char *uri)
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

/* ---- the run ----------------------------------------------------------------- */

static bool pick_holder(run_ctx *c, uint64_t *rs, int *slot)
{
	int cand[MAX_CLIENTS], n = 0;
	for (unsigned i = 0; i < c->o->clients; i++)
		if (atomic_load(&c->sh->holding[i]) != 0)
			cand[n++] = (int)i;
	if (n == 0)
		return false;
	*slot = cand[check_rnd_below(rs, (uint64_t)n)];
	return true;
}

/* Collect exited workers; one that failed on its own (store down during a
 * restart) is replaced, a bounded number of times so a dead store cannot make
 * us fork in a loop. */
void check_reap(run_ctx *c, pid_t *pids, int *incs, bool respawn)
{
	int st;
	pid_t p;
	while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
		for (unsigned i = 0; i < c->o->clients; i++) {
			if (pids[i] != p)
				continue;
			pids[i] = 0;
			bool failed = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
			if (respawn && failed && incs[i] < 100 && check_now_us() < c->deadline_us)
				pids[i] = check_spawn_worker(c, (int)i, ++incs[i]);
		}
	}
}

/* Wait (briefly) for someone to hold the lock: a fault aimed at a holder. */
static int aim_at_holder(run_ctx *c, uint64_t *rs)
{
	int slot = -1;
	int64_t until = check_now_us() + (c->o->ttl_ms + c->o->hold_ms) * 1000;
	while (!pick_holder(c, rs, &slot) && check_now_us() < until)
		check_sleep_ms(5);
	return slot;
}

/* A network fault through the proxy: `mode` on worker `slot`'s routes (-1:
 * all) for ms, then pass again. */
static void net_fault(run_ctx *c, int slot, const char *mode, int64_t ms, fault *f)
{
	struct proxy *px = c->px;
	long long d0 = proxy_dropped(px, slot);
	f->start_us = check_now_us();
	if (proxy_set(px, slot, mode) != 0) {
		snprintf(f->note, sizeof f->note, "the fault proxy refused '%s'", mode);
		proxy_set(px, slot, "pass");
		f->end_us = check_now_us();
		return;
	}
	f->start_us = check_now_us();
	check_fault_sleep_ms(ms);
	f->end_us = check_now_us();
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
	int n = check_count_members(o->server_dir, &mfile);
	if (!mfile && n > 0 && check_script_offers(o->server_script, "pause")) {
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
void check_do_fault(run_ctx *c, unsigned kind, uint64_t *rs, pid_t *pids, int *incs, fault *f)
{
	const check_opts *o = c->o;
	memset(f, 0, sizeof *f);
	f->kind = kind;
	f->slot = f->inc = f->member = -1;
	f->dropped = -1;
	if (kind == F_PAUSE || kind == F_KILL || kind == F_PARTITION || kind == F_FDELETE) {
		int slot = aim_at_holder(c, rs);
		if (slot < 0 && kind == F_PARTITION)
			slot = (int)check_rnd_below(rs, o->clients); /* a waiter's link fails too */
		f->start_us = check_now_us();
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
			f->start_us = check_now_us();
			int rc = unlink(c->db_path), e = errno;
			for (size_t i = 1; i < sizeof sfx / sizeof *sfx; i++) {
				snprintf(path, sizeof path, "%.4000s%s", c->db_path, sfx[i]);
				unlink(path);
			}
			f->end_us = check_now_us();
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
			f->start_us = check_now_us();
			check_fault_sleep_ms(o->pause_ms);
			f->end_us = check_now_us();
			kill(pids[slot], SIGCONT);
		} else {
			f->start_us = check_now_us();
			kill(pids[slot], SIGKILL);
			int st;
			while (waitpid(pids[slot], &st, 0) < 0 && errno == EINTR)
				;
			f->end_us = check_now_us();
			pids[slot] = check_spawn_worker(c, slot, ++incs[slot]);
		}
		f->ok = 1;
		return;
	}
	if (kind == F_LOSE) {
		int slot = (int)check_rnd_below(rs, o->clients);
		int64_t len = o->ttl_ms / 4 + (int64_t)check_rnd_below(rs, (uint64_t)(o->ttl_ms * 3 / 4 + 1));
		f->slot = slot;
		f->inc = incs[slot];
		net_fault(c, slot, "drop", len, f);
		if (f->ok)
			snprintf(f->note, sizeof f->note, "replies dropped for %lldms, %lld bytes discarded",
				 (long long)len, f->dropped);
		return;
	}
	if (kind == F_DELAY) {
		int slot = check_rnd_below(rs, 2) ? (int)check_rnd_below(rs, o->clients) : -1;
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
	f->start_us = check_now_us();
	if (!o->server_script || !o->server_dir) {
		snprintf(f->note, sizeof f->note, "needs --server-script and --server-dir");
		f->end_us = f->start_us;
		return;
	}
	if (kind == F_RESTART) {
		/* Redis needs a kill before its restart; others refuse `kill` (harmless). */
		run_script(o->work_dir, o->server_script, "kill", o->server_dir, NULL);
		int rc = run_script(o->work_dir, o->server_script, "restart", o->server_dir, NULL);
		f->end_us = check_now_us();
		f->ok = rc == 0;
		if (rc != 0)
			snprintf(f->note, sizeof f->note, "%s restart exited %d (see server.log)",
				 o->server_script, rc);
		return;
	}
	if (kind == F_SPAUSE) {
		pid_t sp[256];
		int np = check_server_pids(o->server_dir, sp, 256);
		f->start_us = check_now_us();
		int n = pause_servers(c, true, sp, np);
		f->start_us = check_now_us();
		if (n > 0)
			check_fault_sleep_ms(o->pause_ms);
		f->end_us = check_now_us();
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
		f->end_us = check_now_us();
		f->ok = rc == 0;
		c->failed_over = true;
		if (rc == 0)
			snprintf(f->note, sizeof f->note, "master killed; Sentinel promotes the replica");
		else
			snprintf(f->note, sizeof f->note, "kill-master exited %d (see server.log)", rc);
		return;
	}
	bool mfile;
	int n = check_count_members(o->server_dir, &mfile);
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
		int first = (int)check_rnd_below(rs, (uint64_t)n), bad = 0;
		size_t off = (size_t)snprintf(f->note, sizeof f->note, "restarted masters");
		for (int k = 0; k < n && !check_interrupted; k++) {
			int i = (first + k) % n;
			if (k > 0)
				check_fault_sleep_ms(o->ttl_ms / 2);
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
		f->end_us = check_now_us();
		f->ok = bad == 0;
		return;
	}
	if (mfile) {
		int i = 1 + (int)check_rnd_below(rs, (uint64_t)n);
		f->member = i;
		snprintf(idx, sizeof idx, "%d", i);
		pid_t p = member_pid(o->server_dir, i);
		if (p > 0)
			kill(p, SIGKILL);
		check_fault_sleep_ms(o->pause_ms);
		rc = run_script(o->work_dir, o->server_script, "restart-member", o->server_dir, idx);
	} else {
		int i = (int)check_rnd_below(rs, (uint64_t)n);
		f->member = i;
		snprintf(idx, sizeof idx, "%d", i);
		run_script(o->work_dir, o->server_script, "kill", o->server_dir, idx);
		check_fault_sleep_ms(o->pause_ms);
		rc = run_script(o->work_dir, o->server_script, "restart", o->server_dir, idx);
	}
	f->end_us = check_now_us();
	f->ok = rc == 0;
	if (rc != 0)
		snprintf(f->note, sizeof f->note, "restarting member %s exited %d (see server.log)", idx, rc);
}
