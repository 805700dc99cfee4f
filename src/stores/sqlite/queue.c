/*
 * The embedded store's decision: the holders of a name, the waiters' queue
 * (fair order, writer preference, registrations) and one acquire try.
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

/* Holder rows of the name: live shared and other counts, the smallest limit
 * (permits) among the live exclusive holders (INT64_MAX: none), earliest live
 * expiry, the last fence handed out (-1: no fence row yet), whether any waiter
 * rows exist. */
static int read_holders(sqlite_store *b, const char *n, int64_t now, int64_t *nshared, int64_t *nexcl, int64_t *limit,
			int64_t *first_expiry, int64_t *last_fence, bool *any_waiters)
{
	sqlite3_stmt *s = dlock__sq_prep(b, Q_HOLDERS, n, NULL);
	int r;
	int64_t expired = 0, rows = 0;
	*nshared = *nexcl = 0;
	*limit = INT64_MAX;
	*first_expiry = *last_fence = -1;
	while ((r = sqlite3_step(s)) == SQLITE_ROW) {
		rows++;
		int64_t expires = sqlite3_column_int64(s, 3);
		*any_waiters = sqlite3_column_int(s, 4) != 0;
		if (sqlite3_column_int(s, 0)) /* the fence row */
			*last_fence = sqlite3_column_int64(s, 2);
		else if (expires <= now)
			expired++;
		else {
			if (sqlite3_column_int(s, 1) == DLOCK_SHARED) {
				++*nshared;
			} else {
				++*nexcl;
				int64_t p = sqlite3_column_int64(s, 5);
				if (p < *limit)
					*limit = p < 1 ? 1 : p;
			}
			if (*first_expiry < 0 || expires < *first_expiry)
				*first_expiry = expires;
		}
	}
	sqlite3_reset(s);
	if (r != SQLITE_DONE)
		return dlock__sq_fail(b, r, "read holders");
	if (rows == 0) { /* never granted: no row to carry the waiter flag */
		int rc = 0;
		*any_waiters = dlock__sq_step_int(b, dlock__sq_prep(b, Q_ANY_WAITERS, n, NULL), 0, 0, &rc) != 0;
		if (rc)
			return rc;
	}
	if (expired == 0)
		return 0; /* the common case: nothing to delete, no write */
	s = dlock__sq_prep(b, Q_PURGE_HOLDERS, n, NULL);
	sqlite3_bind_int64(s, 3, now);
	return dlock__sq_run(b, s, "expire holders");
}

/*
 * A fair mutex waiter with two or more ahead of it cannot be next: it is
 * registered for FAR_TTL times the core's queue TTL and tells the core to
 * nap a third of that, since it is rung when it moves up to second place
 * (note_head). The first two in line keep the short registration's naps, so
 * one of them is always awake to notice a dead front; a registration is cut
 * to the short one when its waiter comes to the front, so a waiter that died
 * far back blocks the queue no longer than one that died at the front. With
 * 2,000 waiters, their refreshes (a read every second, a write every other)
 * were most of the store's work.
 */
#define FAR_TTL 10

/* How long a waiter `ahead` places from the front is registered for. */
static int64_t registration_ms(const dlock_request *req, int64_t ahead, bool own_heard)
{
	bool far_ok = req->fair && own_heard && req->mode != DLOCK_SHARED && req->permits == 1;
	return ahead >= 2 && far_ok ? req->queue_ttl_ms * FAR_TTL : req->queue_ttl_ms;
}

/* The queue of req->name moved (inside the transaction, or after a
 * statement of its own): waiters at its front that are known dead leave
 * (drop_dead_front), the first two in line go into b->front, to ring after
 * it, and the front's registration is cut to a front waiter's. */
