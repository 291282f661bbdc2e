/* kwinspect.analyze._crows: the records table's rows of a clean v2 record batch, in C.
 *
 *   v2_rows(data, pos, end, count, max_records, row_type, fields, template, ts, seq, offsets)
 *       -> list of row_type, or None
 *
 * The twin of record_rows._batch_rows over RecordBatch._v2_records for the usual batch:
 * magic 2, not a control batch, keys and values shown in `auto` mode (UTF-8 text when
 * the bytes decode strictly, else base64), a topic that is not an internal one.  The
 * caller (analyze/record_rows.py) checks those; this function checks the records area
 * data[pos:end] (the batch's body, or its decompressed payload) is exactly what the
 * Python decoder reads without a single issue: every varint within its record and
 * its byte limit, every length inside what is left, no null header key, no byte left
 * inside a record or after the last, exactly `count` records and at most
 * `max_records`.  Anything else returns None before any row is made, and the Python
 * generator decodes the batch and alone reports its issues.
 *
 * Rows are made without the dataclass's __init__: the type is allocated and each slot
 * (`fields`: the names, in the order of `template`) set at its member offset.
 * `template` holds every value that is the same for the batch's rows; the per-record
 * ones are filled in (offset, timestamp, key, key_encoding, value, value_encoding,
 * headers, sequence).
 *
 *   ts:      (log_append, max_timestamp, base_timestamp): the record's timestamp is
 *            max_timestamp under log-append time, else base_timestamp + delta (ms;
 *            None stays None); the row's is that / 1000.0
 *   seq:     base sequence (>= 0) or None: the row's sequence is (base + offset delta)
 *            & 0x7FFFFFFF
 *   offsets: (first, skip_below): the row's offset is first + offset delta (None when
 *            first is None); a record whose first + delta is below skip_below (an int) is
 *            left out (Fetch rows before the fetch offset)
 *
 * Hostile input: lengths are checked against the bytes left before anything is read,
 * in 64-bit arithmetic; nothing is allocated from a length field (keys and values are
 * decoded from the data in place); the row count is bounded by max_records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

#include "../_cattrs.h" /* slot_offset */

enum { F_OFFSET = 3, F_TIMESTAMP = 4, F_KEY = 6, F_KEY_ENC = 7, F_VALUE = 8, F_VALUE_ENC = 9, F_HEADERS = 10,
       F_SEQUENCE = 16 };
#define MAX_FIELDS 40

static PyObject *S_utf8, *S_base64, *S_key, *S_value, *S_value_encoding;

/* Zigzag varint of at most max_bytes bytes at *pos, below end: 0, or 1 when the Python
 * decoder would raise (truncated, too long) or the value does not fit in 64 bits. */
static int varint(const unsigned char *d, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, int64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end)
            return 1;
        unsigned char b = d[p++];
        uint64_t bits = (uint64_t)(b & 0x7F);
        if (shift >= 64 || (shift > 57 && (bits >> (64 - shift)) != 0))
            return 1; /* more than 64 bits: Python's int; not the usual record */
        result |= bits << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            *pos = p;
            return 0;
        }
        shift += 7;
    }
    return 1;
}

/* a length-prefixed field: *start and *len (-1 for null); 1 when Python would raise */
static int field(const unsigned char *d, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *start, Py_ssize_t *len)
{
    int64_t n;
    if (varint(d, pos, end, 5, &n))
        return 1;
    if (n < 0) {
        if (n != -1)
            return 1;
        *len = -1;
        *start = *pos;
        return 0;
    }
    if (n > (int64_t)(end - *pos))
        return 1;
    *start = *pos;
    *len = (Py_ssize_t)n;
    *pos += (Py_ssize_t)n;
    return 0;
}

/* One record's layout, as RecordBatch._v2_records reads it */
typedef struct {
    int64_t ts_delta, off_delta, nheaders;
    Py_ssize_t key, key_len, value, value_len, headers; /* headers: position of the first */
} Rec;

