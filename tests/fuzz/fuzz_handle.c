/* libFuzzer: handles given to dlock_lock_attach (what `dlock release/extend` read). */
#include <dlock/dlock.h>
#include <dlock/sys/backend.h>

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int nop_acquire(dlock_backend *be, const dlock_request *r, dlock_grant *out)
{
	return DLOCK_ELOCKED;
}
static int nop_release(dlock_backend *be, const dlock_request *r)
{
	return DLOCK_ENOTHELD;
}
static int nop_renew(dlock_backend *be, const dlock_request *const *r, size_t n, int *results)
{
	for (size_t i = 0; i < n; i++)
		results[i] = DLOCK_ENOTHELD;
	return 0;
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
		static const dlock_backend_methods nop_methods = {
			DLOCK_BACKEND_METHODS_INIT("nop"),
			.acquire = nop_acquire,
			.release = nop_release,
			.renew = nop_renew,
			.close = nop_close,
		};
		dlock_backend_init(be, &nop_methods);
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
