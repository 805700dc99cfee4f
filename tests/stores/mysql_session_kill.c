/*
 * MySQL/MariaDB mode=get_lock: a session the server ends while its holder
 * runs (KILL) frees its GET_LOCK at once, so the holder must hear of it at
 * once too, not at its next renewal (nu_session_kill has the bound).
 *
 *   mysql_session_kill      (URI from $DLOCK_TEST_URI_FILE; KILL as root
 *                            over the server's socket in the same directory)
 *
 * The server's part of the bound is the time until it shows the lock free.
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <mysql.h>

#include <stdio.h>
#include <stdlib.h>

static char uri[2048], dir[1024], gl_uri[2100];
static MYSQL *admin;

/* First column of the first row as an integer; -1 for NULL or no row; -2 on error. */
static long long q1(const char *sql)
{
	if (mysql_query(admin, sql) != 0) {
		fprintf(stderr, "admin query failed: %s: %s\n", sql, mysql_error(admin));
		return -2;
	}
	MYSQL_RES *r = mysql_store_result(admin);
	MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
	long long v = row && row[0] ? atoll(row[0]) : -1;
	mysql_free_result(r);
	return v;
}

static void ping(void)
{
	q1("SELECT 1");
}

static void kill_session(dlock_lock *l, const char *name, long long *t0)
{
	(void)l;
	char used[256], sql[256];
	snprintf(used, sizeof used, "SELECT IS_USED_LOCK('dlock_test/dlock/%s')", name);
	long long id = q1(used);
	CHECK(id > 0);
	snprintf(sql, sizeof sql, "KILL %lld", id);
	*t0 = tu_now_ms();
	CHECK(q1(sql) == -1);
	/* KILL only asks the session to end: until the server shows the lock free. */
	while (q1(used) > 0 && tu_now_ms() - *t0 < 5000)
		;
}

int main(void)
{
	tu_uri_from_env(uri, sizeof uri, "mysql_session_kill");
	tu_server_dir(dir, sizeof dir);
	snprintf(gl_uri, sizeof gl_uri, "%s?mode=get_lock", uri);
	char sock[1100];
	snprintf(sock, sizeof sock, "%s/sock", dir);
	admin = mysql_init(NULL);
	if (!mysql_real_connect(admin, NULL, "root", NULL, "dlock_test", 0, sock, 0)) {
		fprintf(stderr, "admin connect: %s\n", mysql_error(admin));
		return 1;
	}
	const nu_session_killer k = { gl_uri, "mykill", "free", ping, kill_session };
	nu_session_kill(&k, 1);
	nu_session_kill(&k, 3);
	mysql_close(admin);
	return tu_done("mysql_session_kill");
}
