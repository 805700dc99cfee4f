/* libFuzzer: durations and lock names. */
#include <dlock/dlock.h>

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
	int64_t ms = -1;
	if (dlock_duration_parse(&ms, text) == 0 && ms < 0)
		abort(); /* a parsed duration is never negative */
	if (dlock_name_check(text) == 0 && (strlen(text) == 0 || strlen(text) > DLOCK_NAME_MAX))
		abort();
	free(text);
	return 0;
}
