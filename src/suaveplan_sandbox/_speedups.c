/* suaveplan_sandbox._speedups: the uncached fs and fetch checks in C.
 *
 * Why this exists: the permissions issue asks an uncached `check_fs` to cost at most 4x a
 * bare `posixpath.normpath` and an uncached `check_fetch` at most 1.5x a bare WHATWG parse.
 * Since CPython 3.11 normpath is itself C (0.2-0.4 us), and a Python checker pays more than
 * that in interpreter overhead alone (frames, slot loads, the result object), so the
 * ratios cannot be met in Python. No library does "normalise a path and find the first
 * matching rule" or "parse a URL and match its host against suffix rules" for us, hence
 * our own code.
 *
 * Contract: every function here is a drop-in for a pure-Python twin that stays the
 * reference (`_fs_rules.FsRuleSet._check_python`, `_fetch_rules.FetchRuleSet._check_python`),
 * with the same rule tables, the same memo dicts and the same decision objects. The
 * differential tests (`tests/permissions/test_speedups.py`) run both on the vectors and on
 * generated rules and inputs. Anything off the fast path (a non-ASCII or long path, a
 * `mode` that is not exactly a str) is either handed to Python helpers or compared with
 * Python's own semantics, so the C code only ever handles short ASCII bytes itself.
 *
 * Memory safety: the fs fast path handles paths of at most MAX_FAST bytes in fixed stack
 * buffers sized for that bound; every index is checked against the input length. URL
 * parsing is ada's (the same library the Python twin calls through cffi): we dlsym its C
 * API from the copy ada_url already loaded (RTLD_NOLOAD), never load another library.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FAST 255 /* MAX_SEGMENT_BYTES: an ASCII path this short is within every limit */

static PyObject *str_read;  /* "read" */
static PyObject *str_write; /* "write" */
static PyObject *str_dot;   /* "." */

/* ---------------------------------------------------------------- shared helpers ---- */

/* An Allow(rule=rule, target=target) built the way `_decision.new_allow` builds it: a bare
 * instance and the two slot descriptors' setters (the dataclass is frozen). */
typedef struct {
    PyTypeObject *type;
    PyObject *rule_descr;
    PyObject *target_descr;
} AllowMaker;

static int
allow_maker_init(AllowMaker *m, PyObject *allow_type)
{
    if (!PyType_Check(allow_type)) {
        PyErr_SetString(PyExc_TypeError, "allow_type must be a type");
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)allow_type;
    /* Class attribute access returns the slot descriptors themselves. */
    PyObject *rule = PyObject_GetAttrString(allow_type, "rule");
    PyObject *target = rule == NULL ? NULL : PyObject_GetAttrString(allow_type, "target");
    if (rule == NULL || target == NULL) {
        Py_XDECREF(rule);
        return -1;
    }
    if (Py_TYPE(rule) != &PyMemberDescr_Type || Py_TYPE(target) != &PyMemberDescr_Type ||
        type->tp_alloc == NULL) {
        Py_DECREF(rule);
        Py_DECREF(target);
        PyErr_SetString(PyExc_TypeError, "allow_type needs 'rule' and 'target' slots");
        return -1;
    }
    Py_INCREF(type);
    m->type = type;
    m->rule_descr = rule;
    m->target_descr = target;
    return 0;
}

static void
allow_maker_clear(AllowMaker *m)
{
    Py_CLEAR(m->type);
    Py_CLEAR(m->rule_descr);
    Py_CLEAR(m->target_descr);
}

