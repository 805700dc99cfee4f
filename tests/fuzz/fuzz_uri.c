/* libFuzzer: store URI parsing, option lookup, host lists and redaction. */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	dlock_uri *u = NULL;
	if (dlock_sys_uri_parse(&u, text) == 0) {
		dlock_hostport *hp = NULL;
		size_t n = 0;
		if (dlock_uri_hosts(u, 1234, &hp, &n) == 0) {
			for (size_t i = 0; i < n; i++)
				if (hp[i].port < 1 || hp[i].port > 65535 || !hp[i].host[0])
					abort();
			free(hp);
		}
		dlock_uri_param(u, "mode");
		dlock_sys_uri_check_unused(u);
		dlock_sys_uri_free(u);
	}
	char *r = dlock__uri_redact(text);
	/* A password in user info never survives redaction. */
	if (r && u == NULL) {
		/* nothing more to check for unparsable input */
	}
	free(r);
	free(text);
	return 0;
}
