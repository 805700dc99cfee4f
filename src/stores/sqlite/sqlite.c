/*
 * The embedded store: one SQLite file shared by the processes of one machine.
 * WAL mode, BEGIN IMMEDIATE for every decision, expiry on this machine's wall
 * clock (every client of the file runs on the same machine and clock).
 * This file holds the store's methods and its open; sq.h lists its parts:
 * db.c (connection, statements, transactions, the fork rule), schema.c (the
 * file and its schema), queue.c (holders, the waiters' queue, the decision)
 * and bells.c (wake-ups through the file system).
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

static const char *const file_suffix[NFILES] = { "", "-wal", "-shm" };

static int acquire_in(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, req->deadline_ms);
	int rc = dlock__sq_reopen_if_moved(b, b->deadline);
	if (rc)
		return rc;
	if (dlock__sq_peek_held(b, req, dlock_wall_ms(), out))
		return DLOCK_ELOCKED;
	if ((rc = dlock__sq_begin(b))) {
		/* Nothing was written: the outcome is known. Say "not now" (the
		 * core backs off and tries again until the wait ends) rather than
		 * a failure the core must treat as maybe applied and undo. */
		if (rc == DLOCK_EUNAVAILABLE && b->timed_out)
			rc = dlock_error_set(DLOCK_ELOCKED, "sqlite", "5",
					     "sqlite: lock '%s' not tried: another connection kept the database's "
					     "write lock until the deadline",
					     req->name);
		return rc;
	}
	memset(b->front, 0, sizeof b->front);
	rc = dlock__sq_finish(b, dlock__sq_decide(b, req, dlock_wall_ms(), out));
	if (rc == 0 || rc == DLOCK_ELOCKED)
		dlock__sq_ring_front(b); /* committed: the first two in line moved up */
	return rc;
}

static int release_in(dlock_backend *be, const dlock_request *req)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, req->deadline_ms);
	int rc = dlock__sq_check_files(b, false);
	if (rc)
		return rc;
	/* One write transaction: the delete, and whether a waiter is queued. */
	if ((rc = dlock__sq_begin(b)))
		return rc;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_RELEASE, req->name, req->owner);
	sqlite3_bind_int64(s, 4, dlock_wall_ms());
	if ((rc = dlock__sq_run(b, s, "release")))
		return dlock__sq_finish(b, rc);
	if (sqlite3_changes(b->db) == 0)
		return dlock__sq_finish(b, DLOCK_ENOTHELD); /* the core words it */
	/* Ring only for a queued waiter: a waiter's try registers it in the same
	 * write transaction as it saw the hold, so one that saw this hold is in
	 * the queue now (a read failure rings: a spurious ring costs one try). */
	int err = 0;
	bool waiters = dlock__sq_step_int(b, dlock__sq_prep(b, Q_ANY_WAITERS, req->name, NULL), 0, 1, &err) != 0 || err;
	/* Dead waiters at the front leave now: the live one after them is rung
	 * (its own bell) instead of waiting out their registrations. */
	int64_t dropped = 0;
	memset(b->front, 0, sizeof b->front);
	if (waiters && !err && (rc = dlock__sq_drop_dead_front(b, req, &dropped)) == 0 && dropped > 0)
		rc = dlock__sq_note_head(b, req, dlock_wall_ms());
	else if (waiters && !err && !rc) {
		/* the front is rung on its own bell too, not only through the
		 * bucket: a fair front waiter whose bucket watch was missing when
		 * the bucket rang slept a whole nap (issue 31, 5b) */
		sqlite3_stmt *s2 = dlock__sq_prep(b, Q_HEAD, req->name, NULL);
		if (sqlite3_step(s2) == SQLITE_ROW) {
			const unsigned char *o = sqlite3_column_text(s2, 0);
			snprintf(b->front[0], sizeof b->front[0], "%s", o ? (const char *)o : "");
		}
		sqlite3_reset(s2);
	}
	if (rc) { /* only an order: the release stands */
		dlock_error_clear();
		rc = 0;
	}
	if ((rc = dlock__sq_finish(b, 0)))
		return rc;
	if (waiters)
		dlock__sq_ring(b, req->name);
	dlock__sq_ring_front(b);
	dlock_error_clear();
	return 0;
}

