/* kwinspect.run._csplit: the compiled routing loop of the --jobs reader (run/split.py).
 *
 *   split_chunk(state, chunk, limit, next_check, shadow_next, file_offset)
 *       -> (plain records taken, RawPacket | None, last plain timestamp | None, file offset)
 *
 * It walks the pcap records of a RecordChunk (readers.py) and takes, without any Python
 * per packet, the "plain" ones: the common Ethernet/IPv4/TCP packet (the header test of
 * Splitter.run) of a connection whose owner, tcp.stream number and decision are already
 * known (owners, numbers and decided hold the 12-byte 4-tuple keys), not a SYN, and with no
 * idle check due (its time below next_check and below the shadow's next check).  Each is
 * copied as it is (record header and data) to its worker's record buffer (unless `records`
 * is None: the workers read the file themselves, at the records' file offsets), its tcp.stream
 * number (-1 for None) to the worker's number buffer (native int32), and its captured length
 * added to the worker's load.  Consecutive packet numbers of one worker make one run,
 * appended to that worker's item list as (TAG_RUN, first packet, count, byte offset, first
 * record, bytes) when it ends (the worker feeds a run to its Dissector's compiled packet loop
 * in one call); the byte offset is into the worker's record buffer, or the file's.  Every run
 * is ended before returning, so items the caller appends later come after.  `file_offset` is
 * the file offset of the chunk's record at chunk.pos; the one after the records taken is
 * returned.
 *
 * The first record that is not plain (and is wholly in the buffer) is taken too and
 * returned as the RawPacket the reader would have made of it: the caller routes it with its
 * Python code.  At most `limit` records are taken.  The chunk's counters (pos, index,
 * bytes, truncated, ts) are kept exactly as for the RawPackets the records stand for.
 *
 * state = (owners: dict, numbers: dict, decided: set, load: list | None, records: list of
 *          bytearray | None, nums: list of bytearray, items: list of list, RawPacket, TAG_RUN)
 *
 * Hostile input: lengths are checked against the bytes present (as scan_pcap does); an owner
 * that is not a worker number, or a number that is not a small int, makes the packet
 * not plain (Python judges it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t rd32(const unsigned char *p, int big)
{
    if (big)
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

static PyObject *S_buf, *S_pos, *S_layout, *S_index, *S_bytes_captured, *S_bytes_wire, *S_truncated, *S_ts;

static int get_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

/* end worker w's open run: append (TAG_RUN, first, count, offset, first record) to its items */
static int end_run(PyObject *state, Py_ssize_t w, long long *run)
{
    if (run[1] == 0)
        return 0;
    PyObject *items = PyList_GET_ITEM(PyTuple_GET_ITEM(state, 6), w);
    PyObject *t = Py_BuildValue("(OLLLLL)", PyTuple_GET_ITEM(state, 8), run[0], run[1], run[2], run[3], run[4]);
    if (t == NULL)
        return -1;
    int r = PyList_Append(items, t);
    Py_DECREF(t);
    run[1] = 0;
    return r;
}

#define MAX_JOBS 256
#define SEEN 4 /* connections remembered per call */