static int parse_record(const unsigned char *d, Py_ssize_t *pos, Py_ssize_t end, Rec *r)
{
    int64_t length;
    Py_ssize_t p = *pos;
    if (varint(d, &p, end, 5, &length))
        return 1;
    if (length < 0 || length > (int64_t)(end - p) || length < 1)
        return 1;
    Py_ssize_t rend = p + (Py_ssize_t)length;
    p += 1; /* attributes */
    if (varint(d, &p, rend, 10, &r->ts_delta) || varint(d, &p, rend, 5, &r->off_delta))
        return 1;
    if (field(d, &p, rend, &r->key, &r->key_len) || field(d, &p, rend, &r->value, &r->value_len))
        return 1;
    if (varint(d, &p, rend, 5, &r->nheaders))
        return 1;
    if (r->nheaders < 0 || r->nheaders > (int64_t)((rend - p) / 2))
        return 1;
    r->headers = p;
    for (int64_t i = 0; i < r->nheaders; i++) {
        Py_ssize_t s, n;
        if (field(d, &p, rend, &s, &n) || n < 0) /* a null header key */
            return 1;
        if (field(d, &p, rend, &s, &n))
            return 1;
    }
    if (p != rend)
        return 1; /* unread bytes inside the record: a warning Python makes */
    *pos = p;
    return 0;
}

/* render_bytes(data, "auto"): (text, "utf8") when it decodes strictly, else base64 */
static int render_auto(const unsigned char *d, Py_ssize_t start, Py_ssize_t len, PyObject **text, PyObject **enc)
{
    if (len < 0) {
        *text = Py_NewRef(Py_None);
        *enc = Py_NewRef(Py_None);
        return 0;
    }
    *text = PyUnicode_DecodeUTF8((const char *)d + start, len, NULL);
    if (*text != NULL) {
        *enc = Py_NewRef(S_utf8);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        return -1;
    PyErr_Clear();
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    Py_ssize_t out_len = ((len + 2) / 3) * 4;
    PyObject *s = PyUnicode_New(out_len, 127);
    if (s == NULL)
        return -1;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(s);
    const unsigned char *r = d + start;
    Py_ssize_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = ((uint32_t)r[i] << 16) | ((uint32_t)r[i + 1] << 8) | r[i + 2];
        *w++ = alphabet[v >> 18];
        *w++ = alphabet[(v >> 12) & 63];
        *w++ = alphabet[(v >> 6) & 63];
        *w++ = alphabet[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)r[i] << 16;
        *w++ = alphabet[v >> 18];
        *w++ = alphabet[(v >> 12) & 63];
        *w++ = '=';
        *w++ = '=';
    } else if (len - i == 2) {
        uint32_t v = ((uint32_t)r[i] << 16) | ((uint32_t)r[i + 1] << 8);
        *w++ = alphabet[v >> 18];
        *w++ = alphabet[(v >> 12) & 63];
        *w++ = alphabet[(v >> 6) & 63];
        *w++ = '=';
    }
    *text = s;
    *enc = Py_NewRef(S_base64);
    return 0;
}

/* [{"key": ..., "value": ..., "value_encoding": ...}] of a record's headers */
static PyObject *headers_of(const unsigned char *d, const Rec *r, Py_ssize_t end)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    Py_ssize_t p = r->headers;
    for (int64_t i = 0; i < r->nheaders; i++) {
        Py_ssize_t ks, kn, vs, vn;
        if (field(d, &p, end, &ks, &kn) || field(d, &p, end, &vs, &vn)) { /* checked before */
            Py_DECREF(list);
            PyErr_SetString(PyExc_RuntimeError, "v2_rows: a header changed under the walk");
            return NULL;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)d + ks, kn, "replace");
        PyObject *text = NULL, *enc = NULL, *h = NULL;
        if (key == NULL || render_auto(d, vs, vn, &text, &enc) < 0 || (h = PyDict_New()) == NULL
            || PyDict_SetItem(h, S_key, key) < 0 || PyDict_SetItem(h, S_value, text) < 0
            || PyDict_SetItem(h, S_value_encoding, enc) < 0 || PyList_Append(list, h) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(text);
            Py_XDECREF(enc);
            Py_XDECREF(h);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(text);
        Py_DECREF(enc);
        Py_DECREF(h);
    }
    return list;
}

/* member offsets of row_type's slots named in `fields`, cached for the last type */
static PyTypeObject *cached_type;
static PyObject *cached_fields;
static Py_ssize_t offsets[MAX_FIELDS];

