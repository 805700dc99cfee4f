#include "core/internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = tolower(c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Percent-decode [s, s+n) into a new string; NULL with DLOCK_EINVAL or ENOMEM set. */
static char *decode(const char *s, size_t n, const char *what)
{
	char *out = dlock_sys_calloc(n + 1, 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%') {
			int h = i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1;
			int l = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
			if (h < 0 || l < 0 || (h == 0 && l == 0)) {
				free(out);
				dlock_error_set(DLOCK_EINVAL, NULL, NULL,
						"bad percent-escape in the %s of the store URI", what);
				return NULL;
			}
			*o++ = (char)(h * 16 + l);
			i += 2;
		} else {
			*o++ = s[i];
		}
	}
	return out;
}

/* [s, s+n) reads as a host list: host[:port] or [v6][:port] items, comma-separated. */
static bool hostlist_like(const char *s, size_t n)
{
	if (n == 0)
		return false;
	const char *e = s + n;
	while (s < e) {
		const char *item = s;
		if (*s == '[') {
			while (s < e && *s != ']' &&
			       (isalnum((unsigned char)*s) || *s == ':' || *s == '.' || *s == '%' || *s == '['))
				s++;
			if (s >= e || *s != ']' || s == item + 1)
				return false;
			s++;
		} else {
			while (s < e &&
			       (isalnum((unsigned char)*s) || *s == '.' || *s == '-' || *s == '_' || *s == '%'))
				s++;
			if (s == item)
				return false;
		}
		if (s < e && *s == ':') {
			const char *port = ++s;
			while (s < e && isdigit((unsigned char)*s))
				s++;
			if (s == port || s - port > 5)
				return false;
		}
		if (s < e && *s != ',')
			return false;
		if (s < e && ++s == e)
			return false; /* a trailing comma */
	}
	return true;
}

/*
 * Where the user info of an authority ends. `a` points just after "//".
 * RFC 3986 ends the authority at the first '/', '?' or '#', so a password
 * holding one (base64 secrets hold '/') would spill into the path or the
 * options, and errors about those echo them ("bad database number
 * 'r1tXY@host'"). Here the user info is split off first: it runs to the
 * last '@' that is followed by a host list (up to the next '/', '?', '#' or
 * the end), except
 *  - an empty authority ("sqlite:///dir@x/f.db") has no user info;
 *  - when the RFC authority is already a valid [user info@]host list, an
 *    '@' inside an option's value (after '?' and that option's '=':
 *    "?cacert=/home/a@b/ca.pem") belongs to the option.
 * An '@' in a path of a URI with no user info must be written %40.
 * Returns the '@' that ends the user info, or NULL; *end gets the end of the
 * authority (the host list's).
 */
static const char *split_authority(const char *a, const char **end)
{
	size_t alen = strcspn(a, "/?#");
	const char *rfc_at = NULL;
	for (const char *c = a; c < a + alen; c++)
		if (*c == '@')
			rfc_at = c;
	*end = a + alen;
	if (alen == 0)
		return NULL;
	const char *hosts = rfc_at ? rfc_at + 1 : a;
	bool clean = hostlist_like(hosts, (size_t)(a + alen - hosts));
	/* the query of the RFC reading: from the first '?' after the authority, before any '#' */
	const char *q = a + alen + strcspn(a + alen, "?#");
	if (*q != '?')
		q = NULL;
	const char *pick = NULL;
	for (const char *c = strchr(a, '@'); c; c = strchr(c + 1, '@')) {
		if (!hostlist_like(c + 1, strcspn(c + 1, "/?#")))
			continue;
		if (clean && q && c > q) {
			const char *seg = c;
			while (seg > q && *seg != '&')
				seg--;
			if (memchr(seg, '=', (size_t)(c - seg)))
				continue; /* in an option's value */
		}
		pick = c;
	}
	if (!pick)
		return rfc_at;
	*end = pick + 1 + strcspn(pick + 1, "/?#");
	return pick;
}

/* A parsed URI and, beside it, the option names its store asked for (by
 * dlock_uri_param), so that an unknown option can be answered with the
 * store's own list. */
typedef struct uri_impl {
	dlock_uri pub;
	char asked[480];
} uri_impl;

void dlock_sys_uri_free(dlock_uri *uri)
{
	if (!uri)
		return;
	free(uri->scheme);
	free(uri->user);
	dlock_sys_free_secret(uri->password);
	free(uri->hosts);
	free(uri->path);
	for (size_t i = 0; i < uri->nparams; i++) {
		free(uri->params[i].key);
		free(uri->params[i].value);
	}
	free(uri->params);
	free(uri);
}

