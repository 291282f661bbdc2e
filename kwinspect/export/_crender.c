/* One table row to its JSON line, in C: the compiled core's row renderer.
 *
 * export/writers.py generates, per column tuple, a Python function ("fast") that turns a
 * row's values into exactly the line the general path (normalize_row + the json encoder)
 * writes. JsonlRow does the same work for the values it knows (exact str, int, float,
 * bool, None, bytes; timestamps as floats inside years 1..9999; lists of those and of
 * record-header dicts) and hands the whole row to that Python function for anything else,
 * so the two cannot differ: the Python function stays the reference, and
 * tests/export/test_crender.py compares them.
 *
 * The text rules copied here, each from the Python it must equal:
 * - strings: json.encoder.encode_basestring (ensure_ascii=False): '"' and '\\' escaped,
 *   \b \f \n \r \t by name, other characters below 0x20 as \u00xx (lowercase hex),
 *   everything else as it is. A string that is not valid UTF-8 text (lone surrogates,
 *   from bytes decoded with surrogateescape) sends the row to Python, whose writer
 *   escapes them its own way;
 * - ints: int.__repr__; floats: float.__repr__ (PyOS_double_to_string 'r'), non-finite
 *   as null; bytes: their hex digits in quotes;
 * - timestamps: round(v * 1e6) (half to even, as Python's round), floor-divided into
 *   seconds and microseconds, the proleptic Gregorian date of the seconds as
 *   YYYY-MM-DDTHH:MM:SS, then .ffffffZ.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "../_cattrs.h" /* slot_offset */

#define MAX_BOUND 64 /* columns line_of reads from a row's slots */

/* column kinds: must match _crender_kinds in export/writers.py */
enum { K_SCALAR = 0, K_TIMESTAMP = 1, K_LIST = 2 };

/* the open range of epoch seconds the Python fast path renders inline
 * (writers._MIN_US // 1e6 + 1, writers._MAX_US // 1e6 - 1); the rest goes to Python */
#define TS_LOW (-62135596800.0 + 1.0)
#define TS_HIGH (253402300799.0 - 1.0)

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    int ascii; /* every byte written so far is below 0x80 */
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (!data) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

/* room for `count` items of `each` bytes plus `extra`, the product checked for overflow */
static int reserve(Buf *b, Py_ssize_t count, Py_ssize_t each, Py_ssize_t extra) {
    if (count > (PY_SSIZE_T_MAX - extra - b->len) / each) {
        PyErr_NoMemory();
        return -1;
    }
    return buf_grow(b, count * each + extra);
}

static int put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, lit) put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

static const char HEX[] = "0123456789abcdef";

/* the bytes a byte adds when escaped in a JSON string: 0 for most, 1 for '"', '\\' and
 * the controls with a name (\b \f \n \r \t), 5 for the other controls (\u00xx) */
static unsigned char ESCAPE_EXTRA[256];

static void init_escape_table(void) {
    for (int i = 0; i < 256; i++) {
        if (i == '"' || i == '\\' || i == '\b' || i == '\f' || i == '\n' || i == '\r' || i == '\t')
            ESCAPE_EXTRA[i] = 1;
        else
            ESCAPE_EXTRA[i] = i < 0x20 ? 5 : 0;
    }
}

/* 1 when one of the 8 bytes at s needs escaping ('"', '\\', or a control below 0x20): the
 * word tests of "Bit Twiddling Hacks" (hasless, haszero), exact as yes/no answers, so the
 * usual text is scanned and copied 8 bytes at a time */
static inline int word_needs_escape(const unsigned char *s) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t w, q, bs;
    memcpy(&w, s, 8);
    q = w ^ (ones * '"');
    bs = w ^ (ones * '\\');
    return (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & highs ? 1 : 0;
}

