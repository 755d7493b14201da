// The NCCL communicator (core/comm/nccl_communicator.h) on device buffers. At world size 1 every collective must give
// back its input (allreduce of f32/f16/bf16 at sizes 0, 1, 7 and 2^20+3, allgatherv with an empty block, broadcast,
// the payload path keeping its prefix), the byte accounting must say nothing moved, misuse is a clear error before
// anything is queued, and abort() fails every later and pending call with CommError. With two or more GPUs, two
// forked processes meet through a TcpStoreServer and check sums, gathers and the ring-model accounting against values
// computed locally. Without a device everything skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/comm/nccl_communicator.h"
#include "core/comm/transport.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"
#include "terse/sdk/half.hpp"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

// Element i of rank r as dtype's bytes: small integers, exact in every dtype and in any sum of a few ranks.
std::vector<std::byte> input(int r, std::size_t count, DType dtype) {
  std::vector<std::byte> out(count * dtypeSize(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const float v = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 15) - 7);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? sdk::floatToHalf(v) : sdk::floatToBf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// A device copy of host bytes, and back.
struct Dev {
  std::unique_ptr<cuda::DeviceBuffer> buf;
  explicit Dev(const std::vector<std::byte>& host) {
    buf = std::make_unique<cuda::DeviceBuffer>(host.size(), nullptr);
    if (!host.empty()) buf->copyFromHost(host.data(), host.size(), nullptr);
    TERSE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  std::byte* data() const { return buf->as<std::byte>(); }
  std::span<std::byte> span() const { return {data(), buf->size()}; }
  std::vector<std::byte> host() const {
    std::vector<std::byte> out(buf->size());
    if (!out.empty()) buf->copyToHost(out.data(), out.size(), nullptr);
    TERSE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return out;
  }
};

class NcclSingle : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceSummary summary = cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
    NcclOptions o;
    o.store_prefix = "single/";
    comm_ = connectNcclCommunicator(o, store_);
  }
  MemoryStore store_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclSingle, AllreduceGivesBackItsInput) {
  EXPECT_EQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->size(), 1);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_TRUE(comm_->supportsSum(dtype));
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, (std::size_t{1} << 20) + 3}) {
      const auto want = input(0, count, dtype);
      Dev d(want);
      const WireBytes w = comm_->allreduce(d.data(), count, dtype);
      EXPECT_EQ(w, WireBytes{}) << "a world of one moves nothing";
      EXPECT_EQ(d.host(), want) << dtypeName(dtype) << " x " << count;
      Dev e(want);
      CommRequest req = comm_->iallreduce(e.data(), count, dtype, ReduceOp::kSum, 9);
      req.wait();
      EXPECT_TRUE(req.test());
      EXPECT_EQ(e.host(), want) << "iallreduce " << dtypeName(dtype) << " x " << count;
    }
  }
  EXPECT_EQ(comm_->stats().kind(OpKind::kAllreduce).ops, 24u);
  EXPECT_EQ(comm_->traffic().sent.kind(OpKind::kAllreduce).bytes, 0u);
  EXPECT_FALSE(comm_->supportsSum(DType::kI32));
  Dev i32(std::vector<std::byte>(16));
  EXPECT_THROW(comm_->allreduce(i32.data(), 4, DType::kI32), Unsupported);
  EXPECT_THROW(comm_->allreduce(nullptr, 4, DType::kF32), InvalidArgument);
}

TEST_F(NcclSingle, PayloadKeepsItsPrefix) {
  auto bytes = input(0, 64, DType::kF16);
  for (std::size_t i = 0; i < 6; ++i) bytes[i] = static_cast<std::byte>(0xa0 + i);  // a 6-byte header
  bytes.resize(6 + 2 * 29);
  Dev d(bytes);
  comm_->allreducePayload(d.span(), 6, DType::kF16, 3);
  EXPECT_EQ(d.host(), bytes);
  comm_->iallreducePayload(d.span(), 6, DType::kF16, 3).wait();
  EXPECT_EQ(d.host(), bytes);
  EXPECT_THROW(comm_->allreducePayload(d.span(), 7, DType::kF16), InvalidArgument);  // 57 bytes: not whole f16s
  EXPECT_THROW(comm_->allreducePayload(d.span(), d.span().size() + 1, DType::kF16), InvalidArgument);
  EXPECT_THROW(comm_->allreducePayload(d.span(), 6, DType::kU8), Unsupported);
}

TEST_F(NcclSingle, AllgathervBroadcastSizesAndBarrier) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{13}, (std::size_t{1} << 20) + 3}) {
    std::vector<std::byte> mine(bytes);
    for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<std::byte>(i * 5 + 1);
    Dev send(mine), recv(std::vector<std::byte>(bytes, std::byte{0x55}));
    const std::vector<uint64_t> sizes{bytes};
    EXPECT_EQ(comm_->allgatherv(send.span(), recv.span(), sizes), WireBytes{});
    EXPECT_EQ(recv.host(), mine);
    Dev recv2{std::vector<std::byte>(bytes)};
    comm_->iallgatherv(send.span(), recv2.span(), sizes).wait();
    EXPECT_EQ(recv2.host(), mine);
    Dev b(mine);
    comm_->broadcast(b.span(), 0);
    comm_->ibroadcast(b.span(), 0).wait();
    EXPECT_EQ(b.host(), mine);
  }
  Dev send(std::vector<std::byte>(4)), recv(std::vector<std::byte>(8));
  const std::vector<uint64_t> wrong{4};
  EXPECT_THROW(comm_->allgatherv(send.span(), recv.span(), wrong), InvalidArgument);  // recv larger than the blocks
  EXPECT_THROW(comm_->broadcast(send.span(), 1), InvalidArgument);
  std::vector<uint64_t> all(1);
  comm_->allgatherSizes(0x1234567890abcdefull, all);
  EXPECT_EQ(all[0], 0x1234567890abcdefull);
  comm_->barrier();
  comm_->ibarrier().wait();
  EXPECT_EQ(comm_->stats().kind(OpKind::kBarrier).ops, 2u);
}