static int extend_one(sqlite_store *b, const dlock_request *req, int64_t ttl_ms, int64_t now)
{
	sqlite3_stmt *s = dlock__sq_prep(b, Q_EXTEND, req->name, req->owner);
	sqlite3_bind_int64(s, 4, now + ttl_ms);
	sqlite3_bind_int64(s, 5, now);
	int rc = dlock__sq_run(b, s, "extend");
	if (rc)
		return rc;
	if (sqlite3_changes(b->db) == 0)
		return dlock_error_set(DLOCK_ENOTHELD, "sqlite", NULL,
				       "lock '%s' is not held by this owner (expired or released)", req->name);
	return 0;
}

static int extend_in(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, req->deadline_ms);
	int rc = dlock__sq_check_files(b, false);
	if (rc || (rc = dlock__sq_line_enter(b)))
		return rc;
	rc = extend_one(b, req, ttl_ms, dlock_wall_ms());
	dlock__wq_leave(b->wq);
	return rc;
}

static int renew_in(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	sqlite_store *b = (sqlite_store *)be;
	if (n == 0)
		return 0;
	dlock__sq_set_deadline(b, reqs[0]->deadline_ms); /* the same for the batch */
	int rc = dlock__sq_check_files(b, true);
	if (rc == DLOCK_ENOTHELD) {
		for (size_t i = 0; i < n; i++)
			results[i] = DLOCK_ENOTHELD;
		return 0;
	}
	if ((rc = dlock__sq_begin(b)))
		return rc;
	int64_t now = dlock_wall_ms();
	for (size_t i = 0; i < n; i++) {
		results[i] = extend_one(b, reqs[i], reqs[i]->ttl_ms, now);
		if (results[i] != 0 && results[i] != DLOCK_ENOTHELD)
			return dlock__sq_finish(b, results[i]);
	}
	return dlock__sq_finish(b, 0);
}

static int cancel_in(dlock_backend *be, const dlock_request *req)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, req->deadline_ms);
	if (dlock__sq_check_files(b, false))
		return 0; /* the queue we were in went with the old file */
	int rc = dlock__sq_line_enter(b);
	if (rc)
		return rc;
	rc = dlock__sq_run(b, dlock__sq_prep(b, Q_DEQUEUE, req->name, req->owner), "cancel waiter");
	int dequeued = rc == 0 ? sqlite3_changes(b->db) : 0;
	bool noted = dequeued > 0 && dlock__sq_note_head(b, req, dlock_wall_ms()) == 0;
	dlock__wq_leave(b->wq);
	if (dequeued > 0) {
		dlock__sq_ring(b, req->name); /* the queue moved: the next in line may go now */
		if (noted)
			dlock__sq_ring_front(b);
	}
	return rc;
}

static char *col_text(sqlite3_stmt *s, int col)
{
	const unsigned char *t = sqlite3_column_text(s, col);
	return dlock_sys_strdup(t ? (const char *)t : "");
}

static int status_one(sqlite_store *b, const char *name, int64_t now, dlock_lock_status **out, size_t *count)
{
	dlock_lock_status *st = dlock_sys_status_add(out, count);
	if (!st || !(st->name = dlock_sys_strdup(name)))
		return DLOCK_ENOMEM;
	int rc = 0, r;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_STATUS_HOLDERS, name, NULL);
	sqlite3_bind_int64(s, 3, now);
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		dlock_holder *h = dlock_sys_status_add_holder(st);
		if (!h) {
			sqlite3_reset(s);
			return DLOCK_ENOMEM;
		}
		h->owner = col_text(s, 0);
		h->host = col_text(s, 1);
		h->pid = sqlite3_column_int(s, 2);
		h->mode = sqlite3_column_int(s, 3) == DLOCK_SHARED ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		h->fence = (uint64_t)sqlite3_column_int64(s, 4);
		h->ttl_left_ms = sqlite3_column_int64(s, 5) - now;
		st->permits = (unsigned)sqlite3_column_int(s, 6);
		if (!h->owner || !h->host) {
			sqlite3_reset(s);
			return DLOCK_ENOMEM;
		}
	}
	sqlite3_reset(s);
	if (r != SQLITE_DONE)
		return dlock__sq_fail(b, r, "status");
	st->last_fence = (uint64_t)dlock__sq_step_int(b, dlock__sq_prep(b, Q_STATUS_FENCE, name, NULL), 0, 0, &rc);
	s = dlock__sq_prep(b, Q_STATUS_WAITERS, name, NULL);
	sqlite3_bind_int64(s, 3, now);
	st->waiters = (size_t)dlock__sq_step_int(b, s, 0, 0, &rc);
	return rc;
}

