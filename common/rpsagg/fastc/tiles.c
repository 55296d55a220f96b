/* tiles.c (rpsagg._fast): the decode's joint SRHT products by tiles of 2^m coordinates
 * (tile_adjoint, tile_forward), thread-split by the caller with bits that do not depend on the
 * split.
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

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
