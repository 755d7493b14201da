// Helpers of the multi-rank tests: one thread per rank (Gloo's spawn), a watchdog that turns a hang into a failure,
// deterministic data, and replays of the algorithms' summation orders so expected 16-bit sums are exact.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/collective.h"
#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/comm/job.h"
#include "core/common/dtype.h"
#include "terse/sdk/half.hpp"

namespace terse::comm::testing {

// What each rank's thread threw (empty when it returned).
struct SpawnResult {
  std::vector<std::exception_ptr> errors;
  bool watchdog_fired = false;
  bool anyError() const {
    for (const auto& e : errors)
      if (e) return true;
    return false;
  }
  std::string message(int rank) const {
    if (!errors[static_cast<std::size_t>(rank)]) return "";
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(rank)]);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown exception";
    }
  }
};

// An environment of just these variables, for the functions that take an EnvLookup (job.h).
inline EnvLookup envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Runs fn(rank) on n threads. When they have not all returned after `timeout`, the watchdog aborts the fabric, which
// fails every pending operation, so the threads return with errors instead of hanging the test.
inline SpawnResult spawnRanks(int n, const std::function<void(int)>& fn, InprocFabric* fabric,
                              std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  SpawnResult result;
  result.errors.resize(static_cast<std::size_t>(n));
  std::mutex mutex;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        result.errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
      std::lock_guard lock(mutex);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, timeout, [&] { return finished == n; })) {
      result.watchdog_fired = true;
      if (fabric) fabric->abort("test watchdog: ranks still running after the timeout");
    }
  }
  for (auto& t : threads) t.join();
  return result;
}

// Fails the test with every rank's error.
inline void expectNoErrors(const SpawnResult& r) {
  EXPECT_FALSE(r.watchdog_fired) << "watchdog fired: a rank hung";
  for (std::size_t i = 0; i < r.errors.size(); ++i)
    EXPECT_EQ(r.errors[i], nullptr) << "rank " << i << ": " << r.message(static_cast<int>(i));
}

// Options that pin the ring allgatherv (auto picks Bruck for small gathers): for tests whose counts are the ring's.
inline HostCommOptions ringAllgather() {
  HostCommOptions o;
  o.allgather = AllgatherAlgorithm::kRing;
  return o;
}

// A fabric and one HostCommunicator per rank.
struct World {
  std::shared_ptr<InprocFabric> fabric;
  std::vector<std::unique_ptr<HostCommunicator>> comms;

  explicit World(int n, const HostCommOptions& comm_options = {}, const InprocOptions& inproc = {})
      : fabric(InprocFabric::create(n, inproc)) {
    for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<HostCommunicator>(fabric->endpoint(r), comm_options));
  }
  int size() const { return static_cast<int>(comms.size()); }
  SpawnResult run(const std::function<void(int, HostCommunicator&)>& fn,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    return spawnRanks(
        size(), [&](int r) { fn(r, *comms[static_cast<std::size_t>(r)]); }, fabric.get(), timeout);
  }
  void runOk(const std::function<void(int, HostCommunicator&)>& fn) { expectNoErrors(run(fn)); }
};

// splitmix64-style hash: deterministic data independent of the platform's RNG.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank r's element i: a multiple of 1/64 in [-15.625, 15.625], stored in dtype (rounded once for bf16).
inline float valueOf(int rank, std::size_t i, uint64_t salt = 0) {
  const uint64_t h = mix(salt * 1000003u + static_cast<uint64_t>(rank) * 0x100000001b3ull + i);
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) / 64.0f;
}

