/* Optional compiled kernels of the SRHT encode and decode (module rpsagg._fast).
 *
 * The encode's are the same arithmetic as the numpy code in spec.py / _srht.py, bit for
 * bit (the tests compare the two on every path): SplitMix64 words in counter mode,
 * rejection sampling of distinct rows, the +-1 sign multiply, and the SRHT's last
 * butterfly stage at the kept rows. docs/wire-format.md is the normative description of
 * the first three. The decode's joint products by tiles (tile_adjoint, tile_forward) sum
 * in another order than the numpy passes (agreement to rounding, ~1e-15 relative) and
 * give the same bits however the caller splits them between threads. Arrays are passed
 * through the buffer protocol (no numpy headers needed to build), and every loop runs
 * without the GIL.
 */
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

/* BYTE_FACTORS[v]: the 8 int8 factors 1 - 2 bit_t (t = 0..7, least significant first) of the
 * byte v, as one 8-byte word (filled at import) */
static uint64_t BYTE_FACTORS[256];

static void byte_factors_init(void) {
    for (int v = 0; v < 256; v++) {
        int8_t f[8];
        for (int t = 0; t < 8; t++) f[t] = (int8_t)(1 - 2 * ((v >> t) & 1));
        memcpy(&BYTE_FACTORS[v], f, 8);
    }
}

/* sign_factors(key, out): out[j] = 1 - 2 b_j (int8) for j < len(out), b_j as in
 * sign_multiply; spec.sign_factors' values, without the GIL (threads derive clients' signs
 * in parallel) */
