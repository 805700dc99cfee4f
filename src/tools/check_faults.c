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
#include <netdb.h>

#include "faultproxy_uri.h"

/* Run `bash SCRIPT ARG...` with output appended to WORK/server.log; its exit code. */
static int run_script(const char *work, const char *script, const char *a1, const char *a2, const char *a3)
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

/* src/tools/faultproxy.c, compiled in with FAULTPROXY_MAIN renamed. */
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
	char(*targets)[FAULTPROXY_HOST_MAX] = calloc(FAULTPROXY_MAX_HOSTS, sizeof *targets);
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
		if (read_line_fd(out[0], line, sizeof line, 10000) < 0 || (v = strtol(line, &end, 10)) <= 0 || *end ||
		    v > 65535) {
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

static void do_seam_fault(run_ctx *c, unsigned kind, uint64_t *rs, pid_t *pids, int *incs, fault *f);

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
	f->count = -1;
	if (kind & (F_KILLTOOL | F_SESSKILL | F_EVICT | F_FAILBACK)) {
		do_seam_fault(c, kind, rs, pids, incs, f);
		return;
	}
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
			snprintf(f->note, sizeof f->note, "%s restart exited %d (see server.log)", o->server_script,
				 rc);
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
		snprintf(f->note, sizeof f->note, "no %s listed in %.120s",
			 kind == F_MRESTART ? "Redis masters" : "members", o->server_dir);
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
				off += (size_t)snprintf(f->note + off, sizeof f->note - off, " %d%s", i,
							rc ? "(FAILED)" : "");
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

/* ---- the seams: kill-tool, session-kill, evict, failback ------------------------ */

/* Whether PROG is an executable in PATH. */
static bool in_path(const char *prog)
{
	const char *path = getenv("PATH");
	char buf[PATH_MAX];
	if (!path || !*path)
		path = "/usr/bin:/bin";
	for (const char *p = path; *p;) {
		size_t n = strcspn(p, ":");
		snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
		if (access(buf, X_OK) == 0)
			return true;
		p += n + (p[n] == ':');
	}
	return false;
}

/* Run argv with stdout captured into out (at most cap-1 bytes, NUL-ended),
 * stderr appended to WORK/server.log; the exit code, -1 if it did not run. */
static int run_capture(const char *work, char *const argv[], const char *env_name, const char *env_val, char *out,
		       size_t cap)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%.4000s/server.log", work ? work : "");
		int fd = work ? open(path, O_WRONLY | O_CREAT | O_APPEND, 0644) : open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, 2);
		dup2(p[1], 1);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		if (env_name)
			setenv(env_name, env_val, 1);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	size_t n = 0;
	for (;;) {
		char tmp[512];
		ssize_t r = read(p[0], tmp, sizeof tmp);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		for (ssize_t i = 0; i < r && out && n + 1 < cap; i++)
			out[n++] = tmp[i];
	}
	if (out && cap)
		out[n] = '\0';
	close(p[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The parts of scheme://[user[:pass]@]host:port[/db][?...]; 0, or -1. */
typedef struct uri_parts {
	char scheme[32], user[128], pass[256], host[256], db[128];
	int port;
} uri_parts;

static int split_uri(const char *uri, uri_parts *u)
{
	memset(u, 0, sizeof *u);
	const char *a = uri ? strstr(uri, "://") : NULL;
	if (!a || (size_t)(a - uri) >= sizeof u->scheme)
		return -1;
	memcpy(u->scheme, uri, (size_t)(a - uri));
	a += 3;
	const char *end = a + strcspn(a, "/?#");
	const char *at = memchr(a, '@', (size_t)(end - a));
	if (at) {
		const char *colon = memchr(a, ':', (size_t)(at - a));
		const char *ue = colon ? colon : at;
		snprintf(u->user, sizeof u->user, "%.*s", (int)(ue - a), a);
		if (colon)
			snprintf(u->pass, sizeof u->pass, "%.*s", (int)(at - colon - 1), colon + 1);
		a = at + 1;
	}
	const char *hend = a + strcspn(a, ",/?#");
	const char *colon = memchr(a, ':', (size_t)(hend - a));
	snprintf(u->host, sizeof u->host, "%.*s", (int)((colon ? colon : hend) - a), a);
	u->port = colon ? atoi(colon + 1) : 0;
	if (*end == '/') {
		const char *d = end + 1;
		snprintf(u->db, sizeof u->db, "%.*s", (int)strcspn(d, "?#"), d);
	}
	return u->host[0] ? 0 : -1;
}

static bool scheme_is(const char *shown, const char *const *schemes)
{
	for (; *schemes; schemes++) {
		size_t n = strlen(*schemes);
		if (strncmp(shown, *schemes, n) == 0 && shown[n] == ':')
			return true;
	}
	return false;
}

static const char *const pg_schemes[] = { "postgres", "postgresql", NULL };
static const char *const my_schemes[] = { "mysql", "mariadb", NULL };
static const char *const redis_schemes[] = { "redis", "rediss", NULL };

/* One Redis command through redis-cli on HOST:PORT; its output in out. */
static int redis_cmd4(const run_ctx *c, const char *hostport, char *out, size_t cap, const char *a1, const char *a2,
		      const char *a3, const char *a4)
{
	char host[256];
	snprintf(host, sizeof host, "%s", hostport);
	char *colon = strrchr(host, ':');
	if (!colon)
		return -1;
	*colon = '\0';
	char *argv[] = {
		"redis-cli", "-h", host, "-p", colon + 1, (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL
	};
	uri_parts u;
	const char *pass = c->uri && split_uri(c->uri, &u) == 0 && u.pass[0] ? u.pass : NULL;
	char buf[4096];
	int rc = run_capture(c->o->work_dir, argv, pass ? "REDISCLI_AUTH" : NULL, pass, out ? out : buf,
			     out ? cap : sizeof buf);
	return rc;
}

static int redis_cmd(const run_ctx *c, const char *hostport, char *out, size_t cap, const char *a1, const char *a2,
		     const char *a3)
{
	return redis_cmd4(c, hostport, out, cap, a1, a2, a3, NULL);
}

/* The new faults' own checks before the run: each refused with the reason
 * when it cannot run on this store (a usage error, exit 64). */
int check_seam_prepare(run_ctx *c, const char *shown)
{
	const check_opts *o = c->o;
	const cli_global *g = o->g;
	if ((o->ops & OP_EXTEND) && shown && strncmp(shown, "sqlite:", 7) == 0) {
		if (!in_path("sqlite3"))
			return cli_usage_error(
				g,
				"--ops extend: not available on this store: SQLite renewals are delayed by "
				"holding its write lock from the sqlite3 shell, which is not in PATH");
		c->db_path = check_sqlite_path(c->uri);
		if (!c->db_path)
			return cli_usage_error(g, "--ops extend: cannot tell the SQLite database file of %s", shown);
	}
	if (o->faults & F_KILLTOOL) {
		char buf[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
		if (n <= 0)
			return cli_usage_error(g,
					       "--faults kill-tool: cannot find this program (/proc/self/exe) to run "
					       "`dlock run`");
		buf[n] = '\0';
		c->self = strdup(buf);
		if (!c->self)
			return CLI_EXIT_FAIL;
	}
	if (o->faults & F_SESSKILL) {
		bool pg = scheme_is(shown, pg_schemes), my = scheme_is(shown, my_schemes);
		if (!pg && !my)
			return cli_usage_error(
				g,
				"--faults session-kill: not available on this store: it kills a PostgreSQL "
				"or MySQL server session (postgres://, mysql://)");
		if (pg && !in_path("psql"))
			return cli_usage_error(
				g, "--faults session-kill: psql is not in PATH (it runs pg_terminate_backend)");
		if (my && !in_path("mariadb") && !in_path("mysql"))
			return cli_usage_error(
				g, "--faults session-kill: neither mariadb nor mysql is in PATH (they run KILL)");
	}
	if ((o->faults & F_EVICT) && !scheme_is(shown, (const char *const[]){ "memcached", NULL }))
		return cli_usage_error(g,
				       "--faults evict: not available on this store: it fills a memcached server "
				       "(memcached://)");
	if (o->faults & F_FAILBACK) {
		if (!scheme_is(shown, redis_schemes) && !o->master)
			return cli_usage_error(
				g,
				"--faults failback: the topology is not given: on %.40s the master is not "
				"the store's host; name it with --master HOST:PORT (and its replica "
				"with --replica HOST:PORT)",
				shown);
		if (!o->replica)
			return cli_usage_error(
				g,
				"--faults failback: the topology is not given: name the master's replica "
				"with --replica HOST:PORT");
		if (!in_path("redis-cli"))
			return cli_usage_error(g, "--faults failback: redis-cli is not in PATH (it runs REPLICAOF)");
		if (!o->master) {
			uri_parts u;
			if (split_uri(c->uri, &u) != 0 || strchr(c->uri, ','))
				return cli_usage_error(
					g,
					"--faults failback: the store has no single master host: name it "
					"with --master HOST:PORT");
		}
		char out[512];
		if (redis_cmd(c, o->replica, out, sizeof out, "ROLE", NULL, NULL) != 0 || strncmp(out, "slave", 5) != 0)
			return cli_usage_error(g, "--faults failback: --replica %s is not a replica (ROLE says: %.40s)",
					       o->replica, out);
	}
	return 0;
}

/* The master for failback: --master, or the store's one host. */
static void failback_master(const run_ctx *c, char *buf, size_t cap)
{
	uri_parts u;
	if (c->o->master)
		snprintf(buf, cap, "%s", c->o->master);
	else if (split_uri(c->uri, &u) == 0)
		snprintf(buf, cap, "%s:%d", u.host, u.port ? u.port : 6379);
	else
		snprintf(buf, cap, "?");
}

/* Wait (bounded) until HOST:PORT says master_link_status:up. */
static bool redis_link_up(const run_ctx *c, const char *hp, int64_t ms)
{
	int64_t until = check_now_us() + ms * 1000;
	char out[8192];
	while (!check_interrupted && check_now_us() < until) {
		if (redis_cmd(c, hp, out, sizeof out, "INFO", "replication", NULL) == 0 &&
		    strstr(out, "master_link_status:up"))
			return true;
		check_sleep_ms(50);
	}
	return false;
}

/* failback: the replica is promoted, the master made its replica (a full
 * resync from it: what the replica had is what the master has now), then the
 * master promoted back and the replica following it again. The master keeps
 * its run_id; its replication id changes. */
static void do_failback(run_ctx *c, fault *f)
{
	const check_opts *o = c->o;
	char m[300], rhost[256], out[512];
	failback_master(c, m, sizeof m);
	snprintf(rhost, sizeof rhost, "%s", o->replica);
	char *rport = strrchr(rhost, ':'), mhost[300];
	snprintf(mhost, sizeof mhost, "%s", m);
	char *mport = strrchr(mhost, ':');
	if (!rport || !mport) {
		snprintf(f->note, sizeof f->note, "bad HOST:PORT (%.80s, %.80s)", m, o->replica);
		f->end_us = check_now_us();
		return;
	}
	*rport++ = '\0';
	*mport++ = '\0';
	/* a full resync at once, not after Redis's diskless-sync delay (5 s) */
	redis_cmd4(c, o->replica, out, sizeof out, "CONFIG", "SET", "repl-diskless-sync-delay", "0");
	redis_cmd4(c, m, out, sizeof out, "CONFIG", "SET", "repl-diskless-sync-delay", "0");
	f->start_us = check_now_us();
	const char *step = "promote the replica";
	bool ok = redis_cmd(c, o->replica, out, sizeof out, "REPLICAOF", "NO", "ONE") == 0 &&
		  strncmp(out, "OK", 2) == 0;
	if (ok) {
		step = "demote the master";
		ok = redis_cmd(c, m, out, sizeof out, "REPLICAOF", rhost, rport) == 0 && strncmp(out, "OK", 2) == 0;
	}
	if (ok) {
		step = "the master's resync";
		ok = redis_link_up(c, m, 10000);
	}
	/* back, whatever happened: the master a master, the replica its replica */
	bool back = redis_cmd(c, m, out, sizeof out, "REPLICAOF", "NO", "ONE") == 0 && strncmp(out, "OK", 2) == 0;
	back &= redis_cmd(c, o->replica, out, sizeof out, "REPLICAOF", mhost, mport) == 0 && strncmp(out, "OK", 2) == 0;
	f->end_us = check_now_us();
	f->ok = ok && back;
	f->count = f->ok;
	if (f->ok)
		snprintf(f->note, sizeof f->note, "master %.64s demoted to a replica of %.64s, resynced, promoted back",
			 m, o->replica);
	else
		snprintf(f->note, sizeof f->note, "failback failed at: %s%s (see server.log)",
			 ok ? "promoting back" : step, back ? "" : "; the topology may be left changed");
}

/* The local ports of pid's TCP connections to remote port `rport`. */
static int worker_ports(pid_t pid, int rport, int *ports, int max)
{
	char path[PATH_MAX], link[128];
	unsigned long inodes[256];
	int ni = 0, n = 0;
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	struct dirent *e;
	while (d && (e = readdir(d)) && ni < 256) {
		char fp[PATH_MAX];
		if (snprintf(fp, sizeof fp, "%s/%s", path, e->d_name) >= (int)sizeof fp)
			continue;
		ssize_t k = readlink(fp, link, sizeof link - 1);
		if (k <= 0)
			continue;
		link[k] = '\0';
		unsigned long ino;
		if (sscanf(link, "socket:[%lu]", &ino) == 1)
			inodes[ni++] = ino;
	}
	if (d)
		closedir(d);
	const char *tables[] = { "tcp", "tcp6" };
	for (size_t t = 0; t < 2; t++) {
		snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, tables[t]);
		FILE *f = fopen(path, "r");
		char line[512];
		while (f && fgets(line, sizeof line, f)) {
			char la[64], ra[64];
			unsigned lp, rp, st;
			unsigned long ino;
			if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%x %x %*s %*s %*s %*s %*s %lu", la,
				   &lp, ra, &rp, &st, &ino) != 6 ||
			    (int)rp != rport)
				continue;
			for (int i = 0; i < ni; i++)
				if (inodes[i] == ino && n < max)
					ports[n++] = (int)lp;
		}
		if (f)
			fclose(f);
	}
	return n;
}

/* session-kill: the holder's server sessions (its connections, found by
 * their client ports) killed by the server. */
static void do_session_kill(run_ctx *c, int slot, pid_t pid, fault *f)
{
	const check_opts *o = c->o;
	uri_parts u;
	int ports[32];
	bool pg = c->uri && strncmp(c->uri, "postgres", 8) == 0;
	if (!c->uri || split_uri(c->uri, &u) != 0) {
		snprintf(f->note, sizeof f->note, "cannot read the store's URI");
		return;
	}
	int np = worker_ports(pid, u.port ? u.port : pg ? 5432 : 3306, ports, 32);
	if (np == 0) {
		snprintf(f->note, sizeof f->note, "no connection of worker %d to port %d found%s", slot, u.port,
			 c->px ? " (through the fault proxy: the server sees the proxy's ports)" : "");
		return;
	}
	char list[400] = "", out[2048];
	size_t off = 0;
	for (int i = 0; i < np && off < sizeof list; i++)
		off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", i ? "," : "", ports[i]);
	int rc;
	long long killed = 0;
	if (pg) {
		char sql[600], conn[1200];
		snprintf(
			sql, sizeof sql,
			"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE client_port IN (%s) AND pid <> "
			"pg_backend_pid()",
			list);
		/* the store's server and database, the password in the environment
		 * (not in a process list), without dlock's own parameters */
		snprintf(conn, sizeof conn, "postgresql://%s@%s:%d/%s", u.user, u.host, u.port ? u.port : 5432, u.db);
		char *argv[] = { "psql", "-X", "-q", "-t", "-A", "-d", conn, "-c", sql, NULL };
		f->start_us = check_now_us();
		rc = run_capture(o->work_dir, argv, "PGPASSWORD", u.pass, out, sizeof out);
		killed = rc == 0 ? atoll(out) : 0;
	} else {
		char sql[700], port[16], pass[300];
		const char *client = in_path("mariadb") ? "mariadb" : "mysql";
		snprintf(port, sizeof port, "%d", u.port ? u.port : 3306);
		snprintf(pass, sizeof pass, "%s", u.pass);
		char hosts[1200] = "";
		size_t ho = 0;
		for (int i = 0; i < np && ho < sizeof hosts; i++)
			ho += (size_t)snprintf(hosts + ho, sizeof hosts - ho, "%s'%s:%d'", i ? "," : "",
					       strcmp(u.host, "localhost") ? u.host : "localhost", ports[i]);
		snprintf(sql, sizeof sql, "SELECT ID FROM information_schema.PROCESSLIST WHERE HOST IN (%s)", hosts);
		char *argv[] = { (char *)client, "-h", u.host, "-P", port, "-u", u.user, "-N", "-B", "-e", sql, NULL };
		rc = run_capture(o->work_dir, argv, "MYSQL_PWD", pass, out, sizeof out);
		char kills[1200] = "";
		size_t ko = 0;
		for (char *s = out, *save = NULL, *w; rc == 0 && (w = strtok_r(s, "\n", &save)); s = NULL)
			if (ko < sizeof kills)
				ko += (size_t)snprintf(kills + ko, sizeof kills - ko, "KILL %lld;", atoll(w)), killed++;
		if (rc == 0 && killed > 0) {
			char *argv2[] = { (char *)client, "-h", u.host, "-P", port,  "-u",
					  u.user,         "-N", "-B",   "-e", kills, NULL };
			f->start_us = check_now_us();
			rc = run_capture(o->work_dir, argv2, "MYSQL_PWD", pass, NULL, 0);
		}
	}
	f->end_us = check_now_us();
	f->count = killed;
	f->ok = rc == 0 && killed > 0;
	if (f->ok)
		snprintf(f->note, sizeof f->note, "%lld session%s of worker %d killed by the server (client ports %s)",
			 killed, killed == 1 ? "" : "s", slot, list);
	else
		snprintf(f->note, sizeof f->note,
			 "%s exited %d, %lld sessions killed (client ports %s; see server.log)",
			 pg ? "psql" : "mysql client", rc, killed, list);
}

/* A memcached text-protocol connection to the store's host. */
static int mc_connect(const char *uri)
{
	uri_parts u;
	if (split_uri(uri, &u) != 0)
		return -1;
	char port[16];
	snprintf(port, sizeof port, "%d", u.port ? u.port : 11211);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	if (getaddrinfo(u.host, port, &hints, &ai) != 0)
		return -1;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

/* `stats`: the value of STAT name, -1 on error. */
static long long mc_stat(int fd, const char *name)
{
	if (send(fd, "stats\r\n", 7, MSG_NOSIGNAL) != 7)
		return -1;
	char buf[16384];
	size_t n = 0;
	while (n + 1 < sizeof buf) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, 5000) <= 0)
			return -1;
		ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
		if (r <= 0)
			return -1;
		n += (size_t)r;
		buf[n] = '\0';
		if (strstr(buf, "END\r\n"))
			break;
	}
	char want[80];
	snprintf(want, sizeof want, "STAT %s ", name);
	const char *p = strstr(buf, want);
	return p ? atoll(p + strlen(want)) : -1;
}

