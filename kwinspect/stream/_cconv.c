/* kwinspect.stream._cconv: the compiled common path of a Kafka conversation (conversation.py).
 *
 *   frames(conv, events, start, from_client, validator[, sink]) -> int
 *
 * The C twin of what one ordinary frame costs in Python: Dissector._frames_to_conversation
 * -> Conversation.on_request (decode, the pending entry) or Conversation.on_response
 * (decode, _after_response, emit: the labels, the Exchange).  It walks `events` (what the
 * splitter's events() handed out) from index `start` and takes each Frame it can; it stops
 * at the first event that is not a Frame or that is not the ordinary case, and returns its
 * index (len(events) when it took them all).  The caller hands that event to the Python
 * methods, which stay the reference, and calls again after it.  With a `sink` list, when it
 * took them all and the conversation's pending rows are only Exchanges (pop_events would
 * hand them over as they are), it moves them to the end of `sink` itself and returns
 * len(events) + 1: the caller's pop_events is done too.
 *
 * Each frame is taken in two phases, like the driver's segments.  The first reads and
 * decides, changing nothing: a request is the ordinary case when the connection is not
 * between raw SASL tokens, the compiled decoder decodes it (decode.py would return the very
 * same Message), it is not ApiVersions, SaslHandshake or an api that carries secrets, its
 * version is one the broker advertised (or nothing was advertised), it is not an acks=0
 * Produce, its correlation id is not in flight, its frame fits the decoded-bytes budget
 * (PENDING_DECODED_BYTES) and one more request fits max_in_flight.  A response is the
 * ordinary case when no SASL token waits, its correlation id is the oldest in flight, that
 * request was kept decoded, neither request nor response has issues, the api is none of
 * the above nor one SharedState.learn learns from (Metadata, FindCoordinator,
 * DescribeCluster), the compiled labels (labels.compiled_exchange) answer and find no error
 * code and no record set with issues.  Anything else returns before anything changed, and
 * the Python method runs as it always did: it alone makes issue, anomaly and error rows.
 * The second phase writes the fields those methods write, with the same values: the
 * counters, last_correlation_id, _api_versions_seen, the pending map and
 * SharedState.pending_bytes, the validator's last_correlation_id, exchange_counter, the
 * Exchange (built with every field emit gives it; broker_id from SharedState.broker_id_for's
 * cache when valid, else from the method; latency from the same float expression and
 * Python's own round()), and
 * frame_packets of the last frame taken.  It fails only when memory does.
 *
 * With SharedState.defer_bodies set (configure_deferred()), a Produce request is scanned
 * rather than decoded (compiled.exchange_scanner: decoding's checks, the body noted, a
 * DeferredMessage that decodes its body when read), and so is its response: the Exchange's
 * topics and throttle then come from the scans' notes, without the labels walk (the scans
 * gave up on any error code or troubled record set).  A frame the scan leaves is decoded
 * as above; a response it leaves goes to Python, which reads the request's body.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <structmember.h>

/* api keys (protocol/schema/api_keys.py) */
#define PRODUCE 0
#define FETCH 1
#define METADATA 3
#define FIND_COORDINATOR 10
#define SASL_HANDSHAKE 17
#define API_VERSIONS 18
#define DESCRIBE_CLUSTER 60

#define DECLINE 0
#define TAKEN 1

static PyObject *S_requests, *S_responses, *S_frame_packets, *S_sasl_raw, *S_sasl_pending, *S_pending,
    *S_advertised, *S_max_in_flight, *S_shared, *S_events, *S_last_correlation_id, *S_api_versions_seen,
    *S_stream, *S_client_text, *S_broker_text, *S_tcp_stream, *S_broker, *S_pending_bytes,
    *S_topic_names, *S_exchange_counter, *S_broker_id_for, *S_api_key, *S_api_version, *S_header,
    *S_body, *S_issues, *S_size, *S_message, *S_frame, *S_counted, *S_correlation_id, *S_client_id,
    *S_acks, *S_throttle_time_ms, *S_max_wait_ms, *S_compiled_exchange, *S_brokers, *S_brokers_seen,
    *S_broker_ids, *S_closed, *S_defer_bodies, *S_facts;

/* configure()'s objects */
static PyTypeObject *g_conv_type, *g_shared_type, *g_pending_type, *g_exchange_type, *g_frame_type;
static PyObject *g_decoder_fn;  /* compiled.exchange_decoder(is_request, api_key, version) -> fn | None */
static PyObject *g_labels;      /* the labels module: its compiled_exchange, read per exchange */
static PyObject *g_fetch_carried_records; /* (body, names) -> bool */
static PyObject *g_round, *g_api_names, *g_secret_apis, *g_long_poll_fraction, *g_status_paired;
static PyObject *g_empty_dict, *g_zero, *g_three;
static long long g_pending_limit;
static PyObject *g_decoders; /* (is_request << 32 | api_key << 16 | version) -> decoder (| 1 << 40: scanner) */
/* configure_deferred()'s: compiled.exchange_scanner and the DeferredMessage it makes; a
 * Produce exchange of a SharedState with defer_bodies set is scanned, not decoded: its
 * messages decode their bodies when read, its row comes from what the scan noted */
static PyObject *g_scanner_fn;
static PyTypeObject *g_deferred_type;

/* slot offsets of the dataclasses with __slots__ the C builds: Exchange's fields in order
 * (its __init__ only assigns them), and _Pending's */
#define EXCHANGE_FIELDS 28
#define PENDING_FIELDS 8
static Py_ssize_t g_exchange_off[EXCHANGE_FIELDS], g_pending_off[PENDING_FIELDS];

/* ---- attribute access: kwinspect/_cattrs.h, shared with _cdriver.c ------------------- */
#include "../_cattrs.h"

/* mod.name: a module's attribute from its dict, where getattr finds it first; other
 * objects (and a name not in the dict) by getattr */
