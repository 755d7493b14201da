/* The loopback bound of a ring allreduce's traffic, for scripts/bench-vs-peers: n processes in a ring of TCP
 * connections on 127.0.0.1, each sending 2(n-1)/n * SIZE bytes to its right neighbour while it receives as many from
 * its left (a sender and a receiver thread per process, blocking send/recv of 1 MiB, TCP_NODELAY), and nothing else: no
 * framing, no reduction, no waiting on the ring's steps. That is the bytes a ring allreduce of SIZE bytes moves per
 * rank, so its time is what the kernel's loopback copies alone cost on this machine (a transport's floor). After the
 * warm-up, each timed iteration starts after a token went twice round the ring; an iteration's time is the slowest
 * rank's, and the figure is the median over the iterations. busbw = SIZE * 2(n-1)/n / time, as for the allreduces.
 *
 *   cc -O2 -pthread -o /tmp/bench_loopback_ring scripts/bench_loopback_ring.c
 *   /tmp/bench_loopback_ring RANKS SIZE_BYTES ITERS WARMUP
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kMaxRanks = 64, kMaxIters = 1000, kChunk = 1 << 20 };

struct Stream {
  int fd;
  char* buf;
  size_t bytes;
};

static void die(const char* what) {
  perror(what);
  exit(1);
}

static void* sendAll(void* arg) {
  const struct Stream* s = arg;
  for (size_t off = 0; off < s->bytes;) {
    const size_t c = s->bytes - off < kChunk ? s->bytes - off : kChunk;
    const ssize_t w = send(s->fd, s->buf + off, c, 0);
    if (w <= 0) die("bench_loopback_ring: send");
    off += (size_t)w;
  }
  return NULL;
}

static void* recvAll(void* arg) {
  const struct Stream* s = arg;
  for (size_t off = 0; off < s->bytes;) {
    const size_t c = s->bytes - off < kChunk ? s->bytes - off : kChunk;
    const ssize_t r = recv(s->fd, s->buf + off, c, 0);
    if (r <= 0) die("bench_loopback_ring: recv");
    off += (size_t)r;
  }
  return NULL;
}

static double nowSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compareDoubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: bench_loopback_ring RANKS SIZE_BYTES ITERS WARMUP\n");
    return 2;
  }
  const int n = atoi(argv[1]);
  const long size = atol(argv[2]);
  const int iters = atoi(argv[3]), warmup = atoi(argv[4]);
  if (n < 2 || n > kMaxRanks || size < n || iters < 1 || iters > kMaxIters || warmup < 0) {
    fprintf(stderr, "bench_loopback_ring: RANKS in [2, %d], SIZE_BYTES >= RANKS, ITERS in [1, %d], WARMUP >= 0\n",
            kMaxRanks, kMaxIters);
    return 2;
  }
  const size_t bytes = (size_t)(size / n) * 2 * (size_t)(n - 1);

  // Every rank's listening socket exists before the fork, so each can connect to its right neighbour at once.
  int listener[kMaxRanks];
  struct sockaddr_in addr[kMaxRanks];
  for (int i = 0; i < n; ++i) {
    listener[i] = socket(AF_INET, SOCK_STREAM, 0);
    memset(&addr[i], 0, sizeof addr[i]);
    addr[i].sin_family = AF_INET;
    addr[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr[i];
    if (listener[i] < 0 || bind(listener[i], (struct sockaddr*)&addr[i], len) != 0 || listen(listener[i], 4) != 0 ||
        getsockname(listener[i], (struct sockaddr*)&addr[i], &len) != 0)
      die("bench_loopback_ring: listen");
  }
  // times[rank * iters + i]: shared with the parent (rank 0), which takes each iteration's slowest rank.
  double* times =
      mmap(NULL, sizeof(double) * (size_t)n * (size_t)iters, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (times == MAP_FAILED) die("bench_loopback_ring: mmap");
  int me = 0;
  for (int i = 1; i < n; ++i) {
    const pid_t p = fork();
    if (p < 0) die("bench_loopback_ring: fork");
    if (p == 0) {
      me = i;
      break;
    }
  }
  const int right = (me + 1) % n;
  const int out = socket(AF_INET, SOCK_STREAM, 0);
  if (out < 0 || connect(out, (struct sockaddr*)&addr[right], sizeof addr[right]) != 0)
    die("bench_loopback_ring: connect");
  const int in = accept(listener[me], NULL, NULL);
  if (in < 0) die("bench_loopback_ring: accept");
  const int one = 1;
  setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char* sbuf = malloc(bytes);
  char* rbuf = malloc(bytes);
  if (!sbuf || !rbuf) die("bench_loopback_ring: malloc");
  memset(sbuf, 1, bytes);
  memset(rbuf, 0, bytes);
  struct Stream tx = {out, sbuf, bytes}, rx = {in, rbuf, bytes};
  for (int it = 0; it < warmup + iters; ++it) {
    char token = 0;
    for (int round = 0; round < 2; ++round) {
      if (me == 0 && send(out, &token, 1, 0) != 1) die("bench_loopback_ring: token");
      if (recv(in, &token, 1, MSG_WAITALL) != 1) die("bench_loopback_ring: token");
      if (me != 0 && send(out, &token, 1, 0) != 1) die("bench_loopback_ring: token");
    }
    const double t0 = nowSeconds();
    pthread_t a, b;
    pthread_create(&a, NULL, sendAll, &tx);
    pthread_create(&b, NULL, recvAll, &rx);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    if (it >= warmup) times[me * iters + (it - warmup)] = nowSeconds() - t0;
  }
  if (me != 0) return 0;
  for (int i = 1; i < n; ++i) wait(NULL);
  double slowest[kMaxIters];
  for (int i = 0; i < iters; ++i) {
    slowest[i] = 0;
    for (int r = 0; r < n; ++r)
      if (times[r * iters + i] > slowest[i]) slowest[i] = times[r * iters + i];
  }
  qsort(slowest, (size_t)iters, sizeof(double), compareDoubles);
  const double t = slowest[iters / 2];
  printf("# loopback ring (plain sockets, no reduction), median of %d after %d warm-up\n", iters, warmup);
  printf("#  ranks        size   time(us)  busbw(GB/s)\n");
  printf("%8d %11ld %10.1f %12.3f\n", n, size, t * 1e6, (double)bytes / t / 1e9);
  return 0;
}
