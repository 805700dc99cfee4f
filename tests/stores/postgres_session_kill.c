/*
 * PostgreSQL mode=advisory: a session the server ends while its holder runs
 * (pg_terminate_backend) frees the key at once, so the holder must hear of
 * it at once too, not at its next renewal (nu_session_kill has the bound).
 *
 *   postgres_session_kill      (URI from $DLOCK_TEST_URI_FILE)
 *
 * The server's part of the bound is the kill itself, until the backend is
 * gone.
 */
#include "testutil/netutil.h"
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char base_uri[2048], adv_uri[2100];
static PGconn *admin;

static void ping(void)
{
	PQclear(PQexec(admin, "SELECT 1"));
}

static void kill_session(dlock_lock *l, const char *name, long long *t0)
{
	(void)name;
	/* The hold's session names itself "dlock <pid> <fence> ...". PostgreSQL
	 * 14+: wait (up to 5 s) until the backend is gone, so that the kill's
	 * time covers the server's part and the bound only ours. */
	char sql[512];
	snprintf(sql, sizeof sql,
		 "SELECT pg_terminate_backend(pid%s) FROM pg_stat_activity"
		 " WHERE application_name LIKE 'dlock %d %llu %%'",
		 PQserverVersion(admin) >= 140000 ? ", 5000" : "", (int)getpid(), (unsigned long long)dlock_fence(l));
	*t0 = tu_now_ms();
	PGresult *r = PQexec(admin, sql);
	CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0);
	PQclear(r);
}

int main(void)
{
	tu_uri_from_env(base_uri, sizeof base_uri, "postgres_session_kill");
	snprintf(adv_uri, sizeof adv_uri, "%s?mode=advisory", base_uri);
	admin = PQconnectdb(base_uri);
	if (PQstatus(admin) != CONNECTION_OK) {
		fprintf(stderr, "admin connection: %s\n", PQerrorMessage(admin));
		return 1;
	}
	PQclear(PQexec(admin, "SET application_name = 'dlock-test-admin'"));
	const nu_session_killer k = { adv_uri, "pgkill", "kill", ping, kill_session };
	nu_session_kill(&k, 1);
	nu_session_kill(&k, 3);
	PQfinish(admin);
	return tu_done("postgres_session_kill");
}
