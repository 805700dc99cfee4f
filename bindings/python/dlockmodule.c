/*
 * dlockmodule.c — the `dlock` Python module: libdlock's public API as
 * Store and Lock objects (docs/python.md).
 *
 * Every call that may block (open, acquire, release, extend, status, break,
 * close, a lock handle's free) runs with the GIL released. A Store or Lock
 * object is in use while such a call runs: a second call on the same Lock
 * from another thread gets BusyError rather than sharing a handle that
 * libdlock gives to one thread at a time, and close() of a store with a call
 * under way gets BusyError too.
 *
 * The lost-lock callback runs on a runner thread of libdlock. Its payload is
 * not a pointer but the Lock object's serial number, looked up with the GIL
 * held in the list of live Lock objects: a Lock freed while its callback was
 * on its way is simply not found, and a serial is never reused.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <dlock/dlock.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct lock_object lock_object;

typedef struct store_object {
	PyObject ob_base; /* PyObject_HEAD */
	dlock_store *store;
	int calls;    /* calls of this store or its locks under way without the GIL
			 (a lock handle's free included) */
	int closing;  /* close() is freeing the handles: no call starts */
	struct store_object *prev, *next;
} store_object;

struct lock_object {
	PyObject ob_base; /* PyObject_HEAD */
	dlock_lock *lock;
	store_object *store; /* strong reference */
	PyObject *lost;      /* a threading.Event */
	PyObject *on_lost;   /* callable or NULL */
	PyObject *weakrefs;
	int64_t wait_ms;     /* what `with` waits: < 0 forever */
	uint64_t serial;
	int busy;
	lock_object *prev, *next;
};

static PyTypeObject store_type;
static PyTypeObject lock_type;

/* Both lists change only with the GIL held. */
static store_object *stores;
static lock_object *locks;
static uint64_t next_serial = 1;
/* 0 once the interpreter runs its exit handlers: a late lost signal then
 * leaves Python alone. */
static atomic_int python_alive = 1;

static PyObject *event_class; /* threading.Event */
static PyObject *error_base;

static const struct {
	int code;
	const char *name; /* dlock.<name> */
	const char *doc;
	PyObject **builtin; /* a second base, or NULL */
	PyObject *cls;
} errors[] = {
	{ DLOCK_EINVAL, "InvalidError", "bad argument: URI, name, duration, option, handle (DLOCK_EINVAL)",
	  &PyExc_ValueError, NULL },
	{ DLOCK_ENOMEM, "NoMemoryError", "out of memory (DLOCK_ENOMEM)", &PyExc_MemoryError, NULL },
	{ DLOCK_ETIMEOUT, "TimeoutError", "not acquired within the wait (DLOCK_ETIMEOUT)", &PyExc_TimeoutError, NULL },
	{ DLOCK_ELOCKED, "LockedError", "a try-once found the lock held (DLOCK_ELOCKED)", NULL, NULL },
	{ DLOCK_ENOTHELD, "NotHeldError", "release or extend of a lock this handle does not hold (DLOCK_ENOTHELD)",
	  NULL, NULL },
	{ DLOCK_ELOST, "LostError", "the lock was held but its lease ended (DLOCK_ELOST)", NULL, NULL },
	{ DLOCK_EUNAVAILABLE, "UnavailableError", "store unreachable, or no answer in time (DLOCK_EUNAVAILABLE)",
	  &PyExc_ConnectionError, NULL },
	{ DLOCK_EAUTH, "AuthError", "authentication or permission failure (DLOCK_EAUTH)", &PyExc_PermissionError,
	  NULL },
	{ DLOCK_ENOTSUPPORTED, "NotSupportedError", "the store or this build cannot do this (DLOCK_ENOTSUPPORTED)",
	  NULL, NULL },
	{ DLOCK_ESTORE, "StoreError", "the store answered with an unexpected error (DLOCK_ESTORE)", NULL, NULL },
	{ DLOCK_EBUSY, "BusyError", "the handle is in use by another thread (DLOCK_EBUSY)", NULL, NULL },
};
#define NERRORS (sizeof(errors) / sizeof(errors[0]))
static PyObject *error_classes[NERRORS];

