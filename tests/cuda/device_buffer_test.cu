// core/common/device_buffer.h: the RAII types own what they hold (moves leave the source empty, nothing is released
// twice), copies land where they should, streams get the priority asked for, and every failure is a DeviceError that
// names the CUDA call. The device tests skip on a machine without a GPU; the last test is its mirror image and runs
// only there, so the error path is exercised on every CI machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"

namespace terse::cuda {
namespace {

class DeviceBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceSummary summary = deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
  }
};

TEST_F(DeviceBufferTest, RoundTripFillAndBounds) {
  Stream stream;
  std::vector<uint32_t> host(1001);
  std::iota(host.begin(), host.end(), 7u);
  DeviceBuffer buffer(host.size() * sizeof(uint32_t), stream.get());
  EXPECT_EQ(buffer.size(), host.size() * sizeof(uint32_t));
  EXPECT_NE(buffer.data(), nullptr);
  buffer.copyFromHost(host.data(), buffer.size(), stream.get());
  std::vector<uint32_t> back(host.size());
  buffer.copyToHost(back.data(), buffer.size(), stream.get());
  stream.synchronize();
  EXPECT_EQ(back, host);

  buffer.fill(0xAB, stream.get());
  buffer.copyToHost(back.data(), buffer.size(), stream.get());
  stream.synchronize();
  for (uint32_t v : back) ASSERT_EQ(v, 0xABABABABu);

  EXPECT_THROW(buffer.copyFromHost(host.data(), buffer.size() + 1, stream.get()), InvalidArgument);
  EXPECT_THROW(buffer.copyToHost(back.data(), buffer.size() + 1, stream.get()), InvalidArgument);
}

TEST_F(DeviceBufferTest, MovesTransferOwnership) {
  Stream stream;
  DeviceBuffer a(256, stream.get());
  void* p = a.data();
  DeviceBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 256u);
  DeviceBuffer c(64, stream.get());
  c = std::move(b);  // frees c's old memory, takes b's
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);
  c.release();
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.data(), nullptr);
  DeviceBuffer empty(0, stream.get());
  EXPECT_EQ(empty.data(), nullptr);
  stream.synchronize();

  Stream s1;
  cudaStream_t raw = s1.get();
  Stream s2(std::move(s1));
  EXPECT_EQ(s1.get(), nullptr);
  EXPECT_EQ(s2.get(), raw);

  PinnedBuffer pinned(128);
  ASSERT_NE(pinned.data(), nullptr);
  PinnedBuffer moved(std::move(pinned));
  EXPECT_EQ(pinned.data(), nullptr);
  EXPECT_EQ(moved.size(), 128u);
}

TEST_F(DeviceBufferTest, StreamsGetTheRequestedPriority) {
  int least = 0, greatest = 0;
  TERSE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const Stream high(Stream::Priority::kHigh);
  const Stream low(Stream::Priority::kLow);
  EXPECT_EQ(high.cudaPriority(), greatest);
  EXPECT_EQ(low.cudaPriority(), least);
  EXPECT_EQ(high.priority(), Stream::Priority::kHigh);
  unsigned flags = 0;
  TERSE_CUDA_CHECK(cudaStreamGetFlags(high.get(), &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
}

TEST_F(DeviceBufferTest, EventsOrderStreamsAndTime) {
  Stream producer, consumer;
  DeviceBuffer buffer(1 << 20, producer.get());
  Event start(Event::Timing::kEnabled), stop(Event::Timing::kEnabled), ready;
  start.record(producer.get());
  buffer.fill(0x11, producer.get());
  stop.record(producer.get());
  ready.record(producer.get());
  ready.waitOn(consumer.get());  // the consumer's copy runs after the fill
  std::vector<unsigned char> back(buffer.size());
  buffer.copyToHost(back.data(), back.size(), consumer.get());
  consumer.synchronize();
  for (unsigned char v : back) ASSERT_EQ(v, 0x11);
  stop.synchronize();
  EXPECT_GE(stop.millisecondsSince(start), 0.0f);
  // Timing needs both events made with timing: a disabled one is a DeviceError naming the call.
  EXPECT_THROW(ready.millisecondsSince(start), DeviceError);
}

TEST_F(DeviceBufferTest, GuardRestoresTheDeviceAndNamesFailures) {
  int before = -1;
  TERSE_CUDA_CHECK(cudaGetDevice(&before));
  {
    const DeviceGuard guard(before);
    int now = -1;
    TERSE_CUDA_CHECK(cudaGetDevice(&now));
    EXPECT_EQ(now, before);
  }
  try {
    const DeviceGuard guard(1 << 20);
    FAIL() << "a guard on device 2^20 was made";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice(device) failed: cudaErrorInvalidDevice"), std::string::npos)
        << e.what();
  }
  int after = -1;
  TERSE_CUDA_CHECK(cudaGetDevice(&after));
  EXPECT_EQ(after, before);
}

// Runs only where there is no device (the CPU-only CI machines): allocating is then a DeviceError naming the call and
// the runtime's reason, never a crash or a null buffer.
TEST(DeviceBufferWithoutDevice, FailuresNameTheCall) {
  const DeviceSummary summary = deviceSummary();
  if (summary.count > 0) GTEST_SKIP() << "a CUDA device is present (" << summary.first_name << ")";
  try {
    const DeviceBuffer buffer(1024, nullptr);
    FAIL() << "allocated device memory without a device";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMallocAsync(&data_, bytes_, stream_) failed: cuda"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Stream stream, DeviceError);
}

}  // namespace
}  // namespace terse::cuda