int dlock__sq_note_head(sqlite_store *b, const dlock_request *req, int64_t now)
{
	int64_t dropped;
	int rc = dlock__sq_drop_dead_front(b, req, &dropped), r = SQLITE_DONE, i = 0;
	memset(b->front, 0, sizeof b->front);
	if (rc)
		return rc;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_HEAD, req->name, NULL);
	while (i < 2 && (r = sqlite3_step(s)) == SQLITE_ROW) {
		const unsigned char *o = sqlite3_column_text(s, 0);
		snprintf(b->front[i++], sizeof b->front[0], "%s", o ? (const char *)o : "");
	}
	if (i < 2 && r != SQLITE_DONE)
		rc = dlock__sq_fail(b, r, "read the queue's head");
	sqlite3_reset(s);
	if (!rc && b->front[0][0]) {
		s = dlock__sq_prep(b, Q_CUT_HEAD, req->name, b->front[0]);
		sqlite3_bind_int64(s, 4, now + req->queue_ttl_ms);
		rc = dlock__sq_run(b, s, "cut the front's registration");
	}
	return rc;
}

/* Expired waiter registrations of req->name go, and for a fair waiter the
 * dead at the front (the queue's head is noted when it moved). */
static int purge_waiters(sqlite_store *b, const dlock_request *req, int64_t now)
{
	sqlite3_stmt *s = dlock__sq_prep(b, Q_PURGE_WAITERS, req->name, NULL);
	sqlite3_bind_int64(s, 3, now);
	int rc = dlock__sq_run(b, s, "expire waiters");
	int64_t moved = rc ? 0 : sqlite3_changes(b->db);
	if (!rc && !moved && req->fair)
		rc = dlock__sq_drop_dead_front(b, req, &moved);
	if (!rc && moved > 0)
		rc = dlock__sq_note_head(b, req, now);
	return rc;
}

/* Where req->owner stands in its name's queue: the waiters ahead of it,
 * counted up to `cap`, and (`excl`) whether one of them wants it exclusive
 * (every waiter is ahead when it has no row: *queued false). */
static int queue_place(sqlite_store *b, const dlock_request *req, int64_t cap, bool excl, int64_t *ahead,
		       bool *excl_ahead, bool *queued)
{
	int rc = 0;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_MYSEQ, req->name, req->owner);
	int64_t myseq = dlock__sq_step_int(b, s, 0, -1, &rc);
	if (rc)
		return rc;
	*queued = myseq >= 0;
	s = dlock__sq_prep(b, Q_AHEAD, req->name, NULL);
	if (myseq >= 0)
		sqlite3_bind_int64(s, 3, myseq);
	sqlite3_bind_int64(s, 4, cap);
	*ahead = dlock__sq_step_int(b, s, 0, 0, &rc);
	*excl_ahead = false;
	if (!rc && excl) {
		s = dlock__sq_prep(b, Q_EXCL_AHEAD, req->name, NULL);
		if (myseq >= 0)
			sqlite3_bind_int64(s, 3, myseq);
		*excl_ahead = dlock__sq_step_int(b, s, 0, 0, &rc) != 0;
	}
	return rc;
}

/* What one decision has read of the name's queue, so that a refusal after
 * the queue rules neither purges nor counts again in the same transaction. */
typedef struct queue_look {
	bool purged;     /* expired registrations are gone */
	bool placed;     /* ahead and excl_ahead are read */
	int64_t ahead;   /* waiters ahead of the requester, counted up to 2 at least */
	bool excl_ahead; /* one of them wants it exclusive (read for a reader only) */
} queue_look;

/* Where req->owner stands, into q (once per decision): the waiters ahead
 * counted up to `cap` (at least 2), and for a reader whether a writer is
 * among them. */
static int look_place(sqlite_store *b, const dlock_request *req, int64_t cap, queue_look *q)
{
	bool queued, shared = req->mode == DLOCK_SHARED;
	if (q->placed)
		return 0;
	int rc = queue_place(b, req, cap > 2 ? cap : 2, shared, &q->ahead, &q->excl_ahead, &queued);
	q->placed = rc == 0;
	return rc;
}

/* Expired registrations gone, once per decision. */
static int look_purged(sqlite_store *b, const dlock_request *req, int64_t now, queue_look *q)
{
	if (q->purged)
		return 0;
	int rc = purge_waiters(b, req, now);
	q->purged = rc == 0;
	return rc;
}