static int parse_query(dlock_uri *uri, const char *q)
{
	while (*q) {
		size_t len = strcspn(q, "&");
		if (len > 0) {
			const char *eq = memchr(q, '=', len);
			size_t klen = eq ? (size_t)(eq - q) : len;
			if (klen == 0)
				return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
						       "store URI has an option without a name");
			dlock_uri_option *np = realloc(uri->params, (uri->nparams + 1) * sizeof(*np));
			if (!np)
				return dlock_sys_oom();
			uri->params = np;
			dlock_uri_option *p = &uri->params[uri->nparams];
			memset(p, 0, sizeof(*p));
			p->key = decode(q, klen, "options");
			if (!p->key)
				return dlock_error_last()->code;
			uri->nparams++;
			p->value = eq ? decode(eq + 1, len - klen - 1, "options") : dlock_sys_strdup("");
			if (!p->value)
				return dlock_error_last()->code;
			for (size_t i = 0; i + 1 < uri->nparams; i++)
				if (strcmp(uri->params[i].key, p->key) == 0)
					return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
							       "store URI gives option '%s' twice", p->key);
		}
		q += len;
		if (*q == '&')
			q++;
	}
	return 0;
}

static int common_options(dlock_uri *uri)
{
	const char *v;
	uri->ttl_ms = DLOCK__DEFAULT_TTL_MS;
	uri->connect_timeout_ms = DLOCK__DEFAULT_CONNECT_TIMEOUT_MS;
	uri->prefix = "dlock";
	if ((v = dlock_uri_param(uri, "ttl"))) {
		if (dlock_duration_parse(&uri->ttl_ms, v) != 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI option ttl: %s",
					       dlock_error_last()->message);
		if (uri->ttl_ms < 10 || uri->ttl_ms > DLOCK_TTL_MAX_MS)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
					       "store URI option ttl must be between 10ms and 366 days");
	}
	if ((v = dlock_uri_param(uri, "connect_timeout"))) {
		if (dlock_duration_parse(&uri->connect_timeout_ms, v) != 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI option connect_timeout: %s",
					       dlock_error_last()->message);
		if (uri->connect_timeout_ms <= 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
					       "store URI option connect_timeout must be positive");
	}
	uri->request_timeout_ms = uri->connect_timeout_ms < 2000 ? uri->connect_timeout_ms : 2000;
	if ((v = dlock_uri_param(uri, "timeout"))) {
		if (dlock_duration_parse(&uri->request_timeout_ms, v) != 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI option timeout: %s",
					       dlock_error_last()->message);
		if (uri->request_timeout_ms <= 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI option timeout must be positive");
	}
	if ((v = dlock_uri_param(uri, "prefix"))) {
		if (dlock_name_check(v) != 0 || strlen(v) > 64)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
					       "store URI option prefix must be 1-64 bytes of printable UTF-8");
		uri->prefix = v;
	}
	return 0;
}

int dlock_sys_uri_parse(dlock_uri **out, const char *text)
{
	*out = NULL;
	if (!text || !*text)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "empty store URI");
	const char *p = text;
	if (!isalpha((unsigned char)*p))
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "malformed store URI: it must start with a scheme such as sqlite: or redis://");
	while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.')
		p++;
	if (*p != ':')
		return dlock_error_set(
			DLOCK_EINVAL, NULL, NULL,
			"malformed store URI: no ':' after the scheme (expected e.g. redis://host:port)");
	uri_impl *impl = dlock_sys_calloc(1, sizeof(*impl));
	if (!impl)
		return DLOCK_ENOMEM;
	dlock_uri *uri = &impl->pub;
	int rc = DLOCK_ENOMEM;
	if (!(uri->scheme = dlock_sys_strndup(text, (size_t)(p - text))))
		goto fail;
	for (char *c = uri->scheme; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	p++;
	if (p[0] == '/' && p[1] == '/') {
		p += 2;
		const char *aend;
		const char *at = split_authority(p, &aend);
		size_t alen = (size_t)(aend - p);
		const char *hosts = p;
		if (at) {
			const char *colon = memchr(p, ':', (size_t)(at - p));
			size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
			if (!(uri->user = decode(p, ulen, "user name")))
				goto fail_err;
			if (colon && !(uri->password = decode(colon + 1, (size_t)(at - colon - 1), "password")))
				goto fail_err;
			hosts = at + 1;
		}
		if (!(uri->hosts = decode(hosts, (size_t)(p + alen - hosts), "host list")))
			goto fail_err;
		p += alen;
	}
	if (*p == '#') {
		rc = dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI must not have a #fragment");
		goto fail;
	}
	size_t plen = strcspn(p, "?#");
	if (!(uri->path = decode(p, plen, "path")))
		goto fail_err;
	p += plen;
	if (*p == '?') {
		const char *q = p + 1;
		size_t qlen = strcspn(q, "#");
		char *qs = dlock_sys_strndup(q, qlen);
		if (!qs)
			goto fail;
		rc = parse_query(uri, qs);
		free(qs);
		if (rc != 0)
			goto fail;
		p = q + qlen;
	}
	if (*p == '#') {
		rc = dlock_error_set(DLOCK_EINVAL, NULL, NULL, "store URI must not have a #fragment");
		goto fail;
	}
	if ((rc = common_options(uri)) != 0)
		goto fail;
	*out = uri;
	return 0;
fail_err:
	rc = dlock_error_last()->code;
fail:
	dlock_sys_uri_free(uri);
	return rc;
}

