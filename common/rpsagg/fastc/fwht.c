/* fwht.c (rpsagg._fast): the fast Walsh-Hadamard transform (fwht_rows) and its SIMD building
 * blocks (v4d, TILE_CLONES), shared by the hblocks and tile kernels included after it.
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

/* ---- FWHT (unnormalized, Sylvester order), without the GIL. The butterflies are numpy's
 * (rpsagg._fwht.fwht_numpy): the same pairs in the same stage order, up to three stages
 * fused per pass, so the result is bit for bit the numpy one. Stages h < TILE_BLOCK run
 * within blocks of TILE_BLOCK doubles (16 KiB, L1), the next ones across blocks, three per
 * pass over memory. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(__clang__)
/* AVX2 where the CPU has it, chosen at load time (a wheel cannot assume -march=native).
 * All products here are by +-1 (exact), so contraction into FMA changes no bit. */
#define TILE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef TILE_CLONES
#define TILE_CLONES
#endif
#define TILE_INLINE static inline __attribute__((always_inline))

typedef double v4d __attribute__((vector_size(32)));
/* unaligned loads and stores of 4 doubles (macros: a function passing v4d by value would
 * make GCC note an ABI change) */
#define LOAD4(v, p) memcpy(&(v), (p), sizeof(v4d))
#define STORE4(p, v)                         \
    do {                                     \
        v4d tmp_ = (v);                      \
        memcpy((p), &tmp_, sizeof(v4d));     \
    } while (0)

/* Butterfly stages with 4-double vectors over x (len doubles), stride h a multiple of 4:
 * three (radix 8), two (radix 4) or one (radix 2) consecutive stages per pass. Every pair
 * is computed as a lone stage computes it ((a, b) -> (a + b, a - b), stages in increasing
 * h), so the result is the same bits as one stage at a time (numpy's butterflies); fusing
 * stages only saves passes over memory (3 instead of 1 per load and store). */
TILE_INLINE void tile_radix8(double *restrict x, Py_ssize_t len, Py_ssize_t h) {
    for (Py_ssize_t i = 0; i < len; i += 8 * h) {
        double *restrict p = x + i;
        for (Py_ssize_t j = 0; j < h; j += 4) {
            v4d a0, a1, a2, a3, a4, a5, a6, a7;
            LOAD4(a0, p + j);
            LOAD4(a1, p + j + h);
            LOAD4(a2, p + j + 2 * h);
            LOAD4(a3, p + j + 3 * h);
            LOAD4(a4, p + j + 4 * h);
            LOAD4(a5, p + j + 5 * h);
            LOAD4(a6, p + j + 6 * h);
            LOAD4(a7, p + j + 7 * h);
            v4d b0 = a0 + a1, b1 = a0 - a1, b2 = a2 + a3, b3 = a2 - a3;
            v4d b4 = a4 + a5, b5 = a4 - a5, b6 = a6 + a7, b7 = a6 - a7;
            v4d c0 = b0 + b2, c2 = b0 - b2, c1 = b1 + b3, c3 = b1 - b3;
            v4d c4 = b4 + b6, c6 = b4 - b6, c5 = b5 + b7, c7 = b5 - b7;
            STORE4(p + j, c0 + c4);
            STORE4(p + j + h, c1 + c5);
            STORE4(p + j + 2 * h, c2 + c6);
            STORE4(p + j + 3 * h, c3 + c7);
            STORE4(p + j + 4 * h, c0 - c4);
            STORE4(p + j + 5 * h, c1 - c5);
            STORE4(p + j + 6 * h, c2 - c6);
            STORE4(p + j + 7 * h, c3 - c7);
        }
    }
}

TILE_INLINE void tile_radix4(double *restrict x, Py_ssize_t len, Py_ssize_t h) {
    for (Py_ssize_t i = 0; i < len; i += 4 * h) {
        double *restrict p = x + i;
        for (Py_ssize_t j = 0; j < h; j += 4) {
            v4d a, b, c, d;
            LOAD4(a, p + j);
            LOAD4(b, p + j + h);
            LOAD4(c, p + j + 2 * h);
            LOAD4(d, p + j + 3 * h);
            v4d s0 = a + b, d0 = a - b, s1 = c + d, d1 = c - d;
            STORE4(p + j, s0 + s1);
            STORE4(p + j + h, d0 + d1);
            STORE4(p + j + 2 * h, s0 - s1);
            STORE4(p + j + 3 * h, d0 - d1);
        }
    }
}

