/* kwinspect.stream._clabels: the compiled twin of the generic walks of stream/labels.py.
 *
 * What an exchange says at a glance, read from its decoded bodies (the dicts and lists the
 * decoders build): its error codes, its topics, its record sets.  The walks are the generic
 * ones of labels.py (_walk_errors, _walk_topics, iter_record_sets), which the schema-guided
 * Python walks equal by design, so one C walk serves every api and both.
 *
 *   configure(error, RecordSet)              once: labels._error builds an error's dict
 *   errors(body, names) -> list | None       list(iter_errors(body, names))
 *   topics(body, names) -> list | None       topics_of(body, names)
 *   record_sets(api_key, body, names) -> list | None     list(iter_record_sets(...))
 *   exchange(api_key, request_body, response_body, names) -> tuple | None
 *       what Conversation.emit asks, in one call: (the response's errors, the request's
 *       topics or else the response's, the request's and the response's record sets whose
 *       issues are not empty)
 *
 * None means "not the ordinary case": a subclass of dict, list, int or str where the walk
 * would look at it, a key that is not a str where the Python walk uses it, a record set of
 * another type, nesting deeper than MAX_DEPTH, an exception from a Python call.  The caller
 * then runs the Python walk, which gives the results (and raises what it raises).
 *
 * Exactness: dicts are walked in insertion order (PyDict_Next, as dict.items()); an error
 * code is inserted before the errors of the node's children as in Python; the dict of an
 * error is built by labels._error itself, from the same path and context chains the Python
 * walk would have built (rare: only for non-zero codes).  Topic ids are looked up exactly
 * where and how the Python walk looks them up (names.get(tid) or names.get(tid, tid)), through
 * the object's own get unless it is a plain dict, so a lookup-logging mapping (run/parallel.py)
 * logs the same lookups.
 *
 * Nothing here reads bytes: the walks follow objects the decoders made, to a bounded depth.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_DEPTH 64 /* decoded bodies nest a few levels; deeper ones go to Python */

enum { OK = 0, FAIL = -1, DECLINE = 1 };

static PyObject *g_error_fn, *g_record_set;
static PyObject *s_get, *s_name, *s_topic, *s_topic_name, *s_topic_id, *s_index, *s_partition_index,
    *s_records, *s_topic_data, *s_partition_data, *s_responses, *s_partitions, *s_zero_uuid, *s_error_code, *s_issues;

/* ---- str tests the walks make on keys -------------------------------------------------- */

static int contains(PyObject *key, const char *needle, Py_ssize_t n) /* needle in key */
{
    if (PyUnicode_KIND(key) == PyUnicode_1BYTE_KIND) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(key);
        const char *d = (const char *)PyUnicode_1BYTE_DATA(key);
        for (Py_ssize_t i = 0; i + n <= len; i++)
            if (d[i] == needle[0] && memcmp(d + i + 1, needle + 1, n - 1) == 0)
                return 1;
        return 0;
    }
    /* a wider str cannot hold the ASCII needle's bytes in a row: ask Python */
    PyObject *sub = PyUnicode_FromStringAndSize(needle, n);
    if (sub == NULL)
        return -1;
    int r = PyUnicode_Contains(key, sub);
    Py_DECREF(sub);
    return r;
}

static int ends_with_error_code(PyObject *key)
{
    static const char tail[] = "error_code";
    const Py_ssize_t n = sizeof tail - 1;
    if (PyUnicode_KIND(key) == PyUnicode_1BYTE_KIND) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(key);
        return len >= n && memcmp(PyUnicode_1BYTE_DATA(key) + len - n, tail, n) == 0;
    }
    return PyUnicode_Tailmatch(key, s_error_code, 0, PY_SSIZE_T_MAX, 1); /* a wider str */
}

/* "topic" in key or key == "responses" (labels._is_topic_array) */
static int topic_array(PyObject *key)
{
    int r = contains(key, "topic", 5);
    if (r != 0)
        return r;
    return PyUnicode_GET_LENGTH(key) == 9 && PyUnicode_KIND(key) == PyUnicode_1BYTE_KIND &&
           memcmp(PyUnicode_1BYTE_DATA(key), "responses", 9) == 0;
}