static PyObject *error_class(int code)
{
	for (size_t i = 0; i < NERRORS; i++)
		if (errors[i].code == code)
			return error_classes[i];
	return error_base;
}

/* Raise the exception of `code` with `message` and the store's details. */
static PyObject *raise_error(int code, const char *message, const char *store, const char *store_code)
{
	PyObject *exc = PyObject_CallFunction(error_class(code), "s", message);
	if (!exc)
		return NULL;
	PyObject *c = PyLong_FromLong(code), *st = PyUnicode_FromString(store);
	PyObject *sc = PyUnicode_FromString(store_code);
	int bad = !c || !st || !sc || PyObject_SetAttrString(exc, "code", c) < 0 ||
		  PyObject_SetAttrString(exc, "store", st) < 0 || PyObject_SetAttrString(exc, "store_code", sc) < 0;
	Py_XDECREF(c);
	Py_XDECREF(st);
	Py_XDECREF(sc);
	if (!bad)
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
	Py_DECREF(exc);
	return NULL;
}

/* Raise what the calling thread's last libdlock error says of `code`. */
static PyObject *raise_last(int code)
{
	const dlock_error *e = dlock_error_last();
	const char *msg = e->code == code && e->message[0] ? e->message : dlock_strerror(code);
	return raise_error(code, msg, e->code == code ? e->store : "", e->code == code ? e->store_code : "");
}

/* Seconds (int or float; None or negative: forever) to milliseconds, rounded
 * up so that a small positive wait is not a try-once. */
static int seconds_to_ms(PyObject *o, int64_t *ms, int none_is_forever, const char *what)
{
	if (o == NULL || o == Py_None) {
		*ms = none_is_forever ? -1 : 0;
		return 0;
	}
	double s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (isnan(s)) {
		PyErr_Format(PyExc_ValueError, "%s: not a number", what);
		return -1;
	}
	if (s < 0) {
		*ms = -1;
		return 0;
	}
	double m = ceil(s * 1000.0);
	*ms = m > (double)DLOCK_TTL_MAX_MS ? DLOCK_TTL_MAX_MS + 1 : (int64_t)m;
	return 0;
}

static int ttl_to_ms(PyObject *o, int64_t *ms)
{
	if (o == NULL || o == Py_None) {
		*ms = 0;
		return 0;
	}
	double s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (!(s > 0) || s * 1000.0 > (double)DLOCK_TTL_MAX_MS) {
		raise_error(DLOCK_EINVAL, "ttl must be more than 0 and at most 366 days (in seconds)", "", "");
		return -1;
	}
	*ms = (int64_t)ceil(s * 1000.0);
	return 0;
}

/* --- Lock ------------------------------------------------------------------ */

static lock_object *lock_by_serial(uint64_t serial)
{
	for (lock_object *l = locks; l; l = l->next)
		if (l->serial == serial)
			return l;
	return NULL;
}

static void lost_signal(dlock_lock *handle, void *payload)
{
	if (!atomic_load(&python_alive) || !Py_IsInitialized())
		return;
	PyGILState_STATE g = PyGILState_Ensure();
	lock_object *l = lock_by_serial((uint64_t)(uintptr_t)payload);
	/* A signal that waited for the GIL while the Lock acquired again is the
	 * old hold's: the new one (held now) is not lost. */
	if (l && atomic_load(&python_alive) && !dlock_held(handle)) {
		Py_INCREF(l);
		PyObject *r = PyObject_CallMethod(l->lost, "set", NULL);
		if (!r)
			PyErr_WriteUnraisable(l->lost);
		Py_XDECREF(r);
		if (l->on_lost) {
			PyObject *cb = l->on_lost;
			Py_INCREF(cb);
			r = PyObject_CallOneArg(cb, (PyObject *)l);
			if (!r)
				PyErr_WriteUnraisable(cb);
			Py_XDECREF(r);
			Py_DECREF(cb);
		}
		Py_DECREF(l);
	}
	PyGILState_Release(g);
}

/* Take the lock object for one call without the GIL; NULL with an exception
 * when it cannot be. */
