/*
 * module.c — the entry of a store built as a module of its own
 * (LIBDIR/dlock/store-<kind>.so; CMake compiles this file once per module,
 * with DLOCK_MODULE_SCHEMES naming its list in schemes.h). The core loads
 * the module on the first use of one of its schemes and calls
 * dlock_store_module_init (declared in <dlock/sys/backend.h>), which
 * registers each scheme with dlock_backend_register: the same public call
 * an application's own store uses (examples/store/memstore.c).
 */
#include "schemes.h"
#include "support.h"

#define DLOCK__MODULE_REGISTER(scheme, open)                                                       \
	if (dlock_backend_register(scheme, open) != 0)                                              \
		return -1;

int dlock_store_module_init(void)
{
	DLOCK_MODULE_SCHEMES(DLOCK__MODULE_REGISTER)
	return 0;
}
