/* kwinspect._cdriver: the compiled per-segment path of the driver (dissect.py).
 *
 *   segment(state, seg, packets) -> None | True | connection state
 *
 * The C twin of what one in-order TCP segment of an established Kafka connection costs in
 * Python: Dissector.feed_segment -> TcpReassembler.feed (its inlined in-order branch) ->
 * Dissector._on_data -> FrameSplitter.feed (its fast path, the start of a frame the
 * payload does not complete, the branch that sets aside a chunk inside a frame of known
 * size, and _complete, which ends such a frame).  The Python objects keep all the state; this
 * function reads the fields those methods read, decides, and writes the fields they
 * write, with the same values.  `state` is (dissector, reassembler, deque, Frame,
 * FrameSplitter), made once by the Dissector.
 *
 * Two phases.  The first reads every field the segment will touch and checks that it is
 * the ordinary case: no SYN/FIN/RST, a known connection whose direction has started, the
 * next expected byte, nothing buffered out of order on either side, no FIN or ack-gap
 * timer pending, a decided plaintext Kafka connection, and a splitter in sync that either
 * holds nothing (the payload: whole frames, then perhaps the start of one), or holds a
 * frame's start and pieces set aside (the payload extends or ends that frame; the rest
 * as if fed on its own).  Anything else returns None before
 * anything changed, and the Python code takes the segment exactly as it always did: it
 * alone handles gaps, retransmissions, out-of-order data, closes, detection, TLS, resync,
 * and it alone makes issues.  The second phase writes; it fails only when memory does.
 *
 * Returns None (declined: nothing changed), True (done, no frame ready), or the
 * connection's state object when its splitter has events ready: the caller hands them to
 * the conversation (Dissector._frames_to_conversation) and checks the idle timer, as the
 * Python path does at that point.
 *
 * Hostile input: the payload's size prefixes are read only inside the payload, in 64-bit
 * arithmetic, against the splitter's max_frame_size; frames are slices of the payload
 * (nothing allocated from a length field); every integer read from the objects is taken
 * as a 64-bit value and any overflow declines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>
#include "capture/_cparse.h"

#define FIN 0x01
#define SYN 0x02
#define RST 0x04
#define ACK 0x10

static PyObject *S_stats, *S_tcp_packets, *S_last_ts_d, *S_packets, *S_kafka_bytes, *S_hot_pair,
    *S_hot_info, *S_conn_by_tuple, *S_hot_cid, *S_hot_conn, *S_conns, *S_dirty, *S_segments,
    *S_hot_a, *S_hot_b, *S_hot_ab, *S_hot_ba, *S_dirs, *S_last_conn, *S_data_sink, *S_max_window,
    *S_overlap_check_bytes, *S_buffered_total, *S_max_total_buffered, *S_last_ts, *S_cid, *S_st,
    *S_started, *S_nxt, *S_ooo_s, *S_max_end, *S_recent, *S_recent_bytes, *S_fin_at, *S_hole_since,
    *S_peer_ack, *S_payload_bytes, *S_delivered, *S_end, *S_info, *S_decided, *S_tls, *S_splitters,
    *S_broker, *S_bytes, *S_kind, *S_to_broker, *S_to_client, *S_finished, *S_buf, *S_state,
    *S_base, *S_max_frame_size, *S_ready, *S_frames, *S_last_frame, *S_frame_bytes, *S_fed_bytes,
    *S_chunks, *S_parts, *S_parts_len, *S_need_off, *S_part_chunks, *S_pos, *S_peak_buffered,
    *S_append, *S_popleft, *S_clear, *S_move_to_end, *S_parser, *S_endpoints, *S_tcp,
    *S_events, *S_next_idle_check, *S_c_buf, *S_c_pos, *S_c_index, *S_c_bytes_captured, *S_c_bytes_wire,
    *S_c_truncated, *S_c_ts, *S_c_layout, *S_on_frame, *S_conversation, *S_client, *S_req_validator,
    *S_compiled_frames;

#include "_cattrs.h"

static inline int add_ok(long long a, long long b, long long *out) { return !__builtin_add_overflow(a, b, out); }

/* the signed distance from `nxt` to a 32-bit sequence number (tcp.py's unwrap) */
static inline long long seq_delta(long long seq32, long long nxt)
{
    long long d = (long long)(((uint64_t)seq32 - (uint64_t)nxt) & 0xFFFFFFFFu);
    if (d >= (1LL << 31))
        d -= (1LL << 32);
    return d;
}

/* (int(v), a[, b]): a tuple whose first item is a new int, the others borrowed (increfed);
 * what Py_BuildValue("(LOO)") makes, without parsing a format per segment */
static PyObject *tuple_ll(long long v, PyObject *a, PyObject *b)
{
    PyObject *t = PyTuple_New(b == NULL ? 2 : 3);
    if (t == NULL)
        return NULL;
    PyObject *iv = PyLong_FromLongLong(v);
    if (iv == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, iv);
    Py_INCREF(a);
    PyTuple_SET_ITEM(t, 1, a);
    if (b != NULL) {
        Py_INCREF(b);
        PyTuple_SET_ITEM(t, 2, b);
    }
    return t;
}

/* What FrameSplitter.feed does with a payload the driver takes */
enum { WHOLE = 1, /* whole frames only (its fast path) */
       START,     /* whole frames, then the start of a frame the payload does not complete */
       COMPLETE,  /* the end of the held frame (_complete), then as WHOLE/START */
       INSIDE };  /* part of a frame of known size that the payload does not complete */

/* Whole frames of data[from:n] (their end in *q, their number in *nframes) and what the
 * rest is: *tail_need the index just past the frame the rest starts (its size prefix is
 * whole and in range), or -1 (fewer than 4 bytes left, or none).  1 (decline) when the
 * rest starts with a size out of range: _sync's _bad_size decides that. */
static int scan_frames(const unsigned char *data, Py_ssize_t from, Py_ssize_t n, long long maxs,
                       Py_ssize_t *q, Py_ssize_t *nframes, long long *tail_need)
{
    Py_ssize_t at = from, count = 0;
    *tail_need = -1;
    while (n - at >= 4) {
        int32_t size = (int32_t)(((uint32_t)data[at] << 24) | ((uint32_t)data[at + 1] << 16)
                                 | ((uint32_t)data[at + 2] << 8) | data[at + 3]);
        if (size < 0 || (long long)size > maxs)
            return 1;
        long long fe = (long long)at + 4 + size;
        if (fe > n) {
            *tail_need = fe;
            break;
        }
        at = (Py_ssize_t)fe;
        count++;
    }
    *q = at;
    *nframes = count;
    return 0;
}

/* a == b for two endpoints: the parser's Endpoint and the connection's own (equal, often
 * not the same object).  Two tuples of one exact type holding an exact str and an exact
 * int each, whose type compares as tuple does, compare as tuple == does (item by item: str equality, int equality), without
 * the rich comparison's dispatch; anything else takes PyObject_RichCompareBool. */