// Element i of a buffer of dtype as float, and the reverse (rounded to nearest even).
inline float load(const std::vector<std::byte>& buf, std::size_t i, DType dtype) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, buf.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return dtype == DType::kF16 ? sdk::halfToFloat(h) : sdk::bf16ToFloat(h);
}
inline void store(std::vector<std::byte>& buf, std::size_t i, DType dtype, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(buf.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::kF16 ? sdk::floatToHalf(v) : sdk::floatToBf16(v);
  std::memcpy(buf.data() + 2 * i, &h, 2);
}
// One pairwise add as reduce.h does it: in f32, rounded once to the element type.
inline float add(float a, float b, DType dtype) {
  const float s = a + b;
  if (dtype == DType::kF16) return sdk::halfToFloat(sdk::floatToHalf(s));
  if (dtype == DType::kBF16) return sdk::bf16ToFloat(sdk::floatToBf16(s));
  return s;
}

inline std::vector<std::byte> makeInput(int rank, std::size_t count, DType dtype, uint64_t salt = 0) {
  std::vector<std::byte> buf(count * dtypeSize(dtype));
  for (std::size_t i = 0; i < count; ++i) store(buf, i, dtype, valueOf(rank, i, salt));
  return buf;
}

// makeInput of every rank 0..n-1.
inline std::vector<std::vector<std::byte>> makeInputs(int n, std::size_t count, DType dtype, uint64_t salt = 0) {
  std::vector<std::vector<std::byte>> in;
  for (int r = 0; r < n; ++r) in.push_back(makeInput(r, count, dtype, salt));
  return in;
}

// The ring's order for the chunk holding element i (allreduce_ring.h): x_c, then + x_{c+1}, ..., + x_{c+n-1}.
inline std::vector<std::byte> expectedRing(const std::vector<std::vector<std::byte>>& in, std::size_t count,
                                           DType dtype) {
  const int n = static_cast<int>(in.size());
  std::vector<std::byte> out(count * dtypeSize(dtype));
  for (int c = 0; c < n; ++c) {
    const Range rc = ringChunk(count, n, c);
    for (std::size_t i = rc.begin; i < rc.begin + rc.size; ++i) {
      float acc = load(in[static_cast<std::size_t>(c)], i, dtype);
      for (int k = 1; k < n; ++k) acc = add(load(in[static_cast<std::size_t>((c + k) % n)], i, dtype), acc, dtype);
      store(out, i, dtype, acc);
    }
  }
  return out;
}

// The hierarchical allreduce's order (allreduce_hierarchical.h): inside each node of `per` consecutive ranks,
// x_{G-1} + x_{G-2} + ... + x_0 (the chain toward the leader), then the ring's order over the nodes' sums.
inline std::vector<std::byte> expectedHierarchical(const std::vector<std::vector<std::byte>>& in, std::size_t count,
                                                   DType dtype, int per) {
  const int n = static_cast<int>(in.size());
  per = std::min(per, n);
  std::vector<std::vector<std::byte>> nodes;
  for (int first = 0; first < n; first += per) {
    const int last = std::min(first + per, n) - 1;
    std::vector<std::byte> sum(count * dtypeSize(dtype));
    for (std::size_t i = 0; i < count; ++i) {
      float acc = load(in[static_cast<std::size_t>(last)], i, dtype);
      for (int g = last - 1; g >= first; --g) acc = add(load(in[static_cast<std::size_t>(g)], i, dtype), acc, dtype);
      store(sum, i, dtype, acc);
    }
    nodes.push_back(std::move(sum));
  }
  return nodes.size() == 1 ? nodes[0] : expectedRing(nodes, count, dtype);
}

// The recursive-doubling tree (allreduce_recursive_doubling.h), distances 1 up to p/2; the halving-doubling allreduce
// (allreduce_halving_doubling.h) halves nearest partner first, so it sums every block in this same order.
inline std::vector<std::byte> expectedRecursiveDoubling(const std::vector<std::vector<std::byte>>& in,
                                                        std::size_t count, DType dtype) {
  const int n = static_cast<int>(in.size());
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  std::vector<std::byte> out(count * dtypeSize(dtype));
  std::vector<float> v(static_cast<std::size_t>(n)), w(static_cast<std::size_t>(p)), w2(static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < count; ++i) {
    for (int r = 0; r < n; ++r) v[static_cast<std::size_t>(r)] = load(in[static_cast<std::size_t>(r)], i, dtype);
    for (int j = 0; j < rem; ++j)
      v[static_cast<std::size_t>(2 * j + 1)] =
          add(v[static_cast<std::size_t>(2 * j + 1)], v[static_cast<std::size_t>(2 * j)], dtype);
    for (int vr = 0; vr < p; ++vr)
      w[static_cast<std::size_t>(vr)] = v[static_cast<std::size_t>(vr < rem ? 2 * vr + 1 : vr + rem)];
    for (int d = 1; d < p; d *= 2) {
      for (int vr = 0; vr < p; ++vr)
        w2[static_cast<std::size_t>(vr)] =
            add(w[static_cast<std::size_t>(vr)], w[static_cast<std::size_t>(vr ^ d)], dtype);
      w.swap(w2);
    }
    store(out, i, dtype, w[0]);
  }
  return out;
}

// The binary tree's order (allreduce_tree.h): T_v = (x_v + T_{2v+1}) + T_{2v+2}, the result T_0.
inline float treeSum(const std::vector<std::vector<std::byte>>& in, std::size_t i, DType dtype, std::size_t v) {
  float acc = load(in[v], i, dtype);
  for (std::size_t c = 2 * v + 1; c <= 2 * v + 2 && c < in.size(); ++c) acc = add(acc, treeSum(in, i, dtype, c), dtype);
  return acc;
}
inline std::vector<std::byte> expectedTree(const std::vector<std::vector<std::byte>>& in, std::size_t count,
                                           DType dtype) {
  std::vector<std::byte> out(count * dtypeSize(dtype));
  for (std::size_t i = 0; i < count; ++i) store(out, i, dtype, treeSum(in, i, dtype, 0));
  return out;
}

// The master-worker order (allreduce_reduce_broadcast.h): ((x_0 + x_1) + x_2) + ... + x_{n-1}.
inline std::vector<std::byte> expectedRankOrder(const std::vector<std::vector<std::byte>>& in, std::size_t count,
                                                DType dtype) {
  std::vector<std::byte> out(count * dtypeSize(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    float acc = load(in[0], i, dtype);
    for (std::size_t r = 1; r < in.size(); ++r) acc = add(acc, load(in[r], i, dtype), dtype);
    store(out, i, dtype, acc);
  }
  return out;
}

// The exact result of a flat algorithm (not kAuto or kHierarchical), replayed in its own order.
inline std::vector<std::byte> expectedFor(AllreduceAlgorithm algo, const std::vector<std::vector<std::byte>>& in,
                                          std::size_t count, DType dtype) {
  switch (algo) {
    case AllreduceAlgorithm::kRecursiveDoubling:
    case AllreduceAlgorithm::kHalvingDoubling:
      return expectedRecursiveDoubling(in, count, dtype);
    case AllreduceAlgorithm::kTree:
      return expectedTree(in, count, dtype);
    case AllreduceAlgorithm::kReduceBroadcast:
      return expectedRankOrder(in, count, dtype);
    default:
      return expectedRing(in, count, dtype);
  }
}

// Number of ranks sorted out of 0..n-1 whose bytes differ from `want`, with the first difference.
inline ::testing::AssertionResult sameBytes(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                                            DType dtype) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  const std::size_t elem = dtypeSize(dtype);
  for (std::size_t i = 0; i < got.size() / elem; ++i) {
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << load(got, i, dtype) << ", want " << load(want, i, dtype);
    }
  }
  return ::testing::AssertionSuccess();
}