/* evict: fill the server with keys of the sizes of a lock's (values of 1 to
 * 300 bytes: every slab class they may be in, since memcached evicts per
 * class), twice its memory and until it has evicted (at most 4 ×). */
static void do_evict(run_ctx *c, uint64_t *rs, fault *f)
{
	int fd = mc_connect(c->uri);
	long long ev0 = fd >= 0 ? mc_stat(fd, "evictions") : -1, limit = fd >= 0 ? mc_stat(fd, "limit_maxbytes") : -1;
	f->start_us = check_now_us();
	if (ev0 < 0 || limit <= 0) {
		snprintf(f->note, sizeof f->note, "cannot read the server's stats");
		if (fd >= 0)
			close(fd);
		f->end_us = check_now_us();
		return;
	}
	static char val[512];
	memset(val, 'x', sizeof val);
	long long written = 0, keys = 0, ev = ev0;
	char cmd[1024];
	int64_t give_up = check_now_us() + 20000000;
	while (written < 4 * limit && !check_interrupted && check_now_us() < give_up) {
		/* every slab class a lock's keys may be in: memcached evicts per class */
		size_t len = 1 + (size_t)check_rnd_below(rs, 300);
		int n = snprintf(cmd, sizeof cmd, "set dlock-check-fill/%d/%lld 0 300 %zu noreply\r\n", (int)getpid(),
				 keys++, len);
		memcpy(cmd + n, val, len);
		memcpy(cmd + n + len, "\r\n", 2);
		size_t tot = (size_t)n + len + 2, sent = 0;
		while (sent < tot) {
			ssize_t w = send(fd, cmd + sent, tot - sent, MSG_NOSIGNAL);
			if (w <= 0)
				break;
			sent += (size_t)w;
		}
		if (sent < tot)
			break;
		written += (long long)len + 50;
		/* twice the memory: every key older than the fill that nobody touched is gone */
		if (written > 2 * limit && keys % 2000 == 0 && (ev = mc_stat(fd, "evictions")) > ev0)
			break;
	}
	ev = mc_stat(fd, "evictions");
	close(fd);
	f->end_us = check_now_us();
	f->count = ev > ev0 ? ev - ev0 : 0;
	f->ok = f->count > 0;
	if (f->ok)
		snprintf(f->note, sizeof f->note, "%lld keys written (%lld KB), %lld evicted", keys, written / 1024,
			 f->count);
	else
		snprintf(f->note, sizeof f->note, "%lld keys written (%lld KB) but nothing evicted (started with -M?)",
			 keys, written / 1024);
}