static PyObject *sign_factors_py(PyObject *self, PyObject *args) {
    unsigned long long key;
    PyObject *outo;
    if (!PyArg_ParseTuple(args, "KO", &key, &outo)) return NULL;
    Py_buffer out;
    if (get_buffer(outo, &out, 1, "b", 1, "out") < 0) return NULL;
    int8_t *o = (int8_t *)out.buf;
    Py_ssize_t n = out.len;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t j = 0;
    for (uint64_t t = 0; j < n; t++) {
        uint64_t w = word_at((uint64_t)key, t);
        if (j + 64 <= n) {
            for (int byte = 0; byte < 8; byte++, w >>= 8)
                memcpy(o + j + 8 * byte, &BYTE_FACTORS[w & 255], 8);
            j += 64;
            continue;
        }
        for (; j < n; j++, w >>= 1) o[j] = (int8_t)(1 - 2 * (int)(w & 1));
    }
    Py_END_ALLOW_THREADS
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
    /* a bitmap over every candidate [0, 2^m), so that a candidate >= bound can be looked
     * up too: the loop then accepts or rejects without a branch (rejections at random,
     * up to half of the words when bound is just above a power of two, mispredicted) */
    uint64_t *seen = calloc((((size_t)1 << m) + 63) / 64, 8);
    if (seen == NULL) {
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    int64_t *rows = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t got = 0;
    for (uint64_t t = 0; got < k; t++) {
        uint64_t cand = m ? word_at((uint64_t)key, t) >> (64 - m) : 0;
        uint64_t bit = 1ULL << (cand & 63);
        uint64_t fresh = (uint64_t)(cand < (uint64_t)bound) & (uint64_t)((seen[cand >> 6] & bit) == 0);
        seen[cand >> 6] |= bit & (0 - fresh);
        rows[got] = (int64_t)cand; /* kept only if fresh: got moves on */
        got += (Py_ssize_t)fresh;
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

/* ---- The overlapping-blocks Hadamard projection ("hblocks", rpsagg._hblocks). With
 * b = 2^floor(log2 d) and e = d - b: w[(j + shift) mod d] = (1 - 2 b_j) x_j, multiplied by
 * 1/sqrt(b) at positions < b; w[0:b] gets the FWHT; the overlap w[e:b] the second signs
 * (stream rpsSIGN2); w[e:d] the FWHT; rows >= e are multiplied by 1/sqrt(b) when read. The
 * numpy code of _hblocks.py does the same operations. Keys are mix64(seed XOR tag). */
#define TAG_SIGNS 0x7270735349474E53ULL /* "rpsSIGNS" */
#define TAG_SHIFT 0x7270735348494654ULL /* "rpsSHIFT" */
#define TAG_SIGN2 0x7270735349474E32ULL /* "rpsSIGN2" */

static int buffers_overlap(const Py_buffer *a, const Py_buffer *b) {
    const char *a0 = a->buf, *b0 = b->buf;
    return a0 < b0 + b->len && b0 < a0 + a->len;
}

/* sample_distinct(seed, rpsSHIFT, 1, d)[0]: the first candidate < d */
static Py_ssize_t hb_shift(uint64_t seed, Py_ssize_t d) {
    int m = 0;
    while (m < 63 && ((uint64_t)1 << m) < (uint64_t)d) m++;
    uint64_t key = mix64(seed ^ TAG_SHIFT);
    for (uint64_t t = 0;; t++) {
        uint64_t cand = m ? word_at(key, t) >> (64 - m) : 0;
        if (cand < (uint64_t)d) return (Py_ssize_t)cand;
    }
}

/* the sign masks of 64 consecutive elements from one stream word, four at a time: lane i
 * of group g gets bit 4 g + i of the word in its sign bit (GCC's vector shifts: vpsllvq with
 * AVX2) */
typedef uint64_t v4u __attribute__((vector_size(32)));
#define SIGN_BIT 0x8000000000000000ULL

/* out[j] = (xs[j] * scale, or xs[j] if scale is 1) with its sign flipped by bit j of the
 * stream key, for j in [j0, j1): whole words four elements per vector, the rest one at a
 * time; out may be xs (each element is read before it is written). Multiplying by -1 flips
 * the sign bit: exact, as the numpy path. */
TILE_INLINE void hb_segment_v(const double *xs, uint64_t key, Py_ssize_t j0, Py_ssize_t j1,
                              double *out, double scale) {
    const v4u shifts = {63, 62, 61, 60}, sign = {SIGN_BIT, SIGN_BIT, SIGN_BIT, SIGN_BIT};
    const v4d sc = {scale, scale, scale, scale};
    Py_ssize_t j = j0;
    while (j < j1) {
        uint64_t w = word_at(key, (uint64_t)(j >> 6));
        Py_ssize_t stop = (j | 63) + 1 < j1 ? (j | 63) + 1 : j1;
        if ((j & 63) == 0 && stop == j + 64) {
            for (int g = 0; g < 16; g++, w >>= 4) {
                v4u m = ((v4u){w, w, w, w} << shifts) & sign, u;
                v4d v;
                LOAD4(v, xs + j + 4 * g);
                if (scale != 1.0) v = v * sc;
                memcpy(&u, &v, sizeof u);
                u ^= m;
                memcpy(out + j + 4 * g, &u, sizeof u);
            }
            j = stop;
            continue;
        }
        w >>= (j & 63);
        for (; j < stop; j++, w >>= 1) {
            double v = scale == 1.0 ? xs[j] : xs[j] * scale;
            uint64_t u;
            memcpy(&u, &v, 8);
            u ^= (w & 1ULL) << 63;
            memcpy(out + j, &u, 8);
        }
    }
}

/* The first pass: ws[(j + shift) mod d] = (1 - 2 b_j) x_j, times 1/sqrt(b) where the position
 * is < b (so that the unnormalized FWHT of ws[0:b] is H_lo's) */
/* hb_sign_shift for the inputs j in [jlo, jhi) only (disjoint ranges write disjoint w) */
TILE_CLONES static void hb_sign_shift_range(const double *xs, uint64_t key, Py_ssize_t shift,
                                            double *ws, Py_ssize_t d, Py_ssize_t b,
                                            Py_ssize_t jlo, Py_ssize_t jhi) {
    double inv = 1.0 / sqrt((double)b);
    /* j in [0, d - shift) lands on j + shift; j in [d - shift, d) on j + shift - d */
    Py_ssize_t wrap = d - shift;
    Py_ssize_t cut1 = b - shift; /* first range: positions < b iff j < cut1 */
    if (cut1 < 0) cut1 = 0;
    if (cut1 > wrap) cut1 = wrap;
    Py_ssize_t cut2 = wrap + b; /* second range: positions < b iff j < cut2 */
    if (cut2 > d) cut2 = d;
    const Py_ssize_t lo[4] = {0, cut1, wrap, cut2}, hi[4] = {cut1, wrap, cut2, d};
    const Py_ssize_t off[4] = {shift, shift, shift - d, shift - d};
    const double scale[4] = {inv, 1.0, inv, 1.0};
    for (int s = 0; s < 4; s++) {
        Py_ssize_t a = lo[s] > jlo ? lo[s] : jlo, c = hi[s] < jhi ? hi[s] : jhi;
        if (a < c) hb_segment_v(xs, key, a, c, ws + off[s], scale[s]);
    }
}

/* w[(j + shift) mod d] = (1 - 2 b_j) x_j, scaled by 1/sqrt(b) where it lands below b */
static void hb_sign_shift(const double *xs, uint64_t key, Py_ssize_t shift, double *ws,
                          Py_ssize_t d, Py_ssize_t b) {
    hb_sign_shift_range(xs, key, shift, ws, d, b, 0, d);
}

/* the second signs, on the overlap w[e:b] (bit p - e at position p) */
TILE_CLONES static void hb_middle(double *w, Py_ssize_t d, Py_ssize_t b, uint64_t seed) {
    Py_ssize_t e = d - b;
    hb_segment_v(w + e, mix64(seed ^ TAG_SIGN2), 0, b - e, w + e, 1.0);
}

/* rows >= e went through the unnormalized second FWHT: times 1/sqrt(b) */
static void hb_gather(const double *w, Py_ssize_t d, Py_ssize_t b, const int64_t *rows,
                      Py_ssize_t k, double *out) {
    Py_ssize_t e = d - b;
    double inv = 1.0 / sqrt((double)b);
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t r = rows[i];
        out[i] = r < e ? w[r] : w[r] * inv;
    }
}

static Py_ssize_t hb_block(Py_ssize_t d) {
    Py_ssize_t b = 1;
    while (2 * b <= d) b *= 2;
    return b;
}

/* hb_first(x, seed, w): w[(j + shift) mod d] = (1 - 2 b_j) x_j (len(w) = len(x)) */
static PyObject *hb_first(PyObject *self, PyObject *args) {
    PyObject *xo, *wo;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OKO", &xo, &seed, &wo)) return NULL;
    Py_buffer x, w;
    if (get_buffer(xo, &x, 0, "d", 8, "x") < 0) return NULL;
    if (get_buffer(wo, &w, 1, "d", 8, "w") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t d = x.len / 8;
    if (d < 1 || w.len != x.len || buffers_overlap(&x, &w)) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&w);
        PyErr_SetString(PyExc_ValueError, "hb_first: bad shapes or overlap");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    hb_sign_shift((const double *)x.buf, mix64((uint64_t)seed ^ TAG_SIGNS),
                  hb_shift((uint64_t)seed, d), (double *)w.buf, d, hb_block(d));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    Py_RETURN_NONE;
}

/* hb_middle(w, seed): the second signs and the scaling, in place */
static PyObject *hb_middle_py(PyObject *self, PyObject *args) {
    PyObject *wo;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OK", &wo, &seed)) return NULL;
    Py_buffer w;
    if (get_buffer(wo, &w, 1, "d", 8, "w") < 0) return NULL;
    Py_ssize_t d = w.len / 8;
    if (d < 1) {
        PyBuffer_Release(&w);
        PyErr_SetString(PyExc_ValueError, "hb_middle: empty w");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    hb_middle((double *)w.buf, d, hb_block(d), (uint64_t)seed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&w);
    Py_RETURN_NONE;
}

static int hb_rows_ok(const Py_buffer *rows, Py_ssize_t d, const Py_buffer *out) {
    Py_ssize_t k = rows->len / 8;
    const int64_t *r = (const int64_t *)rows->buf;
    if (out->len / 8 != k) return 0;
    for (Py_ssize_t i = 0; i < k; i++)
        if (r[i] < 0 || r[i] >= d) return 0;
    return 1;
}

/* the buffers (w, rows, out) of the kernels below: w float64 (writable when w_writable),
 * rows int64, out float64 writable; 0 with all three held, or -1 with none held and an
 * exception set */
static int get_w_rows_out(PyObject *wo, PyObject *ro, PyObject *oo, int w_writable,
                          Py_buffer *w, Py_buffer *rows, Py_buffer *out) {
    if (get_buffer(wo, w, w_writable, "d", 8, "w") < 0) return -1;
    if (get_buffer(ro, rows, 0, "q", 8, "rows") < 0) {
        PyBuffer_Release(w);
        return -1;
    }
    if (get_buffer(oo, out, 1, "d", 8, "out") < 0) {
        PyBuffer_Release(w);
        PyBuffer_Release(rows);
        return -1;
    }
    return 0;
}

static void release_w_rows_out(Py_buffer *w, Py_buffer *rows, Py_buffer *out) {
    PyBuffer_Release(w);
    PyBuffer_Release(rows);
    PyBuffer_Release(out);
}

/* hb_gather(w, rows, out): out[i] = w[rows[i]] with the last scale */
static PyObject *hb_gather_py(PyObject *self, PyObject *args) {
    PyObject *wo, *ro, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &wo, &ro, &oo)) return NULL;
    Py_buffer w, rows, out;
    if (get_w_rows_out(wo, ro, oo, 0, &w, &rows, &out) < 0) return NULL;
    Py_ssize_t d = w.len / 8;
    int ok = d >= 1 && hb_rows_ok(&rows, d, &out);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        hb_gather((const double *)w.buf, d, hb_block(d), (const int64_t *)rows.buf,
                  rows.len / 8, (double *)out.buf);
        Py_END_ALLOW_THREADS
    }
    release_w_rows_out(&w, &rows, &out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "hb_gather: bad shapes or a row out of range");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* hb_encode(x, seed, rows, w, out): the whole encode with the FWHT of this file (one call:
 * for small d, where the calls cost more than the arithmetic) */
static PyObject *hb_encode(PyObject *self, PyObject *args) {
    PyObject *xo, *ro, *wo, *oo;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OKOOO", &xo, &seed, &ro, &wo, &oo)) return NULL;
    Py_buffer x, rows, w, out;
    if (get_buffer(xo, &x, 0, "d", 8, "x") < 0) return NULL;
    if (get_w_rows_out(wo, ro, oo, 1, &w, &rows, &out) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t d = x.len / 8;
    int ok = d >= 1 && w.len == x.len && !buffers_overlap(&x, &w) && hb_rows_ok(&rows, d, &out);
    if (ok) {
        Py_ssize_t b = hb_block(d);
        double *ws = (double *)w.buf;
        Py_BEGIN_ALLOW_THREADS
        hb_sign_shift((const double *)x.buf, mix64((uint64_t)seed ^ TAG_SIGNS),
                      hb_shift((uint64_t)seed, d), ws, d, b);
        fwht_runs(ws, b, b);
        hb_middle(ws, d, b, (uint64_t)seed);
        fwht_runs(ws + (d - b), b, b);
        hb_gather(ws, d, b, (const int64_t *)rows.buf, rows.len / 8, (double *)out.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    release_w_rows_out(&w, &rows, &out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "hb_encode: bad shapes, overlap or a row out of range");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- the joint SRHT products by tiles (rpsagg._srht.JointSRHT with the compiled kernels).
 *
 * G_i = d'^-1/2 E_i H D_i. Output coordinate j = c0 * T + t (T = 2^m, tile c0); in Sylvester
 * order, with rh = r >> m and rl = r & (T - 1), H[r, c0 T + t] = (-1)^parity(rh & c0) *
 * H_T[rl, t], since c0 T and t have disjoint bits. So tile c0 of G_i^T z_i is
 * s_i[tile] * H_T a with a[rl_p] += (-1)^parity(rh_p & c0) z_ip, and (G_i u)_p sums, over
 * the tiles, (-1)^parity(rh_p & c0) (H_T (s_i[tile] * u[tile]))[rl_p]: every transform is
 * of T doubles, in L1/L2, and nothing of n x d' floats is written. Each output element is
 * produced by one call in a fixed order (tiles split the adjoint; the forward's units,
 * (client, group of tiles), each sum their group's tiles in order and the caller adds the
 * groups in order), so the results do not depend on how callers split the work among
 * threads. */

/* v * (-1)^parity(bits), without a branch (the parities are random: a branch on them would
 * be mispredicted half the time): the sign bit flipped, exact */
TILE_INLINE double flip(double v, uint64_t bits) {
    uint64_t w;
    memcpy(&w, &v, sizeof w);
    w ^= (uint64_t)__builtin_parityll(bits) << 63;
    memcpy(&v, &w, sizeof w);
    return v;
}

/* tiles [t_lo, t_hi) of out = scale * sum_i D_i H E_i^T z_i */
TILE_CLONES static void tile_adjoint_run(const double *z, const int64_t *rows,
                                         const int8_t *signs, Py_ssize_t n, Py_ssize_t k,
                                         Py_ssize_t d, int m, Py_ssize_t t_lo, Py_ssize_t t_hi,
                                         double scale, double *out, double *acc, double *a) {
    Py_ssize_t T = (Py_ssize_t)1 << m;
    uint64_t mask = (uint64_t)T - 1;
    for (Py_ssize_t c0 = t_lo; c0 < t_hi; c0++) {
        memset(acc, 0, (size_t)T * sizeof(double));
        for (Py_ssize_t i = 0; i < n; i++) {
            const double *zi = z + i * k;
            const int64_t *ri = rows + i * k;
            memset(a, 0, (size_t)T * sizeof(double));
            for (Py_ssize_t p = 0; p < k; p++) {
                uint64_t r = (uint64_t)ri[p];
                a[r & mask] += flip(zi[p], (r >> m) & (uint64_t)c0);
            }
            tile_fwht(a, T);
            const int8_t *si = signs + i * d + c0 * T;
            for (Py_ssize_t t = 0; t < T; t++) acc[t] += (double)si[t] * a[t];
        }
        double *o = out + c0 * T;
        for (Py_ssize_t t = 0; t < T; t++) o[t] = acc[t] * scale;
    }
}

/* units [lo, hi) of the forward product without its scale: unit g n + i is client i over
 * tile group g (tiles [tiles g / groups, tiles (g + 1) / groups)), and part[g][i][p] =
 * sum over the group's tiles, in order, of (-1)^parity(rh_p & c0) (H_T (s_i u)[tile])[rl_p].
 * Tiles outer, clients inner: u's tile is reused by the clients of the range in cache. */
TILE_CLONES static void tile_forward_run(const double *u, const int64_t *rows,
                                         const int8_t *signs, Py_ssize_t n, Py_ssize_t k,
                                         Py_ssize_t d, int m, Py_ssize_t groups, Py_ssize_t lo,
                                         Py_ssize_t hi, double *part, double *b) {
    Py_ssize_t T = (Py_ssize_t)1 << m, tiles = d >> m;
    uint64_t mask = (uint64_t)T - 1;
    for (Py_ssize_t g = lo / n; g < groups && g * n < hi; g++) {
        Py_ssize_t i_lo = lo > g * n ? lo - g * n : 0;
        Py_ssize_t i_hi = hi < (g + 1) * n ? hi - g * n : n;
        double *pg = part + g * n * k;
        memset(pg + i_lo * k, 0, (size_t)((i_hi - i_lo) * k) * sizeof(double));
        for (Py_ssize_t c0 = tiles * g / groups; c0 < tiles * (g + 1) / groups; c0++) {
            const double *ut = u + c0 * T;
            for (Py_ssize_t i = i_lo; i < i_hi; i++) {
                const int8_t *si = signs + i * d + c0 * T;
                for (Py_ssize_t t = 0; t < T; t++) b[t] = (double)si[t] * ut[t];
                tile_fwht(b, T);
                const int64_t *ri = rows + i * k;
                double *yi = pg + i * k;
                for (Py_ssize_t p = 0; p < k; p++) {
                    uint64_t r = (uint64_t)ri[p];
                    yi[p] += flip(b[r & mask], (r >> m) & (uint64_t)c0);
                }
            }
        }
    }
}

/* whether a row is outside [0, d) (checked without the GIL: n k rows per call, and
 * every thread of a product makes a call) */
static int tile_rows_bad(const int64_t *r, Py_ssize_t nk, Py_ssize_t d) {
    int bad = 0;
    for (Py_ssize_t i = 0; i < nk; i++) bad |= r[i] < 0 || r[i] >= d;
    return bad;
}

static PyObject *tile_rows_error(void) {
    PyErr_SetString(PyExc_ValueError, "tile products: a row out of range");
    return NULL;
}

/* the buffers of the arguments common to both products, checked (but the rows' range) */
typedef struct {
    Py_buffer vec, rows, signs, out;
    Py_ssize_t n, k, d;
} tile_args;

static void tile_release(tile_args *t, int count) {
    Py_buffer *bufs[4] = {&t->vec, &t->rows, &t->signs, &t->out};
    for (int i = 0; i < count; i++) PyBuffer_Release(bufs[i]);
}

/* vec: z (n k doubles, adjoint) or u (d doubles, forward); out: d or n k doubles */
static int tile_parse(tile_args *t, PyObject *veco, PyObject *rowso, PyObject *signso,
                      PyObject *outo, Py_ssize_t k, int m, int adjoint) {
    if (get_buffer(veco, &t->vec, 0, "d", 8, adjoint ? "z" : "u") < 0) return -1;
    if (get_buffer(rowso, &t->rows, 0, "q", 8, "rows") < 0) {
        tile_release(t, 1);
        return -1;
    }
    if (get_buffer(signso, &t->signs, 0, "b", 1, "signs") < 0) {
        tile_release(t, 2);
        return -1;
    }
    if (get_buffer(outo, &t->out, 1, "d", 8, "out") < 0) {
        tile_release(t, 3);
        return -1;
    }
    Py_ssize_t nk = t->rows.len / 8;
    int bad = k < 1 || nk % k || nk == 0 || m < 0 || m > 30;
    Py_ssize_t n = bad ? 1 : nk / k;
    Py_ssize_t d = t->signs.len / n;
    bad = bad || t->signs.len % n || d < 1 || (d & (d - 1)) || ((Py_ssize_t)1 << m) > d;
    if (!bad)
        bad = adjoint ? (t->vec.len / 8 != nk || t->out.len / 8 != d)
                      : (t->vec.len / 8 != d || t->out.len / 8 % nk != 0);
    if (bad) {
        tile_release(t, 4);
        PyErr_SetString(PyExc_ValueError, "tile products: bad shapes or m");
        return -1;
    }
    t->n = n;
    t->k = k;
    t->d = d;
    return 0;
}

/* tile_adjoint(z, rows, signs, k, m, t_lo, t_hi, scale, out) */
static PyObject *tile_adjoint(PyObject *self, PyObject *args) {
    PyObject *zo, *rowso, *signso, *outo;
    Py_ssize_t k, t_lo, t_hi;
    int m;
    double scale;
    if (!PyArg_ParseTuple(args, "OOOninndO", &zo, &rowso, &signso, &k, &m, &t_lo, &t_hi,
                          &scale, &outo))
        return NULL;
    tile_args t;
    if (tile_parse(&t, zo, rowso, signso, outo, k, m, 1) < 0) return NULL;
    Py_ssize_t T = (Py_ssize_t)1 << m;
    if (t_lo < 0 || t_hi > t.d / T || t_lo > t_hi) {
        tile_release(&t, 4);
        PyErr_SetString(PyExc_ValueError, "tile_adjoint: tile range out of bounds");
        return NULL;
    }
    double *work = malloc((size_t)(2 * T) * sizeof(double));
    if (work == NULL) {
        tile_release(&t, 4);
        return PyErr_NoMemory();
    }
    int bad;
    Py_BEGIN_ALLOW_THREADS
    bad = tile_rows_bad((const int64_t *)t.rows.buf, t.n * t.k, t.d);
    if (!bad)
        tile_adjoint_run((const double *)t.vec.buf, (const int64_t *)t.rows.buf,
                         (const int8_t *)t.signs.buf, t.n, t.k, t.d, m, t_lo, t_hi, scale,
                         (double *)t.out.buf, work, work + T);
    Py_END_ALLOW_THREADS
    free(work);
    tile_release(&t, 4);
    if (bad) return tile_rows_error();
    Py_RETURN_NONE;
}

/* tile_forward(u, rows, signs, k, m, groups, lo, hi, part) */
static PyObject *tile_forward(PyObject *self, PyObject *args) {
    PyObject *uo, *rowso, *signso, *outo;
    Py_ssize_t k, groups, lo, hi;
    int m;
    if (!PyArg_ParseTuple(args, "OOOninnnO", &uo, &rowso, &signso, &k, &m, &groups, &lo, &hi,
                          &outo))
        return NULL;
    tile_args t;
    if (tile_parse(&t, uo, rowso, signso, outo, k, m, 0) < 0) return NULL;
    Py_ssize_t T = (Py_ssize_t)1 << m;
    if (groups < 1 || groups > t.d / T || t.out.len / 8 != groups * t.n * t.k || lo < 0 ||
        hi > groups * t.n || lo > hi) {
        tile_release(&t, 4);
        PyErr_SetString(PyExc_ValueError,
                        "tile_forward: groups, the part's size or the unit range out of bounds");
        return NULL;
    }
    double *work = malloc((size_t)T * sizeof(double));
    if (work == NULL) {
        tile_release(&t, 4);
        return PyErr_NoMemory();
    }
    int bad;
    Py_BEGIN_ALLOW_THREADS
    bad = tile_rows_bad((const int64_t *)t.rows.buf, t.n * t.k, t.d);
    if (!bad)
        tile_forward_run((const double *)t.vec.buf, (const int64_t *)t.rows.buf,
                         (const int8_t *)t.signs.buf, t.n, t.k, t.d, m, groups, lo, hi,
                         (double *)t.out.buf, work);
    Py_END_ALLOW_THREADS
    free(work);
    tile_release(&t, 4);
    if (bad) return tile_rows_error();
    Py_RETURN_NONE;
}

/* ---- hblocks' encode as one pipeline (hb_pipe), on the calling thread and, for two-thread
 * encodes, one helper thread of this module. The same operations as hb_encode (the same bits:
 * the FWHT stages in the same order, every butterfly computed alike), fused so that each
 * value is written about once per block of TILE_BLOCK positions, in L1, instead of once per
 * pass. w (b doubles) holds the first block, z (b doubles, z[q] is position e + q) the
 * second; h = b / 2.
 *
 *   phase 1, half t = 0 or 1 (positions [t h, t h + h) of the first block): for each block
 *     of TILE_BLOCK positions, the first pass (signs, cyclic shift, 1/sqrt(b)) and the
 *     block's FWHT stages; then the stages across blocks: w[t h : t h + h] holds the FWHT of
 *     its half.
 *   phase 2, half t (z[t h : t h + h)), once both halves of phase 1 are done: block by
 *     block, at overlap positions (q < b - e) the first block's last butterfly stage and the
 *     second signs (bit q of rpsSIGN2), at the tail (positions >= b) the first pass with
 *     scale 1; the block's FWHT stages; then the stages across blocks. Half 1 also writes the
 *     kept rows below e (the first block's last stage at them).
 *   phase 3 (the caller): the kept rows >= e, the second block's last stage at them times
 *     1/sqrt(b).
 *
 * Each half of a phase has h positions to fill and one FWHT of h, so the halves balance.
 * Phase 2 reads w and writes z only: the halves of a phase never race. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

typedef struct {
    const double *x;
    const int64_t *rows;
    double *w, *z, *out;
    Py_ssize_t d, b, e, h, k, shift;
    uint64_t key1, key2;
    double inv;
} hb_pipe_job;

/* spin until *flag reaches value; yield the CPU after a while (a loaded machine) */
static void spin_until(atomic_int *flag, int value) {
    for (unsigned n = 0; atomic_load_explicit(flag, memory_order_acquire) < value; n++) {
        if (n < 64)
            CPU_RELAX();
        else
            sched_yield();
    }
}

/* the first pass at positions [p0, p1) (all below b or all from b on) into dst[0, p1 - p0):
 * the inputs j = (p - shift) mod d, one or two runs */
TILE_INLINE void hb_first_positions(const hb_pipe_job *J, Py_ssize_t p0, Py_ssize_t p1,
                                    double scale, double *dst) {
    Py_ssize_t j0 = p0 - J->shift;
    if (j0 < 0) j0 += J->d;
    Py_ssize_t len = p1 - p0, first = J->d - j0 < len ? J->d - j0 : len;
    hb_segment_v(J->x, J->key1, j0, j0 + first, dst - j0, scale);
    if (first < len) hb_segment_v(J->x, J->key1, 0, len - first, dst + first, scale);
}

TILE_CLONES static void hb_pipe_phase1(const hb_pipe_job *J, int t) {
    Py_ssize_t h = J->h, lo = t * h, block = h < TILE_BLOCK ? h : TILE_BLOCK;
    for (Py_ssize_t p = lo; p < lo + h; p += block) {
        hb_first_positions(J, p, p + block, J->inv, J->w + p);
        tile_fwht_block(J->w + p, block);
    }
    tile_stages_from(J->w + lo, h, block);
}

TILE_CLONES static void hb_pipe_phase2(const hb_pipe_job *J, int t) {
    Py_ssize_t h = J->h, e = J->e, lo = t * h, over = J->b - e;
    Py_ssize_t block = h < TILE_BLOCK ? h : TILE_BLOCK;
    const double *w = J->w;
    double *z = J->z;
    for (Py_ssize_t q0 = lo; q0 < lo + h; q0 += block) {
        Py_ssize_t q1 = q0 + block < over ? q0 + block : over; /* the overlap part */
        /* positions e + q below h pair with e + q + h, the others with e + q - h */
        Py_ssize_t q = q0, qh = h - e < q0 ? q0 : h - e < q1 ? h - e : q1;
        const double *restrict lo_in = w + e, *restrict hi_in = w + e + h;
        for (; q < qh; q++) z[q] = lo_in[q] + hi_in[q];
        const double *restrict below = w + e - h;
        for (; q < q1; q++) z[q] = below[q] - lo_in[q];
        if (q0 < q1) hb_segment_v(z, J->key2, q0, q1, z, 1.0); /* signs flipped in place */
        if (q < q0 + block) /* the tail part: positions e + q >= b, from x */
            hb_first_positions(J, e + q, e + q0 + block, 1.0, z + q);
        tile_fwht_block(z + q0, block);
    }
    tile_stages_from(z + lo, h, block);
    if (t == 1) /* the kept rows below e: the first block's last stage */
        for (Py_ssize_t i = 0; i < J->k; i++) {
            Py_ssize_t r = (Py_ssize_t)J->rows[i];
            if (r < e) J->out[i] = r < h ? w[r] + w[r + h] : w[r - h] - w[r];
        }
}

/* phase 3: the kept rows >= e, the second block's last stage at them, times 1/sqrt(b) */
static void hb_pipe_finish(const hb_pipe_job *J) {
    const double *z = J->z;
    Py_ssize_t h = J->h;
    for (Py_ssize_t i = 0; i < J->k; i++) {
        Py_ssize_t q = (Py_ssize_t)J->rows[i] - J->e;
        if (q >= 0) J->out[i] = (q < h ? z[q] + z[q + h] : z[q - h] - z[q]) * J->inv;
    }
}

/* ---- Two threads: the caller and one helper thread per process, started at the first
 * two-core encode. An encode is four units (phase 1 of halves 0 and 1, then phase 2 of
 * halves 0 and 1) that the caller and the helper claim in order; a phase-2 unit waits until
 * both phase-1 units are done. The caller claims too, so a helper that is slow to wake (or
 * whose core is busy) costs at most the units it has claimed: with no helper the caller
 * runs all four. The job lives in static storage, owned by one caller at a time
 * (helper_owner; a caller that finds it taken runs its encode alone), and a claim names
 * the job's generation, so a helper that wakes late finds its job gone and claims nothing.
 * After each job the helper spins for HELPER_SPIN_NS, yielding the core every few
 * microseconds (a caller that shares its core then runs first), so that encodes a few
 * milliseconds apart (a client's vectors of one round) hand over at once; then it sleeps on
 * a condition variable (hb_wake wakes it early). fht-cpu's OpenMP threads, which the padded
 * SRHT's encode uses, spin as long (3.3-6.7 ms of CPU after each transform, measured here)
 * and do not yield. fork(): the child has no helper and starts its own (helper_after_fork). */
#define HELPER_SPIN_NS 5000000 /* how long the helper spins for the next job before sleeping */

static pthread_mutex_t helper_owner = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t helper_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cv = PTHREAD_COND_INITIALIZER;
static int helper_state; /* 0: not started, 1: running, -1: could not start */
static atomic_ulong helper_posted;   /* the generation of the latest job */
static atomic_int helper_sleeping;
static int helper_woken; /* under helper_mu: hb_wake asked a sleeping helper to spin */
static hb_pipe_job helper_job;       /* written by its owner before the generation is posted */
static atomic_ulong job_claim;       /* generation * 8 + the next unit to claim (0-4) */
static atomic_int job_phase1_done, job_phase2_done;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* claim and run units of job generation gen until none is left (or the job is gone) */
static void hb_pipe_units(unsigned long gen) {
    for (;;) {
        unsigned long c = atomic_load(&job_claim);
        if (c >> 3 != gen || (c & 7) >= 4) return;
        if (!atomic_compare_exchange_weak(&job_claim, &c, c + 1)) continue;
        int unit = (int)(c & 7);
        if (unit < 2) {
            hb_pipe_phase1(&helper_job, unit);
            atomic_fetch_add_explicit(&job_phase1_done, 1, memory_order_release);
        } else {
            spin_until(&job_phase1_done, 2);
            hb_pipe_phase2(&helper_job, unit - 2);
            atomic_fetch_add_explicit(&job_phase2_done, 1, memory_order_release);
        }
    }
}

/* arg: the value of helper_posted when the thread was created (its first job comes after) */
static void *helper_main(void *arg) {
    unsigned long seen = (unsigned long)(uintptr_t)arg;
    for (;;) {
        unsigned long g = atomic_load(&helper_posted);
        int64_t until = g == seen ? now_ns() + HELPER_SPIN_NS : 0;
        for (int n = 1; g == seen; n++) {
            CPU_RELAX();
            g = atomic_load(&helper_posted);
            if (g == seen && (n & 63) == 0) {
                if (now_ns() > until) break;
                sched_yield(); /* a caller on this same core runs first */
            }
        }
        if (g == seen) { /* sleep until a job or a wake-up (hb_wake: spin again) */
            pthread_mutex_lock(&helper_mu);
            atomic_store(&helper_sleeping, 1);
            while ((g = atomic_load(&helper_posted)) == seen && !helper_woken)
                pthread_cond_wait(&helper_cv, &helper_mu);
            helper_woken = 0;
            atomic_store(&helper_sleeping, 0);
            pthread_mutex_unlock(&helper_mu);
            if (g == seen) continue;
        }
        seen = g;
        hb_pipe_units(g);
    }
    return NULL;
}

/* wake a sleeping helper (it then spins for a job); nothing if it spins or does not exist */
static void helper_wake(void) {
    if (!atomic_load(&helper_sleeping)) return;
    pthread_mutex_lock(&helper_mu);
    helper_woken = 1;
    pthread_cond_signal(&helper_cv);
    pthread_mutex_unlock(&helper_mu);
}

/* in a child after fork() the helper does not exist: start afresh */
static void helper_after_fork(void) {
    pthread_mutex_init(&helper_owner, NULL);
    pthread_mutex_init(&helper_mu, NULL);
    pthread_cond_init(&helper_cv, NULL);
    helper_state = 0;
    helper_woken = 0;
    atomic_store(&helper_sleeping, 0);
}

/* 1 with the helper owned by the caller (release with pthread_mutex_unlock(&helper_owner)),
 * 0 when another caller has it or it cannot start */
static int helper_acquire(void) {
    if (pthread_mutex_trylock(&helper_owner) != 0) return 0;
    if (helper_state == 0) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with the Python threads */
        pthread_attr_t attr;
        pthread_t tid;
        int ok = pthread_attr_init(&attr) == 0;
        ok = ok && pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0;
        void *posted = (void *)(uintptr_t)atomic_load(&helper_posted);
        ok = ok && pthread_create(&tid, &attr, helper_main, posted) == 0;
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        helper_state = ok ? 1 : -1;
    }
    if (helper_state != 1) {
        pthread_mutex_unlock(&helper_owner);
        return 0;
    }
    return 1;
}

static void hb_pipe_run(const hb_pipe_job *J, int threads) {
    if (threads >= 2 && helper_acquire()) {
        helper_job = *J;
        atomic_store(&job_phase1_done, 0);
        atomic_store(&job_phase2_done, 0);
        unsigned long gen = atomic_load(&helper_posted) + 1;
        atomic_store(&job_claim, gen << 3);
        atomic_store(&helper_posted, gen);
        helper_wake();
        hb_pipe_units(gen);
        spin_until(&job_phase2_done, 2); /* the units the helper claimed */
        pthread_mutex_unlock(&helper_owner);
    } else {
        hb_pipe_phase1(J, 0);
        hb_pipe_phase1(J, 1);
        hb_pipe_phase2(J, 0);
        hb_pipe_phase2(J, 1);
    }
    hb_pipe_finish(J);
}

/* hb_wake(): wake the helper thread if it sleeps, so that it spins by the time a two-thread
 * encode posts its job (a caller makes this call before the work that precedes hb_pipe, such
 * as sampling the rows: a sleeping thread takes tens of microseconds to wake) */
static PyObject *hb_wake(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    helper_wake();
    Py_RETURN_NONE;
}

/* hb_pipe(x, seed, rows, work, out, threads): the whole hblocks encode (b = 2^floor(log2 d)
 * >= 8); work: 2 b doubles (w, then z); threads >= 2 runs the halves on two threads */
static PyObject *hb_pipe(PyObject *self, PyObject *args) {
    PyObject *xo, *ro, *wo, *oo;
    unsigned long long seed;
    int threads;
    if (!PyArg_ParseTuple(args, "OKOOOi", &xo, &seed, &ro, &wo, &oo, &threads)) return NULL;
    Py_buffer x, rows, w, out;
    if (get_buffer(xo, &x, 0, "d", 8, "x") < 0) return NULL;
    if (get_w_rows_out(wo, ro, oo, 1, &w, &rows, &out) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t d = x.len / 8, b = d >= 1 ? hb_block(d) : 0;
    int ok = b >= 8 && w.len == 2 * b * 8 && !buffers_overlap(&x, &w) &&
             !buffers_overlap(&out, &w) && hb_rows_ok(&rows, d, &out);
    if (ok) {
        hb_pipe_job J = {
            .x = (const double *)x.buf, .rows = (const int64_t *)rows.buf,
            .w = (double *)w.buf, .z = (double *)w.buf + b, .out = (double *)out.buf,
            .d = d, .b = b, .e = d - b, .h = b / 2, .k = rows.len / 8,
            .shift = hb_shift((uint64_t)seed, d), .key1 = mix64((uint64_t)seed ^ TAG_SIGNS),
            .key2 = mix64((uint64_t)seed ^ TAG_SIGN2), .inv = 1.0 / sqrt((double)b),
        };
        Py_BEGIN_ALLOW_THREADS
        hb_pipe_run(&J, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    release_w_rows_out(&w, &rows, &out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "hb_pipe: bad shapes (d >= 8, len(work) = 2 b), overlap or a row out "
                        "of range");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sign_multiply", sign_multiply, METH_VARARGS,
     "sign_multiply(x, key, out): out = D x (zero-padded), D from the stream key."},
    {"sign_factors", sign_factors_py, METH_VARARGS,
     "sign_factors(key, out): out = the int8 diagonal of D from the stream key (GIL released)."},
    {"sample_distinct", sample_distinct, METH_VARARGS,
     "sample_distinct(key, k, bound, out): k distinct rows in order of acceptance."},
    {"last_stage", last_stage, METH_VARARGS,
     "last_stage(pair, rows, scale, out): the SRHT's last butterfly at the kept rows."},
    {"fwht_rows", fwht_rows, METH_VARARGS,
     "fwht_rows(a, n): in-place FWHT of every run of n doubles of a (GIL released)."},
    {"hb_first", hb_first, METH_VARARGS,
     "hb_first(x, seed, w): hblocks' signs and cyclic shift, x into w."},
    {"hb_middle", hb_middle_py, METH_VARARGS,
     "hb_middle(w, seed): hblocks' second signs and scaling, in place."},
    {"hb_gather", hb_gather_py, METH_VARARGS,
     "hb_gather(w, rows, out): hblocks' kept rows with their last scale."},
    {"hb_encode", hb_encode, METH_VARARGS,
     "hb_encode(x, seed, rows, w, out): the whole hblocks encode in C."},
    {"hb_wake", hb_wake, METH_NOARGS,
     "hb_wake(): wake hb_pipe's helper thread if it sleeps (before a two-thread encode)."},
    {"hb_pipe", hb_pipe, METH_VARARGS,
     "hb_pipe(x, seed, rows, work, out, threads): the whole hblocks encode as one fused "
     "pipeline, on two threads when threads >= 2 (GIL released)."},
    {"tile_adjoint", tile_adjoint, METH_VARARGS,
     "tile_adjoint(z, rows, signs, k, m, t_lo, t_hi, scale, out): tiles [t_lo, t_hi) of "
     "the joint SRHT adjoint, by tiles of 2^m coordinates (GIL released)."},
    {"tile_forward", tile_forward, METH_VARARGS,
     "tile_forward(u, rows, signs, k, m, groups, lo, hi, part): units [lo, hi) (unit "
     "g n + i: client i over tile group g) of the joint SRHT forward product without its "
     "scale, part[g, i] (shape (groups, n, k)), by tiles of 2^m coordinates (GIL released)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fast(void) {
    byte_factors_init();
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, helper_after_fork) == 0) atfork_done = 1;
    return PyModule_Create(&module);
}