/* names.get(tid) (default NULL: one argument) or names.get(tid, default); a new reference */
static PyObject *names_get(PyObject *names, PyObject *tid, PyObject *dflt)
{
    if (PyDict_CheckExact(names)) {
        PyObject *v = PyDict_GetItemWithError(names, tid);
        if (v == NULL) {
            if (PyErr_Occurred())
                return NULL;
            v = dflt != NULL ? dflt : Py_None;
        }
        Py_INCREF(v);
        return v;
    }
    if (dflt == NULL)
        return PyObject_CallMethodOneArg(names, s_get, tid);
    return PyObject_CallMethodObjArgs(names, s_get, tid, dflt, NULL);
}

/* dict.get(key) on a plain dict: borrowed, NULL when absent (and no error set) */
static PyObject *get(PyObject *d, PyObject *key, int *err)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL && PyErr_Occurred())
        *err = 1;
    return v;
}

/* ---- the error walk (labels._walk_errors / _walk_list) -------------------------------- */

typedef struct {
    PyObject *names, *out;
    int npath, nctx;
    PyObject *path_key[MAX_DEPTH + 1];  /* a dict key, or NULL: a list index */
    Py_ssize_t path_index[MAX_DEPTH + 1];
    PyObject *ctx_node[MAX_DEPTH + 1];   /* the dicts from the body down */
    char ctx_topics[MAX_DEPTH + 1], ctx_parts[MAX_DEPTH + 1];
} Errors;

static int walk_list(Errors *w, PyObject *list, int in_topics, int in_parts);

/* The path chain (parent, part) ... and the context chain (parent, node, in topics, in
 * partitions) the Python walk carries, built for an error only. */
static PyObject *path_chain(Errors *w)
{
    PyObject *chain = Py_None;
    Py_INCREF(chain);
    for (int i = 0; i < w->npath; i++) {
        PyObject *part = w->path_key[i];
        PyObject *t = part != NULL ? PyTuple_Pack(2, chain, part) : NULL;
        if (part == NULL) {
            PyObject *idx = PyLong_FromSsize_t(w->path_index[i]);
            t = idx != NULL ? PyTuple_Pack(2, chain, idx) : NULL;
            Py_XDECREF(idx);
        }
        Py_DECREF(chain);
        if (t == NULL)
            return NULL;
        chain = t;
    }
    return chain;
}

static PyObject *ctx_chain(Errors *w)
{
    PyObject *chain = Py_None;
    Py_INCREF(chain);
    for (int i = 0; i < w->nctx; i++) {
        PyObject *t = PyTuple_Pack(4, chain, w->ctx_node[i], w->ctx_topics[i] ? Py_True : Py_False,
                                   w->ctx_parts[i] ? Py_True : Py_False);
        Py_DECREF(chain);
        if (t == NULL)
            return NULL;
        chain = t;
    }
    return chain;
}

