/*
 * libFuzzer: ZooKeeper lock-name escaping and child-node names.
 *  - escape(name) uses only [A-Za-z0-9._-] and %XX, is never "." or "..",
 *    and unescape gives the name back;
 *  - unescape of any child name (another client's node) never crashes;
 *  - parse_child accepts exactly names ending in 10 digits, seq in range.
 */
#include "core/internal.h"
#include "stores/zookeeper/parse.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int plain(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
	       c == '.';
}

static int hex(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 65536)
		return 0;
	char *s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';

	char *e = dlock__zk_escape(s);
	if (!e)
		abort();
	if (strcmp(e, ".") == 0 || strcmp(e, "..") == 0)
		abort();
	for (const unsigned char *p = (const unsigned char *)e; *p; p++) {
		if (*p == '%') {
			if (!hex(p[1]) || !hex(p[2]))
				abort();
			p += 2;
		} else if (!plain(*p)) {
			abort();
		}
	}
	char *back = dlock__zk_unescape(e);
	if (!back || strcmp(back, s) != 0)
		abort();
	free(back);
	free(e);

	free(dlock__zk_unescape(s));

	child c;
	size_t n = strlen(s);
	int tail = n >= 10 && strspn(s + n - 10, "0123456789") == 10;
	if (dlock__zk_parse_child(s, &c) != (tail && n >= 11))
		abort();
	if (tail && n >= 11 && (c.name != s || c.seq < 0 || c.seq > 9999999999LL))
		abort();
	free(s);
	return 0;
}
