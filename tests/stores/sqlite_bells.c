/* SQLite doorbells (docs/stores/sqlite.md, "Waiting"): a waiter in one
 * process is woken by a release in another at once, not when its back-off
 * ends. The holder's lease is long (30 s) and a waiter's registration is
 * refreshed every queue TTL / 3 (1 s), so a waiter that only polled would be
 * granted up to 1 s after the release; a rung one within milliseconds. Three
 * handoffs, each woken well before its 1 s nap would have ended; and the
 * bell directory is made only once someone waits.
 *
 * Fair queues: a fair waiter behind another listens only to its own bell,
 * rung when it comes to the front, and its process does not even watch its
 * bucket's bell meanwhile (read from /proc/PID/fdinfo). Two fair waiters (processes) queue behind
 * a holder; the holder lets go, the first is granted — which must ring the
 * second's bell — and when the first lets go the second is granted at once:
 * had its own bell not rung, it would still be listening for it alone and
 * come back only when its 1 s nap ends.
 *
 * Every file can vanish: a waiter's bell files deleted while it waits, then
 * the whole bell directory: the waiter looks at once, watches new ones (the
 * directory made again), and the next release still wakes it within
 * milliseconds — not at its nap.
 *
 * A release rings only when a waiter is queued: 20 waiting acquires and
 * releases of a free name ring nothing (counted with an inotify watch of the
 * test's own on the directory); one with a waiter queued rings. */
