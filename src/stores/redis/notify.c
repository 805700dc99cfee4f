/*
 * The pub/sub notifier of the Redis and Redlock stores: one thread per store
 * handle hands the releases published for the names its waiters watch to the
 * core's wake-up board (redis.h).
 */
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* notifier                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Waiting without polling, and without missing a release.
 *
 * One background thread per store handle owns one subscriber connection per
 * server and SUBSCRIBEs to the channels of every lock some thread of this
 * process is waiting for: the lock's own ("*": wake every waiter) and our
 * direct one (a fair queue names its new head's owner). A waiter is a
 * dlock_request (one per lock handle, stable across the tries of one acquire)
 * that the core watches after each refused try (dlock__rnotify_watch: a lock
 * nobody holds costs no subscription) and unwatches when the wait is over. Messages go to the core's board: "*" wakes the name
 * (dlock_backend_wake), an owner of ours wakes that waiter alone
 * (dlock_backend_wake_owner), a reconnection after an outage wakes everyone.
 *
 * The race: the core tries, is refused, then sleeps on the board. The core
 * arms the board before each try, so a release published after the arming
 * wakes the sleeper even if it comes before the sleep, once the channel is
 * subscribed; a release before the subscription is in place is covered by
 * the wake-up of the name that follows each confirmation of a subscription
 * (the waiter then tries once more). The subscription stays up across tries
 * and is dropped when the waiter is unwatched, or (a backstop) when no
 * refused try of it came for FORGET_IDLE_MS.
 */
#define FORGET_IDLE_MS 10000
#define RECONNECT_MAX_MS 2000

typedef struct rn_chan {
	struct rn_chan *next;
	char *lock;            /* the lock's name: what the board is told */
	char *name;            /* the lock's channel "{P:NAME}:c": wake-everyone messages */
	size_t len;
	char *direct;          /* "{P:NAME}:c:<client id>": wake-ups naming our waiters */
	size_t dlen;
	int refs;              /* waiters that want it */
	int home;              /* sharded (Redis Cluster): the one server that carries it
				  (-1: every server; -2: none known yet) */
	unsigned char *sent;   /* per server: SUBSCRIBE sent (and no UNSUBSCRIBE since) */
	int *pend;             /* per server: SUBSCRIBE replies still to come */
	unsigned char *ok;     /* per server: confirmed */
	char *last;            /* last wake-all message (to drop the other masters' copies) */
	unsigned char *heard;  /* per server: has delivered `last` (a second copy from the
				  same server is a new release, e.g. a second bare "*") */
} rn_chan;

typedef struct rn_waiter {
	struct rn_waiter *next;
	const dlock_request *req;
	char owner[64];
	rn_chan *chan;
	int64_t last;          /* its last watch (a try of the core) */
} rn_waiter;

struct dlock__rnotify {
	dlock_backend *be;    /* whose board the wake-ups go to */
	const char *kind;
	dlock__rserver *srv;  /* the store's; moved only under mu (dlock__rnotify_moved) */
	size_t n;
	pthread_mutex_t mu;
	pthread_t th;
	bool started, stop;
	int pipe[2];
	redisContext **c;       /* non-blocking sockets: nothing here blocks the thread */
	int64_t *retry_at, *backoff;
	int64_t *sub_since;     /* per server: oldest SUBSCRIBE not yet confirmed (0: none) */
	unsigned char *wantw;   /* per server: output still buffered (poll for POLLOUT) */
	rn_chan *chans;
	rn_waiter *waiters;
	/* sharded pub/sub (dlock__rnotify_sharded): SSUBSCRIBE on the server
	 * home(home_arg, channel) names; NULL: SUBSCRIBE everywhere */
	int (*home)(void *arg, const char *channel);
	void *home_arg;
};

int dlock__rnotify_new(dlock__rnotify **out, dlock_backend *be, dlock__rserver *srv, size_t n, const char *kind)
{
	*out = NULL;
	dlock__rnotify *nt = dlock_sys_calloc(1, sizeof(*nt));
	if (!nt)
		return DLOCK_ENOMEM;
	nt->be = be;
	nt->kind = kind;
	nt->srv = srv;
	nt->n = n;
	nt->pipe[0] = nt->pipe[1] = -1;
	nt->c = calloc(n, sizeof(*nt->c));
	nt->retry_at = calloc(n, sizeof(*nt->retry_at));
	nt->backoff = calloc(n, sizeof(*nt->backoff));
	nt->sub_since = calloc(n, sizeof(*nt->sub_since));
	nt->wantw = calloc(n, 1);
	if (!nt->c || !nt->retry_at || !nt->backoff || !nt->sub_since || !nt->wantw ||
	    pipe2(nt->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		int rc = nt->c && nt->retry_at && nt->backoff && nt->sub_since && nt->wantw
				 ? dlock_error_set(DLOCK_ESTORE, kind, NULL, "pipe: %s", strerror(errno))
				 : dlock_sys_oom();
		dlock__rnotify_free(nt);
		return rc;
	}
	pthread_mutex_init(&nt->mu, NULL);
	*out = nt;
	return 0;
}

static void kick(dlock__rnotify *nt)
{
	char b = 1;
	ssize_t w = write(nt->pipe[1], &b, 1);
	(void)w; /* a full pipe already holds a wake-up */
}

static void chan_free(rn_chan *ch)
{
	free(ch->last);
	free(ch->heard);
	free(ch->lock);
	free(ch->name);
	free(ch->direct);
	free(ch->sent);
	free(ch->pend);
	free(ch->ok);
	free(ch);
}

void dlock__rnotify_free(dlock__rnotify *nt)
{
	if (!nt)
		return;
	if (nt->started) {
		pthread_mutex_lock(&nt->mu);
		nt->stop = true;
		pthread_mutex_unlock(&nt->mu);
		kick(nt);
		pthread_join(nt->th, NULL);
	}
	if (nt->pipe[0] >= 0) {
		close(nt->pipe[0]);
		close(nt->pipe[1]);
		pthread_mutex_destroy(&nt->mu);
	}
	for (size_t i = 0; nt->c && i < nt->n; i++)
		if (nt->c[i])
			dlock__rfree(nt->c[i]);
	while (nt->waiters) {
		rn_waiter *w = nt->waiters;
		nt->waiters = w->next;
		free(w);
	}
	while (nt->chans) {
		rn_chan *ch = nt->chans;
		nt->chans = ch->next;
		chan_free(ch);
	}
	free(nt->c);
	free(nt->retry_at);
	free(nt->backoff);
	free(nt->sub_since);
	free(nt->wantw);
	free(nt);
}

static bool chan_ok(const dlock__rnotify *nt, const rn_chan *ch)
{
	for (size_t i = 0; i < nt->n; i++)
		if (ch->ok[i])
			return true;
	return false;
}

/* Whether server i should carry ch's subscription. */
static bool wanted_on(const rn_chan *ch, size_t i)
{
	return ch->refs > 0 && (ch->home == -1 || ch->home == (int)i);
}

/* Whether some waiter needs server i. */
static bool server_wanted(const dlock__rnotify *nt, size_t i)
{
	for (const rn_chan *ch = nt->chans; ch; ch = ch->next)
		if (wanted_on(ch, i))
			return true;
	return false;
}

/* A lock's channels by either name: the lock's own, or our direct one (the
 * two never collide: a lock's channel ends in "}:c", a direct one in hex). */
static rn_chan *chan_find(dlock__rnotify *nt, const char *name, size_t len)
{
	for (rn_chan *ch = nt->chans; ch; ch = ch->next)
		if ((ch->len == len && !memcmp(ch->name, name, len)) ||
		    (ch->direct && ch->dlen == len && !memcmp(ch->direct, name, len)))
			return ch;
	return NULL;
}

static rn_waiter *waiter_find(dlock__rnotify *nt, const dlock_request *req)
{
	for (rn_waiter *w = nt->waiters; w; w = w->next)
		if (w->req == req)
			return w;
	return NULL;
}

static void waiter_unlink(dlock__rnotify *nt, rn_waiter *w)
{
	for (rn_waiter **p = &nt->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	if (--w->chan->refs == 0)
		kick(nt);
	free(w);
}

static void drop_conn(dlock__rnotify *nt, size_t i)
{
	dlock__rfree(nt->c[i]);
	nt->c[i] = NULL;
	nt->sub_since[i] = 0;
	nt->wantw[i] = 0;
	for (rn_chan *ch = nt->chans; ch; ch = ch->next)
		ch->sent[i] = ch->pend[i] = ch->ok[i] = 0;
	int64_t b = nt->backoff[i] ? nt->backoff[i] * 2 : 100;
	nt->backoff[i] = b < RECONNECT_MAX_MS ? b : RECONNECT_MAX_MS;
	nt->retry_at[i] = dlock_clock_ms() + nt->backoff[i];
}

/* One reply or message from server i. @return false when the connection
 * must go: a sharded subscription refused (the slot moved: -MOVED). */
static bool on_reply(dlock__rnotify *nt, size_t i, redisReply *r)
{
	if (r->type == REDIS_REPLY_ERROR && nt->home) {
		/* the slot map we subscribed by is stale: every waiter of this
		 * server tries again, and the store's redirect rehomes them */
		for (rn_chan *ch = nt->chans; ch; ch = ch->next)
			if (ch->sent[i])
				dlock_backend_wake(nt->be, ch->lock);
		return false;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
	    r->element[1]->type != REDIS_REPLY_STRING)
		return true;
	const char *what = r->element[0]->str;
	rn_chan *ch = chan_find(nt, r->element[1]->str, r->element[1]->len);
	if (!ch)
		return true;
	if (what[0] == 's' && nt->home) /* ssubscribe, smessage, sunsubscribe */
		what++;
	if (!strcmp(what, "unsubscribe") && ch->sent[i]) {
		/* not asked for: the server dropped it (its slot moved away). The
		 * waiters try again; their redirect tells the store where it went. */
		ch->sent[i] = ch->ok[i] = 0;
		ch->pend[i] = 0;
		dlock_backend_wake(nt->be, ch->lock);
		return true;
	}
	if (!strcmp(what, "subscribe")) {
		if (ch->pend[i] > 0 && --ch->pend[i] == 0 && ch->sent[i]) {
			/* listening now: a release before this point may have gone unheard */
			if (!chan_ok(nt, ch))
				dlock_backend_wake(nt->be, ch->lock);
			ch->ok[i] = 1;
		}
		bool pending = false;
		for (rn_chan *o = nt->chans; o && !pending; o = o->next)
			pending = o->pend[i] > 0;
		if (!pending)
			nt->sub_since[i] = 0;
	} else if (!strcmp(what, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
		const char *msg = r->element[2]->str;
		bool all = msg[0] == '*';
		/* the same release heard from another master (Redlock): already counted.
		 * The same text again from a server that already delivered it is a new
		 * event (a second bare "*" of a cancel, or any repeat on one server). */
		if (all && ch->last && !strcmp(ch->last, msg) && !ch->heard[i]) {
			ch->heard[i] = 1;
			return true;
		}
		if (all) {
			free(ch->last);
			ch->last = strdup(msg);
			memset(ch->heard, 0, nt->n);
			ch->heard[i] = 1;
			dlock_backend_wake(nt->be, ch->lock);
			return true;
		}
		/* a new head named: wake it alone, if it is one of ours */
		for (rn_waiter *w = nt->waiters; w; w = w->next)
			if (w->chan == ch && !strcmp(msg, w->owner))
				dlock_backend_wake_owner(nt->be, w->owner);
	}
	return true;
}

/* Bring each server's subscriptions in line with what waiters want. Under mu. */
static void sync_subs(dlock__rnotify *nt)
{
	for (size_t i = 0; i < nt->n; i++) {
		if (!nt->c[i])
			continue;
		for (rn_chan *ch = nt->chans; ch; ch = ch->next) {
			const char *verb = NULL;
			int nch = ch->direct ? 2 : 1;
			bool want = wanted_on(ch, i);
			if (want && !ch->sent[i]) {
				verb = nt->home ? "SSUBSCRIBE" : "SUBSCRIBE";
				ch->sent[i] = 1;
				ch->pend[i] += nch; /* one confirmation per channel */
				if (!nt->sub_since[i])
					nt->sub_since[i] = dlock_clock_ms();
			} else if (!want && ch->sent[i]) {
				verb = nt->home ? "SUNSUBSCRIBE" : "UNSUBSCRIBE";
				ch->sent[i] = ch->ok[i] = 0;
			}
			if (verb) {
				const char *argv[3] = { verb, ch->name, ch->direct };
				size_t lens[3] = { strlen(verb), ch->len, ch->dlen };
				redisAppendCommandArgv(nt->c[i], 1 + nch, argv, lens);
			}
		}
		/* non-blocking: what does not fit now goes when poll says POLLOUT */
		int done = 0;
		if (dlock__rbuffer_write(nt->c[i], &done) != REDIS_OK)
			drop_conn(nt, i);
		else
			nt->wantw[i] = !done;
	}
	/* forget channels nobody wants once unsubscribed everywhere */
	for (rn_chan **p = &nt->chans; *p;) {
		rn_chan *ch = *p;
		bool any = false;
		for (size_t i = 0; i < nt->n; i++)
			any |= ch->sent[i] != 0;
		if (ch->refs == 0 && !any) {
			*p = ch->next;
			chan_free(ch);
		} else {
			p = &ch->next;
		}
	}
}

static void *notify_main(void *arg)
{
	dlock__rnotify *nt = arg;
	struct pollfd *pf = calloc(nt->n + 1, sizeof(*pf));
	size_t *pidx = calloc(nt->n + 1, sizeof(*pidx));
	if (!pf || !pidx) {
		free(pf);
		free(pidx);
		return NULL;
	}
	pthread_mutex_lock(&nt->mu);
	while (!nt->stop) {
		int64_t now = dlock_clock_ms();
		bool wanted = false;
		for (rn_chan *ch = nt->chans; ch; ch = ch->next)
			wanted |= ch->refs > 0;
		/* (re)connect servers that are down while someone waits */
		for (size_t i = 0; i < nt->n && wanted; i++) {
			if (nt->c[i] || now < nt->retry_at[i] || !nt->srv[i].port || !server_wanted(nt, i))
				continue;
			redisContext *c = NULL;
			/* short: this thread also serves the other servers' messages */
			dlock__rserver quick = nt->srv[i];
			int64_t limit = quick.timeout_ms < 500 ? quick.timeout_ms : 500;
			pthread_mutex_unlock(&nt->mu);
			int rc = dlock__rconnect_by(&c, &quick, nt->kind, dlock_clock_ms() + limit);
			pthread_mutex_lock(&nt->mu);
			if (rc) {
				int64_t b = nt->backoff[i] ? nt->backoff[i] * 2 : 100;
				nt->backoff[i] = b < RECONNECT_MAX_MS ? b : RECONNECT_MAX_MS;
				nt->retry_at[i] = dlock_clock_ms() + nt->backoff[i];
				continue;
			}
			bool again = nt->backoff[i] != 0;
			nt->c[i] = c;
			nt->backoff[i] = 0;
			if (again) /* releases during the outage were not heard: everyone retries */
				dlock_backend_wake_all(nt->be);
		}
		sync_subs(nt);
		/* a subscription not confirmed in time: the connection hangs (a dead
		 * link, a stopped server): drop it, so that it is made again */
		now = dlock_clock_ms();
		int64_t next_check = INT64_MAX;
		for (size_t i = 0; i < nt->n; i++) {
			if (!nt->c[i] || !nt->sub_since[i])
				continue;
			int64_t limit = nt->srv[i].timeout_ms;
			if (now - nt->sub_since[i] >= limit) {
				drop_conn(nt, i);
			} else if (nt->sub_since[i] + limit < next_check) {
				next_check = nt->sub_since[i] + limit;
			}
		}
		/* backstop for waiters whose caller vanished without unwatch */
		for (rn_waiter *w = nt->waiters, *next; w; w = next) {
			next = w->next;
			if (now - w->last > FORGET_IDLE_MS)
				waiter_unlink(nt, w);
		}
		size_t np = 0;
		pf[np].fd = nt->pipe[0];
		pf[np].events = POLLIN;
		np++;
		bool down = false;
		for (size_t i = 0; i < nt->n; i++) {
			if (nt->c[i]) {
				pf[np].fd = nt->c[i]->fd;
				pf[np].events = POLLIN | (nt->wantw[i] ? POLLOUT : 0);
				pidx[np] = i;
				np++;
			} else if (nt->srv[i].port && server_wanted(nt, i)) {
				down = true;
			}
		}
		/* a timer only while there is local bookkeeping to do; no network polling */
		int timeout = nt->waiters ? 1000 : -1;
		if (down && wanted)
			timeout = 100;
		if (next_check != INT64_MAX) {
			int64_t t = next_check - now + 1;
			if (timeout < 0 || t < timeout)
				timeout = (int)t;
		}
		pthread_mutex_unlock(&nt->mu);
		int pr = poll(pf, np, timeout);
		pthread_mutex_lock(&nt->mu);
		if (pr <= 0)
			continue;
		if (pf[0].revents) {
			char buf[64];
			while (read(nt->pipe[0], buf, sizeof(buf)) > 0)
				;
		}
		for (size_t k = 1; k < np; k++) {
			size_t i = pidx[k];
			if (!pf[k].revents || !nt->c[i] || nt->c[i]->fd != pf[k].fd)
				continue;
			if (pf[k].revents & POLLOUT) {
				int done = 0;
				if (dlock__rbuffer_write(nt->c[i], &done) != REDIS_OK) {
					drop_conn(nt, i);
					continue;
				}
				nt->wantw[i] = !done;
			}
			if (!(pf[k].revents & (POLLIN | POLLERR | POLLHUP)))
				continue;
			if (dlock__rbuffer_read(nt->c[i]) != REDIS_OK) {
				drop_conn(nt, i);
				continue;
			}
			void *r = NULL;
			while (nt->c[i] && dlock__rget_reply(nt->c[i], &r) == REDIS_OK && r) {
				bool keep = on_reply(nt, i, r);
				freeReplyObject(r);
				r = NULL;
				if (!keep)
					drop_conn(nt, i);
			}
			if (nt->c[i] && nt->c[i]->err)
				drop_conn(nt, i);
		}
	}
	pthread_mutex_unlock(&nt->mu);
	free(pf);
	free(pidx);
	return NULL;
}

void dlock__rnotify_moved(dlock__rnotify *nt, size_t i, const char *host, int port)
{
	pthread_mutex_lock(&nt->mu);
	if (strcmp(nt->srv[i].host, host) != 0 || nt->srv[i].port != port) {
		snprintf(nt->srv[i].host, sizeof(nt->srv[i].host), "%s", host);
		nt->srv[i].port = port;
		if (nt->c[i]) { /* listen where the releases are published now */
			drop_conn(nt, i);
			nt->retry_at[i] = 0;
			kick(nt);
		}
	}
	pthread_mutex_unlock(&nt->mu);
}

void dlock__rnotify_forget(dlock__rnotify *nt, const dlock_request *req)
{
	pthread_mutex_lock(&nt->mu);
	rn_waiter *w = waiter_find(nt, req);
	if (w)
		waiter_unlink(nt, w);
	pthread_mutex_unlock(&nt->mu);
}

/* The channels of one lock; owner (ours: "<client id>-<serial>") names the direct one. */
static rn_chan *chan_get(dlock__rnotify *nt, const char *lock, const char *name, const char *owner)
{
	size_t len = strlen(name);
	rn_chan *ch = chan_find(nt, name, len);
	if (ch)
		return ch;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->lock = dlock_sys_strdup(lock);
	ch->name = dlock_sys_strdup(name);
	ch->len = len;
	size_t cid = strspn(owner, "0123456789abcdefABCDEF");
	if (cid > 0 && owner[cid] == '-') {
		ch->dlen = len + 1 + cid;
		if ((ch->direct = malloc(ch->dlen + 1)) != NULL)
			snprintf(ch->direct, ch->dlen + 1, "%s:%.*s", name, (int)cid, owner);
		else
			ch->dlen = 0; /* then only the lock's channel: wake-ups naming us come after a nap */
	}
	ch->home = nt->home ? nt->home(nt->home_arg, ch->name) : -1;
	ch->sent = calloc(nt->n, 1);
	ch->pend = calloc(nt->n, sizeof(int));
	ch->ok = calloc(nt->n, 1);
	ch->heard = calloc(nt->n, 1);
	if (!ch->lock || !ch->name || !ch->sent || !ch->pend || !ch->ok || !ch->heard) {
		chan_free(ch);
		return NULL;
	}
	ch->next = nt->chans;
	nt->chans = ch;
	return ch;
}

int dlock__rnotify_watch(dlock__rnotify *nt, const dlock_request *req, const char *prefix)
{
	dlock__rkeys k;
	dlock__rkeys_make(&k, prefix, req->name);
	const char *channel = k.k[DLOCK__RK_C];
	pthread_mutex_lock(&nt->mu);
	if (!nt->started) {
		if (pthread_create(&nt->th, NULL, notify_main, nt) != 0) {
			pthread_mutex_unlock(&nt->mu);
			return dlock_error_set(DLOCK_ESTORE, nt->kind, NULL, "cannot start the pub/sub thread");
		}
		nt->started = true;
	}
	rn_waiter *w = waiter_find(nt, req);
	if (w && strcmp(w->chan->name, channel) != 0) { /* a handle reused for another name */
		waiter_unlink(nt, w);
		w = NULL;
	}
	bool joined = false; /* a channel already listened to: no confirmation will come */
	if (!w) {
		rn_chan *ch = chan_get(nt, req->name, channel, req->owner);
		w = ch ? calloc(1, sizeof(*w)) : NULL;
		if (!w) {
			pthread_mutex_unlock(&nt->mu);
			return dlock_sys_oom();
		}
		w->req = req;
		w->chan = ch;
		ch->refs++;
		w->next = nt->waiters;
		nt->waiters = w;
		joined = chan_ok(nt, ch);
		kick(nt); /* subscribe; its confirmation wakes the name */
	}
	snprintf(w->owner, sizeof(w->owner), "%s", req->owner);
	w->last = dlock_clock_ms();
	pthread_mutex_unlock(&nt->mu);
	/* The core calls this after a refused try: a message naming this waiter
	 * (a fair queue's new head) between that try and now found no waiter of
	 * that owner here and went unheard. On a new subscription its
	 * confirmation covers that; on a channel already confirmed, look again. */
	if (joined)
		dlock_backend_wake_owner(nt->be, req->owner);
	return 0;
}

void dlock__rnotify_sharded(dlock__rnotify *nt, int (*home)(void *arg, const char *channel), void *arg)
{
	pthread_mutex_lock(&nt->mu);
	nt->home = home;
	nt->home_arg = arg;
	pthread_mutex_unlock(&nt->mu);
}

void dlock__rnotify_rehome(dlock__rnotify *nt)
{
	pthread_mutex_lock(&nt->mu);
	bool moved = false;
	for (rn_chan *ch = nt->chans; ch && nt->home; ch = ch->next) {
		int h = nt->home(nt->home_arg, ch->name);
		if (h != ch->home) {
			ch->home = h;
			moved = true;
		}
	}
	pthread_mutex_unlock(&nt->mu);
	if (moved)
		kick(nt); /* unsubscribe where it was, subscribe where it is */
}