/* The queue rules, only when the name has waiter rows at all. */
static int queue_rules(sqlite_store *b, const dlock_request *req, int64_t now, int64_t nexcl, int64_t limit,
		       bool *conflict, queue_look *q)
{
	const char *n = req->name;
	int rc = look_purged(b, req, now, q);
	if (rc)
		return rc;
	/* Fair order, and readers yield to waiting writers. */
	if (req->fair) {
		if ((rc = look_place(b, req, limit, q)))
			return rc;
		*conflict = req->mode == DLOCK_SHARED ? q->excl_ahead : q->ahead + nexcl >= limit;
	} else if (req->mode == DLOCK_SHARED) {
		*conflict = dlock__sq_step_int(b, dlock__sq_prep(b, Q_WRITER_WAITING, n, req->owner), 0, 0, &rc) > 0;
	}
	return rc;
}

/* A refused fair waiter: how many wait ahead of it (at least up to 2; 0 or
 * 1 for a reader: whether an exclusive one does)? With others ahead only its
 * own bell need wake it (see "doorbells"). *again: look again at once
 * (bell_behind); *own_heard: its own bell is watched. */
static int mark_behind(sqlite_store *b, const dlock_request *req, queue_look *q, int64_t *ahead, bool *again,
		       bool *own_heard)
{
	int rc = look_place(b, req, 2, q);
	*ahead = req->mode == DLOCK_SHARED ? q->excl_ahead : q->ahead;
	if (!rc)
		*again = dlock__sq_bell_behind(b, req, *ahead > 0, own_heard);
	return rc;
}

/*
 * The next fence after `last` (-1: the name has no counter in this file):
 * never below this machine's wall clock in microseconds. Grants of one
 * file are write transactions, far more than a microsecond apart, so every
 * fence a file gave is at most the clock at its grant; a file made anew or
 * put in place later (deleted, cleaned, restored from a copy) starts above
 * all of them (docs/stores/sqlite.md, "Fences").
 */
static int64_t fence_after(int64_t last)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
	return last + 1 > us ? last + 1 : us;
}