static int endpoint_eq(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (Py_TYPE(a) == Py_TYPE(b) && PyTuple_Check(a) && Py_TYPE(a)->tp_richcompare == PyTuple_Type.tp_richcompare
        && PyTuple_GET_SIZE(a) == 2 && PyTuple_GET_SIZE(b) == 2) {
        PyObject *ia = PyTuple_GET_ITEM(a, 0), *ib = PyTuple_GET_ITEM(b, 0);
        PyObject *pa = PyTuple_GET_ITEM(a, 1), *pb = PyTuple_GET_ITEM(b, 1);
        if (PyUnicode_CheckExact(ia) && PyUnicode_CheckExact(ib) && PyLong_CheckExact(pa) && PyLong_CheckExact(pb)) {
            int overflow_a = 0, overflow_b = 0;
            long long x = PyLong_AsLongLongAndOverflow(pa, &overflow_a), y = PyLong_AsLongLongAndOverflow(pb, &overflow_b);
            if (!overflow_a && !overflow_b && !PyErr_Occurred()) {
                if (x != y)
                    return 0;
                if (ia == ib)
                    return 1;
                if (PyUnicode_GET_LENGTH(ia) != PyUnicode_GET_LENGTH(ib) || PyUnicode_KIND(ia) != PyUnicode_KIND(ib))
                    return 0; /* (a str's kind is the narrowest that holds it: equal strs share it) */
                return memcmp(PyUnicode_DATA(ia), PyUnicode_DATA(ib),
                              (size_t)PyUnicode_GET_LENGTH(ia) * PyUnicode_KIND(ia)) == 0;
            }
            PyErr_Clear();
        }
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The C methods call1 has found on a type without instance dicts (the deques' append,
 * popleft, clear): called directly, as obj.name(...) would call them, without the
 * attribute lookup per call.  The cache holds its types and methods. */
#define METHOD_CACHE 6
static struct {
    PyTypeObject *type;
    PyObject *name, *method;
} method_cache[METHOD_CACHE];

static PyObject *c_method(PyTypeObject *type, PyObject *name)
{
    for (int i = 0; i < METHOD_CACHE; i++)
        if (method_cache[i].type == type && method_cache[i].name == name)
            return method_cache[i].method;
    if (type->tp_dictoffset != 0 || (type->tp_flags & Py_TPFLAGS_MANAGED_DICT))
        return NULL; /* an instance dict could hold another value of that name */
    PyObject *m = _PyType_Lookup(type, name); /* borrowed */
    if (m == NULL || !Py_IS_TYPE(m, &PyMethodDescr_Type))
        return NULL;
    for (int i = 0; i < METHOD_CACHE; i++) {
        if (method_cache[i].type == NULL) {
            Py_INCREF(type);
            Py_INCREF(name);
            Py_INCREF(m);
            method_cache[i].type = type;
            method_cache[i].name = name;
            method_cache[i].method = m;
            return m;
        }
    }
    return NULL;
}

/* obj.name(arg), or obj.name() when arg is NULL, its result dropped (deque append/clear/popleft) */
static int call1(PyObject *obj, PyObject *name, PyObject *arg)
{
    PyObject *m = c_method(Py_TYPE(obj), name), *r;
    if (m != NULL) {
        PyObject *args[2] = {obj, arg};
        r = PyObject_Vectorcall(m, args, arg ? 2 : 1, NULL);
    } else {
        r = arg ? PyObject_CallMethodOneArg(obj, name, arg) : PyObject_CallMethodNoArgs(obj, name);
    }
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ready.append(Frame(data, off, ts0, ts1, pkt0, pkt1)) */
static int append_frame(PyObject *ready, PyTypeObject *frame_type, PyObject *data, long long off, PyObject *ts0,
                        PyObject *ts1, PyObject *pkt0, PyObject *pkt1)
{
    PyObject *fr = frame_type->tp_alloc(frame_type, 6);
    if (fr == NULL)
        return -1;
    PyObject *o = PyLong_FromLongLong(off);
    if (o == NULL) {
        Py_DECREF(fr);
        return -1;
    }
    Py_INCREF(data);
    PyTuple_SET_ITEM(fr, 0, data);
    PyTuple_SET_ITEM(fr, 1, o);
    Py_INCREF(ts0);
    PyTuple_SET_ITEM(fr, 2, ts0);
    Py_INCREF(ts1);
    PyTuple_SET_ITEM(fr, 3, ts1);
    Py_INCREF(pkt0);
    PyTuple_SET_ITEM(fr, 4, pkt0);
    Py_INCREF(pkt1);
    PyTuple_SET_ITEM(fr, 5, pkt1);
    int r = call1(ready, S_append, fr);
    Py_DECREF(fr);
    return r;
}

/* chunks.append((offset, ts, pkt)) */
static int append_chunk(PyObject *chunks, long long offset, PyObject *ts, PyObject *pkt)
{
    PyObject *chunk = tuple_ll(offset, ts, pkt);
    if (chunk == NULL)
        return -1;
    int r = call1(chunks, S_append, chunk);
    Py_DECREF(chunk);
    return r;
}

/* FrameSplitter.feed's writes for WHOLE, START and COMPLETE (planned in phase 1):
 * _complete's join of the held frame, the fast path's frames sliced out of the payload,
 * and the general path's buffering of a frame's start with _sync's _need_off. */
static int splitter_feed(PyObject *sp, int whole, const unsigned char *data, Py_ssize_t n,
                         PyObject *buf, Py_ssize_t buflen, long long pos, PyObject *parts, PyObject *part_chunks,
                         long long parts_len, long long need_off, long long k, Py_ssize_t q1, Py_ssize_t nframes,
                         long long tail_need, long long base, long long fed, long long fbytes, long long nf,
                         long long peak, PyObject *ts, PyObject *pkt, PyObject *ready, PyObject *chunks,
                         PyTypeObject *frame_type)
{
    PyObject *last = NULL;
    Py_ssize_t from = 0;   /* where the fast path starts in the payload */
    long long fbase = base; /* the splitter's _base then */
    int rc = -1;
    if (whole == COMPLETE) {
        Py_ssize_t head = buflen - (Py_ssize_t)pos - 4;
        last = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(head + parts_len + k));
        if (last == NULL)
            goto out;
        char *w = PyBytes_AS_STRING(last);
        memcpy(w, PyByteArray_AS_STRING(buf) + pos + 4, (size_t)head);
        w += head;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
            PyObject *part = PyList_GET_ITEM(parts, i);
            memcpy(w, PyBytes_AS_STRING(part), (size_t)PyBytes_GET_SIZE(part));
            w += PyBytes_GET_SIZE(part);
        }
        memcpy(w, data, (size_t)k);
        long long off = base + pos;
        /* _chunk_at(off): the chunk that holds the frame's first byte */
        for (;;) {
            Py_ssize_t len = PyObject_Length(chunks);
            if (len < 0)
                goto out;
            if (len <= 1)
                break;
            PyObject *second = PySequence_GetItem(chunks, 1);
            if (second == NULL)
                goto out;
            long long start = PyTuple_Check(second) && PyTuple_GET_SIZE(second) == 3
                                  ? PyLong_AsLongLong(PyTuple_GET_ITEM(second, 0)) : -1;
            Py_DECREF(second);
            if (start == -1 && PyErr_Occurred())
                goto out;
            if (start > off)
                break;
            if (call1(chunks, S_popleft, NULL) < 0)
                goto out;
        }
        PyObject *first = PySequence_GetItem(chunks, 0);
        if (first == NULL)
            goto out;
        if (!PyTuple_Check(first) || PyTuple_GET_SIZE(first) != 3) {
            Py_DECREF(first);
            PyErr_SetString(PyExc_TypeError, "segment: a chunk is not (offset, ts, packet)");
            goto out;
        }
        int r = append_frame(ready, frame_type, last, off, PyTuple_GET_ITEM(first, 1), ts,
                             PyTuple_GET_ITEM(first, 2), pkt);
        Py_DECREF(first);
        if (r < 0)
            goto out;
        nf += 1;
        fbytes += need_off - off;
        fed += k;
        if (PyList_SetSlice(parts, 0, PyList_GET_SIZE(parts), NULL) < 0
            || PyList_SetSlice(part_chunks, 0, PyList_GET_SIZE(part_chunks), NULL) < 0
            || set_ll(sp, S_parts_len, 0) < 0 || set_ll(sp, S_need_off, 0) < 0
            || PyByteArray_Resize(buf, 0) < 0 || set_ll(sp, S_pos, 0) < 0
            || call1(chunks, S_clear, NULL) < 0 || append_chunk(chunks, need_off, ts, pkt) < 0)
            goto out;
        fbase = need_off;
        from = (Py_ssize_t)k;
    }
    if (q1 > from) {
        /* the fast path: whole frames, all with this payload's ts and packet */
        Py_ssize_t at = from;
        for (Py_ssize_t i = 0; i < nframes; i++) {
            uint32_t size = ((uint32_t)data[at] << 24) | ((uint32_t)data[at + 1] << 16)
                            | ((uint32_t)data[at + 2] << 8) | data[at + 3];
            Py_XDECREF(last);
            last = PyBytes_FromStringAndSize((const char *)data + at + 4, (Py_ssize_t)size);
            if (last == NULL)
                goto out;
            if (append_frame(ready, frame_type, last, fbase + (at - from), ts, ts, pkt, pkt) < 0)
                goto out;
            at += 4 + (Py_ssize_t)size;
        }
        nf += nframes;
        fbytes += q1 - from;
        fed += q1 - from;
        if (call1(chunks, S_clear, NULL) < 0 || append_chunk(chunks, fbase, ts, pkt) < 0)
            goto out;
        fbase += q1 - from;
    }
    if (last != NULL && SET(sp, S_last_frame, last) < 0)
        goto out;
    if (q1 < n) {
        /* START: the general path buffers the rest, and _sync learns its frame's size */
        Py_ssize_t t = n - q1;
        if (append_chunk(chunks, fbase, ts, pkt) < 0 || PyByteArray_Resize(buf, t) < 0)
            goto out;
        memcpy(PyByteArray_AS_STRING(buf), data + q1, (size_t)t);
        fed += t;
        if (tail_need >= 0 && set_ll(sp, S_need_off, fbase + (tail_need - q1)) < 0)
            goto out;
        if (t > peak && set_ll(sp, S_peak_buffered, t) < 0)
            goto out;
    }
    if (set_ll(sp, S_frames, nf) < 0 || set_ll(sp, S_frame_bytes, fbytes) < 0 || set_ll(sp, S_fed_bytes, fed) < 0
        || set_ll(sp, S_base, fbase) < 0)
        goto out;
    rc = 0;
out:
    Py_XDECREF(last);
    return rc;
}

#define DECLINE do { result = Py_None; goto done; } while (0)
#define FAIL do { result = NULL; goto done; } while (0)
/* run a check returning 0 (go on), 1 (decline) or -1 (error) */
#define CHECK(expr) do { int r_ = (expr); if (r_ < 0) FAIL; if (r_ > 0) DECLINE; } while (0)

/* The segment's checks and effects, for a TcpSegment already taken apart (ts, src, dst,
 * the payload: the objects the segment's tuple holds; seq, ack, flags: its numbers, checked
 * to be 32-bit / a byte).  Returns a new reference: None (declined), True, or the state. */
static PyObject *segment_impl(PyObject *state, PyObject *ts, PyObject *src, PyObject *dst, long long seq,
                              long long ack, long flags, PyObject *payload, long long packets, PyObject **sp_out)
{
    if (PyTuple_GET_SIZE(state) < 5 || packets < 1) {
        PyErr_SetString(PyExc_ValueError, "segment(state, seg, packets): bad arguments");
        return NULL;
    }
    PyObject *d = PyTuple_GET_ITEM(state, 0), *tcp = PyTuple_GET_ITEM(state, 1);
    PyObject *deque_type = PyTuple_GET_ITEM(state, 2);
    PyTypeObject *frame_type = (PyTypeObject *)PyTuple_GET_ITEM(state, 3);
    PyTypeObject *splitter_type = (PyTypeObject *)PyTuple_GET_ITEM(state, 4);
    if (!PyType_Check(deque_type) || !PyType_Check(frame_type) || !PyType_Check(splitter_type)
        || !PyType_IsSubtype(frame_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "segment: state must hold the deque, Frame and FrameSplitter types");
        return NULL;
    }
    if (flags & (SYN | FIN | RST))
        Py_RETURN_NONE;
    const Py_ssize_t n = PyBytes_GET_SIZE(payload);
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(payload);

    PyObject *result = Py_None;
    /* everything read in the first phase (owned references, released at `done`) */
    PyObject *tstats = NULL, *entry = NULL, *hot_b = NULL, *conn = NULL, *h = NULL, *p = NULL, *st = NULL,
             *last_conn = NULL, *recent = NULL, *cid = NULL, *dstats = NULL, *hot_pair = NULL, *info = NULL,
             *ooo = NULL, *conn_last_ts = NULL, *hot_ba = NULL;
    PyObject *dconn = NULL, *cinfo = NULL, *dirty = NULL, *sp = NULL, *broker = NULL, *bytes_d = NULL,
             *pkt = NULL, *sp_state = NULL, *buf = NULL, *ready = NULL, *chunks = NULL, *parts = NULL,
             *part_chunks = NULL, *last = NULL, *kind = NULL, *key = NULL, *hot_cid = NULL;
    int entry_hot = 0, info_hot = 0, conn_hot = 0;

    /* ---- phase 1: TcpReassembler.feed's reads ---------------------------------------- */
    tstats = GET(tcp, S_stats);
    if (tstats == NULL)
        FAIL;
    PyObject *hot_a = GET(tcp, S_hot_a);
    if (hot_a == NULL)
        FAIL;
    Py_DECREF(hot_a); /* only its identity is compared; tcp holds it */
    hot_b = GET(tcp, S_hot_b);
    if (hot_b == NULL)
        FAIL;
    if (src == hot_a && dst == hot_b) {
        entry = GET(tcp, S_hot_ab);
        entry_hot = 1;
    } else if (src == hot_b && dst == hot_a) {
        entry = GET(tcp, S_hot_ba);
        entry_hot = 1;
    } else {
        PyObject *dirs = GET(tcp, S_dirs);
        if (dirs == NULL)
            FAIL;
        PyObject *k = PyTuple_Pack(2, src, dst);
        if (k == NULL) {
            Py_DECREF(dirs);
            FAIL;
        }
        entry = PyDict_Check(dirs) ? PyDict_GetItemWithError(dirs, k) : NULL;
        Py_XINCREF(entry);
        Py_DECREF(k);
        Py_DECREF(dirs);
        if (entry == NULL) {
            if (PyErr_Occurred())
                FAIL;
            DECLINE; /* a new connection, or one already closed: Python's */
        }
    }
    if (entry == NULL)
        FAIL;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        DECLINE;
    conn = PyTuple_GET_ITEM(entry, 0);
    h = PyTuple_GET_ITEM(entry, 1);
    p = PyTuple_GET_ITEM(entry, 2);
    Py_INCREF(conn);
    Py_INCREF(h);
    Py_INCREF(p);
    int t;
    CHECK((t = truth(h, S_started)) < 0 ? -1 : !t); /* the capture began after the SYN: Python's */
    if ((t = is_none(h, S_fin_at)) < 0)
        FAIL;
    if (!t)
        DECLINE;
    if ((t = is_none(h, S_hole_since)) < 0)
        FAIL;
    if (!t)
        DECLINE;
    if ((t = is_none(p, S_hole_since)) < 0)
        FAIL;
    if (!t)
        DECLINE;
    long long max_window, buffered_total, max_total;
    CHECK(get_ll(tcp, S_max_window, &max_window));
    CHECK(get_ll(tcp, S_buffered_total, &buffered_total));
    CHECK(get_ll(tcp, S_max_total_buffered, &max_total));
    if (buffered_total > max_total)
        DECLINE;
    st = GET(h, S_st);
    if (st == NULL)
        FAIL;
    long long tsegs, hsegs, nxt, payload_bytes = 0, max_end = 0, delivered = 0, end = 0, recent_bytes = 0,
              keep = 0;
    CHECK(get_ll(tstats, S_segments, &tsegs));
    CHECK(get_ll(st, S_segments, &hsegs));
    CHECK(get_ll(h, S_nxt, &nxt));
    if (n) {
        if (seq_delta(seq, nxt) != 0 || n > max_window)
            DECLINE; /* not the next byte: Python places it */
        ooo = GET(h, S_ooo_s);
        if (ooo == NULL)
            FAIL;
        if ((t = PyObject_IsTrue(ooo)) < 0)
            FAIL;
        if (t)
            DECLINE;
        if ((t = is_none(tcp, S_data_sink)) < 0)
            FAIL;
        if (t)
            DECLINE; /* no sink: events per segment (Python's) */
        CHECK(get_ll(st, S_payload_bytes, &payload_bytes));
        CHECK(get_ll(st, S_delivered, &delivered));
        CHECK(get_ll(st, S_end, &end));
        CHECK(get_ll(h, S_max_end, &max_end));
        CHECK(get_ll(h, S_recent_bytes, &recent_bytes));
        CHECK(get_ll(tcp, S_overlap_check_bytes, &keep));
        recent = GET(h, S_recent);
        if (recent == NULL)
            FAIL;
        if (recent != Py_None && (PyObject *)Py_TYPE(recent) != deque_type)
            DECLINE;
        if (nxt > LLONG_MAX - n || payload_bytes > LLONG_MAX - n || delivered > LLONG_MAX - n
            || recent_bytes > LLONG_MAX - n)
            DECLINE;
    }
    /* the ACK: a new peer_ack is taken here only when nothing of the peer waits on it */
    int take_ack = 0;
    long long peer_ack_new = 0;
    if (flags & ACK) {
        if ((t = truth(p, S_started)) < 0)
            FAIL;
        if (t) {
            PyObject *pooo = GET(p, S_ooo_s);
            if (pooo == NULL)
                FAIL;
            t = PyObject_IsTrue(pooo);
            Py_DECREF(pooo);
            if (t < 0)
                FAIL;
            if (t)
                DECLINE; /* the ACK may declare a hole in the peer's data */
            if ((t = is_none(p, S_fin_at)) < 0)
                FAIL;
            if (!t)
                DECLINE;
            long long pnxt;
            CHECK(get_ll(p, S_nxt, &pnxt));
            if (pnxt > LLONG_MAX - (1LL << 32) || pnxt < LLONG_MIN + (1LL << 32))
                DECLINE;
            long long a = pnxt + seq_delta(ack, pnxt);
            PyObject *pa = GET(p, S_peer_ack);
            if (pa == NULL)
                FAIL;
            int newer = 1;
            if (pa != Py_None) {
                if (!PyLong_Check(pa)) {
                    Py_DECREF(pa);
                    DECLINE;
                }
                int overflow = 0;
                long long old = PyLong_AsLongLongAndOverflow(pa, &overflow);
                Py_DECREF(pa);
                if (overflow)
                    DECLINE;
                if (old == -1 && PyErr_Occurred())
                    FAIL;
                newer = a > old;
            } else {
                Py_DECREF(pa);
            }
            if (newer && a - pnxt <= max_window) {
                take_ack = 1;
                peer_ack_new = a;
            }
        }
    }
    conn_last_ts = GET(conn, S_last_ts);
    if (conn_last_ts == NULL)
        FAIL;
    last_conn = GET(tcp, S_last_conn);
    if (last_conn == NULL)
        FAIL;
    cid = GET(conn, S_cid);
    if (cid == NULL)
        FAIL;

    /* ---- phase 1: Dissector.feed_segment's reads --------------------------------------- */
    dstats = GET(d, S_stats);
    if (dstats == NULL)
        FAIL;
    long long tcp_packets, info_packets;
    CHECK(get_ll(dstats, S_tcp_packets, &tcp_packets));
    hot_pair = GET(d, S_hot_pair);
    if (hot_pair == NULL)
        FAIL;
    if (PyTuple_CheckExact(hot_pair) && PyTuple_GET_SIZE(hot_pair) == 2
        && ((PyTuple_GET_ITEM(hot_pair, 0) == src && PyTuple_GET_ITEM(hot_pair, 1) == dst)
            || (PyTuple_GET_ITEM(hot_pair, 0) == dst && PyTuple_GET_ITEM(hot_pair, 1) == src))) {
        info = GET(d, S_hot_info);
        if (info == NULL)
            FAIL;
        info_hot = 1;
    } else {
        int le = PyObject_RichCompareBool(src, dst, Py_LE);
        if (le < 0)
            FAIL;
        PyObject *byt = GET(d, S_conn_by_tuple);
        if (byt == NULL)
            FAIL;
        PyObject *k = le ? PyTuple_Pack(2, src, dst) : PyTuple_Pack(2, dst, src);
        if (k == NULL) {
            Py_DECREF(byt);
            FAIL;
        }
        info = PyDict_Check(byt) ? PyDict_GetItemWithError(byt, k) : NULL;
        Py_XINCREF(info);
        Py_DECREF(k);
        Py_DECREF(byt);
        if (info == NULL) {
            if (PyErr_Occurred())
                FAIL;
            DECLINE; /* a segment of no connection: counted by Python */
        }
    }
    if (info == Py_None)
        DECLINE;
    CHECK(get_ll(info, S_packets, &info_packets));
    if (info_packets > LLONG_MAX - packets || tcp_packets == LLONG_MAX)
        DECLINE;

    /* ---- phase 1: Dissector._on_data's and FrameSplitter.feed's reads ---------------- */
    long long kafka_bytes = 0, counted = 0, sp_frames = 0, frame_bytes = 0, fed_bytes = 0, base = 0,
              parts_len = 0, need_off = 0, pos = 0, peak = 0, maxs = 0;
    Py_ssize_t nframes = 0, buflen = 0, q1 = 0;
    long long k = 0, tail_need = -1;
    int whole = 0; /* what FrameSplitter.feed does with the payload: WHOLE, START, COMPLETE, INSIDE */
    if (n) {
        hot_cid = GET(d, S_hot_cid);
        if (hot_cid == NULL)
            FAIL;
        if (hot_cid == cid) {
            dconn = GET(d, S_hot_conn);
            if (dconn == NULL)
                FAIL;
            conn_hot = 1;
        } else {
            PyObject *conns = GET(d, S_conns);
            if (conns == NULL)
                FAIL;
            dconn = PyDict_Check(conns) ? PyDict_GetItemWithError(conns, cid) : NULL;
            Py_XINCREF(dconn);
            Py_DECREF(conns);
            if (dconn == NULL) {
                if (PyErr_Occurred())
                    FAIL;
                DECLINE;
            }
        }
        if (dconn == Py_None)
            DECLINE;
        dirty = GET(d, S_dirty);
        if (dirty == NULL)
            FAIL;
        if (!PySet_CheckExact(dirty))
            DECLINE;
        cinfo = GET(dconn, S_info);
        if (cinfo == NULL)
            FAIL;
        kind = GET(cinfo, S_kind);
        if (kind == NULL)
            FAIL;
        if (!PyUnicode_Check(kind) || PyUnicode_CompareWithASCIIString(kind, "tls") == 0
            || PyUnicode_CompareWithASCIIString(kind, "not_kafka") == 0)
            DECLINE;
        if ((t = is_none(dconn, S_tls)) < 0)
            FAIL;
        if (!t)
            DECLINE; /* decrypting: Python's */
        if ((t = truth(dconn, S_decided)) < 0)
            FAIL;
        if (!t)
            DECLINE; /* detection: Python's */
        broker = GET(cinfo, S_broker);
        if (broker == NULL)
            FAIL;
        if (broker != Py_None) {
            int to_broker = endpoint_eq(dst, broker);
            if (to_broker < 0)
                FAIL;
            key = to_broker ? S_to_broker : S_to_client;
            bytes_d = GET(cinfo, S_bytes);
            if (bytes_d == NULL)
                FAIL;
            if (!PyDict_CheckExact(bytes_d))
                DECLINE;
            PyObject *v = PyDict_GetItemWithError(bytes_d, key);
            if (v == NULL) {
                if (PyErr_Occurred())
                    FAIL;
                DECLINE;
            }
            if (!PyLong_CheckExact(v))
                DECLINE;
            int overflow = 0;
            counted = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || counted > LLONG_MAX - n)
                DECLINE;
        }
        CHECK(get_ll(dstats, S_kafka_bytes, &kafka_bytes));
        if (kafka_bytes > LLONG_MAX - n)
            DECLINE;
        pkt = GET(dstats, S_packets);
        if (pkt == NULL)
            FAIL;
        PyObject *splitters = GET(dconn, S_splitters);
        if (splitters == NULL)
            FAIL;
        sp = PyDict_CheckExact(splitters) ? PyDict_GetItemWithError(splitters, src) : NULL;
        Py_XINCREF(sp);
        Py_DECREF(splitters);
        if (sp == NULL) {
            if (PyErr_Occurred())
                FAIL;
            DECLINE;
        }
        if ((PyObject *)Py_TYPE(sp) != (PyObject *)splitter_type)
            DECLINE; /* a subclass may feed otherwise */
        if ((t = truth(sp, S_finished)) < 0)
            FAIL;
        if (t)
            DECLINE;
        buf = GET(sp, S_buf);
        if (buf == NULL)
            FAIL;
        if (!PyByteArray_CheckExact(buf))
            DECLINE;
        buflen = PyByteArray_GET_SIZE(buf);
        sp_state = GET(sp, S_state);
        if (sp_state == NULL)
            FAIL;
        int in_sync = PyUnicode_Check(sp_state) && PyUnicode_CompareWithASCIIString(sp_state, "sync") == 0;
        ready = GET(sp, S_ready);
        if (ready == NULL)
            FAIL;
        chunks = GET(sp, S_chunks);
        if (chunks == NULL)
            FAIL;
        if ((PyObject *)Py_TYPE(ready) != deque_type || (PyObject *)Py_TYPE(chunks) != deque_type)
            DECLINE;
        CHECK(get_ll(sp, S_base, &base));
        CHECK(get_ll(sp, S_fed_bytes, &fed_bytes));
        if (fed_bytes > LLONG_MAX - n || base > LLONG_MAX - n)
            DECLINE;
        CHECK(get_ll(sp, S_max_frame_size, &maxs));
        CHECK(get_ll(sp, S_frames, &sp_frames));
        CHECK(get_ll(sp, S_frame_bytes, &frame_bytes));
        if (frame_bytes > LLONG_MAX - n || sp_frames > LLONG_MAX - n)
            DECLINE;
        if (buflen == 0 && in_sync) {
            /* FrameSplitter.feed's fast path: whole frames sliced out of the payload; then
             * (START) the start of a frame it does not complete, which the general path
             * buffers */
            CHECK(scan_frames(data, 0, n, maxs, &q1, &nframes, &tail_need));
            whole = q1 == n ? WHOLE : START;
        }
        if (whole != WHOLE) {
            CHECK(get_ll(sp, S_parts_len, &parts_len));
            CHECK(get_ll(sp, S_need_off, &need_off));
            CHECK(get_ll(sp, S_pos, &pos));
            CHECK(get_ll(sp, S_peak_buffered, &peak));
            if (parts_len < 0 || pos < 0 || pos > buflen || base > LLONG_MAX - buflen - parts_len - n)
                DECLINE;
            parts = GET(sp, S_parts);
            if (parts == NULL)
                FAIL;
            part_chunks = GET(sp, S_part_chunks);
            if (part_chunks == NULL)
                FAIL;
            if (!PyList_CheckExact(parts) || !PyList_CheckExact(part_chunks))
                DECLINE;
        }
        long long end_off = base + buflen + parts_len + n;
        if (whole == START) {
            /* the general path after the fast path: nothing held (pos 0, no parts) and no
             * frame size known that the payload falls short of */
            if (pos != 0 || parts_len != 0 || PyList_GET_SIZE(parts) != 0 || end_off < need_off)
                DECLINE;
        } else if (whole == WHOLE) {
            /* nothing more to read */
        } else if (in_sync && buflen - pos >= 4 && PyList_GET_SIZE(parts) > 0 && !(end_off < need_off)) {
            /* FrameSplitter._complete: the payload ends the frame the buffer starts, whose
             * pieces were set aside; then the rest as if fed on its own (fast path, START) */
            const unsigned char *b = (const unsigned char *)PyByteArray_AS_STRING(buf) + pos;
            int32_t size = (int32_t)(((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3]);
            if (size < 0 || base + pos + 4 + size != need_off)
                DECLINE; /* a _need_off a gap left: _flatten's */
            long long held_parts = 0;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
                PyObject *part = PyList_GET_ITEM(parts, i);
                if (!PyBytes_CheckExact(part))
                    DECLINE;
                held_parts += PyBytes_GET_SIZE(part);
            }
            if (held_parts != parts_len)
                DECLINE;
            k = need_off - (end_off - n);
            if (k <= 0 || k > n)
                DECLINE;
            Py_ssize_t nchunks = PyObject_Length(chunks);
            if (nchunks < 0)
                FAIL;
            if (nchunks < 1)
                DECLINE; /* _chunk_at's _NO_CHUNK: Python's */
            CHECK(scan_frames(data, (Py_ssize_t)k, n, maxs, &q1, &nframes, &tail_need));
            whole = COMPLETE;
        } else if (end_off < need_off) {
            /* inside a frame of known size that this payload does not complete */
            whole = INSIDE;
        } else {
            DECLINE;
        }
    }

    /* ---- phase 2: write ---------------------------------------------------------------- */
    result = NULL;
    if (set_ll(dstats, S_tcp_packets, tcp_packets + 1) < 0 || SET(d, S_last_ts_d, ts) < 0)
        goto done;
    if (set_ll(tstats, S_segments, tsegs + 1) < 0)
        goto done;
    if (!entry_hot) {
        hot_ba = PyTuple_Pack(3, conn, p, h);
        if (hot_ba == NULL || SET(tcp, S_hot_a, src) < 0 || SET(tcp, S_hot_b, dst) < 0
            || SET(tcp, S_hot_ab, entry) < 0 || SET(tcp, S_hot_ba, hot_ba) < 0)
            goto done;
    }
    t = PyObject_RichCompareBool(ts, conn_last_ts, Py_GT);
    if (t < 0 || (t && SET(conn, S_last_ts, ts) < 0))
        goto done;
    if (conn != last_conn) {
        PyObject *lru = GET(tcp, S_conns);
        if (lru == NULL)
            goto done;
        PyObject *r = PyObject_CallMethodOneArg(lru, S_move_to_end, conn);
        Py_DECREF(lru);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
        if (SET(tcp, S_last_conn, conn) < 0)
            goto done;
    }
    if (set_ll(st, S_segments, hsegs + 1) < 0)
        goto done;
    if (n) {
        long long e = nxt + n;
        if (set_ll(st, S_payload_bytes, payload_bytes + n) < 0)
            goto done;
        if (e > max_end && set_ll(h, S_max_end, e) < 0)
            goto done;
        /* the data sink: Dissector._on_data */
        if (!conn_hot && (SET(d, S_hot_cid, cid) < 0 || SET(d, S_hot_conn, dconn) < 0))
            goto done;
        if (PySet_Add(dirty, dconn) < 0 || SET(cinfo, S_last_ts, ts) < 0)
            goto done;
        if (key != NULL) {
            PyObject *v = PyLong_FromLongLong(counted + n);
            if (v == NULL)
                goto done;
            int r = PyDict_SetItem(bytes_d, key, v);
            Py_DECREF(v);
            if (r < 0)
                goto done;
        }
        if (set_ll(dstats, S_kafka_bytes, kafka_bytes + n) < 0)
            goto done;
        /* FrameSplitter.feed */
        if (whole == INSIDE) {
            long long end_off = base + buflen + parts_len + n;
            PyObject *chunk = tuple_ll(end_off - n, ts, pkt);
            if (chunk == NULL)
                goto done;
            int r = PyList_Append(part_chunks, chunk);
            Py_DECREF(chunk);
            if (r < 0 || PyList_Append(parts, payload) < 0)
                goto done;
            if (set_ll(sp, S_parts_len, parts_len + n) < 0 || set_ll(sp, S_fed_bytes, fed_bytes + n) < 0)
                goto done;
            long long held = buflen - pos + parts_len + n;
            if (held > peak && set_ll(sp, S_peak_buffered, held) < 0)
                goto done;
        } else if (splitter_feed(sp, whole, data, n, buf, buflen, pos, parts, part_chunks, parts_len,
                                 need_off, k, q1, nframes, tail_need, base, fed_bytes, frame_bytes, sp_frames,
                                 peak, ts, pkt, ready, chunks, frame_type) < 0) {
            goto done;
        }
        /* back in TcpReassembler.feed: the delivered tail kept for overlap checks */
        if (recent == Py_None) {
            Py_DECREF(recent);
            recent = PyObject_CallNoArgs(deque_type);
            if (recent == NULL || SET(h, S_recent, recent) < 0)
                goto done;
        }
        PyObject *item = tuple_ll(nxt, payload, NULL);
        if (item == NULL)
            goto done;
        int appended = call1(recent, S_append, item);
        Py_DECREF(item);
        if (appended < 0)
            goto done;
        long long kept = recent_bytes + n;
        for (;;) {
            Py_ssize_t len = PyObject_Length(recent);
            if (len < 0)
                goto done;
            if (len <= 1)
                break;
            PyObject *first = PySequence_GetItem(recent, 0);
            if (first == NULL)
                goto done;
            Py_ssize_t flen = PyTuple_Check(first) && PyTuple_GET_SIZE(first) == 2
                                  ? PyObject_Length(PyTuple_GET_ITEM(first, 1)) : -1;
            Py_DECREF(first);
            if (flen < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "segment: a recent entry is not (seq, bytes)");
                goto done;
            }
            if (!(kept - flen >= keep))
                break;
            if (call1(recent, S_popleft, NULL) < 0)
                goto done;
            kept -= flen;
        }
        if (set_ll(h, S_recent_bytes, kept) < 0 || set_ll(h, S_nxt, e) < 0
            || set_ll(st, S_delivered, delivered + n) < 0)
            goto done;
        if (e > end && set_ll(st, S_end, e) < 0)
            goto done;
    }
    if (take_ack && set_ll(p, S_peer_ack, peer_ack_new) < 0)
        goto done;
    /* back in Dissector.feed_segment */
    if (!info_hot) {
        PyObject *pair = PyTuple_Pack(2, src, dst);
        if (pair == NULL)
            goto done;
        int r = SET(d, S_hot_pair, pair);
        Py_DECREF(pair);
        if (r < 0 || SET(d, S_hot_info, info) < 0)
            goto done;
    }
    if (set_ll(info, S_packets, info_packets + packets) < 0)
        goto done;
    result = Py_True;
    if (ready != NULL) {
        Py_ssize_t nready = PyObject_Length(ready);
        if (nready < 0) {
            result = NULL;
            goto done;
        }
        if (nready) {
            result = dconn;
            if (sp_out != NULL) {
                Py_INCREF(sp);
                *sp_out = sp;
            }
        }
    }

