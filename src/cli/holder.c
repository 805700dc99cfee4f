/*
 * holder.c — `dlock acquire` on stores whose locks live and die with a
 * session or connection (ZooKeeper, MySQL get_lock, PostgreSQL advisory;
 * dlock_store_session_bound). Such a hold cannot outlive the process that
 * took it, so `acquire` leaves a small holder process behind: it takes the
 * lock, keeps the session alive, and gives the lock up when `dlock release`
 * asks, or when its TTL passes without a `dlock extend` — the same contract
 * as every other store (DESIGN.md §4).
 *
 * extend/release reach the holder over a Linux abstract Unix socket (no file
 * to clean up; it vanishes with the holder). The handle carries the socket's
 * name and a 128-bit secret that every request must present, so only whoever
 * was given the handle can act on the hold; the holder also refuses peers of
 * another uid (root excepted).
 *
 *   handle:  dlh1.<x|s>.<permits>.<fence>.<ttl ms>.<socket id, 16 hex>.<secret, 32 hex>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HANDLE_PREFIX "dlh1."
#define REQUEST_MAX 1024
#define REPLY_TIMEOUT_MS 60000


bool cli_holder_handle(const char *handle)
{
	return strncmp(handle, HANDLE_PREFIX, strlen(HANDLE_PREFIX)) == 0;
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

static socklen_t abstract_addr(struct sockaddr_un *a, const char *sockid)
{
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	/* sun_path[0] == '\0': the abstract namespace. */
	int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "dlock-holder/%s", sockid);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

typedef struct parsed {
	char mode;
	unsigned permits;
	uint64_t fence;
	int64_t ttl;
	char sockid[17];
	char secret[33];
} parsed;

static bool parse_handle(const char *h, parsed *p)
{
	int used = 0;
	if (strlen(h) > 200 ||
	    sscanf(h, HANDLE_PREFIX "%c.%u.%" SCNu64 ".%" SCNd64 ".%16[0-9a-f].%32[0-9a-f]%n", &p->mode,
		   &p->permits, &p->fence, &p->ttl, p->sockid, p->secret, &used) != 6)
		return false;
	return h[used] == '\0' && strlen(p->sockid) == 16 && strlen(p->secret) == 32 &&
	       (p->mode == 'x' || p->mode == 's');
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
	int n = snprintf(line, sizeof line, "%d %lld %llu %s\n", code, (long long)ttl_left,
			 (unsigned long long)fence, text);
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
	snprintf(out, len, HANDLE_PREFIX "%c.%u.%llu.%lld.%s.%s", h->mode, h->permits,
		 (unsigned long long)dlock_fence(h->lock), (long long)h->ttl, h->sockid, h->secret);
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
	int n = snprintf(line, sizeof line, "%d %llu %lld %s\n", code, (unsigned long long)fence,
			 (long long)ttl_left, text);
	return n > 0 && write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
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
	struct sockaddr_un addr;
	socklen_t alen = abstract_addr(&addr, h.sockid);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, alen) != 0 || listen(lfd, 8) != 0) {
		report(rfd, DLOCK_ENOTSUPPORTED, 0, 0, "cannot listen on a holder socket");
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
	if (lfd >= 0)
		close(lfd);
	dlock_lock_free(lock); /* releases a hold still held (expired TTL, failed report) */
	dlock_store_close(store);
	return 0;
}

int cli_holder_acquire(const cli_global *g, const char *uri, const char *name,
		       const cli_lockopts *lo)
{
	int rp[2];
	if (pipe2(rp, O_CLOEXEC) != 0) {
		cli_error(g, "pipe: %s", strerror(errno));
		return CLI_EXIT_FAIL;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		cli_error(g, "fork: %s", strerror(errno));
		close(rp[0]);
		close(rp[1]);
		return CLI_EXIT_FAIL;
	}
	if (pid == 0) {
		/*
		 * The holder outlives us: it must not keep our stdout open (a
		 * script's $(dlock acquire ...) waits for EOF on it) nor stderr.
		 */
		close(rp[0]);
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			dup2(null, STDERR_FILENO);
		}
		/* Nor any other descriptor of the caller (a pipe some script waits on). */
		if (rp[1] > 3)
			close_range(3, (unsigned)rp[1] - 1, 0);
		close_range((unsigned)rp[1] + 1, ~0U, 0);
		if (chdir("/") != 0) {
			/* harmless: only keeps a directory busy */
		}
		_exit(holder_main(uri, name, lo, rp[1]));
	}
	close(rp[1]);
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
	if (sscanf(buf, "%d %llu %lld %n", &code, &fence, &ttl_left, &used) != 3 || used == 0) {
		/* The holder died before reporting: reap it. */
		waitpid(pid, NULL, 0);
		cli_error(g, "the lock holder process failed to start");
		return CLI_EXIT_FAIL;
	}
	const char *text = buf + used;
	if (code != 0) {
		waitpid(pid, NULL, 0);
		if (code == DLOCK_ETIMEOUT || code == DLOCK_ELOCKED) {
			cli_info(g, "lock '%s' is held by another", name);
			return CLI_EXIT_NOTACQUIRED;
		}
		cli_error(g, "acquire: %s", text);
		return cli_exit_code(code);
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

int cli_holder_request(const cli_global *g, const char *name, const char *handle,
		       const char *op, int64_t ttl_ms, cli_holder_reply *out)
{
	parsed p;
	memset(out, 0, sizeof *out);
	if (!parse_handle(handle, &p))
		return cli_usage_error(g, "bad handle: malformed holder handle (expected what 'dlock acquire' printed)");
	struct sockaddr_un addr;
	socklen_t alen = abstract_addr(&addr, p.sockid);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		cli_error(g, "socket: %s", strerror(errno));
		return CLI_EXIT_FAIL;
	}
	if (connect(fd, (struct sockaddr *)&addr, alen) != 0) {
		/* No holder: it released, or its TTL passed without an extend. */
		close(fd);
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
	if (nl)
		*nl = '\0';
	int used = 0;
	long long ttl_left = 0;
	unsigned long long fence = 0;
	if (sscanf(buf, "%d %lld %llu %n", &out->code, &ttl_left, &fence, &used) != 3 || used == 0) {
		cli_error(g, "no answer from the lock holder process");
		return CLI_EXIT_UNAVAILABLE;
	}
	out->ttl_left_ms = ttl_left;
	out->fence = fence;
	snprintf(out->text, sizeof out->text, "%s", buf + used);
	return 0;
}
