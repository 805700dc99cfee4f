/* ZooKeeper store: node names — escaping lock names, parsing sequential
 * children (parse.h; tests/fuzz/fuzz_zookeeper.c). */
#include "zk.h"

/* ---------------------------------------------------------------- names */

bool dlock__zk_plain(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
	       c == '.';
}

/* One znode name component for s: reversible percent-encoding of everything
 * but [A-Za-z0-9._-]; "." and ".." (not valid znode names) become %2E... */
char *dlock__zk_escape(const char *s)
{
	size_t n = strlen(s);
	char *out = malloc(3 * n + 1);
	if (!out) {
		dlock_sys_oom();
		return NULL;
	}
	bool dots = strspn(s, ".") == n;
	char *o = out;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (dlock__zk_plain(*p) && !(dots && *p == '.')) {
			*o++ = (char)*p;
		} else {
			sprintf(o, "%%%02X", *p);
			o += 3;
		}
	}
	*o = '\0';
	return out;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* The lock name an escaped component stands for; NULL if it is not one of ours. */
char *dlock__zk_unescape(const char *s)
{
	char *out = malloc(strlen(s) + 1), *o = out;
	if (!out)
		return NULL;
	for (const char *p = s; *p; p++) {
		if (*p != '%') {
			*o++ = *p;
			continue;
		}
		int hi = hexval(p[1]), lo = hi < 0 ? -1 : hexval(p[2]);
		if (hi < 0 || lo < 0) {
			free(out);
			return NULL;
		}
		*o++ = (char)(hi * 16 + lo);
		p += 2;
	}
	*o = '\0';
	return out;
}

const char *dlock__zk_kind_word(node_kind k)
{
	return k == K_READ ? "read" : k == K_SEM ? "sem" : "lock";
}

/* Parse "<anything>-<kind>-<10 digits>"; a sequential node of another client
 * (Curator's "-lock-", kazoo's "__lock__") counts as exclusive. */
bool dlock__zk_parse_child(const char *name, child *c)
{
	size_t n = strlen(name);
	if (n < SEQ_DIGITS + 1)
		return false;
	const char *d = name + n - SEQ_DIGITS;
	int64_t seq = 0;
	for (int i = 0; i < SEQ_DIGITS; i++) {
		if (d[i] < '0' || d[i] > '9')
			return false;
		seq = seq * 10 + (d[i] - '0');
	}
	c->name = name;
	c->seq = seq;
	c->kind = K_LOCK;
	c->permits = 0;
	/* "-sem<N>-": a semaphore node that names its permits (the rule of the
	 * smallest limit needs every earlier holder's); "-sem-" is an older one */
	const char *w = d - 1;
	unsigned long p = 0, scale = 1;
	while (w > name && w[-1] >= '0' && w[-1] <= '9' && scale <= 100000000) {
		p += (unsigned long)(w[-1] - '0') * scale;
		scale *= 10;
		w--;
	}
	if (n >= SEQ_DIGITS + 6 && strncmp(d - 6, "-read-", 6) == 0)
		c->kind = K_READ;
	else if (n >= SEQ_DIGITS + 5 && strncmp(d - 5, "-sem-", 5) == 0)
		c->kind = K_SEM;
	else if (d[-1] == '-' && scale > 1 && w - name >= 4 && strncmp(w - 4, "-sem", 4) == 0) {
		c->kind = K_SEM;
		c->permits = p > 0 && p < 1000000 ? (unsigned)p : 1;
	} else if (n >= SEQ_DIGITS + 9 && strncmp(d - 9, "__rlock__", 9) == 0)
		c->kind = K_READ;
	else if (n >= SEQ_DIGITS + 8 && strncmp(d - 8, "__READ__", 8) == 0)
		c->kind = K_READ; /* Curator's InterProcessReadWriteLock ("__WRIT__": exclusive) */
	return true;
}

int dlock__zk_by_seq(const void *a, const void *b)
{
	const child *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

const char *dlock__zk_base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}