done:
    Py_XINCREF(result);
    Py_XDECREF(tstats);
    Py_XDECREF(entry);
    Py_XDECREF(hot_b);
    Py_XDECREF(conn);
    Py_XDECREF(h);
    Py_XDECREF(p);
    Py_XDECREF(st);
    Py_XDECREF(last_conn);
    Py_XDECREF(recent);
    Py_XDECREF(cid);
    Py_XDECREF(dstats);
    Py_XDECREF(hot_pair);
    Py_XDECREF(info);
    Py_XDECREF(ooo);
    Py_XDECREF(conn_last_ts);
    Py_XDECREF(hot_ba);
    Py_XDECREF(dconn);
    Py_XDECREF(cinfo);
    Py_XDECREF(dirty);
    Py_XDECREF(sp);
    Py_XDECREF(broker);
    Py_XDECREF(bytes_d);
    Py_XDECREF(pkt);
    Py_XDECREF(sp_state);
    Py_XDECREF(buf);
    Py_XDECREF(ready);
    Py_XDECREF(chunks);
    Py_XDECREF(parts);
    Py_XDECREF(part_chunks);
    Py_XDECREF(last);
    Py_XDECREF(kind);
    Py_XDECREF(hot_cid);
    return result;
}

static PyObject *segment(PyObject *self, PyObject *args)
{
    PyObject *state, *seg;
    long long packets;
    if (!PyArg_ParseTuple(args, "O!O!L", &PyTuple_Type, &state, &PyTuple_Type, &seg, &packets))
        return NULL;
    if (PyTuple_GET_SIZE(state) < 5 || PyTuple_GET_SIZE(seg) < 9 || packets < 1) {
        PyErr_SetString(PyExc_ValueError, "segment(state, seg, packets): bad arguments");
        return NULL;
    }
    PyObject *ts = PyTuple_GET_ITEM(seg, 0), *src = PyTuple_GET_ITEM(seg, 1), *dst = PyTuple_GET_ITEM(seg, 2);
    PyObject *seq_o = PyTuple_GET_ITEM(seg, 3), *ack_o = PyTuple_GET_ITEM(seg, 4);
    PyObject *flags_o = PyTuple_GET_ITEM(seg, 5), *payload = PyTuple_GET_ITEM(seg, 6);
    PyObject *missing_o = PyTuple_GET_ITEM(seg, 8);
    if (!PyFloat_CheckExact(ts) || !PyBytes_CheckExact(payload) || !PyLong_CheckExact(flags_o)
        || !PyLong_CheckExact(seq_o) || !PyLong_CheckExact(ack_o) || !PyLong_CheckExact(missing_o))
        Py_RETURN_NONE;
    long flags = PyLong_AsLong(flags_o), missing = PyLong_AsLong(missing_o);
    long long seq = PyLong_AsLongLong(seq_o), ack = PyLong_AsLongLong(ack_o);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (flags & (SYN | FIN | RST) || missing != 0 || seq < 0 || seq > 0xFFFFFFFFLL || ack < 0 || ack > 0xFFFFFFFFLL)
        Py_RETURN_NONE;
    return segment_impl(state, ts, src, dst, seq, ack, flags, payload, packets, NULL);
}


