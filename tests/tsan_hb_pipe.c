/* ThreadSanitizer harness of hblocks' two-thread encode (hb_pipe_run in fastc/hbpipe.c), built and
 * run by tests/unit/test_hblocks_tsan.py: three threads, then the main one, encode at once with
 * two threads each (so they contend for the one helper, and the helper falls asleep every
 * 50 encodes) and must give the one-thread pipeline's bits. _fast_noclones.c is _fast.c,
 * beside copies of the fastc/ files it includes without target_clones (ThreadSanitizer runs
 * after the loader resolves ifuncs). */
#include "_fast_noclones.c"
#include <stdio.h>
#include <unistd.h>

#define D 70001
#define K 700
static double X[D];
static int64_t ROWS[K];
static double REF[4][K];

static void run_one(double *work, double *out, int threads, uint64_t seed) {
    Py_ssize_t b = hb_block(D);
    hb_pipe_job J = {.x = X, .rows = ROWS, .w = work, .z = work + b, .out = out, .d = D, .b = b,
                     .e = D - b, .h = b / 2, .k = K, .shift = hb_shift(seed, D),
                     .key1 = mix64(seed ^ TAG_SIGNS), .key2 = mix64(seed ^ TAG_SIGN2),
                     .inv = 1.0 / sqrt((double)b)};
    hb_pipe_run(&J, threads);
}

static void *worker(void *arg) {
    long id = (long)arg;
    double *work = malloc(2 * hb_block(D) * sizeof(double)), out[K];
    for (int it = 0; it < 200; it++) {
        run_one(work, out, 2, (uint64_t)(id % 4));
        if (memcmp(out, REF[id % 4], sizeof out)) {
            printf("mismatch: thread %ld, encode %d\n", id, it);
            exit(1);
        }
        if (it % 50 == 0) usleep(20000); /* longer than the helper's spin: it sleeps */
    }
    free(work);
    return NULL;
}

int main(void) {
    for (int i = 0; i < D; i++) X[i] = sin(i * 0.37);
    for (int i = 0; i < K; i++) ROWS[i] = (i * 97) % D;
    double *work = malloc(2 * hb_block(D) * sizeof(double));
    for (int s = 0; s < 4; s++) run_one(work, REF[s], 1, (uint64_t)s);
    free(work);
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    worker((void *)3);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("ok\n");
    return 0;
}
