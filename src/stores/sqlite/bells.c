/*
 * The embedded store's wake-ups: doorbell files beside the database, watched
 * with inotify, and the presence of fair waiters (see below).
 */
#include "sqlite/sq.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <inttypes.h>
#include <time.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- doorbells: waking waiters without polling ----
 *
 * Every client of a file is on this machine, so a release can wake the
 * waiters of the same name in other processes through the file system: a
 * directory "<db>.bells" beside the database holds one file per bucket of
 * names (64); a release, or a waiter leaving the queue, opens and closes
 * its bucket's file for writing ("rings"), and each waiting store handle
 * watches the bell files it listens to with inotify (not the directory: a
 * ring wakes only its listeners) and wakes the core's board for the names
 * it waits on in that bucket. A ring costs two system calls and is
 * skipped while no waiter has made the directory. A dead holder rings
 * nothing: its waiters come back when its lease ends (the acquire's
 * retry time). A ring that is missed or spurious costs one try, never
 * safety: every decision is still the database's.
 *
 * A fair waiter behind others cannot be granted before they are, so it does
 * not listen to its bucket (every release would wake it for nothing, and a
 * herd of refused write transactions is what slowed fair mode): it listens
 * only to a bell of its own, "o<hash of its owner>", which is rung when it
 * moves up to the front or to second place — by the grant that took the
 * waiter before it out of the queue, by that waiter's leaving, or by the
 * removal of an expired registration ahead (note_head). A waiter learns
 * where it stands from each refused try. A fair waiter's own bell is also
 * its presence (presence_take): the waiters at the front whose processes
 * died leave the queue at the next release, grant, cancel or fair try
 * (drop_dead_front), and the live one after them is rung. Without a
 * presence (no bells, an older library) a dead waiter is waited out by its
 * registration, as before (a waiter far back naps longer: FAR_TTL). */
#define NBELLS 64

typedef struct bell_watch {
	struct bell_watch *next;
	char *name;
	char owner[DLOCK_SYS_OWNER_MAX];
	unsigned bucket;
	int own_wd;    /* inotify watch of its own bell file, -1: none (yet, or its file was removed) */
	int live_fd;   /* its own bell file, open with a shared flock: its presence (-1: none) */
	bool behind;   /* a fair waiter with others ahead: only its own bell wakes it */
	bool placed;   /* its bells are watched (dlock__sq_watch ran for this wait) */
} bell_watch;

typedef struct bells {
	pthread_mutex_t mu;
	bell_watch *watches;  /* under mu */
	int bucket_wd[NBELLS]; /* the bucket files' watches (in the hub's instance), -1: not watched */
	sqlite_store *b;    /* the handle it wakes */
	struct bells *next;   /* in the hub's list (under hub.mu) */
	bool started;         /* in the hub */
} bells;

/*
 * The hub: ONE inotify instance and one thread for the bells of every store
 * handle of the process, however many wait (a user has 128 instances by
 * default, and programs that are not ours need them too). Each event goes
 * to every handle's bells, which match it against their own watches. Two
 * handles watching one bell file get the same watch descriptor: `refs`
 * counts its users, and only the last one's leaving removes the watch.
 * Locks: hub.mu (the list, the instance's life) before a bells' mu before
 * hub.ref_mu. The thread ends when the last handle's bells go.
 */
typedef struct hub_ref {
	int wd, n;
} hub_ref;

static struct {
	pthread_mutex_t mu, ref_mu;
	bells *list;
	int ifd, stop[2];
	pthread_t thread;
	bool running;
	pid_t pid;        /* of the process that made it: a fork()'s child starts anew */
	hub_ref *refs;    /* under ref_mu */
	size_t nrefs, caprefs;
} hub = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, NULL, -1, { -1, -1 }, 0, false, 0, NULL, 0, 0 };