/* ---- feed_chunk: the packet loop over capture records ------------------------------------ */

/* The reader's part of a RecordChunk (readers.py), read at the start of a call and written
 * back at every exit, so the reader's bookkeeping always counts exactly the records taken. */
typedef struct {
    PyObject *buf;            /* bytes: the reader's buffer */
    long long pos, index, bytes_captured, bytes_wire, truncated;
    PyObject *ts;             /* the last record's timestamp (a new reference), or NULL */
} chunk_t;

/* one pcapng interface, as readers._Iface gives it to the chunk: (linktype, div, tsoffset) */
typedef struct {
    PyObject *linktype;
    long lt;
    double div, tsoffset_f;
} cif_t;

static int chunk_write_back(PyObject *chunk, chunk_t *c)
{
    static Slot s_pos, s_index, s_cap, s_wire, s_trunc, s_ts;
    if (set_ll_c(chunk, S_c_pos, &s_pos, c->pos) < 0 || set_ll_c(chunk, S_c_index, &s_index, c->index) < 0
        || set_ll_c(chunk, S_c_bytes_captured, &s_cap, c->bytes_captured) < 0
        || set_ll_c(chunk, S_c_bytes_wire, &s_wire, c->bytes_wire) < 0
        || set_ll_c(chunk, S_c_truncated, &s_trunc, c->truncated) < 0)
        return -1;
    if (c->ts != NULL && fast_set(chunk, S_c_ts, c->ts, &s_ts) < 0)
        return -1;
    return 0;
}