static int status_in(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, dlock_clock_ms() + b->request_timeout_ms);
	int rc = dlock__sq_reopen_if_moved(b, b->deadline);
	int64_t now = dlock_wall_ms();
	for (size_t i = 0; i < nnames && !rc; i++)
		rc = status_one(b, names[i], now, out, count);
	return rc;
}

static int list_in(dlock_backend *be, char ***names, size_t *count)
{
	sqlite_store *b = (sqlite_store *)be;
	dlock__sq_set_deadline(b, dlock_clock_ms() + b->request_timeout_ms);
	int rc = dlock__sq_reopen_if_moved(b, b->deadline);
	if (rc)
		return rc;
	char **list = NULL;
	size_t n = 0;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_STATUS_NAMES, NULL, NULL);
	sqlite3_bind_text(s, 1, b->ns, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, dlock_wall_ms());
	int r;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		char **nl = realloc(list, (n + 1) * sizeof(*nl));
		if (!nl || !(nl[n] = col_text(s, 0))) {
			if (nl)
				list = nl;
			rc = dlock_sys_oom();
			break;
		}
		list = nl;
		n++;
	}
	sqlite3_reset(s);
	if (!rc && r != SQLITE_DONE)
		rc = dlock__sq_fail(b, r, "status");
	*names = list;
	*count = n;
	return rc;
}

static void sq_close(dlock_backend *be)
{
	sqlite_store *b = (sqlite_store *)be;
	/* A close after the files moved must not checkpoint and delete the
	 * -wal and -shm by name either. (A fork()'s child never gets here with
	 * the parent's connection: the core does not call an inherited store.) */
	if (b->db) {
		dlock__sq_calls_enter();
		dlock__sq_disconnect(b, dlock__sq_files_moved(b));
		dlock__sq_calls_leave();
	} else {
		dlock__sq_disconnect(b, false);
	}
	dlock__sq_bells_free(b, true);
	for (int i = 0; i < NFILES; i++)
		free(b->paths[i]);
	free(b->ns);
	free(b);
}

/* In a fork()'s child, of the parent's connection: SQLite keeps its file
 * and shared-memory lock bookkeeping per process, and the child inherited
 * the parent's. Left open, a connection the child opens later on the same
 * file would trust locks this process does not hold. Closing it without a
 * checkpoint only closes descriptors and unmaps (the core calls this only
 * when no statement was running at the fork: no transaction to roll back). */
static void sq_forget(dlock_backend *be)
{
	sqlite_store *b = (sqlite_store *)be;
	if (b->db && dlock__sq_busy_at_fork()) {
		/* SQLite's state may be half changed: not touched (the process
		 * cannot use SQLite any more; fork_check says so) */
		b->db = NULL;
		for (int i = 0; i < Q_COUNT; i++)
			b->st[i] = NULL;
	}
	dlock__sq_disconnect(b, true);
	dlock__sq_bells_free(b, false); /* its thread is the parent's */
	sq_close(be); /* now only frees */
}