/* Watch a bell file (a path) in the hub's instance: its descriptor, or -1. */
static int hub_watch(const char *path)
{
	pthread_mutex_lock(&hub.ref_mu);
	int wd = inotify_add_watch(hub.ifd, path, IN_CLOSE_WRITE | IN_DONT_FOLLOW);
	if (wd >= 0) {
		size_t i = 0;
		while (i < hub.nrefs && hub.refs[i].wd != wd)
			i++;
		if (i == hub.nrefs) {
			if (hub.nrefs == hub.caprefs) {
				size_t cap = hub.caprefs ? 2 * hub.caprefs : 64;
				hub_ref *r = realloc(hub.refs, cap * sizeof(*r));
				if (!r) { /* cannot count it: do without this watch */
					inotify_rm_watch(hub.ifd, wd);
					pthread_mutex_unlock(&hub.ref_mu);
					errno = ENOMEM;
					return -1;
				}
				hub.refs = r;
				hub.caprefs = cap;
			}
			hub.refs[hub.nrefs++] = (hub_ref){ wd, 0 };
		}
		hub.refs[i].n++;
	}
	pthread_mutex_unlock(&hub.ref_mu);
	return wd;
}

/* One user of watch wd leaves (`gone`: the kernel removed it, IN_IGNORED). */
static void hub_unwatch(int wd, bool gone)
{
	pthread_mutex_lock(&hub.ref_mu);
	for (size_t i = 0; i < hub.nrefs; i++)
		if (hub.refs[i].wd == wd) {
			if (gone || --hub.refs[i].n <= 0) {
				if (!gone)
					inotify_rm_watch(hub.ifd, wd);
				hub.refs[i] = hub.refs[--hub.nrefs];
			}
			break;
		}
	pthread_mutex_unlock(&hub.ref_mu);
}

/* In a fork()'s child: the parent's hub (its thread is not here; its locks
 * may have been held at the fork) is forgotten, its descriptors closed. */
static void hub_after_fork(void)
{
	if (hub.pid == 0 || hub.pid == getpid())
		return;
	pthread_mutex_init(&hub.mu, NULL);
	pthread_mutex_init(&hub.ref_mu, NULL);
	if (hub.ifd >= 0)
		close(hub.ifd);
	for (int i = 0; i < 2; i++)
		if (hub.stop[i] >= 0)
			close(hub.stop[i]);
	free(hub.refs);
	hub.refs = NULL;
	hub.nrefs = hub.caprefs = 0;
	hub.ifd = hub.stop[0] = hub.stop[1] = -1;
	hub.list = NULL;
	hub.running = false;
	hub.pid = 0;
}

static char *bells_dir(const sqlite_store *b)
{
	return dlock_sys_sprintf("%s.bells", b->paths[0]);
}

/* The modes of the bells directory and its files follow the database's:
 * its owner, and the group or others where the file lets them write (they
 * ring and listen too). Set explicitly, not left to the umask (a group of
 * a 0660 database lost its bits and polled). A directory others may write
 * is sticky: nobody removes another user's bell. */
static mode_t bells_dir_mode(mode_t db)
{
	mode_t m = 0700 | (db & 0020 ? 0070 : 0) | (db & 0002 ? 0007 : 0);
	return m & 0077 ? m | S_ISVTX : m;
}

static mode_t bell_file_mode(mode_t db)
{
	return 0600 | (db & 0020 ? 0060 : 0) | (db & 0002 ? 0006 : 0);
}

/*
 * The bells directory, opened as one we may trust — checked like the
 * writers' line (writeq.c): "<db>.bells" itself not a symbolic link
 * (O_NOFOLLOW: a link another user planted sent root's rings, and its
 * removals of stale bells, into a directory of the link's choosing), a
 * directory, owned by someone who may write the database anyway (us, its
 * owner, its group's members when the group may write it: the directory
 * has its group; anyone when others may), and writable by nobody the
 * database does not let write. With `make`, made first when
 * missing, and a directory of ours given the database's bits. A descriptor,
 * or -1 (missing and not made, or not trusted: no bells, the core polls).
 */
