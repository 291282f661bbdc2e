/* kwinspect.protocol._cdecode: the compiled twin of protocol/fastdecode.py.
 *
 * A small interpreter over a program that protocol/compiled.py builds from the schema
 * tables with the same layout rules (protocol/layout.py) the generated Python decoder is
 * written from.  For one (api key, version, direction) or one named struct it reads a clean
 * frame and builds exactly the objects the generated decoder builds: the same dicts with the
 * same keys in the same order, the same lists, ints, floats, bools, strings, bytes, the
 * record sets made by the same Python parser, the same Message.
 *
 *   configure(Message, read_tagged, parse_records)    once, before any compile
 *   compile(program) -> capsule                        ValueError/TypeError on a bad program
 *   decode_request(capsule, frame) -> Message | None
 *   decode_response(capsule, frame, api_key, api_version) -> Message | None
 *   decode_struct(capsule, data) -> dict | None
 *   configure_deferred(DeferredMessage)                once, before any scan
 *   scan_request(capsule, frame) -> DeferredMessage | None
 *   scan_response(capsule, frame, api_key, api_version) -> DeferredMessage | None
 *                    (decoding's checks, the header built, the body's labels noted and the
 *                     body left to be decoded when read: see "scanning" below)
 *
 * None means "not the clean case": a short buffer, a bad length, a null where none is
 * allowed, invalid UTF-8, an element budget overrun, trailing bytes, a tagged field the
 * Python helper refuses, an ApiVersions rejection.  The caller then runs the reference
 * decoder, which alone reports issues, exactly as when the generated Python decoder gives up.
 * Non-empty tagged-field sections are read by the same Python helper (fastdecode.read_tagged)
 * the generated decoder calls, with the same table.
 *
 * Hostile input: every length is compared, in 64-bit arithmetic, with the bytes left before
 * it is used; an array is allocated only after its count times the fewest bytes an element
 * takes is found to fit in what is left (so no allocation exceeds what the input holds), and
 * the per-message element budget (layout.MAX_ELEMENTS_PER_MESSAGE) is spent as in Python.
 * Recursion depth follows the schema's nesting, never the input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "../_cattrs.h" /* slot_offset */
#include "_crc32c.h"

/* Field operations; the numbers are protocol/compiled.py's OPS. */
enum {
    OP_BOOL, OP_INT8, OP_INT16, OP_UINT16, OP_INT32, OP_UINT32, OP_INT64, OP_FLOAT64, OP_UUID,
    OP_STRING, OP_BYTES, OP_RECORDS, OP_STRUCT, OP_ARRAY, OP_COUNT
};
enum { KIND_STRUCT, KIND_REQUEST, KIND_RESPONSE };

typedef struct Node Node;

typedef struct {
    int op, compact, nullable;
    int inner;     /* OP_ARRAY: the element's op */
    int64_t least; /* OP_ARRAY: fewest bytes an element takes (>= 1) */
    Node *child;   /* OP_STRUCT, or OP_ARRAY of OP_STRUCT */
    int fact;      /* what the scan notes of it (FACT_*, from its name) */
} Field;

/* What scan_message (below) notes of a field, from its name as the label walks of
 * stream/labels.py test it: an error code, a topic array, the body's throttle_time_ms / acks */
enum { FACT_ERROR = 1, FACT_TOPIC_ARRAY = 2, FACT_THROTTLE = 4, FACT_ACKS = 8 };

struct Node { /* one struct at one version */
    int flexible;
    Py_ssize_t nfields;
    PyObject **names; /* the regular fields, in order */
    Field *fields;
    PyObject *table;  /* flexible: fastdecode.read_tagged's table */
    Py_ssize_t ndefaults;
    PyObject **dnames, **dvalues; /* flexible: absent tagged fields and their defaults */
    PyObject *tmpl;   /* {name: None} of the regular fields in order: a struct's dict is a
                       * copy of it (one allocation of the keys table, no resize midway) with
                       * each value then replaced, not a dict grown one key at a time */
    /* for the scan, as an element of a topic array: the field labels._note_topic takes the
     * name from (the first string field of name, topic, topic_name), or -1; whether it comes
     * before every field a topic or record set can sit under; whether the element has a
     * topic_id or a tagged default that could name a topic or hold an error code */
    Py_ssize_t topic_field;
    int named_first, topic_id, unscannable;
};

typedef struct {
    int kind, apiv_check;
    int64_t budget;
    Node *header, *body; /* a struct program: body only */
    PyObject *key, *version;
} Program;

typedef struct {
    PyObject *bufobj;
    const unsigned char *b;
    int64_t L, pos, E;
} St;

static PyObject *g_message, *g_read_tagged, *g_parse_records;
/* Message's fields in __init__'s order, and their slot offsets when each is a plain object
 * slot: a Message is then made in place (its dataclass __init__, run by the interpreter, was
 * a tenth of decoding a small produce exchange); else 0 and Message(...) is called */
static const char *const MESSAGE_FIELDS[9] = {"is_request", "api_key", "api_version", "header", "body",
                                              "issues", "raw_body", "size", "decoded_version"};
static Py_ssize_t g_message_offsets[9];
static int g_message_in_place;
static const char CAPSULE[] = "kwinspect.protocol._cdecode.Program";

/* ---- building and freeing programs ---------------------------------------------------- */

static void free_node(Node *n)
{
    if (n == NULL)
        return;
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        Py_XDECREF(n->names[i]);
        free_node(n->fields[i].child);
    }
    for (Py_ssize_t i = 0; i < n->ndefaults; i++) {
        Py_XDECREF(n->dnames[i]);
        Py_XDECREF(n->dvalues[i]);
    }
    Py_XDECREF(n->table);
    Py_XDECREF(n->tmpl);
    PyMem_Free(n->names);
    PyMem_Free(n->fields);
    PyMem_Free(n->dnames);
    PyMem_Free(n->dvalues);
    PyMem_Free(n);
}

static int as_int(PyObject *o, long lo, long hi, long *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "program value %ld out of range", v);
        return -1;
    }
    *out = v;
    return 0;
}

static Node *build_node(PyObject *t);

/* (op, compact, nullable, inner, least, child) */
static int build_field(PyObject *t, Field *f)
{
    long op, compact, nullable, inner, least;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6) {
        PyErr_SetString(PyExc_TypeError, "a field is (op, compact, nullable, inner, least, child)");
        return -1;
    }
    if (as_int(PyTuple_GET_ITEM(t, 0), 0, OP_COUNT - 1, &op) || as_int(PyTuple_GET_ITEM(t, 1), 0, 1, &compact)
        || as_int(PyTuple_GET_ITEM(t, 2), 0, 1, &nullable) || as_int(PyTuple_GET_ITEM(t, 3), 0, OP_COUNT - 1, &inner)
        || as_int(PyTuple_GET_ITEM(t, 4), 0, 1L << 30, &least))
        return -1;
    f->op = (int)op;
    f->compact = (int)compact;
    f->nullable = (int)nullable;
    f->inner = (int)inner;
    f->least = least;
    f->child = NULL;
    if (op == OP_ARRAY && (inner == OP_ARRAY || least < 1)) {
        PyErr_SetString(PyExc_ValueError, "an array of arrays, or an element of no bytes");
        return -1;
    }
    if (op == OP_STRUCT || (op == OP_ARRAY && inner == OP_STRUCT)) {
        f->child = build_node(PyTuple_GET_ITEM(t, 5));
        if (f->child == NULL)
            return -1;
    }
    return 0;
}


