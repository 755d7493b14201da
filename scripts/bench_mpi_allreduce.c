/* Open MPI's allreduce over its tcp transport (btl tcp on loopback), timed the way `terse bench allreduce` and
 * scripts/bench_gloo_allreduce.py time theirs, for scripts/bench-vs-peers: a float32 buffer of SIZE bytes summed in
 * place (MPI_IN_PLACE, MPI_SUM). After the warm-up the timed iterations run in min(ITERS, 5) batches of ITERS / batches
 * back-to-back operations, each batch after a barrier; a batch's time is the slowest rank's, and the figure is the
 * median batch divided by its operations -- experiments/cli/bench/collective.cc's rule, so that both columns of
 * scripts/bench-vs-peers are the same statistic (a median over single operations drops the slow ones a batch keeps).
 * busbw = size * 2(n-1)/n / time. The timed data grow by a factor n per operation (timing does not depend on the
 * values); small integers (exact in f32) are summed and checked after the timed loop.
 *
 *   mpicc -O2 -o /tmp/bench_mpi_allreduce scripts/bench_mpi_allreduce.c
 *   mpirun -n 2 --mca pml ob1 --mca btl self,tcp /tmp/bench_mpi_allreduce SIZE_BYTES ITERS WARMUP
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int compareDoubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: bench_mpi_allreduce SIZE_BYTES ITERS WARMUP\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const long size = atol(argv[1]);
  const int iters = atoi(argv[2]), warmup = atoi(argv[3]);
  if (size < 4 || size % 4 != 0 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "bench_mpi_allreduce: SIZE_BYTES must be a positive multiple of 4, ITERS >= 1\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const long count = size / 4;
  const int batches = iters < 5 ? iters : 5;
  const int per_batch = iters / batches;
  float* x = malloc((size_t)size);
  double* times = malloc(sizeof(double) * (size_t)batches);
  for (long i = 0; i < count; ++i) x[i] = (float)((i + rank) % 7);
  for (int it = 0; it < warmup; ++it) MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int b = 0; b < batches; ++b) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < per_batch; ++i)
      MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times[b] = slowest / per_batch;
  }
  for (long i = 0; i < count; ++i) x[i] = (float)((i + rank) % 7);
  MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  long wrong = 0;
  for (long i = 0; i < count; ++i) {
    long want = 0;
    for (int r = 0; r < n; ++r) want += (i + r) % 7;
    wrong += x[i] != (float)want;
  }
  long wrong_all = 0;
  MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  qsort(times, (size_t)batches, sizeof(double), compareDoubles);
  const double med = times[batches / 2];
  if (rank == 0) {
    const double algbw = (double)size / med / 1e9;
    printf("#  ranks        size   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong\n");
    printf("%8d %11ld %10.2f %12.3f %12.3f %7ld\n", n, size, med * 1e6, algbw, algbw * 2.0 * (n - 1) / n, wrong_all);
  }
  free(x);
  free(times);
  MPI_Finalize();
  return wrong_all != 0;
}