static PyObject *split_chunk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 9) {
        PyErr_SetString(PyExc_TypeError, "split_chunk(state, chunk, limit, next_check, shadow_next, file_offset)");
        return NULL;
    }
    PyObject *state = args[0], *chunk = args[1];
    PyObject *owners = PyTuple_GET_ITEM(state, 0), *numbers = PyTuple_GET_ITEM(state, 1);
    PyObject *decided = PyTuple_GET_ITEM(state, 2), *load = PyTuple_GET_ITEM(state, 3);
    PyObject *records = PyTuple_GET_ITEM(state, 4), *nums = PyTuple_GET_ITEM(state, 5);
    PyObject *items = PyTuple_GET_ITEM(state, 6), *raw_type = PyTuple_GET_ITEM(state, 7);
    if (!PyDict_CheckExact(owners) || !PyDict_CheckExact(numbers) || !PyAnySet_CheckExact(decided)
        || (records != Py_None && !PyList_CheckExact(records)) || !PyList_CheckExact(nums) || !PyList_CheckExact(items)
        || !PyType_Check(raw_type) || (load != Py_None && !PyList_CheckExact(load))) {
        PyErr_SetString(PyExc_TypeError, "split_chunk: bad state");
        return NULL;
    }
    Py_ssize_t jobs = PyList_GET_SIZE(nums);
    if (jobs < 1 || jobs > MAX_JOBS || (records != Py_None && PyList_GET_SIZE(records) != jobs)
        || PyList_GET_SIZE(items) != jobs
        || (load != Py_None && PyList_GET_SIZE(load) != jobs)) {
        PyErr_SetString(PyExc_ValueError, "split_chunk: one buffer, number buffer and item list per worker");
        return NULL;
    }
    for (Py_ssize_t w = 0; w < jobs; w++) {
        if ((records != Py_None && !PyByteArray_CheckExact(PyList_GET_ITEM(records, w)))
            || !PyByteArray_CheckExact(PyList_GET_ITEM(nums, w))
            || !PyList_CheckExact(PyList_GET_ITEM(items, w))) {
            PyErr_SetString(PyExc_TypeError, "split_chunk: records and nums are bytearrays, items lists");
            return NULL;
        }
    }
    long long limit = PyLong_AsLongLong(args[2]), file_off = PyLong_AsLongLong(args[5]);
    double next_check = PyFloat_AsDouble(args[3]), shadow_next = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *layout = PyObject_GetAttr(chunk, S_layout);
    if (layout == NULL)
        return NULL;
    if (!PyTuple_CheckExact(layout) || PyTuple_GET_SIZE(layout) != 5) {
        Py_DECREF(layout);
        PyErr_SetString(PyExc_TypeError, "split_chunk: chunk.layout must be a 5-tuple");
        return NULL;
    }
    long fmt = PyLong_AsLong(PyTuple_GET_ITEM(layout, 0)), big = PyLong_AsLong(PyTuple_GET_ITEM(layout, 1));
    long nano = PyLong_AsLong(PyTuple_GET_ITEM(layout, 2)), rec_len = PyLong_AsLong(PyTuple_GET_ITEM(layout, 3));
    PyObject *linktype = PyTuple_GET_ITEM(layout, 4);
    long lt = PyLong_AsLong(linktype);
    if (PyErr_Occurred() || fmt != 0 || rec_len < 16 || rec_len > 64) {
        Py_DECREF(layout);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "split_chunk: pcap records only");
        return NULL;
    }
    PyObject *buf = PyObject_GetAttr(chunk, S_buf);
    Py_buffer view = {0};
    int have_view = 0;
    long long pos, index, cap_total, wire_total, trunc_total;
    /* the last connections looked up in this call (no Python runs during it, so the dicts
     * cannot change): most packets are of one of a few busy connections */
    struct {
        unsigned char key[12];
        long w;
        long long number;
        int plain;
    } seen[SEEN];
    int n_seen = 0, next_seen = 0;
    long long load_add[MAX_JOBS];
    memset(load_add, 0, sizeof(long long) * (size_t)jobs);
    PyObject *result = NULL, *raw = NULL, *last_ts = NULL, *chunk_ts = NULL, *key = NULL;
    long long runs[MAX_JOBS][5]; /* per worker: first packet, count, byte offset, first record, bytes */
    memset(runs, 0, sizeof(long long) * 5 * (size_t)jobs);
    if (buf == NULL || get_ll(chunk, S_pos, &pos) < 0 || get_ll(chunk, S_index, &index) < 0
        || get_ll(chunk, S_bytes_captured, &cap_total) < 0 || get_ll(chunk, S_bytes_wire, &wire_total) < 0
        || get_ll(chunk, S_truncated, &trunc_total) < 0)
        goto done;
    /* bytes, or the map of the whole file (readers.py records(mapped=True)) */
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0)
        goto done;
    have_view = 1;
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "split_chunk: the chunk's position must be inside its buffer");
        goto done;
    }
    const unsigned char *b = (const unsigned char *)view.buf;
    const Py_ssize_t blen = view.len;
    const double div = nano ? 1e9 : 1e6;
    long long taken = 0;
    double last_plain = 0.0;
    int any_plain = 0, failed = 0;
    while (taken < limit) {
        const unsigned char *h = b + pos;
        if (blen - pos < rec_len)
            break;
        uint32_t sec = rd32(h, big & 1), frac = rd32(h + 4, big & 1), caplen = rd32(h + 8, big & 1);
        uint64_t wire = rd32(h + 12, big & 1);
        if ((uint64_t)caplen > (uint64_t)(blen - pos - rec_len))
            break; /* runs past the buffer: the reader refills or reports */
        const unsigned char *d = h + rec_len;
        const double ts = (double)sec + (double)frac / div; /* readers.py: sec + frac / div */
        const long long rec_off = file_off;
        pos += rec_len + (long long)caplen;
        file_off += rec_len + (long long)caplen;
        index++;
        cap_total += caplen;
        if (wire != caplen) {
            if (wire > caplen)
                trunc_total++;
            else /* some writers leave orig_len 0 */
                wire = caplen;
        }
        wire_total += (long long)wire;
        taken++;
        /* Splitter.run's header test for the common packet */
        Py_ssize_t n = (Py_ssize_t)caplen, w = -1;
        long long number = 0;
        int plain = 0;
        if (lt == 1 && n >= 54 && d[12] == 8 && d[13] == 0 && d[14] == 0x45 && d[23] == 6
            && !((d[20] & 0x3F) || d[21]) && !(d[47] & 0x02) && ts < next_check && ts < shadow_next) {
            unsigned total = ((unsigned)d[16] << 8) | d[17], hl = (unsigned)(d[46] >> 4) * 4;
            if (total >= 40 && (Py_ssize_t)total <= n - 14 && hl >= 20 && hl + 20 <= total) {
                int hit = -1;
                for (int i = 0; i < n_seen; i++) {
                    if (memcmp(seen[i].key, d + 26, 12) == 0) {
                        hit = i;
                        break;
                    }
                }
                if (hit >= 0) {
                    if (seen[hit].plain) {
                        w = seen[hit].w;
                        number = seen[hit].number;
                        plain = 1;
                    }
                    goto looked_up;
                }
                key = PyBytes_FromStringAndSize((const char *)d + 26, 12);
                if (key == NULL) {
                    failed = 1;
                    break;
                }
                PyObject *owner = PyDict_GetItemWithError(owners, key); /* borrowed */
                PyObject *num = owner == NULL ? NULL : PyDict_GetItemWithError(numbers, key);
                int dec = num == NULL ? 0 : PySet_Contains(decided, key);
                if (PyErr_Occurred() || dec < 0) {
                    failed = 1;
                    break;
                }
                if (dec && PyLong_CheckExact(owner) && (num == Py_None || PyLong_CheckExact(num))) {
                    long ow = PyLong_AsLong(owner);
                    long long nv = num == Py_None ? -1 : PyLong_AsLongLong(num);
                    if (PyErr_Occurred()) {
                        PyErr_Clear();
                    } else if (ow >= 0 && ow < jobs && nv >= -1 && nv <= INT32_MAX) {
                        w = ow;
                        number = nv;
                        plain = 1;
                    }
                }
                Py_CLEAR(key);
                memcpy(seen[next_seen].key, d + 26, 12);
                seen[next_seen].w = w;
                seen[next_seen].number = number;
                seen[next_seen].plain = plain;
                next_seen = (next_seen + 1) % SEEN;
                if (n_seen < SEEN)
                    n_seen++;
            }
        }
    looked_up:
        if (!plain) { /* the caller's Python routes it */
            PyObject *data = PyBytes_FromStringAndSize((const char *)d, n);
            if (data == NULL) {
                failed = 1;
                break;
            }
            PyObject *it[5] = {PyFloat_FromDouble(ts), linktype, data, PyLong_FromUnsignedLongLong(wire),
                               PyLong_FromLongLong(index)};
            Py_INCREF(linktype);
            PyTypeObject *type = (PyTypeObject *)raw_type;
            raw = type->tp_alloc(type, 5);
            if (raw == NULL) {
                for (int i = 0; i < 5; i++)
                    Py_XDECREF(it[i]);
                failed = 1;
                break;
            }
            for (int i = 0; i < 5; i++) {
                if (it[i] == NULL)
                    failed = 1;
                PyTuple_SET_ITEM(raw, i, it[i]);
            }
            chunk_ts = PyFloat_FromDouble(ts);
            if (chunk_ts == NULL)
                failed = 1;
            break;
        }
        PyObject *recs = records == Py_None ? NULL : PyList_GET_ITEM(records, w), *nb = PyList_GET_ITEM(nums, w);
        Py_ssize_t off = recs == NULL ? (Py_ssize_t)rec_off : PyByteArray_GET_SIZE(recs);
        Py_ssize_t nrec = PyByteArray_GET_SIZE(nb) / 4;
        long long *run = runs[w];
        if (run[1] != 0 && recs == NULL && run[2] + run[4] != (long long)off) { /* (a record between) */
            if (end_run(state, w, run) < 0) {
                failed = 1;
                break;
            }
        }
        if (run[1] != 0 && run[0] + run[1] != index) { /* not the next packet: a new run */
            if (end_run(state, w, run) < 0) {
                failed = 1;
                break;
            }
        }
        if (run[1] == 0) {
            run[0] = index;
            run[2] = off;
            run[3] = nrec;
            run[4] = 0;
        }
        int32_t nv32 = (int32_t)number;
        if ((recs != NULL && PyByteArray_Resize(recs, off + rec_len + n) < 0)
            || PyByteArray_Resize(nb, (nrec + 1) * 4) < 0) {
            failed = 1;
            break;
        }
        if (recs != NULL)
            memcpy(PyByteArray_AS_STRING(recs) + off, h, (size_t)(rec_len + n));
        run[4] += rec_len + n;
        memcpy(PyByteArray_AS_STRING(nb) + nrec * 4, &nv32, 4);
        run[1]++;
        load_add[w] += n;
        last_plain = ts;
        any_plain = 1;
    }
    for (Py_ssize_t w = 0; w < jobs; w++) {
        if (end_run(state, w, runs[w]) < 0)
            failed = 1;
        if (load != Py_None && load_add[w] && !failed) { /* the worker's load, added once per call */
            PyObject *old = PyList_GET_ITEM(load, w);
            PyObject *add = PyLong_FromLongLong(load_add[w]);
            PyObject *sum = add == NULL ? NULL : PyNumber_Add(old, add);
            Py_XDECREF(add);
            if (sum == NULL) {
                failed = 1;
            } else {
                PyList_SET_ITEM(load, w, sum);
                Py_DECREF(old);
            }
        }
    }
    if (!failed) {
        if (chunk_ts == NULL && any_plain)
            chunk_ts = PyFloat_FromDouble(last_plain);
        if (set_ll(chunk, S_pos, pos) < 0 || set_ll(chunk, S_index, index) < 0
            || set_ll(chunk, S_bytes_captured, cap_total) < 0 || set_ll(chunk, S_bytes_wire, wire_total) < 0
            || set_ll(chunk, S_truncated, trunc_total) < 0
            || (chunk_ts != NULL && PyObject_SetAttr(chunk, S_ts, chunk_ts) < 0))
            failed = 1;
    }
    if (!failed) {
        last_ts = any_plain ? PyFloat_FromDouble(last_plain) : Py_NewRef(Py_None);
        if (last_ts != NULL)
            result = Py_BuildValue("(LOOL)", taken - (raw != NULL), raw != NULL ? raw : Py_None, last_ts, file_off);
    }