static int name_is(PyObject *name, const char *what)
{
    return PyUnicode_CompareWithASCIIString(name, what) == 0;
}

/* a tagged default (key: value) the scan could not vouch for: a key that could name a topic
 * or a top-level fact, that mentions a topic or is "responses", or an error code that is not
 * 0, in it or in a dict of it all the way down (a list default is a fresh empty list) */
static int odd_default(PyObject *k, PyObject *v, int depth)
{
    if (!PyUnicode_Check(k) || depth > 16)
        return 1;
    PyObject *topic = PyUnicode_FromString("topic"), *suffix = PyUnicode_FromString("error_code");
    if (topic == NULL || suffix == NULL) {
        Py_XDECREF(topic);
        Py_XDECREF(suffix);
        return -1;
    }
    int has_topic = PyUnicode_Contains(k, topic);
    Py_ssize_t is_err = PyUnicode_Tailmatch(k, suffix, 0, PY_SSIZE_T_MAX, 1);
    Py_DECREF(topic);
    Py_DECREF(suffix);
    if (has_topic < 0 || is_err < 0)
        return -1;
    if (has_topic || name_is(k, "responses") || name_is(k, "name") || name_is(k, "throttle_time_ms")
        || name_is(k, "acks"))
        return 1;
    if (is_err && !(PyLong_CheckExact(v) && PyLong_AsLong(v) == 0))
        return 1;
    if (!PyDict_Check(v))
        return 0;
    PyObject *k2, *x;
    Py_ssize_t i = 0;
    while (PyDict_Next(v, &i, &k2, &x)) {
        int r = odd_default(k2, x, depth + 1);
        if (r)
            return r;
    }
    return 0;
}

/* the scan's notes of a struct's fields (Field.fact, Node.topic_field...), from their names */
static int node_facts(Node *n)
{
    PyObject *topic = PyUnicode_FromString("topic"), *suffix = PyUnicode_FromString("error_code");
    int result = -1;
    if (topic == NULL || suffix == NULL)
        goto done;
    n->topic_field = -1;
    Py_ssize_t first_nested = n->nfields, rank = 4;
    int has_topic_id = 0;
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        PyObject *name = n->names[i];
        Field *f = &n->fields[i];
        int has_topic = PyUnicode_Contains(name, topic);
        Py_ssize_t is_err = PyUnicode_Tailmatch(name, suffix, 0, PY_SSIZE_T_MAX, 1);
        if (has_topic < 0 || is_err < 0)
            goto done;
        f->fact = 0;
        if (is_err && f->op <= OP_INT64)
            f->fact |= FACT_ERROR;
        if (f->op == OP_ARRAY && (has_topic || name_is(name, "responses")))
            f->fact |= FACT_TOPIC_ARRAY;
        if (f->op <= OP_INT64 && name_is(name, "throttle_time_ms"))
            f->fact |= FACT_THROTTLE;
        if (f->op <= OP_INT64 && name_is(name, "acks"))
            f->fact |= FACT_ACKS;
        if ((f->op == OP_ARRAY || f->op == OP_STRUCT || f->op == OP_RECORDS) && i < first_nested)
            first_nested = i;
        if (name_is(name, "topic_id"))
            has_topic_id = 1;
        Py_ssize_t r = name_is(name, "name") ? 1 : name_is(name, "topic") ? 2 : name_is(name, "topic_name") ? 3 : 4;
        if (r < rank && f->op == OP_STRING) {
            rank = r;
            n->topic_field = i;
        }
    }
    n->named_first = n->topic_field < 0 ? first_nested == n->nfields : n->topic_field < first_nested;
    n->topic_id = has_topic_id;
    for (Py_ssize_t i = 0; i < n->ndefaults; i++) {
        int r = odd_default(n->dnames[i], n->dvalues[i], 0);
        if (r < 0)
            goto done;
        if (r)
            n->unscannable = 1;
    }
    result = 0;
done:
    Py_XDECREF(topic);
    Py_XDECREF(suffix);
    return result;
}

/* (flexible, names, fields, table, defaults) with defaults ((name, value), ...) */
static Node *build_node(PyObject *t)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
        PyErr_SetString(PyExc_TypeError, "a struct is (flexible, names, fields, table, defaults)");
        return NULL;
    }
    PyObject *names = PyTuple_GET_ITEM(t, 1), *fields = PyTuple_GET_ITEM(t, 2);
    PyObject *table = PyTuple_GET_ITEM(t, 3), *defaults = PyTuple_GET_ITEM(t, 4);
    if (!PyTuple_Check(names) || !PyTuple_Check(fields) || !PyTuple_Check(defaults)
        || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(fields)) {
        PyErr_SetString(PyExc_TypeError, "names and fields: tuples of one length; defaults: a tuple");
        return NULL;
    }
    Node *n = PyMem_Calloc(1, sizeof(Node));
    if (n == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    long flexible;
    if (as_int(PyTuple_GET_ITEM(t, 0), 0, 1, &flexible))
        goto fail;
    n->flexible = (int)flexible;
    Py_ssize_t nf = PyTuple_GET_SIZE(names), nd = PyTuple_GET_SIZE(defaults);
    n->names = PyMem_Calloc(nf + 1, sizeof(PyObject *));
    n->fields = PyMem_Calloc(nf + 1, sizeof(Field));
    n->dnames = PyMem_Calloc(nd + 1, sizeof(PyObject *));
    n->dvalues = PyMem_Calloc(nd + 1, sizeof(PyObject *));
    if (!n->names || !n->fields || !n->dnames || !n->dvalues) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "field names are str");
            goto fail;
        }
        Py_INCREF(name);
        n->names[i] = name;
        n->nfields = i + 1;
        if (build_field(PyTuple_GET_ITEM(fields, i), &n->fields[i]))
            goto fail;
    }
    if ((n->tmpl = PyDict_New()) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < nf; i++)
        if (PyDict_SetItem(n->tmpl, n->names[i], Py_None) < 0)
            goto fail;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *pair = PyTuple_GET_ITEM(defaults, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "a default is (name, value)");
            goto fail;
        }
        n->dnames[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        n->dvalues[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        n->ndefaults = i + 1;
    }
    if (node_facts(n))
        goto fail;
    if (n->flexible) {
        if (!PyTuple_Check(table)) {
            PyErr_SetString(PyExc_TypeError, "a flexible struct has a tagged-field table");
            goto fail;
        }
        n->table = Py_NewRef(table);
    }
    return n;
fail:
    free_node(n);
    return NULL;
}

static void free_program(PyObject *capsule)
{
    Program *p = PyCapsule_GetPointer(capsule, CAPSULE);
    if (p == NULL)
        return;
    free_node(p->header);
    free_node(p->body);
    Py_XDECREF(p->key);
    Py_XDECREF(p->version);
    PyMem_Free(p);
}

