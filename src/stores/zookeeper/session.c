/* ZooKeeper store: sessions — one per TTL class, connected by a deadline,
 * referenced by holds, orphans and waits (zk.h). */
#include "zk.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

void dlock__zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	zsess *z = ctx;
	zookeeper_store *st = z->st;
	pthread_mutex_lock(&st->mu);
	if (type == ZOO_SESSION_EVENT) {
		z->state = state;
		if (state == ZOO_CONNECTED_STATE) {
			z->negotiated = zoo_recv_timeout(zh);
			st->ever_connected = true;
		}
		if (state == ZOO_EXPIRED_SESSION_STATE)
			z->expired = true;
		if (state == ZOO_AUTH_FAILED_STATE)
			z->expired = z->auth_failed = true;
		/* Orphans: connected again, delete them now (an idle process
		 * would otherwise keep them alive with its pings); expired, they
		 * are gone with the session. */
		for (orphan **p = &st->orphans; *p && !st->closing;) {
			orphan *o = *p;
			if (o->sess != z) {
				p = &o->next;
			} else if (z->expired && !o->sweeping) {
				*p = o->next;
				dlock__zk_orphan_free_locked(o);
			} else {
				if (state == ZOO_CONNECTED_STATE)
					dlock__zk_sweep_start_locked(o);
				p = &o->next;
			}
		}
	} else if (path) {
		for (watch_wait *w = st->waits; w; w = w->next)
			if (w->sess == z && strcmp(w->path, path) == 0)
				w->fired = true;
	}
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
}

static void quiet_log(const char *message)
{
	(void)message; /* libzookeeper logs every reconnect; our errors carry what matters */
}

/* Under st->mu: drop a reference; returns the session to close (after
 * unlocking) when it was the last. */
zsess *dlock__zk_unref_locked(zsess *z)
{
	if (--z->refs > 0)
		return NULL;
	zookeeper_store *st = z->st;
	for (zsess **p = &st->sessions; *p; p = &(*p)->next) {
		if (*p == z) {
			*p = z->next;
			break;
		}
	}
	return z;
}

/* Under st->mu, on any thread (also libzookeeper's completion thread, which
 * cannot close its own handle): the last reference goes to the graveyard. */
void dlock__zk_unref_later_locked(zsess *z)
{
	zsess *dead = dlock__zk_unref_locked(z);
	if (dead) {
		dead->next = dead->st->graveyard;
		dead->st->graveyard = dead;
	}
}

void dlock__zk_close_sess(zsess *z)
{
	if (!z)
		return;
	if (z->zh)
		zookeeper_close(z->zh);
	free(z->servers);
	free(z);
}

/* Close the sessions the completion thread let go (from a caller's thread). */
void dlock__zk_reap(zookeeper_store *st)
{
	pthread_mutex_lock(&st->mu);
	zsess *all = st->graveyard;
	st->graveyard = NULL;
	pthread_mutex_unlock(&st->mu);
	while (all) {
		zsess *z = all;
		all = z->next;
		dlock__zk_close_sess(z);
	}
}

void dlock__zk_unref(zookeeper_store *st, zsess *z)
{
	if (!z)
		return;
	pthread_mutex_lock(&st->mu);
	zsess *dead = dlock__zk_unref_locked(z);
	pthread_mutex_unlock(&st->mu);
	dlock__zk_close_sess(dead);
}

