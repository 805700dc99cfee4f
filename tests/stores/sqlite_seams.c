/* SQLite at the seams between two features (issue 30), one ctest entry per
 * case: `sqlite_seams DIR CASE`.
 *
 *   extend_vs_renewal  a renewal that copied the old TTL is held up by
 *                      another process's write lock while dlock_extend(60 s)
 *                      waits too; when the lock is let go, the extend lands
 *                      and then the late renewal: the stored lease must still
 *                      be the extended one (the store keeps the later expiry)
 *   fences_new_file    the file deleted between two holders, or replaced by
 *                      an older copy of itself: the next grant's fence is
 *                      above every fence the old file gave
 *   foreign_db         a database of another application (a table of its
 *                      own) is refused with DLOCK_EINVAL and left exactly as
 *                      it was (bytes, journal mode, no -wal); ?foreign=ok uses
 *                      it; a bad foreign= value is refused
 *   bells_dir          the doorbell directory "<db>.bells": one planted as a
 *                      symbolic link (or, as root, owned by another user) is
 *                      not used — nothing is made in the directory it names,
 *                      and waits still end (by polling); one we make gets
 *                      the database's group bits whatever the umask (0660
 *                      database: 01770 directory, 0660 bells)
 *   one_inotify        three store handles of one process (two on one file,
 *                      one on another) wait at once: one inotify instance in
 *                      the process, not one per handle; each waiter is rung
 *                      (granted within 400 ms of its holder's release); none
 *                      is left once the handles are closed
 *   no_renew_deleted   a hold nobody renews (no_renew, as `dlock acquire`
 *                      leaves) whose file was deleted and taken by another
 *                      process: its next extend and release say it is lost
 */
#include "testutil/testutil.h"
#include "sqlite_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[512];

