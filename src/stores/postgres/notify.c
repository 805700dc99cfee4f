/*
 * PostgreSQL store: LISTEN/NOTIFY on one dedicated connection and its thread,
 * which wake the waiters of table mode.
 */
#include "pg.h"

/* -------------------------------------------------------- LISTEN / NOTIFY */

static void drain_notifies(pg_backend *be)
{
	PGnotify *n;
	while ((n = PQnotifies(be->lconn))) {
		be->bucket_gen[dlock__pg_bucket_of(n->extra, strlen(n->extra))] = ++be->gen;
		PQfreemem(n);
	}
}

/* Missed notifications (a broken LISTEN connection): wake everyone. */
static void wake_all(pg_backend *be)
{
	be->gen++;
	for (int i = 0; i < NBUCKETS; i++)
		be->bucket_gen[i] = be->gen;
}

/* A new LISTEN connection in *out, by `deadline`. */
static int listen_connect(pg_backend *be, int64_t deadline, PGconn **out)
{
	int code = 0;
	PGconn *c = dlock__pg_connect_db(be, deadline, &code);
	if (!c)
		return code;
	if ((code = dlock__pg_run(&c, deadline, "LISTEN", "LISTEN " CHANNEL, 0, NULL, NULL))) {
		dlock__pg_drop_conn(&c, 0);
		return code;
	}
	*out = c;
	return 0;
}

/* The LISTEN thread. It reconnects without lmu (waiters keep their own
 * timeouts meanwhile), each connect bounded by connect_timeout. */
static void *listener(void *arg)
{
	pg_backend *be = arg;
	pthread_mutex_lock(&be->lmu);
	while (!be->lstop) {
		struct pollfd p[2] = { { be->wakefd[0], POLLIN, 0 }, { -1, POLLIN, 0 } };
		PGconn *lc = be->lconn;
		if (lc)
			p[1].fd = PQsocket(lc);
		pthread_mutex_unlock(&be->lmu);
		if (!lc) {
			PGconn *c = NULL;
			int rc = listen_connect(be, dlock_clock_ms() + be->connect_timeout_ms, &c);
			pthread_mutex_lock(&be->lmu);
			if (rc == 0) {
				be->lconn = c;
				wake_all(be);
				pthread_cond_broadcast(&be->lcv);
				continue;
			}
			pthread_mutex_unlock(&be->lmu);
		}
		/* Without a connection, try again in a second (or when closed). */
		int n = poll(p, 2, lc ? -1 : 1000);
		pthread_mutex_lock(&be->lmu);
		if (be->lstop)
			break;
		if (n < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			char buf[16];
			while (read(be->wakefd[0], buf, sizeof buf) > 0) {
			}
		}
		if (lc && p[1].revents) {
			if (!PQconsumeInput(be->lconn) || PQstatus(be->lconn) != CONNECTION_OK) {
				dlock__pg_drop_conn(&be->lconn, 0);
				wake_all(be);
			} else {
				drain_notifies(be);
			}
		}
		pthread_cond_broadcast(&be->lcv);
	}
	pthread_mutex_unlock(&be->lmu);
	return NULL;
}

/*
 * Make sure the LISTEN thread runs (before an acquire whose refusal we may
 * wait on). It connects on its own, so no call waits for that connect: a
 * notification sent before its LISTEN is in place is covered by the
 * wake-up of every waiter that follows each (re)connect.
 */
static int listen_ensure(pg_backend *be)
{
	int rc = 0;
	pthread_mutex_lock(&be->lmu);
	if (!be->lthread_on && !be->lstop) {
		if (pthread_create(&be->lthread, NULL, listener, be) == 0)
			be->lthread_on = 1;
		else
			rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "cannot start the LISTEN thread");
	}
	pthread_mutex_unlock(&be->lmu);
	return rc;
}

static mark *mark_find(pg_backend *be, const char *owner, int create)
{
	mark *old = &be->marks[0];
	for (int i = 0; i < NMARKS; i++) {
		if (be->marks[i].used && strcmp(be->marks[i].owner, owner) == 0)
			return &be->marks[i];
		if (be->marks[i].used < old->used)
			old = &be->marks[i];
	}
	if (!create)
		return NULL;
	snprintf(old->owner, sizeof old->owner, "%s", owner);
	return old;
}

/*
 * Remember the notification generation of req's bucket from before the
 * acquire is sent: a release after the acquire's check notifies after this
 * point, so wait() sees it even if it arrived before wait() was called.
 */
void dlock__pg_mark_before_try(pg_backend *be, const dlock_request *req)
{
	/* Without a LISTEN thread the waiter falls back to its timeout. */
	dlock__saved_error saved;
	dlock__error_save(&saved);
	int rc = listen_ensure(be);
	dlock__error_restore(&saved);
	if (rc)
		return;
	pthread_mutex_lock(&be->lmu);
	mark *m = mark_find(be, req->owner, 1);
	m->gen = be->bucket_gen[dlock__pg_bucket_for(be, req->name)];
	m->used = ++be->mark_clock;
	pthread_mutex_unlock(&be->lmu);
}

void dlock__pg_mark_forget(pg_backend *be, const dlock_request *req)
{
	pthread_mutex_lock(&be->lmu);
	mark *m = mark_find(be, req->owner, 0);
	if (m)
		m->used = 0;
	pthread_mutex_unlock(&be->lmu);
}

int dlock__pg_wait(dlock_backend *base, dlock_request *req, int64_t timeout_ms)
{
	pg_backend *be = (pg_backend *)base;
	int64_t end = dlock_clock_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
	if (listen_ensure(be) != 0) {
		/* No LISTEN thread: the core backs off by timeout alone. */
		int64_t left = end - dlock_clock_ms();
		dlock__sleep_ms(left < 0 ? 0 : left < 100 ? left : 100);
		return 0;
	}
	pthread_mutex_lock(&be->lmu);
	unsigned b = dlock__pg_bucket_for(be, req->name);
	mark *m = mark_find(be, req->owner, 0);
	uint64_t g0 = m ? m->gen : be->bucket_gen[b];
	while (be->bucket_gen[b] <= g0 && !be->lstop) {
		int64_t left = end - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock__abstime(&ts, left);
		pthread_cond_timedwait(&be->lcv, &be->lmu, &ts);
	}
	pthread_mutex_unlock(&be->lmu);
	return 0;
}
