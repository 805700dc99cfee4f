/*
 * PostgreSQL store (libpq): postgres://user:pass@host:port/db[?mode=table|advisory]
 *
 * mode=table (default): leases in tables, judged only by the server's clock
 * (clock_timestamp()); the client's clock never appears in SQL. Waiters are
 * woken by LISTEN/NOTIFY on one dedicated connection.
 * mode=advisory: pg_try_advisory_lock on a connection held for the lock's
 * life (req->slot), with idle_session_timeout as a server-side lease.
 * This file: open, close and the method tables. See docs/stores/postgres.md
 * for the failure model.
 */
#include "pg.h"

/* ------------------------------------------------------------ open/close */

void dlock__pg_close(dlock_backend *base)
{
	postgres_store *be = (postgres_store *)base;
	if (!be)
		return;
	dlock_backend_unwatch_all(base);
	if (be->lthread_on) {
		pthread_mutex_lock(&be->lmu);
		be->lstop = 1;
		pthread_mutex_unlock(&be->lmu);
		ssize_t w = write(be->wakefd[1], "x", 1);
		(void)w;
		pthread_join(be->lthread, NULL);
	}
	if (be->lconn)
		PQfinish(be->lconn);
	if (be->wakefd[0] >= 0)
		close(be->wakefd[0]);
	if (be->wakefd[1] >= 0)
		close(be->wakefd[1]);
	pthread_mutex_destroy(&be->lmu);
	while (be->intents) {
		intent *in = be->intents;
		be->intents = in->next;
		PQfinish(in->conn);
		free(in);
	}
	for (int i = 0; i < be->npool; i++)
		PQfinish(be->pool[i]);
	if (be->conn)
		PQfinish(be->conn);
	free(be->host);
	free(be->port);
	free(be->user);
	dlock_sys_free_secret(be->password);
	free(be->dbname);
	free(be->sslmode);
	free(be->sslrootcert);
	free(be->sslcert);
	free(be->sslkey);
	free(be->ns);
	free(be);
}

int dlock__postgres_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	const char *mode = dlock_uri_param(uri, "mode");
	const char *sslmode = dlock_uri_param(uri, "sslmode");
	static const char *const sslmodes[] = { "disable", "allow", "prefer", "require", "verify-ca", "verify-full" };
	int ssl_ok = !sslmode;
	for (size_t i = 0; !ssl_ok && i < sizeof sslmodes / sizeof sslmodes[0]; i++)
		ssl_ok = strcmp(sslmode, sslmodes[i]) == 0;
	if (!ssl_ok)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "postgres: unknown sslmode '%s' (disable, allow, prefer, require, "
				       "verify-ca or verify-full)",
				       sslmode);
	int advisory = 0;
	if (mode && strcmp(mode, "advisory") == 0)
		advisory = 1;
	else if (mode && strcmp(mode, "table") != 0)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "postgres: unknown mode '%s' (expected table or advisory)", mode);

	dlock_hostport *hp = NULL;
	size_t nh = 0;
	if (uri->hosts && *uri->hosts) {
		int rc = dlock_uri_hosts(uri, 5432, &hp, &nh);
		if (rc)
			return rc;
		if (nh != 1) {
			dlock_free(hp);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "postgres: give exactly one host:port");
		}
	}
	const char *db = uri->path && uri->path[0] == '/' ? uri->path + 1 : uri->path;
	if (!dlock_sys_host_is_local(hp ? hp[0].host : NULL) &&
	    (!sslmode || (strcmp(sslmode, "verify-ca") != 0 && strcmp(sslmode, "verify-full") != 0)))
		dlock_sys_open_warning(
			"postgres: sslmode=%s does not verify the server: on the way to %s a man in "
			"the middle could read the password and the lock traffic; use "
			"sslmode=verify-full&sslrootcert=CA.pem",
			sslmode ? sslmode : "prefer (the default)", hp[0].host);

	postgres_store *be = calloc(1, sizeof *be);
	if (!be) {
		dlock_free(hp);
		return dlock_sys_oom();
	}
	dlock_backend_init(&be->base, advisory ? &dlock__pg_advisory_methods : &dlock__pg_table_methods);
	be->advisory = advisory;
	be->wakefd[0] = be->wakefd[1] = -1;
	pthread_mutex_init(&be->lmu, NULL);
	int rc = 0;
	/* The whole open (connect, TLS, authentication, schema) is bounded by connect_timeout. */
	int64_t open_deadline = dlock_clock_ms() + uri->connect_timeout_ms;
	be->connect_timeout_ms = uri->connect_timeout_ms;
	be->request_timeout_ms = uri->request_timeout_ms;
	if (!rc && hp && !(be->host = dlock_sys_strdup(hp[0].host)))
		rc = DLOCK_ENOMEM;
	if (!rc && hp && !(be->port = dlock_sys_sprintf("%d", hp[0].port)))
		rc = DLOCK_ENOMEM;
	if (!rc)
		rc = dlock_sys_opt_dup(&be->user, uri->user);
	if (!rc)
		rc = dlock_sys_opt_dup(&be->password, uri->password);
	if (!rc && db && *db)
		rc = dlock_sys_opt_dup(&be->dbname, db);
	if (!rc)
		rc = dlock_sys_opt_dup(&be->sslmode, sslmode);
	if (!rc)
		rc = dlock_sys_opt_dup(&be->sslrootcert, dlock_uri_param(uri, "sslrootcert"));
	if (!rc)
		rc = dlock_sys_opt_dup(&be->sslcert, dlock_uri_param(uri, "sslcert"));
	if (!rc)
		rc = dlock_sys_opt_dup(&be->sslkey, dlock_uri_param(uri, "sslkey"));
	if (!rc)
		rc = dlock_sys_opt_dup(&be->ns, uri->prefix ? uri->prefix : "dlock");
	if (!rc) /* an unknown option is a usage error, before any connection */
		rc = dlock_sys_uri_check_unused(uri);
	dlock_free(hp);
	if (!rc && pipe2(be->wakefd, O_CLOEXEC) != 0)
		rc = dlock_error_set(DLOCK_ESTORE, KIND, NULL, "pipe: %s", strerror(errno));
	for (int i = 0; !rc && i < 2; i++)
		fcntl(be->wakefd[i], F_SETFL, fcntl(be->wakefd[i], F_GETFL) | O_NONBLOCK);
	if (!rc)
		rc = dlock__pg_ensure_schema(be, open_deadline);
	if (rc) {
		dlock__pg_close(&be->base);
		return rc;
	}
	/* Advisory: the first acquire takes the open's connection from the pool
	 * (no second connect inside a short wait); status connects when asked. */
	if (advisory && be->conn && PQtransactionStatus(be->conn) == PQTRANS_IDLE) {
		be->pool[be->npool++] = be->conn;
		be->conn = NULL;
	}
	*out = &be->base;
	return 0;
}