static void sleep_until(long long t)
{
	long long left = t - tu_now_ms();
	if (left > 0) {
		struct timespec ts = { (time_t)(left / 1000), (long)(left % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* The stored lease left of `name`'s first holder, from a handle of its own
 * (-1: none). */
static long long stored_ttl_left(const char *uri, const char *name)
{
	dlock_store *s = NULL;
	long long left = -1;
	if (dlock_store_open(&s, uri) != 0)
		return -1;
	dlock_lock_status *st = NULL;
	size_t n = 0;
	const char *names[] = { name };
	if (dlock_store_status(s, names, 1, &st, &n) == 0 && n == 1 && st[0].nholders == 1)
		left = st[0].holders[0].ttl_left_ms;
	dlock_status_free(st, n);
	dlock_store_close(s);
	return left;
}

typedef struct extend_call {
	dlock_lock *l;
	long long ttl;
	int rc;
	long long done_at;
} extend_call;

static void *do_extend(void *arg)
{
	extend_call *e = arg;
	e->rc = dlock_extend(e->l, e->ttl);
	e->done_at = tu_now_ms();
	return NULL;
}

/*
 * TTL 3 s: the renewer copies the request (TTL 3 s) at about a third of the
 * lease, 1000 ms after the acquire. The write lock is taken by another
 * process before that; the extend starts at 700 ms (and waits for the write
 * lock with the store's mutex, so the renewal, copied at 1000 ms, waits
 * behind it); the write lock goes at 1600 ms.
 */
#define X_TTL_MS 3000

static void case_extend_vs_renewal(void)
{
	char path[700], uri[800];
	snprintf(path, sizeof(path), "%s/extend.db", dir);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s?ttl=%dms", path, X_TTL_MS);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return;
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "job", NULL), 0);
	long long t0 = tu_now_ms();
	CHECK_RC(dlock_acquire(l, 0), 0);

	sp_child w;
	char line[32] = "";
	CHECK(sp_start(&w, "exclusive", path, NULL) == 0);
	CHECK(sp_line(&w, line, sizeof(line), 5000) == 0 && strcmp(line, "ready") == 0);
	long long ready = tu_now_ms() - t0;

	sleep_until(t0 + 700);
	extend_call e = { l, 60000, -99, 0 };
	pthread_t th;
	CHECK(pthread_create(&th, NULL, do_extend, &e) == 0);
	sleep_until(t0 + 1600);
	long long late = tu_now_ms() - (t0 + 1600); /* this run's scheduling delay */
	CHECK(sp_finish(&w) == 0);
	pthread_join(th, NULL);
	CHECK_RC(e.rc, 0);
	fprintf(stderr,
		"extend_vs_renewal: writer ready at %lld ms, write lock let go %lld ms late, "
		"extend returned at %lld ms\n",
		ready, late, e.done_at - t0);

	/* The late renewal lands right after the extend: look for a shortened
	 * lease for a second (an observation window, not a wait for an event;
	 * the renewal ran long before its end). */
	long long min_left = 1LL << 60, until = tu_now_ms() + 1000;
	do {
		long long left = stored_ttl_left(uri, "job");
		if (left < min_left)
			min_left = left;
		if (left < 50000)
			break;
	} while (tu_now_ms() < until);
	fprintf(stderr, "extend_vs_renewal: least stored lease seen after the extend: %lld ms\n", min_left);
	CHECK(min_left >= 50000);
	CHECK(dlock_ttl_left(l) > 50000);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
}

/* Take and release `name` once on uri; the fence (0: failed). */
static uint64_t grant(const char *uri, const char *name)
{
	dlock_store *s = NULL;
	uint64_t f = 0;
	if (dlock_store_open(&s, uri) != 0)
		return 0;
	dlock_lock *l = NULL;
	if (dlock_lock_new(&l, s, name, NULL) == 0 && dlock_acquire(l, 0) == 0) {
		f = dlock_fence(l);
		dlock_release(l);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
	return f;
}

static bool copy_file(const char *from, const char *to)
{
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	bool ok = in && out;
	char buf[8192];
	size_t n;
	while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
		ok = fwrite(buf, 1, n, out) == n;
	if (in)
		fclose(in);
	if (out)
		ok = fclose(out) == 0 && ok;
	return ok;
}

static void case_fences_new_file(void)
{
	char path[700], uri[800], copy[800];
	snprintf(path, sizeof(path), "%s/fences.db", dir);
	snprintf(copy, sizeof(copy), "%s/fences-copy.db", dir);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);

	/* Holder A takes it three times; the file is deleted; B (another
	 * process, on the new file) is granted next. */
	uint64_t a[3];
	for (int i = 0; i < 3; i++)
		a[i] = grant(uri, "res");
	CHECK(a[0] > 0 && a[1] > a[0] && a[2] > a[1]);
	sp_remove_db(path);
	sp_child c;
	char line[64] = "";
	CHECK(sp_start(&c, "hold", uri, "res") == 0);
	CHECK(sp_line(&c, line, sizeof(line), 5000) == 0);
	unsigned long long b = 0;
	CHECK(sscanf(line, "held %llu", &b) == 1);
	CHECK(sp_finish(&c) == 0);
	fprintf(stderr, "fences_new_file: old file %llu %llu %llu, new file %llu\n", (unsigned long long)a[0],
		(unsigned long long)a[1], (unsigned long long)a[2], b);
	CHECK(b > a[2]);

	/* A copy of the file taken now, two more grants, then the copy put back
	 * in its place (a restore): the next grant is above all of them. */
	uint64_t before = grant(uri, "res");
	CHECK(before > b);
	{
		/* a consistent copy: everything checkpointed into the main file */
		sqlite3 *db = NULL;
		CHECK(sqlite3_open(path, &db) == SQLITE_OK);
		CHECK(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) == SQLITE_OK);
		sqlite3_close(db);
	}
	CHECK(copy_file(path, copy));
	uint64_t later = 0;
	for (int i = 0; i < 2; i++)
		later = grant(uri, "res");
	CHECK(later > before);
	char p[800];
	snprintf(p, sizeof(p), "%s-wal", path);
	unlink(p);
	snprintf(p, sizeof(p), "%s-shm", path);
	unlink(p);
	CHECK(rename(copy, path) == 0);
	uint64_t restored = grant(uri, "res");
	fprintf(stderr, "fences_new_file: before the copy %llu, after it %llu, on the restored copy %llu\n",
		(unsigned long long)before, (unsigned long long)later, (unsigned long long)restored);
	CHECK(restored > later);
	sp_remove_db(path);
}

static void case_no_renew_deleted(void)
{
	char path[700], uri[800];
	snprintf(path, sizeof(path), "%s/norenew.db", dir);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (!s)
		return;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	o.no_renew = 1;
	o.ttl_ms = 30000;
	dlock_lock *l = NULL, *m = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "held", &o), 0);
	CHECK_RC(dlock_lock_new(&m, s, "held2", &o), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_acquire(m, 0), 0);
	sp_remove_db(path);
	/* Another process is granted both names on the new file. */
	sp_child c, c2;
	char line[64] = "";
	CHECK(sp_start(&c, "hold", uri, "held") == 0);
	CHECK(sp_line(&c, line, sizeof(line), 5000) == 0 && strncmp(line, "held ", 5) == 0);
	CHECK(sp_start(&c2, "hold", uri, "held2") == 0);
	CHECK(sp_line(&c2, line, sizeof(line), 5000) == 0 && strncmp(line, "held ", 5) == 0);
	/* The old holds' next calls: lost, not a success. */
	int rc = dlock_extend(l, 0);
	CHECK(rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD);
	CHECK(!dlock_held(l));
	rc = dlock_release(m);
	CHECK(rc == DLOCK_ELOST || rc == DLOCK_ENOTHELD);
	CHECK(!dlock_held(m));
	CHECK(sp_finish(&c2) == 0); /* first: it inherited c's stdin pipe */
	CHECK(sp_finish(&c) == 0);
	dlock_lock_free(l);
	dlock_lock_free(m);
	dlock_store_close(s);
}

