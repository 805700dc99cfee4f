/*
 * Redlock counts independent masters (issue 30 row 8): a URI that names one
 * server several times — the same host:port twice, or an alias of it
 * (localhost and 127.0.0.1) — is refused with DLOCK_EINVAL and a message
 * naming the duplicate, instead of making one server a "quorum of 3". The
 * fixture's five distinct masters still open and lock.
 *
 *   redlock_dup    (DLOCK_TEST_URI_FILE: the redlock fixture's URI)
 */
#include "testutil/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int port_of(const char *uri, int i, char *host, size_t hn)
{
	const char *p = strstr(uri, "://");
	p = p ? p + 3 : uri;
	for (; i > 0 && p; i--)
		if ((p = strchr(p, ',')) != NULL)
			p++;
	int port = 0;
	char h[256];
	if (!p || sscanf(p, "%255[^:]:%d", h, &port) != 2)
		return 0;
	snprintf(host, hn, "%s", h);
	return port;
}

/* Open u: 0 after one lock round trip, or the error (message printed). */
static int try_open(const char *u)
{
	dlock_store *s = NULL;
	int rc = dlock_store_open(&s, u);
	if (rc == 0) {
		dlock_lock *l = NULL;
		CHECK_RC(dlock_lock_new(&l, s, "redlock-dup", NULL), 0);
		CHECK_RC(dlock_acquire(l, 0), 0);
		CHECK_RC(dlock_release(l), 0);
		dlock_lock_free(l);
		dlock_store_close(s);
		printf("  %-70s -> opened\n", u);
	} else {
		CHECK(s == NULL);
		printf("  %-70s -> %s: %s\n", u, dlock_error_name(rc), dlock_error_last()->message);
	}
	return rc;
}

int main(void)
{
	char uri[4096], host[256], u[4400];
	tu_uri_from_env(uri, sizeof uri, "redlock_dup");
	int p0 = port_of(uri, 0, host, sizeof host), p1 = port_of(uri, 1, host, sizeof host);
	if (!p0 || !p1 || strcmp(host, "127.0.0.1") != 0) {
		fprintf(stderr, "cannot read two 127.0.0.1 masters from %s\n", uri);
		return 1;
	}
	/* the fixture's distinct masters work */
	CHECK_RC(try_open(uri), 0);

	/* the same host:port three times */
	snprintf(u, sizeof u, "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", p0, p0, p0);
	CHECK_RC(try_open(u), DLOCK_EINVAL);
	char want[64];
	snprintf(want, sizeof want, "127.0.0.1:%d", p0);
	CHECK(strstr(dlock_error_last()->message, want) != NULL);
	CHECK(strstr(dlock_error_last()->message, "same server") != NULL);

	/* one duplicate among otherwise distinct masters is still a duplicate */
	snprintf(u, sizeof u, "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", p0, p1, p0);
	CHECK_RC(try_open(u), DLOCK_EINVAL);

	/* an alias: localhost resolves to 127.0.0.1 */
	snprintf(u, sizeof u, "redlock://127.0.0.1:%d,localhost:%d,127.0.0.1:%d", p0, p0, p1);
	CHECK_RC(try_open(u), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "localhost") != NULL);

	/* same address, other ports: other servers */
	int p2 = port_of(uri, 2, host, sizeof host);
	snprintf(u, sizeof u, "redlock://127.0.0.1:%d,localhost:%d,127.0.0.1:%d", p0, p1, p2);
	CHECK_RC(try_open(u), 0);
	return tu_done("redlock_dup");
}
