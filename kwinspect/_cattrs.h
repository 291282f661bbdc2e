/* Attribute access for the compiled core's C twins of Python methods (_cdriver.c,
 * stream/_cconv.c; slot_offset also for analyze/_crows.c and export/_crender.c): they read and write the fields of the Python objects the methods
 * work on, in place, with getattr's semantics and without its lookups per access.
 * Included by each extension (static functions; each module keeps its own call-site
 * caches).  Needs Python.h and structmember.h first; the macros use GCC statement
 * expressions (__extension__), as the two modules do. */
#ifndef KWINSPECT_CATTRS_H
#define KWINSPECT_CATTRS_H

/* The objects on these paths are instances of classes with __slots__ (the reassembler's
 * halves and connections, DirectionStats, the driver's connection state, _Pending), whose
 * fields are member descriptors at fixed offsets, or of plain classes whose fields live in the
 * instance dict.  Each call site keeps the type it saw last and how that type stores the field:
 * an object slot (its offset), the instance dict (no data descriptor of that name on the
 * class, and the generic getattr/setattr), or anything else (PyObject_GetAttr/SetAttr every
 * time).  That spares the type and descriptor lookups per access with the same semantics: a
 * slot is a data descriptor, found before any instance dict; without a data descriptor, the
 * generic lookup reads the instance dict first (a class attribute such as a dataclass default
 * only counts when the dict has no such key) and the generic setattr writes the dict.  A value
 * not found that way (an unset slot, a key not in the dict) takes PyObject_GetAttr, which
 * finds the class attribute or raises the AttributeError. */
#define VIA_GETATTR 0
#define VIA_DICT (-1)
typedef struct {
    PyTypeObject *type; /* strong reference: the way is only valid for this type */
    Py_ssize_t way;     /* > 0: the slot's offset; VIA_DICT; VIA_GETATTR */
} Slot;

/* The offset of `name` on `type` when it is a writable object slot (a __slots__ field),
 * else 0.  The C that builds or reads slots dataclasses directly (_cconv.c's Exchange,
 * analyze/_crows.c's RecordRow, export/_crender.c's rows) resolves their fields with it. */
static inline Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type))
        return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    return m->type == T_OBJECT_EX && !(m->flags & READONLY) && m->offset > 0 ? m->offset : 0;
}

static inline void slot_resolve(PyTypeObject *type, PyObject *name, Slot *c)
{
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed */
    Py_ssize_t way = VIA_GETATTR;
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_ssize_t offset = slot_offset(type, name);
        if (offset > 0)
            way = offset;
    } else if ((descr == NULL || Py_TYPE(descr)->tp_descr_set == NULL) /* not a data descriptor */
               && type->tp_getattro == PyObject_GenericGetAttr
               && type->tp_setattro == PyObject_GenericSetAttr
               && (type->tp_dictoffset != 0 || (type->tp_flags & Py_TPFLAGS_MANAGED_DICT))) {
        way = VIA_DICT;
    }
    Py_INCREF(type);
    Py_XSETREF(c->type, type);
    c->way = way;
}

/* a new reference to obj.name, or NULL with an exception */
static inline PyObject *fast_get(PyObject *obj, PyObject *name, Slot *c)
{
    if (c->type != Py_TYPE(obj))
        slot_resolve(Py_TYPE(obj), name, c);
    if (c->way > 0) {
        PyObject *v = *(PyObject **)((char *)obj + c->way);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    } else if (c->way == VIA_DICT) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj); /* (makes the dict of a managed one) */
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *v = PyDict_GetItemWithError(*dictptr, name);
            if (v != NULL) {
                Py_INCREF(v);
                return v;
            }
            if (PyErr_Occurred())
                return NULL;
        }
    }
    return PyObject_GetAttr(obj, name);
}

static inline int fast_set(PyObject *obj, PyObject *name, PyObject *v, Slot *c)
{
    if (c->type != Py_TYPE(obj))
        slot_resolve(Py_TYPE(obj), name, c);
    if (c->way > 0) {
        PyObject **field = (PyObject **)((char *)obj + c->way);
        PyObject *old = *field;
        Py_INCREF(v);
        *field = v;
        Py_XDECREF(old);
        return 0;
    } else if (c->way == VIA_DICT) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL && *dictptr != NULL)
            return PyDict_SetItem(*dictptr, name, v);
    }
    return PyObject_SetAttr(obj, name, v);
}

#define GET(obj, name) __extension__({ static Slot c_; fast_get((obj), (name), &c_); })
#define SET(obj, name, v) __extension__({ static Slot c_; fast_set((obj), (name), (v), &c_); })

/* A 64-bit value of an int attribute: 0, or 1 when it is not an int / does not fit
 * (decline), or -1 on an error (exception set). */
static inline int get_ll_c(PyObject *obj, PyObject *name, Slot *c, long long *out)
{
    PyObject *v = fast_get(obj, name, c);
    if (v == NULL)
        return -1;
    if (!PyLong_CheckExact(v)) { /* (a subclass may add otherwise)*/
        Py_DECREF(v);
        return 1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (overflow)
        return 1;
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

static inline int set_ll_c(PyObject *obj, PyObject *name, Slot *c, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int r = fast_set(obj, name, v, c);
    Py_DECREF(v);
    return r;
}

/* the attribute is None: 1, not None: 0, error: -1 */
static inline int is_none_c(PyObject *obj, PyObject *name, Slot *c)
{
    PyObject *v = fast_get(obj, name, c);
    if (v == NULL)
        return -1;
    int r = v == Py_None;
    Py_DECREF(v);
    return r;
}

/* the attribute's truth value (1/0), -1 on error */
static inline int truth_c(PyObject *obj, PyObject *name, Slot *c)
{
    PyObject *v = fast_get(obj, name, c);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

#define get_ll(obj, name, out) __extension__({ static Slot c_; get_ll_c((obj), (name), &c_, (out)); })
#define set_ll(obj, name, value) __extension__({ static Slot c_; set_ll_c((obj), (name), &c_, (value)); })
#define is_none(obj, name) __extension__({ static Slot c_; is_none_c((obj), (name), &c_); })
#define truth(obj, name) __extension__({ static Slot c_; truth_c((obj), (name), &c_); })

#endif