/* list.append(int(v)); 0, or -1 with the exception */
static int append_ll(PyObject *list, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    int r = PyList_Append(list, o);
    Py_DECREF(o);
    return r;
}

/* call fn(a) or fn(a, b); 0, or -1 with the exception */
static int call_py(PyObject *fn, PyObject *a, PyObject *b)
{
    PyObject *args[2] = {a, b};
    PyObject *r = PyObject_Vectorcall(fn, args, b == NULL ? 1 : 2, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* obj.name += 1 for an int attribute (declining is not possible here: a counter that is not
 * an int is an error, as `+= 1` in Python would make it one or raise) */
static int incr_c(PyObject *obj, PyObject *name, Slot *c)
{
    PyObject *v = fast_get(obj, name, c);
    if (v == NULL)
        return -1;
    PyObject *w;
    long long x;
    int overflow = 0;
    if (PyLong_CheckExact(v) && (x = PyLong_AsLongLongAndOverflow(v, &overflow), !overflow) && x < LLONG_MAX
        && !(x == -1 && PyErr_Occurred())) {
        w = PyLong_FromLongLong(x + 1); /* an exact int: what int + 1 gives, without the number protocol */
    } else {
        PyErr_Clear();
        PyObject *one = PyLong_FromLong(1);
        w = one == NULL ? NULL : PyNumber_Add(v, one);
        Py_XDECREF(one);
    }
    Py_DECREF(v);
    if (w == NULL)
        return -1;
    int r = fast_set(obj, name, w, c);
    Py_DECREF(w);
    return r;
}
#define incr(obj, name) __extension__({ static Slot c_; incr_c((obj), (name), &c_); })

/* Dissector._frames_to_conversation(conn, src) for the connection state `conn` whose
 * splitter `sp` (src's) has events ready: without a frame hook, the splitter's events go
 * straight to the conversation's compiled walk (state[11].compiled_frames: the module
 * stream/conversation.py, whose compiled_frames is stream/_cconv.c's frames) with
 * the dissector's rows as its sink, as the Python method does first; the events it leaves
 * (it returns their index) go to the Python method, which goes on from there.  0, or -1
 * with the exception. */
static int frames_to_conversation(PyObject *lstate, PyObject *d, PyObject *conn, PyObject *src, PyObject *sp)
{
    PyObject *frames_to_conv = PyTuple_GET_ITEM(lstate, 8);
    if (sp == NULL)
        return call_py(frames_to_conv, conn, src);
    PyObject *on_frame = GET(d, S_on_frame);
    if (on_frame == NULL)
        return -1;
    Py_DECREF(on_frame);
    if (on_frame != Py_None) /* frame hooks see every frame: the Python method's */
        return call_py(frames_to_conv, conn, src);
    /* read at every call, as the Python method does (tests set it to None); from the
     * module's dict, where module attribute access finds it first */
    PyObject *mod = PyTuple_GET_ITEM(lstate, 11), *walk = NULL;
    if (PyModule_CheckExact(mod)) {
        walk = PyDict_GetItemWithError(PyModule_GetDict(mod), S_compiled_frames);
        if (walk == NULL && PyErr_Occurred())
            return -1;
        Py_XINCREF(walk);
    }
    if (walk == NULL)
        walk = PyObject_GetAttr(mod, S_compiled_frames);
    if (walk == NULL)
        return -1;
    if (walk == Py_None) {
        Py_DECREF(walk);
        return call_py(frames_to_conv, conn, src);
    }
    int rc = -1;
    PyObject *info = NULL, *conv = NULL, *client = NULL, *validator = NULL, *ready = NULL, *events = NULL,
             *sink = NULL, *start = NULL;
    if ((info = GET(conn, S_info)) == NULL || (conv = GET(info, S_conversation)) == NULL
        || (client = GET(info, S_client)) == NULL || (validator = GET(conn, S_req_validator)) == NULL
        || (ready = GET(sp, S_ready)) == NULL || (sink = GET(d, S_events)) == NULL)
        goto out;
    int from_client = endpoint_eq(src, client);
    if (from_client < 0)
        goto out;
    /* splitter.events(): its ready events as a list, and none left */
    if ((events = PySequence_List(ready)) == NULL || call1(ready, S_clear, NULL) < 0)
        goto out;
    PyObject *args[6] = {conv, events, NULL, from_client ? Py_True : Py_False, validator, sink};
    if ((args[2] = start = PyLong_FromLong(0)) == NULL)
        goto out;
    PyObject *r = PyObject_Vectorcall(walk, args, 6, NULL);
    if (r == NULL)
        goto out;
    Py_ssize_t i = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (i == -1 && PyErr_Occurred())
        goto out;
    if (i > PyList_GET_SIZE(events)) { /* all taken, and the rows moved to the sink */
        rc = 0;
        goto out;
    }
    /* the rest: _frames_to_conversation(conn, src, events, i) */
    PyObject *at = PyLong_FromSsize_t(i);
    if (at == NULL)
        goto out;
    PyObject *rest[4] = {conn, src, events, at};
    r = PyObject_Vectorcall(frames_to_conv, rest, 4, NULL);
    Py_DECREF(at);
    if (r == NULL)
        goto out;
    Py_DECREF(r);
    rc = 0;
out:
    Py_DECREF(walk);
    Py_XDECREF(info);
    Py_XDECREF(conv);
    Py_XDECREF(client);
    Py_XDECREF(validator);
    Py_XDECREF(ready);
    Py_XDECREF(events);
    Py_XDECREF(sink);
    Py_XDECREF(start);
    return rc;
}

/* One record: what Dissector.feed_packet does with the RawPacket (ts, linktype, data,
 * wire, index) it would have been given.  0, or -1 with an exception. */
static int feed_record(PyObject *lstate, PyObject *d, PyObject *parser, PyObject *ts, PyObject *linktype, long lt,
                       const unsigned char *data, Py_ssize_t caplen, long long wire, long long index)
{
    PyObject *raw_type = PyTuple_GET_ITEM(lstate, 5), *seg_type = PyTuple_GET_ITEM(lstate, 6);
    PyObject *feed_segment = PyTuple_GET_ITEM(lstate, 7);
    PyObject *flush_idle = PyTuple_GET_ITEM(lstate, 9), *feed_python = PyTuple_GET_ITEM(lstate, 10);
    PyObject *dstats = GET(d, S_stats);
    if (dstats == NULL)
        return -1;
    int rc = incr(dstats, S_packets); /* self.stats.packets += 1 */
    Py_DECREF(dstats);
    if (rc < 0)
        return -1;
    tcp_view_t v;
    PyObject *a = NULL, *b = NULL;
    if (tcp_view(data, caplen, lt, &v)) {
        PyObject *endpoints = GET(parser, S_endpoints);
        if (endpoints == NULL)
            return -1;
        if (PyDict_CheckExact(endpoints)) {
            a = known_endpoint(endpoints, v.src, v.iplen, v.sport);
            if (a != NULL)
                b = known_endpoint(endpoints, v.dst, v.iplen, v.dport);
        }
        Py_DECREF(endpoints);
        if (b == NULL) {
            Py_CLEAR(a);
            if (PyErr_Occurred())
                return -1;
        }
    }
    if (b == NULL) { /* not an ordinary packet (or a new endpoint): feed_packet's Python path */
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)data, caplen);
        if (bytes == NULL)
            return -1;
        PyObject *items[5] = {ts, linktype, bytes, PyLong_FromLongLong(wire), PyLong_FromLongLong(index)};
        Py_INCREF(ts);
        Py_INCREF(linktype);
        PyObject *raw = new_tuple_of((PyTypeObject *)raw_type, items, 5);
        if (raw == NULL)
            return -1;
        rc = call_py(feed_python, raw, NULL);
        Py_DECREF(raw);
        return rc;
    }
    rc = -1;
    PyObject *payload = NULL, *res = NULL, *sp = NULL;
    PyObject *pstats = GET(parser, S_stats);
    if (pstats == NULL || incr(pstats, S_packets) < 0 || incr(pstats, S_tcp) < 0)
        goto out;
    payload = PyBytes_FromStringAndSize((const char *)data + v.payload_off, v.payload_len);
    if (payload == NULL)
        goto out;
    res = segment_impl(lstate, ts, a, b, v.seq, v.ack, (long)v.flags, payload, 1, &sp);
    if (res == NULL)
        goto out;
    if (res == Py_None) { /* the driver declined: feed_segment(seg, 1) */
        Py_INCREF(ts);
        Py_INCREF(a);
        Py_INCREF(b);
        Py_INCREF(payload);
        PyObject *items[9] = {ts, a, b, PyLong_FromUnsignedLong(v.seq), PyLong_FromUnsignedLong(v.ack),
                              PyLong_FromLong(v.flags), payload, PyLong_FromLongLong(index), PyLong_FromLong(0)};
        PyObject *seg = new_tuple_of((PyTypeObject *)seg_type, items, 9);
        if (seg == NULL)
            goto out;
        PyObject *one = PyLong_FromLong(1);
        if (one == NULL) {
            Py_DECREF(seg);
            goto out;
        }
        int r = call_py(feed_segment, seg, one);
        Py_DECREF(one);
        Py_DECREF(seg);
        rc = r;
        goto out;
    }
    if (res != Py_True && frames_to_conversation(lstate, d, res, a, sp) < 0) /* the splitter has frames ready */
        goto out;
    PyObject *next_check = GET(d, S_next_idle_check);
    if (next_check == NULL)
        goto out;
    int due = PyObject_RichCompareBool(ts, next_check, Py_GE);
    Py_DECREF(next_check);
    if (due < 0 || (due && call_py(flush_idle, ts, NULL) < 0))
        goto out;
    rc = 0;
out:
    Py_XDECREF(pstats);
    Py_XDECREF(payload);
    Py_XDECREF(res);
    Py_XDECREF(sp);
    Py_DECREF(a);
    Py_DECREF(b);
    return rc;
}

