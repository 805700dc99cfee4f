/*
 * PostgreSQL store, mode=table (the default): leases in tables, judged only by
 * the server's clock (clock_timestamp()); the client's clock never appears in
 * SQL. The acquire is one call of dlock_acquire_v1 (schema.sql).
 */
#include "pg.h"

/* ------------------------------------------------------------- table mode */

void dlock__pg_i64s(char *buf, size_t n, int64_t v)
{
	snprintf(buf, n, "%" PRId64, v);
}

static int tbl_acquire(dlock_backend *base, const dlock_request *req, dlock_grant *out)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	char mode[4], permits[16], ttl[24], qttl[24], pid[16];
	snprintf(mode, sizeof mode, "%d", req->mode == DLOCK_SHARED ? 1 : 0);
	snprintf(permits, sizeof permits, "%u", req->permits);
	dlock__pg_i64s(ttl, sizeof ttl, req->ttl_ms);
	dlock__pg_i64s(qttl, sizeof qttl, req->queue_ttl_ms);
	snprintf(pid, sizeof pid, "%d", req->pid);
	const char *v[] = { be->ns,
			    req->name,
			    req->owner,
			    mode,
			    permits,
			    ttl,
			    req->waiting ? "t" : "f",
			    req->fair ? "t" : "f",
			    qttl,
			    req->host ? req->host : "",
			    pid };
	PGresult *r;
	rc = dlock__pg_run_stmt(be, deadline, S_ACQUIRE, "acquire", v, &r);
	if (rc)
		return rc;
	uint64_t f = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
	int64_t retry = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
	PQclear(r);
	if (f == 0) {
		if (retry > 0)
			out->retry_ms = retry;
		return DLOCK_ELOCKED;
	}
	out->fence = f;
	return 0;
}

static int tbl_release(dlock_backend *base, const dlock_request *req)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	const char *v[] = { be->ns, req->name, req->owner };
	PGresult *r;
	rc = dlock__pg_run_stmt(be, deadline, S_RELEASE, "release", v, &r);
	if (rc)
		return rc;
	int live = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return live ? 0 : DLOCK_ENOTHELD;
}

static int tbl_extend(dlock_backend *base, const dlock_request *req, int64_t ttl_ms)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	char ttl[24];
	dlock__pg_i64s(ttl, sizeof ttl, ttl_ms);
	const char *v[] = { be->ns, req->name, req->owner, ttl };
	PGresult *r;
	rc = dlock__pg_run(
		&be->conn, deadline, "extend",
		"UPDATE dlock_holders SET expires = GREATEST(expires, clock_timestamp() + $4::bigint * interval '1 millisecond')"
		" WHERE ns = $1 AND name = $2 AND owner = $3 AND expires > clock_timestamp() RETURNING 1",
		4, v, &r);
	if (rc)
		return rc;
	int ok = PQntuples(r) == 1;
	PQclear(r);
	return ok ? 0 : DLOCK_ENOTHELD;
}

/* Append s as one element of a PostgreSQL array literal. */
static int arr_add(char **buf, size_t *len, size_t *cap, const char *s)
{
	size_t need = *len + 2 * strlen(s) + 4;
	if (need > *cap) {
		size_t nc = need * 2 + 64;
		char *nb = realloc(*buf, nc);
		if (!nb)
			return dlock_sys_oom();
		*buf = nb;
		*cap = nc;
	}
	char *p = *buf + *len;
	if (*len > 1)
		*p++ = ',';
	*p++ = '"';
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			*p++ = '\\';
		*p++ = *s;
	}
	*p++ = '"';
	*p = 0;
	*len = (size_t)(p - *buf);
	return 0;
}

typedef struct arr {
	char *buf;
	size_t len, cap;
} arr;

static int arr_init(arr *a)
{
	a->buf = malloc(64);
	if (!a->buf)
		return dlock_sys_oom();
	strcpy(a->buf, "{");
	a->len = 1;
	a->cap = 64;
	return 0;
}

static int arr_push(arr *a, const char *s)
{
	return arr_add(&a->buf, &a->len, &a->cap, s);
}