static PyObject *make_error(Errors *w, PyObject *node, PyObject *key, PyObject *value)
{
    PyObject *path = path_chain(w);
    if (path == NULL)
        return NULL;
    PyObject *ctx = ctx_chain(w);
    if (ctx == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    PyObject *args[6] = {node, key, value, path, ctx, w->names};
    PyObject *err = PyObject_Vectorcall(g_error_fn, args, 6, NULL);
    Py_DECREF(path);
    Py_DECREF(ctx);
    return err;
}

static int walk_errors(Errors *w, PyObject *node) /* node: the top of the ctx stack */
{
    Py_ssize_t start = PyList_GET_SIZE(w->out), pos = 0;
    PyObject *key, *value;
    int parent_parts = w->ctx_parts[w->nctx - 1];
    while (PyDict_Next(node, &pos, &key, &value)) {
        PyTypeObject *t = Py_TYPE(value);
        if (t == &PyUnicode_Type || value == Py_None)
            continue;
        int r;
        if (t == &PyLong_Type || t == &PyBool_Type) {
            if (!PyUnicode_Check(key))
                continue; /* isinstance(key, str) fails: no error */
            if (!PyUnicode_CheckExact(key))
                return DECLINE; /* its own endswith: Python */
            if (!PyObject_IsTrue(value)) /* an int or a bool: cannot fail */
                continue;
            int tail = ends_with_error_code(key);
            if (tail < 0)
                return FAIL;
            if (!tail)
                continue;
            Py_INCREF(key);
            Py_INCREF(value);
            PyObject *err = make_error(w, node, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (err == NULL)
                return FAIL;
            r = PyList_Insert(w->out, start++, err);
            Py_DECREF(err);
            if (r < 0)
                return FAIL;
            continue;
        }
        int is_dict = t == &PyDict_Type;
        if (!is_dict && t != &PyList_Type) {
            if (PyLong_Check(value) || PyDict_Check(value) || PyList_Check(value))
                return DECLINE; /* a subclass: the Python walk's isinstance rules */
            continue;           /* float, bytes, a RecordSet, ...: nothing below */
        }
        if (!is_dict && PyList_GET_SIZE(value) == 0)
            continue;
        if (!PyUnicode_CheckExact(key) || w->npath >= MAX_DEPTH || w->nctx >= MAX_DEPTH)
            return DECLINE; /* str(key), and deep nesting: Python */
        int in_topics = topic_array(key);
        int in_parts = parent_parts ? 1 : contains(key, "partition", 9);
        if (in_topics < 0 || in_parts < 0)
            return FAIL;
        w->path_key[w->npath++] = key;
        Py_INCREF(key); /* held: an error's dict is made by Python code */
        Py_INCREF(value);
        if (is_dict) {
            w->ctx_node[w->nctx] = value;
            w->ctx_topics[w->nctx] = (char)in_topics;
            w->ctx_parts[w->nctx++] = (char)in_parts;
            r = walk_errors(w, value);
            w->nctx--;
        } else {
            r = walk_list(w, value, in_topics, in_parts);
        }
        Py_DECREF(value);
        Py_DECREF(key);
        w->npath--;
        if (r != OK)
            return r;
    }
    return OK;
}

static int walk_list(Errors *w, PyObject *list, int in_topics, int in_parts)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        PyTypeObject *t = Py_TYPE(item);
        int r;
        if (t != &PyDict_Type && t != &PyList_Type) {
            if (PyDict_Check(item) || PyList_Check(item))
                return DECLINE;
            continue;
        }
        if (w->npath >= MAX_DEPTH || w->nctx >= MAX_DEPTH)
            return DECLINE;
        w->path_key[w->npath] = NULL;
        w->path_index[w->npath++] = i;
        Py_INCREF(item);
        if (t == &PyDict_Type) {
            w->ctx_node[w->nctx] = item;
            w->ctx_topics[w->nctx] = (char)in_topics;
            w->ctx_parts[w->nctx++] = (char)in_parts;
            r = walk_errors(w, item);
            w->nctx--;
        } else {
            r = walk_list(w, item, in_topics, in_parts);
        }
        Py_DECREF(item);
        w->npath--;
        if (r != OK)
            return r;
    }
    return OK;
}

/* A walk's DECLINE or FAIL: NULL, with *declined set for a decline or an error that may
 * be swallowed (an Exception: the Python walk will raise it again, or not). */
static PyObject *declined_by(int r, int *declined)
{
    if (r == DECLINE || (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))) {
        PyErr_Clear();
        *declined = 1;
    }
    return NULL;
}

/* NULL with an error set: None (the Python walk decides), unless the error must not be
 * swallowed (KeyboardInterrupt and the like, not an Exception). */
