/* ZooKeeper store: error codes, and every request sent asynchronously and
 * waited for until the caller's deadline (zk.h). */
#include "zk.h"

/* ---------------------------------------------------------------- errors */

static const char *zcode(int rc)
{
	switch (rc) {
        /* clang-format off */
	case ZCONNECTIONLOSS: return "ZCONNECTIONLOSS";
	case ZOPERATIONTIMEOUT: return "ZOPERATIONTIMEOUT";
	case ZSESSIONEXPIRED: return "ZSESSIONEXPIRED";
	case ZINVALIDSTATE: return "ZINVALIDSTATE";
	case ZNOAUTH: return "ZNOAUTH";
	case ZAUTHFAILED: return "ZAUTHFAILED";
	case ZNONODE: return "ZNONODE";
	case ZNODEEXISTS: return "ZNODEEXISTS";
	case ZNOTEMPTY: return "ZNOTEMPTY";
	case ZBADARGUMENTS: return "ZBADARGUMENTS";
	case ZINVALIDACL: return "ZINVALIDACL";
	case ZCLOSING: return "ZCLOSING";
	case ZMARSHALLINGERROR: return "ZMARSHALLINGERROR";
	case ZNOCHILDRENFOREPHEMERALS: return "ZNOCHILDRENFOREPHEMERALS";
	case ZDEADLINE: return "TIMEDOUT";
	case ZRUNTIMEINCONSISTENCY: return "ZRUNTIMEINCONSISTENCY";
	default: return "ZSYSTEMERROR";
        /* clang-format on */
	}
}

int dlock__zk_zerr(int rc, const char *what, const char *path)
{
	int code = DLOCK_EUNAVAILABLE;
	if (rc == ZNOAUTH || rc == ZAUTHFAILED)
		code = DLOCK_EAUTH;
	else if (rc == ZBADARGUMENTS || rc == ZINVALIDACL)
		code = DLOCK_EINVAL;
	if (rc == ZDEADLINE)
		return dlock_error_set(code, KIND, zcode(rc),
				       "zookeeper: %s %s: timed out (no reply by the call's deadline; outcome unknown)",
				       what, path ? path : "");
	return dlock_error_set(code, KIND, zcode(rc), "zookeeper: %s %s: %s", what, path ? path : "", zerror(rc));
}

/* The request may or may not have been applied. (libzookeeper fails the
 * requests in flight with ZRUNTIMEINCONSISTENCY when it drops a connection
 * over a reply out of order: a request lost on a link that works again.) */
bool dlock__zk_lost_conn(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZRUNTIMEINCONSISTENCY || rc == ZDEADLINE;
}

/* ...and there may be time to ask again once reconnected. */
bool dlock__zk_retryable(int rc)
{
	return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZRUNTIMEINCONSISTENCY;
}

/* A sweep's answer that settles the question (anything else: try again). */
bool dlock__zk_settled(int rc)
{
	return rc == ZOK || rc == ZNONODE || rc == ZNOAUTH || rc == ZBADARGUMENTS || rc == ZINVALIDACL;
}

zop *dlock__zk_op_new(zookeeper_store *st)
{
	zop *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	op->st = st;
	op->refs = 2;
	op->rc = ZSYSTEMERROR;
	pthread_mutex_lock(&st->mu);
	op->next = st->ops;
	if (st->ops)
		st->ops->prev = op;
	st->ops = op;
	pthread_mutex_unlock(&st->mu);
	return op;
}

void dlock__zk_op_free_locked(zop *op)
{
	zookeeper_store *st = op->st;
	if (op->prev)
		op->prev->next = op->next;
	else
		st->ops = op->next;
	if (op->next)
		op->next->prev = op->prev;
	deallocate_String_vector(&op->kids);
	free(op->value);
	free(op);
}

/* Under st->mu. */
void dlock__zk_op_unref_locked(zop *op)
{
	if (--op->refs > 0)
		return;
	dlock__zk_op_free_locked(op);
}

/* The completion's part: record, wake the waiters, let go. */
static void op_finish(zop *op, int rc, const struct Stat *stat, struct String_vector kids, char *value, int vlen)
{
	zookeeper_store *st = op->st;
	pthread_mutex_lock(&st->mu);
	op->rc = rc;
	if (stat)
		op->stat = *stat;
	op->kids = kids;
	op->value = value;
	op->vlen = vlen;
	op->done = true;
	pthread_cond_broadcast(&st->cv);
	dlock__zk_op_unref_locked(op);
	pthread_mutex_unlock(&st->mu);
}

static struct String_vector copy_kids(int *rc, const struct String_vector *sv)
{
	struct String_vector kids = { 0, NULL };
	if (*rc != ZOK || !sv || sv->count <= 0)
		return kids;
	kids.data = calloc((size_t)sv->count, sizeof(char *));
	for (int i = 0; kids.data && i < sv->count; i++) {
		if (!(kids.data[i] = strdup(sv->data[i])))
			break;
		kids.count++;
	}
	if (kids.count != sv->count)
		*rc = ZSYSTEMERROR; /* out of memory: as good as no answer */
	return kids;
}

void dlock__zk_cb_void(int rc, const void *data)
{
	op_finish((zop *)data, rc, NULL, (struct String_vector){ 0, NULL }, NULL, 0);
}

void dlock__zk_cb_stat(int rc, const struct Stat *stat, const void *data)
{
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, NULL, 0);
}

void dlock__zk_cb_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
	char *v = rc == ZOK && value ? strdup(value) : NULL;
	if (rc == ZOK && !v)
		rc = ZSYSTEMERROR;
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, v, 0);
}