/* compile((kind, header, body, apiv_check, api_key, api_version, budget)) -> capsule */
static PyObject *compile_program(PyObject *self, PyObject *arg)
{
    if (g_message == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 7) {
        PyErr_SetString(PyExc_TypeError, "a program is (kind, header, body, apiv_check, key, version, budget)");
        return NULL;
    }
    long kind, apiv, budget;
    if (as_int(PyTuple_GET_ITEM(arg, 0), KIND_STRUCT, KIND_RESPONSE, &kind)
        || as_int(PyTuple_GET_ITEM(arg, 3), 0, 1, &apiv) || as_int(PyTuple_GET_ITEM(arg, 6), 0, 1L << 40, &budget))
        return NULL;
    Program *p = PyMem_Calloc(1, sizeof(Program));
    if (p == NULL)
        return PyErr_NoMemory();
    p->kind = (int)kind;
    p->apiv_check = (int)apiv;
    p->budget = budget;
    p->key = Py_NewRef(PyTuple_GET_ITEM(arg, 4));
    p->version = Py_NewRef(PyTuple_GET_ITEM(arg, 5));
    if (kind != KIND_STRUCT && (p->header = build_node(PyTuple_GET_ITEM(arg, 1))) == NULL)
        goto fail;
    if ((p->body = build_node(PyTuple_GET_ITEM(arg, 2))) == NULL)
        goto fail;
    PyObject *capsule = PyCapsule_New(p, CAPSULE, free_program);
    if (capsule != NULL)
        return capsule;
fail:
    free_node(p->header);
    free_node(p->body);
    Py_XDECREF(p->key);
    Py_XDECREF(p->version);
    PyMem_Free(p);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *message, *read_tagged, *parse;
    if (!PyArg_ParseTuple(args, "OOO", &message, &read_tagged, &parse))
        return NULL;
    Py_XSETREF(g_message, Py_NewRef(message));
    g_message_in_place = PyType_Check(message);
    for (int i = 0; i < 9 && g_message_in_place; i++) {
        PyObject *name = PyUnicode_InternFromString(MESSAGE_FIELDS[i]);
        if (name == NULL)
            return NULL;
        g_message_offsets[i] = slot_offset((PyTypeObject *)message, name);
        Py_DECREF(name);
        g_message_in_place = g_message_offsets[i] > 0;
    }
    Py_XSETREF(g_read_tagged, Py_NewRef(read_tagged));
    Py_XSETREF(g_parse_records, Py_NewRef(parse));
    Py_RETURN_NONE;
}

/* the big-endian integer of n bytes at p */
static inline int64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

/* ---- record sets ----------------------------------------------------------------------
 * records.parse_record_set(raw) for the ordinary RECORDS field: whole v2 batches, every CRC
 * right.  The same RecordSet and RecordBatch objects with the same slot values as
 * parse_record_set and _v2_batch set; anything else (a partial tail, a legacy or unknown
 * magic, a short or bad length, a CRC mismatch) gives up before anything is handed out, and
 * the Python parser reads the field from the start and makes the issues. */

static PyObject *g_record_set, *g_record_batch, *g_crc32c, *g_codecs, *g_ts_create, *g_ts_append, *g_limits;
static PyObject *g_zero, *g_two;

enum { LOG_OVERHEAD = 12, V2_HEADER_SIZE = 61 };

#define BATCH_SLOTS(X) X(position) X(size) X(base_offset) X(length) X(partition_leader_epoch) X(magic) \
    X(crc) X(crc_ok) X(attributes) X(codec) X(compression) X(timestamp_type) X(is_transactional) \
    X(is_control) X(has_delete_horizon) X(last_offset_delta) X(base_timestamp) X(max_timestamp) \
    X(producer_id) X(producer_epoch) X(base_sequence) X(record_count) X(issues) X(buffer) X(body_start) \
    X(end) X(limits) X(origin) X(sink) X(reported) X(legacy_key) X(batch_index) X(raw) X(batches)
#define DECLARE(n) static PyObject *s_##n;
BATCH_SLOTS(DECLARE)
#undef DECLARE
/* RecordBatch's own slots (BATCH_SLOTS but raw and batches, which are RecordSet's) */
#define RECORD_BATCH_SLOTS(X) X(position) X(size) X(base_offset) X(length) X(partition_leader_epoch) \
    X(magic) X(crc) X(crc_ok) X(attributes) X(codec) X(compression) X(timestamp_type) X(is_transactional) \
    X(is_control) X(has_delete_horizon) X(last_offset_delta) X(base_timestamp) X(max_timestamp) \
    X(producer_id) X(producer_epoch) X(base_sequence) X(record_count) X(issues) X(buffer) X(body_start) \
    X(end) X(limits) X(origin) X(sink) X(reported) X(legacy_key) X(batch_index)
/* their offsets in a RecordBatch, when every one is a plain object slot (then a new batch's
 * fields are stored in place: 33 setattr calls, with their type and descriptor lookups, were
 * a fifth of a small produce request's decoding); else 0 and setattr is used */
#define OFFSET(n) static Py_ssize_t o_##n;
RECORD_BATCH_SLOTS(OFFSET)
#undef OFFSET
static int g_batch_in_place;
/* RecordSet's slots, with the values its __init__ gives them (raw and size set after), when
 * each is a plain object slot: a set is then made in place (its __init__, run by the
 * interpreter, was ~0.4 us a record set: 400k on a capture of small produces); else 0 */
#define RECORD_SET_SLOTS(X) X(batches) X(issues) X(partial_tail_bytes) X(size) X(raw) X(limits) X(origin) \
    X(allow_partial)
#define SET_OFFSET(n) static Py_ssize_t os_##n;
RECORD_SET_SLOTS(SET_OFFSET)
#undef SET_OFFSET
static int g_set_in_place;

static int intern_names(void)
{
#define INTERN(n) if ((s_##n = PyUnicode_InternFromString(#n)) == NULL) return -1;
    BATCH_SLOTS(INTERN)
#undef INTERN
    return 0;
}

/* obj.name = value, stealing value (NULL: a failed allocation, passed on) */
static int put(PyObject *obj, PyObject *name, PyObject *value)
{
    if (value == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, value);
    Py_DECREF(value);
    return r;
}

