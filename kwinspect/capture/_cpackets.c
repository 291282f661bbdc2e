/* kwinspect.capture._cpackets: the compiled fast paths of capture/ (readers.py, packets.py).
 *
 * Three functions, each the C twin of a Python fast path that stays the reference:
 *
 *   scan_pcap(buf, pos, big_endian, nano, rec_len, linktype, index, RawPacket, limit)
 *       -> (packets, new_pos, bytes_wire, truncated)
 *   scan_pcapng(buf, pos, big_endian, interfaces, index, RawPacket, limit)
 *       -> (packets, new_pos, bytes_captured, bytes_wire, truncated, last_ts)
 *   tcp_segment(raw, endpoints, TcpSegment) -> TcpSegment | None
 *
 * The scanners take the records wholly inside `buf` from `pos` on and stop at the first one
 * that is not (cut by the end of the buffer, a corrupt length, a block that is not an
 * Enhanced Packet Block): the Python reader handles that one exactly as before, refills its
 * buffer and calls again.  tcp_segment parses Ethernet / Linux SLL / SLL2 / raw IP, then IPv4
 * (options allowed) or IPv6 (no extension headers), then TCP, for packets nothing odd
 * happened to (no fragment, nothing cut by the snaplen, no TSO zero length, endpoints already
 * known to the parser); anything else returns None and PacketParser's Python code takes it,
 * with its counters and issues.
 *
 * Hostile input: every length is checked against the bytes present before it is used, sizes
 * are compared in 64-bit arithmetic (no overflow), and nothing is allocated from a length
 * field beyond the bytes already in `buf` (a record's data is a slice of what is there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include "_cparse.h"

static int check_tuple_type(PyTypeObject *type, const char *what)
{
    if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s must be a NamedTuple class", what);
        return -1;
    }
    return 0;
}

/* A RawPacket(ts, linktype, data, wire_len, index); steals data. */
static PyObject *raw_packet(PyTypeObject *type, double ts, PyObject *linktype, PyObject *data,
                            unsigned long long wire_len, long long index)
{
    PyObject *items[5];
    items[0] = PyFloat_FromDouble(ts);
    Py_INCREF(linktype);
    items[1] = linktype;
    items[2] = data;
    items[3] = PyLong_FromUnsignedLongLong(wire_len);
    items[4] = PyLong_FromLongLong(index);
    return new_tuple_of(type, items, 5);
}

static PyObject *scan_pcap(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, rec_len, limit;
    int big, nano;
    PyObject *linktype;
    long long index;
    PyTypeObject *raw_type;
    if (!PyArg_ParseTuple(args, "y*nppnO!LO!n", &view, &pos, &big, &nano, &rec_len, &PyLong_Type,
                          &linktype, &index, &PyType_Type, &raw_type, &limit))
        return NULL;
    PyObject *out = NULL;
    if (check_tuple_type(raw_type, "RawPacket") < 0)
        goto done;
    if (pos < 0 || pos > view.len || rec_len < 16) {
        PyErr_SetString(PyExc_ValueError, "scan_pcap: bad position or record header length");
        goto done;
    }
    const unsigned char *b = view.buf;
    const Py_ssize_t blen = view.len;
    const double div = nano ? 1e9 : 1e6;
    unsigned long long bytes_wire = 0, trunc = 0;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        goto done;
    for (Py_ssize_t count = 0; count < limit; count++) {
        if (blen - pos < rec_len)
            break;
        const unsigned char *h = b + pos;
        uint32_t sec = rd32(h, big), frac = rd32(h + 4, big), caplen = rd32(h + 8, big);
        uint64_t wire = rd32(h + 12, big);
        if ((uint64_t)caplen > (uint64_t)(blen - pos - rec_len))
            break; /* the record runs past the buffer: the Python reader refills or reports */
        Py_ssize_t start = pos + rec_len;
        if (wire != caplen) {
            if (wire > caplen)
                trunc++;
            else /* some writers leave orig_len 0 */
                wire = caplen;
        }
        PyObject *data = PyBytes_FromStringAndSize((const char *)b + start, (Py_ssize_t)caplen);
        if (data == NULL) {
            Py_DECREF(list);
            goto done;
        }
        /* the expression of readers.py: sec + frac / div */
        PyObject *pkt = raw_packet(raw_type, (double)sec + (double)frac / div, linktype, data, wire, index + 1);
        if (pkt == NULL || PyList_Append(list, pkt) < 0) {
            Py_XDECREF(pkt);
            Py_DECREF(list);
            goto done;
        }
        Py_DECREF(pkt);
        index++;
        bytes_wire += wire;
        pos = start + (Py_ssize_t)caplen;
    }
    out = Py_BuildValue("(NnKK)", list, pos, bytes_wire, trunc);
done:
    PyBuffer_Release(&view);
    return out;
}

