/*
 * The MySQL / MariaDB store (libmariadb).
 *
 *   mysql://user:pass@host:port/db[?mode=table|get_lock][&socket=PATH][&ssl=...]
 *
 * mode=table (default, table.c): leases in InnoDB tables, judged only by the
 * server's clock. mode=get_lock (get_lock.c): GET_LOCK on a connection of its
 * own per hold. This file: options, open and close.
 *
 * docs/stores/mysql.md has the guarantees and the failure model.
 */
#include "my.h"

/* ================= open / close ================= */

void dlock__my_be_close(dlock_backend *be)
{
	mysql_store *b = (mysql_store *)be;
	if (!b)
		return;
	dlock_backend_unwatch_all(be);
	while (b->holds)
		dlock__my_hold_free(b, b->holds, 0);
	for (size_t i = 0; i < b->nwait_pool; i++)
		mysql_close(b->wait_pool[i]);
	pthread_mutex_destroy(&b->wait_mu);
	for (size_t i = 0; i < b->npool; i++)
		mysql_close(b->pool[i]);
	dlock__my_conn_drop(&b->conn);
	free(b->host);
	free(b->user);
	dlock_sys_free_secret(b->password);
	free(b->db);
	free(b->socket);
	free(b->ssl_ca);
	free(b->ssl_capath);
	free(b->ssl_cert);
	free(b->ssl_key);
	free(b->ns_hex);
	free(b);
}

static int opt_dup(char **dst, const char *v)
{
	if (!v)
		return 0;
	if (!*v)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: an ssl_* option needs a file name");
	return dlock_sys_opt_dup(dst, v);
}

