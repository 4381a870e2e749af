/* Packed protobuf varints for int64 arrays: the hot loop of writing and reading tf.train.Example shards.
 *
 * Optional accelerator for model_contract.example_codec, which falls back to numpy when this extension is not
 * built (the results are byte-identical; tests compare both). Inputs are any contiguous buffer of
 * little-endian int64 (a numpy array); outputs are bytes (encode) or a bytearray of int64 (decode).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *encode_varints(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "encode_varints needs a buffer of int64 values");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    const unsigned char *src = (const unsigned char *)view.buf;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 10);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned char *p = dst;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, src + 8 * i, 8);
        while (v >= 0x80) {
            *p++ = (unsigned char)(v | 0x80);
            v >>= 7;
        }
        *p++ = (unsigned char)v;
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, p - dst) < 0) return NULL;
    return out;
}

static PyObject *decode_varints(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *src = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, count = 0;
    for (Py_ssize_t i = 0; i < len; i++) count += (src[i] < 0x80);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * 8);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
    Py_ssize_t pos = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t v = 0;
        int shift = 0;
        for (;;) {
            unsigned char b = src[pos++];
            if (shift > 63) {
                Py_DECREF(out);
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_ValueError, "varint longer than 10 bytes");
                return NULL;
            }
            v |= (uint64_t)(b & 0x7F) << shift;
            shift += 7;
            if (b < 0x80) break;
        }
        memcpy(dst + 8 * k, &v, 8);
    }
    int trailing = pos != len;
    PyBuffer_Release(&view);
    if (trailing) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "packed varint payload ends inside a varint");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode_varints", encode_varints, METH_O, "int64 buffer -> packed varint bytes"},
    {"decode_varints", decode_varints, METH_O, "packed varint bytes -> bytearray of int64"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_varint", NULL, -1, methods};

PyMODINIT_FUNC PyInit__varint(void) { return PyModule_Create(&module); }
