/* base.c (rpsagg._fast): SplitMix64 in counter mode (the stream words every other file draws
 * from) and the buffer-protocol check every entry point uses.
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
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