static int arr_close(arr *a)
{
	if (a->len + 2 > a->cap) {
		char *nb = realloc(a->buf, a->len + 2);
		if (!nb)
			return dlock_sys_oom();
		a->buf = nb;
	}
	strcpy(a->buf + a->len, "}");
	a->len++;
	return 0;
}

static int tbl_renew(dlock_backend *base, const dlock_request *const *reqs, size_t n, int *results)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = n ? reqs[0]->deadline_ms : dlock_clock_ms();
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	arr names = { 0 }, owners = { 0 }, ttls = { 0 }, idx = { 0 };
	if ((rc = arr_init(&names)) || (rc = arr_init(&owners)) || (rc = arr_init(&ttls)) || (rc = arr_init(&idx)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		char t[24], k[24];
		dlock__pg_i64s(t, sizeof t, reqs[i]->ttl_ms);
		snprintf(k, sizeof k, "%zu", i);
		if ((rc = arr_push(&names, reqs[i]->name)) || (rc = arr_push(&owners, reqs[i]->owner)) ||
		    (rc = arr_push(&ttls, t)) || (rc = arr_push(&idx, k)))
			goto out;
	}
	if ((rc = arr_close(&names)) || (rc = arr_close(&owners)) || (rc = arr_close(&ttls)) || (rc = arr_close(&idx)))
		goto out;
	const char *v[] = { be->ns, names.buf, owners.buf, ttls.buf, idx.buf };
	PGresult *r;
	/* One statement for the whole batch; only live rows of their owners move,
	 * never back: a renewal that lands after an extend keeps its expiry. */
	rc = dlock__pg_run(
		&be->conn, deadline, "renew",
		"UPDATE dlock_holders h SET expires = GREATEST(h.expires, clock_timestamp() + r.ttl * interval '1 millisecond')"
		" FROM unnest($2::text[], $3::text[], $4::bigint[], $5::int[]) AS r(name, owner, ttl, i)"
		" WHERE h.ns = $1 AND h.name = r.name AND h.owner = r.owner"
		" AND h.expires > clock_timestamp() RETURNING r.i",
		5, v, &r);
	if (rc)
		goto out;
	for (size_t i = 0; i < n; i++)
		results[i] = DLOCK_ENOTHELD;
	for (int row = 0; row < PQntuples(r); row++) {
		long i = strtol(PQgetvalue(r, row, 0), NULL, 10);
		if (i >= 0 && (size_t)i < n)
			results[i] = 0;
	}
	PQclear(r);
out:
	free(names.buf);
	free(owners.buf);
	free(ttls.buf);
	free(idx.buf);
	return rc;
}

static int tbl_cancel(dlock_backend *base, const dlock_request *req)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = req->deadline_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	const char *v[] = { be->ns, req->name, req->owner };
	/* The queue head may have changed: wake the others. */
	return dlock__pg_run(&be->conn, deadline, "cancel",
			     "WITH d AS (DELETE FROM dlock_waiters WHERE ns = $1 AND name = $2 AND owner = $3"
			     " RETURNING 1) SELECT pg_notify('" CHANNEL "', $1 || chr(31) || $2) FROM d",
			     3, v, NULL);
}

static char *dupval(PGresult *r, int row, int col)
{
	return dlock_sys_strdup(PQgetvalue(r, row, col));
}

static int names_array(arr *a, const char *const *names, size_t nnames)
{
	int rc = arr_init(a);
	for (size_t i = 0; !rc && i < nnames; i++)
		rc = arr_push(a, names[i]);
	return rc ? rc : arr_close(a);
}