static PyObject *module_attr(PyObject *mod, PyObject *name)
{
    if (PyModule_CheckExact(mod)) {
        PyObject *v = PyDict_GetItemWithError(PyModule_GetDict(mod), name);
        if (v != NULL)
            return Py_NewRef(v);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetAttr(mod, name);
}

/* Python's round(x, 3) (the decimal value of x rounded half to even, as the nearest double)
 * without its decimal conversion (1.8% of `exchanges` on small produces): when x * 1000 is
 * below 1e9 its product is off by under 2e-7, so if it is not within 1e-6 of a half the
 * rounded integer r is the exact value's, and r / 1000 (one correctly rounded division) is
 * the double nearest r * 10^-3, which is what round() gives; a zero keeps x's sign as
 * round() does. 0: the caller asks round() itself (near a half, huge, or not finite). */
static int round3(double x, double *out)
{
    double y = x * 1000.0;
    if (!(fabs(y) < 1e9))
        return 0;
    double lower = floor(y), frac = y - lower;
    if (fabs(frac - 0.5) < 1e-6)
        return 0;
    double r = frac < 0.5 ? lower : lower + 1.0;
    *out = r == 0.0 ? copysign(0.0, x) : r / 1000.0;
    return 1;
}

/* a small int object attribute (+1): the counters the methods increment */
static int bump(PyObject *obj, PyObject *name, Slot *c, long long by, long long *now)
{
    long long v;
    int r = get_ll_c(obj, name, c, &v);
    if (r != 0)
        return r < 0 ? -1 : 1;
    if (__builtin_add_overflow(v, by, &v))
        return 1;
    if (now != NULL)
        *now = v;
    return set_ll_c(obj, name, c, v);
}

#define BUMP(obj, name, by, now) __extension__({ static Slot c_; bump((obj), (name), &c_, (by), (now)); })

/* An exception from Python code the methods call inside a try (the decoders): declined, as
 * decode.py's `except Exception` sends the frame to the reference; anything that is not an
 * Exception (KeyboardInterrupt) goes up. */
static int swallow(void)
{
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return DECLINE;
}

static int configured(void)
{
    if (g_conv_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cconv.configure() was not called");
        return 0;
    }
    return 1;
}

/* ---- the decoders -------------------------------------------------------------------------- */

/* The compiled decoder decode.py uses for (direction, key, version) (borrowed), NULL when
 * there is none (declined) or on error (exception set).  Only decoders are cached (real
 * versions: compiled.exchange_decoder answers None for the rest), so garbage versions in
 * hostile frames never grow the cache. */
/* the last few answers of the cache (borrowed from g_decoders, which only grows until
 * memo_clear() empties both): a frame's lookup without an int key made and hashed */
#define MEMO 4
static long long memo_key[MEMO];
static PyObject *memo_fn[MEMO];
static int memo_next;

static void memo_clear(void)
{
    for (int i = 0; i < MEMO; i++)
        memo_fn[i] = NULL;
    PyDict_Clear(g_decoders);
}

static PyObject *maker_for(PyObject *maker_fn, long long kind, int is_request, long api_key, long version)
{
    if (api_key < 0 || api_key > 0x7FFF || version < 0 || version > 0x7FFF || maker_fn == NULL)
        return NULL;
    long long k = kind | ((long long)is_request << 32) | (api_key << 16) | version;
    for (int i = 0; i < MEMO; i++)
        if (memo_fn[i] != NULL && memo_key[i] == k)
            return memo_fn[i];
    PyObject *key = PyLong_FromLongLong(k);
    if (key == NULL)
        return NULL;
    PyObject *fn = PyDict_GetItemWithError(g_decoders, key);
    if (fn != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        if (fn != NULL) {
            memo_key[memo_next] = k;
            memo_fn[memo_next] = fn;
            memo_next = (memo_next + 1) % MEMO;
        }
        return fn;
    }
    fn = PyObject_CallFunction(maker_fn, "Oll", is_request ? Py_True : Py_False, api_key, version);
    if (fn == NULL || fn == Py_None || PyDict_SetItem(g_decoders, key, fn) < 0) {
        Py_DECREF(key);
        Py_XDECREF(fn);
        return NULL;
    }
    Py_DECREF(key);
    Py_DECREF(fn); /* the cache holds it */
    return fn;
}

#define decoder_for(is_request, api_key, version) maker_for(g_decoder_fn, 0, (is_request), (api_key), (version))
/* the scanner of the same (exchange_scanner), borrowed; NULL: none (or an exception) */
#define scanner_for(is_request, api_key, version) \
    maker_for(g_scanner_fn, 1LL << 40, (is_request), (api_key), (version))

/* A decoded Message's fields the path needs; 0 when it is not what the compiled decoder
 * makes without issues (declined), -1 on error.  New references in *out. */
typedef struct {
    PyObject *api_key, *api_version, *header, *body, *issues;
} Fields;

static void fields_clear(Fields *f)
{
    Py_CLEAR(f->api_key);
    Py_CLEAR(f->api_version);
    Py_CLEAR(f->header);
    Py_CLEAR(f->body);
    Py_CLEAR(f->issues);
}

/* A message's fields, or DECLINE when one is not what the walk takes. ``deferred``: a
 * DeferredMessage, whose facts tuple (topics, volumes, throttle, acks) goes in f->body in
 * place of its body (reading that would decode it). */
static int fields_of(PyObject *msg, Fields *f, int deferred)
{
    if ((f->api_key = GET(msg, S_api_key)) == NULL || (f->api_version = GET(msg, S_api_version)) == NULL
        || (f->header = GET(msg, S_header)) == NULL
        || (f->body = deferred ? GET(msg, S_facts) : GET(msg, S_body)) == NULL
        || (f->issues = GET(msg, S_issues)) == NULL)
        return -1;
    if (!PyLong_CheckExact(f->api_key) || !PyLong_CheckExact(f->api_version) || !PyDict_CheckExact(f->header)
        || !PyList_CheckExact(f->issues) || PyList_GET_SIZE(f->issues) != 0)
        return DECLINE;
    if (deferred ? !PyTuple_CheckExact(f->body) || PyTuple_GET_SIZE(f->body) != 4
                       || !PyTuple_CheckExact(PyTuple_GET_ITEM(f->body, 0))
                 : !PyDict_CheckExact(f->body))
        return DECLINE;
    return TAKEN;
}

/* shared.defer_bodies is True (1), else 0; -1 on error */
static int defers(PyObject *conv)
{
    if (g_scanner_fn == NULL)
        return 0;
    PyObject *shared = GET(conv, S_shared), *flag;
    if (shared == NULL)
        return -1;
    int r = 0;
    if (Py_TYPE(shared) == g_shared_type) {
        if ((flag = GET(shared, S_defer_bodies)) == NULL)
            r = -1;
        else {
            r = flag == Py_True;
            Py_DECREF(flag);
        }
    }
    Py_DECREF(shared);
    return r;
}

/* an api this path leaves to Python: ApiVersions (advertised, client software), SASL and the
 * apis that carry secrets (redaction, raw tokens), and, for responses, the apis
 * SharedState.learn learns from (the labels must see what it learned) */
static int special_api(long api_key, PyObject *key_obj, int response)
{
    if (api_key == API_VERSIONS || api_key == SASL_HANDSHAKE)
        return 1;
    if (response && (api_key == METADATA || api_key == FIND_COORDINATOR || api_key == DESCRIBE_CLUSTER))
        return 1;
    return PySet_Contains(g_secret_apis, key_obj); /* -1 on error */
}

/* d.get(key), borrowed; NULL when absent (or on error: the caller checks PyErr_Occurred) */
static PyObject *dict_get(PyObject *d, PyObject *key)
{
    return PyDict_GetItemWithError(d, key);
}

/* ---- requests ------------------------------------------------------------------------------ */

static int take_request(PyObject *conv, PyObject *data, PyObject *ts_first, PyObject *ts_last, PyObject *pkt_first,
                        PyObject *pkt_last, PyObject *validator)
{
    int result = -1, r;
    PyObject *sasl_raw = NULL, *msg = NULL, *advertised = NULL, *pending = NULL, *shared = NULL,
             *seen = NULL, *key = NULL, *entry = NULL, *counted = NULL;
    Fields f = {0};
    long long max_in_flight, pending_bytes;
    Py_ssize_t size = PyBytes_GET_SIZE(data);

    /* -- decide --------------------------------------------------------------------------- */
    if ((sasl_raw = GET(conv, S_sasl_raw)) == NULL)
        goto done;
    if (sasl_raw != Py_False || size < 4) {
        result = DECLINE;
        goto done;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    long api_key = (int16_t)((p[0] << 8) | p[1]), version = (int16_t)((p[2] << 8) | p[3]);
    int deferred = api_key == PRODUCE ? defers(conv) : 0;
    if (deferred < 0)
        goto done;
    if (deferred) { /* scanned: decoded when read (else, not the clean case, decoded now) */
        PyObject *scan = scanner_for(1, api_key, version);
        if (scan == NULL && PyErr_Occurred()) {
            result = swallow();
            goto done;
        }
        if (scan != NULL) {
            Py_INCREF(scan);
            msg = PyObject_CallOneArg(scan, data);
            Py_DECREF(scan);
            if (msg == NULL) {
                result = swallow();
                goto done;
            }
        }
        if (msg == NULL || msg == Py_None || Py_TYPE(msg) != g_deferred_type) {
            Py_CLEAR(msg);
            deferred = 0;
        }
    }
    if (!deferred) {
        PyObject *decode = decoder_for(1, api_key, version);
        if (decode == NULL) {
            result = PyErr_Occurred() ? swallow() : DECLINE;
            goto done;
        }
        Py_INCREF(decode); /* (the cache may change while it runs Python code) */
        msg = PyObject_CallOneArg(decode, data);
        Py_DECREF(decode);
        if (msg == NULL) {
            result = swallow();
            goto done;
        }
    }
    if (msg == Py_None || (r = fields_of(msg, &f, deferred)) == DECLINE) {
        result = DECLINE;
        goto done;
    }
    if (r < 0)
        goto done;
    PyObject *cid = dict_get(f.header, S_correlation_id);
    if (cid == NULL && PyErr_Occurred())
        goto done;
    if (cid == NULL || !PyLong_CheckExact(cid) || PyLong_AsLong(f.api_key) != api_key
        || PyLong_AsLong(f.api_version) != version) {
        result = DECLINE;
        goto done;
    }
    if ((r = special_api(api_key, f.api_key, 0)) != 0) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    if ((advertised = GET(conv, S_advertised)) == NULL)
        goto done;
    if (advertised != Py_None) { /* on_request's "usual answer": an advertised version */
        if (!PyDict_CheckExact(advertised)) {
            result = DECLINE;
            goto done;
        }
        PyObject *rng = dict_get(advertised, f.api_key);
        if (rng == NULL && PyErr_Occurred())
            goto done;
        if (rng == NULL || !PyTuple_CheckExact(rng) || PyTuple_GET_SIZE(rng) != 2) {
            result = DECLINE;
            goto done;
        }
        int lo = PyObject_RichCompareBool(PyTuple_GET_ITEM(rng, 0), f.api_version, Py_LE);
        int hi = lo == 1 ? PyObject_RichCompareBool(f.api_version, PyTuple_GET_ITEM(rng, 1), Py_LE) : lo;
        if (lo < 0 || hi < 0)
            goto done;
        if (!lo || !hi) {
            result = DECLINE;
            goto done;
        }
    }
    if (api_key == PRODUCE && (deferred || PyDict_GET_SIZE(f.body) > 0)) { /* acks=0: no response expected */
        PyObject *acks = deferred ? PyTuple_GET_ITEM(f.body, 3) : dict_get(f.body, S_acks);
        if (acks == NULL && PyErr_Occurred())
            goto done;
        if (acks == Py_None && deferred)
            acks = NULL; /* (no acks field) */
        if (acks != NULL) {
            if ((r = PyObject_RichCompareBool(acks, g_zero, Py_EQ)) != 0) {
                result = r < 0 ? -1 : DECLINE;
                goto done;
            }
        }
    }
    if ((pending = GET(conv, S_pending)) == NULL || (shared = GET(conv, S_shared)) == NULL)
        goto done;
    if (!PyODict_CheckExact(pending) || Py_TYPE(shared) != g_shared_type) {
        result = DECLINE;
        goto done;
    }
    if ((r = PyDict_Contains(pending, cid)) != 0) { /* a duplicate correlation id */
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    if ((r = get_ll(conv, S_max_in_flight, &max_in_flight)) != 0
        || (r = get_ll(shared, S_pending_bytes, &pending_bytes)) != 0) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    if (PyDict_GET_SIZE(pending) + 1 > max_in_flight || pending_bytes > g_pending_limit - size) {
        result = DECLINE;
        goto done;
    }
    if ((seen = GET(conv, S_api_versions_seen)) == NULL)
        goto done;
    if (!PySet_CheckExact(seen)) {
        result = DECLINE;
        goto done;
    }

    /* -- write (what on_request writes, in its order) --------------------------------------- */
    if ((r = BUMP(conv, S_requests, 1, NULL)) != 0) {
        result = r < 0 ? -1 : DECLINE; /* (an odd counter: nothing written yet) */
        goto done;
    }
    if (SET(conv, S_last_correlation_id, cid) < 0)
        goto done;
    if ((key = PyTuple_Pack(2, f.api_key, f.api_version)) == NULL || PySet_Add(seen, key) < 0)
        goto done;
    if (set_ll(shared, S_pending_bytes, pending_bytes + size) < 0)
        goto done;
    if ((counted = PyLong_FromSsize_t(size)) == NULL)
        goto done;
    if ((entry = g_pending_type->tp_alloc(g_pending_type, 0)) == NULL)
        goto done;
    /* _Pending(msg, ts_first, ts_last, False, pkt_first, pkt_last, None, len(frame)) */
    PyObject *values[PENDING_FIELDS] = {msg, ts_first, ts_last, Py_False, pkt_first, pkt_last, Py_None, counted};
    for (int i = 0; i < PENDING_FIELDS; i++) {
        Py_INCREF(values[i]);
        *(PyObject **)((char *)entry + g_pending_off[i]) = values[i];
    }
    if (PyObject_SetItem(pending, cid, entry) < 0)
        goto done;
    /* the driver's line after on_request: the validator follows the connection's ids */
    if (SET(validator, S_last_correlation_id, cid) < 0)
        goto done;
    result = TAKEN;
done:
    Py_XDECREF(sasl_raw);
    Py_XDECREF(msg);
    Py_XDECREF(advertised);
    Py_XDECREF(pending);
    Py_XDECREF(shared);
    Py_XDECREF(seen);
    Py_XDECREF(key);
    Py_XDECREF(entry);
    Py_XDECREF(counted);
    fields_clear(&f);
    return result;
}

/* ---- responses ----------------------------------------------------------------------------- */

/* brokers == seen (two exact dicts), the answer of the last comparison reused while neither
 * dict has changed since: CPython 3.11 gives every dict a version tag, unique across all
 * dicts and renewed by every change, and the values compared are (host, port) tuples that
 * cannot change in place (checked before an answer is kept; on later versions, where the
 * tag is deprecated, the dicts are compared each time).  1, 0, or -1 with an exception. */
/* every value of d is an exact tuple of exact str and int objects: nothing a comparison of
 * d reads can change unless d itself does */
static int immutable_values(PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (!PyTuple_CheckExact(v))
            return 0;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
            PyObject *x = PyTuple_GET_ITEM(v, i);
            if (!PyUnicode_CheckExact(x) && !PyLong_CheckExact(x))
                return 0;
        }
    }
    return 1;
}

static int brokers_equal(PyObject *brokers, PyObject *seen)
{
#if PY_VERSION_HEX < 0x030C0000
    static uint64_t brokers_tag, seen_tag; /* of the last pair found equal (0: none) */
    uint64_t bt = ((PyDictObject *)brokers)->ma_version_tag, st = ((PyDictObject *)seen)->ma_version_tag;
    if (brokers_tag != 0 && bt == brokers_tag && st == seen_tag)
        return 1;
    int same = PyObject_RichCompareBool(brokers, seen, Py_EQ);
    if (same == 1 && bt == ((PyDictObject *)brokers)->ma_version_tag && st == ((PyDictObject *)seen)->ma_version_tag
        && immutable_values(brokers) && immutable_values(seen)) {
        brokers_tag = bt; /* (not when a value's __eq__ changed either dict meanwhile) */
        seen_tag = st;
    }
    return same;
#else
    return PyObject_RichCompareBool(brokers, seen, Py_EQ);
#endif
}

/* shared.broker_id_for(endpoint): its cached answer read here when the cache is valid (brokers
 * equal to the copy the answers were worked out from, the endpoint asked before), else the
 * method itself (which works it out and fills the cache).  A new reference. */
static PyObject *broker_id_for(PyObject *shared, PyObject *endpoint)
{
    PyObject *brokers = GET(shared, S_brokers), *seen = NULL, *ids = NULL, *out = NULL;
    if (brokers == NULL)
        return NULL;
    if ((seen = GET(shared, S_brokers_seen)) == NULL)
        goto done;
    if (PyDict_CheckExact(brokers) && PyDict_CheckExact(seen)) {
        int same = brokers_equal(brokers, seen);
        if (same < 0)
            goto done;
        if (same) {
            if ((ids = GET(shared, S_broker_ids)) == NULL)
                goto done;
            if (PyDict_CheckExact(ids)) {
                out = PyDict_GetItemWithError(ids, endpoint);
                if (out != NULL) {
                    Py_INCREF(out);
                    goto done;
                }
                if (PyErr_Occurred())
                    goto done;
            }
        }
    }
    out = PyObject_CallMethodOneArg(shared, S_broker_id_for, endpoint);
done:
    Py_DECREF(brokers);
    Py_XDECREF(seen);
    Py_XDECREF(ids);
    return out;
}

static int take_response(PyObject *conv, PyObject *data, PyObject *ts_first, PyObject *ts_last, PyObject *pkt_first,
                         PyObject *pkt_last)
{
    int result = -1, r;
    PyObject *sasl_raw = NULL, *sasl_pending = NULL, *pending = NULL, *cid = NULL, *first = NULL, *entry = NULL,
             *req = NULL, *resp = NULL, *frame = NULL, *shared = NULL, *names = NULL, *labels_fn = NULL,
             *found = NULL, *latency = NULL, *long_poll = NULL, *events = NULL, *broker = NULL,
             *broker_id = NULL, *index = NULL, *ex = NULL, *errors_codes = NULL, *error_names = NULL,
             *req_first = NULL, *req_last = NULL, *req_pfirst = NULL, *req_plast = NULL, *size_req = NULL,
             *size_resp = NULL, *counted = NULL, *stream = NULL, *client_text = NULL, *broker_text = NULL,
             *tcp_stream = NULL, *iter = NULL, *topics_of_scan = NULL;
    Fields q = {0}, a = {0};
    Py_ssize_t size = PyBytes_GET_SIZE(data);

    /* -- decide --------------------------------------------------------------------------- */
    if ((sasl_raw = GET(conv, S_sasl_raw)) == NULL || (sasl_pending = GET(conv, S_sasl_pending)) == NULL)
        goto done;
    if (sasl_raw != Py_False || !PyList_CheckExact(sasl_pending) || PyList_GET_SIZE(sasl_pending) != 0
        || size < 4) {
        result = DECLINE;
        goto done;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    if ((cid = PyLong_FromLong((int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3])))
        == NULL)
        goto done;
    if ((pending = GET(conv, S_pending)) == NULL)
        goto done;
    if (!PyODict_CheckExact(pending) || PyDict_GET_SIZE(pending) == 0) {
        result = DECLINE;
        goto done;
    }
    /* the oldest request in flight must be this one (else out of order, or an orphan) */
    if ((iter = PyObject_GetIter(pending)) == NULL)
        goto done;
    if ((first = PyIter_Next(iter)) == NULL) {
        result = PyErr_Occurred() ? -1 : DECLINE;
        goto done;
    }
    if ((r = PyObject_RichCompareBool(first, cid, Py_EQ)) != 1 || !PyLong_CheckExact(first)) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    entry = PyDict_GetItemWithError(pending, cid);
    if (entry == NULL) {
        result = PyErr_Occurred() ? -1 : DECLINE;
        goto done;
    }
    Py_INCREF(entry);
    if (Py_TYPE(entry) != g_pending_type) {
        result = DECLINE;
        goto done;
    }
    /* _Pending's slots, in its field order: message, ts_first, ts_last, no_response_expected,
     * pkt_first, pkt_last, frame, counted */
#define ENTRY(i) (*(PyObject **)((char *)entry + g_pending_off[i]))
    for (int i = 0; i < PENDING_FIELDS; i++)
        if (ENTRY(i) == NULL) {
            result = DECLINE;
            goto done;
        }
    if (ENTRY(6) != Py_None) { /* kept as its frame (PENDING_DECODED_BYTES): decoded again by Python */
        result = DECLINE;
        goto done;
    }
    req = ENTRY(0);
    Py_INCREF(req);
    req_first = ENTRY(1), req_last = ENTRY(2), req_pfirst = ENTRY(4), req_plast = ENTRY(5), counted = ENTRY(7);
    Py_INCREF(req_first), Py_INCREF(req_last), Py_INCREF(req_pfirst), Py_INCREF(req_plast), Py_INCREF(counted);
#undef ENTRY
    int deferred = Py_TYPE(req) == g_deferred_type; /* scanned: its response is scanned too */
    if ((r = fields_of(req, &q, deferred)) != TAKEN) {
        result = r;
        goto done;
    }
    long api_key = PyLong_AsLong(q.api_key), version = PyLong_AsLong(q.api_version);
    if ((api_key == -1 || version == -1) && PyErr_Occurred()) {
        result = swallow();
        goto done;
    }
    if ((r = special_api(api_key, q.api_key, 1)) != 0) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    if (!PyFloat_CheckExact(req_last) || !PyFloat_CheckExact(ts_first) || !PyLong_CheckExact(counted)) {
        result = DECLINE;
        goto done;
    }
    PyObject *decode = deferred ? scanner_for(0, api_key, version) : decoder_for(0, api_key, version);
    if (decode == NULL) {
        result = PyErr_Occurred() ? swallow() : DECLINE;
        goto done;
    }
    PyObject *args[3] = {data, q.api_key, q.api_version};
    Py_INCREF(decode);
    resp = PyObject_Vectorcall(decode, args, 3, NULL);
    Py_DECREF(decode);
    if (resp == NULL) {
        result = swallow();
        goto done;
    }
    /* (a response the scan leaves: Python's emit decodes both) */
    if (resp == Py_None || (deferred && Py_TYPE(resp) != g_deferred_type)
        || (r = fields_of(resp, &a, deferred)) == DECLINE) {
        result = DECLINE;
        goto done;
    }
    if (r < 0)
        goto done;
    if ((shared = GET(conv, S_shared)) == NULL)
        goto done;
    if (Py_TYPE(shared) != g_shared_type) {
        result = DECLINE;
        goto done;
    }
    if ((names = GET(shared, S_topic_names)) == NULL)
        goto done;
    PyObject *topics, *throttle = NULL;
    if (deferred) {
        /* the scans found no error code, no troubled record set: the request's topics, else
         * the response's (as compiled_exchange gives them), a list of the exchange's own */
        PyObject *mine = PyTuple_GET_ITEM(q.body, 0);
        if (PyTuple_GET_SIZE(mine) == 0)
            mine = PyTuple_GET_ITEM(a.body, 0);
        if ((topics_of_scan = PyList_New(PyTuple_GET_SIZE(mine))) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mine); i++)
            PyList_SET_ITEM(topics_of_scan, i, Py_NewRef(PyTuple_GET_ITEM(mine, i)));
        topics = topics_of_scan;
        throttle = PyTuple_GET_ITEM(a.body, 2);
        goto labelled;
    }
    if ((labels_fn = module_attr(g_labels, S_compiled_exchange)) == NULL)
        goto done;
    if (labels_fn == Py_None) {
        result = DECLINE;
        goto done;
    }
    r = PyObject_IsTrue(names);
    if (r < 0)
        goto done;
    PyObject *largs[4] = {q.api_key, q.body, a.body, r ? names : g_empty_dict};
    if ((found = PyObject_Vectorcall(labels_fn, largs, 4, NULL)) == NULL)
        goto done;
    if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 4) { /* None: Python's walks decide */
        result = DECLINE;
        goto done;
    }
    PyObject *errors = PyTuple_GET_ITEM(found, 0);
    topics = PyTuple_GET_ITEM(found, 1);
    PyObject *req_sets = PyTuple_GET_ITEM(found, 2), *resp_sets = PyTuple_GET_ITEM(found, 3);
    /* error codes (rows), or record sets with issues (rows): emit makes those */
    if (!PyList_CheckExact(errors) || PyList_GET_SIZE(errors) != 0 || !PyList_CheckExact(req_sets)
        || PyList_GET_SIZE(req_sets) != 0 || !PyList_CheckExact(resp_sets) || PyList_GET_SIZE(resp_sets) != 0) {
        result = DECLINE;
        goto done;
    }
    if (PyDict_GET_SIZE(a.body) > 0) {
        throttle = dict_get(a.body, S_throttle_time_ms);
        if (throttle == NULL && PyErr_Occurred())
            goto done;
    }