/* kill-tool: SIGKILL a worker's `dlock run` while its command (which
 * ignores SIGTERM) runs, then watch the command until it is dead; a line
 * "D slot inc seq t" tells the analysis when the command's hold really ended. */
static void do_kill_tool(run_ctx *c, uint64_t *rs, fault *f)
{
	const check_opts *o = c->o;
	int cand[MAX_CLIENTS], n = 0, slot = -1;
	pid_t cmd = -1, tool = 0;
	long long seq = 0;
	int inc = 0;
	int64_t until = check_now_us() + (4 * o->ttl_ms + o->hold_ms) * 1000;
	while (cmd < 0 && check_now_us() < until && !check_interrupted) {
		n = 0;
		for (unsigned i = 0; i < o->clients; i++)
			if (atomic_load(&c->sh->tool[i]) != 0)
				cand[n++] = (int)i;
		if (n > 0) {
			slot = cand[check_rnd_below(rs, (uint64_t)n)];
			tool = atomic_load(&c->sh->tool[slot]);
			char path[PATH_MAX];
			snprintf(path, sizeof path, "%.4000s/cmd.%d", o->work_dir, slot);
			FILE *pf = fopen(path, "r");
			int p = 0;
			if (pf && fscanf(pf, "%d %lld %d", &p, &seq, &inc) == 3 && p > 0 && kill(p, 0) == 0)
				cmd = p;
			if (pf)
				fclose(pf);
		}
		if (cmd < 0)
			check_sleep_ms(5);
	}
	f->start_us = check_now_us();
	if (cmd < 0 || tool <= 0) {
		snprintf(f->note, sizeof f->note, "no `dlock run` command running to aim at");
		f->end_us = f->start_us;
		return;
	}
	f->slot = slot;
	f->inc = inc;
	kill(tool, SIGKILL);
	/* dead: gone, or a zombie nobody reaped yet */
	int64_t watch = check_now_us() + (4 * o->ttl_ms + o->hold_ms + 10000) * 1000;
	bool dead = false;
	while (!dead && check_now_us() < watch) {
		char path[64], line[512];
		snprintf(path, sizeof path, "/proc/%d/stat", (int)cmd);
		FILE *sf = fopen(path, "r");
		char st = 'Z';
		if (sf && fgets(line, sizeof line, sf)) {
			char *rp = strrchr(line, ')');
			if (!rp || sscanf(rp + 1, " %c", &st) != 1)
				st = 'Z';
		}
		if (sf)
			fclose(sf);
		dead = st == 'Z' || st == 'X';
		if (!dead)
			check_sleep_ms(2);
	}
	int64_t died = check_now_us();
	f->end_us = died;
	if (!dead) {
		kill(cmd, SIGKILL);
		snprintf(f->note, sizeof f->note,
			 "dlock run killed; its command (pid %d) still ran %.0f ms later: killed "
			 "by the checker",
			 (int)cmd, check_us_to_ms(died - f->start_us));
	}
	char line[128];
	int len = snprintf(line, sizeof line, "D %d %d %lld %lld\n", slot, inc, seq, (long long)died);
	if (write(c->log_fd, line, (size_t)len) != len)
		snprintf(f->note, sizeof f->note, "cannot log the command's death");
	f->ok = 1;
	f->count = 1;
	if (dead)
		snprintf(f->note, sizeof f->note,
			 "dlock run SIGKILLed; its command (ignoring SIGTERM) died %.0f ms later",
			 check_us_to_ms(died - f->start_us));
}

/* The faults of the seams (check_do_fault hands them on). */
static void do_seam_fault(run_ctx *c, unsigned kind, uint64_t *rs, pid_t *pids, int *incs, fault *f)
{
	if (kind == F_KILLTOOL) {
		do_kill_tool(c, rs, f);
		return;
	}
	if (kind == F_EVICT) {
		do_evict(c, rs, f);
		return;
	}
	if (kind == F_FAILBACK) {
		do_failback(c, f);
		return;
	}
	int slot = aim_at_holder(c, rs);
	f->start_us = f->end_us = check_now_us();
	if (slot < 0 || pids[slot] <= 0) {
		snprintf(f->note, sizeof f->note, "no holder to aim at");
		return;
	}
	f->slot = slot;
	f->inc = incs[slot];
	do_session_kill(c, slot, pids[slot], f);
}