static int parse(mysql_store *b, dlock_uri *uri)
{
	const char *v = dlock_uri_param(uri, "mode");
	if (!v || strcmp(v, "table") == 0)
		b->mode = MODE_TABLE;
	else if (strcmp(v, "get_lock") == 0)
		b->mode = MODE_GET_LOCK;
	else
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: unknown mode '%s' (table or get_lock)", v);

	const char *path = uri->path ? uri->path : "";
	if (*path == '/')
		path++;
	if (!*path || strchr(path, '/'))
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
				       "mysql URI needs one database name: mysql://user:pass@host:port/DATABASE");
	if (strlen(path) > 64)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: database name longer than 64 characters");
	if (!(b->db = dlock_sys_strdup(path)))
		return DLOCK_ENOMEM;

	const char *sock = dlock_uri_param(uri, "socket");
	if (sock && !(b->socket = dlock_sys_strdup(sock)))
		return DLOCK_ENOMEM;
	if (!uri->hosts || !*uri->hosts) {
		if (!b->socket)
			return dlock_error_set(
				DLOCK_EINVAL, KIND, NULL,
				"mysql URI needs a host (mysql://user:pass@host:port/db) or ?socket=PATH");
		b->host = dlock_sys_strdup("localhost");
		b->port = 0;
	} else {
		dlock_hostport *hp = NULL;
		size_t nh = 0;
		int rc = dlock_uri_hosts(uri, 3306, &hp, &nh);
		if (rc)
			return rc;
		if (nh != 1) {
			dlock_free(hp);
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql URI takes exactly one host, got %zu",
					       nh);
		}
		b->host = dlock_sys_strdup(hp[0].host);
		b->port = hp[0].port;
		dlock_free(hp);
	}
	if (!b->host)
		return DLOCK_ENOMEM;
	if (uri->user && !(b->user = dlock_sys_strdup(uri->user)))
		return DLOCK_ENOMEM;
	if (uri->password && !(b->password = dlock_sys_strdup(uri->password)))
		return DLOCK_ENOMEM;

	int64_t t = uri->connect_timeout_ms;
	b->connect_timeout_ms = t;
	b->timeout_s = (unsigned)((t + 999) / 1000);
	b->request_timeout_ms = uri->request_timeout_ms;
	/* Whole seconds (the variable is an integer), under the request bound
	 * where it can be: the server's "lock wait timeout" then comes first. */
	b->lock_wait_s = b->request_timeout_ms <= 2000 ? 1 : (unsigned)((b->request_timeout_ms - 1) / 1000);

	int rc;
	if ((rc = opt_dup(&b->ssl_ca, dlock_uri_param(uri, "ssl_ca"))) ||
	    (rc = opt_dup(&b->ssl_capath, dlock_uri_param(uri, "ssl_capath"))) ||
	    (rc = opt_dup(&b->ssl_cert, dlock_uri_param(uri, "ssl_cert"))) ||
	    (rc = opt_dup(&b->ssl_key, dlock_uri_param(uri, "ssl_key"))))
		return rc;
	const char *ssl = dlock_uri_param(uri, "ssl");
	int any_file = b->ssl_ca || b->ssl_capath || b->ssl_cert || b->ssl_key;
	if (!ssl) {
		b->ssl_enforce = any_file;
		b->ssl_verify = b->ssl_ca || b->ssl_capath;
	} else if (strcmp(ssl, "off") == 0 || strcmp(ssl, "0") == 0 || strcmp(ssl, "false") == 0) {
		if (any_file)
			return dlock_error_set(DLOCK_EINVAL, KIND, NULL,
					       "mysql: ssl=off contradicts the ssl_* options");
	} else if (strcmp(ssl, "required") == 0 || strcmp(ssl, "on") == 0 || strcmp(ssl, "1") == 0 ||
		   strcmp(ssl, "true") == 0) {
		b->ssl_enforce = 1;
		b->ssl_verify = b->ssl_ca || b->ssl_capath;
	} else if (strcmp(ssl, "verify") == 0) {
		b->ssl_enforce = 1;
		b->ssl_verify = 1;
	} else {
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: ssl=%s: expected off, required or verify",
				       ssl);
	}

	if (!b->ssl_verify && !b->socket && !dlock_sys_host_is_local(b->host))
		dlock_sys_open_warning(
			"mysql: %s: on the way to %s a man in the middle could read the password and "
			"the lock traffic; use ssl=verify&ssl_ca=CA.pem",
			b->ssl_enforce ? "ssl=required encrypts but does not verify the server"
				       : "no TLS (the default)",
			b->host);
	const char *prefix = uri->prefix ? uri->prefix : "dlock";
	if (strlen(prefix) > 255)
		return dlock_error_set(DLOCK_EINVAL, KIND, NULL, "mysql: prefix longer than 255 bytes");
	sbuf s = { 0 };
	dlock__my_sb_hex(&s, prefix);
	if ((rc = dlock__my_sb_check(&s)) != 0)
		return rc;
	b->ns_hex = s.p;
	return 0;
}

int dlock__mysql_open(dlock_backend **out, dlock_uri *uri)
{
	*out = NULL;
	mysql_store *b = dlock_sys_calloc(1, sizeof(*b));
	if (!b)
		return DLOCK_ENOMEM;
	pthread_mutex_init(&b->wait_mu, NULL);
	int rc = parse(b, uri);
	if (rc == 0) /* an unknown option is a usage error, before any connection */
		rc = dlock_sys_uri_check_unused(uri);
	int64_t deadline = dlock_clock_ms() + b->connect_timeout_ms;
	if (rc == 0) {
		dlock_backend_init(&b->base,
				   b->mode == MODE_TABLE ? &dlock__my_table_methods : &dlock__my_get_lock_methods);
		rc = dlock__my_conn_open(b, &b->conn, deadline);
	}
	/* Both modes need the counter table (get_lock takes its fences there). */
	if (rc == 0)
		rc = dlock__my_schema_ensure(b, deadline);
	if (rc == 0 && b->mode == MODE_GET_LOCK && strstr(mysql_get_server_info(b->conn), "MariaDB"))
		b->base.methods = &dlock__my_get_lock_wait_methods;
	if (rc) {
		dlock__my_be_close(&b->base);
		return rc;
	}
	*out = &b->base;
	return 0;
}