static int bells_dir_open(const sqlite_store *b, bool make)
{
	char *dir = bells_dir(b);
	if (!dir)
		return -1;
	mode_t mode = bells_dir_mode(b->db_mode);
	if (make)
		(void)mkdir(dir, 0700);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	free(dir);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		goto refuse;
	if (make && st.st_uid == geteuid() && (st.st_mode & 07777) != mode &&
	    (fchmod(fd, mode) != 0 || fstat(fd, &st) != 0))
		goto refuse;
	bool owner_ok = st.st_uid == geteuid() || st.st_uid == b->db_uid ||
			(b->db_mode & 0020 && st.st_gid == b->db_gid) || b->db_mode & 0002;
	if (S_ISDIR(st.st_mode) && owner_ok && !(st.st_mode & 0022 & ~(b->db_mode & 0022)))
		return fd;
refuse:
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Open bell `file` in the directory `dir` (made when missing and `create`,
 * with the database's bits); -1 and errno. */
static int bell_open(const sqlite_store *b, int dir, const char *file, int how, bool create)
{
	int flags = how | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	int fd = openat(dir, file, flags);
	if (fd >= 0 || errno != ENOENT || !create)
		return fd;
	fd = openat(dir, file, flags | O_CREAT | O_EXCL, 0600);
	if (fd >= 0)
		(void)fchmod(fd, bell_file_mode(b->db_mode));
	else if (errno == EEXIST) /* made meanwhile by another */
		fd = openat(dir, file, flags);
	return fd;
}

static unsigned bell_bucket(const sqlite_store *b, const char *name)
{
	uint64_t h = dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, b->ns, strlen(b->ns) + 1);
	return (unsigned)(dlock_sys_fnv1a64(h, name, strlen(name)) % NBELLS);
}

static uint64_t owner_bell(const sqlite_store *b, const char *owner)
{
	uint64_t h = dlock_sys_fnv1a64(DLOCK_SYS_FNV64_OFFSET, b->ns, strlen(b->ns) + 1);
	return dlock_sys_fnv1a64(h, owner, strlen(owner));
}

/* The file name of an owner's own bell. */
static void bell_name(const sqlite_store *b, const char *owner, char *f, size_t n)
{
	snprintf(f, n, "o%016" PRIx64, owner_bell(b, owner));
}

/*
 * A fair waiter's presence: its own bell file, made with one byte in it and
 * held open with a shared flock() for as long as it waits. The kernel lets
 * go of the lock the moment its process dies (however it dies), so a waiter
 * at the front of a queue is known dead at once instead of after its
 * registration: a byte in the file and no lock on it. The file is made
 * under a temporary name, written, locked, then linked in: nobody sees it at
 * its name unlocked while its waiter lives. An empty file (an older library
 * made it, without the lock) or none says nothing: the registration's TTL
 * decides, as before. A fork()'s child that keeps the descriptor keeps the
 * lock: its dead parent then counts as alive until its registration ends.
 */
static int presence_take(const sqlite_store *b, int dir, const char *file)
{
	char tmp[64];
	snprintf(tmp, sizeof tmp, "t%s.%d.%08llx", file, (int)getpid(),
		 (unsigned long long)dlock_sys_rand_between(0, 0xffffffff));
	int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	bool ok = fchmod(fd, bell_file_mode(b->db_mode)) == 0 && write(fd, "w", 1) == 1;
	close(fd);
	fd = ok ? openat(dir, tmp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
	if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0 && linkat(dir, tmp, dir, file, 0) != 0) {
		bool there = errno == EEXIST; /* made by an earlier watch of this waiter: lock that one */
		close(fd);
		fd = there ? openat(dir, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
		if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) {
			close(fd);
			fd = -1;
		}
	}
	unlinkat(dir, tmp, 0);
	return fd;
}

/* Is the waiter `owner` known dead (its presence, above, unlocked)? */
static bool waiter_gone(const sqlite_store *b, int dir, const char *owner)
{
	char f[24];
	bell_name(b, owner, f, sizeof f);
	int fd = openat(dir, f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return false;
	struct stat st;
	bool gone = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && flock(fd, LOCK_EX | LOCK_NB) == 0;
	close(fd); /* and our lock with it */
	return gone;
}

/* Waiters at the front of req->name's queue that are known dead leave it
 * now, however many died there (inside the write transaction): the queue
 * waits out no dead registration, short or long. *dropped: how many. */
#define FRONT_BATCH 16
#define FRONT_MAX 4096

int dlock__sq_drop_dead_front(sqlite_store *b, const dlock_request *req, int64_t *dropped)
{
	*dropped = 0;
	int dir = bells_dir_open(b, false);
	if (dir < 0) { /* no bells: no presence either */
		dlock_error_clear();
		return 0;
	}
	int rc = 0;
	bool alive = false;
	while (!rc && !alive && *dropped < FRONT_MAX) {
		char owners[FRONT_BATCH][DLOCK_SYS_OWNER_MAX];
		int n = 0, r;
		sqlite3_stmt *s = dlock__sq_prep(b, Q_FRONT, req->name, NULL);
		sqlite3_bind_int(s, 3, FRONT_BATCH);
		while (n < FRONT_BATCH && (r = sqlite3_step(s)) == SQLITE_ROW) {
			const unsigned char *o = sqlite3_column_text(s, 0);
			snprintf(owners[n++], sizeof owners[0], "%s", o ? (const char *)o : "");
		}
		if (n < FRONT_BATCH && r != SQLITE_DONE)
			rc = dlock__sq_fail(b, r, "read the queue's front");
		sqlite3_reset(s);
		for (int i = 0; i < n && !rc && !alive; i++) {
			if (!(alive = !waiter_gone(b, dir, owners[i])) &&
			    !(rc = dlock__sq_run(b, dlock__sq_prep(b, Q_DEQUEUE, req->name, owners[i]),
						 "drop a dead waiter")))
				++*dropped;
		}
		if (n < FRONT_BATCH)
			break;
	}
	close(dir);
	return rc;
}

/* Ring a bell file (best effort; nothing when no waiter made the directory).
 * A waiter's own bell (`own`) is rung only while it exists: its waiter makes
 * it, and watches it, after the try that registered it (then looks again at
 * once), and removes it when its wait ends. Not made here, nor removed after the ring: a second ring
 * before the waiter looked again would then go to a new file nobody watches
 * (a grant rings the second in line, and the next grant the same waiter at
 * the front). */
static void ring_file(const sqlite_store *b, const char *file, bool own)
{
	int dir = bells_dir_open(b, false);
	if (dir >= 0) {
		int fd = bell_open(b, dir, file, O_WRONLY, !own);
		if (fd >= 0)
			close(fd);
		close(dir);
	}
	dlock_error_clear(); /* an allocation that failed above is not the caller's error */
}

/* Ring the bucket of `name`: its waiters at the front (and unfair ones) look. */
void dlock__sq_ring(const sqlite_store *b, const char *name)
{
	char f[8];
	snprintf(f, sizeof f, "%02x", bell_bucket(b, name));
	ring_file(b, f, false);
}

/* Ring the bells of the first two in line of a queue that moved (note_head). */
void dlock__sq_ring_front(sqlite_store *b)
{
	for (int i = 0; i < 2 && b->front[i][0]; i++) {
		char f[24];
		bell_name(b, b->front[i], f, sizeof f);
		ring_file(b, f, true);
	}
	memset(b->front, 0, sizeof b->front);
}

/* The events of one read, for one handle's bells (under bl->mu). */
static void bells_dispatch(bells *bl, const char *buf, ssize_t n)
{
	bool rung[NBELLS] = { false }, lost[NBELLS] = { false }, all = false;
	int own[64], gone[64];
	size_t nown = 0, ngone = 0;
	for (const char *q = buf; q < buf + n;) {
		const struct inotify_event *ev = (const struct inotify_event *)q;
		q += sizeof(*ev) + ev->len;
		if (ev->mask & IN_Q_OVERFLOW) {
			all = true;
			continue;
		}
		bool bucket = false;
		for (unsigned v = 0; v < NBELLS && !bucket; v++)
			if (bl->bucket_wd[v] == ev->wd) {
				bucket = true;
				if (ev->mask & IN_IGNORED) {
					/* the file went (deleted): its listeners look now,
					 * and their next try makes and watches it again */
					bl->bucket_wd[v] = -1;
					lost[v] = true;
				} else {
					rung[v] = true;
				}
			}
		if (bucket)
			continue;
		if (ev->mask & IN_IGNORED) /* an own bell removed: rung, or deleted by someone */
			ngone < 64 ? (void)(gone[ngone++] = ev->wd) : (void)(all = true);
		else if (ev->mask & IN_CLOSE_WRITE)
			nown < 64 ? (void)(own[nown++] = ev->wd) : (void)(all = true);
	}
	for (bell_watch *w = bl->watches; w; w = w->next) {
		bool mine = false;
		for (size_t i = 0; i < nown && !mine; i++)
			mine = w->own_wd >= 0 && own[i] == w->own_wd;
		for (size_t i = 0; i < ngone; i++)
			if (w->own_wd >= 0 && gone[i] == w->own_wd) {
				w->own_wd = -1;
				mine = true; /* its file was removed: look, and watch a new one */
			}
		if (mine)
			dlock_backend_wake_owner(&bl->b->base, w->owner);
		else if (all || lost[w->bucket] || (rung[w->bucket] && !w->behind))
			dlock_backend_wake(&bl->b->base, w->name);
	}
}

/* The thread's descriptors come in its argument (int[2], freed here): the
 * last handle's leaving resets hub's fields before it joins the thread. */
static void *hub_main(void *arg)
{
	int ifd = ((int *)arg)[0], stop = ((int *)arg)[1];
	free(arg);
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		struct pollfd p[2] = { { ifd, POLLIN, 0 }, { stop, POLLIN, 0 } };
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		ssize_t n = read(ifd, buf, sizeof buf);
		if (n <= 0)
			continue;
		pthread_mutex_lock(&hub.mu);
		for (const char *q = buf; q < buf + n;) { /* watches the kernel removed */
			const struct inotify_event *ev = (const struct inotify_event *)q;
			q += sizeof(*ev) + ev->len;
			if (ev->mask & IN_IGNORED)
				hub_unwatch(ev->wd, true);
		}
		for (bells *bl = hub.list; bl; bl = bl->next) {
			pthread_mutex_lock(&bl->mu);
			bells_dispatch(bl, buf, n);
			pthread_mutex_unlock(&bl->mu);
		}
		pthread_mutex_unlock(&hub.mu);
	}
	return NULL;
}

/* A waiter makes its own bell file and removes it when it stops waiting;
 * one that died waiting leaves it.
 * Such files untouched for an hour are removed when a handle starts its
 * bells: a live waiter whose file goes makes a new one at its next try. */
#define STALE_BELL_S 3600

static void sweep_stale_bells(int dir)
{
	int fd = dup(dir);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	time_t now = time(NULL);
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		struct stat st;
		bool own = e->d_name[0] == 'o' && strlen(e->d_name) == 17, tmp = e->d_name[0] == 't';
		if ((own || tmp) && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(st.st_mode) && now - st.st_mtime > STALE_BELL_S) {
			/* not the bell of a waiter still waiting (its presence locked) */
			int f = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
			if (f >= 0 && flock(f, LOCK_EX | LOCK_NB) == 0)
				unlinkat(dirfd(d), e->d_name, 0);
			if (f >= 0)
				close(f);
		}
	}
	closedir(d);
}

