/*
 * watch.c — the hang-up watch of held connections (dlock_backend_watch_fd).
 *
 * One thread per process polls every watched socket for a hang-up, never
 * reading them (their statements run on other threads). On POLLRDHUP,
 * POLLHUP, POLLERR or POLLNVAL (a socket closed meanwhile) the socket leaves
 * the set and its store's holds are renewed at once
 * (dlock_backend_renew_now). The thread starts with the first socket and
 * ends when the set is empty.
 *
 * Locking: `mu` is a leaf (nothing else is taken under it). The thread lets
 * go of it to renew, marking the backend it renews in `busy`, so that
 * dlock_backend_unwatch_all — a store's close — waits until no renewal of
 * its backend can still start or run.
 */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define WATCH_REPOLL_MS 1000

typedef struct {
	dlock_backend *be;
	int fd;
} watched;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER; /* busy changed */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static watched *set;          /* under mu */
static size_t nset, capset;   /* under mu */
static bool running;          /* under mu: the thread runs (or is starting) */
static dlock_backend *busy;   /* under mu: the backend being renewed */
static int wake[2] = { -1, -1 }; /* the thread re-reads the set when written */

/* A fork's child has no thread and watches none of the parent's sockets;
 * its pipe must not be the parent's (a read there would eat the parent's
 * wake-ups). */
static void fork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

static void fork_child(void)
{
	nset = 0;
	running = false;
	busy = NULL;
	if (wake[0] >= 0) {
		close(wake[0]);
		close(wake[1]);
		wake[0] = wake[1] = -1;
	}
	pthread_mutex_unlock(&mu);
}

static void init_once(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Under mu: the thread polls the new set. A non-blocking write under mu,
 * so that the pipe cannot be closed (fork_child) under it. */
static void poke(void)
{
	if (wake[1] >= 0) {
		ssize_t w = write(wake[1], "x", 1);
		(void)w; /* a full pipe wakes the thread already */
	}
}

/* Under mu: remove set[i]. */
static void drop(size_t i)
{
	set[i] = set[--nset];
}

static void *watcher(void *arg)
{
	(void)arg;
	struct pollfd *p = NULL;
	dlock_backend **of = NULL;
	size_t cap = 0;
	pthread_mutex_lock(&mu);
	while (nset > 0) {
		size_t n = nset;
		if (n + 1 > cap) {
			struct pollfd *np = realloc(p, (n + 1) * sizeof *p);
			if (np)
				p = np;
			dlock_backend **nof = np ? realloc(of, (n + 1) * sizeof *of) : NULL;
			if (!nof) {
				/* the holds' hang-ups are seen at their next renewal */
				nset = 0;
				break;
			}
			of = nof;
			cap = n + 1;
		}
		p[0] = (struct pollfd){ wake[0], POLLIN, 0 };
		for (size_t i = 0; i < n; i++) {
			p[1 + i] = (struct pollfd){ set[i].fd, POLLRDHUP, 0 };
			of[1 + i] = set[i].be;
		}
		pthread_mutex_unlock(&mu);
		/* Not without end: a socket closed while watched (a store that
		 * gave up its connection without unwatching it) stays open in the
		 * kernel while a poll holds it; each return lets go of it. */
		int r = poll(p, (nfds_t)(n + 1), WATCH_REPOLL_MS);
		pthread_mutex_lock(&mu);
		if (r < 0 && errno != EINTR) {
			nset = 0;
			break;
		}
		if (r > 0 && p[0].revents) {
			char buf[64];
			while (read(wake[0], buf, sizeof buf) > 0) {
			}
		}
		for (size_t i = 1; r > 0 && i <= n; i++) {
			if (!p[i].revents)
				continue;
			/* Still watched: not unwatched (or its store closed) meanwhile. */
			size_t k = 0;
			while (k < nset && !(set[k].be == of[i] && set[k].fd == p[i].fd))
				k++;
			if (k == nset)
				continue;
			drop(k);
			busy = of[i];
			pthread_mutex_unlock(&mu);
			dlock_backend_renew_now(of[i]);
			pthread_mutex_lock(&mu);
			busy = NULL;
			pthread_cond_broadcast(&cv);
		}
	}
	running = false;
	pthread_mutex_unlock(&mu);
	free(p);
	free(of);
	return NULL;
}

int dlock_backend_watch_fd(dlock_backend *be, int fd)
{
	if (!be || fd < 0)
		return DLOCK_EINVAL;
	pthread_once(&once, init_once);
	int rc = 0;
	pthread_mutex_lock(&mu);
	size_t k = 0;
	while (k < nset && !(set[k].be == be && set[k].fd == fd))
		k++;
	if (k < nset)
		goto out;
	if (nset == capset) {
		size_t cap = capset ? capset * 2 : 16;
		watched *n = realloc(set, cap * sizeof *set);
		if (!n) {
			rc = DLOCK_ENOMEM;
			goto out;
		}
		set = n;
		capset = cap;
	}
	if (wake[0] < 0 && pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
		wake[0] = wake[1] = -1;
		rc = DLOCK_ENOMEM;
		goto out;
	}
	set[nset++] = (watched){ be, fd };
	if (!running) {
		pthread_attr_t a;
		pthread_t t;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, watcher, NULL) == 0) {
			running = true;
		} else {
			nset--;
			rc = DLOCK_ENOMEM;
		}
		pthread_attr_destroy(&a);
	}
	poke();
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

void dlock_backend_unwatch_fd(dlock_backend *be, int fd)
{
	if (!be || fd < 0)
		return;
	pthread_mutex_lock(&mu);
	for (size_t k = 0; k < nset; k++)
		if (set[k].be == be && set[k].fd == fd) {
			drop(k);
			poke();
			break;
		}
	pthread_mutex_unlock(&mu);
}

void dlock_backend_unwatch_all(dlock_backend *be)
{
	if (!be)
		return;
	pthread_mutex_lock(&mu);
	for (size_t k = 0; k < nset;) {
		if (set[k].be == be)
			drop(k);
		else
			k++;
	}
	poke();
	while (busy == be)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}