labelled:
    if (throttle == NULL || !PyLong_Check(throttle))
        throttle = Py_None;
    /* round((resp_first - req_last) * 1000.0, 3), the same float expression and round() */
    {
        double ms_value = (PyFloat_AS_DOUBLE(ts_first) - PyFloat_AS_DOUBLE(req_last)) * 1000.0, r;
        if (round3(ms_value, &r)) {
            latency = PyFloat_FromDouble(r);
        } else {
            PyObject *ms = PyFloat_FromDouble(ms_value);
            if (ms == NULL)
                goto done;
            PyObject *rargs[2] = {ms, g_three};
            latency = PyObject_Vectorcall(g_round, rargs, 2, NULL);
            Py_DECREF(ms);
        }
        if (latency == NULL)
            goto done;
    }
    long_poll = Py_None;
    Py_INCREF(long_poll);
    if (api_key == FETCH && !deferred && PyDict_GET_SIZE(a.body) > 0 && PyDict_GET_SIZE(q.body) > 0) {
        /* isinstance(wait, int) and wait > 0 and latency >= LONG_POLL_FRACTION * wait
         * and not any(rs.size for ... iter_record_sets(1, body, names)) */
        PyObject *wait = dict_get(q.body, S_max_wait_ms);
        if (wait == NULL && PyErr_Occurred())
            goto done;
        Py_SETREF(long_poll, Py_NewRef(Py_False));
        if (wait != NULL && PyLong_Check(wait)) {
            Py_INCREF(wait);
            r = PyObject_RichCompareBool(wait, g_zero, Py_GT);
            if (r == 1) {
                PyObject *least = PyNumber_Multiply(g_long_poll_fraction, wait);
                r = least == NULL ? -1 : PyObject_RichCompareBool(latency, least, Py_GE);
                Py_XDECREF(least);
                if (r == 1) {
                    PyObject *fargs[2] = {a.body, names};
                    PyObject *carried = PyObject_Vectorcall(g_fetch_carried_records, fargs, 2, NULL);
                    r = carried == NULL ? -1 : PyObject_IsTrue(carried);
                    Py_XDECREF(carried);
                    if (r >= 0)
                        Py_SETREF(long_poll, Py_NewRef(r ? Py_False : Py_True));
                }
            }
            Py_DECREF(wait);
            if (r < 0)
                goto done;
        }
    }
    if ((events = GET(conv, S_events)) == NULL || (broker = GET(conv, S_broker)) == NULL
        || (stream = GET(conv, S_stream)) == NULL || (client_text = GET(conv, S_client_text)) == NULL
        || (broker_text = GET(conv, S_broker_text)) == NULL || (tcp_stream = GET(conv, S_tcp_stream)) == NULL)
        goto done;
    if (!PyList_CheckExact(events)) {
        result = DECLINE;
        goto done;
    }
    long long pending_bytes = 0, counted_v = PyLong_AsLongLong(counted);
    if (counted_v == -1 && PyErr_Occurred()) {
        result = swallow();
        goto done;
    }
    if (counted_v && (r = get_ll(shared, S_pending_bytes, &pending_bytes)) != 0) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }

    /* -- write (on_response, then emit, in their order) ----------------------------------- */
    if ((r = BUMP(conv, S_responses, 1, NULL)) != 0) {
        result = r < 0 ? -1 : DECLINE;
        goto done;
    }
    if (PyObject_DelItem(pending, cid) < 0)
        goto done;
    if (counted_v) {
        if (set_ll(shared, S_pending_bytes, pending_bytes - counted_v) < 0
            || SET(entry, S_counted, g_zero) < 0)
            goto done;
    }
    long long n;
    if ((r = BUMP(shared, S_exchange_counter, 1, &n)) != 0) {
        if (r > 0)
            PyErr_SetString(PyExc_ValueError, "SharedState.exchange_counter is not an int");
        goto done;
    }
    if ((index = PyLong_FromLongLong(n)) == NULL)
        goto done;
    if ((broker_id = broker_id_for(shared, broker)) == NULL)
        goto done;
    if ((errors_codes = PyList_New(0)) == NULL || (error_names = PyList_New(0)) == NULL)
        goto done;
    PyObject *name = dict_get(g_api_names, q.api_key);
    if (name == NULL && PyErr_Occurred())
        goto done;
    PyObject *client_id = dict_get(q.header, S_client_id);
    if (client_id == NULL && PyErr_Occurred())
        goto done;
    if ((size_req = GET(req, S_size)) == NULL || (size_resp = GET(resp, S_size)) == NULL)
        goto done;
    if ((ex = g_exchange_type->tp_alloc(g_exchange_type, 0)) == NULL)
        goto done;
    {
        PyObject *values[EXCHANGE_FIELDS] = {
            stream, client_text, broker_text, q.api_key, name ? name : Py_None, q.api_version, cid,
            client_id ? client_id : Py_None, req_last, ts_first, latency, size_req, size_resp,
            g_status_paired, errors_codes, error_names, topics, throttle, ts_last, req, resp, broker_id,
            index, long_poll,
            /* frame, response_frame (0: None), tcp_stream, order (the request's first packet) */
            PyObject_IsTrue(req_plast) ? req_plast : Py_None, PyObject_IsTrue(pkt_last) ? pkt_last : Py_None,
            tcp_stream, req_pfirst};
        for (int i = 0; i < EXCHANGE_FIELDS; i++) {
            Py_INCREF(values[i]);
            *(PyObject **)((char *)ex + g_exchange_off[i]) = values[i];
        }
    }
    if (PyList_Append(events, ex) < 0)
        goto done;
    (void)pkt_first;
    result = TAKEN;
