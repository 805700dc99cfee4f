#include "core/internal.h"

#include <string.h>

/* Length of the UTF-8 sequence at s (1-4), or 0 if it is not valid UTF-8. */
static size_t utf8_len(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		return (s[1] & 0xC0) == 0x80 ? 2 : 0;
	if (s[0] >= 0xE0 && s[0] <= 0xEF) {
		if ((s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
			return 0;
		if (s[0] == 0xE0 && s[1] < 0xA0)
			return 0; /* overlong */
		if (s[0] == 0xED && s[1] >= 0xA0)
			return 0; /* surrogate */
		return 3;
	}
	if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		if ((s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
			return 0;
		if (s[0] == 0xF0 && s[1] < 0x90)
			return 0;
		if (s[0] == 0xF4 && s[1] >= 0x90)
			return 0;
		return 4;
	}
	return 0;
}

int dlock_name_check(const char *name)
{
	if (!name || !*name)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "lock name is empty");
	size_t n = strlen(name);
	if (n > DLOCK_NAME_MAX)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "lock name is %zu bytes long; the limit is %d", n,
				       DLOCK_NAME_MAX);
	const unsigned char *s = (const unsigned char *)name;
	for (size_t i = 0; i < n;) {
		if (s[i] < 0x20 || s[i] == 0x7f)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
					       "lock name has a control character at byte %zu", i);
		size_t l = utf8_len(s + i);
		if (l == 0)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "lock name is not valid UTF-8 at byte %zu", i);
		i += l;
	}
	return 0;
}