TEST_F(NcclSingle, AbortFailsPendingAndLaterCalls) {
  const auto big = input(0, std::size_t{1} << 22, DType::kF32);
  Dev d(big);
  CommRequest pending = comm_->iallreduce(d.data(), big.size() / 4, DType::kF32);
  comm_->abort("test abort");
  comm_->abort("a second reason is ignored");
  EXPECT_TRUE(comm_->aborted());
  auto expectAborted = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << " did not throw after abort";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << what << ": " << e.what();
    }
  };
  expectAborted([&] { pending.wait(); }, "the pending iallreduce");
  expectAborted([&] { comm_->allreduce(d.data(), 1, DType::kF32); }, "allreduce");
  expectAborted([&] { comm_->iallreduce(d.data(), 1, DType::kF32); }, "iallreduce");
  expectAborted([&] { comm_->barrier(); }, "barrier");
  expectAborted([&] { comm_->broadcast(d.span(), 0); }, "broadcast");
  std::vector<uint64_t> all(1);
  expectAborted([&] { comm_->allgatherSizes(1, all); }, "allgatherSizes");
}

// ---- Two processes, one GPU each.

// How many devices a fresh process sees. Asked in a child: CUDA initialized in this process would not survive the
// fork of the ranks below (ctest runs each test in its own process, so this one has not touched CUDA).
int deviceCountInChild() {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const int count = cuda::deviceSummary().count;
    (void)!write(fds[1], &count, sizeof count);
    _exit(0);
  }
  close(fds[1]);
  int count = 0;
  if (read(fds[0], &count, sizeof count) != static_cast<ssize_t>(sizeof count)) count = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return count;
}

TEST(NcclProcesses, TwoRanksSumGatherAndCountTheRing) {
  const int devices = deviceCountInChild();
  if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << devices;
  const int n = 2;
  const JobToken token = JobToken::generate();
  const auto results = testing::forkRanks(
      n, token,
      [&](int r, Store& store, std::string& out) {
        NcclOptions o;
        o.rank = r;
        o.world_size = n;
        o.local_rank = r;
        o.local_world_size = n;
        o.store_prefix = "two/";
        o.timeout = std::chrono::seconds(60);
        auto comm = connectNcclCommunicator(o, store);
        for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
          for (std::size_t count : {std::size_t{0}, std::size_t{7}, (std::size_t{1} << 20) + 3}) {
            Dev d(input(r, count, dtype));
            const WireBytes w = comm->allreduce(d.data(), count, dtype);
            const uint64_t bytes = count * dtypeSize(dtype);
            if (w.sent_bytes != bytes || w.received_bytes != bytes)  // 2(n-1)/n x bytes at n = 2
              throw std::runtime_error("allreduce accounting: " + std::to_string(w.sent_bytes));
            const auto got = d.host();
            for (std::size_t i = 0; i < count; ++i) {
              const float want =
                  static_cast<float>(static_cast<int>((i * 7) % 15) - 7 + static_cast<int>((i * 7 + 3) % 15) - 7);
              float v = 0;
              if (dtype == DType::kF32) {
                std::memcpy(&v, got.data() + 4 * i, 4);
              } else {
                uint16_t h;
                std::memcpy(&h, got.data() + 2 * i, 2);
                v = dtype == DType::kF16 ? sdk::halfToFloat(h) : sdk::bf16ToFloat(h);
              }
              if (v != want) throw std::runtime_error("allreduce element " + std::to_string(i) + " wrong");
            }
          }
        }
        // Variable sizes, one empty block: learned with allgatherSizes, then gathered.
        const uint64_t mine_bytes = r == 0 ? 0 : 100003;
        std::vector<uint64_t> sizes(n);
        comm->allgatherSizes(mine_bytes, sizes);
        if (sizes != std::vector<uint64_t>{0, 100003}) throw std::runtime_error("allgatherSizes wrong");
        Dev send(std::vector<std::byte>(mine_bytes, static_cast<std::byte>(r + 1)));
        Dev recv(std::vector<std::byte>(100003));
        const WireBytes g = comm->allgatherv(send.span(), recv.span(), sizes);
        // Ring model: rank r sends every block but its successor's, receives every block but its own.
        const uint64_t want_sent = r == 0 ? 0 : 100003, want_received = r == 0 ? 100003 : 0;
        if (g.sent_bytes != want_sent || g.received_bytes != want_received)
          throw std::runtime_error("allgatherv accounting " + std::to_string(g.sent_bytes));
        for (std::byte b : recv.host())
          if (b != std::byte{2}) throw std::runtime_error("allgatherv data wrong");
        Dev b(std::vector<std::byte>(4099, static_cast<std::byte>(r == 1 ? 0x7e : 0)));
        comm->ibroadcast(b.span(), 1).wait();
        for (std::byte x : b.host())
          if (x != std::byte{0x7e}) throw std::runtime_error("broadcast data wrong");
        comm->barrier();
        out = "ok " + std::to_string(comm->traffic().sent.kind(OpKind::kAllreduce).bytes);
      },
      std::chrono::seconds(120));
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(results[static_cast<std::size_t>(r)].exited_ok())
        << "rank " << r << ": " << results[static_cast<std::size_t>(r)].text;
}

}  // namespace
}  // namespace terse::comm
