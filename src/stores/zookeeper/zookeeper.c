/*
 * The ZooKeeper store (libzookeeper_mt): Curator's lock recipes over
 * ephemeral sequential nodes, with the holes of ZooKeeper's own C recipe
 * (zoo_lock.c) closed — a lost session is reported, a create that hit a
 * connection loss is found again instead of repeated, and a grant is only
 * returned after our node is seen first in line.
 *
 * Layout: /[chroot/]<prefix>/<escaped name>/_c_<owner>-<kind>-<10-digit seq>
 * where kind is "lock" (exclusive), "read" (shared) or "sem" (semaphore).
 * The prefix and name nodes are containers: the server removes them once
 * their last child is gone. A hold is granted when no earlier node blocks it:
 * exclusive — no earlier node at all; shared — no earlier lock/sem node;
 * semaphore of N — no earlier lock/read node and fewer than N earlier sem
 * nodes. Fence = czxid of our node (zxids only grow, ensemble-wide).
 *
 * Sessions: a hold lives in a session whose timeout is at least the hold's
 * TTL (the TTL rounded up to a power-of-two number of seconds, or the fixed
 * `session_timeout=` option), so the core's lease deadline (t0 + ttl) always
 * passes before the server can expire the session and give the lock away.
 * Every renewal is a round trip (pipelined exists() of our nodes), which is
 * what lets the core move that deadline forward: the server heard from us
 * after the renewal started, so it cannot expire us before t0 + timeout.
 *
 * Locking: every method but `wait` runs under the core's store mutex. `wait`
 * runs concurrently, so shared state (sessions, refs, watch registrations)
 * is under st->mu. The watcher runs on libzookeeper's completion thread and
 * takes st->mu, so no synchronous zoo_* call may ever be made holding st->mu,
 * and zookeeper_close (which joins that thread) is only called without it.
 */

#include "zk.h"

void dlock__zk_close(dlock_backend *be)
{
	zookeeper_store *st = (zookeeper_store *)be;
	dlock__zk_reap(st);
	/* Holds nobody released: a lock freed after it was lost (the core does
	 * not release those). Their nodes end with the sessions below. */
	while (st->holds)
		dlock__zk_hold_free(st, st->holds);
	/* Orphans' nodes end with the sessions too. Closing a session completes
	 * its requests in flight (ZCLOSING), sweeps included: `closing` keeps
	 * those from freeing orphans or starting anything. */
	pthread_mutex_lock(&st->mu);
	st->closing = true;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	if (st->sweeper_started)
		pthread_join(st->sweeper, NULL);
	pthread_mutex_lock(&st->mu);
	zsess *all = st->sessions;
	st->sessions = NULL;
	pthread_mutex_unlock(&st->mu);
	while (all) {
		zsess *z = all;
		all = z->next;
		dlock__zk_close_sess(z);
	}
	dlock__zk_reap(st);
	/* libzookeeper (3.8) can lose completions it queues while closing (its
	 * completion thread may stop before running them): free what never
	 * came back. No completion can come any more. */
	while (st->ops)
		dlock__zk_op_free_locked(st->ops);
	while (st->orphans) {
		orphan *o = st->orphans;
		st->orphans = o->next;
		o->sess = NULL; /* closed above */
		dlock__zk_orphan_free_locked(o);
	}
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st->hosts);
	dlock_free(st->hp);
	free(st->root);
	dlock_sys_free_secret(st->auth);
	free(st);
}

/* ---------------------------------------------------------------- open */

static int check_chroot(const char *path)
{
	if (!*path || strcmp(path, "/") == 0)
		return 0;
	if (path[0] != '/')
		return DLOCK_EINVAL;
	for (const char *c = path + 1;;) {
		size_t n = strcspn(c, "/");
		if (n == 0 && c[0] == '\0' && c[-1] == '/')
			return 0; /* a trailing slash */
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return DLOCK_EINVAL;
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
				return DLOCK_EINVAL;
		if (c[n] == '\0')
			return 0;
		c += n + 1;
	}
}

/* Ephemeral nodes live with our session: DLOCK_BACKEND_F_SESSION. */
/* clang-format off */
static const dlock_backend_methods zookeeper_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.flags = DLOCK_BACKEND_F_SESSION,
	.acquire = dlock__zk_acquire,
	.release = dlock__zk_release,
	.renew = dlock__zk_renew,
	.extend = dlock__zk_extend,
	.wait = dlock__zk_wait,
	.cancel = dlock__zk_cancel,
	.status = dlock__zk_status,
	.list = dlock__zk_list,
	.close = dlock__zk_close,
};
/* clang-format on */

