/*
 * holder.c — `dlock acquire` on stores whose locks live and die with a
 * session or connection (ZooKeeper, MySQL get_lock, PostgreSQL advisory;
 * dlock_store_session_bound). Such a hold cannot outlive the process that
 * took it, so `acquire` leaves a small holder process behind: it takes the
 * lock, keeps the session alive, and gives the lock up when `dlock release`
 * asks, or when its TTL passes without a `dlock extend` — the same contract
 * as every other store (docs/cli.md).
 *
 * The holder is dlock itself, executed again as "dlock --lock-holder-process":
 * its argv never carries the store URI (the process table is readable by
 * every local user); the URI and the options come through a pipe (fd 3) and
 * the holder reports on another (fd 4).
 *
 * extend/release reach the holder over a Unix socket in a directory that
 * only this user can enter: $XDG_RUNTIME_DIR/dlock, else /run/user/<uid>/dlock,
 * else /tmp/dlock-<uid> (each made 0700 and checked: a directory, ours, no
 * access for anyone else, not a symlink). The handle carries the socket's
 * name, the holder's pid and a 128-bit secret that every request must
 * present. Before it sends the secret, the client checks with SO_PEERCRED
 * that the peer is the holder: our uid and the pid of the handle — so a
 * process that took the socket's name after the holder went (the same user
 * after a crash; nobody else can enter the directory) learns nothing. The
 * holder refuses peers of another uid (root excepted). Replies are parsed
 * strictly and never printed raw.
 *
 *   handle:  dlh2.<x|s>.<permits>.<fence>.<ttl ms>.<holder pid>.<socket id, 16 hex>.<secret, 32 hex>
 *   request: "<secret> <extend|release> <ttl ms> <name>\n"
 *   reply:   "<dlock code> <ttl left ms> <fence> <handle or message>\n"
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HANDLE_PREFIX "dlh2."
#define OLD_HANDLE_PREFIX "dlh1." /* abstract sockets, before 0.2: refused */
#define REQUEST_MAX 1024
#define REPLY_TIMEOUT_MS 60000
#define CONFIG_FD 3
#define REPORT_FD 4
#define CONFIG_MAX 65536

bool cli_holder_handle(const char *handle)
{
	return strncmp(handle, HANDLE_PREFIX, strlen(HANDLE_PREFIX)) == 0 ||
	       strncmp(handle, OLD_HANDLE_PREFIX, strlen(OLD_HANDLE_PREFIX)) == 0;
}

static void hex(char *out, const unsigned char *b, size_t n)
{
	static const char d[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[b[i] >> 4];
		out[2 * i + 1] = d[b[i] & 15];
	}
	out[2 * n] = '\0';
}

/*
 * Make (mkdir 0700) or check the socket directory `path`: it must be a
 * directory (not a symlink) owned by us with no access for group or others.
 * Returns an fd on it (O_DIRECTORY) or -1. Create only when `create`.
 */
static int own_dir(const char *path, bool create)
{
	if (create && mkdir(path, 0700) != 0 && errno != EEXIST)
		return -1;
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

enum { NDIRS = 3 };

/* The candidate socket directories, in order of preference. */
static int socket_dirs(char dirs[NDIRS][96])
{
	int n = 0;
	const char *x = getenv("XDG_RUNTIME_DIR");
	if (x && x[0] == '/' && strlen(x) < 80)
		snprintf(dirs[n++], 96, "%s/dlock", x);
	snprintf(dirs[n++], 96, "/run/user/%u/dlock", (unsigned)getuid());
	snprintf(dirs[n++], 96, "/tmp/dlock-%u", (unsigned)getuid());
	return n;
}

static bool sock_addr(struct sockaddr_un *a, socklen_t *alen, const char *dir, const char *sockid)
{
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	int n = snprintf(a->sun_path, sizeof a->sun_path, "%s/h-%s", dir, sockid);
	if (n <= 0 || (size_t)n >= sizeof a->sun_path)
		return false;
	*alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n + 1);
	return true;
}