static PyObject *decline(PyObject *partial)
{
    Py_XDECREF(partial);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static int configured(void)
{
    if (g_error_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kwinspect.stream._clabels: configure() first");
        return 0;
    }
    return 1;
}

/* The error walk of a body: a new list, or NULL: declined (*declined set, no error set) or
 * an error to raise. */
static PyObject *errors_of(PyObject *body, PyObject *names, int *declined)
{
    if (!PyDict_CheckExact(body)) {
        *declined = 1;
        return NULL;
    }
    Errors w;
    w.names = names;
    w.out = PyList_New(0);
    if (w.out == NULL)
        return NULL;
    w.npath = 0;
    w.nctx = 1;
    w.ctx_node[0] = body;
    w.ctx_topics[0] = w.ctx_parts[0] = 0;
    int r = walk_errors(&w, body);
    if (r != OK) {
        Py_DECREF(w.out);
        return declined_by(r, declined);
    }
    return w.out;
}

static PyObject *errors(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "errors(body, names)");
        return NULL;
    }
    if (!configured())
        return NULL;
    int declined = 0;
    PyObject *out = errors_of(args[0], args[1], &declined);
    return out != NULL ? out : decline(NULL);
}

/* ---- the topic walk (labels._walk_topics / _walk_topics_list / _note_topic) ------------- */

typedef struct {
    PyObject *names, *seen;
    int depth;
} Topics;

static int walk_topics_list(Topics *w, PyObject *list, int in_topic_array);

static int note_topic(Topics *w, PyObject *node)
{
    static PyObject **keys[] = {&s_name, &s_topic, &s_topic_name};
    int err = 0;
    PyObject *name = NULL; /* borrowed or owned (owned: from names.get) */
    int owned = 0;
    for (int i = 0; i < 3; i++) {
        PyObject *v = get(node, *keys[i], &err);
        if (err)
            return FAIL;
        if (v != NULL && PyUnicode_Check(v)) {
            if (!PyUnicode_CheckExact(v))
                return DECLINE;
            name = v;
            break;
        }
    }
    if (name == NULL || PyUnicode_GET_LENGTH(name) == 0) {
        PyObject *tid = get(node, s_topic_id, &err);
        if (err)
            return FAIL;
        if (tid != NULL && PyUnicode_Check(tid)) {
            if (!PyUnicode_CheckExact(tid))
                return DECLINE;
            name = names_get(w->names, tid, NULL);
            if (name == NULL)
                return FAIL;
            owned = 1;
            if (name == Py_None) {
                int zero = PyUnicode_Compare(tid, s_zero_uuid);
                if (zero == -1 && PyErr_Occurred()) {
                    Py_DECREF(name);
                    return FAIL;
                }
                if (zero != 0) {
                    Py_DECREF(name);
                    name = tid;
                    owned = 0;
                }
            }
        }
    }
    int r = OK;
    if (name != NULL && name != Py_None) {
        if (!PyUnicode_CheckExact(name))
            r = DECLINE; /* a mapping's odd value: Python's truth and hash rules */
        else if (PyUnicode_GET_LENGTH(name) > 0 && PyDict_SetDefault(w->seen, name, Py_None) == NULL)
            r = FAIL;
    }
    if (owned)
        Py_DECREF(name);
    return r;
}

static int walk_topics(Topics *w, PyObject *node, int in_topic_array)
{
    if (in_topic_array) {
        int r = note_topic(w, node);
        if (r != OK)
            return r;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(node, &pos, &key, &value)) {
        PyTypeObject *t = Py_TYPE(value);
        int r;
        if (t == &PyList_Type) {
            if (!PyUnicode_CheckExact(key))
                return DECLINE; /* "topic" in key: Python says what it makes of it */
            int in_topics = topic_array(key);
            if (in_topics < 0)
                return FAIL;
            Py_INCREF(value); /* held: a lookup below may run Python code */
            r = walk_topics_list(w, value, in_topics);
            Py_DECREF(value);
        } else if (t == &PyDict_Type) {
            if (w->depth >= MAX_DEPTH)
                return DECLINE;
            w->depth++;
            Py_INCREF(value);
            r = walk_topics(w, value, 0);
            Py_DECREF(value);
            w->depth--;
        } else if (PyList_Check(value) || PyDict_Check(value)) {
            return DECLINE;
        } else {
            continue;
        }
        if (r != OK)
            return r;
    }
    return OK;
}

