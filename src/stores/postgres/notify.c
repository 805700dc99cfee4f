/*
 * PostgreSQL store: LISTEN/NOTIFY on one dedicated connection and its thread,
 * which feed the core's wake-up board (dlock_backend_wake): a release that a
 * waiter queued behind (table mode: a hold it marked; advisory mode: every
 * release) and every cancel notify "<prefix>\x1f<name>"; an expiry does not.
 */
#include "pg.h"

/* -------------------------------------------------------- LISTEN / NOTIFY */

/* Wake the names of our namespace that the server notified. */
static void drain_notifies(postgres_store *be)
{
	size_t nslen = strlen(be->ns);
	PGnotify *n;
	while ((n = PQnotifies(be->lconn))) {
		if (strncmp(n->extra, be->ns, nslen) == 0 && n->extra[nslen] == '\x1f')
			dlock_backend_wake(&be->base, n->extra + nslen + 1);
		PQfreemem(n);
	}
}

/* A new LISTEN connection in *out, by `deadline`. */
static int listen_connect(postgres_store *be, int64_t deadline, PGconn **out)
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

/*
 * The LISTEN thread. It reconnects without lmu, each connect bounded by
 * connect_timeout; after each (re)connect and each broken connection every
 * waiter tries again (notifications may have been missed meanwhile).
 */
static void *listener(void *arg)
{
	postgres_store *be = arg;
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
				dlock_backend_wake_all(&be->base);
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
		if (lc && be->lconn == lc && p[1].revents) {
			if (!PQconsumeInput(be->lconn) || PQstatus(be->lconn) != CONNECTION_OK) {
				dlock__pg_drop_conn(&be->lconn, 0);
				dlock_backend_wake_all(&be->base);
			} else {
				drain_notifies(be);
			}
		}
	}
	pthread_mutex_unlock(&be->lmu);
	return NULL;
}

/* Under nothing: start the LISTEN thread if it does not run. */
static int listener_start(postgres_store *be)
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

/*
 * be->watch, after each refused waiting try: make sure the LISTEN thread runs. It
 * connects on its own, so no call waits for that connect: a notification
 * sent before its LISTEN is in place is covered by the wake-up of every
 * waiter that follows each (re)connect. Names need no subscription of their
 * own: the one channel carries them all.
 */
int dlock__pg_watch(dlock_backend *base, const dlock_request *req)
{
	(void)req;
	return listener_start((postgres_store *)base);
}

void dlock__pg_unwatch(dlock_backend *base, const dlock_request *req)
{
	(void)base;
	(void)req;
}