/* Start the bells (once per handle): into the hub, started with the
 * first. 0 or an error (the core then polls). */
static int bells_start(sqlite_store *b)
{
	if (b->bells)
		return b->bells->started ? 0 : DLOCK_ESTORE;
	bells *bl = dlock_sys_calloc(1, sizeof(*bl));
	if (!bl)
		return DLOCK_ENOMEM;
	pthread_mutex_init(&bl->mu, NULL);
	for (unsigned v = 0; v < NBELLS; v++)
		bl->bucket_wd[v] = -1;
	bl->b = b;
	b->bells = bl;
	int dir = bells_dir_open(b, true);
	if (dir < 0)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL,
				       "sqlite: %s.bells is not a directory of this database's owner (or it "
				       "cannot be made): waiters poll",
				       b->paths[0]);
	sweep_stale_bells(dir);
	close(dir);
	pthread_mutex_lock(&hub.mu);
	hub_after_fork();
	int e = 0;
	if (!hub.running) {
		int *fds = NULL;
		if ((hub.ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0 || pipe2(hub.stop, O_CLOEXEC) != 0 ||
		    !(fds = malloc(2 * sizeof(int))) || (fds[0] = hub.ifd, fds[1] = hub.stop[0], false) ||
		    pthread_create(&hub.thread, NULL, hub_main, fds) != 0) {
			e = errno ? errno : EAGAIN;
			free(fds);
			if (hub.ifd >= 0)
				close(hub.ifd);
			for (int i = 0; i < 2; i++)
				if (hub.stop[i] >= 0)
					close(hub.stop[i]);
			hub.ifd = hub.stop[0] = hub.stop[1] = -1;
		} else {
			hub.running = true;
			hub.pid = getpid();
		}
	}
	if (!e) {
		bl->next = hub.list;
		hub.list = bl;
		bl->started = true;
	}
	pthread_mutex_unlock(&hub.mu);
	if (e)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: cannot watch for wake-ups: %s",
				       strerror(e));
	return 0;
}