done:
    Py_XDECREF(key);
    Py_XDECREF(raw);
    Py_XDECREF(last_ts);
    Py_XDECREF(chunk_ts);
    if (have_view)
        PyBuffer_Release(&view);
    Py_XDECREF(buf);
    Py_DECREF(layout);
    return result;
}

/* gather(buffer, spans) -> bytes: the spans ((offset, length) pairs) of buffer, one after the
 * other: a worker's runs out of the map of the capture file, copied once (the runs of the
 * other workers between them are not read). */
static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "gather(buffer, spans: list of (offset, length))");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *spans = args[1], *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(spans), total = 0;
    for (int pass = 0; pass < 2; pass++) { /* sizes and bounds first, then the copy */
        char *dst = pass ? PyBytes_AS_STRING(out) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *t = PyList_GET_ITEM(spans, i);
            long long off, len;
            if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
                PyErr_SetString(PyExc_TypeError, "gather: each span is (offset, length)");
                goto fail;
            }
            off = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
            len = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
            if (PyErr_Occurred())
                goto fail;
            if (off < 0 || len < 0 || off > view.len || len > view.len - off) {
                PyErr_SetString(PyExc_ValueError, "gather: a span outside the buffer");
                goto fail;
            }
            if (pass) {
                memcpy(dst, (const char *)view.buf + off, (size_t)len);
                dst += len;
            } else {
                total += (Py_ssize_t)len;
            }
        }
        if (!pass && (out = PyBytes_FromStringAndSize(NULL, total)) == NULL)
            goto fail;
    }
    PyBuffer_Release(&view);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(buffer, spans) -> bytes: the (offset, length) spans of buffer, one after the other."},
    {"split_chunk", (PyCFunction)(void (*)(void))split_chunk, METH_FASTCALL,
     "split_chunk(state, chunk, limit, next_check, shadow_next) -> (plain records taken,\n"
     "RawPacket | None, last plain timestamp | None): see the module's source."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csplit", "The --jobs reader's routing loop.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__csplit(void)
{
    if ((S_buf = PyUnicode_InternFromString("buf")) == NULL || (S_pos = PyUnicode_InternFromString("pos")) == NULL
        || (S_layout = PyUnicode_InternFromString("layout")) == NULL
        || (S_index = PyUnicode_InternFromString("index")) == NULL
        || (S_bytes_captured = PyUnicode_InternFromString("bytes_captured")) == NULL
        || (S_bytes_wire = PyUnicode_InternFromString("bytes_wire")) == NULL
        || (S_truncated = PyUnicode_InternFromString("truncated")) == NULL
        || (S_ts = PyUnicode_InternFromString("ts")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