static int resolve(PyTypeObject *type, PyObject *fields)
{
    if (type == cached_type && fields == cached_fields)
        return 0;
    Py_CLEAR(cached_type); /* the offsets below are rewritten: no type owns them until they all are */
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        offsets[i] = slot_offset(type, PyTuple_GET_ITEM(fields, i));
        if (offsets[i] <= 0) {
            PyErr_Format(PyExc_TypeError, "v2_rows: %R is not a slot of %s", PyTuple_GET_ITEM(fields, i),
                         type->tp_name);
            return -1;
        }
    }
    Py_XSETREF(cached_fields, Py_NewRef(fields));
    cached_type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    return 0;
}

/* a new row: every slot from vals (new references are taken) */
static PyObject *make_row(PyTypeObject *type, PyObject **vals, Py_ssize_t n)
{
    PyObject *row = type->tp_alloc(type, 0);
    if (row == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **slot = (PyObject **)((char *)row + offsets[i]);
        Py_XSETREF(*slot, Py_NewRef(vals[i]));
    }
    return row;
}

static int as_i64(PyObject *o, int64_t *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        return 1;
    *out = v;
    return 0;
}

static PyObject *v2_rows(PyObject *self, PyObject *args)
{
    PyObject *data, *fields, *template, *ts, *seq, *offs;
    Py_ssize_t pos, end, count, max_records;
    PyTypeObject *type;
    if (!PyArg_ParseTuple(args, "O!nnnnO!O!O!O!OO!", &PyBytes_Type, &data, &pos, &end, &count, &max_records,
                          &PyType_Type, &type, &PyTuple_Type, &fields, &PyTuple_Type, &template, &PyTuple_Type, &ts,
                          &seq, &PyTuple_Type, &offs))
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    if (nf != PyTuple_GET_SIZE(template) || nf > MAX_FIELDS || nf <= F_SEQUENCE || PyTuple_GET_SIZE(ts) != 3
        || PyTuple_GET_SIZE(offs) != 2 || pos < 0 || end < pos || end > PyBytes_GET_SIZE(data)) {
        PyErr_SetString(PyExc_ValueError, "v2_rows: bad arguments");
        return NULL;
    }
    if (resolve(type, fields) < 0)
        return NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    int log_append = PyObject_IsTrue(PyTuple_GET_ITEM(ts, 0));
    if (log_append < 0)
        return NULL;
    PyObject *max_ts = PyTuple_GET_ITEM(ts, 1), *base_ts_o = PyTuple_GET_ITEM(ts, 2);
    PyObject *first_o = PyTuple_GET_ITEM(offs, 0), *skip_o = PyTuple_GET_ITEM(offs, 1);
    int64_t base_ts = 0, base_seq = 0, first = 0, skip = 0;
    int r;
    if (!log_append && base_ts_o != Py_None && (r = PyLong_Check(base_ts_o) ? as_i64(base_ts_o, &base_ts) : 1) != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if (seq != Py_None && (r = PyLong_Check(seq) ? as_i64(seq, &base_seq) : 1) != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if (first_o != Py_None && (r = PyLong_Check(first_o) ? as_i64(first_o, &first) : 1) != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if (skip_o != Py_None && (r = PyLong_Check(skip_o) ? as_i64(skip_o, &skip) : 1) != 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    if (count < 0 || (log_append && max_ts != Py_None && !PyLong_Check(max_ts)))
        return Py_NewRef(Py_None);

    /* the walk: is this the batch the Python decoder reads without an issue? */
    Py_ssize_t p = pos, found = 0;
    Rec rec;
    while (found < count && p < end) {
        if (found >= max_records || parse_record(d, &p, end, &rec))
            return Py_NewRef(Py_None);
        int64_t v;
        if (!log_append && base_ts_o != Py_None && __builtin_add_overflow(base_ts, rec.ts_delta, &v))
            return Py_NewRef(Py_None);
        if (first_o != Py_None && __builtin_add_overflow(first, rec.off_delta, &v))
            return Py_NewRef(Py_None);
        found++;
    }
    if (found < count || p < end)
        return Py_NewRef(Py_None); /* records missing, or bytes after the last: reported by Python */

    /* the rows */
    PyObject *rows = PyList_New(0);
    if (rows == NULL)
        return NULL;
    PyObject *vals[MAX_FIELDS];
    for (Py_ssize_t i = 0; i < nf; i++)
        vals[i] = PyTuple_GET_ITEM(template, i);
    PyObject *fixed_ts = NULL;
    if (log_append) {
        if (max_ts == Py_None)
            fixed_ts = Py_NewRef(Py_None);
        else {
            double m = PyLong_AsDouble(max_ts);
            if (m == -1.0 && PyErr_Occurred())
                goto fail;
            fixed_ts = PyFloat_FromDouble(m / 1000.0);
            if (fixed_ts == NULL)
                goto fail;
        }
    }
    p = pos;
    for (Py_ssize_t i = 0; i < found; i++) {
        if (parse_record(d, &p, end, &rec)) {
            PyErr_SetString(PyExc_RuntimeError, "v2_rows: a record changed under the walk");
            goto fail;
        }
        if (skip_o != Py_None && first + rec.off_delta < skip)
            continue;
        PyObject *offset = NULL, *tsv = NULL, *key = NULL, *kenc = NULL, *value = NULL, *venc = NULL,
                 *headers = NULL, *sequence = NULL, *row = NULL;
        offset = first_o == Py_None ? Py_NewRef(Py_None) : PyLong_FromLongLong(first + rec.off_delta);
        if (offset == NULL)
            goto row_fail;
        if (log_append)
            tsv = Py_NewRef(fixed_ts);
        else if (base_ts_o == Py_None)
            tsv = Py_NewRef(Py_None);
        else
            tsv = PyFloat_FromDouble((double)(base_ts + rec.ts_delta) / 1000.0);
        if (tsv == NULL || render_auto(d, rec.key, rec.key_len, &key, &kenc) < 0
            || render_auto(d, rec.value, rec.value_len, &value, &venc) < 0)
            goto row_fail;
        headers = rec.nheaders ? headers_of(d, &rec, end) : PyList_New(0);
        if (headers == NULL)
            goto row_fail;
        sequence = seq == Py_None ? Py_NewRef(Py_None) : PyLong_FromLongLong((base_seq + rec.off_delta) & 0x7FFFFFFF);
        if (sequence == NULL)
            goto row_fail;
        vals[F_OFFSET] = offset;
        vals[F_TIMESTAMP] = tsv;
        vals[F_KEY] = key;
        vals[F_KEY_ENC] = kenc;
        vals[F_VALUE] = value;
        vals[F_VALUE_ENC] = venc;
        vals[F_HEADERS] = headers;
        vals[F_SEQUENCE] = sequence;
        row = make_row(type, vals, nf);
        if (row == NULL || PyList_Append(rows, row) < 0)
            goto row_fail;
        Py_DECREF(row);
        Py_DECREF(offset);
        Py_DECREF(tsv);
        Py_DECREF(key);
        Py_DECREF(kenc);
        Py_DECREF(value);
        Py_DECREF(venc);
        Py_DECREF(headers);
        Py_DECREF(sequence);
        continue;
    row_fail:
        Py_XDECREF(row);
        Py_XDECREF(offset);
        Py_XDECREF(tsv);
        Py_XDECREF(key);
        Py_XDECREF(kenc);
        Py_XDECREF(value);
        Py_XDECREF(venc);
        Py_XDECREF(headers);
        Py_XDECREF(sequence);
        goto fail;
    }
    Py_XDECREF(fixed_ts);
    return rows;
fail:
    Py_XDECREF(fixed_ts);
    Py_DECREF(rows);
    return NULL;
}

static PyMethodDef methods[] = {
    {"v2_rows", v2_rows, METH_VARARGS,
     "v2_rows(data, pos, end, count, max_records, row_type, fields, template, ts, seq, offsets) -> "
     "rows of a clean v2 record batch, or None (the Python decoder's)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__crows(void)
{
    if ((S_utf8 = PyUnicode_InternFromString("utf8")) == NULL
        || (S_base64 = PyUnicode_InternFromString("base64")) == NULL
        || (S_key = PyUnicode_InternFromString("key")) == NULL
        || (S_value = PyUnicode_InternFromString("value")) == NULL
        || (S_value_encoding = PyUnicode_InternFromString("value_encoding")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