done:
    Py_XDECREF(sasl_raw);
    Py_XDECREF(sasl_pending);
    Py_XDECREF(pending);
    Py_XDECREF(cid);
    Py_XDECREF(first);
    Py_XDECREF(iter);
    Py_XDECREF(entry);
    Py_XDECREF(req);
    Py_XDECREF(resp);
    Py_XDECREF(frame);
    Py_XDECREF(shared);
    Py_XDECREF(names);
    Py_XDECREF(labels_fn);
    Py_XDECREF(found);
    Py_XDECREF(latency);
    Py_XDECREF(long_poll);
    Py_XDECREF(events);
    Py_XDECREF(broker);
    Py_XDECREF(broker_id);
    Py_XDECREF(index);
    Py_XDECREF(ex);
    Py_XDECREF(errors_codes);
    Py_XDECREF(error_names);
    Py_XDECREF(req_first);
    Py_XDECREF(req_last);
    Py_XDECREF(req_pfirst);
    Py_XDECREF(req_plast);
    Py_XDECREF(counted);
    Py_XDECREF(size_req);
    Py_XDECREF(size_resp);
    Py_XDECREF(stream);
    Py_XDECREF(client_text);
    Py_XDECREF(broker_text);
    Py_XDECREF(tcp_stream);
    Py_XDECREF(topics_of_scan);
    fields_clear(&q);
    fields_clear(&a);
    return result;
}