/* Forget the bells (close; or fork's child: `in_parent` false, the hub is
 * the parent's). The last handle's leaving stops the hub. */
void dlock__sq_bells_free(sqlite_store *b, bool in_parent)
{
	bells *bl = b->bells;
	if (!bl)
		return;
	pthread_mutex_lock(&hub.mu);
	hub_after_fork();
	bool stop = false;
	pthread_t thread;
	int fds[3] = { -1, -1, -1 };
	if (bl->started && in_parent) {
		for (bells **p = &hub.list; *p; p = &(*p)->next)
			if (*p == bl) {
				*p = bl->next;
				break;
			}
		/* out of the list: the thread no longer looks at it */
		for (unsigned v = 0; v < NBELLS; v++)
			if (bl->bucket_wd[v] >= 0)
				hub_unwatch(bl->bucket_wd[v], false);
		for (bell_watch *w = bl->watches; w; w = w->next)
			if (w->own_wd >= 0)
				hub_unwatch(w->own_wd, false);
		if (!hub.list && hub.running) {
			stop = true;
			thread = hub.thread;
			fds[0] = hub.ifd;
			fds[1] = hub.stop[0];
			fds[2] = hub.stop[1];
			hub.ifd = hub.stop[0] = hub.stop[1] = -1;
			hub.running = false;
			free(hub.refs);
			hub.refs = NULL;
			hub.nrefs = hub.caprefs = 0;
		}
	}
	pthread_mutex_unlock(&hub.mu);
	if (stop) {
		(void)!write(fds[2], "x", 1);
		pthread_join(thread, NULL);
		for (int i = 0; i < 3; i++)
			close(fds[i]);
	}
	while (bl->watches) {
		bell_watch *w = bl->watches;
		bl->watches = w->next;
		/* a fork()'s child only closes its copy: the parent's lock stays */
		if (w->live_fd >= 0)
			close(w->live_fd);
		free(w->name);
		free(w);
	}
	if (in_parent)
		pthread_mutex_destroy(&bl->mu);
	free(bl);
	b->bells = NULL;
}