typedef struct parsed {
	char mode;
	unsigned permits;
	uint64_t fence;
	int64_t ttl;
	int pid;
	char sockid[17];
	char secret[33];
} parsed;

static bool parse_handle(const char *h, parsed *p)
{
	int used = 0;
	memset(p, 0, sizeof *p);
	if (strlen(h) > 200 || strspn(h, "dlh0123456789abcdefsx.") != strlen(h) ||
	    sscanf(h, HANDLE_PREFIX "%c.%u.%" SCNu64 ".%" SCNd64 ".%d.%16[0-9a-f].%32[0-9a-f]%n", &p->mode, &p->permits,
		   &p->fence, &p->ttl, &p->pid, p->sockid, p->secret, &used) != 7)
		return false;
	return h[used] == '\0' && strlen(p->sockid) == 16 && strlen(p->secret) == 32 &&
	       (p->mode == 'x' || p->mode == 's') && p->pid > 0 && p->permits >= 1 && p->ttl > 0;
}

/* ---- the holder process ---- */

static int lost_fds[2] = { -1, -1 };

static void holder_lost(dlock_lock *lock, void *payload)
{
	(void)lock;
	(void)payload;
	char b = 'L';
	ssize_t r = write(lost_fds[1], &b, 1);
	(void)r;
}

/* Write all of buf (the report pipe or a client socket). */
static bool write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		buf += n;
		len -= (size_t)n;
	}
	return true;
}

static void reply(int fd, int code, int64_t ttl_left, uint64_t fence, const char *text)
{
	char line[REQUEST_MAX];
	int n = snprintf(line, sizeof line, "%d %lld %llu %s\n", code, (long long)ttl_left, (unsigned long long)fence,
			 text);
	if (n > 0)
		write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Read one request line from a client within a second (a client that stalls is dropped). */
static bool read_line(int fd, char *buf, size_t cap)
{
	size_t len = 0;
	int64_t until = cli_mono_ms() + 1000;
	while (len + 1 < cap) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = until - cli_mono_ms();
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return false;
		ssize_t n = read(fd, buf + len, cap - 1 - len);
		if (n <= 0)
			return false;
		len += (size_t)n;
		buf[len] = '\0';
		char *nl = memchr(buf, '\n', len);
		if (nl) {
			*nl = '\0';
			return true;
		}
	}
	return false;
}

static bool peer_ok(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof cr;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
		return false;
	return cr.uid == getuid() || cr.uid == 0;
}

typedef struct hold {
	dlock_lock *lock;
	const char *name;
	char mode;
	unsigned permits;
	int64_t ttl;        /* current hold TTL (changes with extend --ttl) */
	int64_t deadline;   /* CLOCK_MONOTONIC ms: give the lock up here without an extend */
	char sockid[17], secret[33];
} hold;

static void make_handle(char *out, size_t len, const hold *h)
{
	snprintf(out, len, HANDLE_PREFIX "%c.%u.%llu.%lld.%d.%s.%s", h->mode, h->permits,
		 (unsigned long long)dlock_fence(h->lock), (long long)h->ttl, (int)getpid(), h->sockid, h->secret);
}