/* The file's bytes, into a malloc'd buffer (*n); NULL when unreadable. */
static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	*n = 0;
	if (!f)
		return NULL;
	char chunk[8192];
	size_t k;
	while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
		char *nb = realloc(buf, *n + k);
		if (!nb)
			break;
		buf = nb;
		memcpy(buf + *n, chunk, k);
		*n += k;
	}
	fclose(f);
	return buf;
}

static void case_foreign_db(void)
{
	char path[700], uri[800], wal[800];
	snprintf(path, sizeof(path), "%s/app.db", dir);
	snprintf(wal, sizeof(wal), "%s-wal", path);
	sp_remove_db(path);
	sqlite3 *db = NULL;
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db,
			   "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT);"
			   "INSERT INTO users(name) VALUES('ada');",
			   NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	size_t n0 = 0, n1 = 0;
	char *before = slurp(path, &n0);
	CHECK(before != NULL);

	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_EINVAL);
	const char *msg = dlock_error_last()->message;
	fprintf(stderr, "foreign_db: %s\n", msg);
	CHECK(strstr(msg, "not a dlock database") && strstr(msg, "table 'users'") && strstr(msg, "foreign=ok"));
	dlock_store_close(s);
	char *after = slurp(path, &n1);
	CHECK(after && n1 == n0 && memcmp(before, after, n0) == 0); /* not a byte changed */
	free(after);
	struct stat st;
	CHECK(stat(wal, &st) != 0); /* no WAL beside it */
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	sqlite3_stmt *q = NULL;
	CHECK(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &q, NULL) == SQLITE_OK);
	CHECK(q && sqlite3_step(q) == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(q, 0), "delete") == 0);
	sqlite3_finalize(q);
	sqlite3_close(db);

	/* only foreign=ok opens it */
	snprintf(uri, sizeof(uri), "sqlite://%s?foreign=yes", path);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), DLOCK_EINVAL);
	dlock_store_close(s);

	/* asked for: shared with the application's tables */
	snprintf(uri, sizeof(uri), "sqlite://%s?foreign=ok", path);
	s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	if (s) {
		dlock_lock *l = NULL;
		CHECK_RC(dlock_lock_new(&l, s, "job", NULL), 0);
		CHECK_RC(dlock_acquire(l, 0), 0);
		CHECK_RC(dlock_release(l), 0);
		dlock_lock_free(l);
		dlock_store_close(s);
	}
	CHECK(sqlite3_open(path, &db) == SQLITE_OK);
	CHECK(sqlite3_exec(db, "SELECT name FROM users", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(db);
	free(before);
	sp_remove_db(path);
}

/* How many entries (besides . and ..) directory `path` has; -1: unreadable. */
static int entries(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* Another process holds "job" while this one waits `wait_ms` for it (its
 * bells are started and watched, or refused); then the holder lets go and
 * this one is granted within 5 s (rung or polling). */
static void wait_behind_holder(const char *uri, long wait_ms)
{
	sp_child c;
	char line[64] = "";
	CHECK(sp_start(&c, "hold", uri, "job") == 0);
	CHECK(sp_line(&c, line, sizeof(line), 5000) == 0 && strncmp(line, "held ", 5) == 0);
	dlock_store *s = NULL;
	CHECK_RC(dlock_store_open(&s, uri), 0);
	dlock_lock *l = NULL;
	if (s)
		CHECK_RC(dlock_lock_new(&l, s, "job", NULL), 0);
	if (l) {
		int rc = dlock_acquire(l, wait_ms);
		CHECK(rc == DLOCK_ETIMEOUT || rc == DLOCK_ELOCKED);
	}
	CHECK(sp_finish(&c) == 0);
	if (l) {
		CHECK_RC(dlock_acquire(l, 5000), 0);
		CHECK_RC(dlock_release(l), 0);
	}
	dlock_lock_free(l);
	dlock_store_close(s);
}

static void case_bells_dir(void)
{
	char path[700], uri[800], bells[800], victim[800];
	snprintf(path, sizeof(path), "%s/bells.db", dir);
	snprintf(bells, sizeof(bells), "%s.bells", path);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	sp_remove_db(path);
	snprintf(uri, sizeof(uri), "sqlite://%s", path);
	CHECK(sp_run("status", uri, NULL) == 0); /* the file */
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", bells, victim);
	CHECK(system(cmd) == 0);

	/* a symbolic link planted where the directory goes */
	CHECK(mkdir(victim, 0700) == 0);
	CHECK(symlink(victim, bells) == 0);
	wait_behind_holder(uri, 300);
	int n = entries(victim);
	fprintf(stderr, "bells_dir: %d files made through a planted symbolic link\n", n);
	CHECK(n == 0);
	struct stat st;
	CHECK(lstat(bells, &st) == 0 && S_ISLNK(st.st_mode)); /* left alone */
	CHECK(unlink(bells) == 0);

	/* as root: a directory of another user is not used either */
	if (geteuid() == 0) {
		CHECK(mkdir(bells, 0700) == 0 && chown(bells, 65534, 65534) == 0);
		wait_behind_holder(uri, 300);
		n = entries(bells);
		fprintf(stderr, "bells_dir: %d files made in another user's directory\n", n);
		CHECK(n == 0);
		CHECK(rmdir(bells) == 0);
		/* but one made by a member of the group that may write the database
		 * (a 0660 database of group 65534) is shared: its waiters ring there */
		CHECK(chown(path, 0, 65534) == 0 && chmod(path, 0660) == 0);
		CHECK(mkdir(bells, 0700) == 0 && chown(bells, 65534, 65534) == 0 && chmod(bells, 01770) == 0);
		wait_behind_holder(uri, 300);
		n = entries(bells);
		fprintf(stderr, "bells_dir: %d files made in a group member's directory\n", n);
		CHECK(n >= 1);
		snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", bells, victim);
		CHECK(system(cmd) == 0);
		CHECK(chown(path, 0, 0) == 0 && chmod(path, 0600) == 0);
	}

	/* a 0660 database, a umask of 077: the group keeps its bits */
	CHECK(chmod(path, 0660) == 0);
	mode_t old = umask(077);
	wait_behind_holder(uri, 300);
	umask(old);
	CHECK(lstat(bells, &st) == 0 && S_ISDIR(st.st_mode));
	fprintf(stderr, "bells_dir: directory mode %04o\n", (unsigned)(st.st_mode & 07777));
	CHECK((st.st_mode & 07777) == 01770);
	DIR *d = opendir(bells);
	int files = 0, right = 0;
	for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
		if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		files++;
		right += (st.st_mode & 07777) == 0660;
		if ((st.st_mode & 07777) != 0660)
			fprintf(stderr, "bells_dir: bell %s has mode %04o\n", e->d_name,
				(unsigned)(st.st_mode & 07777));
	}
	if (d)
		closedir(d);
	CHECK(files >= 1 && right == files);
	CHECK(system(cmd) == 0);
	sp_remove_db(path);
}

/* inotify instances this process has open. */
static int inotify_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
		char link[256] = "";
		if (readlinkat(dirfd(d), e->d_name, link, sizeof link - 1) > 0 &&
		    strcmp(link, "anon_inode:inotify") == 0)
			n++;
	}
	if (d)
		closedir(d);
	return n;
}