static PyObject *
allow_new(AllowMaker *m, PyObject *rule, PyObject *target)
{
    PyObject *obj = m->type->tp_alloc(m->type, 0);
    if (obj == NULL) {
        return NULL;
    }
    if (Py_TYPE(m->rule_descr)->tp_descr_set(m->rule_descr, obj, rule) < 0 ||
        Py_TYPE(m->target_descr)->tp_descr_set(m->target_descr, obj, target) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

/* Field `i` of a rule-table entry tuple (borrowed); the tables are built by our own
 * Python code, but a malformed one is an exception, not a crash. */
static inline PyObject *
entry_item(PyObject *entry, Py_ssize_t i)
{
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4) {
        PyErr_SetString(PyExc_TypeError, "malformed rule entry");
        return NULL;
    }
    return PyTuple_GET_ITEM(entry, i);
}

static inline int
entry_index(PyObject *entry, long *out)
{
    PyObject *index = entry_item(entry, 0);
    if (index == NULL) {
        return -1;
    }
    long v = PyLong_AsLong(index);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = v;
    return 0;
}

/* Bounded memo insert, as the Python twins do it. */
static int
memo_put(PyObject *cache, Py_ssize_t limit, PyObject *key, PyObject *value)
{
    if (PyDict_GET_SIZE(cache) >= limit) {
        PyDict_Clear(cache);
    }
    return PyDict_SetItem(cache, key, value);
}

static PyObject *
ascii_str(const char *data, Py_ssize_t n)
{
    PyObject *s = PyUnicode_New(n, 127);
    if (s != NULL) {
        memcpy(PyUnicode_1BYTE_DATA(s), data, (size_t)n);
    }
    return s;
}

/* ------------------------------------------------------------------------ fs ------- */

typedef struct {
    PyObject_HEAD
    PyObject *exact;        /* dict: normalised path -> tuple of entries */
    PyObject *globs;        /* dict: bucket key -> tuple of entries */
    PyObject *read_cache;   /* dict: raw path -> decision */
    PyObject *write_cache;  /* dict */
    PyObject *denials;      /* dict: DenyReason -> Deny */
    PyObject *deny_mode;
    PyObject *deny_outside;
    PyObject *deny_invalid;
    PyObject *normalize;    /* normalize_request_path, for paths off the fast path */
    AllowMaker allow;
    int root_globs;
    long first_glob;
    Py_ssize_t cache_entries;
    Py_ssize_t cached_chars;
} FsMatcher;

static void
FsMatcher_dealloc(FsMatcher *self)
{
    Py_XDECREF(self->exact);
    Py_XDECREF(self->globs);
    Py_XDECREF(self->read_cache);
    Py_XDECREF(self->write_cache);
    Py_XDECREF(self->denials);
    Py_XDECREF(self->deny_mode);
    Py_XDECREF(self->deny_outside);
    Py_XDECREF(self->deny_invalid);
    Py_XDECREF(self->normalize);
    allow_maker_clear(&self->allow);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
FsMatcher_init(FsMatcher *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"exact", "globs", "root_globs", "first_glob", "read_cache",
                             "write_cache", "denials", "deny_mode", "deny_outside",
                             "deny_invalid", "allow_type", "normalize", "cache_entries",
                             "cached_chars", NULL};
    PyObject *exact, *globs, *read_cache, *write_cache, *denials, *deny_mode, *deny_outside,
        *deny_invalid, *allow_type, *normalize;
    int root_globs;
    long first_glob;
    Py_ssize_t cache_entries, cached_chars;
    if (self->exact != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FsMatcher is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "$O!O!plO!O!O!OOOOOnn", kwlist, &PyDict_Type, &exact, &PyDict_Type,
            &globs, &root_globs, &first_glob, &PyDict_Type, &read_cache, &PyDict_Type,
            &write_cache, &PyDict_Type, &denials, &deny_mode, &deny_outside, &deny_invalid,
            &allow_type, &normalize, &cache_entries, &cached_chars)) {
        return -1;
    }
    if (!PyCallable_Check(normalize)) {
        PyErr_SetString(PyExc_TypeError, "normalize must be callable");
        return -1;
    }
    if (allow_maker_init(&self->allow, allow_type) < 0) {
        return -1;
    }
    self->exact = Py_NewRef(exact);
    self->globs = Py_NewRef(globs);
    self->read_cache = Py_NewRef(read_cache);
    self->write_cache = Py_NewRef(write_cache);
    self->denials = Py_NewRef(denials);
    self->deny_mode = Py_NewRef(deny_mode);
    self->deny_outside = Py_NewRef(deny_outside);
    self->deny_invalid = Py_NewRef(deny_invalid);
    self->normalize = Py_NewRef(normalize);
    self->root_globs = root_globs;
    self->first_glob = first_glob;
    self->cache_entries = cache_entries;
    self->cached_chars = cached_chars;
    return 0;
}

/* `FsRuleSet._decide`: the lowest-index rule that matches `target` and grants the mode
 * wins; a match that only lacks the mode is mode-not-permitted. New reference or NULL. */
