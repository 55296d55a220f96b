/* rows.c (rpsagg._fast): rejection sampling of distinct rows (sample_distinct, with a bitmap
 * of values seen) and the SRHT's last butterfly stage at the kept rows only (last_stage).
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

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