/* Under st->mu: wait until z is connected (true) or dead, or the deadline. */
static bool wait_connected_locked(zookeeper_store *st, zsess *z, int64_t deadline)
{
	while (!z->expired && z->state != ZOO_CONNECTED_STATE) {
		int64_t left = deadline - dlock_clock_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		dlock_sys_abstime(&ts, left);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	return !z->expired && z->state == ZOO_CONNECTED_STATE;
}

bool dlock__zk_wait_connected(zookeeper_store *st, zsess *z, int64_t deadline)
{
	pthread_mutex_lock(&st->mu);
	bool ok = wait_connected_locked(st, z, deadline);
	pthread_mutex_unlock(&st->mu);
	return ok;
}

bool dlock__zk_sess_dead(zookeeper_store *st, zsess *z)
{
	pthread_mutex_lock(&st->mu);
	bool dead = z->expired;
	pthread_mutex_unlock(&st->mu);
	return dead;
}

bool dlock__zk_sess_connected(zookeeper_store *st, zsess *z)
{
	pthread_mutex_lock(&st->mu);
	bool ok = !z->expired && z->state == ZOO_CONNECTED_STATE;
	pthread_mutex_unlock(&st->mu);
	return ok;
}

/* The session timeout a hold of ttl_ms needs: never shorter than the ttl, so
 * the holder's own deadline passes before the server can expire it. */
int64_t dlock__zk_session_key(zookeeper_store *st, int64_t ttl_ms)
{
	if (st->fixed_session)
		return st->fixed_session;
	int64_t k = 1000;
	while (k < ttl_ms && k < INT32_MAX / 2)
		k *= 2;
	return k;
}

static int dead_sess_error(zsess *z)
{
	if (z->auth_failed)
		return dlock_error_set(DLOCK_EAUTH, KIND, "ZAUTHFAILED",
				       "zookeeper: the server refused our credentials");
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZSESSIONEXPIRED", "zookeeper: session expired");
}

static int not_connected_error(zookeeper_store *st, int64_t waited)
{
	return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZCONNECTIONLOSS",
			       "zookeeper: not connected to any of %s: timed out after %lld ms", st->hosts,
			       (long long)waited);
}

/*
 * The connect string of a new session: every address of every host,
 * resolved by `deadline`. The C client would resolve the names itself with a
 * blocking getaddrinfo, in zookeeper_init and again on its reconnects; given
 * addresses it never asks the DNS. A host whose name does not resolve in time
 * is left out while another one answered.
 */
static int resolve_hosts(zookeeper_store *st, int64_t deadline, char **out)
{
	*out = NULL;
	dlock_sys_addrs *ad = dlock_sys_calloc(st->nh, sizeof(*ad));
	int *rcs = dlock_sys_calloc(st->nh, sizeof(*rcs));
	const char **names = dlock_sys_calloc(st->nh, sizeof(*names));
	int rc = 0;
	if (!ad || !rcs || !names) {
		rc = DLOCK_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < st->nh; i++)
		names[i] = st->hp[i].host;
	if (!dlock_sys_resolve_all(ad, rcs, names, st->nh, deadline, KIND)) {
		rc = dlock_error_last()->code;
		goto out;
	}
	size_t cap = st->nh * DLOCK_SYS_ADDRS_MAX * (DLOCK_SYS_ADDR_LEN + 10) + st->nh * 270 + 1, len = 0;
	char *cs = dlock_sys_calloc(1, cap);
	if (!cs) {
		rc = DLOCK_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < st->nh; i++) {
		if (rcs[i])
			continue;
		for (size_t k = 0; k < (ad[i].n ? ad[i].n : 1); k++) {
			const char *h = ad[i].n ? ad[i].addr[k] : st->hp[i].host;
			bool v6 = strchr(h, ':') != NULL;
			len += (size_t)snprintf(cs + len, cap - len, "%s%s%s%s:%d", len ? "," : "", v6 ? "[" : "", h,
						v6 ? "]" : "", st->hp[i].port);
		}
	}
	*out = cs;
out:
	free(ad);
	free(rcs);
	free(names);
	return rc;
}

/* Remove every entry `server` ("addr:port", as the client names it) from
 * the connect string cs, unless none or all are; *n counts the entries. */
static bool drop_server(char *cs, const char *server, size_t *n)
{
	size_t len = server ? strlen(server) : 0, matches = 0;
	if (!len)
		return false;
	for (const char *p = cs; *p;) {
		const char *end = strchr(p, ',');
		size_t plen = end ? (size_t)(end - p) : strlen(p);
		matches += plen == len && strncmp(p, server, len) == 0;
		p = end ? end + 1 : p + plen;
	}
	if (!matches || matches == *n)
		return false;
	for (char *p = cs; *p;) {
		char *end = strchr(p, ',');
		size_t plen = end ? (size_t)(end - p) : strlen(p);
		if (plen == len && strncmp(p, server, len) == 0) {
			if (end) {
				memmove(p, end + 1, strlen(end + 1) + 1);
				continue;
			}
			p[p > cs ? -1 : 0] = '\0'; /* the last one: its comma too */
			break;
		}
		p = end ? end + 1 : p + plen;
	}
	*n -= matches;
	return true;
}

/* ------------------------------------------------ a member gone silent */

