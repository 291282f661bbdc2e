/* The link/IP/TCP header parse of the compiled core, shared by capture/_cpackets.c
 * (tcp_segment) and kwinspect/_cdriver.c (feed_chunk's loop over capture records), so the
 * rules for what counts as an ordinary packet exist once in C.  Include after Python.h.
 *
 * tcp_view() parses Ethernet (no VLAN tag), Linux SLL/SLL2 and raw IP, then IPv4 (options
 * allowed; not a fragment, no TSO zero length, not cut by the snaplen) or IPv6 (no
 * extension headers, not a jumbogram, not cut), then TCP with a sane data offset.  It
 * returns 0 for anything else (packets.PacketParser's Python code judges those).  Every
 * length is compared with the bytes present before it is used.
 */
#ifndef KWINSPECT_CPARSE_H
#define KWINSPECT_CPARSE_H
#include <stdint.h>
#include <string.h>

typedef struct {
    const unsigned char *src, *dst; /* the IP addresses, iplen bytes each */
    Py_ssize_t iplen;
    unsigned sport, dport;
    uint32_t seq, ack;
    unsigned flags;
    Py_ssize_t payload_off, payload_len; /* the TCP payload inside the packet's bytes */
} tcp_view_t;

static inline uint32_t rd32(const unsigned char *p, int big)
{
    if (big)
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

/* A new instance of a tuple subclass with `n` items (what tuple.__new__(cls, items) makes);
 * steals the references in items, also on failure. */
static PyObject *new_tuple_of(PyTypeObject *type, PyObject **items, Py_ssize_t n)
{
    PyObject *t = type->tp_alloc(type, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL) { /* an allocation failed: drop the half-made tuple */
            for (Py_ssize_t j = i + 1; j < n; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

static inline unsigned cp_be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

static inline uint32_t cp_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* 1 and *v filled for an ordinary TCP packet of link type lt, else 0 */
static inline int tcp_view(const unsigned char *p, Py_ssize_t n, long lt, tcp_view_t *v)
{
    Py_ssize_t off;
    unsigned etype;
    /* the link layer: the types packets.PacketParser._parse reads without a loop (VLAN tags
     * and the BSD loopback families take the Python path) */
    if (lt == 1) { /* Ethernet */
        if (n < 14)
            return 0;
        etype = cp_be16(p + 12);
        off = 14;
    } else if (lt == 113) { /* Linux SLL */
        if (n < 16)
            return 0;
        etype = cp_be16(p + 14);
        off = 16;
    } else if (lt == 276) { /* Linux SLL2 */
        if (n < 20)
            return 0;
        etype = cp_be16(p);
        off = 20;
    } else if (lt == 101 || lt == 12 || lt == 14 || lt == 228 || lt == 229) { /* raw IP */
        if (n < 1)
            return 0;
        unsigned ver = p[0] >> 4;
        etype = ver == 4 ? 0x0800 : ver == 6 ? 0x86DD : 0;
        off = 0;
    } else {
        return 0;
    }
    Py_ssize_t q, end;
    if (etype == 0x0800) {
        if (n - off < 20)
            return 0;
        const unsigned char *ip = p + off;
        unsigned ihl = (ip[0] & 0x0F) * 4;
        unsigned total = cp_be16(ip + 2);
        if (ip[0] >> 4 != 4 || ihl < 20 || total == 0 || total < ihl)
            return 0; /* bad headers, or a TSO zero length: the Python path judges */
        if (cp_be16(ip + 6) & 0x3FFF || ip[9] != 6)
            return 0; /* a fragment, or not TCP */
        if ((Py_ssize_t)total > n - off)
            return 0; /* the snaplen cut it: the Python path counts what is missing */
        v->src = ip + 12;
        v->dst = ip + 16;
        v->iplen = 4;
        q = off + ihl;
        end = off + total;
    } else if (etype == 0x86DD) {
        if (n - off < 40)
            return 0;
        const unsigned char *ip = p + off;
        unsigned plen = cp_be16(ip + 4);
        if (ip[0] >> 4 != 6 || plen == 0 || ip[6] != 6)
            return 0; /* bad version, jumbogram/TSO, extension headers or not TCP */
        if ((Py_ssize_t)plen > n - off - 40)
            return 0;
        v->src = ip + 8;
        v->dst = ip + 24;
        v->iplen = 16;
        q = off + 40;
        end = off + 40 + plen;
    } else {
        return 0;
    }
    if (end - q < 20)
        return 0;
    const unsigned char *t = p + q;
    Py_ssize_t hl = (t[12] >> 4) * 4;
    if (hl < 20 || q + hl > end)
        return 0;
    v->sport = cp_be16(t);
    v->dport = cp_be16(t + 2);
    v->seq = cp_be32(t + 4);
    v->ack = cp_be32(t + 8);
    v->flags = t[13];
    v->payload_off = q + hl;
    v->payload_len = end - q - hl;
    return 1;
}

/* The last few endpoints found, so an ordinary packet does not build two (ip bytes, port)
 * keys and look them up in the parser's dict (~0.15 us each: 5% of `summary` on a capture
 * of a few busy connections). Valid while the dict is the same object and has not shrunk:
 * the parser only adds endpoints, or clears the dict when it grows too big (it checks every
 * packet, so a clear is seen at the next one). One memo per module that includes this. */
#define EP_MEMO_SIZE 4
typedef struct {
    unsigned char ip[16];
    Py_ssize_t iplen;
    unsigned port;
    PyObject *ep; /* strong */
} ep_memo_entry_t;
static struct {
    PyObject *dict; /* strong, so its address cannot be reused by another dict */
    Py_ssize_t size;
    int used, next;
    ep_memo_entry_t e[EP_MEMO_SIZE];
} g_ep_memo;

static void ep_memo_reset(PyObject *endpoints)
{
    for (int i = 0; i < g_ep_memo.used; i++)
        Py_CLEAR(g_ep_memo.e[i].ep);
    g_ep_memo.used = g_ep_memo.next = 0;
    Py_XINCREF(endpoints);
    Py_XSETREF(g_ep_memo.dict, endpoints);
}

/* The parser's endpoint for (ip, port) (a new reference), or NULL: with no error set when
 * it has none yet (PacketParser.endpoint makes it), else with the error. */
static PyObject *known_endpoint(PyObject *endpoints, const unsigned char *ip, Py_ssize_t iplen, unsigned port)
{
    Py_ssize_t size = PyDict_GET_SIZE(endpoints);
    if (g_ep_memo.dict != endpoints || size < g_ep_memo.size)
        ep_memo_reset(endpoints);
    g_ep_memo.size = size;
    for (int i = 0; i < g_ep_memo.used; i++) {
        ep_memo_entry_t *m = &g_ep_memo.e[i];
        if (m->port == port && m->iplen == iplen && memcmp(m->ip, ip, (size_t)iplen) == 0)
            return Py_NewRef(m->ep);
    }
    /* the key (ip bytes, port), as PacketParser.endpoint makes it (built directly, without
     * Py_BuildValue's format parsing) */
    PyObject *key = PyTuple_New(2);
    if (key == NULL)
        return NULL;
    PyObject *ipb = PyBytes_FromStringAndSize((const char *)ip, iplen), *po = PyLong_FromUnsignedLong(port);
    if (ipb == NULL || po == NULL) {
        Py_XDECREF(ipb);
        Py_XDECREF(po);
        Py_DECREF(key);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, ipb);
    PyTuple_SET_ITEM(key, 1, po);
    PyObject *ep = PyDict_GetItemWithError(endpoints, key); /* borrowed */
    Py_DECREF(key);
    if (ep == NULL)
        return NULL;
    if (iplen <= 16) {
        ep_memo_entry_t *m = &g_ep_memo.e[g_ep_memo.next];
        if (g_ep_memo.next < g_ep_memo.used)
            Py_CLEAR(m->ep);
        else
            g_ep_memo.used++;
        memcpy(m->ip, ip, (size_t)iplen);
        m->iplen = iplen;
        m->port = port;
        m->ep = Py_NewRef(ep);
        g_ep_memo.next = (g_ep_memo.next + 1) % EP_MEMO_SIZE;
    }
    return Py_NewRef(ep);
}

#endif