/* s[0:n] (UTF-8) as a JSON string, quotes included */
static int put_escaped(Buf *b, const unsigned char *s, Py_ssize_t n) {
    /* the exact size first: reserving the worst case (6 bytes a byte) for a long value
     * would grow the row buffer, which is kept between rows, far past the row */
    Py_ssize_t extra = 2, i = 0;
    for (; i + 8 <= n; i += 8)
        if (word_needs_escape(s + i))
            for (int j = 0; j < 8; j++)
                extra += ESCAPE_EXTRA[s[i + j]];
    for (; i < n; i++)
        extra += ESCAPE_EXTRA[s[i]];
    if (reserve(b, n, 1, extra) < 0)
        return -1;
    char *o = b->data + b->len;
    *o++ = '"';
    if (extra == 2) { /* nothing to escape */
        memcpy(o, s, (size_t)n);
        o += n;
        *o++ = '"';
        b->len = o - b->data;
        return 0;
    }
    for (i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (!(i & 7) && i + 8 <= n && !word_needs_escape(s + i)) {
            memcpy(o, s + i, 8);
            o += 8;
            i += 7;
            continue;
        }
        if (!ESCAPE_EXTRA[c]) {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            *o++ = 'u'; *o++ = '0'; *o++ = '0';
            *o++ = HEX[c >> 4]; *o++ = HEX[c & 15];
        }
    }
    *o++ = '"';
    b->len = o - b->data;
    return 0;
}

/* 1: written; 0: not a value this renderer knows (the row goes to Python); -1: error */
static int put_str(Buf *b, PyObject *v) {
    if (PyUnicode_IS_ASCII(v))
        return put_escaped(b, (const unsigned char *)PyUnicode_DATA(v), PyUnicode_GET_LENGTH(v)) < 0 ? -1 : 1;
    PyObject *utf8 = PyUnicode_AsUTF8String(v);
    if (!utf8) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) { /* lone surrogates */
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    b->ascii = 0;
    int rc = put_escaped(b, (const unsigned char *)PyBytes_AS_STRING(utf8), PyBytes_GET_SIZE(utf8));
    Py_DECREF(utf8);
    return rc < 0 ? -1 : 1;
}

/* the decimal digits of x at o; returns the end (snprintf's "%llu" without its cost:
 * vfprintf was 4% of `exchanges` on a capture of small produces) */
static char *digits(char *o, unsigned long long x) {
    char t[20];
    int n = 0;
    do {
        t[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    while (n)
        *o++ = t[--n];
    return o;
}

/* v (0..99) as two digits */
static char *two(char *o, unsigned v) {
    *o++ = (char)('0' + v / 10);
    *o++ = (char)('0' + v % 10);
    return o;
}

static int put_int(Buf *b, PyObject *v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (!overflow) {
        char tmp[32], *o = tmp;
        unsigned long long u = (unsigned long long)x;
        if (x < 0) {
            *o++ = '-';
            u = 0 - u; /* LLONG_MIN too */
        }
        o = digits(o, u);
        return put(b, tmp, o - tmp) < 0 ? -1 : 1;
    }
    PyObject *text = PyLong_Type.tp_repr(v);
    if (!text)
        return -1;
    int rc = put(b, (const char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text));
    Py_DECREF(text);
    return rc < 0 ? -1 : 1;
}

static int put_float(Buf *b, double d) {
    if (!isfinite(d))
        return PUT_LIT(b, "null") < 0 ? -1 : 1;
    /* repr of a value with at most 3 decimals (latencies are rounded to them), without the
     * shortest-digits search (2,000 instructions a value): when d is exactly the double
     * nearest the decimal k/1000 (k/1000.0 is that, correctly rounded), that decimal reads
     * back as d, and below 1e11 (an ulp under 0.0001) no other decimal of at most 3 decimals
     * does, nor any shorter one: it is repr's digits, in repr's fixed notation (0.001 <=
     * |d| < 1e16), trailing zeros dropped but one ("12.0").  Zero and the rest: repr. */
    if (d != 0.0 && d > -1e11 && d < 1e11) {
        double scaled = d * 1000.0;
        long long k = llround(scaled);
        if (k != 0 && (double)k / 1000.0 == d) {
            if (reserve(b, 1, 32, 0) < 0)
                return -1;
            char *o = b->data + b->len;
            unsigned long long m = k < 0 ? (unsigned long long)(-k) : (unsigned long long)k;
            if (k < 0)
                *o++ = '-';
            o = digits(o, m / 1000);
            *o++ = '.';
            unsigned f = (unsigned)(m % 1000);
            *o++ = (char)('0' + f / 100);
            if (f % 100) {
                *o++ = (char)('0' + f / 10 % 10);
                if (f % 10)
                    *o++ = (char)('0' + f % 10);
            }
            b->len = o - b->data;
            return 1;
        }
    }
    char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text)
        return -1;
    int rc = put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc < 0 ? -1 : 1;
}

/* writers._j_scalar, with the generated code's str/int/None tests in front */
static int put_scalar(Buf *b, PyObject *v) {
    if (PyUnicode_CheckExact(v))
        return put_str(b, v);
    if (PyLong_CheckExact(v))
        return put_int(b, v);
    if (v == Py_None)
        return PUT_LIT(b, "null") < 0 ? -1 : 1;
    if (PyFloat_CheckExact(v))
        return put_float(b, PyFloat_AS_DOUBLE(v));
    if (v == Py_True)
        return PUT_LIT(b, "true") < 0 ? -1 : 1;
    if (v == Py_False)
        return PUT_LIT(b, "false") < 0 ? -1 : 1;
    if (PyBytes_CheckExact(v)) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(v);
        if (reserve(b, n, 2, 2) < 0)
            return -1;
        char *o = b->data + b->len;
        *o++ = '"';
        for (Py_ssize_t i = 0; i < n; i++) {
            *o++ = HEX[s[i] >> 4];
            *o++ = HEX[s[i] & 15];
        }
        *o++ = '"';
        b->len = o - b->data;
        return 1;
    }
    return 0;
}

