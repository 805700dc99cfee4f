/* ZooKeeper store: status and list (zk.h). */
#include "zk.h"

/* ---------------------------------------------------------------- status */

static int status_one(zookeeper_store *st, zhandle_t *zh, const char *name, int64_t deadline, dlock_lock_status **out,
		      size_t *count)
{
	dlock_lock_status *s = dlock_sys_status_add(out, count);
	if (!s || !(s->name = dlock_sys_strdup(name)))
		return DLOCK_ENOMEM;
	char *dir = dlock__zk_dir_of(st, name);
	if (!dir)
		return DLOCK_ENOMEM;
	struct String_vector sv = { 0, NULL };
	int r = dlock__zk_z_children(st, zh, dir, deadline, &sv, NULL);
	if (r == ZNONODE) {
		free(dir);
		return 0;
	}
	if (r != ZOK) {
		int rc = dlock__zk_zerr(r, "list", dir);
		free(dir);
		return rc;
	}
	child *cs = calloc((size_t)sv.count + 1, sizeof(*cs));
	zop **ops = calloc((size_t)sv.count + 1, sizeof(*ops));
	int rc = cs && ops ? 0 : dlock_sys_oom();
	size_t n = 0;
	for (int i = 0; cs && i < sv.count; i++)
		if (dlock__zk_parse_child(sv.data[i], &cs[n]))
			n++;
	if (cs)
		qsort(cs, n, sizeof(*cs), dlock__zk_by_seq);
	/* Every node's data in one pipelined round trip. */
	for (size_t i = 0; i < n && !rc; i++) {
		char *p = dlock_sys_sprintf("%s/%s", dir, cs[i].name);
		zop *op = p ? dlock__zk_op_new(st) : NULL;
		ops[i] = dlock__zk_op_sent(st, op, op ? zoo_aget(zh, p, 0, dlock__zk_cb_data, op) : ZSYSTEMERROR);
		free(p);
	}
	if (!rc)
		dlock__zk_ops_wait(st, zh, ops, n, deadline);
	/* Who holds: the same rule acquire applies, node by node. */
	size_t sems = 0;
	bool writer_seen = false, reader_seen = false;
	unsigned sem_limit = UINT_MAX; /* the smallest permits of the semaphore nodes so far */
	for (size_t i = 0; i < n && !rc; i++) {
		r = dlock__zk_op_rc(st, ops[i]);
		if (r == ZNONODE)
			continue;
		if (r != ZOK) {
			rc = dlock__zk_zerr(r, "read", dir);
			break;
		}
		char data[600];
		int len = ops[i]->vlen < (int)sizeof(data) - 1 ? ops[i]->vlen : (int)sizeof(data) - 1;
		if (len > 0)
			memcpy(data, ops[i]->value, (size_t)len);
		data[len > 0 ? len : 0] = '\0';
		struct Stat stat = ops[i]->stat;
		int pid = 0;
		long long ttl = -1;
		unsigned permits = 1;
		char host[256] = "";
		const char *hp = strstr(data, " host=");
		if (hp)
			snprintf(host, sizeof(host), "%s", hp + 6);
		if (sscanf(data, "dlock1 pid=%d ttl=%lld permits=%u", &pid, &ttl, &permits) != 3)
			pid = 0, ttl = -1, permits = 1;
		bool holds;
		switch (cs[i].kind) {
		case K_READ:
			holds = !writer_seen && sems == 0;
			reader_seen = true;
			break;
		case K_SEM:
			if (permits < sem_limit)
				sem_limit = permits;
			holds = !writer_seen && !reader_seen && sems < sem_limit;
			sems++;
			if (permits > 1)
				s->permits = permits;
			break;
		default:
			holds = i == 0;
			writer_seen = true;
			break;
		}
		if (!holds) {
			s->waiters++;
			continue;
		}
		dlock_holder *hd = dlock_sys_status_add_holder(s);
		if (!hd) {
			rc = DLOCK_ENOMEM;
			break;
		}
		/* owner: between "_c_" and "-<kind>-<seq>" */
		const char *o = strncmp(cs[i].name, "_c_", 3) == 0 ? cs[i].name + 3 : cs[i].name;
		size_t olen = strlen(o) - SEQ_DIGITS - 1;
		while (olen > 0 && o[olen - 1] != '-')
			olen--;
		hd->owner = dlock_sys_strndup(o, olen ? olen - 1 : 0);
		hd->host = dlock_sys_strdup(host);
		hd->pid = pid;
		hd->mode = cs[i].kind == K_READ ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		hd->fence = (uint64_t)stat.czxid;
		/* The node lives as long as its holder's session: its ttl is what the
		 * holder itself allows between confirmations. */
		hd->ttl_left_ms = ttl;
		if ((uint64_t)stat.czxid > s->last_fence)
			s->last_fence = (uint64_t)stat.czxid;
		if (!hd->owner || !hd->host)
			rc = DLOCK_ENOMEM;
	}
	for (size_t i = 0; ops && i < n; i++)
		dlock__zk_op_put(st, ops[i]);
	free(ops);
	free(cs);
	deallocate_String_vector(&sv);
	free(dir);
	return rc;
}

/* The core lists through dlock__zk_list, so names is never NULL here. Bounded by
 * the request timeout from the start of the call. */
int dlock__zk_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out, size_t *count)
{
	zookeeper_store *st = (zookeeper_store *)be;
	int64_t deadline = dlock_clock_ms() + st->request_ms;
	dlock__zk_reap(st);
	zsess *z;
	int rc = dlock__zk_get_session(st, dlock__zk_session_key(st, st->default_ttl), deadline, &z);
	for (size_t i = 0; i < nnames && !rc; i++)
		rc = status_one(st, z->zh, names[i], deadline, out, count);
	return rc;
}

/* The name nodes under the root (a name node with nobody in it, about to be
 * reaped, shows as an idle lock: the core drops it). */
int dlock__zk_list(dlock_backend *be, char ***names, size_t *n)
{
	zookeeper_store *st = (zookeeper_store *)be;
	int64_t deadline = dlock_clock_ms() + st->request_ms;
	dlock__zk_reap(st);
	zsess *z;
	int rc = dlock__zk_get_session(st, dlock__zk_session_key(st, st->default_ttl), deadline, &z);
	if (rc)
		return rc;
	struct String_vector sv = { 0, NULL };
	int r = dlock__zk_z_children(st, z->zh, st->root, deadline, &sv, NULL);
	if (r == ZNONODE)
		return 0;
	if (r != ZOK)
		return dlock__zk_zerr(r, "list", st->root);
	char **all = sv.count > 0 ? calloc((size_t)sv.count, sizeof(*all)) : NULL;
	if (sv.count > 0 && !all)
		rc = dlock_sys_oom();
	for (int i = 0; i < sv.count && all; i++)
		if ((all[*n] = dlock__zk_unescape(sv.data[i])) != NULL) /* NULL: not a name of ours */
			(*n)++;
	*names = all;
	deallocate_String_vector(&sv);
	return rc;
}