// Every rank of `world` allreduces its own copy of in[rank] and must end with exactly `want`.
inline void expectAllreduceGives(World& world, const std::vector<std::vector<std::byte>>& in, std::size_t count,
                                 DType dtype, const std::vector<std::byte>& want) {
  std::vector<std::vector<std::byte>> out = in;
  world.runOk([&](int r, HostCommunicator& c) { c.allreduce(out[static_cast<std::size_t>(r)].data(), count, dtype); });
  for (int r = 0; r < world.size(); ++r)
    EXPECT_TRUE(sameBytes(out[static_cast<std::size_t>(r)], want, dtype)) << "rank " << r;
}

// Deterministic bytes for (rank, salt): what one rank contributes to an allgatherv or broadcast test.
inline std::vector<std::byte> block(int rank, uint64_t size, int salt = 0) {
  std::vector<std::byte> b(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::byte>(mix(static_cast<uint64_t>(rank * 7919 + salt) * 1000003u + i) & 0xFF);
  return b;
}

// Several operations in flight at once, each under its own tag, issued in the same order everywhere but completed in
// any order, with blocking calls interleaved and compute running meanwhile. One body for every transport: `world` is
// a 4-rank World (inproc) or TcpWorld.
template <class WorldT>
void checkOverlappingOperations(WorldT& world) {
  const int n = 4;
  const std::size_t counts[] = {1000, 1 << 18, 3, 70000};
  std::vector<std::vector<std::vector<std::byte>>> in(4);
  for (std::size_t k = 0; k < 4; ++k)
    for (int r = 0; r < n; ++r) in[k].push_back(makeInput(r, counts[k], DType::kF32, k));
  world.runOk([&](int r, HostCommunicator& c) {
    std::vector<std::vector<std::byte>> bufs;
    for (std::size_t k = 0; k < 4; ++k) bufs.push_back(in[k][static_cast<std::size_t>(r)]);
    std::vector<CommRequest> reqs;
    for (std::size_t k = 0; k < 4; ++k)
      reqs.push_back(c.iallreduce(bufs[k].data(), counts[k], DType::kF32, ReduceOp::kSum, k));
    std::vector<uint64_t> sizes = {100, 0, 5000, 7};
    const auto mine = block(r, sizes[static_cast<std::size_t>(r)], 3);
    std::vector<std::byte> gathered(5107);
    reqs.push_back(c.iallgatherv(mine, gathered, sizes, 9));
    std::vector<std::byte> bc = r == 2 ? block(2, 4096, 4) : std::vector<std::byte>(4096);
    reqs.push_back(c.ibroadcast(bc, 2, 10));
    reqs.push_back(c.ibarrier());
    // A blocking allreduce issued while the others are queued runs at once under its own tag.
    float x = static_cast<float>(r + 1);
    c.allreduce(&x, 1, DType::kF32);
    if (x != 10.0f) throw std::runtime_error("blocking allreduce among async ones: wrong sum");
    // Compute while the operations run.
    volatile double acc = 0;
    for (int i = 0; i < 200000; ++i) acc = acc + std::sqrt(static_cast<double>(i));
    // Complete them in reverse order.
    for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
    for (std::size_t k = 0; k < 4; ++k) {
      const auto want = expectedFor(c.algorithmFor(bufs[k].size()), in[k], counts[k], DType::kF32);
      if (!sameBytes(bufs[k], want, DType::kF32)) throw std::runtime_error("async allreduce wrong");
    }
    std::size_t off = 0;
    for (int i = 0; i < n; ++i) {
      const auto b = block(i, sizes[static_cast<std::size_t>(i)], 3);
      if (!std::equal(b.begin(), b.end(), gathered.begin() + static_cast<std::ptrdiff_t>(off)))
        throw std::runtime_error("async allgatherv wrong");
      off += b.size();
    }
    if (bc != block(2, 4096, 4)) throw std::runtime_error("async broadcast wrong");
    if (reqs[0].wire().sent_bytes == 0) throw std::runtime_error("no wire bytes reported");
  });
  const CommStats s = world.comms[0]->stats();
  EXPECT_EQ(s.kind(OpKind::kAllreduce).ops, 5u);
  EXPECT_EQ(s.kind(OpKind::kAllgather).ops, 1u);
  EXPECT_EQ(s.kind(OpKind::kBroadcast).ops, 1u);
  EXPECT_EQ(s.kind(OpKind::kBarrier).ops, 1u);
}

}  // namespace terse::comm::testing
