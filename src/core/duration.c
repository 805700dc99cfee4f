#include "core/internal.h"

#include <string.h>

int dlock_duration_parse(int64_t *ms, const char *text)
{
	const char *p = text;
	int64_t whole = 0, frac = 0, frac_scale = 1;
	int digits = 0;

	if (!text || !*text)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "empty duration");
	for (; *p >= '0' && *p <= '9'; p++, digits++) {
		if (whole > INT64_MAX / 10 - 10)
			return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "duration '%s' is too large", text);
		whole = whole * 10 + (*p - '0');
	}
	if (*p == '.') {
		p++;
		for (; *p >= '0' && *p <= '9'; p++, digits++) {
			if (frac_scale < 1000000000) {
				frac = frac * 10 + (*p - '0');
				frac_scale *= 10;
			}
		}
	}
	if (digits == 0)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "bad duration '%s': expected a number such as 250ms, 30s, 5m or 1h", text);
	int64_t unit;
	if (*p == '\0' || strcmp(p, "s") == 0)
		unit = 1000;
	else if (strcmp(p, "ms") == 0)
		unit = 1;
	else if (strcmp(p, "m") == 0)
		unit = 60 * 1000;
	else if (strcmp(p, "h") == 0)
		unit = 3600 * 1000;
	else
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL,
				       "bad duration '%s': unknown unit '%s' (use ms, s, m or h)", text, p);
	if (whole > INT64_MAX / unit / 2)
		return dlock_error_set(DLOCK_EINVAL, NULL, NULL, "duration '%s' is too large", text);
	*ms = whole * unit + frac * unit / frac_scale;
	return 0;
}