static int64_t floor_div(int64_t a, int64_t d) {
    int64_t q = a / d;
    return (a % d != 0 && ((a < 0) != (d < 0))) ? q - 1 : q;
}

/* days since 1970-01-01 -> proleptic Gregorian y/m/d (H. Hinnant's civil_from_days) */
static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const unsigned doe = (unsigned)(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* the generated code's inline timestamp, or 0 for what it hands to writers._j_ts */
static int put_timestamp(Buf *b, PyObject *v) {
    if (v == Py_None)
        return PUT_LIT(b, "null") < 0 ? -1 : 1;
    if (!PyFloat_CheckExact(v))
        return 0;
    double t = PyFloat_AS_DOUBLE(v);
    if (!(TS_LOW < t && t < TS_HIGH))
        return 0;
    int64_t us = (int64_t)nearbyint(t * 1000000.0); /* half to even, as round() */
    int64_t seconds = floor_div(us, 1000000);
    int64_t micros = us - seconds * 1000000;
    int64_t days = floor_div(seconds, 86400);
    int64_t sod = seconds - days * 86400;
    int64_t year;
    unsigned month, day;
    civil_from_days(days, &year, &month, &day);
    char tmp[48];
    /* "YYYY-MM-DDTHH:MM:SS.ffffffZ", quoted, digit by digit (TS_LOW..TS_HIGH: years 1-9999) */
    char *o = tmp;
    *o++ = '"';
    o = two(o, (unsigned)(year / 100));
    o = two(o, (unsigned)(year % 100));
    *o++ = '-';
    o = two(o, month);
    *o++ = '-';
    o = two(o, day);
    *o++ = 'T';
    o = two(o, (unsigned)(sod / 3600));
    *o++ = ':';
    o = two(o, (unsigned)(sod / 60 % 60));
    *o++ = ':';
    o = two(o, (unsigned)(sod % 60));
    *o++ = '.';
    o = two(o, (unsigned)(micros / 10000));
    o = two(o, (unsigned)(micros / 100 % 100));
    o = two(o, (unsigned)(micros % 100));
    *o++ = 'Z';
    *o++ = '"';
    return put(b, tmp, o - tmp) < 0 ? -1 : 1;
}

/* writers._j_header: {"key": .., "value": .., "value_encoding": ..} */
static PyObject *HEADER_KEYS[3]; /* "key", "value", "value_encoding", interned at import */

static int put_header(Buf *b, PyObject *h) {
    static const char *lead[3] = {"{\"key\": ", ", \"value\": ", ", \"value_encoding\": "};
    for (int i = 0; i < 3; i++) {
        if (put(b, lead[i], (Py_ssize_t)strlen(lead[i])) < 0)
            return -1;
        PyObject *v = PyDict_GetItemWithError(h, HEADER_KEYS[i]); /* borrowed; NULL: absent */
        if (!v && PyErr_Occurred())
            return -1;
        int rc = put_scalar(b, v ? v : Py_None);
        if (rc <= 0)
            return rc;
    }
    return PUT_LIT(b, "}") < 0 ? -1 : 1;
}

/* writers._j_list */
static int put_list(Buf *b, PyObject *v) {
    if (v == Py_None)
        return PUT_LIT(b, "null") < 0 ? -1 : 1;
    if (!PyList_CheckExact(v))
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (PUT_LIT(b, "[") < 0)
        return -1;
    int headers = n > 0 && PyDict_CheckExact(PyList_GET_ITEM(v, 0));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && PUT_LIT(b, ", ") < 0)
            return -1;
        PyObject *item = PyList_GET_ITEM(v, i);
        int rc;
        if (headers)
            rc = PyDict_CheckExact(item) ? put_header(b, item) : 0;
        else
            rc = put_scalar(b, item);
        if (rc <= 0)
            return rc;
    }
    return PUT_LIT(b, "]") < 0 ? -1 : 1;
}