/* One client request. Returns true when the holder must exit (released or lost). */
static bool serve(int fd, hold *h)
{
	char line[REQUEST_MAX], secret[40], op[16];
	long long ttl = 0;
	int used = 0;
	if (!peer_ok(fd) || !read_line(fd, line, sizeof line))
		return false;
	if (sscanf(line, "%39s %15s %lld %n", secret, op, &ttl, &used) != 3 || used == 0) {
		reply(fd, DLOCK_EINVAL, 0, 0, "malformed request");
		return false;
	}
	const char *name = line + used;
	/* Wrong secret or name: this handle does not hold this lock; change nothing. */
	unsigned diff = strlen(secret) != 32;
	for (size_t i = 0; i < 32 && !diff; i++)
		diff |= (unsigned)(secret[i] ^ h->secret[i]);
	if (diff || strcmp(name, h->name) != 0) {
		reply(fd, DLOCK_ENOTHELD, 0, 0, "not held by this handle");
		return false;
	}
	if (strcmp(op, "release") == 0) {
		int err = dlock_release(h->lock);
		reply(fd, err, 0, 0, err ? dlock_error_last()->message : "released");
		return true;
	}
	if (strcmp(op, "extend") == 0) {
		int64_t t = ttl > 0 ? ttl : h->ttl;
		int err = dlock_extend(h->lock, t);
		if (err != 0) {
			reply(fd, err, 0, 0, dlock_error_last()->message);
			return err == DLOCK_ENOTHELD || err == DLOCK_ELOST;
		}
		h->ttl = t;
		h->deadline = cli_mono_ms() + t;
		char handle[256];
		make_handle(handle, sizeof handle, h);
		reply(fd, 0, t, dlock_fence(h->lock), handle);
		return false;
	}
	reply(fd, DLOCK_EINVAL, 0, 0, "unknown request");
	return false;
}

static void serve_until_done(int lfd, hold *h)
{
	for (;;) {
		int64_t left = h->deadline - cli_mono_ms();
		if (left <= 0)
			return; /* TTL passed without an extend: the caller frees the lock */
		struct pollfd p[2] = { { .fd = lfd, .events = POLLIN }, { .fd = lost_fds[0], .events = POLLIN } };
		int n = poll(p, 2, left > 60000 ? 60000 : (int)left);
		if (n < 0 && errno != EINTR)
			return;
		if (n > 0 && p[1].revents)
			return; /* lost: nothing left to hold */
		if (n > 0 && (p[0].revents & POLLIN)) {
			int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (fd < 0)
				continue;
			bool done = serve(fd, h);
			close(fd);
			if (done)
				return;
		}
	}
}

/* Report to the waiting `dlock acquire`: "<code> <fence> <ttl left> <handle or message>". */
static bool report(int fd, int code, uint64_t fence, int64_t ttl_left, const char *text)
{
	char line[REQUEST_MAX];
	int n = snprintf(line, sizeof line, "%d %llu %lld %s\n", code, (unsigned long long)fence, (long long)ttl_left,
			 text);
	return n > 0 && write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Bind the holder's socket in the first socket directory we can make safely;
 * the holder then lives in that directory (it unlinks its socket by name). */
static int listen_socket(const char *sockid)
{
	char dirs[NDIRS][96];
	int n = socket_dirs(dirs);
	for (int i = 0; i < n; i++) {
		/* /run/user/<uid> is made by the system, never by us. */
		if (strncmp(dirs[i], "/run/user/", 10) == 0) {
			char parent[96];
			snprintf(parent, sizeof parent, "%.*s", (int)(strrchr(dirs[i], '/') - dirs[i]), dirs[i]);
			int pfd = own_dir(parent, false);
			if (pfd < 0)
				continue;
			close(pfd);
		}
		int dfd = own_dir(dirs[i], true);
		if (dfd < 0)
			continue;
		/* Bind by a name relative to the checked directory: no path to race on. */
		int ok = fchdir(dfd);
		close(dfd);
		if (ok != 0)
			continue;
		struct sockaddr_un a;
		memset(&a, 0, sizeof a);
		a.sun_family = AF_UNIX;
		int len = snprintf(a.sun_path, sizeof a.sun_path, "h-%s", sockid);
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		mode_t old = umask(077);
		int b = bind(fd, (struct sockaddr *)&a,
			     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)len + 1));
		umask(old);
		if (b == 0 && listen(fd, 8) == 0)
			return fd;
		close(fd);
	}
	return -1;
}