/* ---- the walk ------------------------------------------------------------------------------ */

/* Conversation.pop_events when it has only to hand the events over (every one an Exchange, the
 * conversation not just closed): they go to the end of `sink` and the conversation gets a new
 * empty list, as pop_events does.  1: done, 0: not that case (nothing changed), -1: error. */
static int move_events(PyObject *conv, PyObject *sink)
{
    PyObject *closed = GET(conv, S_closed), *events = NULL, *fresh = NULL;
    int result = -1;
    if (closed == NULL)
        return -1;
    if ((events = GET(conv, S_events)) == NULL)
        goto done;
    result = 0;
    if (closed != Py_False || !PyList_CheckExact(events))
        goto done;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(events); k++)
        if (Py_TYPE(PyList_GET_ITEM(events, k)) != g_exchange_type)
            goto done;
    result = -1;
    if (PyList_GET_SIZE(events) > 0) {
        if ((fresh = PyList_New(0)) == NULL)
            goto done;
        if (PyList_SetSlice(sink, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, events) < 0 || SET(conv, S_events, fresh) < 0)
            goto done;
    }
    result = 1;
done:
    Py_DECREF(closed);
    Py_XDECREF(events);
    Py_XDECREF(fresh);
    return result;
}

static PyObject *frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "frames(conversation, events, start, from_client, validator[, sink])");
        return NULL;
    }
    /* (a sink that is not a list: the caller's pop_events does the work) */
    PyObject *sink = nargs == 6 && PyList_CheckExact(args[5]) ? args[5] : NULL;
    if (!configured())
        return NULL;
    PyObject *conv = args[0], *events = args[1], *validator = args[4];
    if (!PyList_Check(events)) {
        PyErr_SetString(PyExc_TypeError, "frames(): events must be a list");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    int from_client = PyObject_IsTrue(args[3]);
    if (from_client < 0)
        return NULL;
    if (i < 0)
        i = 0;
    if (Py_TYPE(conv) != g_conv_type) /* a subclass may change any method: Python's */
        return PyLong_FromSsize_t(i);
    PyObject *last = NULL;
    for (; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if (Py_TYPE(ev) != g_frame_type || PyTuple_GET_SIZE(ev) != 6 || !PyBytes_CheckExact(PyTuple_GET_ITEM(ev, 0)))
            break;
        PyObject *data = PyTuple_GET_ITEM(ev, 0), *ts_first = PyTuple_GET_ITEM(ev, 2),
                 *ts_last = PyTuple_GET_ITEM(ev, 3), *pkt_first = PyTuple_GET_ITEM(ev, 4),
                 *pkt_last = PyTuple_GET_ITEM(ev, 5);
        Py_INCREF(ev); /* the list may be changed by code the methods call */
        int r = from_client ? take_request(conv, data, ts_first, ts_last, pkt_first, pkt_last, validator)
                            : take_response(conv, data, ts_first, ts_last, pkt_first, pkt_last);
        if (r < 0) {
            Py_DECREF(ev);
            Py_XDECREF(last);
            return NULL;
        }
        if (r == DECLINE) {
            Py_DECREF(ev);
            break;
        }
        Py_XSETREF(last, ev);
    }
    if (last != NULL) { /* what the driver set before each frame: the last one's packets */
        PyObject *pkts = PyTuple_Pack(2, PyTuple_GET_ITEM(last, 4), PyTuple_GET_ITEM(last, 5));
        Py_DECREF(last);
        if (pkts == NULL)
            return NULL;
        int r = SET(conv, S_frame_packets, pkts);
        Py_DECREF(pkts);
        if (r < 0)
            return NULL;
    }
    if (i == PyList_GET_SIZE(events) && sink != NULL) {
        int r = move_events(conv, sink);
        if (r < 0)
            return NULL;
        if (r)
            return PyLong_FromSsize_t(i + 1);
    }
    return PyLong_FromSsize_t(i);
}