typedef struct waiter {
	dlock_lock *l;
	int rc;
	long long granted;
} waiter;

static void *wait_for(void *arg)
{
	waiter *w = arg;
	w->rc = dlock_acquire(w->l, 10000);
	w->granted = tu_now_ms();
	if (w->rc == 0)
		dlock_release(w->l);
	return NULL;
}

static void case_one_inotify(void)
{
	char path[2][700], uri[2][1600];
	for (int i = 0; i < 2; i++) {
		snprintf(path[i], sizeof path[i], "%s/inotify-%d.db", dir, i);
		sp_remove_db(path[i]);
		snprintf(uri[i], sizeof uri[i], "sqlite://%s", path[i]);
	}
	int before = inotify_fds();
	dlock_store *hs[2] = { NULL, NULL }, *ws[3] = { NULL, NULL, NULL };
	dlock_lock *h[2] = { NULL, NULL };
	waiter w[3] = { { NULL, -1, 0 }, { NULL, -1, 0 }, { NULL, -1, 0 } };
	const char *names[3] = { "a", "b", "a" }; /* file 0: "a" and "b"; file 1: "a" */
	const int file_of[3] = { 0, 0, 1 };
	for (int i = 0; i < 2; i++) {
		CHECK_RC(dlock_store_open(&hs[i], uri[i]), 0);
		if (!hs[i])
			return;
	}
	/* holders: "a" and "b" of file 0 in one handle, "a" of file 1 in another */
	dlock_lock *hb = NULL;
	CHECK_RC(dlock_lock_new(&h[0], hs[0], "a", NULL), 0);
	CHECK_RC(dlock_lock_new(&hb, hs[0], "b", NULL), 0);
	CHECK_RC(dlock_lock_new(&h[1], hs[1], "a", NULL), 0);
	CHECK_RC(dlock_acquire(h[0], 0), 0);
	CHECK_RC(dlock_acquire(hb, 0), 0);
	CHECK_RC(dlock_acquire(h[1], 0), 0);
	pthread_t t[3];
	for (int i = 0; i < 3; i++) {
		CHECK_RC(dlock_store_open(&ws[i], uri[file_of[i]]), 0);
		if (ws[i])
			CHECK_RC(dlock_lock_new(&w[i].l, ws[i], names[i], NULL), 0);
		pthread_create(&t[i], NULL, wait_for, &w[i]);
	}
	CHECK(tu_await_waiters(hs[0], "a", 1, 10000));
	CHECK(tu_await_waiters(hs[0], "b", 1, 10000));
	CHECK(tu_await_waiters(hs[1], "a", 1, 10000));
	int during = inotify_fds() - before;
	fprintf(stderr, "one_inotify: %d inotify instance(s) for 3 waiting store handles\n", during);
	CHECK(during == 1);
	long long released = tu_now_ms();
	CHECK_RC(dlock_release(h[0]), 0);
	CHECK_RC(dlock_release(hb), 0);
	CHECK_RC(dlock_release(h[1]), 0);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		CHECK_RC(w[i].rc, 0);
		fprintf(stderr, "one_inotify: waiter %d granted %lld ms after the releases\n", i,
			w[i].granted - released);
		CHECK(w[i].granted - released < 400 + TU_SCHED_GRACE_MS); /* rung: not a nap */
		dlock_lock_free(w[i].l);
		dlock_store_close(ws[i]);
	}
	dlock_lock_free(h[0]);
	dlock_lock_free(hb);
	dlock_lock_free(h[1]);
	for (int i = 0; i < 2; i++)
		dlock_store_close(hs[i]);
	CHECK(inotify_fds() == before);
	for (int i = 0; i < 2; i++)
		sp_remove_db(path[i]);
}

int main(int argc, char **argv)
{
	int role = sp_role(argc, argv);
	if (role >= 0)
		return role;
	if (argc < 2)
		return 2;
	snprintf(dir, sizeof(dir), "%s", argv[1]);
	mkdir(dir, 0700);
	static const tu_case cases[] = {
		{ "extend_vs_renewal", case_extend_vs_renewal },
		{ "fences_new_file", case_fences_new_file },
		{ "no_renew_deleted", case_no_renew_deleted },
		{ "foreign_db", case_foreign_db },
		{ "bells_dir", case_bells_dir },
		{ "one_inotify", case_one_inotify },
	};
	if (tu_run_cases(cases, sizeof(cases) / sizeof(*cases), argc, argv, 2) == 0)
		return 2;
	return tu_done("sqlite.seams");
}