static PyObject *
fs_decide(FsMatcher *self, PyObject *target, int write)
{
    PyObject *best = NULL; /* strong */
    long best_index = 0;
    int matched = 0;
    PyObject *bucket = PyDict_GetItemWithError(self->exact, target);
    if (bucket == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (bucket != NULL) {
        if (!PyTuple_CheckExact(bucket)) {
            PyErr_SetString(PyExc_TypeError, "malformed rule bucket");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bucket); i++) {
            PyObject *entry = PyTuple_GET_ITEM(bucket, i);
            PyObject *writable = entry_item(entry, 2);
            if (writable == NULL) {
                return NULL;
            }
            matched = 1;
            if (!write || writable == Py_True) {
                if (entry_index(entry, &best_index) < 0) {
                    return NULL;
                }
                best = Py_NewRef(entry);
                break;
            }
        }
    }
    if (PyDict_GET_SIZE(self->globs) && (best == NULL || best_index > self->first_glob)) {
        Py_ssize_t tlen = PyUnicode_GET_LENGTH(target);
        int is_root = tlen == 1 && PyUnicode_READ_CHAR(target, 0) == '.';
        Py_ssize_t slash;
        PyObject *key;
        if (self->root_globs) {
            key = Py_NewRef(str_dot);
            slash = -1;
        }
        else {
            slash = PyUnicode_FindChar(target, '/', 0, tlen, 1);
            if (slash == -2) {
                goto fail;
            }
            key = slash < 0 ? Py_NewRef(target) : PyUnicode_Substring(target, 0, slash);
            if (key == NULL) {
                goto fail;
            }
        }
        for (;;) {
            PyObject *found = PyDict_GetItemWithError(self->globs, key);
            if (found == NULL && PyErr_Occurred()) {
                Py_DECREF(key);
                goto fail;
            }
            if (found != NULL) {
                if (!PyTuple_CheckExact(found)) {
                    Py_DECREF(key);
                    PyErr_SetString(PyExc_TypeError, "malformed rule bucket");
                    goto fail;
                }
                Py_INCREF(found);
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(found); i++) {
                    PyObject *entry = PyTuple_GET_ITEM(found, i);
                    long index;
                    if (entry_index(entry, &index) < 0) {
                        Py_DECREF(found);
                        Py_DECREF(key);
                        goto fail;
                    }
                    if (best != NULL && index > best_index) {
                        break;
                    }
                    PyObject *fullmatch = PyTuple_GET_ITEM(entry, 1);
                    int hit;
                    if (fullmatch == Py_None) {
                        hit = 1; /* a subtree rule: its bucket is at or above target */
                    }
                    else {
                        PyObject *m = PyObject_CallOneArg(fullmatch, target);
                        if (m == NULL) {
                            Py_DECREF(found);
                            Py_DECREF(key);
                            goto fail;
                        }
                        hit = m != Py_None;
                        Py_DECREF(m);
                    }
                    if (hit) {
                        matched = 1;
                        if (!write || PyTuple_GET_ITEM(entry, 2) == Py_True) {
                            Py_XSETREF(best, Py_NewRef(entry));
                            best_index = index;
                            break;
                        }
                    }
                }
                Py_DECREF(found);
                if (best != NULL && best_index == self->first_glob) {
                    break; /* nothing deeper can be lower */
                }
            }
            if (key == target || is_root) {
                break;
            }
            slash = PyUnicode_FindChar(target, '/', slash + 1, tlen, 1);
            if (slash == -2) {
                Py_DECREF(key);
                goto fail;
            }
            Py_SETREF(key, slash < 0 ? Py_NewRef(target) : PyUnicode_Substring(target, 0, slash));
            if (key == NULL) {
                goto fail;
            }
        }
        Py_DECREF(key);
    }
    if (best != NULL) {
        PyObject *allow = allow_new(&self->allow, PyTuple_GET_ITEM(best, 3), target);
        Py_DECREF(best);
        return allow;
    }
    return Py_NewRef(matched ? self->deny_mode : self->deny_outside);
fail:
    Py_XDECREF(best);
    return NULL;
}

/* `normalize_request_path` for a short ASCII path: the root-relative lexical form, built in
 * `out`; returns its length, 0 for the root, -1 for a NUL byte (invalid) and -2 for a climb
 * above the root. `n <= MAX_FAST`, so no segment or output can outgrow the buffers. */
static Py_ssize_t
fs_normalize_ascii(const char *s, Py_ssize_t n, char out[MAX_FAST + 1])
{
    Py_ssize_t marks[MAX_FAST + 1]; /* output length before each kept segment */
    Py_ssize_t depth = 0, len = 0, i = 0;
    if (memchr(s, '\0', (size_t)n) != NULL) {
        return -1;
    }
    while (i < n && s[i] == '/') {
        i++;
    }
    while (i < n) {
        Py_ssize_t j = i;
        while (j < n && s[j] != '/') {
            j++;
        }
        Py_ssize_t seg = j - i;
        if (seg == 0 || (seg == 1 && s[i] == '.')) {
            /* empty or `.`: nothing */
        }
        else if (seg == 2 && s[i] == '.' && s[i + 1] == '.') {
            if (depth == 0) {
                return -2; /* posixpath.normpath would keep a leading `..` */
            }
            len = marks[--depth];
        }
        else {
            marks[depth++] = len;
            if (len > 0) {
                out[len++] = '/';
            }
            memcpy(out + len, s + i, (size_t)seg);
            len += seg;
        }
        i = j + 1;
    }
    return len;
}