TILE_INLINE void tile_radix2(double *restrict x, Py_ssize_t len, Py_ssize_t h) {
    for (Py_ssize_t i = 0; i < len; i += 2 * h) {
        double *restrict p = x + i;
        for (Py_ssize_t j = 0; j < h; j += 4) {
            v4d a, b;
            LOAD4(a, p + j);
            LOAD4(b, p + j + h);
            STORE4(p + j, a + b);
            STORE4(p + j + h, a - b);
        }
    }
}

/* the stages from stride h (a multiple of 4) on: radix 8 while it fits (but 16 = 4 x 4),
 * then radix 4 or 2 */
TILE_INLINE void tile_stages_from(double *restrict x, Py_ssize_t len, Py_ssize_t h) {
    while (h < len) {
        Py_ssize_t left = len / h;
        if (left >= 8 && left != 16) {
            tile_radix8(x, len, h);
            h *= 8;
        } else if (left >= 4) {
            tile_radix4(x, len, h);
            h *= 4;
        } else {
            tile_radix2(x, len, h);
            h *= 2;
        }
    }
}

/* every stage within a block of len >= 4 doubles: h = 1 and 2 on 4-double vectors (the
 * four elements of a group are adjacent; a + (-b) is a - b exactly), then the vector
 * stages from h = 4 */
TILE_INLINE void tile_fwht_block(double *restrict x, Py_ssize_t len) {
    const v4d alt = {1.0, -1.0, 1.0, -1.0}, half = {1.0, 1.0, -1.0, -1.0};
    for (Py_ssize_t j = 0; j < len; j += 4) {
        v4d v;
        LOAD4(v, x + j);
        v4d t = (v4d){v[0], v[0], v[2], v[2]} + (v4d){v[1], v[1], v[3], v[3]} * alt;
        v4d y = (v4d){t[0], t[1], t[0], t[1]} + (v4d){t[2], t[3], t[2], t[3]} * half;
        STORE4(x + j, y);
    }
    tile_stages_from(x, len, 4);
}

#define TILE_BLOCK 2048 /* doubles: 16 KiB, L1 */

/* in-place FWHT of len = 2^m doubles: blocks in L1, then the stages across blocks */
TILE_INLINE void tile_fwht(double *restrict x, Py_ssize_t len) {
    if (len < 4) { /* d' = 1 or 2 */
        if (len == 2) {
            double a = x[0], b = x[1];
            x[0] = a + b;
            x[1] = a - b;
        }
        return;
    }
    Py_ssize_t block = len < TILE_BLOCK ? len : TILE_BLOCK;
    for (Py_ssize_t i = 0; i < len; i += block) tile_fwht_block(x + i, block);
    tile_stages_from(x, len, block);
}

/* in-place FWHT of every consecutive run of n doubles of x[0:total] */
TILE_CLONES static void fwht_runs(double *x, Py_ssize_t total, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < total; i += n) tile_fwht(x + i, n);
}

/* fwht_rows(a, n): in-place FWHT of each consecutive run of n doubles of a (n a power of
 * two, len(a) a multiple of n). */
static PyObject *fwht_rows(PyObject *self, PyObject *args) {
    PyObject *ao;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "On", &ao, &n)) return NULL;
    Py_buffer a;
    if (get_buffer(ao, &a, 1, "d", 8, "a") < 0) return NULL;
    Py_ssize_t total = a.len / 8;
    if (n < 1 || (n & (n - 1)) || total % n) {
        PyBuffer_Release(&a);
        PyErr_SetString(PyExc_ValueError, "fwht_rows: n must be a power of two dividing len(a)");
        return NULL;
    }
    double *x = (double *)a.buf;
    Py_BEGIN_ALLOW_THREADS
    fwht_runs(x, total, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a);
    Py_RETURN_NONE;
}