/* the row buffer a renderer keeps between rows, at most (a bigger one is freed after its row) */
#define KEEP_BYTES (1 << 20)

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    unsigned char *kinds;
    PyObject *prefixes; /* tuple of str (ASCII): '{"col": ' then ', "col": ' ... */
    PyObject *suffix;   /* str (ASCII): '}' or '}\n' */
    PyObject *fallback; /* the generated Python function, for rows this one hands on */
    Buf buf;
    PyTypeObject *bound; /* line_of's row type (bind), or NULL */
    Py_ssize_t *offsets; /* the member offset of each column in it */
} JsonlRow;

static void JsonlRow_dealloc(JsonlRow *self) {
    PyMem_Free(self->kinds);
    PyMem_Free(self->buf.data);
    Py_XDECREF(self->prefixes);
    Py_XDECREF(self->suffix);
    Py_XDECREF(self->fallback);
    Py_XDECREF((PyObject *)self->bound);
    PyMem_Free(self->offsets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ascii_str(PyObject *s) {
    return PyUnicode_CheckExact(s) && PyUnicode_IS_ASCII(s);
}

static int JsonlRow_init(JsonlRow *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kinds", "prefixes", "suffix", "fallback", NULL};
    Py_buffer kinds;
    PyObject *prefixes, *suffix, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*O!UO:JsonlRow", kwlist, &kinds, &PyTuple_Type, &prefixes,
                                     &suffix, &fallback))
        return -1;
    int ok = 0;
    Py_ssize_t n = kinds.len;
    if (PyTuple_GET_SIZE(prefixes) != n || !ascii_str(suffix) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_ValueError, "JsonlRow: one ASCII prefix per kind, an ASCII suffix, a callable");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char k = ((unsigned char *)kinds.buf)[i];
        if (!ascii_str(PyTuple_GET_ITEM(prefixes, i)) || k > K_LIST) {
            PyErr_SetString(PyExc_ValueError, "JsonlRow: a prefix is not ASCII text or a kind is unknown");
            goto done;
        }
    }
    unsigned char *copy = PyMem_Malloc(n ? (size_t)n : 1);
    if (!copy) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(copy, kinds.buf, (size_t)n);
    PyMem_Free(self->kinds);
    self->kinds = copy;
    self->ncols = n;
    Py_INCREF(prefixes);
    Py_XSETREF(self->prefixes, prefixes);
    Py_INCREF(suffix);
    Py_XSETREF(self->suffix, suffix);
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    ok = 1;
done:
    PyBuffer_Release(&kinds);
    return ok ? 0 : -1;
}

/* The line of items[0:n] (the values in column order); NULL with an exception, or
 * Py_None (a borrowed marker, not a line) when a value is one the C does not render. */
static PyObject *render_items(JsonlRow *self, PyObject **items, Py_ssize_t n) {
    Buf *b = &self->buf;
    b->len = 0;
    b->ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *prefix = PyTuple_GET_ITEM(self->prefixes, i);
        if (put(b, (const char *)PyUnicode_DATA(prefix), PyUnicode_GET_LENGTH(prefix)) < 0)
            return NULL;
        int rc;
        switch (self->kinds[i]) {
        case K_TIMESTAMP: rc = put_timestamp(b, items[i]); break;
        case K_LIST: rc = put_list(b, items[i]); break;
        default: rc = put_scalar(b, items[i]);
        }
        if (rc < 0)
            return NULL;
        if (rc == 0)
            return Py_None;
    }
    if (put(b, (const char *)PyUnicode_DATA(self->suffix), PyUnicode_GET_LENGTH(self->suffix)) < 0)
        return NULL;
    PyObject *line;
    if (b->ascii) {
        line = PyUnicode_New(b->len, 127);
        if (line)
            memcpy(PyUnicode_DATA(line), b->data, (size_t)b->len);
    } else {
        line = PyUnicode_DecodeUTF8(b->data, b->len, "strict");
    }
    if (b->cap > KEEP_BYTES) { /* one huge row: its buffer is not kept for the next ones */
        PyMem_Free(b->data);
        b->data = NULL;
        b->len = b->cap = 0;
    }
    return line;
}