static PyObject *
FsMatcher_check(FsMatcher *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *path = NULL, *mode = NULL;
    if (self->exact == NULL) {
        PyErr_SetString(PyExc_TypeError, "FsMatcher was not initialised");
        return NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 2 || nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "check() takes a path and an optional mode");
        return NULL;
    }
    if (nargs >= 1) {
        path = args[0];
    }
    if (nargs == 2) {
        mode = args[1];
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        if (path == NULL && PyUnicode_CompareWithASCIIString(name, "path") == 0) {
            path = args[nargs + k];
        }
        else if (mode == NULL && PyUnicode_CompareWithASCIIString(name, "mode") == 0) {
            mode = args[nargs + k];
        }
        else {
            PyErr_Format(PyExc_TypeError, "check() got an unexpected keyword argument %R", name);
            return NULL;
        }
    }
    if (path == NULL) {
        PyErr_SetString(PyExc_TypeError, "check() missing required argument 'path'");
        return NULL;
    }
    int write;
    PyObject *cache;
    int eq = mode == NULL ? 1 : PyObject_RichCompareBool(mode, str_read, Py_EQ);
    if (eq < 0) {
        return NULL;
    }
    if (eq) {
        write = 0;
        cache = self->read_cache;
    }
    else {
        eq = PyObject_RichCompareBool(mode, str_write, Py_EQ);
        if (eq < 0) {
            return NULL;
        }
        if (!eq) {
            return Py_NewRef(self->deny_mode);
        }
        write = 1;
        cache = self->write_cache;
    }
    if (!PyUnicode_CheckExact(path)) {
        return Py_NewRef(self->deny_invalid);
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(path) < 0) { /* 3.11: a legacy string's canonical form */
        return NULL;
    }
#endif
    PyObject *hit = PyDict_GetItemWithError(cache, path);
    if (hit != NULL) {
        return Py_NewRef(hit);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(path);
    PyObject *decision;
    if (n == 0) {
        decision = Py_NewRef(self->deny_invalid);
    }
    else if (n <= MAX_FAST && PyUnicode_IS_ASCII(path)) {
        char out[MAX_FAST + 1];
        Py_ssize_t len = fs_normalize_ascii((const char *)PyUnicode_1BYTE_DATA(path), n, out);
        if (len == -1) {
            decision = Py_NewRef(self->deny_invalid);
        }
        else if (len == -2) {
            decision = Py_NewRef(self->deny_outside);
        }
        else {
            PyObject *target = len == 0 ? Py_NewRef(str_dot) : ascii_str(out, len);
            if (target == NULL) {
                return NULL;
            }
            decision = fs_decide(self, target, write);
            Py_DECREF(target);
        }
    }
    else {
        PyObject *target = PyObject_CallOneArg(self->normalize, path);
        if (target == NULL) {
            return NULL;
        }
        if (PyUnicode_CheckExact(target)) {
            decision = fs_decide(self, target, write);
        }
        else {
            decision = PyDict_GetItemWithError(self->denials, target);
            if (decision != NULL) {
                Py_INCREF(decision);
            }
            else if (!PyErr_Occurred()) {
                PyErr_SetObject(PyExc_KeyError, target);
            }
        }
        Py_DECREF(target);
    }
    if (decision == NULL) {
        return NULL;
    }
    if (n <= self->cached_chars && memo_put(cache, self->cache_entries, path, decision) < 0) {
        Py_DECREF(decision);
        return NULL;
    }
    return decision;
}

