/* faultproxy_uri.h — the hosts of a store URI, and the same URI with every
 * host:port replaced by a faultproxy route's local port.
 *
 * One copy shared by the test client of the proxy (tests/testutil/faultproxy.c)
 * and `dlock check` (src/tools/check.c), which runs the proxy built into the
 * CLI. Header-only (static inline) so that neither needs the other's library.
 *
 * A URI is scheme://[user[:pass]@]h1:p1[,h2:p2...][/path][?query]; every host
 * needs an explicit port. */
#ifndef DLOCK_FAULTPROXY_URI_H
#define DLOCK_FAULTPROXY_URI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULTPROXY_HOST_MAX 300 /* bytes of one host:port, with its NUL */

/* Split the authority of `uri` into at most `max` "host:port" strings in
 * targets[]; *hs and *he bound the host list in `uri` (after any userinfo),
 * for faultproxy_uri_rewrite. Returns the number of hosts, or -1 with a
 * message in err. */
static inline int faultproxy_uri_hosts(const char *uri, char (*targets)[FAULTPROXY_HOST_MAX], int max, const char **hs,
				       const char **he, char *err, size_t errlen)
{
	const char *a = strstr(uri, "://");
	if (!a) {
		snprintf(err, errlen, "'%s' is not scheme://host:port,...", uri);
		return -1;
	}
	a += 3;
	const char *end = a + strcspn(a, "/?#");
	for (const char *at = a; at < end; at++)
		if (*at == '@')
			a = at + 1;
	*hs = a;
	*he = end;
	int n = 0;
	while (a < end) {
		const char *comma = memchr(a, ',', (size_t)(end - a));
		const char *e = comma ? comma : end;
		const char *colon = NULL;
		for (const char *q = a; q < e; q++)
			if (*q == ':')
				colon = q;
		if (n == max || e - a >= FAULTPROXY_HOST_MAX || !colon || colon == a || colon + 1 == e) {
			snprintf(err, errlen, "host '%.*s' needs host:port (at most %d hosts)", (int)(e - a), a, max);
			return -1;
		}
		memcpy(targets[n], a, (size_t)(e - a));
		targets[n][e - a] = '\0';
		n++;
		a = comma ? comma + 1 : end;
	}
	if (n == 0) {
		snprintf(err, errlen, "no host in the URI (a file store has no connection to fault)");
		return -1;
	}
	return n;
}

/* A malloc'd copy of `uri` with its host list [hs, he) replaced by
 * 127.0.0.1:ports[0],...,127.0.0.1:ports[n-1]; NULL when out of memory.
 * A Redis Cluster URI (scheme ending in "+cluster") also gets
 * remap=host:port>127.0.0.1:port for every host: the nodes announce their own
 * addresses, which the client must reach through the proxy too. */
static inline char *faultproxy_uri_rewrite(const char *uri, const char *hs, const char *he, const int *ports, int n)
{
	const char *sep = strstr(uri, "://");
	int cluster = sep && sep - uri >= 8 && !strncmp(sep - 8, "+cluster", 8);
	size_t cap = strlen(uri) + (size_t)n * 24 + 1 + (cluster ? (size_t)(he - hs) + (size_t)n * 24 + 8 : 0);
	char *copy = malloc(cap);
	if (!copy)
		return NULL;
	size_t off = (size_t)(hs - uri);
	memcpy(copy, uri, off);
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(copy + off, cap - off, "%s127.0.0.1:%d", i ? "," : "", ports[i]);
	off += (size_t)snprintf(copy + off, cap - off, "%s", he);
	if (cluster) {
		off += (size_t)snprintf(copy + off, cap - off, "%sremap=", strchr(he, '?') ? "&" : "?");
		const char *a = hs;
		for (int i = 0; i < n && a < he; i++) {
			const char *comma = memchr(a, ',', (size_t)(he - a));
			const char *e = comma ? comma : he;
			off += (size_t)snprintf(copy + off, cap - off, "%s%.*s>127.0.0.1:%d", i ? "," : "",
						(int)(e - a), a, ports[i]);
			a = comma ? comma + 1 : he;
		}
	}
	return copy;
}

#endif