static PyObject *JsonlRow_call(JsonlRow *self, PyObject *args, PyObject *kwds) {
    PyObject *vals;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "JsonlRow takes one positional argument");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "JsonlRow", 1, 1, &vals))
        return NULL;
    if (!self->kinds) {
        PyErr_SetString(PyExc_ValueError, "JsonlRow was not initialised");
        return NULL;
    }
    if ((PyTuple_CheckExact(vals) || PyList_CheckExact(vals)) && PySequence_Fast_GET_SIZE(vals) == self->ncols) {
        PyObject *line = render_items(self, PySequence_Fast_ITEMS(vals), self->ncols);
        if (line != Py_None)
            return line;
    }
    return PyObject_CallOneArg(self->fallback, vals);
}

/* bind(row_type, names): line_of renders row_type's instances straight from their slots
 * (names: the column of each kind, in order; every one a slot of row_type) */
static PyObject *JsonlRow_bind(JsonlRow *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyTuple_Type, &names))
        return NULL;
    if (!self->kinds || PyTuple_GET_SIZE(names) != self->ncols) {
        PyErr_SetString(PyExc_ValueError, "JsonlRow.bind: one name per column of an initialised renderer");
        return NULL;
    }
    Py_ssize_t *offsets = PyMem_Malloc(self->ncols ? (size_t)self->ncols * sizeof(Py_ssize_t) : 1);
    if (!offsets)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        offsets[i] = slot_offset(type, PyTuple_GET_ITEM(names, i));
        if (offsets[i] <= 0) {
            PyMem_Free(offsets);
            PyErr_Format(PyExc_TypeError, "JsonlRow.bind: %R is not a slot of %s", PyTuple_GET_ITEM(names, i),
                         type->tp_name);
            return NULL;
        }
    }
    PyMem_Free(self->offsets);
    self->offsets = offsets;
    Py_INCREF(type);
    Py_XSETREF(self->bound, type);
    Py_RETURN_NONE;
}

/* line_of(row): the line of a row of the bound type, read from its slots; None for any
 * other object or a slot not set (the caller's general path then renders or raises) */
static PyObject *JsonlRow_line_of(JsonlRow *self, PyObject *row) {
    if (self->bound == NULL || Py_TYPE(row) != self->bound)
        Py_RETURN_NONE;
    PyObject *items[MAX_BOUND];
    Py_ssize_t n = self->ncols;
    if (n > MAX_BOUND)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = *(PyObject **)((char *)row + self->offsets[i]);
        if (items[i] == NULL)
            Py_RETURN_NONE;
    }
    PyObject *line = render_items(self, items, n);
    if (line != Py_None)
        return line;
    /* a value the C does not render: the generated function, with the values in a tuple */
    PyObject *vals = PyTuple_New(n);
    if (!vals)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(vals, i, items[i]);
    }
    line = PyObject_CallOneArg(self->fallback, vals);
    Py_DECREF(vals);
    return line;
}

static PyMethodDef JsonlRow_methods[] = {
    {"bind", (PyCFunction)JsonlRow_bind, METH_VARARGS,
     "bind(row_type, names): line_of renders row_type's instances from these slots"},
    {"line_of", (PyCFunction)JsonlRow_line_of, METH_O,
     "line_of(row) -> the line of a row of the bound type, or None for anything else"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject JsonlRowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kwinspect.export._crender.JsonlRow",
    .tp_doc = "JsonlRow(kinds, prefixes, suffix, fallback): values in column order -> the row's JSON line "
              "(fallback(values) for values it does not render)",
    .tp_basicsize = sizeof(JsonlRow),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)JsonlRow_init,
    .tp_dealloc = (destructor)JsonlRow_dealloc,
    .tp_call = (ternaryfunc)JsonlRow_call,
    .tp_methods = JsonlRow_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kwinspect.export._crender",
    "Table rows to JSON lines in C (the compiled core; writers.py's generated functions are the reference).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__crender(void) {
    init_escape_table();
    static const char *header_keys[3] = {"key", "value", "value_encoding"};
    for (int i = 0; i < 3; i++)
        if (!HEADER_KEYS[i] && !(HEADER_KEYS[i] = PyUnicode_InternFromString(header_keys[i])))
            return NULL;
    if (PyType_Ready(&JsonlRowType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&JsonlRowType);
    if (PyModule_AddObject(m, "JsonlRow", (PyObject *)&JsonlRowType) < 0) {
        Py_DECREF(&JsonlRowType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
