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
 *
 * One file per concern, included below into this one translation unit (the same code, in
 * the same order, as when it was one file: the compiler inlines across them as before):
 *   fastc/base.c     SplitMix64 stream words, the buffer-protocol check
 *   fastc/signs.c    the sign vector D (sign_multiply, sign_factors)
 *   fastc/rows.c     distinct-row sampling, the last butterfly stage at the kept rows
 *   fastc/fwht.c     the FWHT and its SIMD building blocks
 *   fastc/hblocks.c  the hblocks projection step by step (hb_first ... hb_encode)
 *   fastc/tiles.c    the decode's joint SRHT products by tiles
 *   fastc/hbpipe.c   hblocks' fused encode pipeline and its helper thread
 * This file holds the module: its method table and initialisation.
 */

#include "fastc/base.c"
#include "fastc/signs.c"
#include "fastc/rows.c"
#include "fastc/fwht.c"
#include "fastc/hblocks.c"
#include "fastc/tiles.c"
#include "fastc/hbpipe.c"

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