/* Watch bell `file` for rings into *wd, unless *wd is a watch already
 * (the file is created empty if missing, which rings nothing: opened for
 * reading). A watch of the file, not of the directory: a ring wakes only
 * the processes listening to that bell. */
static int watch_bell(const sqlite_store *b, const char *file, int *wd, int *live)
{
	if (*wd >= 0)
		return 0;
	/* the directory at the path now (made again if it vanished), checked */
	int dir = bells_dir_open(b, true);
	int fd = dir < 0 ? -1 : live ? presence_take(b, dir, file) : bell_open(b, dir, file, O_RDONLY, true);
	if (fd >= 0 && live) { /* kept: the presence of its waiter */
		if (*live >= 0)
			close(*live);
		*live = fd;
		fd = dup(fd);
	}
	if (fd >= 0) {
		close(fd);
		/* through the checked directory's descriptor, not its name */
		char f[64];
		snprintf(f, sizeof f, "/proc/self/fd/%d/%s", dir, file);
		*wd = hub_watch(f);
	}
	int e = errno;
	if (dir >= 0)
		close(dir);
	return *wd >= 0 ? 0
			: dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: cannot watch a doorbell: %s",
					  dir < 0 ? "the bells directory is not trusted" : strerror(e));
}

/* Watch bucket v's bell file (a no-op when watched already). (under bl->mu) */
static int watch_bucket(const sqlite_store *b, unsigned v)
{
	char bucket[8];
	snprintf(bucket, sizeof bucket, "%02x", v);
	return watch_bell(b, bucket, &b->bells->bucket_wd[v], NULL);
}