/* Index of name in out[0..count), or -1. */
static long find_status(dlock_lock_status *out, size_t count, const char *name)
{
	for (size_t i = 0; i < count; i++)
		if (strcmp(out[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* The names with a live holder or waiter (the core then asks status for them). */
static int tbl_list(dlock_backend *base, char ***names, size_t *count)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	*names = NULL;
	*count = 0;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	PGresult *r = NULL;
	const char *v[] = { be->ns };
	rc = dlock__pg_run(&be->conn, deadline, "list",
			   "SELECT name FROM dlock_holders WHERE ns = $1 AND expires > clock_timestamp()"
			   " UNION SELECT name FROM dlock_waiters WHERE ns = $1 AND expires > clock_timestamp()",
			   1, v, &r);
	if (rc)
		return rc;
	int n = PQntuples(r);
	if (n > 0 && !(*names = dlock_sys_calloc((size_t)n, sizeof(char *))))
		rc = DLOCK_ENOMEM;
	for (int row = 0; rc == 0 && row < n; row++) {
		if (!((*names)[row] = dupval(r, row, 0)))
			rc = DLOCK_ENOMEM;
		else
			*count = (size_t)row + 1;
	}
	PQclear(r);
	return rc;
}

static int tbl_status(dlock_backend *base, const char *const *names, size_t nnames, dlock_lock_status **out,
		      size_t *count)
{
	postgres_store *be = (postgres_store *)base;
	int64_t deadline = dlock_clock_ms() + be->request_timeout_ms;
	PGconn *c = NULL;
	int rc = dlock__pg_main_conn(be, deadline, &c);
	if (rc)
		return rc;
	dlock_lock_status *st = NULL;
	size_t cnt = 0;
	arr a = { 0 };
	PGresult *r = NULL;
	if ((rc = names_array(&a, names, nnames)))
		goto fail;
	for (size_t i = 0; i < nnames; i++) {
		dlock_lock_status *s = dlock_sys_status_add(&st, &cnt);
		if (!s || !(s->name = dlock_sys_strdup(names[i]))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		s->permits = 1;
	}
	const char *v[] = { be->ns, a.buf };
	rc = dlock__pg_run(&be->conn, deadline, "status",
			   "SELECT l.name, l.fence, h.owner, h.host, h.pid, h.mode, h.permits, h.fence,"
			   " floor(extract(epoch FROM (h.expires - clock_timestamp())) * 1000)::bigint,"
			   " (SELECT count(*) FROM dlock_waiters w WHERE w.ns = l.ns AND w.name = l.name"
			   "   AND w.expires > clock_timestamp())"
			   " FROM dlock_locks l LEFT JOIN dlock_holders h ON h.ns = l.ns AND h.name = l.name"
			   "  AND h.expires > clock_timestamp()"
			   " WHERE l.ns = $1 AND l.name = ANY($2::text[])"
			   " ORDER BY l.name, h.fence",
			   2, v, &r);
	if (rc)
		goto fail;
	for (int row = 0; row < PQntuples(r); row++) {
		const char *name = PQgetvalue(r, row, 0);
		int has_holder = !PQgetisnull(r, row, 2);
		long waiters = strtol(PQgetvalue(r, row, 9), NULL, 10);
		long i = find_status(st, cnt, name);
		if (i < 0)
			continue;
		dlock_lock_status *s = &st[i];
		s->last_fence = strtoull(PQgetvalue(r, row, 1), NULL, 10);
		s->waiters = (size_t)waiters;
		if (!has_holder)
			continue;
		dlock_holder *h = dlock_sys_status_add_holder(s);
		if (!h || !(h->owner = dupval(r, row, 2)) || !(h->host = dupval(r, row, 3))) {
			rc = DLOCK_ENOMEM;
			goto fail;
		}
		h->pid = atoi(PQgetvalue(r, row, 4));
		h->mode = atoi(PQgetvalue(r, row, 5)) ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
		unsigned p = (unsigned)strtoul(PQgetvalue(r, row, 6), NULL, 10);
		if (h->mode == DLOCK_EXCLUSIVE && p > 1)
			s->permits = p;
		h->fence = strtoull(PQgetvalue(r, row, 7), NULL, 10);
		h->ttl_left_ms = strtoll(PQgetvalue(r, row, 8), NULL, 10);
	}
	PQclear(r);
	free(a.buf);
	*out = st;
	*count = cnt;
	return 0;
fail:
	PQclear(r);
	free(a.buf);
	dlock_status_free(st, cnt);
	return rc;
}

/* mode=table: holds are rows (any connection may renew them). */
const dlock_backend_methods dlock__pg_table_methods = {
	DLOCK_BACKEND_METHODS_INIT(KIND),
	.acquire = tbl_acquire,
	.release = tbl_release,
	.renew = tbl_renew,
	.extend = tbl_extend,
	.watch = dlock__pg_watch,
	.unwatch = dlock__pg_unwatch,
	.cancel = tbl_cancel,
	.status = tbl_status,
	.list = tbl_list,
	.close = dlock__pg_close,
};
