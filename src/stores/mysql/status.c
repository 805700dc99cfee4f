/*
 * MySQL/MariaDB store: status and list, the same for both modes (the holder
 * rows; in mode=get_lock checked against the server's own locks).
 */
#include "my.h"

/* ================= both modes ================= */

static dlock_lock_status *status_find(dlock_lock_status *arr, size_t n, const char *name, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strlen(arr[i].name) == len && memcmp(arr[i].name, name, len) == 0)
			return &arr[i];
	return NULL;
}

static dlock_lock_status *status_get(dlock_lock_status **arr, size_t *n, const char *name, size_t len, int create)
{
	dlock_lock_status *st = status_find(*arr, *n, name, len);
	if (st || !create)
		return st;
	if (!(st = dlock_sys_status_add(arr, n)))
		return NULL;
	if (!(st->name = dlock_sys_strndup(name, len))) {
		(*n)--;
		return NULL;
	}
	return st;
}

int dlock__my_be_status(dlock_backend *be, const char *const *names, size_t nnames, dlock_lock_status **out,
			size_t *count)
{
	mysql_store *b = (mysql_store *)be;
	int64_t deadline = dlock_clock_ms() + b->request_timeout_ms;
	sbuf filter = { 0 };
	sb_add(&filter, " AND name IN (");
	for (size_t i = 0; i < nnames; i++) {
		sb_add(&filter, "%s", i ? "," : "");
		dlock__my_sb_hex(&filter, names[i]);
	}
	sb_add(&filter, ")");
	int rc = dlock__my_sb_check(&filter);
	if (rc)
		return rc;
	for (size_t i = 0; i < nnames; i++)
		if (!status_get(out, count, names[i], strlen(names[i]), 1)) {
			free(filter.p);
			return DLOCK_ENOMEM;
		}
	const char *f = filter.p;
	for (int step = 0; step < 3 && rc == 0; step++) {
		sbuf s = { 0 };
		if (step == 0) {
			sb_add(&s,
			       "SELECT name, owner, mode, permits, fence, "
			       "GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires) DIV 1000), host, pid "
			       "FROM dlock_holder WHERE ns = %s%s AND ",
			       b->ns_hex, f);
			if (b->mode == MODE_TABLE) {
				sb_add(&s, "conn_id = 0 AND expires > UTC_TIMESTAMP(6)");
			} else {
				/* A record counts only while its session really holds the GET_LOCK. */
				sb_add(&s, "conn_id <> 0 AND conn_id = IS_USED_LOCK(");
				dlock__my_sb_key(&s, b, "name");
				sb_add(&s, ")");
			}
			sb_add(&s, " ORDER BY name, fence");
		} else if (step == 1)
			sb_add(&s,
			       "SELECT name, COUNT(*) FROM dlock_waiter WHERE ns = %s%s AND expires > UTC_TIMESTAMP(6) "
			       "GROUP BY name",
			       b->ns_hex, f);
		else
			sb_add(&s, "SELECT name, fence FROM dlock_lock WHERE ns = %s%s", b->ns_hex, f);
		MYSQL_RES *res;
		rc = dlock__my_run(b, &s, &res, "status", 0, deadline);
		free(s.p);
		if (rc)
			break;
		MYSQL_ROW row;
		while (rc == 0 && res && (row = mysql_fetch_row(res)) != NULL) {
			unsigned long *len = mysql_fetch_lengths(res);
			/* Fences are reported only for names already listed (holders or waiters, or asked for). */
			dlock_lock_status *st = status_get(out, count, row[0], len[0], step < 2);
			if (!st) {
				rc = step < 2 ? DLOCK_ENOMEM : 0;
				continue;
			}
			if (step == 0) {
				dlock_holder *h = dlock_sys_status_add_holder(st);
				if (!h) {
					rc = DLOCK_ENOMEM;
					break;
				}
				h->owner = dlock_sys_strndup(row[1], len[1]);
				h->host = dlock_sys_strndup(row[6] ? row[6] : "", row[6] ? len[6] : 0);
				h->mode = dlock__my_row_i64(row, 2, 0) ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
				st->permits = (unsigned)dlock__my_row_i64(row, 3, 1);
				h->fence = dlock__my_row_u64(row, 4);
				h->ttl_left_ms = dlock__my_row_i64(row, 5, -1);
				h->pid = (int)dlock__my_row_i64(row, 7, 0);
				if (!h->owner || !h->host)
					rc = DLOCK_ENOMEM;
			} else if (step == 1) {
				st->waiters = (size_t)dlock__my_row_i64(row, 1, 0);
			} else {
				st->last_fence = dlock__my_row_u64(row, 1);
			}
		}
		mysql_free_result(res);
	}
	free(filter.p);
	return rc;
}

/* The names that have a holder or waiter record (the core then asks status
 * for them, which checks each one's liveness). */
int dlock__my_be_list(dlock_backend *be, char ***names, size_t *count)
{
	mysql_store *b = (mysql_store *)be;
	int64_t deadline = dlock_clock_ms() + b->request_timeout_ms;
	*names = NULL;
	*count = 0;
	sbuf s = { 0 };
	sb_add(&s, "SELECT name FROM dlock_holder WHERE ns = %s UNION SELECT name FROM dlock_waiter WHERE ns = %s",
	       b->ns_hex, b->ns_hex);
	int rc = dlock__my_sb_check(&s);
	MYSQL_RES *res = NULL;
	if (rc == 0)
		rc = dlock__my_run(b, &s, &res, "list", 0, deadline);
	free(s.p);
	if (rc)
		return rc;
	size_t n = res ? (size_t)mysql_num_rows(res) : 0;
	if (n && !(*names = dlock_sys_calloc(n, sizeof(char *))))
		rc = DLOCK_ENOMEM;
	MYSQL_ROW row;
	while (rc == 0 && res && *count < n && (row = mysql_fetch_row(res)) != NULL) {
		unsigned long *len = mysql_fetch_lengths(res);
		if (!((*names)[*count] = dlock_sys_strndup(row[0], len[0])))
			rc = DLOCK_ENOMEM;
		else
			(*count)++;
	}
	if (res)
		mysql_free_result(res);
	return rc;
}