static dlock_lock *lock_enter(lock_object *self)
{
	if (!self->lock || self->store->closing)
		return (dlock_lock *)raise_error(DLOCK_EINVAL, "the lock's store is closed", "", "");
	if (self->busy)
		return (dlock_lock *)raise_error(DLOCK_EBUSY,
						 "another thread is inside a call on this Lock object (use one Lock "
						 "object per thread)",
						 "", "");
	self->busy = 1;
	self->store->calls++;
	return self->lock;
}

static void lock_leave(lock_object *self)
{
	self->busy = 0;
	self->store->calls--;
}

/* Free the handle without the GIL; the store's close waits for it (calls). */
static void lock_free_handle(lock_object *self)
{
	dlock_lock *h = self->lock;
	self->lock = NULL;
	if (h) {
		store_object *st = self->store;
		st->calls++;
		PyThreadState *ts = PyEval_SaveThread();
		dlock_lock_free(h);
		PyEval_RestoreThread(ts);
		st->calls--;
	}
}

static void lock_unlink(lock_object *self)
{
	if (self->prev)
		self->prev->next = self->next;
	else if (locks == self)
		locks = self->next;
	if (self->next)
		self->next->prev = self->prev;
	self->prev = self->next = NULL;
}

static void lock_dealloc(lock_object *self)
{
	PyObject *type, *value, *tb;
	PyErr_Fetch(&type, &value, &tb);
	PyObject_GC_UnTrack(self);
	lock_unlink(self); /* from now on a late lost signal finds nothing */
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	lock_free_handle(self);
	Py_CLEAR(self->store);
	Py_CLEAR(self->lost);
	Py_CLEAR(self->on_lost);
	Py_TYPE(self)->tp_free((PyObject *)self);
	PyErr_Restore(type, value, tb);
}

static int lock_traverse(lock_object *self, visitproc visit, void *arg)
{
	Py_VISIT(self->store);
	Py_VISIT(self->lost);
	Py_VISIT(self->on_lost);
	return 0;
}

static int lock_clear(lock_object *self)
{
	Py_CLEAR(self->on_lost);
	return 0;
}

/* acquire with wait_ms: 1 held, 0 not acquired (timeout / held by another),
 * -1 with an exception. */
static int lock_acquire_ms(lock_object *self, int64_t wait_ms)
{
	dlock_lock *h = lock_enter(self);
	if (!h)
		return -1;
	int was_held = dlock_held(h);
	int rc;
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_acquire(h, wait_ms);
	PyEval_RestoreThread(ts);
	lock_leave(self);
	if (rc == 0 && !was_held) {
		/* a new hold: not lost, whatever an old hold's signal set meanwhile
		 * (a loss of this one signals after this, under the GIL) */
		PyObject *r = PyObject_CallMethod(self->lost, "clear", NULL);
		if (!r)
			return -1;
		Py_DECREF(r);
	}
	if (rc == 0)
		return 1;
	if (rc == DLOCK_ETIMEOUT || rc == DLOCK_ELOCKED)
		return 0;
	raise_last(rc);
	return -1;
}

static PyObject *lock_acquire(lock_object *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:acquire", kwlist, &timeout))
		return NULL;
	int64_t ms;
	if (PyBool_Check(timeout))
		ms = timeout == Py_True ? -1 : 0; /* threading.Lock's acquire(blocking) */
	else if (seconds_to_ms(timeout, &ms, 1, "timeout") < 0)
		return NULL;
	int r = lock_acquire_ms(self, ms);
	if (r < 0)
		return NULL;
	return PyBool_FromLong(r);
}

static PyObject *lock_release(lock_object *self, PyObject *Py_UNUSED(unused))
{
	dlock_lock *h = lock_enter(self);
	if (!h)
		return NULL;
	int rc;
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_release(h);
	PyEval_RestoreThread(ts);
	lock_leave(self);
	if (rc < 0)
		return raise_last(rc);
	Py_RETURN_NONE;
}

static PyObject *lock_extend(lock_object *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "ttl", NULL };
	PyObject *ttl = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:extend", kwlist, &ttl) || ttl_to_ms(ttl, &ms) < 0)
		return NULL;
	dlock_lock *h = lock_enter(self);
	if (!h)
		return NULL;
	int rc;
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_extend(h, ms);
	PyEval_RestoreThread(ts);
	lock_leave(self);
	if (rc < 0)
		return raise_last(rc);
	Py_RETURN_NONE;
}