/* feed_chunk(state, chunk, limit[, marks]) -> records taken.  chunk.layout is (0,
 * big_endian, nanosecond, record header length, linktype) for pcap, (1, big_endian, 0, 0,
 * interfaces) for pcapng, interfaces being ((linktype, div, tsoffset), ...).  Without marks
 * (None) it stops after the first record that leaves rows; with a list, it goes on to
 * limit and appends, for each row a record left, the records taken so far (the caller
 * files each row under its packet: marks[i] is the packet of pending[i]). */
static PyObject *feed_chunk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 4) || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 12) {
        PyErr_SetString(PyExc_TypeError, "feed_chunk(state, chunk, limit[, marks])");
        return NULL;
    }
    PyObject *lstate = args[0], *chunk = args[1];
    PyObject *marks = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
    if (marks != NULL && !PyList_CheckExact(marks)) {
        PyErr_SetString(PyExc_TypeError, "feed_chunk: marks must be a list or None");
        return NULL;
    }
    long long limit = PyLong_AsLongLong(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    static Slot s_layout;
    PyObject *layout = fast_get(chunk, S_c_layout, &s_layout);
    if (layout == NULL)
        return NULL;
    long fmt = 0, big = 0, nano = 0, rec_len_l = 0;
    if (PyTuple_CheckExact(layout) && PyTuple_GET_SIZE(layout) == 5) {
        fmt = PyLong_AsLong(PyTuple_GET_ITEM(layout, 0));
        big = PyLong_AsLong(PyTuple_GET_ITEM(layout, 1));
        nano = PyLong_AsLong(PyTuple_GET_ITEM(layout, 2));
        rec_len_l = PyLong_AsLong(PyTuple_GET_ITEM(layout, 3));
    } else {
        PyErr_SetString(PyExc_TypeError, "feed_chunk: chunk.layout must be a 5-tuple");
    }
    if (PyErr_Occurred() || (fmt == 0 && rec_len_l < 16) || rec_len_l > 64) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "feed_chunk: bad record header length");
        Py_DECREF(layout);
        return NULL;
    }
    PyObject *d = PyTuple_GET_ITEM(lstate, 0);
    chunk_t c = {0};
    cif_t *ifs = NULL;
    Py_ssize_t n_if = 0, rec_len = 16;
    PyObject *linktype = NULL, *events = NULL, *result = NULL;
    long lt = 0;
    static Slot s_buf, s_pos, s_index, s_cap, s_wire, s_trunc;
    c.buf = fast_get(chunk, S_c_buf, &s_buf);
    if (c.buf == NULL) {
        Py_DECREF(layout);
        return NULL;
    }
    if (get_ll_c(chunk, S_c_pos, &s_pos, &c.pos) != 0 || get_ll_c(chunk, S_c_index, &s_index, &c.index) != 0
        || get_ll_c(chunk, S_c_bytes_captured, &s_cap, &c.bytes_captured) != 0
        || get_ll_c(chunk, S_c_bytes_wire, &s_wire, &c.bytes_wire) != 0
        || get_ll_c(chunk, S_c_truncated, &s_trunc, &c.truncated) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "feed_chunk: the chunk's counters must be ints");
        goto fail;
    }
    if (!PyBytes_CheckExact(c.buf) || c.pos < 0 || c.pos > PyBytes_GET_SIZE(c.buf)) {
        PyErr_SetString(PyExc_ValueError, "feed_chunk: the chunk's buffer must be bytes, its position inside");
        goto fail;
    }
    if (fmt == 0) { /* pcap: one link type */
        linktype = PyTuple_GET_ITEM(layout, 4);
        rec_len = rec_len_l;
        int overflow = 0;
        lt = PyLong_AsLongAndOverflow(linktype, &overflow);
        if (overflow || (lt == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "feed_chunk: bad link type");
            goto fail;
        }
    } else { /* pcapng: interfaces */
        PyObject *t = PyTuple_GET_ITEM(layout, 4);
        if (!PyTuple_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "feed_chunk: interfaces must be a tuple");
            goto fail;
        }
        n_if = PyTuple_GET_SIZE(t);
        ifs = PyMem_Calloc(n_if ? (size_t)n_if : 1, sizeof(cif_t));
        if (ifs == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n_if; i++) {
            PyObject *it = PyTuple_GET_ITEM(t, i);
            if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3 || !PyLong_Check(PyTuple_GET_ITEM(it, 0))
                || !PyFloat_Check(PyTuple_GET_ITEM(it, 1)) || !PyLong_Check(PyTuple_GET_ITEM(it, 2))) {
                PyErr_SetString(PyExc_TypeError, "feed_chunk: interfaces are (linktype, div, tsoffset)");
                goto fail;
            }
            int overflow = 0;
            ifs[i].linktype = PyTuple_GET_ITEM(it, 0);
            ifs[i].lt = PyLong_AsLongAndOverflow(ifs[i].linktype, &overflow);
            if (overflow)
                ifs[i].lt = -1; /* no link type tcp_view knows: every packet takes the Python path */
            ifs[i].div = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(it, 1));
            /* int + float in Python converts the int to the nearest double first: the same here */
            ifs[i].tsoffset_f = PyLong_AsDouble(PyTuple_GET_ITEM(it, 2));
            if (PyErr_Occurred())
                goto fail;
        }
    }
    PyObject *dparser = GET(d, S_parser);
    if (dparser == NULL)
        goto fail;
    events = GET(d, S_events);
    if (events == NULL || !PyList_Check(events)) {
        if (events != NULL)
            PyErr_SetString(PyExc_TypeError, "feed_chunk: the dissector's rows must be a list");
        Py_DECREF(dparser);
        goto fail;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(c.buf);
    const Py_ssize_t blen = PyBytes_GET_SIZE(c.buf);
    const double div = nano ? 1e9 : 1e6;
    long long done = 0;
    int failed = 0;
    /* rows pending when the call began count as left by its first record, as they did
     * when it stopped at every record that left rows */
    Py_ssize_t rows_marked = 0;
    while (done < limit) {
        Py_ssize_t pos = (Py_ssize_t)c.pos;
        const unsigned char *h = b + pos;
        const unsigned char *data;
        uint64_t caplen, wire;
        double tsv;
        PyObject *rec_lt;
        long rec_ltv;
        if (fmt == 0) {
            if (blen - pos < rec_len)
                break;
            uint32_t sec = rd32(h, big & 1), frac = rd32(h + 4, big & 1);
            caplen = rd32(h + 8, big & 1);
            wire = rd32(h + 12, big & 1);
            if (caplen > (uint64_t)(blen - pos - rec_len))
                break; /* runs past the buffer: the reader's Python path refills or reports */
            data = h + rec_len;
            c.pos = pos + rec_len + (Py_ssize_t)caplen;
            tsv = (double)sec + (double)frac / div; /* readers.py: sec + frac / div */
            rec_lt = linktype;
            rec_ltv = lt;
        } else {
            if (blen - pos < 32)
                break;
            uint32_t btype = rd32(h, big), bl = rd32(h + 4, big);
            if (btype != 6 || bl < 32 || (uint64_t)bl > (uint64_t)(blen - pos) || (bl & 3))
                break; /* not an Enhanced Packet Block wholly in the buffer: the reader's */
            uint32_t iface_id = rd32(h + 8, big), hi = rd32(h + 12, big), lo = rd32(h + 16, big);
            caplen = rd32(h + 20, big);
            wire = rd32(h + 24, big);
            if ((Py_ssize_t)iface_id >= n_if || 32 + caplen > (uint64_t)bl)
                break;
            const cif_t *f = &ifs[iface_id];
            data = h + 28;
            c.pos = pos + bl;
            /* readers.py: tsoffset + ((hi << 32) | lo) / div */
            tsv = f->tsoffset_f + (double)(((uint64_t)hi << 32) | lo) / f->div;
            rec_lt = f->linktype;
            rec_ltv = f->lt;
        }
        /* the record is handed out: the reader's books count it from here on */
        c.index++;
        c.bytes_captured += (long long)caplen;
        if (wire != caplen) {
            if (wire > caplen)
                c.truncated++;
            else /* some writers leave orig_len 0 */
                wire = caplen;
        }
        c.bytes_wire += (long long)wire;
        done++;
        PyObject *ts = PyFloat_FromDouble(tsv);
        if (ts == NULL) {
            failed = 1;
            break;
        }
        Py_XSETREF(c.ts, ts);
        if (feed_record(lstate, d, dparser, ts, rec_lt, rec_ltv, data, (Py_ssize_t)caplen, (long long)wire,
                        c.index) < 0) {
            failed = 1;
            break;
        }
        Py_ssize_t nrows = PyList_GET_SIZE(events);
        if (nrows > rows_marked) {
            if (marks == NULL)
                break; /* rows: the loop collects them at this packet */
            for (; rows_marked < nrows; rows_marked++)
                if (append_ll(marks, done) < 0)
                    break;
            if (rows_marked < nrows) {
                failed = 1;
                break;
            }
        }
    }
    Py_DECREF(dparser);
    if (chunk_write_back(chunk, &c) < 0)
        failed = 1;
    if (!failed)
        result = PyLong_FromLongLong(done);
    else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_SystemError, "feed_chunk failed without an exception");
    goto end;