static int walk_topics_list(Topics *w, PyObject *list, int in_topic_array)
{
    if (w->depth >= MAX_DEPTH)
        return DECLINE;
    w->depth++;
    int r = OK;
    for (Py_ssize_t i = 0; r == OK && i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        PyTypeObject *t = Py_TYPE(item);
        Py_INCREF(item);
        if (t == &PyDict_Type)
            r = walk_topics(w, item, in_topic_array);
        else if (t == &PyList_Type)
            r = walk_topics_list(w, item, in_topic_array);
        else if (PyDict_Check(item) || PyList_Check(item))
            r = DECLINE;
        else if (in_topic_array && PyUnicode_Check(item)) {
            if (!PyUnicode_CheckExact(item))
                r = DECLINE;
            else if (PyDict_SetDefault(w->seen, item, Py_None) == NULL)
                r = FAIL;
        }
        Py_DECREF(item);
    }
    w->depth--;
    return r;
}

static PyObject *topics_of(PyObject *body, PyObject *names, int *declined)
{
    if (!PyDict_CheckExact(body)) {
        *declined = 1;
        return NULL;
    }
    Topics w = {names, PyDict_New(), 0};
    if (w.seen == NULL)
        return NULL;
    int r = walk_topics(&w, body, 0);
    PyObject *out = r == OK ? PyDict_Keys(w.seen) : declined_by(r, declined);
    Py_DECREF(w.seen);
    return out;
}

static PyObject *topics(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "topics(body, names)");
        return NULL;
    }
    int declined = 0;
    PyObject *out = topics_of(args[0], args[1], &declined);
    return out != NULL ? out : decline(NULL);
}

/* ---- record sets (labels.iter_record_sets) ----------------------------------------------- */

static int falsy_str_or_none(PyObject *v) /* 1: None/absent/"", 0: a non-empty str, -1: other */
{
    if (v == NULL || v == Py_None)
        return 1;
    if (!PyUnicode_CheckExact(v))
        return -1;
    return PyUnicode_GET_LENGTH(v) == 0;
}

/* One element `t` (a dict) of the topics array: its partitions' record sets into out. */
static int topic_sets(PyObject *t, PyObject *parts_key, PyObject *names, PyObject *out, int troubled)
{
    int err = 0;
    /* name = t.get("name") or t.get("topic") */
    PyObject *name = get(t, s_name, &err);
    if (err)
        return FAIL;
    int f = falsy_str_or_none(name);
    if (f < 0)
        return DECLINE;
    if (f) {
        name = get(t, s_topic, &err);
        if (err)
            return FAIL;
        f = falsy_str_or_none(name);
        if (f < 0)
            return DECLINE;
    }
    if (name == NULL)
        name = Py_None;
    Py_INCREF(name);
    if (f) { /* not name and isinstance(t.get("topic_id"), str): names.get(tid, tid) */
        PyObject *tid = get(t, s_topic_id, &err);
        if (err || (tid != NULL && PyUnicode_Check(tid) && !PyUnicode_CheckExact(tid))) {
            Py_DECREF(name);
            return err ? FAIL : DECLINE;
        }
        if (tid != NULL && PyUnicode_CheckExact(tid)) {
            Py_DECREF(name);
            Py_INCREF(tid);
            name = names_get(names, tid, tid);
            Py_DECREF(tid);
            if (name == NULL)
                return FAIL;
        }
    }
    PyObject *parts = get(t, parts_key, &err);
    if (err || (parts != NULL && parts != Py_None && !PyList_CheckExact(parts))) {
        Py_DECREF(name);
        return err ? FAIL : DECLINE;
    }
    if (parts == NULL || parts == Py_None) {
        Py_DECREF(name);
        return OK;
    }
    int r = OK;
    Py_INCREF(parts);
    for (Py_ssize_t j = 0; r == OK && j < PyList_GET_SIZE(parts); j++) {
        PyObject *part = PyList_GET_ITEM(parts, j);
        if (!PyDict_CheckExact(part)) {
            if (PyDict_Check(part))
                r = DECLINE;
            continue;
        }
        PyObject *rs = get(part, s_records, &err);
        if (err || (rs != NULL && rs != Py_None && (PyObject *)Py_TYPE(rs) != g_record_set)) {
            r = err ? FAIL : DECLINE; /* hasattr(rs, "batches"): Python */
            break;
        }
        if (rs == NULL || rs == Py_None)
            continue;
        if (troubled) { /* if rs.issues: (a list; anything else: Python) */
            PyObject *issues = PyObject_GetAttr(rs, s_issues);
            int kind = issues == NULL ? FAIL : !PyList_CheckExact(issues) ? DECLINE : OK;
            Py_ssize_t any = kind == OK ? PyList_GET_SIZE(issues) : 0;
            Py_XDECREF(issues);
            if (kind != OK)
                r = kind;
            if (any == 0)
                continue;
        }
        /* part.get("index", part.get("partition_index")) */
        PyObject *partition = get(part, s_index, &err);
        if (partition == NULL && !err)
            partition = get(part, s_partition_index, &err);
        if (err) {
            r = FAIL;
            break;
        }
        PyObject *item = PyTuple_Pack(3, name, partition != NULL ? partition : Py_None, rs);
        if (item == NULL || PyList_Append(out, item) < 0)
            r = FAIL;
        Py_XDECREF(item);
    }
    Py_DECREF(parts);
    Py_DECREF(name);
    return r;
}