typedef struct {
    PyObject *linktype;
    double div;
    double tsoffset_f;
} iface_t;

static PyObject *scan_pcapng(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, limit;
    int big;
    PyObject *ifaces;
    long long index;
    PyTypeObject *raw_type;
    if (!PyArg_ParseTuple(args, "y*npO!LO!n", &view, &pos, &big, &PyTuple_Type, &ifaces, &index,
                          &PyType_Type, &raw_type, &limit))
        return NULL;
    PyObject *out = NULL;
    iface_t *itf = NULL;
    Py_ssize_t n_if = PyTuple_GET_SIZE(ifaces);
    if (check_tuple_type(raw_type, "RawPacket") < 0)
        goto done;
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "scan_pcapng: bad position");
        goto done;
    }
    itf = PyMem_Calloc(n_if ? (size_t)n_if : 1, sizeof(iface_t));
    if (itf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_if; i++) {
        /* (linktype: int, div: float, tsoffset: int), as readers._Iface holds them */
        PyObject *t = PyTuple_GET_ITEM(ifaces, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || !PyLong_Check(PyTuple_GET_ITEM(t, 0))
            || !PyFloat_Check(PyTuple_GET_ITEM(t, 1)) || !PyLong_Check(PyTuple_GET_ITEM(t, 2))) {
            PyErr_SetString(PyExc_TypeError, "scan_pcapng: interfaces are (linktype, div, tsoffset)");
            goto done;
        }
        itf[i].linktype = PyTuple_GET_ITEM(t, 0);
        itf[i].div = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(t, 1));
        /* int + float in Python converts the int to the nearest double first: the same here */
        itf[i].tsoffset_f = PyLong_AsDouble(PyTuple_GET_ITEM(t, 2));
        if (itf[i].tsoffset_f == -1.0 && PyErr_Occurred())
            goto done;
    }
    const unsigned char *b = view.buf;
    const Py_ssize_t blen = view.len;
    unsigned long long n_cap = 0, n_wire = 0, n_trunc = 0;
    double last_ts = 0.0;
    int any = 0;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        goto done;
    for (Py_ssize_t count = 0; count < limit; count++) {
        if (blen - pos < 32)
            break;
        const unsigned char *h = b + pos;
        uint32_t btype = rd32(h, big), bl = rd32(h + 4, big);
        if (btype != 6 || bl < 32 || (uint64_t)bl > (uint64_t)(blen - pos) || (bl & 3))
            break; /* not an Enhanced Packet Block wholly in the buffer: the general path */
        uint32_t iface_id = rd32(h + 8, big), hi = rd32(h + 12, big), lo = rd32(h + 16, big);
        uint32_t caplen = rd32(h + 20, big);
        uint64_t wire = rd32(h + 24, big);
        if ((Py_ssize_t)iface_id >= n_if || 32 + (uint64_t)caplen > (uint64_t)bl)
            break;
        const iface_t *f = &itf[iface_id];
        n_cap += caplen;
        if (wire > caplen)
            n_trunc++;
        else
            wire = caplen;
        n_wire += wire;
        /* the expression of readers.py: tsoffset + ((hi << 32) | lo) / div */
        double ts = f->tsoffset_f + (double)(((uint64_t)hi << 32) | lo) / f->div;
        PyObject *data = PyBytes_FromStringAndSize((const char *)h + 28, (Py_ssize_t)caplen);
        if (data == NULL) {
            Py_DECREF(list);
            goto done;
        }
        PyObject *pkt = raw_packet(raw_type, ts, f->linktype, data, wire, index + 1);
        if (pkt == NULL || PyList_Append(list, pkt) < 0) {
            Py_XDECREF(pkt);
            Py_DECREF(list);
            goto done;
        }
        Py_DECREF(pkt);
        index++;
        last_ts = ts;
        any = 1;
        pos += bl;
    }
    if (any)
        out = Py_BuildValue("(NnKKKd)", list, pos, n_cap, n_wire, n_trunc, last_ts);
    else
        out = Py_BuildValue("(NnKKKO)", list, pos, n_cap, n_wire, n_trunc, Py_None);