static int holder_main(const char *uri, const char *name, const cli_lockopts *lo, int rfd)
{
	dlock_store *store = NULL;
	dlock_lock *lock = NULL;
	int lfd = -1, err;
	hold h = { 0 };
	char handle[256];
	if (pipe2(lost_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
		report(rfd, DLOCK_ENOMEM, 0, 0, "pipe failed");
		return 1;
	}
	err = dlock_store_open(&store, uri);
	if (err == 0) {
		dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
		cli_lockopts_apply(lo, &o);
		o.on_lost = holder_lost;
		err = dlock_lock_new(&lock, store, name, &o);
	}
	if (err == 0)
		err = dlock_acquire(lock, lo->wait_ms);
	if (err != 0) {
		report(rfd, err, 0, 0, dlock_error_last()->message);
		goto out;
	}
	/* Held: leave the caller's session so its ^C or hang-up no longer reaches us. */
	setsid();
	unsigned char rnd[24];
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
		report(rfd, DLOCK_ENOMEM, 0, 0, "getrandom failed");
		goto out;
	}
	hex(h.sockid, rnd, 8);
	hex(h.secret, rnd + 8, 16);
	h.lock = lock;
	h.name = name;
	h.mode = lo->shared ? 's' : 'x';
	h.permits = lo->permits;
	h.ttl = dlock_ttl_left(lock);
	h.ttl = lo->ttl_ms > 0 ? lo->ttl_ms : h.ttl;
	h.deadline = cli_mono_ms() + h.ttl;
	if ((lfd = listen_socket(h.sockid)) < 0) {
		report(rfd, DLOCK_ENOTSUPPORTED, 0, 0,
		       "cannot listen on a holder socket (no private directory: $XDG_RUNTIME_DIR/dlock, "
		       "/run/user/UID/dlock or /tmp/dlock-UID, owned by this user with mode 0700)");
		goto out;
	}
	make_handle(handle, sizeof handle, &h);
	/* If nobody reads the handle (the caller died), nobody could release: give up now. */
	if (!report(rfd, 0, dlock_fence(lock), dlock_ttl_left(lock), handle))
		goto out;
	close(rfd);
	rfd = -1;
	serve_until_done(lfd, &h);
out:
	if (rfd >= 0)
		close(rfd);
	if (lfd >= 0) {
		char path[40];
		snprintf(path, sizeof path, "h-%s", h.sockid);
		unlink(path); /* relative: we live in the socket directory */
		close(lfd);
	}
	dlock_lock_free(lock); /* releases a hold still held (expired TTL, failed report) */
	dlock_store_close(store);
	return 0;
}

/* The config the holder reads from CONFIG_FD: NUL-terminated fields. */
enum { CF_URI, CF_NAME, CF_TTL, CF_WAIT, CF_SHARED, CF_PERMITS, CF_FAIR, CF_N };

int cli_holder_main(void)
{
	struct stat st;
	if (fstat(CONFIG_FD, &st) != 0 || !S_ISFIFO(st.st_mode) || fstat(REPORT_FD, &st) != 0 ||
	    !S_ISFIFO(st.st_mode)) {
		fprintf(stderr, "dlock: %s is the lock holder that 'dlock acquire' starts, not a command\n",
			CLI_HOLDER_ARGV1);
		return CLI_EXIT_USAGE;
	}
	char *buf = malloc(CONFIG_MAX);
	size_t len = 0;
	ssize_t n;
	if (!buf)
		return CLI_EXIT_FAIL;
	while (len < CONFIG_MAX &&
	       ((n = read(CONFIG_FD, buf + len, CONFIG_MAX - len)) > 0 || (n < 0 && errno == EINTR)))
		if (n > 0)
			len += (size_t)n;
	close(CONFIG_FD);
	const char *f[CF_N];
	size_t k = 0, at = 0;
	while (k < CF_N && at < len) {
		f[k++] = buf + at;
		char *z = memchr(buf + at, '\0', len - at);
		if (!z)
			break;
		at = (size_t)(z - buf) + 1;
	}
	if (k != CF_N || at != len) {
		report(REPORT_FD, DLOCK_EINVAL, 0, 0, "bad holder configuration");
		free(buf);
		return CLI_EXIT_USAGE;
	}
	cli_lockopts lo = CLI_LOCKOPTS_INIT;
	lo.ttl_ms = strtoll(f[CF_TTL], NULL, 10);
	lo.wait_ms = strtoll(f[CF_WAIT], NULL, 10);
	lo.shared = f[CF_SHARED][0] == '1';
	lo.permits = (unsigned)strtoul(f[CF_PERMITS], NULL, 10);
	lo.fair = f[CF_FAIR][0] == '1';
	int rc = holder_main(*f[CF_URI] ? f[CF_URI] : NULL, f[CF_NAME], &lo, REPORT_FD);
	explicit_bzero(buf, len); /* the password: the store keeps its own copy */
	free(buf);
	return rc;
}