/* (topic, partition, record set) of a Produce request's or Fetch response's body into out
 * (api_key: 0 or 1; body: a dict); only those whose record set has issues when `troubled`.
 * The list and each topic are held while a lookup (Python code) runs. */
static int sets_into(long api_key, PyObject *body, PyObject *names, PyObject *out, int troubled)
{
    int err = 0;
    PyObject *topics_list = get(body, api_key == 0 ? s_topic_data : s_responses, &err);
    PyObject *parts_key = api_key == 0 ? s_partition_data : s_partitions;
    if (err)
        return FAIL;
    if (topics_list == NULL || topics_list == Py_None)
        return OK;
    if (!PyList_CheckExact(topics_list))
        return DECLINE; /* `topics or ()` of anything else: Python */
    int r = OK;
    Py_INCREF(topics_list);
    for (Py_ssize_t i = 0; r == OK && i < PyList_GET_SIZE(topics_list); i++) {
        PyObject *t = PyList_GET_ITEM(topics_list, i);
        if (!PyDict_CheckExact(t)) {
            if (PyDict_Check(t))
                r = DECLINE;
            continue;
        }
        Py_INCREF(t);
        r = topic_sets(t, parts_key, names, out, troubled);
        Py_DECREF(t);
    }
    Py_DECREF(topics_list);
    return r;
}

static PyObject *sets_of(long api_key, PyObject *body, PyObject *names, int troubled, int *declined)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int r = sets_into(api_key, body, names, out, troubled);
    if (r != OK) {
        Py_DECREF(out);
        return declined_by(r, declined);
    }
    return out;
}

static PyObject *record_sets(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record_sets(api_key, body, names)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *body = args[1];
    if (!PyLong_CheckExact(args[0]) || !PyDict_CheckExact(body))
        Py_RETURN_NONE;
    long api_key = PyLong_AsLong(args[0]);
    if (api_key == -1 && PyErr_Occurred())
        return decline(NULL);
    if (api_key != 0 && api_key != 1)
        return PyList_New(0);
    int declined = 0;
    PyObject *out = sets_of(api_key, body, args[2], 0, &declined);
    return out != NULL ? out : decline(NULL);
}

/* ---- one exchange's labels in one call (Conversation.emit) --------------------------------- */

static int truthy_body(PyObject *body) /* 1/0, -1: neither None nor a dict (Python decides) */
{
    if (body == Py_None)
        return 0;
    if (!PyDict_CheckExact(body))
        return -1;
    return PyDict_GET_SIZE(body) > 0;
}