fail:
    result = NULL;
end:
    Py_XDECREF(events);
    Py_XDECREF(c.ts);
    Py_DECREF(c.buf);
    Py_DECREF(layout);
    PyMem_Free(ifs);
    return result;
}

static PyMethodDef methods[] = {
    {"segment", segment, METH_VARARGS,
     "segment(state, seg, packets) -> None | True | connection state: one in-order TCP segment of an\n"
     "established Kafka connection, through reassembly and framing (None: declined, nothing changed)"},
    {"feed_chunk", (PyCFunction)(void (*)(void))feed_chunk, METH_FASTCALL,
     "feed_chunk(state, chunk, limit[, marks]) -> records taken (at most limit): the\n"
     "packet loop over the capture records wholly inside a reader's buffer (readers.RecordChunk);\n"
     "without marks it stops at the first record that leaves rows, with a list it appends\n"
     "the records taken so far once for each row a record left, and goes on"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cdriver", "The compiled per-segment driver.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__cdriver(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_stats, "stats");
    INTERN(S_tcp_packets, "tcp_packets");
    INTERN(S_last_ts_d, "_last_ts");
    INTERN(S_packets, "packets");
    INTERN(S_kafka_bytes, "kafka_bytes");
    INTERN(S_hot_pair, "_hot_pair");
    INTERN(S_hot_info, "_hot_info");
    INTERN(S_conn_by_tuple, "_conn_by_tuple");
    INTERN(S_hot_cid, "_hot_cid");
    INTERN(S_hot_conn, "_hot_conn");
    INTERN(S_conns, "_conns");
    INTERN(S_dirty, "_dirty");
    INTERN(S_segments, "segments");
    INTERN(S_hot_a, "_hot_a");
    INTERN(S_hot_b, "_hot_b");
    INTERN(S_hot_ab, "_hot_ab");
    INTERN(S_hot_ba, "_hot_ba");
    INTERN(S_dirs, "_dirs");
    INTERN(S_last_conn, "_last_conn");
    INTERN(S_data_sink, "data_sink");
    INTERN(S_max_window, "max_window");
    INTERN(S_overlap_check_bytes, "overlap_check_bytes");
    INTERN(S_buffered_total, "_buffered_total");
    INTERN(S_max_total_buffered, "max_total_buffered");
    INTERN(S_last_ts, "last_ts");
    INTERN(S_cid, "cid");
    INTERN(S_st, "st");
    INTERN(S_started, "started");
    INTERN(S_nxt, "nxt");
    INTERN(S_ooo_s, "ooo_s");
    INTERN(S_max_end, "max_end");
    INTERN(S_recent, "recent");
    INTERN(S_recent_bytes, "recent_bytes");
    INTERN(S_fin_at, "fin_at");
    INTERN(S_hole_since, "hole_since");
    INTERN(S_peer_ack, "peer_ack");
    INTERN(S_payload_bytes, "payload_bytes");
    INTERN(S_delivered, "delivered");
    INTERN(S_end, "end");
    INTERN(S_info, "info");
    INTERN(S_decided, "decided");
    INTERN(S_tls, "tls");
    INTERN(S_splitters, "splitters");
    INTERN(S_broker, "broker");
    INTERN(S_bytes, "bytes");
    INTERN(S_kind, "kind");
    INTERN(S_to_broker, "to_broker");
    INTERN(S_to_client, "to_client");
    INTERN(S_finished, "_finished");
    INTERN(S_buf, "_buf");
    INTERN(S_state, "_state");
    INTERN(S_base, "_base");
    INTERN(S_max_frame_size, "max_frame_size");
    INTERN(S_ready, "ready");
    INTERN(S_frames, "frames");
    INTERN(S_last_frame, "_last_frame");
    INTERN(S_frame_bytes, "frame_bytes");
    INTERN(S_fed_bytes, "fed_bytes");
    INTERN(S_chunks, "_chunks");
    INTERN(S_parts, "_parts");
    INTERN(S_parts_len, "_parts_len");
    INTERN(S_need_off, "_need_off");
    INTERN(S_part_chunks, "_part_chunks");
    INTERN(S_pos, "_pos");
    INTERN(S_peak_buffered, "peak_buffered");
    INTERN(S_append, "append");
    INTERN(S_popleft, "popleft");
    INTERN(S_clear, "clear");
    INTERN(S_move_to_end, "move_to_end");
    INTERN(S_parser, "parser");
    INTERN(S_endpoints, "endpoints");
    INTERN(S_tcp, "tcp");
    INTERN(S_events, "_events");
    INTERN(S_next_idle_check, "next_idle_check");
    INTERN(S_c_buf, "buf");
    INTERN(S_c_pos, "pos");
    INTERN(S_c_index, "index");
    INTERN(S_c_bytes_captured, "bytes_captured");
    INTERN(S_c_bytes_wire, "bytes_wire");
    INTERN(S_c_truncated, "truncated");
    INTERN(S_c_ts, "ts");
    INTERN(S_c_layout, "layout");
    INTERN(S_on_frame, "on_frame");
    INTERN(S_conversation, "conversation");
    INTERN(S_client, "client");
    INTERN(S_req_validator, "req_validator");
    INTERN(S_compiled_frames, "compiled_frames");
#undef INTERN
    return PyModule_Create(&module);
}