#include "testutil/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read n bytes from fd within ms; false on timeout, EOF or error. */
static bool read_by(int fd, void *buf, size_t n, int ms)
{
	size_t got = 0;
	long long until = mono_ms() + ms;
	while (got < n) {
		long long left = until - mono_ms();
		struct pollfd p = { fd, POLLIN, 0 };
		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return false;
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

/* The holder, ROUNDS times: when told, take `job` and say so; when told
 * again, release it and say when. */
static int holder(const char *uri, int in, int out, int rounds)
{
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0)
		return 1;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	dlock_lock *l;
	if (dlock_lock_new(&l, s, "job", &o) != 0)
		return 1;
	for (int i = 0; i < rounds; i++) {
		char c;
		if (read(in, &c, 1) != 1 || dlock_acquire(l, 20000) != 0)
			return 1;
		if (write(out, "h", 1) != 1 || read(in, &c, 1) != 1)
			return 1;
		long long t = mono_ms();
		if (dlock_release(l) != 0 || write(out, &t, sizeof t) != (ssize_t)sizeof t)
			return 1;
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

/* A fair waiter: when told, wait for `chain`; say when granted; when told
 * again, release and say when. */
static int fair_waiter(const char *uri, int in, int out)
{
	char c;
	if (read(in, &c, 1) != 1)
		return 1;
	dlock_store *s;
	if (dlock_store_open(&s, uri) != 0)
		return 1;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	o.fair = true;
	dlock_lock *l;
	if (dlock_lock_new(&l, s, "chain", &o) != 0 || dlock_acquire(l, 20000) != 0)
		return 1;
	long long t = mono_ms();
	if (write(out, &t, sizeof t) != (ssize_t)sizeof t || read(in, &c, 1) != 1)
		return 1;
	t = mono_ms();
	if (dlock_release(l) != 0 || write(out, &t, sizeof t) != (ssize_t)sizeof t)
		return 1;
	dlock_lock_free(l);
	dlock_store_close(s);
	return 0;
}

/* Whether process `pid` has an inotify watch on any of the bucket bells
 * (the two-hex-digit files) of directory `bells`: read from its fdinfo. */
static bool watches_a_bucket(pid_t pid, const char *bells)
{
	unsigned long inos[64];
	size_t n = 0;
	DIR *d = opendir(bells);
	for (struct dirent *e; d && (e = readdir(d)) != NULL && n < 64;) {
		char f[1000];
		struct stat st;
		snprintf(f, sizeof(f), "%s/%s", bells, e->d_name);
		if (strlen(e->d_name) == 2 && stat(f, &st) == 0 && S_ISREG(st.st_mode))
			inos[n++] = (unsigned long)st.st_ino;
	}
	if (d)
		closedir(d);
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/fdinfo", (int)pid);
	bool found = false;
	d = opendir(dir);
	for (struct dirent *e; d && !found && (e = readdir(d)) != NULL;) {
		char f[400], line[512];
		snprintf(f, sizeof(f), "%s/%s", dir, e->d_name);
		FILE *fp = fopen(f, "r");
		while (fp && !found && fgets(line, sizeof(line), fp)) {
			unsigned long ino;
			const char *at = strstr(line, " ino:");
			if (strncmp(line, "inotify wd:", 11) != 0 || !at || sscanf(at, " ino:%lx", &ino) != 1)
				continue;
			for (size_t i = 0; i < n && !found; i++)
				found = inos[i] == ino;
		}
		if (fp)
			fclose(fp);
	}
	if (d)
		closedir(d);
	return found;
}

/* Whether bell directory `bells` has a waiter's own bell (a file "o…"). */
static bool has_own_bell(const char *bells)
{
	bool found = false;
	DIR *d = opendir(bells);
	for (struct dirent *e; d && !found && (e = readdir(d)) != NULL;)
		found = e->d_name[0] == 'o';
	if (d)
		closedir(d);
	return found;
}

/* Wait (at most 10 s) until a waiter of this process listens to its bells:
 * its bucket watched and, if `fair`, its own bell made. A waiter's refused
 * try registers it, and the watch follows that try. */
static bool await_listening(const char *bells, bool fair)
{
	for (long long until = tu_now_ms() + 10000;;) {
		if (watches_a_bucket(getpid(), bells) && (!fair || has_own_bell(bells)))
			return true;
		if (tu_now_ms() >= until)
			return false;
		usleep(2000);
	}
}

/* A holder's and a waiter's handle on one name (the waiter's lock `fair`
 * if asked), and the waiter's outcome when it waits in a thread. */
typedef struct pair {
	dlock_store *s1, *s2;
	dlock_lock *h, *l;
	int rc;
	long long granted;
} pair;

static bool pair_open(pair *p, const char *uri, const char *name, bool fair)
{
	*p = (pair){ .rc = -1 };
	CHECK_RC(dlock_store_open(&p->s1, uri), 0);
	CHECK_RC(dlock_store_open(&p->s2, uri), 0);
	if (!p->s1 || !p->s2)
		return false;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.ttl_ms = 30000;
	CHECK_RC(dlock_lock_new(&p->h, p->s1, name, &o), 0);
	o.fair = fair;
	CHECK_RC(dlock_lock_new(&p->l, p->s2, name, &o), 0);
	return p->h && p->l;
}

static void pair_close(pair *p)
{
	dlock_lock_free(p->h);
	dlock_lock_free(p->l);
	dlock_store_close(p->s1);
	dlock_store_close(p->s2);
}

static void *vanish_wait(void *arg)
{
	pair *v = arg;
	v->rc = dlock_acquire(v->l, 15000);
	v->granted = mono_ms();
	if (v->rc == 0)
		v->rc = dlock_release(v->l);
	return NULL;
}

/* Remove every file of the bell directory (and, if `dir_too`, the directory:
 * renamed away first, so that a waiter woken by the first removal, which
 * makes its bells again at once, cannot refill it before the rmdir). */
static int clear_bells(const char *bells, bool dir_too)
{
	char gone[4200];
	if (dir_too) {
		snprintf(gone, sizeof gone, "%s.gone", bells);
		if (rename(bells, gone) != 0)
			return -1;
		bells = gone;
	}
	int n = 0;
	DIR *d = opendir(bells);
	for (struct dirent *e; d && (e = readdir(d)) != NULL;)
		if (e->d_name[0] != '.' && unlinkat(dirfd(d), e->d_name, 0) == 0)
			n++;
	if (d)
		closedir(d);
	if (dir_too && rmdir(bells) != 0)
		return -1;
	return n;
}

/* A waiter in its own handle (fair: it listens to its own bell too); its
 * bell files (or the directory) are removed while it waits; then the holder
 * releases: granted within milliseconds. */
static void vanish(const char *uri, const char *bells, bool dir_too, bool fair)
{
	pair v;
	if (!pair_open(&v, uri, "vanish", fair)) {
		pair_close(&v);
		return;
	}
	CHECK_RC(dlock_acquire(v.h, 0), 0);
	pthread_t t;
	pthread_create(&t, NULL, vanish_wait, &v);
	CHECK(tu_await_waiters(v.s1, "vanish", 1, 10000)); /* registered */
	CHECK(await_listening(bells, fair));
	int removed = clear_bells(bells, dir_too);
	CHECK(removed >= (fair ? 2 : 1)); /* its bucket's bell (and its own) */
	long long released = mono_ms();
	CHECK_RC(dlock_release(v.h), 0);
	pthread_join(t, NULL);
	CHECK_RC(v.rc, 0);
	printf("%s removed while a%s waiter waits: granted %lld ms after the release\n",
	       dir_too ? "the bell directory" : "the bell files", fair ? " fair" : "n unfair", v.granted - released);
	CHECK(v.granted - released < 400 + TU_SCHED_GRACE_MS); /* rung: not the 1 s nap */
	/* (Its bells are made again by its next refused try's watch: a waiter
	 * granted at the try its removal woke makes none.) */
	pair_close(&v);
}

/* Rings (a bell file closed after writing) in the directory since the last
 * read: 0, or at least 1 (inotify merges repeats of one file). */
static int rings(int ifd)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	int n = 0;
	ssize_t got;
	while ((got = read(ifd, buf, sizeof buf)) > 0)
		for (char *q = buf; q < buf + got;) {
			struct inotify_event *ev = (struct inotify_event *)q;
			n += (ev->mask & IN_CLOSE_WRITE) != 0;
			q += sizeof(*ev) + ev->len;
		}
	return n;
}

static void quiet_release(const char *uri, const char *bells)
{
	/* the directory a waiter makes (the last one of vanish() may have been
	 * granted without making it again) */
	CHECK(mkdir(bells, 0700) == 0 || errno == EEXIST);
	int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	CHECK(ifd >= 0 && inotify_add_watch(ifd, bells, IN_CLOSE_WRITE) >= 0);
	pair v;
	if (ifd < 0 || !pair_open(&v, uri, "quiet", false)) {
		if (ifd >= 0) {
			close(ifd);
			pair_close(&v);
		}
		return;
	}
	for (int i = 0; i < 20; i++) {
		CHECK_RC(dlock_acquire(v.h, 1000), 0); /* a waiting acquire, never refused */
		CHECK_RC(dlock_release(v.h), 0);
	}
	int quiet = rings(ifd);
	CHECK_RC(dlock_acquire(v.h, 0), 0);
	pthread_t t;
	pthread_create(&t, NULL, vanish_wait, &v);
	CHECK(tu_await_waiters(v.s1, "quiet", 1, 10000));
	CHECK_RC(dlock_release(v.h), 0);
	pthread_join(t, NULL);
	CHECK_RC(v.rc, 0);
	/* the ring's event was queued at its close, inside dlock_release */
	int rung = rings(ifd);
	printf("rings: %d for 20 releases nobody waited for, %d for one with a waiter\n", quiet, rung);
	CHECK(quiet == 0);
	CHECK(rung >= 1);
	pair_close(&v);
	close(ifd);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	mkdir(argv[1], 0700);
	char path[600], uri[700], bells[700];
	snprintf(path, sizeof(path), "%s/bells.db", argv[1]);
	snprintf(bells, sizeof(bells), "%s.bells", path);
	unlink(path);
	DIR *left = opendir(bells); /* a directory left by an earlier run */
	for (struct dirent *e; left && (e = readdir(left)) != NULL;)
		if (e->d_name[0] != '.')
			unlinkat(dirfd(left), e->d_name, 0);
	if (left)
		closedir(left);
	rmdir(bells);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	const int rounds = 3;
	/* The other processes are forked before this one opens anything (no
	 * thread of ours is copied into them), and every read is bounded. */
	int to_holder[2], from_holder[2], to_rel[2];
	if (pipe(to_holder) || pipe(from_holder) || pipe(to_rel))
		return 2;
	pid_t pid = fork();
	if (pid == 0) {
		close(to_holder[1]);
		close(from_holder[0]);
		close(to_rel[0]);
		close(to_rel[1]);
		_exit(holder(uri, to_holder[0], from_holder[1], rounds));
	}
	pid_t rel = fork();
	if (rel == 0) {
		/* the releaser, each round when told: watch for our registration,
		 * then tell the holder to let go */
		close(to_rel[1]);
		close(from_holder[0]);
		close(from_holder[1]);
		close(to_holder[0]);
		dlock_store *p2;
		if (dlock_store_open(&p2, uri) != 0)
			_exit(1);
		char c;
		while (read(to_rel[0], &c, 1) == 1) {
			tu_await_waiters(p2, "job", 1, 10000); /* bounded: the holder lets go either way */
			if (write(to_holder[1], "r", 1) != 1)
				_exit(1);
		}
		dlock_store_close(p2);
		_exit(0);
	}
	int to_w[2][2], from_w[2][2];
	pid_t wp[2];
	for (int k = 0; k < 2; k++) {
		if (pipe(to_w[k]) || pipe(from_w[k]))
			return 2;
		if ((wp[k] = fork()) == 0) {
			close(to_w[k][1]);
			close(from_w[k][0]);
			_exit(fair_waiter(uri, to_w[k][0], from_w[k][1]));
		}
		close(to_w[k][0]);
		close(from_w[k][1]);
	}
	close(to_holder[0]);
	close(from_holder[1]);
	close(to_rel[0]);

	dlock_store *s;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	dlock_lock *w = NULL;
	if (s)
		CHECK_RC(dlock_lock_new(&w, s, "job", NULL), 0);
	/* no waiter yet: a release rings nothing and makes no directory */
	if (w) {
		CHECK_RC(dlock_acquire(w, 0), 0);
		CHECK_RC(dlock_release(w), 0);
	}
	struct stat st;
	CHECK(stat(bells, &st) != 0);
	for (int i = 0; w && i < rounds; i++) {
		char c = 0;
		CHECK(write(to_holder[1], "a", 1) == 1);
		if (!read_by(from_holder[0], &c, 1, 30000) || c != 'h') {
			CHECK(!"the holder did not take the lock");
			break;
		}
		CHECK(write(to_rel[1], "g", 1) == 1);
		CHECK_RC(dlock_acquire(w, 15000), 0);
		long long granted = mono_ms(), released = 0;
		if (!read_by(from_holder[0], &released, sizeof released, 30000)) {
			CHECK(!"the holder did not release");
			break;
		}
		printf("handoff %d: granted %lld ms after the release in another process\n", i + 1, granted - released);
		CHECK(granted - released < 400 + TU_SCHED_GRACE_MS); /* rung: not the 1 s nap */
		CHECK_RC(dlock_release(w), 0);
	}
	CHECK(stat(bells, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);

	/* the fair chain: we hold, two fair waiters queue in order */
	dlock_lock *h = NULL;
	if (s)
		CHECK_RC(dlock_lock_new(&h, s, "chain", NULL), 0);
	if (h)
		CHECK_RC(dlock_acquire(h, 0), 0);
	CHECK(write(to_w[0][1], "g", 1) == 1);
	CHECK(s && tu_await_waiters(s, "chain", 1, 10000));
	CHECK(write(to_w[1][1], "g", 1) == 1);
	CHECK(s && tu_await_waiters(s, "chain", 2, 10000));
	/* the second, behind the first, does not even watch its bucket: a
	 * release wakes the front's process only (the first watches it) */
	bool front_hears = watches_a_bucket(wp[0], bells), behind_hears = watches_a_bucket(wp[1], bells);
	printf("fair chain: the front waiter's process watches its bucket: %s; the one behind: %s\n",
	       front_hears ? "yes" : "no", behind_hears ? "yes" : "no");
	CHECK(front_hears);
	CHECK(!behind_hears);
	long long g1 = 0, r1 = 0, g2 = 0, rel0 = mono_ms();
	if (h)
		CHECK_RC(dlock_release(h), 0);
	CHECK(read_by(from_w[0][0], &g1, sizeof g1, 30000));
	CHECK(write(to_w[0][1], "r", 1) == 1);
	CHECK(read_by(from_w[0][0], &r1, sizeof r1, 30000));
	CHECK(read_by(from_w[1][0], &g2, sizeof g2, 30000));
	printf("fair chain: first granted %lld ms after our release, second %lld ms after the first's\n", g1 - rel0,
	       g2 - r1);
	CHECK(g1 && g1 - rel0 < 400 + TU_SCHED_GRACE_MS);
	CHECK(g2 && r1 && g2 >= r1 && g2 - r1 < 400 + TU_SCHED_GRACE_MS); /* its own bell rang */
	CHECK(write(to_w[1][1], "r", 1) == 1);
	long long r2 = 0;
	CHECK(read_by(from_w[1][0], &r2, sizeof r2, 30000));
	for (int k = 0; k < 2; k++) {
		int wst = -1;
		for (long long until = mono_ms() + 30000; mono_ms() < until && waitpid(wp[k], &wst, WNOHANG) == 0;)
			usleep(10000);
		if (wst == -1)
			kill(wp[k], SIGKILL);
		CHECK(wst != -1 && WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
		close(to_w[k][1]);
		close(from_w[k][0]);
	}
	dlock_lock_free(h);
	vanish(uri, bells, false, true);
	vanish(uri, bells, true, false);
	quiet_release(uri, bells);
	/* A waiter that died waiting leaves its own bell file: one untouched for
	 * an hour is removed when a handle starts its bells; a recent one stays. */
	char stale[760], recent[760];
	snprintf(stale, sizeof stale, "%s/o%016llx", bells, 0x5ea1edULL);
	snprintf(recent, sizeof recent, "%s/o%016llx", bells, 0x7ece17ULL);
	for (int k = 0; k < 2; k++) {
		int fd = open(k ? recent : stale, O_WRONLY | O_CREAT, 0600);
		CHECK(fd >= 0);
		if (fd >= 0)
			close(fd);
	}
	struct timespec old[2] = { { time(NULL) - 7200, 0 }, { time(NULL) - 7200, 0 } };
	CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);
	{
		dlock_store *s1 = NULL, *s2 = NULL;
		CHECK_RC(dlock_store_open(&s1, uri), 0);
		CHECK_RC(dlock_store_open(&s2, uri), 0);
		dlock_lock *a = NULL, *b = NULL;
		dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
		CHECK_RC(dlock_lock_new(&a, s1, "sweep", &o), 0);
		CHECK_RC(dlock_lock_new(&b, s2, "sweep", &o), 0);
		CHECK_RC(dlock_acquire(a, 0), 0);
		CHECK_RC(dlock_acquire(b, 500), DLOCK_ETIMEOUT); /* s2 starts its bells */
		CHECK_RC(dlock_release(a), 0);
		dlock_lock_free(a);
		dlock_lock_free(b);
		dlock_store_close(s1);
		dlock_store_close(s2);
	}
	CHECK(access(stale, F_OK) != 0);
	CHECK(access(recent, F_OK) == 0);
	unlink(recent);
	/* a waiter's own bell goes with its ring or its wait: only bucket bells stay */
	DIR *dir = opendir(bells);
	int others = 0;
	for (struct dirent *e; dir && (e = readdir(dir)) != NULL;)
		others += e->d_name[0] != '.' && strlen(e->d_name) != 2;
	if (dir)
		closedir(dir);
	CHECK(dir && others == 0);
	close(to_holder[1]);
	close(to_rel[1]);
	int cst = -1, rst = -1;
	for (long long until = mono_ms() + 30000; mono_ms() < until && (cst == -1 || rst == -1);) {
		if (cst == -1 && waitpid(pid, &cst, WNOHANG) == 0)
			cst = -1;
		if (rst == -1 && waitpid(rel, &rst, WNOHANG) == 0)
			rst = -1;
		usleep(10000);
	}
	if (cst == -1)
		kill(pid, SIGKILL);
	if (rst == -1)
		kill(rel, SIGKILL);
	CHECK(cst != -1 && WIFEXITED(cst) && WEXITSTATUS(cst) == 0);
	CHECK(rst != -1 && WIFEXITED(rst) && WEXITSTATUS(rst) == 0);
	dlock_lock_free(w);
	dlock_store_close(s);
	return tu_done("sqlite.bells");
}