static PyObject *configure_records(PyObject *self, PyObject *args)
{
    PyObject *rs, *rb, *crc, *codecs, *create, *append, *limits;
    if (!PyArg_ParseTuple(args, "OO!OO!OOO", &rs, &PyType_Type, &rb, &crc, &PyTuple_Type, &codecs, &create,
                          &append, &limits))
        return NULL;
    if (PyTuple_GET_SIZE(codecs) != 8) {
        PyErr_SetString(PyExc_ValueError, "eight codec names, one per value of the codec bits");
        return NULL;
    }
    if (s_position == NULL && intern_names())
        return NULL;
    Py_XSETREF(g_record_set, Py_NewRef(rs));
    Py_XSETREF(g_record_batch, Py_NewRef(rb));
    g_batch_in_place = 1;
#define RESOLVE(n) if ((o_##n = slot_offset((PyTypeObject *)rb, s_##n)) == 0) g_batch_in_place = 0;
    RECORD_BATCH_SLOTS(RESOLVE)
#undef RESOLVE
    g_set_in_place = PyType_Check(rs);
#define RESOLVE_SET(n) \
    if (g_set_in_place) { \
        PyObject *name = PyUnicode_InternFromString(#n); \
        if (name == NULL) \
            return NULL; \
        os_##n = slot_offset((PyTypeObject *)rs, name); \
        Py_DECREF(name); \
        g_set_in_place = os_##n > 0; \
    }
    RECORD_SET_SLOTS(RESOLVE_SET)
#undef RESOLVE_SET
    Py_XSETREF(g_crc32c, Py_NewRef(crc));
    Py_XSETREF(g_codecs, Py_NewRef(codecs));
    Py_XSETREF(g_ts_create, Py_NewRef(create));
    Py_XSETREF(g_ts_append, Py_NewRef(append));
    Py_XSETREF(g_limits, Py_NewRef(limits));
    if (g_zero == NULL && ((g_zero = PyLong_FromLong(0)) == NULL || (g_two = PyLong_FromLong(2)) == NULL))
        return NULL;
    Py_RETURN_NONE;
}

/* CRC-32C of data[from:to]: in C where the CPU has the instruction (_crc32c.h), else by
 * the same function the Python parser calls; -1: an error */
static int crc_matches(PyObject *data, Py_ssize_t from, Py_ssize_t to, uint32_t stored)
{
    if (crc32c_hw_available())
        return crc32c_hw((const unsigned char *)PyBytes_AS_STRING(data) + from, (size_t)(to - from)) == stored;
    PyObject *view = PyMemoryView_FromMemory(PyBytes_AS_STRING(data) + from, to - from, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(g_crc32c, view);
    Py_DECREF(view);
    if (crc == NULL)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(crc);
    Py_DECREF(crc);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return v == stored;
}

/* a fresh object's empty slot at offset = v (stolen; NULL: a failed allocation, passed on) */
static inline int set_fresh(PyObject *obj, Py_ssize_t offset, PyObject *v)
{
    if (v == NULL)
        return -1;
    *(PyObject **)((char *)obj + offset) = v;
    return 0;
}
#define SETB(n, v) (g_batch_in_place ? set_fresh(b, o_##n, (v)) : put(b, s_##n, (v)))

/* One v2 batch at pos (its size checked to hold the header and fit), as _v2_batch makes it. */
static PyObject *v2_batch(PyObject *data, PyObject *sink, Py_ssize_t pos, int64_t size, Py_ssize_t index)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data) + pos;
    Py_ssize_t end = pos + LOG_OVERHEAD + (Py_ssize_t)size;
    uint32_t crc = (uint32_t)be(p + 17, 4);
    int ok = crc_matches(data, pos + 21, end, crc);
    if (ok != 1)
        return NULL; /* a mismatch is the Python parser's to report */
    unsigned attrs = (unsigned)be(p + 21, 2);
    PyTypeObject *type = (PyTypeObject *)g_record_batch;
    PyObject *b = type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    int codec = attrs & 7;
    if (SETB(position, PyLong_FromSsize_t(pos)) || SETB(size, PyLong_FromLongLong(LOG_OVERHEAD + size))
        || SETB(base_offset, PyLong_FromLongLong(be(p, 8))) || SETB(length, PyLong_FromLongLong(size))
        || SETB(partition_leader_epoch, PyLong_FromLong((int32_t)(uint32_t)be(p + 12, 4)))
        || SETB(magic, Py_NewRef(g_two)) || SETB(crc, PyLong_FromUnsignedLong(crc))
        || SETB(crc_ok, Py_NewRef(Py_True)) || SETB(attributes, PyLong_FromLong(attrs))
        || SETB(codec, PyLong_FromLong(codec))
        || SETB(compression, Py_NewRef(PyTuple_GET_ITEM(g_codecs, codec)))
        || SETB(timestamp_type, Py_NewRef(attrs & 0x08 ? g_ts_append : g_ts_create))
        || SETB(is_transactional, PyBool_FromLong(attrs & 0x10))
        || SETB(is_control, PyBool_FromLong(attrs & 0x20))
        || SETB(has_delete_horizon, PyBool_FromLong(attrs & 0x40))
        || SETB(last_offset_delta, PyLong_FromLong((int32_t)(uint32_t)be(p + 23, 4)))
        || SETB(base_timestamp, PyLong_FromLongLong(be(p + 27, 8)))
        || SETB(max_timestamp, PyLong_FromLongLong(be(p + 35, 8)))
        || SETB(producer_id, PyLong_FromLongLong(be(p + 43, 8)))
        || SETB(producer_epoch, PyLong_FromLong((int16_t)(uint16_t)be(p + 51, 2)))
        || SETB(base_sequence, PyLong_FromLong((int32_t)(uint32_t)be(p + 53, 4)))
        || SETB(record_count, PyLong_FromLong((int32_t)(uint32_t)be(p + 57, 4)))
        || SETB(issues, PyList_New(0)) || SETB(buffer, Py_NewRef(data))
        || SETB(body_start, PyLong_FromSsize_t(pos + V2_HEADER_SIZE)) || SETB(end, PyLong_FromSsize_t(end))
        || SETB(limits, Py_NewRef(g_limits)) || SETB(origin, Py_NewRef(g_zero))
        || SETB(sink, Py_NewRef(sink)) || SETB(reported, Py_NewRef(Py_False))
        || SETB(legacy_key, Py_NewRef(Py_None)) || SETB(batch_index, PyLong_FromSsize_t(index))) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

/* RecordSet() as its __init__ makes it, with raw = data and size = its length, in place */
static PyObject *new_record_set(PyObject *data)
{
    PyTypeObject *type = (PyTypeObject *)g_record_set;
    PyObject *rs = type->tp_alloc(type, 0);
    if (rs == NULL)
        return NULL;
    if (set_fresh(rs, os_batches, PyList_New(0)) || set_fresh(rs, os_issues, PyList_New(0))
        || set_fresh(rs, os_partial_tail_bytes, Py_NewRef(g_zero))
        || set_fresh(rs, os_size, PyLong_FromSsize_t(PyBytes_GET_SIZE(data)))
        || set_fresh(rs, os_raw, Py_NewRef(data)) || set_fresh(rs, os_limits, Py_NewRef(g_limits))
        || set_fresh(rs, os_origin, Py_NewRef(g_zero)) || set_fresh(rs, os_allow_partial, Py_NewRef(Py_True))) {
        Py_DECREF(rs);
        return NULL;
    }
    return rs;
}

/* parse_record_set(data) for data of whole, clean v2 batches; NULL (no error set): not that */
static PyObject *record_set(PyObject *data)
{
    if (g_record_set == NULL)
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, index = 0;
    PyObject *rs = g_set_in_place ? new_record_set(data) : PyObject_CallNoArgs(g_record_set), *batches = NULL,
             *sink = NULL;
    if (rs == NULL)
        return NULL;
    if (!g_set_in_place && (put(rs, s_raw, Py_NewRef(data)) || put(rs, s_size, PyLong_FromSsize_t(n))))
        goto fail;
    batches = GET(rs, s_batches); /* (at their slots: getattr without the lookups) */
    sink = GET(rs, s_issues);
    if (batches == NULL || sink == NULL || !PyList_CheckExact(batches))
        goto fail;
    while (pos < n) {
        Py_ssize_t left = n - pos;
        if (left < LOG_OVERHEAD + 5)
            goto fail; /* a partial entry header */
        int64_t size = (int32_t)(uint32_t)be(b + pos + 8, 4);
        if (b[pos + 16] != 2 || size < V2_HEADER_SIZE - LOG_OVERHEAD || size > left - LOG_OVERHEAD)
            goto fail; /* not v2, too small, or cut */
        PyObject *batch = v2_batch(data, sink, pos, size, index);
        if (batch == NULL)
            goto fail;
        int r = PyList_Append(batches, batch);
        Py_DECREF(batch);
        if (r)
            goto fail;
        pos += LOG_OVERHEAD + (Py_ssize_t)size;
        index++;
    }
    Py_DECREF(batches);
    Py_DECREF(sink);
    return rs;
fail:
    Py_XDECREF(batches);
    Py_XDECREF(sink);
    Py_DECREF(rs);
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear(); /* the Python parser decides, and reports */
    return NULL;
}

/* ---- reading --------------------------------------------------------------------------
 * Every reader returns a new reference, or NULL: "not the clean case" when no exception is
 * set, else the exception (a Python callback's, or a failed allocation). */

/* An unsigned LEB128 varint of at most 5 bytes (fastdecode's inline code + read_uvarint). */
static inline int uvarint(St *s, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (s->pos >= s->L)
            return -1;
        unsigned c = s->b[s->pos++];
        v |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static const char B64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* primitives.uuid_to_str: URL-safe base64 of the 16 bytes, padding stripped (22 chars). */
static PyObject *uuid_str(const unsigned char *p)
{
    char out[24];
    int o = 0;
    for (int i = 0; i < 15; i += 3) {
        uint32_t v = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8) | p[i + 2];
        out[o++] = B64URL[(v >> 18) & 63];
        out[o++] = B64URL[(v >> 12) & 63];
        out[o++] = B64URL[(v >> 6) & 63];
        out[o++] = B64URL[v & 63];
    }
    out[o++] = B64URL[p[15] >> 2];
    out[o++] = B64URL[(p[15] & 3) << 4];
    return PyUnicode_DecodeASCII(out, o, NULL);
}

static const int FIXED[] = {1, 1, 2, 2, 4, 4, 8, 8, 16};

static PyObject *read_fixed(St *s, int op)
{
    int size = FIXED[op];
    if (size > s->L - s->pos)
        return NULL;
    const unsigned char *p = s->b + s->pos;
    s->pos += size;
    switch (op) {
    case OP_BOOL: return PyBool_FromLong(p[0] != 0);
    case OP_INT8: return PyLong_FromLong((int8_t)p[0]);
    case OP_INT16: return PyLong_FromLong((int16_t)(uint16_t)be(p, 2));
    case OP_UINT16: return PyLong_FromLong((long)be(p, 2));
    case OP_INT32: return PyLong_FromLong((int32_t)(uint32_t)be(p, 4));
    case OP_UINT32: return PyLong_FromUnsignedLong((unsigned long)be(p, 4));
    case OP_INT64: return PyLong_FromLongLong((long long)be(p, 8));
    case OP_FLOAT64: {
        uint64_t bits = (uint64_t)be(p, 8);
        double d;
        memcpy(&d, &bits, sizeof d);
        return PyFloat_FromDouble(d);
    }
    default: return uuid_str(p);
    }
}

/* A string, bytes or records value: its length prefix, then the value of the bytes. */
static PyObject *read_sized(St *s, int op, int compact, int nullable)
{
    int64_t n;
    if (compact) { /* uvarint length + 1, 0 = null */
        uint64_t u;
        if (uvarint(s, &u))
            return NULL;
        if (u == 0) {
            if (nullable)
                Py_RETURN_NONE;
            return NULL;
        }
        n = (int64_t)u - 1;
    } else { /* int16 (string) or int32 (bytes, records) length, -1 = null */
        int w = op == OP_STRING ? 2 : 4;
        if (w > s->L - s->pos)
            return NULL;
        n = w == 2 ? (int16_t)(uint16_t)be(s->b + s->pos, 2) : (int32_t)(uint32_t)be(s->b + s->pos, 4);
        s->pos += w;
        if (n < 0) {
            if (n == -1 && nullable)
                Py_RETURN_NONE;
            return NULL;
        }
    }
    if (n > s->L - s->pos)
        return NULL;
    const char *p = (const char *)s->b + s->pos;
    s->pos += n;
    if (op == OP_STRING)
        return PyUnicode_DecodeUTF8(p, n, NULL); /* strict, like bytes.decode() */
    PyObject *raw = PyBytes_FromStringAndSize(p, n);
    if (raw == NULL || op == OP_BYTES)
        return raw;
    PyObject *rs = record_set(raw);
    if (rs == NULL && PyErr_Occurred()) {
        Py_DECREF(raw);
        return NULL;
    }
    if (rs == NULL)
        rs = PyObject_CallOneArg(g_parse_records, raw);
    Py_DECREF(raw);
    return rs;
}

static PyObject *read_struct(St *s, const Node *n, int nullable);
static PyObject *read_array(St *s, const Field *f);

static inline PyObject *read_value(St *s, int op, int compact, int nullable, const Field *f, const Node *child)
{
    if (op <= OP_UUID)
        return read_fixed(s, op);
    if (op <= OP_RECORDS)
        return read_sized(s, op, compact, nullable);
    if (op == OP_STRUCT)
        return read_struct(s, child, nullable);
    return read_array(s, f);
}

static PyObject *read_array(St *s, const Field *f)
{
    int64_t n;
    if (f->compact) {
        uint64_t u;
        if (uvarint(s, &u))
            return NULL;
        if (u == 0) {
            if (f->nullable)
                Py_RETURN_NONE;
            return NULL;
        }
        n = (int64_t)u - 1; /* < 2^35 */
    } else {
        if (4 > s->L - s->pos)
            return NULL;
        n = (int32_t)(uint32_t)be(s->b + s->pos, 4);
        s->pos += 4;
        if (n < 0) {
            if (n == -1 && f->nullable)
                Py_RETURN_NONE;
            return NULL;
        }
    }
    /* n < 2^35 and least <= 2^30: no overflow; the list is no longer than the bytes left */
    if (n * f->least > s->L - s->pos)
        return NULL;
    s->E -= n; /* the reference's element budget (layout.ElementLimit) */
    if (s->E < 0)
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        PyObject *v = read_value(s, f->inner, f->compact, 0, NULL, f->child);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* layout.copy_default: dicts copied all the way down, lists fresh and empty, the rest shared */
static PyObject *fresh_copy(PyObject *v)
{
    if (PyDict_Check(v)) {
        PyObject *d = PyDict_New(), *k, *x;
        Py_ssize_t i = 0;
        if (d == NULL)
            return NULL;
        while (PyDict_Next(v, &i, &k, &x)) {
            PyObject *c = fresh_copy(x);
            if (c == NULL || PyDict_SetItem(d, k, c)) {
                Py_XDECREF(c);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(c);
        }
        return d;
    }
    if (PyList_Check(v))
        return PyList_New(0);
    return Py_NewRef(v);
}

static int set_tagged(St *s, const Node *n, PyObject *d)
{
    if (s->pos >= s->L)
        return -1;
    if (s->b[s->pos] == 0) { /* no tagged fields: the defaults of the absent ones */
        s->pos++;
        for (Py_ssize_t i = 0; i < n->ndefaults; i++) {
            PyObject *c = fresh_copy(n->dvalues[i]);
            if (c == NULL || PyDict_SetItem(d, n->dnames[i], c)) {
                Py_XDECREF(c);
                return -1;
            }
            Py_DECREF(c);
        }
        return 0;
    }
    /* read_tagged(buf, pos, L, table) -> (entries, pos), or raises Bail */
    PyObject *res = PyObject_CallFunction(g_read_tagged, "OLLO", s->bufobj, (long long)s->pos, (long long)s->L,
                                          n->table);
    if (res == NULL)
        return -1;
    int ok = PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2 && PyDict_Check(PyTuple_GET_ITEM(res, 0))
             && PyLong_Check(PyTuple_GET_ITEM(res, 1));
    if (ok) {
        long long pos = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
        ok = pos > s->pos && pos <= s->L; /* else (or an overflow error): not ours to judge */
        if (ok) {
            s->pos = pos;
            ok = PyDict_Update(d, PyTuple_GET_ITEM(res, 0)) == 0;
        }
    }
    Py_DECREF(res);
    return ok ? 0 : -1;
}

static PyObject *read_struct(St *s, const Node *n, int nullable)
{
    if (nullable) { /* int8 presence marker, negative = null */
        if (s->pos >= s->L)
            return NULL;
        if (s->b[s->pos++] > 127)
            Py_RETURN_NONE;
    }
    /* (more than 5 keys: a dict grown one key at a time would be resized on the way) */
    PyObject *d = n->nfields > 5 ? PyDict_Copy(n->tmpl) : PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        const Field *f = &n->fields[i];
        PyObject *v = read_value(s, f->op, f->compact, f->nullable, f, f->child);
        if (v == NULL || PyDict_SetItem(d, n->names[i], v)) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    if (n->flexible && set_tagged(s, n, d)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* NULL from a reader: None (the reference decides), unless the error must not be swallowed
 * (KeyboardInterrupt and the like: not an Exception, which the Python fast path catches). */
static PyObject *give_up(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static Program *program_of(PyObject *capsule, int kind)
{
    Program *p = PyCapsule_GetPointer(capsule, CAPSULE);
    if (p != NULL && p->kind != kind) {
        PyErr_SetString(PyExc_ValueError, "a program of another kind");
        return NULL;
    }
    return p;
}

static int start(St *s, PyObject *buf, const Program *p)
{
    if (!PyBytes_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "the frame must be bytes");
        return -1;
    }
    s->bufobj = buf;
    s->b = (const unsigned char *)PyBytes_AS_STRING(buf);
    s->L = PyBytes_GET_SIZE(buf);
    s->pos = 0;
    s->E = p->budget;
    return 0;
}


/* ---- scanning: the checks of decoding, without the objects --------------------------------
 * scan_request / scan_response read a frame exactly as decode_request / decode_response do
 * (every length, null, UTF-8, element budget, record-set CRC and trailing-byte check is the
 * same, so a frame it accepts is one they decode cleanly, to the same values) but build only
 * the header: of the body they note what the exchange's row and the summary read, as the
 * label walks of stream/labels.py would find it in the decoded body (the topics, in
 * first-seen order; each record set's topic, record count and size; the body's
 * throttle_time_ms and acks), and they give up (None: the caller decodes) wherever those
 * would need more: an error code that is not 0, a record set that is not whole clean v2
 * batches, a topic named by an id, by an empty or null name, or after what it names, a
 * non-empty tagged-field section, a tagged default the notes could not vouch for.  The
 * Message they return is a DeferredMessage (protocol/decode.py), which decodes its body
 * from the frame when something reads it. */

/* at most this many topics and record sets noted (more: decoded), kept in C arrays and
 * handed out as tuples: no list (two allocations each) per message, () when none */
#define MAX_NOTED 16
typedef struct {
    PyObject *topics[MAX_NOTED];  /* str, first seen first, no repeats (owned) */
    PyObject *volumes[MAX_NOTED]; /* (topic, records, bytes), one per record set (owned) */
    Py_ssize_t ntopics, nvolumes;
    PyObject *throttle, *acks;
    PyObject *topic;   /* the enclosing topic element's name (borrowed from topics), or NULL */
} Facts;

/* the first n of items as a tuple (new references) */
static PyObject *tuple_of(PyObject *const *items, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(items[i]));
    return t;
}

enum { SCAN_OK = 0, SCAN_NO = 1 }; /* or -1: an exception */

static int scan_struct(St *s, const Node *n, int nullable, int depth, int in_topic, Facts *fx);
static PyObject *g_last_name; /* the last topic name scanned (ASCII, so its UTF-8 is its data) */

static int note_topic(Facts *fx, PyObject *name)
{
    for (Py_ssize_t i = 0; i < fx->ntopics; i++) {
        PyObject *t = fx->topics[i];
        if (t == name || (PyUnicode_GET_LENGTH(t) == PyUnicode_GET_LENGTH(name) && PyUnicode_Compare(t, name) == 0)) {
            fx->topic = t;
            return 0;
        }
    }
    if (fx->ntopics == MAX_NOTED)
        return SCAN_NO;
    fx->topics[fx->ntopics++] = Py_NewRef(name);
    fx->topic = name;
    return 0;
}

/* whole clean v2 batches, every CRC right (record_set's test): their record count, or -1 */
static int64_t scan_record_set(const unsigned char *b, Py_ssize_t n)
{
    Py_ssize_t pos = 0;
    int64_t count = 0;
    if (g_record_set == NULL || !crc32c_hw_available())
        return -1;
    while (pos < n) {
        Py_ssize_t left = n - pos;
        if (left < LOG_OVERHEAD + 5)
            return -1;
        int64_t size = (int32_t)(uint32_t)be(b + pos + 8, 4);
        if (b[pos + 16] != 2 || size < V2_HEADER_SIZE - LOG_OVERHEAD || size > left - LOG_OVERHEAD)
            return -1;
        Py_ssize_t end = pos + LOG_OVERHEAD + (Py_ssize_t)size;
        if (crc32c_hw(b + pos + 21, (size_t)(end - pos - 21)) != (uint32_t)be(b + pos + 17, 4))
            return -1;
        int64_t records = (int32_t)(uint32_t)be(b + pos + 57, 4);
        count += records > 0 ? records : 0;
        pos = end;
    }
    return count;
}

/* a string's, bytes' or records' length prefix and bytes; *str: the string, when asked */
static int scan_sized(St *s, int op, int compact, int nullable, PyObject **str, Facts *fx)
{
    int64_t n;
    if (compact) {
        uint64_t u;
        if (uvarint(s, &u))
            return SCAN_NO;
        if (u == 0)
            return nullable && str == NULL ? SCAN_OK : SCAN_NO; /* (a null name: not ours) */
        n = (int64_t)u - 1;
    } else {
        int w = op == OP_STRING ? 2 : 4;
        if (w > s->L - s->pos)
            return SCAN_NO;
        n = w == 2 ? (int16_t)(uint16_t)be(s->b + s->pos, 2) : (int32_t)(uint32_t)be(s->b + s->pos, 4);
        s->pos += w;
        if (n < 0)
            return n == -1 && nullable && str == NULL ? SCAN_OK : SCAN_NO;
    }
    if (n > s->L - s->pos)
        return SCAN_NO;
    const unsigned char *p = s->b + s->pos;
    s->pos += n;
    if (op == OP_STRING) {
        int ascii = 1;
        for (int64_t i = 0; i < n && ascii; i++)
            ascii = p[i] < 0x80;
        if (ascii && str == NULL)
            return SCAN_OK;
        /* a topic name: the last one's str again when it is the same (ASCII) text */
        if (ascii && g_last_name != NULL && PyUnicode_GET_LENGTH(g_last_name) == n
            && memcmp(PyUnicode_DATA(g_last_name), p, (size_t)n) == 0) {
            *str = Py_NewRef(g_last_name);
            return SCAN_OK;
        }
        PyObject *u = PyUnicode_DecodeUTF8((const char *)p, n, NULL); /* strict, as decoding */
        if (u == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return -1;
            PyErr_Clear();
            return SCAN_NO;
        }
        if (str != NULL) {
            *str = u;
            if (ascii)
                Py_XSETREF(g_last_name, Py_NewRef(u));
        } else
            Py_DECREF(u);
        return SCAN_OK;
    }
    if (op == OP_BYTES)
        return SCAN_OK;
    int64_t records = scan_record_set(p, (Py_ssize_t)n);
    if (records < 0 || fx->topic == NULL || fx->nvolumes == MAX_NOTED) /* (a record set outside a named topic: not ours) */
        return SCAN_NO;
    PyObject *v = PyTuple_New(3), *count = PyLong_FromLongLong(records), *size = PyLong_FromLongLong(n);
    if (v == NULL || count == NULL || size == NULL) {
        Py_XDECREF(v);
        Py_XDECREF(count);
        Py_XDECREF(size);
        return -1;
    }
    PyTuple_SET_ITEM(v, 0, Py_NewRef(fx->topic));
    PyTuple_SET_ITEM(v, 1, count);
    PyTuple_SET_ITEM(v, 2, size);
    fx->volumes[fx->nvolumes++] = v;
    return SCAN_OK;
}

static int scan_fixed(St *s, const Field *f, int op, int depth, Facts *fx)
{
    int size = FIXED[op];
    if (size > s->L - s->pos)
        return SCAN_NO;
    const unsigned char *p = s->b + s->pos;
    s->pos += size;
    if (f == NULL || f->fact == 0)
        return SCAN_OK;
    int64_t v;
    switch (op) {
    case OP_BOOL: v = p[0] != 0; break;
    case OP_INT8: v = (int8_t)p[0]; break;
    case OP_INT16: v = (int16_t)(uint16_t)be(p, 2); break;
    case OP_UINT16: v = be(p, 2); break;
    case OP_INT32: v = (int32_t)(uint32_t)be(p, 4); break;
    case OP_UINT32: v = be(p, 4); break;
    default: v = be(p, 8); break;
    }
    if ((f->fact & FACT_ERROR) && v != 0)
        return SCAN_NO; /* an error row: decoding makes it */
    if (depth == 0 && (f->fact & (FACT_THROTTLE | FACT_ACKS))) {
        PyObject *o = op == OP_BOOL ? PyBool_FromLong((long)v) : PyLong_FromLongLong(v);
        if (o == NULL)
            return -1;
        Py_XSETREF(*(f->fact & FACT_THROTTLE ? &fx->throttle : &fx->acks), o);
    }
    return SCAN_OK;
}

static int scan_array(St *s, const Field *f, int depth, Facts *fx)
{
    int64_t n;
    if (f->compact) {
        uint64_t u;
        if (uvarint(s, &u))
            return SCAN_NO;
        if (u == 0)
            return f->nullable ? SCAN_OK : SCAN_NO;
        n = (int64_t)u - 1;
    } else {
        if (4 > s->L - s->pos)
            return SCAN_NO;
        n = (int32_t)(uint32_t)be(s->b + s->pos, 4);
        s->pos += 4;
        if (n < 0)
            return n == -1 && f->nullable ? SCAN_OK : SCAN_NO;
    }
    if (n * f->least > s->L - s->pos)
        return SCAN_NO;
    s->E -= n;
    if (s->E < 0)
        return SCAN_NO;
    int in_topic = (f->fact & FACT_TOPIC_ARRAY) != 0;
    for (int64_t i = 0; i < n; i++) {
        int r;
        if (f->inner <= OP_UUID)
            r = scan_fixed(s, NULL, f->inner, depth + 1, fx);
        else if (f->inner <= OP_RECORDS)
            /* a topic array of strings: labels note each string (not ours) */
            r = in_topic && f->inner == OP_STRING ? SCAN_NO : scan_sized(s, f->inner, f->compact, 0, NULL, fx);
        else
            r = scan_struct(s, f->child, 0, depth + 1, in_topic, fx);
        if (r)
            return r;
    }
    return SCAN_OK;
}

static int scan_struct(St *s, const Node *n, int nullable, int depth, int in_topic, Facts *fx)
{
    if (nullable) {
        if (s->pos >= s->L)
            return SCAN_NO;
        if (s->b[s->pos++] > 127)
            return SCAN_OK;
    }
    if (n->unscannable || (in_topic && (n->topic_id || !n->named_first)))
        return SCAN_NO;
    PyObject *outer = fx->topic;
    if (in_topic && n->topic_field < 0)
        fx->topic = NULL; /* an element naming no topic: its record sets have none */
    int r = SCAN_OK;
    for (Py_ssize_t i = 0; i < n->nfields && r == SCAN_OK; i++) {
        const Field *f = &n->fields[i];
        if (f->op <= OP_UUID)
            r = scan_fixed(s, f, f->op, depth, fx);
        else if (f->op <= OP_RECORDS) {
            PyObject *name = NULL;
            int want = in_topic && i == n->topic_field;
            r = scan_sized(s, f->op, f->compact, f->nullable, want ? &name : NULL, fx);
            if (r == SCAN_OK && want) {
                if (PyUnicode_GET_LENGTH(name) == 0) /* (labels skip an empty name: not ours) */
                    r = SCAN_NO;
                else
                    r = note_topic(fx, name);
            }
            Py_XDECREF(name);
        } else if (f->op == OP_STRUCT)
            r = scan_struct(s, f->child, f->nullable, depth + 1, 0, fx);
        else
            r = scan_array(s, f, depth, fx);
    }
    fx->topic = outer;
    if (r)
        return r;
    if (n->flexible) { /* only an empty tagged section: the defaults, vouched for above */
        if (s->pos >= s->L || s->b[s->pos] != 0)
            return SCAN_NO;
        s->pos++;
    }
    return SCAN_OK;
}

static PyTypeObject *g_deferred;
static Py_ssize_t g_deferred_frame, g_deferred_facts;

static PyObject *scan_message(const Program *p, PyObject *buf, PyObject *key, PyObject *version)
{
    St s;
    Facts fx = {0};
    PyObject *h = NULL, *msg = NULL;
    if (g_deferred == NULL || !g_message_in_place) {
        PyErr_SetString(PyExc_RuntimeError, "configure_deferred() first");
        return NULL;
    }
    if (start(&s, buf, p))
        return NULL;
    if ((h = read_struct(&s, p->header, 0)) == NULL) {
        msg = give_up();
        goto done;
    }
    if (p->apiv_check && s.L - s.pos >= 2 && s.b[s.pos] == 0 && s.b[s.pos + 1] == 35) {
        msg = Py_NewRef(Py_None);
        goto done;
    }
    int r = scan_struct(&s, p->body, 0, 0, 0, &fx);
    if (r < 0)
        goto done;
    if (r == SCAN_NO || s.pos != s.L) {
        msg = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *topics = tuple_of(fx.topics, fx.ntopics), *volumes = tuple_of(fx.volumes, fx.nvolumes);
    PyObject *facts = topics == NULL || volumes == NULL ? NULL
                      : PyTuple_Pack(4, topics, volumes, fx.throttle ? fx.throttle : Py_None,
                                     fx.acks ? fx.acks : Py_None);
    Py_XDECREF(topics);
    Py_XDECREF(volumes);
    PyObject *issues = PyList_New(0), *size = PyLong_FromLongLong(s.L);
    if (facts != NULL && issues != NULL && size != NULL && (msg = g_deferred->tp_alloc(g_deferred, 0)) != NULL) {
        /* Message's slots (the body's stays empty: DeferredMessage.body decodes it) */
        PyObject *fields[9] = {p->kind == KIND_REQUEST ? Py_True : Py_False, key, version, h, NULL, issues,
                               Py_None, size, version};
        for (int i = 0; i < 9; i++)
            if (fields[i] != NULL)
                *(PyObject **)((char *)msg + g_message_offsets[i]) = Py_NewRef(fields[i]);
        *(PyObject **)((char *)msg + g_deferred_frame) = Py_NewRef(buf);
        *(PyObject **)((char *)msg + g_deferred_facts) = Py_NewRef(facts);
    }
    Py_XDECREF(facts);
    Py_XDECREF(issues);
    Py_XDECREF(size);
done:
    Py_XDECREF(h);
    for (Py_ssize_t i = 0; i < fx.ntopics; i++)
        Py_DECREF(fx.topics[i]);
    for (Py_ssize_t i = 0; i < fx.nvolumes; i++)
        Py_DECREF(fx.volumes[i]);
    Py_XDECREF(fx.throttle);
    Py_XDECREF(fx.acks);
    if (msg == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        return give_up();
    return msg;
}

static PyObject *scan_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_request(program, frame)");
        return NULL;
    }
    Program *p = program_of(args[0], KIND_REQUEST);
    return p == NULL ? NULL : scan_message(p, args[1], p->key, p->version);
}

static PyObject *scan_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan_response(program, frame, api_key, api_version)");
        return NULL;
    }
    Program *p = program_of(args[0], KIND_RESPONSE);
    return p == NULL ? NULL : scan_message(p, args[1], args[2], args[3]);
}

/* configure_deferred(DeferredMessage): a Message subclass with the slots frame and facts */
static PyObject *configure_deferred(PyObject *self, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)g_message)) {
        PyErr_SetString(PyExc_TypeError, "a subclass of the configured Message");
        return NULL;
    }
    PyObject *frame = PyUnicode_InternFromString("frame"), *facts = PyUnicode_InternFromString("facts");
    if (frame == NULL || facts == NULL) {
        Py_XDECREF(frame);
        Py_XDECREF(facts);
        return NULL;
    }
    g_deferred_frame = slot_offset((PyTypeObject *)cls, frame);
    g_deferred_facts = slot_offset((PyTypeObject *)cls, facts);
    Py_DECREF(frame);
    Py_DECREF(facts);
    if (g_deferred_frame <= 0 || g_deferred_facts <= 0) {
        PyErr_SetString(PyExc_TypeError, "frame and facts must be slots");
        return NULL;
    }
    Py_XSETREF(g_deferred, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* Message(*fields) with its slots set in place (borrowed fields) */
static PyObject *new_message(PyObject *const *fields)
{
    PyTypeObject *type = (PyTypeObject *)g_message;
    PyObject *msg = type->tp_alloc(type, 0);
    if (msg == NULL)
        return NULL;
    for (int i = 0; i < 9; i++)
        *(PyObject **)((char *)msg + g_message_offsets[i]) = Py_NewRef(fields[i]);
    return msg;
}

static PyObject *decode_message(const Program *p, PyObject *buf, PyObject *key, PyObject *version)
{
    St s;
    if (start(&s, buf, p))
        return NULL;
    PyObject *h = read_struct(&s, p->header, 0);
    if (h == NULL)
        return give_up();
    /* an UNSUPPORTED_VERSION ApiVersions response has its own layout: the reference's */
    if (p->apiv_check && s.L - s.pos >= 2 && s.b[s.pos] == 0 && s.b[s.pos + 1] == 35) {
        Py_DECREF(h);
        Py_RETURN_NONE;
    }
    PyObject *body = read_struct(&s, p->body, 0);
    if (body == NULL) {
        Py_DECREF(h);
        return give_up();
    }
    if (s.pos != s.L) {
        Py_DECREF(h);
        Py_DECREF(body);
        Py_RETURN_NONE;
    }
    PyObject *issues = PyList_New(0), *size = PyLong_FromLongLong(s.L), *msg = NULL;
    if (issues != NULL && size != NULL) {
        PyObject *args[9] = {p->kind == KIND_REQUEST ? Py_True : Py_False, key, version, h, body, issues,
                             Py_None, size, version};
        msg = g_message_in_place ? new_message(args) : PyObject_Vectorcall(g_message, args, 9, NULL);
    }
    Py_XDECREF(issues);
    Py_XDECREF(size);
    Py_DECREF(h);
    Py_DECREF(body);
    return msg;
}

static PyObject *decode_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_request(program, frame)");
        return NULL;
    }
    Program *p = program_of(args[0], KIND_REQUEST);
    return p == NULL ? NULL : decode_message(p, args[1], p->key, p->version);
}