/* A probe's answer: the server's, none yet (silent), or the ops it was for done. */
enum { PROBE_ANSWERED, PROBE_SILENT, PROBE_MOOT };

static bool ops_all_done(zookeeper_store *st, zop *const *ops, size_t n)
{
	bool all = true;
	pthread_mutex_lock(&st->mu);
	for (size_t i = 0; i < n && all; i++)
		all = !ops[i] || ops[i]->done;
	pthread_mutex_unlock(&st->mu);
	return all;
}

/* "addr:port" as the client names a server (numeric; IPv6 without
 * brackets, or with them as our connect string writes it) to an address. */
static bool server_addr(const char *server, struct sockaddr_storage *out, socklen_t *len)
{
	char host[128];
	const char *colon = strrchr(server, ':');
	if (!colon || colon == server || (size_t)(colon - server) >= sizeof(host))
		return false;
	snprintf(host, sizeof(host), "%.*s", (int)(colon - server), server);
	if (host[0] == '[') {
		memmove(host, host + 1, strlen(host));
		host[strcspn(host, "]")] = '\0';
	}
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
		return false;
	bool ok = ai->ai_addrlen <= sizeof(*out);
	if (ok) {
		memcpy(out, ai->ai_addr, ai->ai_addrlen);
		*len = ai->ai_addrlen;
	}
	freeaddrinfo(ai);
	return ok;
}

static int probe(const char *server, int64_t until, zookeeper_store *st, zop *const *ops, size_t n)
{
	struct sockaddr_storage sa;
	socklen_t salen;
	if (!server_addr(server, &sa, &salen))
		return PROBE_ANSWERED; /* nothing to ask: do nothing */
	int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int r = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sa, salen);
	if (fd < 0 || (r != 0 && errno != EINPROGRESS)) {
		if (fd >= 0)
			close(fd);
		return PROBE_ANSWERED; /* refused: dead, which the client sees by itself */
	}
	bool sent = false;
	int res = PROBE_SILENT;
	for (;;) {
		if (ops && ops_all_done(st, ops, n)) {
			res = PROBE_MOOT;
			break;
		}
		int64_t left = until - dlock_clock_ms();
		if (left <= 0)
			break;
		struct pollfd p = { .fd = fd, .events = sent ? POLLIN : POLLOUT };
		int pr = poll(&p, 1, (int)(left < 10 ? left : 10));
		if (pr < 0 && errno != EINTR)
			break;
		if (pr <= 0)
			continue;
		if (!sent && !(p.revents & (POLLERR | POLLHUP))) {
			int err = 0;
			socklen_t len = sizeof(err);
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
			    send(fd, "srvr", 4, MSG_NOSIGNAL) == 4) {
				sent = true;
				continue;
			}
		}
		res = PROBE_ANSWERED; /* an answer, a close, a reset or a failed connect */
		break;
	}
	close(fd);
	return res;
}

bool dlock__zk_server_silent(const char *server, int64_t until)
{
	return probe(server, until, NULL, NULL, 0) == PROBE_SILENT;
}

/*
 * Shut down every TCP connection of this process to `server` (stopped):
 * each libzookeeper handle on it sees its connection closed at once, fails
 * the requests out on it as ZCONNECTIONLOSS and reconnects — with the same
 * session — to the next server of its list. Only ZooKeeper clients talk to
 * a ZooKeeper client port, and every session on a silent server is better
 * off elsewhere. shutdown(), not close(): the descriptors stay the
 * library's.
 */
static void cut_link(int fd, const struct sockaddr_storage *sa)
{
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0 || peer.ss_family != sa->ss_family)
		return;
	bool same = false;
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)sa, *y = (const void *)&peer;
		same = x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	} else if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)sa, *y = (const void *)&peer;
		same = x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
	}
	if (same)
		shutdown(fd, SHUT_RDWR);
}