/* Our own executable, for the holder (valgrind and ASan runs included). */
static void self_exe(char *out, size_t cap)
{
	ssize_t n = readlink("/proc/self/exe", out, cap - 1);
	if (n > 0 && (size_t)n < cap - 1)
		out[n] = '\0';
	/* Replaced since we started (an upgrade): the kernel's link still runs us. */
	if (n <= 0 || (size_t)n >= cap - 1 || strstr(out, " (deleted)"))
		snprintf(out, cap, "/proc/self/exe");
}

/* The environment for the holder: ours without DLOCK_STORE (it gets the URI by pipe). */
static char **holder_env(void)
{
	extern char **environ;
	size_t n = 0, k = 0;
	while (environ && environ[n])
		n++;
	char **env = calloc(n + 1, sizeof *env);
	for (size_t i = 0; env && i < n; i++)
		if (strncmp(environ[i], "DLOCK_STORE=", 12) != 0)
			env[k++] = environ[i];
	return env;
}

static bool write_config(int fd, const char *uri, const char *name, const cli_lockopts *lo)
{
	char num[4][32];
	snprintf(num[0], sizeof num[0], "%lld", (long long)lo->ttl_ms);
	snprintf(num[1], sizeof num[1], "%lld", (long long)lo->wait_ms);
	snprintf(num[2], sizeof num[2], "%u", lo->permits);
	const char *f[CF_N] = { uri ? uri : "",      name, num[0], num[1], lo->shared ? "1" : "0", num[2],
				lo->fair ? "1" : "0" };
	for (int i = 0; i < CF_N; i++)
		if (!write_all(fd, f[i], strlen(f[i]) + 1))
			return false;
	return true;
}

/* A dlock code the holder may answer with: anything else is not a holder. */
static bool known_code(int code)
{
	return code <= 0 && code > -100;
}

/* Text from the holder, for our output: printable ASCII only (no terminal escapes). */
static void clean_text(char *dst, size_t cap, const char *src)
{
	size_t i = 0;
	for (; src[i] && i + 1 < cap; i++)
		dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
	dst[i] = '\0';
}

