/* libFuzzer: handles given to dlock_lock_attach (what `dlock release/extend` read). */
#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int nop_acquire(dlock_backend *be, dlock_request *r, uint64_t *f, int64_t *retry)
{
	return DLOCK_ELOCKED;
}
static int nop_release(dlock_backend *be, dlock_request *r)
{
	return DLOCK_ENOTHELD;
}
static int nop_extend(dlock_backend *be, dlock_request *r, int64_t ttl)
{
	return DLOCK_ENOTHELD;
}
static void nop_close(dlock_backend *be)
{
	free(be);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static dlock_store *store;
	if (!store) {
		dlock_backend *be = calloc(1, sizeof(*be));
		be->version = DLOCK_BACKEND_VERSION;
		be->kind = "nop";
		be->acquire = nop_acquire;
		be->release = nop_release;
		be->extend = nop_extend;
		be->close = nop_close;
		if (dlock_store_open_backend(&store, be, "nop://", 30000) != 0)
			abort();
	}
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	dlock_lock *l;
	if (dlock_lock_new(&l, store, "fuzz", NULL) == 0) {
		if (dlock_lock_attach(l, text) == 0) {
			/* The store refuses: the handle can never act on someone else's hold. */
			if (dlock_release(l) != DLOCK_ENOTHELD)
				abort();
		}
		dlock_lock_free(l);
	}
	free(text);
	return 0;
}