/* ---- module -------------------------------------------------------------------------------- */

static int slot_offsets(PyTypeObject *type, PyObject *names, Py_ssize_t *out, Py_ssize_t n)
{
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n) {
        PyErr_Format(PyExc_TypeError, "configure(): %s needs %zd field names", type->tp_name, n);
        return -1;
    }
    if (type->tp_dictoffset != 0 || (type->tp_flags & Py_TPFLAGS_MANAGED_DICT)) {
        PyErr_Format(PyExc_TypeError, "configure(): %s must have __slots__ only", type->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = slot_offset(type, PyTuple_GET_ITEM(names, i));
        if (out[i] <= 0) {
            PyErr_Format(PyExc_TypeError, "configure(): %s.%S is not a slot", type->tp_name,
                         PyTuple_GET_ITEM(names, i));
            return -1;
        }
    }
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *conv, *shared, *pending, *exchange, *frame, *pending_fields, *exchange_fields, *decoder_fn,
        *labels_module, *fetch_carried, *round_fn, *api_names, *secret_apis, *fraction, *status_paired;
    long long limit;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!OOOOO!OO!O!L", &PyType_Type, &conv, &PyType_Type, &shared,
                          &PyType_Type, &pending, &PyType_Type, &exchange, &PyType_Type, &frame, &PyTuple_Type,
                          &pending_fields, &PyTuple_Type, &exchange_fields, &decoder_fn, &labels_module,
                          &fetch_carried, &round_fn, &PyDict_Type, &api_names, &secret_apis,
                          &PyFloat_Type, &fraction, &PyUnicode_Type, &status_paired, &limit))
        return NULL;
    if (!PyCallable_Check(decoder_fn) || !PyCallable_Check(fetch_carried) || !PyCallable_Check(round_fn)) {
        PyErr_SetString(PyExc_TypeError, "configure(): the decoder, fetch and round functions must be callable");
        return NULL;
    }
    if (!PyAnySet_Check(secret_apis)) {
        PyErr_SetString(PyExc_TypeError, "configure(): SECRET_APIS must be a set");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)frame, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure(): Frame must be a tuple type");
        return NULL;
    }
    if (slot_offsets((PyTypeObject *)pending, pending_fields, g_pending_off, PENDING_FIELDS) < 0
        || slot_offsets((PyTypeObject *)exchange, exchange_fields, g_exchange_off, EXCHANGE_FIELDS) < 0)
        return NULL;
