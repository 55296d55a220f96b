/* hblocks.c (rpsagg._fast): the overlapping-blocks Hadamard projection step by step (hb_first,
 * hb_middle, hb_gather, hb_encode): the reference the fused pipeline (hbpipe.c) is checked
 * against.
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

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