static PyMethodDef FsMatcher_methods[] = {
    {"check", (PyCFunction)(void (*)(void))FsMatcher_check, METH_FASTCALL | METH_KEYWORDS,
     "check(path, mode='read') -> Allow | Deny"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FsMatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "suaveplan_sandbox._speedups.FsMatcher",
    .tp_basicsize = sizeof(FsMatcher),
    .tp_dealloc = (destructor)FsMatcher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The uncached fs check over an FsRuleSet's tables.",
    .tp_methods = FsMatcher_methods,
    .tp_init = (initproc)FsMatcher_init,
    .tp_new = PyType_GenericNew,
};

/* --------------------------------------------------------------------- fetch ------- */

typedef struct {
    const char *data;
    size_t length;
} ada_string;

typedef struct {
    uint32_t protocol_end;
    uint32_t username_end;
    uint32_t host_start;
    uint32_t host_end;
    uint32_t port;
    uint32_t pathname_start;
    uint32_t search_start;
    uint32_t hash_start;
} ada_url_components;

typedef struct {
    int major;
    int minor;
    int revision;
} ada_version_components;

typedef void *ada_url;
static ada_url (*ada_parse)(const char *, size_t);
static ada_string (*ada_get_href)(ada_url);
static const ada_url_components *(*ada_get_components)(ada_url);
static void (*ada_free)(ada_url);

#define PORT_OMITTED 0xFFFFFFFFu

typedef struct {
    PyObject_HEAD
    PyObject *exact;        /* dict: canonical host -> tuple of entries */
    PyObject *suffix;       /* dict: `*.suffix` key -> tuple of entries */
    PyObject *cache;        /* dict: raw url -> decision */
    PyObject *deny_invalid;
    PyObject *deny_scheme;
    PyObject *deny_host;
    AllowMaker allow;
    unsigned char *labels;  /* labels[k]: some suffix rule has k labels (k <= most) */
    Py_ssize_t most;
    Py_ssize_t cache_entries;
    Py_ssize_t cached_chars;
} FetchMatcher;

static void
FetchMatcher_dealloc(FetchMatcher *self)
{
    Py_XDECREF(self->exact);
    Py_XDECREF(self->suffix);
    Py_XDECREF(self->cache);
    Py_XDECREF(self->deny_invalid);
    Py_XDECREF(self->deny_scheme);
    Py_XDECREF(self->deny_host);
    allow_maker_clear(&self->allow);
    PyMem_Free(self->labels);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
FetchMatcher_init(FetchMatcher *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"exact", "suffix", "suffix_labels", "cache", "deny_invalid",
                             "deny_scheme", "deny_host", "allow_type", "cache_entries",
                             "cached_chars", NULL};
    PyObject *exact, *suffix, *suffix_labels, *cache, *deny_invalid, *deny_scheme, *deny_host,
        *allow_type;
    Py_ssize_t cache_entries, cached_chars;
    if (self->exact != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FetchMatcher is already initialised");
        return -1;
    }
    if (ada_parse == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_ada() has not been called");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$O!O!O!O!OOOOnn", kwlist, &PyDict_Type,
                                     &exact, &PyDict_Type, &suffix, &PyFrozenSet_Type,
                                     &suffix_labels, &PyDict_Type, &cache, &deny_invalid,
                                     &deny_scheme, &deny_host, &allow_type, &cache_entries,
                                     &cached_chars)) {
        return -1;
    }
    Py_ssize_t most = 0;
    PyObject *it = PyObject_GetIter(suffix_labels);
    if (it == NULL) {
        return -1;
    }
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        Py_ssize_t k = PyLong_AsSsize_t(item);
        Py_DECREF(item);
        if (k == -1 && PyErr_Occurred()) {
            Py_DECREF(it);
            return -1;
        }
        if (k < 1 || k > 65536) {
            Py_DECREF(it);
            PyErr_SetString(PyExc_ValueError, "suffix label count out of range");
            return -1;
        }
        if (k > most) {
            most = k;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return -1;
    }
    unsigned char *labels = PyMem_Calloc((size_t)most + 1, 1);
    if (labels == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    it = PyObject_GetIter(suffix_labels);
    if (it == NULL) {
        PyMem_Free(labels);
        return -1;
    }
    while ((item = PyIter_Next(it)) != NULL) {
        labels[PyLong_AsSsize_t(item)] = 1; /* range-checked above */
        Py_DECREF(item);
    }
    Py_DECREF(it);
    if (allow_maker_init(&self->allow, allow_type) < 0) {
        PyMem_Free(labels);
        return -1;
    }
    self->labels = labels;
    self->most = most;
    self->exact = Py_NewRef(exact);
    self->suffix = Py_NewRef(suffix);
    self->cache = Py_NewRef(cache);
    self->deny_invalid = Py_NewRef(deny_invalid);
    self->deny_scheme = Py_NewRef(deny_scheme);
    self->deny_host = Py_NewRef(deny_host);
    self->cache_entries = cache_entries;
    self->cached_chars = cached_chars;
    return 0;
}

/* Fold one bucket into the selection (`FetchRuleSet._select`'s inner loop). */
static int
fetch_fold(PyObject *bucket, long port, int http, PyObject **best, long *best_index,
           int *matched)
{
    if (!PyTuple_CheckExact(bucket)) {
        PyErr_SetString(PyExc_TypeError, "malformed rule bucket");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bucket); i++) {
        PyObject *entry = PyTuple_GET_ITEM(bucket, i);
        PyObject *rule_port = entry_item(entry, 1);
        if (rule_port == NULL) {
            return -1;
        }
        if (rule_port != Py_None) {
            long p = PyLong_AsLong(rule_port);
            if (p == -1 && PyErr_Occurred()) {
                return -1;
            }
            if (p != port) {
                continue;
            }
        }
        *matched = 1;
        long index;
        if (entry_index(entry, &index) < 0) {
            return -1;
        }
        if ((!http || PyTuple_GET_ITEM(entry, 2) == Py_True) &&
            (*best == NULL || index < *best_index)) {
            Py_XSETREF(*best, Py_NewRef(entry));
            *best_index = index;
        }
    }
    return 0;
}

/* The decision for a serialised URL: `href` is ada's ASCII href (n bytes), `hs..he` the
 * host's byte range, `port_value` ada's port field. New reference or NULL. */