void dlock__zk_cb_kids(int rc, const struct String_vector *strings, const struct Stat *stat, const void *data)
{
	struct String_vector kids = copy_kids(&rc, strings);
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, kids, NULL, 0);
}

void dlock__zk_cb_data(int rc, const char *value, int len, const struct Stat *stat, const void *data)
{
	char *v = NULL;
	if (rc == ZOK && value && len > 0 && (v = malloc((size_t)len)) != NULL)
		memcpy(v, value, (size_t)len);
	op_finish((zop *)data, rc, rc == ZOK ? stat : NULL, (struct String_vector){ 0, NULL }, v, v ? len : 0);
}

/* After zoo_a*: a request the library refused will have no completion. */
zop *dlock__zk_op_sent(zookeeper_store *st, zop *op, int r)
{
	if (op && r != ZOK) {
		pthread_mutex_lock(&st->mu);
		op->rc = r;
		op->done = true;
		dlock__zk_op_unref_locked(op);
		pthread_mutex_unlock(&st->mu);
	}
	return op;
}

/* Wait until every op is done or the deadline passes. @return all done.
 * ops were sent on zh (NULL: none to check). A request still out after a
 * quarter of the wait has its server checked (dlock__zk_check_server): one
 * that says nothing until half the wait (at least PROBE_MIN_MS later) is
 * left, within the wait, for the session's other servers. */
bool dlock__zk_ops_wait(zookeeper_store *st, zhandle_t *zh, zop *const *ops, size_t n, int64_t deadline)
{
	int64_t start = dlock_clock_ms();
	/* The server gets at least PROBE_MIN_MS to answer (a loaded machine's
	 * JVM may be slow; it is not silent), and never the wait's last eighth. */
	int64_t check_at = start + (deadline - start) / 4, decide_by = start + (deadline - start) / 2;
	if (decide_by < check_at + PROBE_MIN_MS)
		decide_by = check_at + PROBE_MIN_MS;
	if (decide_by > deadline - (deadline - start) / 8)
		decide_by = deadline - (deadline - start) / 8;
	bool checked = !zh || deadline - start < 4 * CHECK_MIN_MS;
	pthread_mutex_lock(&st->mu);
	for (;;) {
		size_t i = 0;
		while (i < n && (!ops[i] || ops[i]->done))
			i++;
		if (i == n)
			break;
		int64_t now = dlock_clock_ms();
		if (deadline - now <= 0)
			break;
		if (!checked && now >= check_at) {
			checked = true;
			pthread_mutex_unlock(&st->mu);
			dlock__zk_check_server(st, zh, ops, n, decide_by);
			pthread_mutex_lock(&st->mu);
			continue;
		}
		struct timespec ts;
		dlock_sys_abstime(&ts, (checked ? deadline : check_at) - now);
		pthread_cond_timedwait(&st->cv, &st->mu, &ts);
	}
	bool all = true;
	for (size_t i = 0; i < n; i++)
		all = all && ops[i] && ops[i]->done;
	pthread_mutex_unlock(&st->mu);
	return all;
}

/* The op's result (ZDEADLINE if it is still out), after dlock__zk_ops_wait. A done op
 * is no longer touched by its completion: its fields may be read freely. */
int dlock__zk_op_rc(zookeeper_store *st, zop *op)
{
	if (!op)
		return ZSYSTEMERROR;
	pthread_mutex_lock(&st->mu);
	int rc = op->done ? op->rc : ZDEADLINE;
	pthread_mutex_unlock(&st->mu);
	return rc;
}

void dlock__zk_op_put(zookeeper_store *st, zop *op)
{
	if (!op)
		return;
	pthread_mutex_lock(&st->mu);
	dlock__zk_op_unref_locked(op);
	pthread_mutex_unlock(&st->mu);
}

int dlock__zk_op_wait1(zookeeper_store *st, zhandle_t *zh, zop *op, int64_t deadline)
{
	dlock__zk_ops_wait(st, zh, &op, 1, deadline);
	return dlock__zk_op_rc(st, op);
}

/* The bounded forms of the synchronous calls. */
int dlock__zk_z_children(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline,
			 struct String_vector *out, int32_t *cversion)
{
	zop *op = dlock__zk_op_new(st);
	dlock__zk_op_sent(st, op, op ? zoo_aget_children2(zh, path, 0, dlock__zk_cb_kids, op) : ZSYSTEMERROR);
	int rc = dlock__zk_op_wait1(st, zh, op, deadline);
	if (rc == ZOK) {
		*out = op->kids;
		op->kids = (struct String_vector){ 0, NULL };
		if (cversion)
			*cversion = op->stat.cversion;
	}
	dlock__zk_op_put(st, op);
	return rc;
}

int dlock__zk_z_exists(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline, struct Stat *stat)
{
	zop *op = dlock__zk_op_new(st);
	dlock__zk_op_sent(st, op, op ? zoo_aexists(zh, path, 0, dlock__zk_cb_stat, op) : ZSYSTEMERROR);
	int rc = dlock__zk_op_wait1(st, zh, op, deadline);
	if (rc == ZOK && stat)
		*stat = op->stat;
	dlock__zk_op_put(st, op);
	return rc;
}

int dlock__zk_z_delete(zookeeper_store *st, zhandle_t *zh, const char *path, int64_t deadline)
{
	zop *op = dlock__zk_op_new(st);
	dlock__zk_op_sent(st, op, op ? zoo_adelete(zh, path, -1, dlock__zk_cb_void, op) : ZSYSTEMERROR);
	int rc = dlock__zk_op_wait1(st, zh, op, deadline);
	dlock__zk_op_put(st, op);
	return rc;
}