/* Does a waiter of this handle listen to bucket v? (under bl->mu) */
static bool bucket_heard(const bells *bl, unsigned v)
{
	for (const bell_watch *w = bl->watches; w; w = w->next)
		if (w->bucket == v && !w->behind)
			return true;
	return false;
}

/* The bucket's watch goes when a fair waiter falls behind and no other
 * waiter here listens to it: the kernel then wakes only the processes that
 * do (with 1,000 fair waiters, every release woke 1,000 bell threads for one
 * front waiter). Its IN_IGNORED matches no watch any more: nothing is woken
 * for it. It stays when a wait ends (the next wait of the handle, the
 * common case, would make it again: two system calls per acquire). (under
 * bl->mu) */
static void bucket_unheard(bells *bl, unsigned v)
{
	if (bl->bucket_wd[v] >= 0 && !bucket_heard(bl, v)) {
		hub_unwatch(bl->bucket_wd[v], false);
		bl->bucket_wd[v] = -1;
	}
}

/* The wait of req->owner (under bl->mu): found, or made (not yet listening:
 * `placed` false), or moved to req->name (a handle reused for another name:
 * listening again). NULL when out of memory. */
static bell_watch *watch_get(bells *bl, const sqlite_store *b, const dlock_request *req)
{
	bell_watch *w;
	for (w = bl->watches; w; w = w->next)
		if (strcmp(w->owner, req->owner) == 0)
			break;
	if (w && strcmp(w->name, req->name) != 0) {
		char *n = dlock_sys_strdup(req->name);
		if (!n)
			return NULL;
		free(w->name);
		w->name = n;
		w->bucket = bell_bucket(b, req->name);
		w->behind = false;
		w->placed = false;
	} else if (!w && (w = calloc(1, sizeof(*w))) != NULL) {
		if (!(w->name = dlock_sys_strdup(req->name))) {
			free(w);
			return NULL;
		}
		snprintf(w->owner, sizeof(w->owner), "%s", req->owner);
		w->bucket = bell_bucket(b, req->name);
		w->own_wd = -1;
		w->live_fd = -1;
		w->next = bl->watches;
		bl->watches = w;
	}
	return w;
}

