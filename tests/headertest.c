/* Compiled alone with -pedantic -Werror: the public headers stand on their own. */
#include <dlock/dlock.h>
#include <dlock/sys/backend.h>
#include <dlock/sys/support.h>

int main(void)
{
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	return (int)o.version - DLOCK_LOCK_OPTIONS_VERSION;
}
