/*
 * The writers' line of an SQLite database (writeq.h).
 */
#include "sqlite/writeq.h"

#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WQ_MAGIC "dlockwq1"
#define WQ_SIZE 4096

/* The file's one page. A mutex layout of another C library would not match:
 * its size is in the header, and a file whose size differs is not used. */
typedef struct wq_page {
	char magic[8];
	uint32_t mutex_size;
	uint32_t reserved;
	pthread_mutex_t mu;
} wq_page;

_Static_assert(sizeof(wq_page) <= WQ_SIZE, "the line's header fits its page");

struct dlock__wq {
	wq_page *page;
	dev_t dev;
	ino_t ino;
	bool held;
};

static char *wq_path(const char *db_path)
{
	size_t n = strlen(db_path) + sizeof(".writers");
	char *p = malloc(n);
	if (p)
		snprintf(p, n, "%s.writers", db_path);
	return p;
}

/* The write bits the database gives its group and others: the line's file
 * may give no more (a user who cannot write the database must not be able
 * to stall its writers through the line). */
static mode_t db_write_bits(const struct stat *db)
{
	return db->st_mode & 0022;
}

static bool trusted(const struct stat *st, const struct stat *db)
{
	return S_ISREG(st->st_mode) && st->st_size >= WQ_SIZE &&
	       (st->st_uid == geteuid() || st->st_uid == db->st_uid) && !(st->st_mode & 0022 & ~db_write_bits(db));
}

/* A new line in a file of its own, linked in under `path` only once its
 * mutex is set up: no opener ever sees a half-made one. */
static int make_line(const char *path, const struct stat *db)
{
	size_t n = strlen(path) + 32;
	char *tmp = malloc(n);
	if (!tmp)
		return -1;
	snprintf(tmp, n, "%s.%d.%08llx", path, (int)getpid(),
		 (unsigned long long)dlock_sys_rand_between(0, 0xffffffff));
	mode_t mode = 0600 | (db->st_mode & 0020 ? 0060 : 0) | (db->st_mode & 0002 ? 0006 : 0);
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	int rc = -1;
	wq_page *pg = MAP_FAILED;
	if (fd < 0)
		goto out;
	if (fchmod(fd, mode) != 0 || ftruncate(fd, WQ_SIZE) != 0)
		goto out;
	pg = mmap(NULL, WQ_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pg == MAP_FAILED)
		goto out;
	pthread_mutexattr_t a;
	if (pthread_mutexattr_init(&a) != 0)
		goto out;
	bool ok = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) == 0 &&
		  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 &&
		  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK) == 0 && pthread_mutex_init(&pg->mu, &a) == 0;
	pthread_mutexattr_destroy(&a);
	if (!ok)
		goto out;
	pg->mutex_size = (uint32_t)sizeof(pthread_mutex_t);
	memcpy(pg->magic, WQ_MAGIC, sizeof(pg->magic));
	/* link, not rename: a line another opener made meanwhile stays the one */
	rc = link(tmp, path) == 0 || errno == EEXIST ? 0 : -1;
out:
	if (pg != MAP_FAILED)
		munmap(pg, WQ_SIZE);
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	free(tmp);
	return rc;
}

dlock__wq *dlock__wq_open(const char *db_path, bool create)
{
	struct stat db, st;
	char *path = wq_path(db_path);
	dlock__wq *q = NULL;
	int fd = -1;
	if (!path || stat(db_path, &db) != 0)
		goto out;
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno == ENOENT && create && make_line(path, &db) == 0)
		fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 || fstat(fd, &st) != 0 || !trusted(&st, &db))
		goto out;
	wq_page *pg = mmap(NULL, WQ_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pg == MAP_FAILED)
		goto out;
	if (memcmp(pg->magic, WQ_MAGIC, sizeof(pg->magic)) != 0 || pg->mutex_size != sizeof(pthread_mutex_t) ||
	    !(q = calloc(1, sizeof(*q)))) {
		munmap(pg, WQ_SIZE);
		goto out;
	}
	q->page = pg;
	q->dev = st.st_dev;
	q->ino = st.st_ino;
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return q;
}

/* A wall-clock time `ms` from now, for pthread_mutex_timedlock. */
static struct timespec wall_in(int64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

int dlock__wq_enter(dlock__wq *q, int64_t deadline_ms)
{
	if (q->held)
		return 0;
	/* timedlock counts on the wall clock: in slices of at most 100 ms, each
	 * checked against the monotonic deadline, so a clock step cannot stretch
	 * the wait (the line's holder still wakes us the moment it lets go) */
	for (;;) {
		int64_t left = deadline_ms - dlock_clock_ms();
		int e;
		if (left <= 0) {
			e = pthread_mutex_trylock(&q->page->mu);
		} else {
			struct timespec ts = wall_in(left < 100 ? left : 100);
			e = pthread_mutex_timedlock(&q->page->mu, &ts);
		}
		if (e == EOWNERDEAD) /* its holder died mid-write: SQLite rolled that back */
			e = pthread_mutex_consistent(&q->page->mu);
		if (e == 0) {
			q->held = true;
			return 0;
		}
		if (e == EBUSY) /* the deadline came: one last look found it taken */
			return 1;
		if (e != ETIMEDOUT)
			return -1;
	}
}

void dlock__wq_leave(dlock__wq *q)
{
	if (q && q->held) {
		q->held = false;
		pthread_mutex_unlock(&q->page->mu);
	}
}

bool dlock__wq_current(const dlock__wq *q, const char *db_path)
{
	char *path = wq_path(db_path);
	struct stat st;
	bool same = path && stat(path, &st) == 0 && st.st_dev == q->dev && st.st_ino == q->ino;
	free(path);
	return same;
}

void dlock__wq_close(dlock__wq *q)
{
	if (!q)
		return;
	dlock__wq_leave(q);
	munmap(q->page, WQ_SIZE);
	free(q);
}