int cli_holder_acquire(const cli_global *g, const char *uri, const char *name, const cli_lockopts *lo,
		       int64_t asked_wait_ms)
{
	int rp[2], cp[2];
	char exe[4096];
	self_exe(exe, sizeof exe);
	char **env = holder_env();
	if (!env) {
		cli_error(g, "out of memory");
		return CLI_EXIT_FAIL;
	}
	if (pipe2(rp, O_CLOEXEC) != 0) {
		cli_error(g, "pipe: %s", strerror(errno));
		free(env);
		return CLI_EXIT_FAIL;
	}
	if (pipe2(cp, O_CLOEXEC) != 0) {
		cli_error(g, "pipe: %s", strerror(errno));
		close(rp[0]);
		close(rp[1]);
		free(env);
		return CLI_EXIT_FAIL;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		cli_error(g, "fork: %s", strerror(errno));
		close(rp[0]);
		close(rp[1]);
		close(cp[0]);
		close(cp[1]);
		free(env);
		return CLI_EXIT_FAIL;
	}
	if (pid == 0) {
		/*
		 * The holder outlives us: it must not keep our stdout open (a
		 * script's $(dlock acquire ...) waits for EOF on it) nor stderr,
		 * nor any other descriptor of the caller. It gets the URI by
		 * pipe, never in argv (readable by every user in /proc).
		 */
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		/* Move the pipes above where they go, then into place (dup2 clears CLOEXEC). */
		int c = fcntl(cp[0], F_DUPFD_CLOEXEC, 10), r = fcntl(rp[1], F_DUPFD_CLOEXEC, 10);
		if (null < 0 || c < 0 || r < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(null, STDOUT_FILENO) < 0 ||
		    dup2(null, STDERR_FILENO) < 0 || dup2(c, CONFIG_FD) < 0 || dup2(r, REPORT_FD) < 0)
			_exit(127);
		close_range(REPORT_FD + 1, ~0U, 0);
		if (chdir("/") != 0) {
			/* harmless: only keeps a directory busy */
		}
		char *argv[] = { (char *)"dlock", (char *)CLI_HOLDER_ARGV1, NULL };
		execve(exe, argv, env);
		_exit(127);
	}
	free(env);
	close(rp[1]);
	close(cp[0]);
	bool sent = write_config(cp[1], uri, name, lo);
	close(cp[1]);
	char buf[REQUEST_MAX];
	size_t len = 0;
	ssize_t n;
	while (len + 1 < sizeof buf &&
	       ((n = read(rp[0], buf + len, sizeof buf - 1 - len)) > 0 || (n < 0 && errno == EINTR)))
		if (n > 0)
			len += (size_t)n;
	close(rp[0]);
	buf[len] = '\0';
	int code = 0, used = 0;
	unsigned long long fence = 0;
	long long ttl_left = 0;
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	if (!sent || !nl || sscanf(buf, "%d %llu %lld %n", &code, &fence, &ttl_left, &used) != 3 || used == 0 ||
	    !known_code(code)) {
		/* The holder died before reporting: reap it. */
		waitpid(pid, NULL, 0);
		cli_error(g, "the lock holder process failed to start");
		return CLI_EXIT_FAIL;
	}
	char text[REQUEST_MAX];
	clean_text(text, sizeof text, buf + used);
	parsed ph;
	if (code != 0) {
		waitpid(pid, NULL, 0);
		if (code == DLOCK_ETIMEOUT || code == DLOCK_ELOCKED) {
			dlock_store *s = NULL; /* to name the holder */
			if (dlock_store_open(&s, uri) != 0)
				s = NULL;
			int rc = cli_not_acquired(g, s, name, code, asked_wait_ms, CLI_EXIT_NOTACQUIRED);
			dlock_store_close(s);
			return rc;
		}
		cli_error(g, "acquire: %s", text);
		return cli_exit_code(code);
	}
	if (!parse_handle(text, &ph) || ph.pid != (int)pid) {
		cli_error(g, "the lock holder process answered with a malformed handle");
		return CLI_EXIT_FAIL;
	}
	if (g->json) {
		fputs("{\"name\":", stdout);
		cli_json_str(stdout, name);
		fputs(",\"handle\":", stdout);
		cli_json_str(stdout, text);
		printf(",\"fence\":%llu,\"ttl_ms\":%lld}\n", fence, ttl_left);
	} else {
		printf("%s\n", text);
	}
	cli_debug(g, "acquired '%s' fence %llu through holder process %d", name, fence, (int)pid);
	return fflush(stdout) == 0 ? 0 : CLI_EXIT_FAIL;
}

/*
 * Connect to the holder of p: the socket of p->sockid in the first of our
 * socket directories that has it. 0 with *fd; DLOCK_ENOTHELD when no holder
 * listens there (released, TTL passed); DLOCK_EPERM-like refusals are
 * printed here and returned as an exit code in *exit_rc.
 */