static PyObject *exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "exchange(api_key, request_body, response_body, names)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *req = args[1], *resp = args[2], *names = args[3];
    int has_req = truthy_body(req), has_resp = truthy_body(resp);
    if (!PyLong_CheckExact(args[0]) || has_req < 0 || has_resp < 0)
        Py_RETURN_NONE;
    long api_key = PyLong_AsLong(args[0]);
    if (api_key == -1 && PyErr_Occurred())
        return decline(NULL);
    int records = api_key == 0 || api_key == 1, declined = 0;
    PyObject *errors = NULL, *topics = NULL, *req_sets = NULL, *resp_sets = NULL, *out = NULL;
    /* in emit's order: the response's errors, the request's topics (else the response's),
     * the record sets with issues of the request, then of the response */
    errors = has_resp ? errors_of(resp, names, &declined) : PyList_New(0);
    if (errors == NULL)
        goto done;
    topics = has_req ? topics_of(req, names, &declined) : PyList_New(0);
    if (topics == NULL)
        goto done;
    if (PyList_GET_SIZE(topics) == 0 && has_resp) {
        Py_SETREF(topics, topics_of(resp, names, &declined));
        if (topics == NULL)
            goto done;
    }
    req_sets = records && has_req ? sets_of(api_key, req, names, 1, &declined) : PyList_New(0);
    if (req_sets == NULL)
        goto done;
    resp_sets = records && has_resp ? sets_of(api_key, resp, names, 1, &declined) : PyList_New(0);
    if (resp_sets == NULL)
        goto done;
    out = PyTuple_Pack(4, errors, topics, req_sets, resp_sets);
done:
    Py_XDECREF(errors);
    Py_XDECREF(topics);
    Py_XDECREF(req_sets);
    Py_XDECREF(resp_sets);
    return out != NULL ? out : decline(NULL);
}

/* ---- module ------------------------------------------------------------------------------ */

static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *error_fn, *record_set;
    if (!PyArg_ParseTuple(args, "OO", &error_fn, &record_set))
        return NULL;
    if (!PyCallable_Check(error_fn) || !PyType_Check(record_set)) {
        PyErr_SetString(PyExc_TypeError, "configure(error function, RecordSet type)");
        return NULL;
    }
    Py_INCREF(error_fn);
    Py_INCREF(record_set);
    Py_XSETREF(g_error_fn, error_fn);
    Py_XSETREF(g_record_set, record_set);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(error, RecordSet): labels._error (an error's dict) and the record set type."},
    {"errors", (PyCFunction)(void (*)(void))errors, METH_FASTCALL,
     "errors(body, names) -> list | None: list(labels.iter_errors(body, names)), None: ask Python"},
    {"topics", (PyCFunction)(void (*)(void))topics, METH_FASTCALL,
     "topics(body, names) -> list | None: labels.topics_of(body, names), None: ask Python"},
    {"exchange", (PyCFunction)(void (*)(void))exchange, METH_FASTCALL,
     "exchange(api_key, request_body, response_body, names) -> (errors, topics, request's troubled\n"
     "record sets, response's) | None: what Conversation.emit asks of labels, in one call"},
    {"record_sets", (PyCFunction)(void (*)(void))record_sets, METH_FASTCALL,
     "record_sets(api_key, body, names) -> list | None: list(labels.iter_record_sets(...))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kwinspect.stream._clabels",
    "The compiled twin of kwinspect.stream.labels' generic walks: error codes, topics, record sets.",
    -1, methods,
};

static int intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__clabels(void)
{
    if (intern(&s_get, "get") || intern(&s_name, "name") || intern(&s_topic, "topic") ||
        intern(&s_topic_name, "topic_name") || intern(&s_topic_id, "topic_id") || intern(&s_index, "index") ||
        intern(&s_partition_index, "partition_index") || intern(&s_records, "records") ||
        intern(&s_topic_data, "topic_data") || intern(&s_partition_data, "partition_data") ||
        intern(&s_responses, "responses") || intern(&s_partitions, "partitions") ||
        intern(&s_zero_uuid, "AAAAAAAAAAAAAAAAAAAAAA") || intern(&s_error_code, "error_code") ||
        intern(&s_issues, "issues"))
        return NULL;
    return PyModule_Create(&module);
}