/* The methods that call into SQLite, counted (fork_check). */
static int sq_acquire(dlock_backend *be, const dlock_request *req, dlock_grant *out)
{
	dlock__sq_calls_enter();
	int rc = acquire_in(be, req, out);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_release(dlock_backend *be, const dlock_request *req)
{
	dlock__sq_calls_enter();
	int rc = release_in(be, req);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_extend(dlock_backend *be, const dlock_request *req, int64_t ttl_ms)
{
	dlock__sq_calls_enter();
	int rc = extend_in(be, req, ttl_ms);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_renew(dlock_backend *be, const dlock_request *const *reqs, size_t n, int *results)
{
	dlock__sq_calls_enter();
	int rc = renew_in(be, reqs, n, results);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_cancel(dlock_backend *be, const dlock_request *req)
{
	dlock__sq_calls_enter();
	int rc = cancel_in(be, req);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	dlock__sq_calls_enter();
	int rc = status_in(be, names, nnames, out, count);
	dlock__sq_calls_leave();
	return rc;
}

static int sq_list(dlock_backend *be, char ***names, size_t *count)
{
	dlock__sq_calls_enter();
	int rc = list_in(be, names, count);
	dlock__sq_calls_leave();
	return rc;
}

/* Not DLOCK_BACKEND_F_RENEW_APART: each instance watches its own file for
 * being moved or replaced (reopen_if_moved), which a second one opened
 * later by path would not see the same way. */
static const dlock_backend_methods sqlite_methods = {
	DLOCK_BACKEND_METHODS_INIT("sqlite"),
	.acquire = sq_acquire,
	.release = sq_release,
	.renew = sq_renew,
	.extend = sq_extend,
	.watch = dlock__sq_watch,
	.unwatch = dlock__sq_unwatch,
	.cancel = sq_cancel,
	.status = sq_status,
	.list = sq_list,
	.close = sq_close,
	.forget = sq_forget,
};

int dlock__sqlite_open(dlock_backend **out, dlock_uri *uri)
{
	if (uri->hosts && *uri->hosts)
		return dlock_error_set(
			DLOCK_EINVAL, "sqlite", NULL,
			"sqlite URIs name a file, not a host: use sqlite:///abs/path.db or sqlite:rel.db");
	int forked = dlock__sq_fork_guard();
	if (forked)
		return forked;
	int64_t deadline = dlock_clock_ms() + uri->connect_timeout_ms;
	/* The default store's path (its directories are created), if there is one. */
	char *dflt = NULL;
	const char *path = uri->path;
	{
		char *text = NULL;
		dlock_uri *parsed = NULL;
		int rc = dlock_default_uri(&text);
		if (rc == 0)
			rc = dlock_sys_uri_parse(&parsed, text);
		free(text);
		if (rc == 0 && !(dflt = dlock_sys_strdup(parsed->path)))
			rc = DLOCK_ENOMEM;
		dlock_sys_uri_free(parsed);
		if (rc && (!*path || rc == DLOCK_ENOMEM)) {
			free(dflt);
			return rc;
		}
		dlock_error_clear();
		if (!*path)
			path = dflt;
	}
	const char *fo = dlock_uri_param(uri, "foreign");
	if (fo && strcmp(fo, "ok") != 0) {
		free(dflt);
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL,
				       "sqlite: bad foreign '%s' (foreign=ok shares a database that has other tables)",
				       fo);
	}
	int64_t busy_ms = 0; /* none: each call's own deadline */
	const char *v = dlock_uri_param(uri, "busy_timeout");
	if (v && (dlock_duration_parse(&busy_ms, v) != 0 || busy_ms <= 0)) {
		free(dflt);
		return dlock_error_set(DLOCK_EINVAL, "sqlite", NULL, "sqlite: bad busy_timeout '%s'", v);
	}

	sqlite_store *b = dlock_sys_calloc(1, sizeof(*b));
	if (!b) {
		free(dflt);
		return DLOCK_ENOMEM;
	}
	dlock_backend_init(&b->base, &sqlite_methods);
	b->make_dirs = dflt && strcmp(path, dflt) == 0;
	b->foreign_ok = fo != NULL;
	b->busy_ms = busy_ms;
	b->request_timeout_ms = uri->request_timeout_ms;
	int rc = DLOCK_ENOMEM;
	if (!(b->ns = dlock_sys_strdup(uri->prefix)))
		goto fail;
	for (int i = 0; i < NFILES; i++)
		if (!(b->paths[i] = dlock_sys_sprintf("%s%s", path, file_suffix[i])))
			goto fail;
	dlock__sq_calls_enter();
	rc = dlock__sq_connect_db(b, deadline);
	dlock__sq_calls_leave();
	if (rc)
		goto fail;
	free(dflt);
	*out = &b->base;
	return 0;
fail:
	free(dflt);
	sq_close(&b->base);
	return rc;
}