static void cut_links(const char *server)
{
	struct sockaddr_storage sa;
	socklen_t salen;
	if (!server_addr(server, &sa, &salen))
		return;
	DIR *d = opendir("/proc/self/fd");
	if (!d) {
		for (int fd = 0; fd < 4096; fd++)
			cut_link(fd, &sa);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
			cut_link(atoi(e->d_name), &sa);
	closedir(d);
}

void dlock__zk_check_server(zookeeper_store *st, zhandle_t *zh, zop *const *ops, size_t n, int64_t until)
{
	char *list = NULL;
	pthread_mutex_lock(&st->mu);
	for (zsess *z = st->sessions; z; z = z->next)
		if (z->zh == zh && !z->expired && z->state == ZOO_CONNECTED_STATE && z->servers &&
		    strchr(z->servers, ','))
			list = strdup(z->servers);
	pthread_mutex_unlock(&st->mu);
	if (!list)
		return; /* one server, or not connected: nowhere to move, or moving already */
	char cur[160];
	const char *c = zoo_get_current_server(zh);
	snprintf(cur, sizeof(cur), "%s", c ? c : "");
	size_t count = 1;
	for (const char *p = list; *p; p++)
		count += *p == ',';
	if (probe(cur, until, st, ops, n) == PROBE_SILENT && drop_server(list, cur, &count)) {
		/* The client closes the connection and takes another server of the
		 * list; the wake-up request makes its I/O thread do it now. */
		/* The next connection takes another server of the list... */
		zoo_set_servers(zh, list);
		/* ...and this one is ended now: libzookeeper keeps a connected
		 * socket whatever the list says, until its own 2/3 timeout. */
		cut_links(cur);
	}
	free(list);
}

/* A connected session with timeout key `want` (made, or remade after expiry,
 * as needed), by `deadline`. Borrowed: valid while the caller holds the
 * core's store mutex. */
int dlock__zk_get_session(zookeeper_store *st, int64_t want, int64_t deadline, zsess **out)
{
	int64_t start = dlock_clock_ms();
	pthread_mutex_lock(&st->mu);
	zsess *z = NULL, *retired = NULL;
	for (int round = 0; round < 2; round++) {
		z = NULL;
		for (zsess *s = st->sessions; s; s = s->next)
			if (s->current && s->want_ms == want)
				z = s;
		if (z && z->expired) {
			/* After expiry a new session serves later acquires; holds of the
			 * old one keep it referenced until they are released as lost. */
			z->current = false;
			retired = dlock__zk_unref_locked(z);
			z = NULL;
		}
		if (!z)
			break;
		bool ok = wait_connected_locked(st, z, deadline);
		if (ok) {
			pthread_mutex_unlock(&st->mu);
			*out = z;
			return 0;
		}
		if (!z->expired || z->auth_failed) {
			int rc = z->expired ? dead_sess_error(z) : not_connected_error(st, dlock_clock_ms() - start);
			pthread_mutex_unlock(&st->mu);
			return rc;
		}
		/* it expired while we waited for it to reconnect: make a new one */
	}
	pthread_mutex_unlock(&st->mu);
	dlock__zk_close_sess(retired);

	z = dlock_sys_calloc(1, sizeof(*z));
	if (!z)
		return DLOCK_ENOMEM;
	z->st = st;
	z->want_ms = want;
	z->refs = 1;
	z->current = true;
	z->state = ZOO_CONNECTING_STATE;
	pthread_mutex_lock(&st->mu);
	z->next = st->sessions;
	st->sessions = z;
	pthread_mutex_unlock(&st->mu);
	/* zh is assigned before anything but the watcher can see z; the watcher
	 * only uses the handle it is given. */
	char *numeric = NULL;
	int rrc = resolve_hosts(st, deadline, &numeric);
	if (rrc) {
		dlock__zk_unref(st, z);
		return rrc;
	}
	/* The client tries one server at a time and gives a server that takes
	 * the connection but never answers (SIGSTOPped, hung) two thirds of the
	 * session timeout before the next: longer than connect_timeout. So
	 * while more than half of the servers is left, a handle not
	 * connected after CHECK_MIN_MS has its server asked (srvr,
	 * dlock__zk_server_silent): one silent for PROBE_MIN_MS more (a loaded
	 * JVM is slow, not silent) is left — the handle closed, a new one
	 * started without it — and one that answers (refusing clients while it
	 * elects a leader, say: the client cycles through those by itself) is
	 * asked again CHECK_MIN_MS later. A stopped server costs a new session
	 * about CHECK_MIN_MS + PROBE_MIN_MS. The session keeps the shorter list
	 * for its life, half of the servers at least (with 3 members, the 2
	 * listed are a quorum with either other one; with 2 listed, 1). */
	size_t left_n = 1;
	for (const char *c = numeric; *c; c++)
		left_n += *c == ',';
	const size_t keep_n = (left_n + 1) / 2;
	pthread_mutex_lock(&st->mu);
	z->servers = dlock_sys_strdup(numeric); /* NULL: the session is never moved */
	pthread_mutex_unlock(&st->mu);
	bool ok = false, auth = false;
	zhandle_t *zh = NULL;
	for (;;) {
		int64_t now = dlock_clock_ms(), until = deadline;
		if (left_n > keep_n) /* one may be left out: ask this one soon */
			until = now + CHECK_MIN_MS < deadline ? now + CHECK_MIN_MS : deadline;
		if (!zh) {
			pthread_mutex_lock(&st->mu);
			z->state = ZOO_CONNECTING_STATE; /* before the new handle's first event */
			pthread_mutex_unlock(&st->mu);
			errno = 0;
			zh = zookeeper_init2(numeric, dlock__zk_watcher, (int)want, NULL, z, 0, quiet_log);
			if (!zh) {
				int e = errno;
				free(numeric);
				dlock__zk_unref(st, z);
				return dlock_error_set(e == EINVAL ? DLOCK_EINVAL : DLOCK_EUNAVAILABLE, KIND, NULL,
						       "zookeeper: cannot start a session with %s: %s", st->hosts,
						       strerror(e ? e : EIO));
			}
			pthread_mutex_lock(&st->mu);
			z->zh = zh;
			pthread_mutex_unlock(&st->mu);
			if (st->auth) {
				/* queued: sent with the connect request, answered before CONNECTED */
				int rc = zoo_add_auth(zh, "digest", st->auth, (int)strlen(st->auth), NULL, NULL);
				if (rc != ZOK) {
					free(numeric);
					dlock__zk_unref(st, z);
					return dlock__zk_zerr(rc, "add digest auth for", "session");
				}
			}
		}
		pthread_mutex_lock(&st->mu);
		ok = wait_connected_locked(st, z, until);
		auth = z->auth_failed;
		bool dead = z->expired;
		pthread_mutex_unlock(&st->mu);
		if (ok || dead || until >= deadline)
			break;
		/* Not connected yet. Stuck on a server that took the connection
		 * and says nothing (stopped)? Then a new handle without it. Servers
		 * that refuse or close (dead, or electing a leader) the client
		 * cycles through by itself: the same handle waits on. */
		char cur[160];
		const char *c = zoo_get_current_server(zh);
		snprintf(cur, sizeof(cur), "%s", c ? c : "");
		now = dlock_clock_ms();
		if (!dlock__zk_server_silent(cur, now + PROBE_MIN_MS < deadline ? now + PROBE_MIN_MS : deadline) ||
		    !drop_server(numeric, cur, &left_n))
			continue;
		pthread_mutex_lock(&st->mu);
		z->zh = NULL;
		pthread_mutex_unlock(&st->mu);
		zookeeper_close(zh);
		zh = NULL;
	}
	free(numeric);
	if (!ok) {
		pthread_mutex_lock(&st->mu);
		z->current = false;
		pthread_mutex_unlock(&st->mu);
		dlock__zk_unref(st, z);
		if (auth)
			return dlock_error_set(DLOCK_EAUTH, KIND, "ZAUTHFAILED",
					       "zookeeper: the server refused our credentials");
		return dlock_error_set(DLOCK_EUNAVAILABLE, KIND, "ZCONNECTIONLOSS",
				       "zookeeper: no server of %s answered: timed out after %lld ms", st->hosts,
				       (long long)(dlock_clock_ms() - start));
	}
	*out = z;
	return 0;
}

/* The session for a hold of ttl_ms, refusing a ttl the server's session
 * timeout cannot cover. */
int dlock__zk_session_for(zookeeper_store *st, int64_t ttl_ms, int64_t deadline, zsess **out)
{
	int rc = dlock__zk_get_session(st, dlock__zk_session_key(st, ttl_ms), deadline, out);
	if (rc)
		return rc;
	pthread_mutex_lock(&st->mu);
	int granted = (*out)->negotiated;
	pthread_mutex_unlock(&st->mu);
	if (ttl_ms > granted)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: lock ttl %lld ms is longer than the session timeout the server "
				       "granted (%d ms; see its maxSessionTimeout and our session_timeout option): "
				       "a holder cut off from ZooKeeper could outlive its session unnoticed",
				       (long long)ttl_ms, granted);
	return 0;
}