#define KEEP(var, obj) do { Py_INCREF(obj); Py_XSETREF(var, (void *)(obj)); } while (0)
    KEEP(g_conv_type, conv);
    KEEP(g_shared_type, shared);
    KEEP(g_pending_type, pending);
    KEEP(g_exchange_type, exchange);
    KEEP(g_frame_type, frame);
    KEEP(g_decoder_fn, decoder_fn);
    KEEP(g_labels, labels_module);
    KEEP(g_fetch_carried_records, fetch_carried);
    KEEP(g_round, round_fn);
    KEEP(g_api_names, api_names);
    KEEP(g_secret_apis, secret_apis);
    KEEP(g_long_poll_fraction, fraction);
    KEEP(g_status_paired, status_paired);
#undef KEEP
    g_pending_limit = limit;
    memo_clear();
    Py_RETURN_NONE;
}

static PyObject *configure_deferred(PyObject *self, PyObject *args)
{
    PyObject *scanner_fn, *cls;
    if (!PyArg_ParseTuple(args, "OO!", &scanner_fn, &PyType_Type, &cls))
        return NULL;
    if (!PyCallable_Check(scanner_fn)) {
        PyErr_SetString(PyExc_TypeError, "configure_deferred(): the scanner function must be callable");
        return NULL;
    }
    Py_INCREF(scanner_fn);
    Py_XSETREF(g_scanner_fn, scanner_fn);
    Py_INCREF(cls);
    Py_XSETREF(g_deferred_type, (PyTypeObject *)cls);
    memo_clear();
    Py_RETURN_NONE;
}