static PyObject *
fetch_select(FetchMatcher *self, const char *href, Py_ssize_t n, uint32_t hs, uint32_t he,
             uint32_t port_value)
{
    int http;
    if (n >= 6 && memcmp(href, "https:", 6) == 0) {
        http = 0;
    }
    else if (n >= 5 && memcmp(href, "http:", 5) == 0) {
        http = 1;
    }
    else {
        return Py_NewRef(self->deny_scheme);
    }
    if (hs > he || he > (uint64_t)n) {
        PyErr_SetString(PyExc_ValueError, "ada returned host offsets outside the href");
        return NULL;
    }
    const char *host = href + hs;
    Py_ssize_t hlen = (Py_ssize_t)(he - hs);
    if (hlen > 0 && host[0] == '@') { /* credentials end at the "@" host_start points to */
        host++;
        hlen--;
    }
    if (hlen > 0 && host[hlen - 1] == '.') {
        hlen--;
    }
    long port = port_value == PORT_OMITTED ? (http ? 80 : 443) : (long)port_value;
    int is_ip = 0;
    if (hlen > 0) {
        char last = host[hlen - 1];
        if (last == ']') {
            is_ip = 1;
        }
        else if (last >= '0' && last <= '9') {
            is_ip = 1; /* the last label is all decimal digits */
            for (Py_ssize_t i = hlen - 1; i >= 0 && host[i] != '.'; i--) {
                if (host[i] < '0' || host[i] > '9') {
                    is_ip = 0;
                    break;
                }
            }
        }
    }
    PyObject *best = NULL;
    long best_index = 0;
    int matched = 0;
    if (PyDict_GET_SIZE(self->exact)) {
        PyObject *key = ascii_str(host, hlen);
        if (key == NULL) {
            return NULL;
        }
        PyObject *bucket = PyDict_GetItemWithError(self->exact, key);
        Py_DECREF(key);
        if (bucket == NULL && PyErr_Occurred()) {
            return NULL;
        }
        if (bucket != NULL && fetch_fold(bucket, port, http, &best, &best_index, &matched) < 0) {
            goto fail;
        }
    }
    Py_ssize_t most = is_ip ? 0 : self->most;
    Py_ssize_t labels = 0, dot = hlen;
    while (labels < most) {
        do {
            dot--;
        } while (dot >= 0 && host[dot] != '.');
        if (dot < 0) {
            break;
        }
        labels++;
        if (!self->labels[labels]) {
            continue;
        }
        PyObject *key = ascii_str(host + dot + 1, hlen - dot - 1);
        if (key == NULL) {
            goto fail;
        }
        PyObject *bucket = PyDict_GetItemWithError(self->suffix, key);
        Py_DECREF(key);
        if (bucket == NULL && PyErr_Occurred()) {
            goto fail;
        }
        if (bucket != NULL && fetch_fold(bucket, port, http, &best, &best_index, &matched) < 0) {
            goto fail;
        }
    }
    if (best != NULL) {
        PyObject *target = ascii_str(href, n);
        if (target == NULL) {
            goto fail;
        }
        PyObject *allow = allow_new(&self->allow, PyTuple_GET_ITEM(best, 3), target);
        Py_DECREF(target);
        Py_DECREF(best);
        return allow;
    }
    return Py_NewRef(matched ? self->deny_scheme : self->deny_host);
fail:
    Py_XDECREF(best);
    return NULL;
}

static PyObject *
fetch_decide(FetchMatcher *self, PyObject *url)
{
    Py_ssize_t size;
    const char *raw = PyUnicode_AsUTF8AndSize(url, &size);
    if (raw == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            return NULL;
        }
        PyErr_Clear(); /* a lone surrogate: not a URL */
        return Py_NewRef(self->deny_invalid);
    }
    ada_url handle = ada_parse(raw, (size_t)size);
    if (handle == NULL) {
        return PyErr_NoMemory();
    }
    ada_string href = ada_get_href(handle);
    PyObject *decision;
    if (href.length == 0) {
        decision = Py_NewRef(self->deny_invalid); /* ada's href is empty for an invalid URL */
    }
    else {
        int ascii = 1;
        for (size_t i = 0; i < href.length; i++) {
            if ((unsigned char)href.data[i] >= 0x80) {
                ascii = 0;
                break;
            }
        }
        const ada_url_components *c = ada_get_components(handle);
        if (!ascii || href.length > (size_t)PY_SSIZE_T_MAX) {
            /* WHATWG serialisation is ASCII; anything else is a parser surprise: refuse. */
            decision = Py_NewRef(self->deny_invalid);
        }
        else if (c->port == 0) {
            /* An explicit port 0 (`:0`, `:00`, ...) names no destination: `invalid-url`,
             * whatever the scheme, as `FetchRuleSet._decide` decides. */
            decision = Py_NewRef(self->deny_invalid);
        }
        else {
            decision = fetch_select(self, href.data, (Py_ssize_t)href.length, c->host_start,
                                    c->host_end, c->port);
        }
    }
    ada_free(handle);
    return decision;
}

