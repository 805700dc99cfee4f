/*
 * PostgreSQL over TLS, against the test server of tests/servers/postgres.sh
 * (ssl=on, a certificate for 127.0.0.1 from a CA made there with openssl;
 * pg_hba.conf rejects the role dlock_tls on plain connections).
 *
 *   postgres_tls      (URI from $DLOCK_TEST_URI_FILE; DIR/ca.pem, DIR/other-ca.pem)
 *
 * - sslmode=disable for dlock_tls is refused (EAUTH): the role proves which
 *   connections really used TLS;
 * - sslmode=require and verify-full with sslrootcert=ca.pem take and release
 *   a lock (and the server reports the session as ssl = true);
 * - verify-full against a CA that did not sign the server's certificate, or
 *   with a missing root file, fails to open and never echoes the password.
 */
#include "testutil/testutil.h"

#include <libpq-fe.h>

#include <string.h>

static char uri[2048], dir[2048];
static char hostport[128], db[64];

#define TLS_PW "tls-Pw-7731"

static int try_open(const char *query, int want)
{
	char u[8192];
	snprintf(u, sizeof u, "postgres://dlock_tls:%s@%s/%s?%s", TLS_PW, hostport, db, query);
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc != want)
		fprintf(stderr, "postgres_tls: open ...?%s\n", query);
	CHECK_RC(rc, want);
	if (rc != 0) {
		CHECK(s == NULL);
		CHECK(strstr(dlock_error_last()->message, TLS_PW) == NULL);
		printf("  ?%-70.70s -> %s: %s\n", query, dlock_error_name(rc), dlock_error_last()->message);
		return rc;
	}
	dlock_lock *l = NULL;
	CHECK_RC(dlock_lock_new(&l, s, "tls-test", NULL), 0);
	CHECK_RC(dlock_acquire(l, 0), 0);
	CHECK_RC(dlock_release(l), 0);
	dlock_lock_free(l);
	dlock_store_close(s);
	printf("  ?%-70.70s -> ok\n", query);
	return rc;
}

/* Run one SQL statement as the admin; returns the first value (static buffer) or NULL. */
static const char *admin(const char *conninfo_query, const char *sql)
{
	static char out[256];
	char ci[4096];
	snprintf(ci, sizeof ci, "%s%s", uri, conninfo_query);
	PGconn *c = PQconnectdb(ci);
	const char *ret = NULL;
	if (PQstatus(c) == CONNECTION_OK) {
		PGresult *r = PQexec(c, sql);
		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) {
			snprintf(out, sizeof out, "%s", PQgetvalue(r, 0, 0));
			ret = out;
		} else if (PQresultStatus(r) == PGRES_COMMAND_OK) {
			ret = "";
		} else {
			fprintf(stderr, "postgres_tls: %s: %s", sql, PQerrorMessage(c));
		}
		PQclear(r);
	} else {
		fprintf(stderr, "postgres_tls: admin connection: %s", PQerrorMessage(c));
	}
	PQfinish(c);
	return ret;
}

/* The role may own the store's tables (it created them on a fresh database): hand them back. */
static void drop_role(void)
{
	const char *n = admin("", "SELECT count(*)::text FROM pg_roles WHERE rolname = 'dlock_tls'");
	if (n && strcmp(n, "1") == 0)
		CHECK(admin("",
			    "REASSIGN OWNED BY dlock_tls TO CURRENT_USER; DROP OWNED BY dlock_tls; "
			    "DROP ROLE dlock_tls") != NULL);
}

int main(void)
{
	tu_uri_from_env(uri, sizeof uri, "postgres_tls");
	tu_server_dir(dir, sizeof dir);
	char user[64], pass[128];
	if (sscanf(uri, "postgres://%63[^:]:%127[^@]@%127[^/]/%63s", user, pass, hostport, db) != 4) {
		fprintf(stderr, "postgres_tls: unexpected URI\n");
		return 2;
	}

	/* The admin session itself: with the default sslmode (prefer) libpq uses TLS. */
	const char *ssl = admin("", "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
	CHECK(ssl && strcmp(ssl, "true") == 0);
	drop_role();
	CHECK(admin("", "CREATE ROLE dlock_tls LOGIN SUPERUSER PASSWORD '" TLS_PW "'") != NULL);

	char q[4096];
	try_open("sslmode=disable", DLOCK_EAUTH); /* pg_hba: hostnossl ... reject */
	try_open("sslmode=require", 0);
	snprintf(q, sizeof q, "sslmode=verify-full&sslrootcert=%s/ca.pem", dir);
	try_open(q, 0);
	snprintf(q, sizeof q, "sslmode=verify-ca&sslrootcert=%s/ca.pem&mode=advisory", dir);
	try_open(q, 0);
	/* Verification failures: the server's certificate is not from this CA. */
	snprintf(q, sizeof q, "sslmode=verify-full&sslrootcert=%s/other-ca.pem", dir);
	dlock_store *s = NULL;
	{
		char u[8192];
		snprintf(u, sizeof u, "postgres://dlock_tls:%s@%s/%s?%s", TLS_PW, hostport, db, q);
		int rc = dlock_store_open(&s, u);
		CHECK(rc != 0);
		CHECK(s == NULL);
		CHECK(strstr(dlock_error_last()->message, TLS_PW) == NULL);
		CHECK(strstr(dlock_error_last()->message, "certificate") != NULL);
		printf("  wrong CA -> %s: %s\n", dlock_error_name(rc), dlock_error_last()->message);
		snprintf(u, sizeof u,
			 "postgres://dlock_tls:%s@%s/%s?sslmode=verify-full&sslrootcert=%s/nonexistent.pem", TLS_PW,
			 hostport, db, dir);
		rc = dlock_store_open(&s, u);
		CHECK(rc != 0);
		CHECK(strstr(dlock_error_last()->message, TLS_PW) == NULL);
		printf("  missing CA file -> %s: %s\n", dlock_error_name(rc), dlock_error_last()->message);
	}
	drop_role();
	return tu_done("postgres_tls");
}
