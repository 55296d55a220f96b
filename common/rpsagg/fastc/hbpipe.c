/* hbpipe.c (rpsagg._fast): hblocks' encode as one fused pipeline (hb_pipe) and its helper
 * thread (start, job hand-off by atomics, sleep/wake, fork safety).
 *
 * Part of the one extension module rpsagg._fast: _fast.c includes it, in the order listed
 * there, into one translation unit, so it uses what the files before it define. */

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