static PyObject *
FetchMatcher_check(FetchMatcher *self, PyObject *url)
{
    if (self->exact == NULL) {
        PyErr_SetString(PyExc_TypeError, "FetchMatcher was not initialised");
        return NULL;
    }
    if (!PyUnicode_CheckExact(url)) {
        return Py_NewRef(self->deny_invalid);
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(url) < 0) {
        return NULL;
    }
#endif
    PyObject *hit = PyDict_GetItemWithError(self->cache, url);
    if (hit != NULL) {
        return Py_NewRef(hit);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *decision = fetch_decide(self, url);
    if (decision == NULL) {
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(url) <= self->cached_chars &&
        memo_put(self->cache, self->cache_entries, url, decision) < 0) {
        Py_DECREF(decision);
        return NULL;
    }
    return decision;
}

static PyMethodDef FetchMatcher_methods[] = {
    {"check", (PyCFunction)FetchMatcher_check, METH_O, "check(url) -> Allow | Deny"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FetchMatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "suaveplan_sandbox._speedups.FetchMatcher",
    .tp_basicsize = sizeof(FetchMatcher),
    .tp_dealloc = (destructor)FetchMatcher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The uncached fetch check over a FetchRuleSet's tables.",
    .tp_methods = FetchMatcher_methods,
    .tp_init = (initproc)FetchMatcher_init,
    .tp_new = PyType_GenericNew,
};

/* bind_ada(path): resolve ada's C API in the shared object ada_url has already loaded. */
static PyObject *
bind_ada(PyObject *module, PyObject *arg)
{
    PyObject *encoded;
    if (!PyUnicode_FSConverter(arg, &encoded)) {
        return NULL;
    }
    void *lib = dlopen(PyBytes_AS_STRING(encoded), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    Py_DECREF(encoded);
    if (lib == NULL) {
        PyErr_SetString(PyExc_ImportError, "ada_url's shared object is not loaded");
        return NULL;
    }
    void *parse = dlsym(lib, "ada_parse");
    void *get_href = dlsym(lib, "ada_get_href");
    void *get_components = dlsym(lib, "ada_get_components");
    void *free_url = dlsym(lib, "ada_free");
    void *version = dlsym(lib, "ada_get_version_components");
    if (parse == NULL || get_href == NULL || get_components == NULL || free_url == NULL ||
        version == NULL) {
        dlclose(lib);
        PyErr_SetString(PyExc_ImportError, "ada_url's shared object lacks the ada C API");
        return NULL;
    }
    ada_version_components v = ((ada_version_components(*)(void))version)();
    if (v.major < 2) { /* the C API (ada_c.h) with these signatures dates from ada 2 */
        dlclose(lib);
        PyErr_Format(PyExc_ImportError, "ada %d.%d is older than the C API we use", v.major,
                     v.minor);
        return NULL;
    }
    /* The handle stays open: ada_url keeps its own reference, and so do we. */
    *(void **)&ada_parse = parse;
    *(void **)&ada_get_href = get_href;
    *(void **)&ada_get_components = get_components;
    *(void **)&ada_free = free_url;
    return PyLong_FromLong(v.major);
}


/* ------------------------------------------------------------------ inline fs read --- */

/* read_cached(root_fd, path, limit, rwf, path_flags, read_flags, resolve):
 * `BeneathRootFs._read_cached_python`'s system calls without the interpreter between them.
 *
 * Why this exists: the VM issue asks a proxied 1 KiB read to cost at most 2x a raw msgpack
 * echo. The inline read is seven system calls (look with O_PATH, fstat, close, open,
 * fstat, preadv2, close); through `os` and ctypes each pays for argument conversion and a
 * result object, which on the host's loop cost more than the calls themselves.
 *
 * Same contract as the Python twin, which stays the reference (the differential tests in
 * tests/adapters/test_fs_inline_read.py run both): openat2 with the caller's open_how
 * fields (RESOLVE_CACHED among them, so a lookup needing I/O fails with EAGAIN), only a
 * regular file of at most `limit` bytes is opened for reading, and its bytes are returned
 * only when one preadv2 with `rwf` (RWF_NOWAIT, or 0 on a memory filesystem) returned all
 * of them. Returns the bytes; None whenever the thread must serve the read instead; raises
 * OSError(EOPNOTSUPP) when the filesystem refuses `rwf` (the caller stops trying). Every
 * call here is one the caller has arranged not to wait, so the GIL is held throughout.
 * The path is checked here as the twin's caller checks it (`is_normalised`): a path no
 * request may name is None before any system call.
 */
/* Whether `path` (`len` bytes) names what a request may: no empty, `.` or `..` component
 * (so neither a leading nor a trailing `/`, nor `//`) and no NUL; `_fs._normalised`. */
static int
is_normalised(const char *path, Py_ssize_t len)
{
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i <= len; i++) {
        if (i < len && path[i] == '\0') {
            return 0;
        }
        if (i == len || path[i] == '/') {
            Py_ssize_t n = i - start;
            if (n == 0 || (n == 1 && path[start] == '.') ||
                (n == 2 && path[start] == '.' && path[start + 1] == '.')) {
                return 0;
            }
            start = i + 1;
        }
    }
    return 1;
}

#ifdef SYS_openat2
struct suave_open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};

static int
open_beneath(int root, const char *path, uint64_t flags, uint64_t resolve)
{
    struct suave_open_how how = {.flags = flags, .mode = 0, .resolve = resolve};
    return (int)syscall(SYS_openat2, root, path, &how, sizeof how);
}

static PyObject *
read_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_cached(root_fd, path: bytes, limit, rwf, path_flags, read_flags, "
                        "resolve)");
        return NULL;
    }
    long root = PyLong_AsLong(args[0]);
    long long limit = PyLong_AsLongLong(args[2]);
    long rwf = PyLong_AsLong(args[3]);
    unsigned long long path_flags = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long read_flags = PyLong_AsUnsignedLongLong(args[5]);
    unsigned long long resolve = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(args[1]);
    if (!is_normalised(path, PyBytes_GET_SIZE(args[1])) || root < 0 || limit < 0) {
        Py_RETURN_NONE; /* a path no request may name, or nothing to resolve against */
    }
    struct stat st;
    int fd = open_beneath((int)root, path, path_flags, resolve);
    if (fd < 0) {
        Py_RETURN_NONE;
    }
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= limit;
    close(fd);
    if (!ok) {
        Py_RETURN_NONE;
    }
    fd = open_beneath((int)root, path, read_flags, resolve);
    if (fd < 0) {
        Py_RETURN_NONE;
    }
    /* Looked at again once open: a rename in between may have put anything there. */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > limit) {
        close(fd);
        Py_RETURN_NONE;
    }
    Py_ssize_t size = (Py_ssize_t)st.st_size;
    /* One byte more than the file had: a file that grew since is left to the thread. */
    PyObject *buf = PyBytes_FromStringAndSize(NULL, size + 1);
    if (buf == NULL) {
        close(fd);
        return NULL;
    }
    struct iovec iov = {.iov_base = PyBytes_AS_STRING(buf), .iov_len = (size_t)size + 1};
    ssize_t n = preadv2(fd, &iov, 1, 0, (int)rwf);
    int err = errno;
    close(fd);
    if (n < 0 && err == EOPNOTSUPP) {
        Py_DECREF(buf);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n != size) { /* not all in the cache, or the file changed since the fstat */
        Py_DECREF(buf);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&buf, size) < 0) {
        return NULL;
    }
    return buf;
}
#endif

