#include "testutil/testutil.h"

#include <string.h>

int main(void)
{
	char big[DLOCK_NAME_MAX + 2];
	memset(big, 'a', sizeof(big));
	big[DLOCK_NAME_MAX] = '\0';
	CHECK_RC(dlock_name_check(big), 0); /* exactly the limit */
	big[DLOCK_NAME_MAX] = 'a';
	big[DLOCK_NAME_MAX + 1] = '\0';
	CHECK_RC(dlock_name_check(big), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "513") != NULL);

	CHECK_RC(dlock_name_check("orders/42"), 0);
	CHECK_RC(dlock_name_check("naïve-名前-🔒"), 0);
	CHECK_RC(dlock_name_check("a b:c?d#e%f"), 0);
	CHECK_RC(dlock_name_check(""), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "empty") != NULL);
	CHECK_RC(dlock_name_check(NULL), DLOCK_EINVAL);
	CHECK_RC(dlock_name_check("tab\there"), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "control") != NULL);
	CHECK_RC(dlock_name_check("bad\xff"), DLOCK_EINVAL);
	CHECK(strstr(dlock_error_last()->message, "UTF-8") != NULL);
	CHECK_RC(dlock_name_check("\xc3"), DLOCK_EINVAL);          /* truncated sequence */
	CHECK_RC(dlock_name_check("\xc0\xaf"), DLOCK_EINVAL);      /* overlong '/' */
	CHECK_RC(dlock_name_check("\xed\xa0\x80"), DLOCK_EINVAL);  /* surrogate */
	CHECK_RC(dlock_name_check("\xf4\x90\x80\x80"), DLOCK_EINVAL); /* > U+10FFFF */
	return tu_done("unit.name");
}