static PyObject *decode_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_response(program, frame, api_key, api_version)");
        return NULL;
    }
    Program *p = program_of(args[0], KIND_RESPONSE);
    /* the caller's own key and version objects go into the Message, as in the reference */
    return p == NULL ? NULL : decode_message(p, args[1], args[2], args[3]);
}

static PyObject *decode_struct(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_struct(program, data)");
        return NULL;
    }
    Program *p = program_of(args[0], KIND_STRUCT);
    St s;
    if (p == NULL || start(&s, args[1], p))
        return NULL;
    PyObject *d = read_struct(&s, p->body, 0);
    if (d == NULL)
        return give_up();
    if (s.pos != s.L) {
        Py_DECREF(d);
        Py_RETURN_NONE;
    }
    return d;
}

/* crc32c(data) -> int | None: the C CRC-32C (None where the CPU lacks the instruction and
 * the decoder calls the Python one); for the tests that hold it equal to the crc32c package */
static PyObject *crc32c_c(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (!crc32c_hw_available())
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc32c_hw((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"crc32c", crc32c_c, METH_O,
     "crc32c(data) -> int | None: the decoder's own CRC-32C (None: it calls the Python one)"},
    {"configure", configure, METH_VARARGS,
     "configure(Message, read_tagged, parse_records): the Python objects decoding builds and calls."},
    {"configure_records", configure_records, METH_VARARGS,
     "configure_records(RecordSet, RecordBatch, crc32c, codec_names, TIMESTAMP_CREATE,\n"
     "TIMESTAMP_LOG_APPEND, DEFAULT_LIMITS): what record sets are built from (without it,\n"
     "RECORDS fields go to parse_records)."},
    {"compile", compile_program, METH_O,
     "compile((kind, header, body, apiv_check, api_key, api_version, budget)) -> program"},
    {"decode_request", (PyCFunction)(void (*)(void))decode_request, METH_FASTCALL,
     "decode_request(program, frame) -> Message | None (None: let the reference decode it)"},
    {"decode_response", (PyCFunction)(void (*)(void))decode_response, METH_FASTCALL,
     "decode_response(program, frame, api_key, api_version) -> Message | None"},
    {"decode_struct", (PyCFunction)(void (*)(void))decode_struct, METH_FASTCALL,
     "decode_struct(program, data) -> dict | None"},
    {"scan_request", (PyCFunction)(void (*)(void))scan_request, METH_FASTCALL,
     "scan_request(program, frame) -> DeferredMessage | None (None: decode it)"},
    {"scan_response", (PyCFunction)(void (*)(void))scan_response, METH_FASTCALL,
     "scan_response(program, frame, api_key, api_version) -> DeferredMessage | None"},
    {"configure_deferred", configure_deferred, METH_O,
     "configure_deferred(DeferredMessage): the Message subclass scanning makes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kwinspect.protocol._cdecode",
    "The compiled twin of kwinspect.protocol.fastdecode: a table-driven decoder of clean frames.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__cdecode(void) { return PyModule_Create(&module); }
