/* tshark's tcp.stream numbers in ~40 bytes per 4-tuple: the compiled twin of
 * capture/tcp.py's TcpStreamNumbers (same methods, same answers; tests/capture/
 * test_stream_numbers.py compares the two on random and real sequences).
 *
 * TcpStreamNumbers keeps one packed int per 4-tuple in a dict, ~150 bytes each with
 * the key; a flood of a million SYNs from distinct clients made that 150 MB. Here a
 * 4-tuple is one 32-byte entry in an array (its key inline up to 16 bytes: an IPv4
 * pair; an IPv6 pair's 36 bytes in a block of their own), found through an
 * open-addressing index of uint32 (CPython's dict layout, without per-entry objects):
 * ~40 MB for a million. Entries are never removed (tshark never forgets a 4-tuple);
 * at most max_streams of them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define SYN 0x02
#define ACK 0x10
#define KEY_MAX 36   /* two IPv6 addresses and two ports */
#define KEY_INLINE 16 /* two IPv4 addresses and two ports fit */

typedef struct {
    uint32_t num;     /* stream number + 1; 0: beyond max_streams */
    uint32_t base[2]; /* each side's base sequence number (valid when its seen bit is set) */
    uint8_t seen;     /* bit 0: side 0 seen, bit 1: side 1 seen */
    uint8_t klen;
    union {
        uint8_t in[KEY_INLINE];
        uint8_t *ext; /* klen > KEY_INLINE: PyMem_Malloc'd */
    } k;
} Entry; /* 32 bytes */

static inline const uint8_t *key_of(const Entry *en) {
    return en->klen > KEY_INLINE ? en->k.ext : en->k.in;
}

typedef struct {
    PyObject_HEAD
    Entry *entries;
    Py_ssize_t used, cap;  /* entries in use / allocated */
    uint32_t *index;       /* 0: empty, else entry index + 1 */
    size_t mask;           /* index size - 1 (a power of two) */
    long long count;       /* streams numbered so far */
    long long max_streams;
} StreamNumbers;

static uint64_t hash_key(const uint8_t *k, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a, then a final mix */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return h;
}

/* the slot of the index where key is, or where it would go (index[slot] == 0) */
static size_t find_slot(StreamNumbers *self, const uint8_t *k, Py_ssize_t n) {
    size_t i = (size_t)hash_key(k, n) & self->mask;
    for (;;) {
        uint32_t e = self->index[i];
        if (e == 0)
            return i;
        Entry *en = &self->entries[e - 1];
        if (en->klen == n && memcmp(key_of(en), k, (size_t)n) == 0)
            return i;
        i = (i + 1) & self->mask;
    }
}

static int grow_index(StreamNumbers *self) {
    size_t size = (self->mask + 1) * 2;
    uint32_t *index = PyMem_Calloc(size, sizeof(uint32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->index);
    self->index = index;
    self->mask = size - 1;
    for (Py_ssize_t j = 0; j < self->used; j++) {
        Entry *en = &self->entries[j];
        size_t i = find_slot(self, key_of(en), en->klen);
        index[i] = (uint32_t)(j + 1);
    }
    return 0;
}

/* a new entry for key at index slot `slot` (from find_slot), or NULL with an exception */
static Entry *add_entry(StreamNumbers *self, size_t slot, const uint8_t *k, Py_ssize_t n) {
    if (self->used == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 1024;
        if (cap > self->max_streams + 1)
            cap = (Py_ssize_t)self->max_streams + 1;
        if (cap <= self->used)
            cap = self->used + 1;
        Entry *entries = PyMem_Realloc(self->entries, (size_t)cap * sizeof(Entry));
        if (entries == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->entries = entries;
        self->cap = cap;
    }
    Entry *en = &self->entries[self->used];
    memset(en, 0, sizeof(Entry));
    if (n > KEY_INLINE) {
        en->k.ext = PyMem_Malloc((size_t)n);
        if (en->k.ext == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        memcpy(en->k.ext, k, (size_t)n);
    } else {
        memcpy(en->k.in, k, (size_t)n);
    }
    en->klen = (uint8_t)n;
    self->index[slot] = (uint32_t)(++self->used);
    if ((size_t)self->used * 3 >= (self->mask + 1) * 2) { /* keep the index at most 2/3 full */
        if (grow_index(self) < 0)
            return NULL;
        en = &self->entries[self->used - 1];
    }
    return en;
}

static PyObject *number_of(uint32_t num) {
    if (num == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(num - 1);
}

static int get_seq(PyObject *o, uint32_t *out) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (v > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "a sequence number has 32 bits");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* see(key, side, flags, seq): TcpStreamNumbers.see */
static PyObject *sn_see(StreamNumbers *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "see(key, side, flags, seq)");
        return NULL;
    }
    PyObject *key = args[0];
    if (self->index == NULL) {
        PyErr_SetString(PyExc_ValueError, "StreamNumbers not initialised");
        return NULL;
    }
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "see: the key must be bytes");
        return NULL;
    }
    long side = PyLong_AsLong(args[1]);
    if (side == -1 && PyErr_Occurred())
        return NULL;
    long flags = PyLong_AsLong(args[2]);
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    uint32_t seq;
    if (get_seq(args[3], &seq) < 0)
        return NULL;
    if (side != 0 && side != 1) {
        PyErr_SetString(PyExc_ValueError, "see: side is 0 or 1");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    if (n > KEY_MAX) {
        PyErr_SetString(PyExc_ValueError, "see: a key has at most 36 bytes (capture.tcp.pair_key)");
        return NULL;
    }
    const uint8_t *k = (const uint8_t *)PyBytes_AS_STRING(key);
    const uint32_t base = (flags & SYN) ? seq : seq - 1; /* (seq - 1) & 0xFFFFFFFF */
    const uint8_t bit = (uint8_t)(1 << side);
    size_t slot = find_slot(self, k, n);
    Entry *en;
    if (self->index[slot]) {
        en = &self->entries[self->index[slot] - 1];
        if (!(en->seen & bit)) {
            en->seen |= bit;
            en->base[side] = base;
            return number_of(en->num);
        }
        if ((flags & (SYN | ACK)) != SYN || seq == en->base[side])
            return number_of(en->num);
    } else {
        if (self->used >= self->max_streams)
            Py_RETURN_NONE;
        en = add_entry(self, slot, k, n);
        if (en == NULL)
            return NULL;
    }
    /* the first packet of a 4-tuple, or a new connection on one tshark already knows */
    uint32_t num = 0;
    if (self->count < self->max_streams)
        num = (uint32_t)(++self->count); /* number + 1 */
    en->num = num;
    en->seen = bit;
    en->base[0] = en->base[1] = 0;
    en->base[side] = base;
    return number_of(num);
}

/* knows_direction(key, rkey): TcpStreamNumbers.knows_direction */
static PyObject *sn_knows_direction(StreamNumbers *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "knows_direction(key: bytes, rkey: bytes)");
        return NULL;
    }
    PyObject *key = args[0], *rkey = args[1];
    if (self->index == NULL)
        Py_RETURN_FALSE;
    Py_ssize_t n = PyBytes_GET_SIZE(key), rn = PyBytes_GET_SIZE(rkey);
    int c = memcmp(PyBytes_AS_STRING(key), PyBytes_AS_STRING(rkey), (size_t)(n < rn ? n : rn));
    int le = c < 0 || (c == 0 && n <= rn);
    PyObject *which = le ? key : rkey;
    Py_ssize_t wn = le ? n : rn;
    if (wn > KEY_MAX)
        Py_RETURN_FALSE; /* (see never takes one) */
    size_t slot = find_slot(self, (const uint8_t *)PyBytes_AS_STRING(which), wn);
    if (!self->index[slot])
        Py_RETURN_FALSE;
    Entry *en = &self->entries[self->index[slot] - 1];
    return PyBool_FromLong(en->seen & (le ? 1 : 2));
}

