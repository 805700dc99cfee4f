/*
 * dlock/version.h — version of the library.
 */
#ifndef DLOCK_VERSION_H
#define DLOCK_VERSION_H

#include <dlock/common.h>

#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_STRING "0.1.0"
/** One number that grows with every release: major*10000 + minor*100 + patch. */
#define DLOCK_VERSION_NUMBER \
	(DLOCK_VERSION_MAJOR * 10000 + DLOCK_VERSION_MINOR * 100 + DLOCK_VERSION_PATCH)

DLOCK_BEGIN_DECLS

/** The version of the library linked at run time, e.g. "0.1.0". Thread-safe. */
DLOCK_EXTERN const char *dlock_version(void);

DLOCK_END_DECLS

#endif