done:
    PyMem_Free(itf);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *tcp_segment(PyObject *self, PyObject *args)
{
    PyObject *raw, *endpoints;
    PyTypeObject *seg_type;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyTuple_Type, &raw, &PyDict_Type, &endpoints, &PyType_Type, &seg_type))
        return NULL;
    if (check_tuple_type(seg_type, "TcpSegment") < 0)
        return NULL;
    if (PyTuple_GET_SIZE(raw) < 5)
        Py_RETURN_NONE;
    PyObject *lt_obj = PyTuple_GET_ITEM(raw, 1), *data = PyTuple_GET_ITEM(raw, 2);
    if (!PyLong_CheckExact(lt_obj) || !PyBytes_CheckExact(data))
        Py_RETURN_NONE;
    int overflow = 0;
    long lt = PyLong_AsLongAndOverflow(lt_obj, &overflow);
    if (overflow || (lt == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    tcp_view_t v;
    if (!tcp_view(p, PyBytes_GET_SIZE(data), lt, &v))
        Py_RETURN_NONE;
    PyObject *a = known_endpoint(endpoints, v.src, v.iplen, v.sport);
    if (a == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* a new endpoint: PacketParser.endpoint makes it */
    }
    PyObject *bp = known_endpoint(endpoints, v.dst, v.iplen, v.dport);
    if (bp == NULL) {
        Py_DECREF(a);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *ts = PyTuple_GET_ITEM(raw, 0), *index = PyTuple_GET_ITEM(raw, 4);
    Py_INCREF(ts);
    Py_INCREF(index);
    PyObject *items[9] = {
        ts, a, bp,
        PyLong_FromUnsignedLong(v.seq),
        PyLong_FromUnsignedLong(v.ack),
        PyLong_FromLong(v.flags),
        PyBytes_FromStringAndSize((const char *)p + v.payload_off, v.payload_len),
        index,
        PyLong_FromLong(0),
    };
    return new_tuple_of(seg_type, items, 9);
}

static PyMethodDef methods[] = {
    {"scan_pcap", scan_pcap, METH_VARARGS,
     "scan_pcap(buf, pos, big_endian, nano, rec_len, linktype, index, RawPacket, limit)\n"
     "-> (packets, new_pos, bytes_wire, truncated): the pcap records wholly inside buf."},
    {"scan_pcapng", scan_pcapng, METH_VARARGS,
     "scan_pcapng(buf, pos, big_endian, interfaces, index, RawPacket, limit)\n"
     "-> (packets, new_pos, bytes_captured, bytes_wire, truncated, last_ts): the Enhanced\n"
     "Packet Blocks wholly inside buf; interfaces: ((linktype, div, tsoffset), ...)."},
    {"tcp_segment", tcp_segment, METH_VARARGS,
     "tcp_segment(raw, endpoints, TcpSegment) -> TcpSegment | None: link, IP and TCP headers\n"
     "of an ordinary packet; None for anything the Python parser must judge."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kwinspect.capture._cpackets",
    "Compiled fast paths of kwinspect.capture (pcap/pcapng records, link/IP/TCP headers).", -1, methods,
};

PyMODINIT_FUNC PyInit__cpackets(void) { return PyModule_Create(&module); }