int dlock__sq_watch(dlock_backend *be, const dlock_request *req)
{
	sqlite_store *b = (sqlite_store *)be;
	int rc = bells_start(b);
	if (rc)
		return rc;
	bells *bl = b->bells;
	pthread_mutex_lock(&bl->mu);
	bell_watch *w = watch_get(bl, b, req);
	bool fresh = false;
	rc = w ? 0 : dlock_sys_oom();
	if (w) {
		/* The core calls this after a refused try: a ring between that
		 * try's look and this watch found no one listening here. A new wait
		 * (or one moved to another name), or one whose bell had to be
		 * watched again (its file was removed), looks once more at once.
		 * A fair waiter behind others listens to its own bell alone (its
		 * refused try said so: dlock__sq_bell_behind). */
		fresh = !w->placed || (!w->behind && bl->bucket_wd[w->bucket] < 0) || (req->fair && w->own_wd < 0);
		w->placed = true;
		if (!w->behind)
			rc = watch_bucket(b, w->bucket);
		/* only a fair waiter may be rung alone (when it comes to the front) */
		if (!rc && req->fair) {
			char own[24];
			bell_name(b, w->owner, own, sizeof own);
			rc = watch_bell(b, own, &w->own_wd, &w->live_fd);
		}
	}
	pthread_mutex_unlock(&bl->mu);
	if (fresh && rc == 0)
		dlock_backend_wake(be, req->name);
	return rc;
}

void dlock__sq_unwatch(dlock_backend *be, const dlock_request *req)
{
	sqlite_store *b = (sqlite_store *)be;
	bells *bl = b->bells;
	if (!bl)
		return;
	pthread_mutex_lock(&bl->mu);
	for (bell_watch **p = &bl->watches; *p; p = &(*p)->next) {
		if (strcmp((*p)->owner, req->owner) == 0) {
			bell_watch *w = *p;
			*p = w->next;
			if (w->own_wd >= 0) { /* its bell: take it away (its presence with it) */
				char f[24];
				bell_name(b, w->owner, f, sizeof f);
				hub_unwatch(w->own_wd, false);
				int dir = bells_dir_open(b, false);
				if (dir >= 0) {
					unlinkat(dir, f, 0);
					close(dir);
				}
			}
			if (w->live_fd >= 0)
				close(w->live_fd);
			free(w->name);
			free(w);
			break;
		}
	}
	pthread_mutex_unlock(&bl->mu);
}

/*
 * After a refused try of a fair waiter: whether it has others ahead. Its
 * wait is noted here (watch_get) before the core's watch comes, so that a
 * waiter behind others never listens to its bucket, not even once. True
 * when a waiter already listening came to the front and its bucket was
 * watched again just now: a release between its look and that watch rang
 * unheard, so it must look again at once.
 */
bool dlock__sq_bell_behind(sqlite_store *b, const dlock_request *req, bool behind, bool *own_heard)
{
	*own_heard = false;
	dlock_sys_saved_error saved; /* inside the caller's transaction: its error stands */
	dlock_sys_error_save(&saved);
	int started = bells_start(b);
	dlock_sys_error_restore(&saved);
	if (started != 0)
		return false;
	bells *bl = b->bells;
	bool again = false;
	pthread_mutex_lock(&bl->mu);
	bell_watch *w = watch_get(bl, b, req);
	if (w) {
		w->behind = behind;
		*own_heard = w->own_wd >= 0;
		if (behind)
			bucket_unheard(bl, w->bucket);
		else if (w->placed && bl->bucket_wd[w->bucket] < 0)
			again = watch_bucket(b, w->bucket) == 0;
	}
	pthread_mutex_unlock(&bl->mu);
	return again;
}
