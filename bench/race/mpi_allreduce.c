/* MPI_Allreduce (float32 sum, separate buffers) timed the way `monel bench` times Monel:
 * per size, warm-up calls, then a batch of calls sized to take about TARGET_MS, and the
 * slowest rank's mean time per call. Prints "size_bytes time_us" lines on rank 0.
 * Usage: mpi_allreduce MIN_BYTES MAX_BYTES FACTOR TARGET_MS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long min = argc > 1 ? atol(argv[1]) : 8, max = argc > 2 ? atol(argv[2]) : 32 << 20;
    long factor = argc > 3 ? atol(argv[3]) : 8;
    double target = (argc > 4 ? atof(argv[4]) : 100.0) / 1e3;
    size_t cap = (size_t)max / 4 + 1;
    float *in = malloc(cap * 4), *out = malloc(cap * 4);
    for (long size = min; size <= max; size *= factor) {
        long count = size / 4;
        for (long i = 0; i < count; i++) in[i] = (float)(rank + 1);
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int wrong = 0;
        for (long i = 0; i < count; i++) wrong += out[i] != (float)(n * (n + 1) / 2);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (wrong) {
            if (rank == 0) fprintf(stderr, "size %ld: %d wrong elements\n", size, wrong);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* Warm-up, then batches doubling until one takes a tenth of the target (the
         * slowest rank's time decides, so every rank stops alike) and the batches together
         * took half the target: the batch size. */
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < 3; i++)
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double per, spent = 0;
        for (long k = 1;;) {
            double t0 = MPI_Wtime(), took;
            for (long i = 0; i < k; i++)
                MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            took = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &took, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            spent += took;
            int lng = took >= target / 10;
            if ((lng && spent >= target / 2) || k >= 1L << 20) {
                per = took / k;
                break;
            }
            if (!lng)
                k *= 2;
        }
        long iters = per > 0 ? (long)(target / per) : 10000;
        if (iters < 3) iters = 3;
        if (iters > 1000000) iters = 1000000;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) * 1e6 / iters, slowest;
        MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.3f\n", size, slowest);
        fflush(stdout);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
