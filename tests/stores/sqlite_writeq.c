/* The writers' line of an SQLite file (src/stores/sqlite/writeq.h), through
 * the file itself, on a real database shared with other processes:
 *  - no line while writers never collide; one ("<db>.writers", the
 *    database's mode) once a write found SQLite's write lock taken;
 *  - writers wait in it: while another process holds the line, a try is
 *    not made (SQLite's write lock free), and is granted once it lets go;
 *  - a holder that dies in the line hands it on (robust mutex);
 *  - a line that gives write access the database does not (another user
 *    could stall every writer) is not joined;
 *  - a line deleted and made anew is joined anew by a handle that had the
 *    old one, once someone outside its line held the write lock.
 * Usage: sqlite_writeq DIR */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The line's page as the library lays it out. */
typedef struct page {
	char magic[8];
	uint32_t mutex_size;
	uint32_t reserved;
	pthread_mutex_t mu;
} page;

static char path[600], line[620], uri[700];

/* A process (forked: it only maps the file) that takes the line and lets go
 * when `hold` closes, or dies holding it (`die`). */
typedef struct holder {
	pid_t pid;
	int hold; /* write end: closing it lets the holder go */
} holder;

static int line_holder(holder *h, bool die)
{
	int ready[2], hold[2];
	if (pipe(ready) != 0 || pipe(hold) != 0)
		return -1;
	h->pid = fork();
	if (h->pid == 0) {
		close(ready[0]);
		close(hold[1]);
		int fd = open(line, O_RDWR);
		page *pg = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (pg == MAP_FAILED)
			_exit(2);
		int e = pthread_mutex_lock(&pg->mu);
		if (e == EOWNERDEAD)
			e = pthread_mutex_consistent(&pg->mu);
		if (e != 0)
			_exit(3);
		(void)!write(ready[1], "1", 1);
		if (die)
			_exit(0); /* still holding it */
		char c;
		while (read(hold[0], &c, 1) > 0)
			;
		pthread_mutex_unlock(&pg->mu);
		_exit(0);
	}
	close(ready[1]);
	close(hold[0]);
	h->hold = hold[1];
	char c;
	int n = (int)read(ready[0], &c, 1);
	close(ready[0]);
	if (n != 1) {
		close(h->hold);
		waitpid(h->pid, NULL, 0);
		return -1;
	}
	if (die) {
		close(h->hold);
		waitpid(h->pid, NULL, 0);
	}
	return 0;
}

static void line_let_go(holder *h)
{
	close(h->hold);
	int st = 0;
	waitpid(h->pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* One try of `name` on `s`: its return code (released again when granted). */
static int try_once(dlock_store *s, const char *name)
{
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, NULL) != 0)
		return -1000;
	int rc = dlock_acquire(l, 0);
	if (rc == 0)
		CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	return rc;
}

/* Writers collide: another process holds SQLite's write lock during a try
 * of `s` (refused, not tried), then lets go. */
static void collide(dlock_store *s)
{
	sp_child x;
	char buf[32];
	CHECK(sp_start(&x, "exclusive", path, NULL) == 0);
	CHECK(sp_line(&x, buf, sizeof(buf), 10000) == 0 && !strcmp(buf, "ready"));
	CHECK_RC(try_once(s, "collide"), DLOCK_ELOCKED); /* nobody holds it: not tried */
	CHECK(sp_finish(&x) == 0);
}

static bool exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

int main(int argc, char **argv)
{
	int early = sp_main(argc, argv);
	if (early >= 0)
		return early;
	snprintf(path, sizeof(path), "%s/wq.db", argv[1]);
	snprintf(line, sizeof(line), "%s.writers", path);
	sp_remove_db(path);
	/* a wait for the write lock (in the line or SQLite's) gives up after 300 ms */
	snprintf(uri, sizeof(uri), "sqlite://%s?busy_timeout=300ms", path);

	dlock_store *s1 = NULL;
	CHECK_RC(dlock_store_open(&s1, uri), 0);
	if (!s1)
		return tu_done("sqlite.writeq");

	/* Writers that never collide make no line. */
	for (int i = 0; i < 20; i++)
		CHECK_RC(try_once(s1, "job"), 0);
	CHECK(!exists(line));

	/* The first collision makes it, with the database's mode. */
	collide(s1);
	CHECK_RC(try_once(s1, "job"), 0);
	struct stat st;
	CHECK(stat(line, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 4096);
	char magic[9] = { 0 };
	int fd = open(line, O_RDONLY);
	CHECK(fd >= 0 && read(fd, magic, 8) == 8 && !strcmp(magic, "dlockwq1"));
	if (fd >= 0)
		close(fd);

	/* Writers wait in it: another process in the line, SQLite's lock free. */
	holder h;
	CHECK(line_holder(&h, false) == 0);
	CHECK_RC(try_once(s1, "job"), DLOCK_ELOCKED); /* nobody holds "job": not tried */
	line_let_go(&h);
	CHECK_RC(try_once(s1, "job"), 0);
	printf("line: made at the first collision (mode 0600); a try waits in it while another process holds it\n");

	/* A holder that dies in the line hands it on. */
	CHECK(line_holder(&h, true) == 0);
	CHECK_RC(try_once(s1, "job"), 0);
	CHECK_RC(try_once(s1, "job"), 0);
	printf("line: its holder died in it; the next writer took it over\n");

	/* A line others may write (the database is 0600) is not joined. */
	CHECK(chmod(line, 0666) == 0);
	CHECK(line_holder(&h, false) == 0);
	dlock_store *s2 = NULL;
	CHECK_RC(dlock_store_open(&s2, uri), 0);
	if (s2) {
		collide(s2);
		CHECK_RC(try_once(s2, "job"), 0); /* not in the held line */
		dlock_store_close(s2);
	}
	line_let_go(&h);
	CHECK(chmod(line, 0600) == 0);

	/* Deleted and made anew: a handle with the old line joins the new one
	 * once it meets a writer outside its line. */
	CHECK(unlink(line) == 0);
	dlock_store *s3 = NULL;
	CHECK_RC(dlock_store_open(&s3, uri), 0);
	if (s3) {
		collide(s3);
		CHECK_RC(try_once(s3, "job"), 0);
		CHECK(exists(line));
		collide(s1); /* s1 waits in its old line, then SQLite's lock: held outside */
		CHECK_RC(try_once(s1, "job"), 0);
		CHECK(line_holder(&h, false) == 0);
		CHECK_RC(try_once(s1, "job"), DLOCK_ELOCKED); /* in the new line now */
		CHECK_RC(try_once(s3, "job"), DLOCK_ELOCKED);
		line_let_go(&h);
		CHECK_RC(try_once(s1, "job"), 0);
		dlock_store_close(s3);
	}
	printf("line: deleted, made anew by another handle, and joined by the one that had the old\n");

	dlock_store_close(s1);
	sp_remove_db(path);
	return tu_done("sqlite.writeq");
}