int dlock__sq_decide(sqlite_store *b, const dlock_request *req, int64_t now, dlock_grant *out)
{
	const char *n = req->name;
	int64_t nexcl = 0, nshared = 0, limit, first_expiry = -1, last_fence = -1;
	bool queued = false;
	int rc = read_holders(b, n, now, &nshared, &nexcl, &limit, &first_expiry, &last_fence, &queued);
	if (rc)
		return rc;

	/* The smallest limit among the holders and the requester applies: a
	 * mutex (permits 1) excludes every semaphore caller and the reverse. */
	if ((int64_t)req->permits < limit)
		limit = req->permits;
	bool conflict;
	if (req->mode == DLOCK_SHARED)
		conflict = nexcl > 0;
	else
		conflict = nshared > 0 || nexcl >= limit;
	queue_look q = { 0 };
	if (!conflict && queued && (rc = queue_rules(b, req, now, nexcl, limit, &conflict, &q)))
		return rc;

	sqlite3_stmt *s;
	if (conflict) {
		bool again = false, own_heard = false;
		if (req->waiting) {
			int64_t ahead = 0;
			if ((rc = look_purged(b, req, now, &q)))
				return rc;
			/* where it will stand, before its registration (a new one goes last) */
			if (req->fair && (rc = mark_behind(b, req, &q, &ahead, &again, &own_heard)))
				return rc;
			int64_t ttl = registration_ms(req, ahead, own_heard);
			s = dlock__sq_prep(b, Q_ENQUEUE, n, req->owner);
			sqlite3_bind_int(s, 4, (int)req->mode);
			sqlite3_bind_int64(s, 5, now + ttl);
			sqlite3_bind_text(s, 6, req->host, -1, SQLITE_STATIC);
			sqlite3_bind_int(s, 7, req->pid);
			sqlite3_bind_int64(s, 8, ttl / 2);
			if ((rc = dlock__sq_run(b, s, "enqueue waiter")))
				return rc;
			if (ahead >= 2 && ttl > req->queue_ttl_ms)
				out->nap_ms = ttl / 3;
		}
		if (first_expiry >= 0)
			out->retry_ms = first_expiry > now ? first_expiry - now : 0;
		if (again)
			out->retry_ms = 0;
		return DLOCK_ELOCKED;
	}

	/* Still inside BEGIN IMMEDIATE: nobody can have moved the counter since it was read. */
	int64_t f = last_fence < INT64_MAX ? fence_after(last_fence) : 0;
	if (f <= 0)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: fence counter out of range");
	s = dlock__sq_prep(b, last_fence < 0 ? Q_FENCE_NEW : Q_FENCE_SET, n, NULL); /* new: the name's first grant */
	sqlite3_bind_int64(s, 3, f);
	if ((rc = dlock__sq_run(b, s, "advance fence")))
		return rc;
	if (sqlite3_changes(b->db) != 1)
		return dlock_error_set(DLOCK_ESTORE, "sqlite", NULL, "sqlite: fence counter did not advance");
	s = dlock__sq_prep(b, Q_INSERT_HOLDER, n, req->owner);
	sqlite3_bind_int(s, 4, (int)req->mode);
	sqlite3_bind_int(s, 5, (int)req->permits);
	sqlite3_bind_int64(s, 6, f);
	sqlite3_bind_int64(s, 7, now + req->ttl_ms);
	sqlite3_bind_text(s, 8, req->host, -1, SQLITE_STATIC);
	sqlite3_bind_int(s, 9, req->pid);
	if ((rc = dlock__sq_run(b, s, "insert holder")))
		return rc;
	if (queued && (rc = dlock__sq_run(b, dlock__sq_prep(b, Q_DEQUEUE, n, req->owner), "dequeue waiter")))
		return rc;
	if (queued && (rc = dlock__sq_note_head(b, req, now)) != 0)
		return rc;
	out->fence = (uint64_t)f;
	return 0;
}

/*
 * A registered mutex waiter's try while the name is held by a live lease and
 * its registration needs no refresh yet: refused by a read, without the
 * write lock (a decision in BEGIN IMMEDIATE would write nothing either). With
 * 2,000 waiters, their write transactions starved a release of the write
 * lock past its deadline. True when refused so (out->retry_ms set); false: decide
 * in full (also when the read fails).
 */
bool dlock__sq_peek_held(sqlite_store *b, const dlock_request *req, int64_t now, dlock_grant *out)
{
	if (!req->waiting || req->mode == DLOCK_SHARED || req->permits != 1)
		return false;
	/* The first try of an acquire call (within 1 ms of its ticket, which is
	 * the call's start plus under 1 ms) is not registered yet: the peek would
	 * cost a read transaction and find nothing to refuse with. */
	if (now * 1000 - req->ticket_us < 1000)
		return false;
	sqlite3_stmt *s = dlock__sq_prep(b, Q_PEEK, req->name, req->owner);
	sqlite3_bind_int64(s, 4, now);
	bool held = false;
	if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) {
		int64_t ahead = sqlite3_column_int64(s, 2), left = sqlite3_column_int64(s, 1) - now;
		bool again = false, own_heard = false;
		if (req->fair)
			again = dlock__sq_bell_behind(b, req, ahead > 0, &own_heard);
		/* refused by a read while the registration fits its place: not
		 * half gone, nor longer than the place wants (a decision cuts it) */
		int64_t ttl = registration_ms(req, ahead, own_heard);
		if (left >= ttl / 2 && left <= ttl) {
			held = true;
			out->retry_ms = again ? 0 : sqlite3_column_int64(s, 0) - now;
			if (ahead >= 2 && ttl > req->queue_ttl_ms)
				out->nap_ms = ttl / 3;
		}
	}
	sqlite3_reset(s);
	return held;
}
