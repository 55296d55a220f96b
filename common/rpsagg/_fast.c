/* Optional compiled kernels of the SRHT encode (module rpsagg._fast).
 *
 * The same arithmetic as the numpy code in _spec.py / _srht.py, bit for bit (the tests
 * compare the two on every path): SplitMix64 words in counter mode, rejection sampling of
 * distinct rows, the +-1 sign multiply, and the SRHT's last butterfly stage at the kept
 * rows. docs/wire-format.md is the normative description of the first three. Arrays are
 * passed through the buffer protocol (no numpy headers needed to build), and every loop
 * runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GAMMA 0x9E3779B97F4A7C15ULL
#define MUL1 0xBF58476D1CE4E5B9ULL
#define MUL2 0x94D049BB133111EBULL

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * MUL1;
    z = (z ^ (z >> 27)) * MUL2;
    return z ^ (z >> 31);
}

/* word t (t = 0, 1, ...) of the stream with state key */
static inline uint64_t word_at(uint64_t key, uint64_t t) { return mix64(key + (t + 1) * GAMMA); }

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *fmt,
                      Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                          (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "";
    while (*f == '@' || *f == '=' || *f == '<') f++; /* native little-endian is fine */
    /* 64-bit integers are 'l' or 'q' depending on the platform's C long */
    int ok = view->itemsize == itemsize &&
             (strcmp(f, fmt) == 0 || (fmt[0] == 'q' && strcmp(f, "l") == 0 && sizeof(long) == 8));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous array of format '%s'",
                     name, fmt);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* sign_multiply(x, key, out): out[j] = x[j] * (1 - 2 b_j) for j < len(x), out[j] = 0 after;
 * b_j is bit j % 64 (least significant first) of word j // 64 of the stream ``key``. */
static PyObject *sign_multiply(PyObject *self, PyObject *args) {
    PyObject *xo, *outo;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "OKO", &xo, &key, &outo)) return NULL;
    Py_buffer x, out;
    if (get_buffer(xo, &x, 0, "d", 8, "x") < 0) return NULL;
    if (get_buffer(outo, &out, 1, "d", 8, "out") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t d = x.len / 8, n = out.len / 8;
    if (d > n) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out is shorter than x");
        return NULL;
    }
    const uint64_t *xs = (const uint64_t *)x.buf;
    uint64_t *os = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t j = 0;
    for (uint64_t t = 0; j < d; t++) {
        uint64_t w = word_at((uint64_t)key, t);
        Py_ssize_t stop = j + 64 < d ? j + 64 : d;
        /* multiplying by -1 flips the sign bit: exact, as the numpy path */
        for (; j < stop; j++, w >>= 1) os[j] = xs[j] ^ ((w & 1ULL) << 63);
    }
    memset(os + d, 0, (size_t)(n - d) * 8);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* sample_distinct(key, k, bound, out): the first k distinct candidates < bound, in order of
 * acceptance; candidate t is the top m bits of word t, m = bit length of bound - 1. */
static PyObject *sample_distinct(PyObject *self, PyObject *args) {
    unsigned long long key;
    Py_ssize_t k, bound;
    PyObject *outo;
    if (!PyArg_ParseTuple(args, "KnnO", &key, &k, &bound, &outo)) return NULL;
    if (bound < 1 || k < 1 || k > bound) {
        PyErr_Format(PyExc_ValueError, "need 1 <= k <= bound; got k=%zd, bound=%zd", k, bound);
        return NULL;
    }
    Py_buffer out;
    if (get_buffer(outo, &out, 1, "q", 8, "out") < 0) return NULL;
    if (out.len / 8 < k) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out is shorter than k");
        return NULL;
    }
    int m = 0;
    while (m < 63 && ((uint64_t)1 << m) < (uint64_t)bound) m++;
    uint64_t *seen = calloc(((size_t)bound + 63) / 64, 8);
    if (seen == NULL) {
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    int64_t *rows = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t got = 0;
    for (uint64_t t = 0; got < k; t++) {
        uint64_t cand = m ? word_at((uint64_t)key, t) >> (64 - m) : 0;
        if (cand >= (uint64_t)bound) continue;
        uint64_t bit = 1ULL << (cand & 63);
        if (seen[cand >> 6] & bit) continue;
        seen[cand >> 6] |= bit;
        rows[got++] = (int64_t)cand;
    }
    Py_END_ALLOW_THREADS
    free(seen);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* last_stage(pair, rows, scale, out): with a = pair[:h], b = pair[h:] (the FWHTs of the two
 * halves), out[i] = (a[r] + b[r]) / scale for r = rows[i] < h, (a[r-h] - b[r-h]) / scale
 * otherwise. */
static PyObject *last_stage(PyObject *self, PyObject *args) {
    PyObject *pairo, *rowso, *outo;
    double scale;
    if (!PyArg_ParseTuple(args, "OOdO", &pairo, &rowso, &scale, &outo)) return NULL;
    Py_buffer pair, rows, out;
    if (get_buffer(pairo, &pair, 0, "d", 8, "pair") < 0) return NULL;
    if (get_buffer(rowso, &rows, 0, "q", 8, "rows") < 0) {
        PyBuffer_Release(&pair);
        return NULL;
    }
    if (get_buffer(outo, &out, 1, "d", 8, "out") < 0) {
        PyBuffer_Release(&pair);
        PyBuffer_Release(&rows);
        return NULL;
    }
    Py_ssize_t n = pair.len / 8, h = n / 2, k = rows.len / 8;
    const int64_t *r = (const int64_t *)rows.buf;
    int bad = (n % 2) || out.len / 8 < k;
    for (Py_ssize_t i = 0; !bad && i < k; i++) bad = r[i] < 0 || r[i] >= n;
    if (bad) {
        PyBuffer_Release(&pair);
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "last_stage: bad shapes or a row out of range");
        return NULL;
    }
    const double *a = (const double *)pair.buf, *b = a + h;
    double *o = (double *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t ri = r[i];
        o[i] = (ri < h ? a[ri] + b[ri] : a[ri - h] - b[ri - h]) / scale;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&pair);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sign_multiply", sign_multiply, METH_VARARGS,
     "sign_multiply(x, key, out): out = D x (zero-padded), D from the stream key."},
    {"sample_distinct", sample_distinct, METH_VARARGS,
     "sample_distinct(key, k, bound, out): k distinct rows in order of acceptance."},
    {"last_stage", last_stage, METH_VARARGS,
     "last_stage(pair, rows, scale, out): the SRHT's last butterfly at the kept rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fast(void) { return PyModule_Create(&module); }