static int holder_connect(const cli_global *g, const parsed *p, int *fd_out, int *exit_rc)
{
	char dirs[NDIRS][96];
	int n = socket_dirs(dirs);
	*fd_out = -1;
	*exit_rc = 0;
	for (int i = 0; i < n; i++) {
		int dfd = own_dir(dirs[i], false);
		if (dfd < 0)
			continue; /* absent, or not safe: never talk through it */
		close(dfd);
		struct sockaddr_un addr;
		socklen_t alen;
		if (!sock_addr(&addr, &alen, dirs[i], p->sockid))
			continue;
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			cli_error(g, "socket: %s", strerror(errno));
			*exit_rc = CLI_EXIT_FAIL;
			return -1;
		}
		if (connect(fd, (struct sockaddr *)&addr, alen) != 0) {
			close(fd);
			continue;
		}
		/* Before the secret goes out: is this the holder of the handle? */
		struct ucred cr;
		socklen_t crlen = sizeof cr;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 || cr.uid != getuid() ||
		    cr.pid != p->pid) {
			cli_error(g,
				  "refusing to talk to the process at %s: it is not the holder of this "
				  "handle (pid %d, uid %u; the handle's holder is pid %d). The holder has "
				  "gone; nothing was sent",
				  addr.sun_path, (int)cr.pid, (unsigned)cr.uid, p->pid);
			close(fd);
			*exit_rc = CLI_EXIT_FAIL;
			return -1;
		}
		*fd_out = fd;
		return 0;
	}
	return DLOCK_ENOTHELD;
}

int cli_holder_request(const cli_global *g, const char *name, const char *handle, const char *op, int64_t ttl_ms,
		       cli_holder_reply *out)
{
	parsed p;
	memset(out, 0, sizeof *out);
	if (strncmp(handle, OLD_HANDLE_PREFIX, strlen(OLD_HANDLE_PREFIX)) == 0)
		return cli_usage_error(g,
				       "bad handle: a holder handle of an older dlock (dlh1); use "
				       "that version to release it, or let its TTL pass");
	if (!parse_handle(handle, &p))
		return cli_usage_error(g,
				       "bad handle: malformed holder handle (expected what 'dlock acquire' printed)");
	int fd, exit_rc;
	if (holder_connect(g, &p, &fd, &exit_rc) != 0) {
		if (exit_rc)
			return exit_rc;
		/* No holder: it released, or its TTL passed without an extend. */
		out->code = DLOCK_ENOTHELD;
		snprintf(out->text, sizeof out->text, "the holder process of this handle is gone");
		return 0;
	}
	char req[REQUEST_MAX];
	int n = snprintf(req, sizeof req, "%s %s %lld %s\n", p.secret, op, (long long)ttl_ms, name);
	if (n <= 0 || (size_t)n >= sizeof req || !write_all(fd, req, (size_t)n)) {
		close(fd);
		cli_error(g, "cannot talk to the lock holder process");
		return CLI_EXIT_FAIL;
	}
	char buf[REQUEST_MAX];
	size_t len = 0;
	int64_t until = cli_mono_ms() + REPLY_TIMEOUT_MS;
	while (len + 1 < sizeof buf && !memchr(buf, '\n', len)) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		int64_t left = until - cli_mono_ms();
		if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
			break;
		ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	buf[len] = '\0';
	char *nl = strchr(buf, '\n');
	int used = 0;
	long long ttl_left = 0;
	unsigned long long fence = 0;
	if (!nl || nl[1] != '\0' || sscanf(buf, "%d %lld %llu %n", &out->code, &ttl_left, &fence, &used) != 3 ||
	    used == 0 || !known_code(out->code)) {
		cli_error(g, "no valid answer from the lock holder process");
		return CLI_EXIT_UNAVAILABLE;
	}
	*nl = '\0';
	out->ttl_left_ms = ttl_left;
	out->fence = fence;
	clean_text(out->text, sizeof out->text, buf + used);
	/* A success says exactly what it must: a handle of the same holder, or "released". */
	parsed np;
	bool ok = out->code != 0 || (strcmp(op, "extend") == 0 ? parse_handle(out->text, &np) && np.pid == p.pid &&
									 strcmp(np.secret, p.secret) == 0
							       : strcmp(out->text, "released") == 0);
	if (!ok) {
		cli_error(g, "malformed answer from the lock holder process");
		return CLI_EXIT_UNAVAILABLE;
	}
	return 0;
}