int dlock__zk_open(dlock_backend **out, dlock_uri *uri)
{
	if (!uri->hosts || !*uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper URIs name servers: zk://host:port[,host:port...][/chroot]");
	if (check_chroot(uri->path))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: bad chroot '%s' (want /a/b: no empty, '.' or '..' parts)",
				       uri->path);
	int64_t fixed = 0;
	const char *v = dlock_uri_param(uri, "session_timeout");
	if (v && (dlock_duration_parse(&fixed, v) != 0 || fixed < 10 || fixed > INT32_MAX / 2))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: bad session_timeout '%s' (a duration such as 10s)", v);
	if (uri->user && !uri->password)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: digest auth needs user:password@ (got a user without a password)");
	if (!*uri->prefix)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "zookeeper: the prefix must not be empty");
	int recipe = RECIPE_DLOCK;
	if ((v = dlock_uri_param(uri, "recipe")) != NULL) {
		if (strcmp(v, "curator") == 0)
			recipe = RECIPE_CURATOR;
		else if (strcmp(v, "curator-rw") == 0)
			recipe = RECIPE_CURATOR_RW;
		else if (strcmp(v, "dlock") != 0)
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "zookeeper: unknown recipe '%s' (dlock, curator or curator-rw)", v);
	}

	dlock_hostport *hp = NULL;
	size_t nh = 0;
	int rc = dlock_uri_hosts(uri, 2181, &hp, &nh);
	if (rc)
		return rc;
	zookeeper_store *st = dlock_sys_calloc(1, sizeof(*st));
	if (!st) {
		dlock_free(hp);
		return DLOCK_ENOMEM;
	}
	dlock_backend_init(&st->base, &zookeeper_methods);
	st->fixed_session = fixed;
	st->recipe = recipe;
	st->connect_ms = uri->connect_timeout_ms;
	st->request_ms = uri->request_timeout_ms > 0 ? uri->request_timeout_ms : 2000;
	st->default_ttl = uri->ttl_ms;
	pthread_mutex_init(&st->mu, NULL);
	dlock_sys_cond_init_monotonic(&st->cv);

	size_t cap = nh * 270 + 1;
	st->hosts = calloc(1, cap);
	for (size_t i = 0; st->hosts && i < nh; i++) {
		size_t len = strlen(st->hosts);
		bool v6 = strchr(hp[i].host, ':') != NULL;
		snprintf(st->hosts + len, cap - len, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", hp[i].host,
			 v6 ? "]" : "", hp[i].port);
	}
	st->hp = hp;
	st->nh = nh;
	char *pre = dlock__zk_escape(uri->prefix);
	const char *chroot = strcmp(uri->path, "/") == 0 ? "" : uri->path;
	size_t cl = strlen(chroot);
	while (cl > 0 && chroot[cl - 1] == '/')
		cl--;
	st->root = pre ? dlock_sys_sprintf("%.*s/%s", (int)cl, chroot, pre) : NULL;
	if (!cl && pre && strcmp(pre, "zookeeper") == 0) {
		free(pre);
		dlock__zk_close(&st->base);
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "zookeeper: prefix 'zookeeper' is reserved by the server at the root");
	}
	free(pre);
	if (uri->user)
		st->auth = dlock_sys_sprintf("%s:%s", uri->user, uri->password);
	for (size_t i = 0; uri->user && i < nh; i++)
		if (!dlock_sys_host_is_local(hp[i].host)) {
			dlock_sys_open_warning(
				"zookeeper: the digest password and the lock traffic go to %s over "
				"dlock__zk_plain TCP, which a man in the middle can read (this build's client has "
				"no TLS)",
				hp[i].host);
			break;
		}
	if (!st->hosts || !st->root || (uri->user && !st->auth)) {
		dlock__zk_close(&st->base);
		return DLOCK_ENOMEM;
	}
	if (st->auth) {
		/* Ours to change, readable by all (status from other credentials). */
		st->acl_entries[0] = (struct ACL){ ZOO_PERM_ALL, ZOO_AUTH_IDS };
		st->acl_entries[1] = (struct ACL){ ZOO_PERM_READ, ZOO_ANYONE_ID_UNSAFE };
		st->acl = (struct ACL_vector){ 2, st->acl_entries };
	} else {
		st->acl = ZOO_OPEN_ACL_UNSAFE;
	}
	/* Every option is read by now: report a misspelt one before spending
	 * connect_timeout on a server that may not be there. */
	if ((rc = dlock_sys_uri_check_unused(uri))) {
		dlock__zk_close(&st->base);
		return rc;
	}
	/* Connect now: a wrong address or credentials should fail at open (a
	 * ttl the session cannot cover is refused per lock, at acquire). */
	zsess *z;
	rc = dlock__zk_get_session(st, dlock__zk_session_key(st, st->default_ttl), dlock_clock_ms() + st->connect_ms,
				   &z);
	if (rc) {
		dlock__zk_close(&st->base);
		return rc;
	}
	*out = &st->base;
	return 0;
}