static PyObject *clear_decoders(PyObject *self, PyObject *unused)
{
    memo_clear();
    Py_RETURN_NONE;
}

/* round3(x) -> float | None: the C round(x, 3) above (None: it asks round()); for the
 * tests that hold it equal to round() */
static PyObject *round3_py(PyObject *self, PyObject *arg)
{
    (void)self;
    double x = PyFloat_AsDouble(arg), r;
    if (x == -1.0 && PyErr_Occurred())
        return NULL;
    if (!round3(x, &r))
        Py_RETURN_NONE;
    return PyFloat_FromDouble(r);
}

static PyMethodDef methods[] = {
    {"round3", round3_py, METH_O, "round3(x) -> float | None: round(x, 3) as the C computes it (None: asks round())"},
    {"configure", configure, METH_VARARGS,
     "configure(Conversation, SharedState, _Pending, Exchange, Frame, _Pending's fields, Exchange's fields,\n"
     "exchange_decoder, labels module, fetch_carried_records, round, API_NAMES, SECRET_APIS,\n"
     "LONG_POLL_FRACTION, STATUS_PAIRED, PENDING_DECODED_BYTES)"},
    {"frames", (PyCFunction)(void (*)(void))frames, METH_FASTCALL,
     "frames(conversation, events, start, from_client, validator[, sink]) -> index of the first event not\n"
     "taken; len(events) + 1: all taken and the conversation's rows moved to sink (its pop_events)"},
    {"clear_decoders", clear_decoders, METH_NOARGS, "forget the cached decoders"},
    {"configure_deferred", configure_deferred, METH_VARARGS,
     "configure_deferred(exchange_scanner, DeferredMessage): scan the Produce exchanges of a\n"
     "SharedState with defer_bodies set (their bodies decoded when read)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cconv",
                                    "The compiled common path of a Kafka conversation.", -1, methods};

PyMODINIT_FUNC PyInit__cconv(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_requests, "requests");
    INTERN(S_responses, "responses");
    INTERN(S_frame_packets, "frame_packets");
    INTERN(S_sasl_raw, "_sasl_raw");
    INTERN(S_sasl_pending, "_sasl_pending");
    INTERN(S_pending, "_pending");
    INTERN(S_advertised, "advertised");
    INTERN(S_max_in_flight, "max_in_flight");
    INTERN(S_shared, "shared");
    INTERN(S_events, "_events");
    INTERN(S_last_correlation_id, "last_correlation_id");
    INTERN(S_api_versions_seen, "_api_versions_seen");
    INTERN(S_stream, "stream");
    INTERN(S_client_text, "_client_text");
    INTERN(S_broker_text, "_broker_text");
    INTERN(S_tcp_stream, "tcp_stream");
    INTERN(S_broker, "broker");
    INTERN(S_pending_bytes, "pending_bytes");
    INTERN(S_topic_names, "topic_names");
    INTERN(S_exchange_counter, "exchange_counter");
    INTERN(S_broker_id_for, "broker_id_for");
    INTERN(S_api_key, "api_key");
    INTERN(S_api_version, "api_version");
    INTERN(S_header, "header");
    INTERN(S_body, "body");
    INTERN(S_issues, "issues");
    INTERN(S_size, "size");
    INTERN(S_message, "message");
    INTERN(S_frame, "frame");
    INTERN(S_counted, "counted");
    INTERN(S_correlation_id, "correlation_id");
    INTERN(S_client_id, "client_id");
    INTERN(S_acks, "acks");
    INTERN(S_throttle_time_ms, "throttle_time_ms");
    INTERN(S_max_wait_ms, "max_wait_ms");
    INTERN(S_compiled_exchange, "compiled_exchange");
    INTERN(S_brokers, "brokers");
    INTERN(S_brokers_seen, "_brokers_seen");
    INTERN(S_broker_ids, "_broker_ids");
    INTERN(S_closed, "_closed");
    INTERN(S_defer_bodies, "defer_bodies");
    INTERN(S_facts, "facts");
#undef INTERN
    if ((g_empty_dict = PyDict_New()) == NULL || (g_decoders = PyDict_New()) == NULL
        || (g_zero = PyLong_FromLong(0)) == NULL || (g_three = PyLong_FromLong(3)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