static PyObject *lock_enter_ctx(lock_object *self, PyObject *Py_UNUSED(unused))
{
	int r = lock_acquire_ms(self, self->wait_ms);
	if (r < 0)
		return NULL;
	if (r == 0)
		return raise_error(DLOCK_ETIMEOUT, "lock not acquired within the lock's wait", "", "");
	Py_INCREF(self);
	return (PyObject *)self;
}

/* Release on leaving `with`; an error of the release is raised only when
 * the block itself ended without one (a LostError then says the block did
 * not run under the lock to its end). */
static PyObject *lock_exit_ctx(lock_object *self, PyObject *args)
{
	PyObject *type = Py_None, *value = Py_None, *tb = Py_None;
	if (!PyArg_UnpackTuple(args, "__exit__", 0, 3, &type, &value, &tb))
		return NULL;
	PyObject *r = lock_release(self, NULL);
	if (!r) {
		if (type != Py_None)
			PyErr_Clear();
		else
			return NULL;
	}
	Py_XDECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *lock_wait_lost(lock_object *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait_lost", kwlist, &timeout))
		return NULL;
	return PyObject_CallMethod(self->lost, "wait", "O", timeout);
}

static PyObject *lock_get_fence(lock_object *self, void *Py_UNUSED(unused))
{
	return PyLong_FromUnsignedLongLong(self->lock ? dlock_fence(self->lock) : 0);
}

static PyObject *lock_get_held(lock_object *self, void *Py_UNUSED(unused))
{
	return PyBool_FromLong(self->lock ? dlock_held(self->lock) : 0);
}

static PyObject *lock_get_ttl_left(lock_object *self, void *Py_UNUSED(unused))
{
	return PyFloat_FromDouble(self->lock ? (double)dlock_ttl_left(self->lock) / 1000.0 : 0.0);
}

static PyObject *lock_get_name(lock_object *self, void *Py_UNUSED(unused))
{
	if (!self->lock)
		return raise_error(DLOCK_EINVAL, "the lock's store is closed", "", "");
	return PyUnicode_FromString(dlock_lock_name(self->lock));
}

static PyObject *lock_repr(lock_object *self)
{
	if (!self->lock)
		return PyUnicode_FromString("<dlock.Lock (store closed)>");
	return PyUnicode_FromFormat("<dlock.Lock '%s' held=%s fence=%llu>", dlock_lock_name(self->lock),
				    dlock_held(self->lock) ? "True" : "False",
				    (unsigned long long)dlock_fence(self->lock));
}

static PyMethodDef lock_methods[] = {
	{ "acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS,
	  "acquire(timeout=None) -> bool\n\nNone or a negative number waits forever, 0 tries once, a positive "
	  "number waits at most that many seconds. True when held, False when not acquired in time (or held by "
	  "another on a try-once); other failures raise dlock.Error." },
	{ "release", (PyCFunction)lock_release, METH_NOARGS,
	  "release()\n\nRelease one hold. Raises NotHeldError, LostError, UnavailableError." },
	{ "extend", (PyCFunction)(void (*)(void))lock_extend, METH_VARARGS | METH_KEYWORDS,
	  "extend(ttl=None)\n\nExtend the lease to ttl seconds from now (None: the lock's ttl)." },
	{ "wait_lost", (PyCFunction)(void (*)(void))lock_wait_lost, METH_VARARGS | METH_KEYWORDS,
	  "wait_lost(timeout=None) -> bool\n\nWait until the current hold is lost; lock.lost.wait(timeout)." },
	{ "__enter__", (PyCFunction)lock_enter_ctx, METH_NOARGS, "Acquire, waiting as the lock's `wait` says." },
	{ "__exit__", (PyCFunction)lock_exit_ctx, METH_VARARGS, "Release." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef lock_getset[] = {
	{ "fence", (getter)lock_get_fence, NULL, "fencing token of the current hold, 0 when not held", NULL },
	{ "held", (getter)lock_get_held, NULL, "whether this handle holds the lock now", NULL },
	{ "ttl_left", (getter)lock_get_ttl_left, NULL, "seconds of lease left as this process knows it", NULL },
	{ "name", (getter)lock_get_name, NULL, "the lock's name", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyMemberDef lock_members[] = {
	{ "lost", T_OBJECT, offsetof(lock_object, lost), READONLY,
	  "a threading.Event, set when the current hold is lost and cleared when a new hold begins" },
	{ "on_lost", T_OBJECT, offsetof(lock_object, on_lost), READONLY, "the lost-lock callback, or None" },
	{ NULL, 0, 0, 0, NULL },
};

static PyTypeObject lock_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlock.Lock",
	.tp_basicsize = sizeof(lock_object),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A lock handle on one name of a Store; make it with Store.lock().",
	.tp_dealloc = (destructor)lock_dealloc,
	.tp_traverse = (traverseproc)lock_traverse,
	.tp_clear = (inquiry)lock_clear,
	.tp_weaklistoffset = offsetof(lock_object, weakrefs),
	.tp_repr = (reprfunc)lock_repr,
	.tp_methods = lock_methods,
	.tp_getset = lock_getset,
	.tp_members = lock_members,
};

/* --- Store ----------------------------------------------------------------- */

static dlock_store *store_enter(store_object *self)
{
	if (!self->store || self->closing)
		return (dlock_store *)raise_error(DLOCK_EINVAL, "the store is closed", "", "");
	self->calls++;
	return self->store;
}

static int store_init(store_object *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "uri", "timeout", NULL };
	const char *uri = NULL;
	PyObject *timeout = Py_None;
	int64_t ms;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zO:Store", kwlist, &uri, &timeout) ||
	    seconds_to_ms(timeout, &ms, 0, "timeout") < 0)
		return -1;
	if (self->store) {
		raise_error(DLOCK_EINVAL, "Store is already open", "", "");
		return -1;
	}
	dlock_store *s = NULL;
	int rc;
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_store_open_timeout(&s, uri, ms < 0 ? 0 : ms);
	PyEval_RestoreThread(ts);
	if (rc < 0) {
		raise_last(rc);
		return -1;
	}
	self->store = s;
	self->next = stores;
	if (stores)
		stores->prev = self;
	stores = self;
	return 0;
}

/* Free every lock handle made from the store, then the store. */
static int store_close_impl(store_object *self)
{
	if (!self->store)
		return 0;
	if (self->calls > 0) {
		raise_error(DLOCK_EBUSY, "a call on this store or one of its locks is under way in another thread", "",
			    "");
		return -1;
	}
	/* From here no call starts on the store or its locks (store_enter,
	 * lock_enter, store.lock() see `closing`). The list may change while the
	 * GIL is released: start over each time. */
	self->closing = 1;
	for (;;) {
		lock_object *l = locks;
		while (l && !(l->store == self && l->lock))
			l = l->next;
		if (!l)
			break;
		lock_free_handle(l); /* its handle is NULL from here */
	}
	/* A Lock being deallocated in another thread frees its handle (already
	 * off the list) without the GIL: the store outlives that free. */
	while (self->calls > 0) {
		PyThreadState *ts = PyEval_SaveThread();
		struct timespec ms = { 0, 1000000 };
		nanosleep(&ms, NULL);
		PyEval_RestoreThread(ts);
	}
	dlock_store *s = self->store;
	self->store = NULL;
	if (self->prev)
		self->prev->next = self->next;
	else if (stores == self)
		stores = self->next;
	if (self->next)
		self->next->prev = self->prev;
	self->prev = self->next = NULL;
	PyThreadState *ts = PyEval_SaveThread();
	dlock_store_close(s);
	PyEval_RestoreThread(ts);
	return 0;
}

static void store_dealloc(store_object *self)
{
	/* Locks hold a reference to their store: none is left. An exception
	 * in flight (a failed __init__) is kept. */
	PyObject *type, *value, *tb;
	PyErr_Fetch(&type, &value, &tb);
	if (store_close_impl(self) < 0)
		PyErr_WriteUnraisable((PyObject *)self);
	PyErr_Restore(type, value, tb);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *store_close(store_object *self, PyObject *Py_UNUSED(unused))
{
	if (store_close_impl(self) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *store_enter_ctx(store_object *self, PyObject *Py_UNUSED(unused))
{
	if (!self->store)
		return raise_error(DLOCK_EINVAL, "the store is closed", "", "");
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *store_exit_ctx(store_object *self, PyObject *Py_UNUSED(args))
{
	if (store_close_impl(self) < 0)
		return NULL;
	Py_RETURN_FALSE;
}

static int parse_mode(const char *mode, dlock_mode *out)
{
	if (!mode || !strcmp(mode, "exclusive") || !strcmp(mode, "write") || !strcmp(mode, "semaphore"))
		*out = DLOCK_EXCLUSIVE;
	else if (!strcmp(mode, "read") || !strcmp(mode, "shared"))
		*out = DLOCK_SHARED;
	else
		return -1;
	return 0;
}

static PyObject *store_lock(store_object *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "ttl", "mode", "permits", "fair", "renew", "on_lost", "wait", NULL };
	const char *name, *mode = NULL;
	PyObject *ttl = Py_None, *on_lost = Py_None, *wait = Py_None;
	unsigned int permits = 0;
	int fair = 0, renew = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O$zIppOO:lock", kwlist, &name, &ttl, &mode, &permits, &fair,
					 &renew, &on_lost, &wait))
		return NULL;
	dlock_lock_options o = DLOCK_LOCK_OPTIONS_INIT;
	int64_t wait_ms;
	if (ttl_to_ms(ttl, &o.ttl_ms) < 0 || seconds_to_ms(wait, &wait_ms, 1, "wait") < 0)
		return NULL;
	if (parse_mode(mode, &o.mode) < 0)
		return raise_error(DLOCK_EINVAL,
				   "mode must be 'exclusive', 'write', 'read' (or 'shared') or 'semaphore'", "", "");
	if (mode && !strcmp(mode, "semaphore") && permits < 1)
		return raise_error(DLOCK_EINVAL, "mode='semaphore' needs permits=N", "", "");
	if (on_lost != Py_None && !PyCallable_Check(on_lost))
		return PyErr_Format(PyExc_TypeError, "on_lost must be callable");
	o.permits = permits ? permits : 1;
	o.fair = fair;
	o.no_renew = !renew;
	o.on_lost = lost_signal;
	if (!self->store || self->closing)
		return raise_error(DLOCK_EINVAL, "the store is closed", "", "");
	lock_object *l = PyObject_GC_New(lock_object, &lock_type);
	if (!l)
		return NULL;
	l->lock = NULL;
	l->store = self;
	Py_INCREF(self);
	l->on_lost = on_lost == Py_None ? NULL : Py_NewRef(on_lost);
	l->weakrefs = NULL;
	l->busy = 0;
	l->serial = next_serial++;
	l->prev = l->next = NULL;
	l->wait_ms = wait_ms;
	l->lost = PyObject_CallNoArgs(event_class);
	if (!l->lost) {
		Py_DECREF(l);
		return NULL;
	}
	o.payload = (void *)(uintptr_t)l->serial;
	l->next = locks;
	if (locks)
		locks->prev = l;
	locks = l;
	PyObject_GC_Track(l);
	int rc = dlock_lock_new(&l->lock, self->store, name, &o);
	if (rc < 0) {
		l->lock = NULL;
		raise_last(rc);
		Py_DECREF(l);
		return NULL;
	}
	return (PyObject *)l;
}

static const char *mode_name(dlock_mode m)
{
	return m == DLOCK_SHARED ? "read" : "exclusive";
}

static PyObject *holder_dict(const dlock_holder *h)
{
	/* h->owner is a secret (store.h): never handed to Python. */
	PyObject *ttl = h->ttl_left_ms < 0 ? Py_NewRef(Py_None) : PyFloat_FromDouble((double)h->ttl_left_ms / 1000.0);
	if (!ttl)
		return NULL;
	return Py_BuildValue("{s:s,s:s,s:i,s:s,s:K,s:N,s:I,s:I}", "id", h->id ? h->id : "", "host",
			     h->host ? h->host : "", "pid", h->pid, "mode", mode_name(h->mode), "fence",
			     (unsigned long long)h->fence, "ttl_left", ttl, "copies", h->copies, "copies_of",
			     h->copies_of);
}

static PyObject *store_status(store_object *self, PyObject *args)
{
	const char *name;
	if (!PyArg_ParseTuple(args, "s:status", &name))
		return NULL;
	dlock_store *s = store_enter(self);
	if (!s)
		return NULL;
	dlock_lock_status *st = NULL;
	size_t n = 0;
	int rc;
	const char *names[1] = { name };
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_store_status(s, names, 1, &st, &n);
	PyEval_RestoreThread(ts);
	self->calls--;
	if (rc < 0)
		return raise_last(rc);
	PyObject *list = PyList_New(0);
	for (size_t i = 0; list && i < n; i++)
		for (size_t j = 0; j < st[i].nholders; j++) {
			PyObject *d = holder_dict(&st[i].holders[j]);
			if (!d || PyList_Append(list, d) < 0)
				Py_CLEAR(list);
			Py_XDECREF(d);
			if (!list)
				break;
		}
	dlock_status_free(st, n);
	return list;
}

static PyObject *store_break(store_object *self, PyObject *args)
{
	const char *name, *id;
	if (!PyArg_ParseTuple(args, "ss:break_lock", &name, &id))
		return NULL;
	dlock_store *s = store_enter(self);
	if (!s)
		return NULL;
	dlock_holder freed;
	memset(&freed, 0, sizeof(freed));
	int rc;
	PyThreadState *ts = PyEval_SaveThread();
	rc = dlock_store_break(s, name, id, &freed);
	PyEval_RestoreThread(ts);
	self->calls--;
	if (rc < 0)
		return raise_last(rc);
	PyObject *d = holder_dict(&freed);
	dlock_holder_clear(&freed);
	return d;
}

static PyObject *store_get_str(store_object *self, void *which)
{
	if (!self->store)
		return raise_error(DLOCK_EINVAL, "the store is closed", "", "");
	const char *v;
	switch (*(const char *)which) {
	case 'k':
		v = dlock_store_kind(self->store);
		break;
	case 'u':
		v = dlock_store_uri(self->store);
		break;
	default:
		v = dlock_store_client_id(self->store);
	}
	return PyUnicode_FromString(v);
}

static PyObject *store_get_closed(store_object *self, void *Py_UNUSED(unused))
{
	return PyBool_FromLong(self->store == NULL);
}

static PyObject *store_repr(store_object *self)
{
	if (!self->store)
		return PyUnicode_FromString("<dlock.Store (closed)>");
	return PyUnicode_FromFormat("<dlock.Store %s>", dlock_store_uri(self->store));
}

static PyMethodDef store_methods[] = {
	{ "lock", (PyCFunction)(void (*)(void))store_lock, METH_VARARGS | METH_KEYWORDS,
	  "lock(name, ttl=None, *, mode='exclusive', permits=1, fair=False, renew=True, on_lost=None, wait=None)"
	  " -> Lock\n\nA lock handle on `name` (nothing is sent to the store). ttl and wait in seconds." },
	{ "status", (PyCFunction)store_status, METH_VARARGS,
	  "status(name) -> list of dict\n\nThe holders of `name`: id, host, pid, mode, fence, ttl_left, copies, "
	  "copies_of." },
	{ "break_lock", (PyCFunction)store_break, METH_VARARGS,
	  "break_lock(name, holder_id) -> dict\n\nFree another client's hold (named by its public id from "
	  "status()); returns that holder." },
	{ "close", (PyCFunction)store_close, METH_NOARGS,
	  "close()\n\nRelease every lock still held through the store, free its locks' handles and close it." },
	{ "__enter__", (PyCFunction)store_enter_ctx, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)store_exit_ctx, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef store_getset[] = {
	{ "kind", (getter)store_get_str, NULL, "the store's kind: 'sqlite', 'redis', ...", "k" },
	{ "uri", (getter)store_get_str, NULL, "the URI, password masked", "u" },
	{ "client_id", (getter)store_get_str, NULL, "this store handle's client id", "c" },
	{ "closed", (getter)store_get_closed, NULL, "whether close() was called", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyTypeObject store_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlock.Store",
	.tp_basicsize = sizeof(store_object),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc =
		"Store(uri=None, timeout=None): a connection to one lock store (None: the default SQLite "
		"file).",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)store_init,
	.tp_dealloc = (destructor)store_dealloc,
	.tp_repr = (reprfunc)store_repr,
	.tp_methods = store_methods,
	.tp_getset = store_getset,
};

/* --- module ---------------------------------------------------------------- */

/* atexit: no lost signal enters Python from now on, and every store still
 * open releases its locks now rather than leaving them to their leases. */
static PyObject *module_shutdown(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(unused))
{
	atomic_store(&python_alive, 0);
	for (;;) {
		store_object *s = stores;
		while (s && s->calls > 0)
			s = s->next;
		if (!s)
			break;
		Py_INCREF(s);
		store_close_impl(s); /* unlinks it */
		Py_DECREF(s);
	}
	Py_RETURN_NONE;
}

static PyObject *module_strerror(PyObject *Py_UNUSED(mod), PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(dlock_strerror((int)code));
}

static PyMethodDef module_methods[] = {
	{ "_shutdown", module_shutdown, METH_NOARGS, NULL },
	{ "strerror", module_strerror, METH_O, "strerror(code) -> str: libdlock's text for an error code." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "dlock",
	.m_doc = "Distributed locks over libdlock (docs/python.md).",
	.m_size = -1,
	.m_methods = module_methods,
};

static int add_errors(PyObject *m)
{
	error_base = PyErr_NewExceptionWithDoc("dlock.Error",
					       "Base of dlock's errors: .code (a negative DLOCK_E* number), "
					       ".store and .store_code (the store's own code, or '').",
					       NULL, NULL);
	if (!error_base || PyObject_SetAttrString(error_base, "code", PyLong_FromLong(0)) < 0 ||
	    PyModule_AddObjectRef(m, "Error", error_base) < 0)
		return -1;
	for (size_t i = 0; i < NERRORS; i++) {
		char qual[64];
		snprintf(qual, sizeof(qual), "dlock.%s", errors[i].name);
		PyObject *bases = errors[i].builtin ? PyTuple_Pack(2, error_base, *errors[i].builtin)
						    : PyTuple_Pack(1, error_base);
		if (!bases)
			return -1;
		error_classes[i] = PyErr_NewExceptionWithDoc(qual, errors[i].doc, bases, NULL);
		Py_DECREF(bases);
		PyObject *code = PyLong_FromLong(errors[i].code);
		int bad = !error_classes[i] || !code || PyObject_SetAttrString(error_classes[i], "code", code) < 0 ||
			  PyModule_AddObjectRef(m, errors[i].name, error_classes[i]) < 0 ||
			  PyModule_AddObjectRef(m, dlock_error_name(errors[i].code) + 6, code) < 0;
		Py_XDECREF(code);
		if (bad)
			return -1;
	}
	return 0;
}

PyMODINIT_FUNC PyInit_dlock(void);

PyMODINIT_FUNC PyInit_dlock(void)
{
	if (PyType_Ready(&store_type) < 0 || PyType_Ready(&lock_type) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&module_def);
	if (!m)
		return NULL;
	PyObject *threading = PyImport_ImportModule("threading");
	if (!threading)
		goto fail;
	event_class = PyObject_GetAttrString(threading, "Event");
	Py_DECREF(threading);
	if (!event_class || add_errors(m) < 0 || PyModule_AddObjectRef(m, "Store", (PyObject *)&store_type) < 0 ||
	    PyModule_AddObjectRef(m, "Lock", (PyObject *)&lock_type) < 0 ||
	    PyModule_AddStringConstant(m, "__version__", DLOCK_VERSION_STRING) < 0)
		goto fail;
	PyObject *atexit = PyImport_ImportModule("atexit");
	if (!atexit)
		goto fail;
	PyObject *shutdown = PyObject_GetAttrString(m, "_shutdown");
	PyObject *r = shutdown ? PyObject_CallMethod(atexit, "register", "O", shutdown) : NULL;
	Py_XDECREF(shutdown);
	Py_DECREF(atexit);
	if (!r)
		goto fail;
	Py_DECREF(r);
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