static PyObject *sn_known(StreamNumbers *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(self->used);
}

static void free_entries(StreamNumbers *self) {
    for (Py_ssize_t j = 0; j < self->used; j++)
        if (self->entries[j].klen > KEY_INLINE)
            PyMem_Free(self->entries[j].k.ext);
    PyMem_Free(self->entries);
    self->entries = NULL;
    self->used = self->cap = 0;
}

static int sn_init(StreamNumbers *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_streams", NULL};
    long long max_streams = 1000000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L", kwlist, &max_streams))
        return -1;
    if (max_streams < 0 || max_streams >= (1LL << 21) - 1) {
        PyErr_SetString(PyExc_ValueError, "max_streams must be below 2097151");
        return -1;
    }
    free_entries(self);
    PyMem_Free(self->index);
    self->index = PyMem_Calloc(1024, sizeof(uint32_t));
    if (self->index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = 1023;
    self->count = 0;
    self->max_streams = max_streams;
    return 0;
}

static void sn_dealloc(StreamNumbers *self) {
    free_entries(self);
    PyMem_Free(self->index);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef sn_methods[] = {
    {"see", (PyCFunction)(void (*)(void))sn_see, METH_FASTCALL,
     "see(key, side, flags, seq): the stream number of this packet (None beyond max_streams)"},
    {"knows_direction", (PyCFunction)(void (*)(void))sn_knows_direction, METH_FASTCALL,
     "knows_direction(key, rkey): True when the direction key has been seen"},
    {"known", (PyCFunction)sn_known, METH_NOARGS, "known(): how many 4-tuples are remembered"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sn_members[] = {
    {"count", T_LONGLONG, offsetof(StreamNumbers, count), 0, "streams numbered so far"},
    {"max_streams", T_LONGLONG, offsetof(StreamNumbers, max_streams), READONLY, "4-tuples remembered at most"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StreamNumbersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kwinspect.capture._cstreams.StreamNumbers",
    .tp_basicsize = sizeof(StreamNumbers),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "tshark's tcp.stream numbers, compactly (capture.tcp.TcpStreamNumbers' twin)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sn_init,
    .tp_dealloc = (destructor)sn_dealloc,
    .tp_methods = sn_methods,
    .tp_members = sn_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cstreams", "tcp.stream numbers in compact entries (capture/tcp.py's twin)", -1, NULL,
};

PyMODINIT_FUNC PyInit__cstreams(void) {
    if (PyType_Ready(&StreamNumbersType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StreamNumbersType);
    if (PyModule_AddObject(m, "StreamNumbers", (PyObject *)&StreamNumbersType) < 0) {
        Py_DECREF(&StreamNumbersType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