/* Note `key` in the list of options the store asked for (once). */
static void note_asked(dlock_uri *uri, const char *key)
{
	char *asked = ((uri_impl *)uri)->asked;
	size_t klen = strlen(key), len = strlen(asked);
	for (const char *a = asked; *a;) {
		const char *end = strchr(a, ',');
		size_t n = end ? (size_t)(end - a) : strlen(a);
		if (n == klen && memcmp(a, key, n) == 0)
			return;
		a += n + (end ? 1 : 0);
	}
	if (len + klen + 2 < sizeof(((uri_impl *)0)->asked))
		snprintf(asked + len, sizeof(((uri_impl *)0)->asked) - len, "%s%s", len ? "," : "", key);
}

const char *dlock_uri_param(dlock_uri *uri, const char *key)
{
	note_asked(uri, key);
	for (size_t i = 0; i < uri->nparams; i++) {
		if (strcmp(uri->params[i].key, key) == 0) {
			uri->params[i].used = 1;
			return uri->params[i].value;
		}
	}
	return NULL;
}

int dlock_sys_uri_check_unused(const dlock_uri *uri)
{
	for (size_t i = 0; i < uri->nparams; i++) {
		if (uri->params[i].used)
			continue;
		char list[600] = "";
		size_t n = 0;
		for (const char *a = ((const uri_impl *)uri)->asked; *a && n < sizeof(list) - 3; a++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, *a == ',' ? ", " : "%c", *a);
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "unknown option '%s' (%s: URIs take %s)",
				       uri->params[i].key, uri->scheme, list);
	}
	return 0;
}

char *dlock__uri_redact(const char *text)
{
	char *out = dlock_sys_strdup(text);
	if (!out)
		return NULL;
	char *sep = strstr(out, "://");
	if (sep) {
		char *a = sep + 3;
		const char *aend;
		const char *at = split_authority(a, &aend);
		char *colon = at ? memchr(a, ':', (size_t)(at - a)) : NULL;
		if (colon) {
			char *r = dlock_sys_sprintf("%.*s:***%s", (int)(colon - out), out, at);
			free(out);
			out = r;
			if (!out)
				return NULL;
		}
	}
	/* Secrets passed as options (password=, pass=, token=) are hidden too. */
	char *q = strchr(out, '?');
	while (q) {
		char *k = q + 1;
		if (strncmp(k, "password=", 9) == 0 || strncmp(k, "pass=", 5) == 0 || strncmp(k, "token=", 6) == 0) {
			char *v = strchr(k, '=') + 1;
			size_t off = (size_t)(v - out), vlen = strcspn(v, "&#");
			char *r = dlock_sys_sprintf("%.*s***%s", (int)off, out, v + vlen);
			free(out);
			out = r;
			if (!out)
				return NULL;
			q = strchr(out + off + 3, '&');
		} else {
			q = strchr(k, '&');
		}
	}
	return out;
}

int dlock_uri_hosts(const dlock_uri *uri, int default_port, dlock_hostport **out, size_t *count)
{
	*out = NULL;
	*count = 0;
	if (!uri->hosts || !*uri->hosts)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "%s: store URI names no host", uri->scheme);
	size_t n = 1;
	for (const char *c = uri->hosts; *c; c++)
		n += *c == ',';
	dlock_hostport *hp = dlock_sys_calloc(n, sizeof(*hp));
	if (!hp)
		return DLOCK_ENOMEM;
	const char *s = uri->hosts;
	for (size_t i = 0; i < n; i++) {
		size_t len = strcspn(s, ",");
		const char *host = s, *port = NULL;
		size_t hlen;
		if (*s == '[') {
			const char *close = memchr(s, ']', len);
			if (!close)
				goto bad;
			host = s + 1;
			hlen = (size_t)(close - host);
			if (close + 1 < s + len) {
				if (close[1] != ':')
					goto bad;
				port = close + 2;
			}
		} else {
			const char *colon = memchr(s, ':', len);
			hlen = colon ? (size_t)(colon - s) : len;
			if (colon)
				port = colon + 1;
		}
		if (hlen == 0 || hlen >= sizeof(hp[i].host))
			goto bad;
		memcpy(hp[i].host, host, hlen);
		hp[i].port = default_port;
		if (port) {
			long v = 0;
			const char *e = s + len;
			if (port == e)
				goto bad;
			for (const char *c = port; c < e; c++) {
				if (*c < '0' || *c > '9' || v > 65535)
					goto bad;
				v = v * 10 + (*c - '0');
			}
			if (v < 1 || v > 65535)
				goto bad;
			hp[i].port = (int)v;
		}
		if (hp[i].port <= 0)
			goto bad;
		s += len + (s[len] == ',');
	}
	*out = hp;
	*count = n;
	return 0;
bad:
	free(hp);
	return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
			       "%s: bad host list in store URI (expected host:port[,host:port...])", uri->scheme);
}

char *dlock_uri_redact(const char *uri)
{
	return uri ? dlock__uri_redact(uri) : NULL;
}
