/* signs.c (rpsagg._fast): the SRHT's +-1 sign vector D from the stream rpsSIGNS: sign_multiply
 * (x times D, zero-padded) and sign_factors (D as int8, through a 256-entry byte table).
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

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