/* ------------------------------------------------------------------ polling recv --- */

/* poll_recv(fd, buffer, deadline) -> bytes read (0 at end of file), or -1 when the
 * monotonic clock (`time.monotonic()`'s, CLOCK_MONOTONIC) passed `deadline` first.
 *
 * Why this exists: the VM channel's busy polling (`busy_poll_us`) waits for an answer the
 * other process sends within microseconds. In Python each empty try is a failed recv that
 * builds and unwinds a BlockingIOError, a clock read and a sched_yield: a few microseconds
 * a turn, so an answer is noticed that much late. Here a turn is the two system calls
 * (and a vDSO clock read) alone.
 *
 * Nothing is parsed: the bytes land in the caller's writable buffer, for the same decoder
 * as any other read. recv(MSG_DONTWAIT) until data, end of file or an error other than
 * EAGAIN/EINTR (raised as OSError), sched_yield between tries (the other process may share
 * this CPU). The GIL is released while waiting. */
static PyObject *
poll_recv(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "poll_recv(fd, buffer, deadline)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    double deadline = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (fd < 0 || fd > INT32_MAX) {
        errno = EBADF;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    ssize_t n;
    int err = 0;
    struct timespec now;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        n = recv((int)fd, view.buf, (size_t)view.len, MSG_DONTWAIT);
        if (n >= 0) {
            break;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            err = errno;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)now.tv_sec + (double)now.tv_nsec * 1e-9 > deadline) {
            break;
        }
        sched_yield();
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(n);
}

/* ------------------------------------------------------------------------ module --- */

static PyMethodDef module_methods[] = {
    {"poll_recv", (PyCFunction)(void (*)(void))poll_recv, METH_FASTCALL,
     "poll_recv(fd, buffer, deadline) -> bytes read, or -1 when the deadline passed"},
    {"bind_ada", bind_ada, METH_O,
     "bind_ada(path) -> ada major version: use ada's C API from its loaded shared object"},
#ifdef SYS_openat2
    {"read_cached", (PyCFunction)(void (*)(void))read_cached, METH_FASTCALL,
     "read_cached(root_fd, path, limit, rwf, path_flags, read_flags, resolve) -> bytes | None"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "suaveplan_sandbox._speedups",
    .m_doc = "The uncached fs and fetch checks in C; see _speedups.c for why.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    str_read = PyUnicode_InternFromString("read");
    str_write = PyUnicode_InternFromString("write");
    str_dot = PyUnicode_InternFromString(".");
    if (str_read == NULL || str_write == NULL || str_dot == NULL) {
        return NULL;
    }
    if (PyType_Ready(&FsMatcherType) < 0 || PyType_Ready(&FetchMatcherType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "FsMatcher", (PyObject *)&FsMatcherType) < 0 ||
        PyModule_AddObjectRef(m, "FetchMatcher", (PyObject *)&FetchMatcherType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_FAST", MAX_FAST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
