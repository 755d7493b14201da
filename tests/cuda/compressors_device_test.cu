// The built-in compressors on CUDA tensors against the same plugins on host tensors (DESIGN.md section 5, issue 9):
// for the same input, seed, step and tensor the device payload is the host payload byte for byte, and decompressing
// it on the device (written, and accumulated onto an output that already holds values) gives the host's floats bit
// for bit; the deferred decompress too, without waiting on its stream. No tolerance is needed for any of them: the
// kernels call the host's TERSE_HD functions, draw the host's Philox numbers and sum in the host's order (see each
// compressor's .cu file). Untrusted payloads: corrupted bytes get the host's verdict and message on the device, and a
// refused payload leaves the output untouched. signSGD (CUSTOM aggregation) also reduces on the device. PowerSGD is the
// one exception to "bit for bit": its GEMMs run on cuBLAS in f32, so its tests (at the end) hold the device to the
// tolerance derived in powersgd.cc's header.
//
// Skips with the reason on a machine without a GPU (CI compiles it there).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compressors/dgc/dgc_math.h"
#include "compressors/dgc/dgc_select.h"
#include "compressors/powersgd/powersgd_cuda.h"
#include "compressors/signsgd/signsgd_math.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "terse/kit/one_block.hpp"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

using cuda::DeviceBuffer;
using cuda::Stream;

struct Case {
  std::string plugin;
  Instance::ParamList params;
  std::string label;
  bool fixed_size = true;  // false: the payload's size depends on the data (threshold)
};

std::vector<Case> cases() {
  return {
      {"none", {}, "none"},
      {"fp16", {}, "fp16"},
      {"bf16", {}, "bf16"},
      {"qsgd", {}, "qsgd"},
      // 5-bit codes straddle words, levels 15 < 2^4 - 1 needs the code scan, buckets of 100 straddle groups.
      {"qsgd", {{"levels", "13"}, {"bucket_size", "100"}}, "qsgd_levels13_bucket100"},
      // rounding_bits 16 and 8: one Philox block serves 8 (16) elements, one thread each (pack_kernels.cuh).
      {"qsgd", {{"rounding_bits", "16"}}, "qsgd_rounding16"},
      {"qsgd", {{"rounding_bits", "8"}}, "qsgd_rounding8"},
      {"qsgd", {{"levels", "13"}, {"bucket_size", "100"}, {"rounding_bits", "8"}}, "qsgd_levels13_bucket100_rounding8"},
      {"qsgd",
       {{"levels", "1000"}, {"bucket_size", "100"}, {"rounding_bits", "16"}},
       "qsgd_levels1000_bucket100_rounding16"},
      {"terngrad", {}, "terngrad"},
      {"terngrad", {{"bucket_size", "0"}}, "terngrad_whole_tensor"},
      {"terngrad", {{"rounding_bits", "16"}}, "terngrad_rounding16"},
      {"terngrad", {{"rounding_bits", "8"}}, "terngrad_rounding8"},
      {"terngrad", {{"bucket_size", "100"}, {"rounding_bits", "8"}}, "terngrad_bucket100_rounding8"},
      // Exponent bytes and sign words; input()'s signed zeros keep their sign.
      {"natural", {}, "natural"},
      {"natural", {{"rounding_bits", "16"}}, "natural_rounding16"},
      {"natural", {{"rounding_bits", "8"}}, "natural_rounding8"},
      {"onebit", {}, "onebit"},
      {"onebit", {{"scale", "mean_abs"}, {"bucket_size", "1000"}}, "onebit_mean_abs_bucket1000"},
      {"topk", {}, "topk"},
      {"topk", {{"ratio", "0.1"}}, "topk_ratio0p1"},
      // input() holds about 2% signed zeros, so the cut falls among them: ties broken by index.
      {"topk", {{"ratio", "0.99"}}, "topk_ratio0p99_ties"},
      {"topk", {{"ratio", "1"}}, "topk_everything"},
      {"randomk", {}, "randomk"},
      {"randomk", {{"ratio", "0.3"}, {"unbiased", "true"}}, "randomk_ratio0p3_unbiased"},
      {"randomk", {{"ratio", "1"}}, "randomk_everything"},
      {"threshold", {{"tau", "0.5"}}, "threshold_tau0p5", false},
      {"threshold", {{"tau", "3"}}, "threshold_tau3", false},
      {"threshold", {{"tau", "1e30"}}, "threshold_nothing_passes", false},
      // dgc samples 2^20 + 3 (1% of it, 10486 keys); the smaller sizes are no larger than their 1024-key sample, so
      // their selection is the exact top-k from the start. DgcOnDevice covers the sampled paths in depth.
      {"dgc", {}, "dgc", false},
      {"dgc", {{"ratio", "0.1"}}, "dgc_ratio0p1", false},
      {"dgc", {{"ratio", "0.001"}, {"max_passes", "1"}}, "dgc_ratio0p001_one_pass", false},
      {"dgc", {{"ratio", "0.5"}, {"sample_ratio", "1"}}, "dgc_never_sampled", false},
      {"dgc", {{"ratio", "1"}}, "dgc_everything", false},
      // DGC's warm-up: the cases run at step 5, in the first of four stages over 100 steps (ratio 0.01^(1/5) = 0.398),
      // and in the third of four over 8 steps (0.01^(3/5) = 0.063): a device path that took another stage's k fails.
      {"dgc", {{"ratio", "0.01"}, {"warmup_steps", "100"}}, "dgc_warmup_first_stage", false},
      {"dgc", {{"ratio", "0.01"}, {"warmup_steps", "8"}}, "dgc_warmup_third_stage", false},
  };
}

const uint64_t kSizes[] = {0, 1, 7, 1000, (uint64_t{1} << 20) + 3};

// Gaussian values with the awkward ones mixed in: signed zeros, values that are subnormal in f16, tiny and huge.
std::vector<float> input(uint64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  for (size_t i = 0; i < v.size(); i += 97) v[i] = -0.0f;
  for (size_t i = 1; i < v.size(); i += 89) v[i] = 0.0f;
  for (size_t i = 2; i < v.size(); i += 83) v[i] *= 1e-6f;
  for (size_t i = 3; i < v.size(); i += 1009) v[i] *= 1e4f;
  return v;
}

terse_tensor_info_v1 onDevice(terse_tensor_info_v1 info, int device) {
  info.device = TERSE_DEVICE_CUDA;
  info.device_index = device;
  return info;
}

// Drives one instance on device memory, on one stream.
class DeviceCalls {
 public:
  DeviceCalls(Instance& c, Stream& stream) : c_(c), stream_(stream) {}

  // compress on the device; returns the payload bytes copied back, ADD_FAILUREs on a non-OK status. A fixed-size
  // compressor must report its max_output_bytes.
  Bytes compress(const terse_tensor_info_v1& info, const std::vector<float>& x, DeviceBuffer* payload,
                 bool fixed_size = true) {
    const terse_compressor_sizes_v1 sizes = c_.sizes(info);
    DeviceBuffer in(x.size() * sizeof(float), stream_.get());
    in.copyFromHost(x.data(), in.size(), stream_.get());
    *payload = DeviceBuffer(sizes.max_output_bytes, stream_.get());
    payload->fill(0xCD, stream_.get());  // garbage, so a skipped byte shows
    DeviceBuffer workspace(sizes.workspace_bytes, stream_.get());
    terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
    uint64_t written = ~uint64_t{0};
    const terse_status_v1 status = c_.api().compress(c_.ctx(), &info, in.data(), nullptr, 0, &scratch, payload->data(),
                                                     payload->size(), &written, stream_.handle());
    stream_.synchronize();
    if (status != TERSE_OK) {
      ADD_FAILURE() << "device compress returned " << status << ": " << c_.lastError();
      return {};
    }
    if (fixed_size) EXPECT_EQ(written, sizes.max_output_bytes);
    if (written > sizes.max_output_bytes) {
      ADD_FAILURE() << "device compress wrote " << written << " bytes, max_output_bytes is " << sizes.max_output_bytes;
      return {};
    }
    Bytes out(static_cast<size_t>(written));
    payload->copyToHost(out.data(), out.size(), stream_.get());
    workspace_head_.assign(std::min<size_t>(workspace.size(), kWorkspaceHead), std::byte{0});
    if (!workspace_head_.empty()) workspace.copyToHost(workspace_head_.data(), workspace_head_.size(), stream_.get());
    stream_.synchronize();
    return out;
  }

  // decompress `payload` (host bytes, copied to the device) onto `out`, which holds the starting values and receives
  // the result.
  terse_status_v1 decompress(const terse_tensor_info_v1& info, const Bytes& payload, std::vector<float>& out,
                             bool accumulate) {
    const terse_compressor_sizes_v1 sizes = c_.sizes(info);
    DeviceBuffer p(payload.size(), stream_.get());
    p.copyFromHost(payload.data(), payload.size(), stream_.get());
    DeviceBuffer o(out.size() * sizeof(float), stream_.get());
    o.copyFromHost(out.data(), o.size(), stream_.get());
    DeviceBuffer workspace(sizes.workspace_bytes, stream_.get());
    terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
    const terse_status_v1 status = c_.api().decompress(c_.ctx(), &info, p.data(), p.size(), &scratch, o.data(),
                                                       accumulate ? 1 : 0, stream_.handle());
    o.copyToHost(out.data(), o.size(), stream_.get());
    stream_.synchronize();
    return status;
  }

  // reduce two payloads (host bytes, copied to the device); `out` receives the reduced payload.
  terse_status_v1 reduce(const terse_tensor_info_v1& info, const Bytes& a, const Bytes& b, Bytes* out) {
    const terse_compressor_sizes_v1 sizes = c_.sizes(info);
    DeviceBuffer da(a.size(), stream_.get()), db(b.size(), stream_.get());
    da.copyFromHost(a.data(), a.size(), stream_.get());
    db.copyFromHost(b.data(), b.size(), stream_.get());
    DeviceBuffer o(sizes.max_reduced_bytes, stream_.get());
    o.fill(0xCD, stream_.get());
    DeviceBuffer workspace(sizes.workspace_bytes, stream_.get());
    terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
    uint64_t written = ~uint64_t{0};
    const terse_status_v1 status = c_.api().reduce(c_.ctx(), &info, da.data(), da.size(), db.data(), db.size(),
                                                   &scratch, o.data(), o.size(), &written, stream_.handle());
    stream_.synchronize();
    if (status == TERSE_OK) {
      out->resize(static_cast<size_t>(written));
      o.copyToHost(out->data(), out->size(), stream_.get());
      stream_.synchronize();
    }
    return status;
  }

  // The first bytes of the last compress's workspace, where a selection keeps its State (TopKOnDevice reads it).
  const std::vector<std::byte>& workspaceHead() const { return workspace_head_; }

 private:
  static constexpr size_t kWorkspaceHead = 16;
  Instance& c_;
  Stream& stream_;
  std::vector<std::byte> workspace_head_;
};

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceSummary summary = cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
    TERSE_CUDA_CHECK(cudaGetDevice(&device_));
  }
  int device_ = 0;
};

// compress of x on the host and on the device (`device`): the payloads must agree byte for byte; the host's is left in
// *want. A size mismatch is fatal, as for the byte comparison it guards: call it under ASSERT_NO_FATAL_FAILURE.
void expectPayloadIsTheHosts(Instance& c, DeviceCalls& dev, const terse_tensor_info_v1& info, int device,
                             const std::vector<float>& x, bool fixed_size, Bytes* want) {
  *want = c.compress(info, x);
  DeviceBuffer payload;
  const Bytes got = dev.compress(onDevice(info, device), x, &payload, fixed_size);
  ASSERT_EQ(got.size(), want->size());
  EXPECT_EQ(0, std::memcmp(got.data(), want->data(), want->size())) << "device payload differs from the host's";
}

// decompress of `payload` accumulated onto a copy of `out` on the host and on the device: the outputs must agree bit
// for bit. Call it under ASSERT_NO_FATAL_FAILURE (a refused decompress is fatal).
void expectAccumulatedDecodeIsTheHosts(Instance& c, DeviceCalls& dev, const terse_tensor_info_v1& info, int device,
                                       const Bytes& payload, const std::vector<float>& out) {
  std::vector<float> host_out = out, dev_out = out;
  ASSERT_EQ(c.decompress(info, payload, host_out, true), TERSE_OK) << c.lastError();
  ASSERT_EQ(dev.decompress(onDevice(info, device), payload, dev_out, true), TERSE_OK) << c.lastError();
  EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
}

class CompressorsOnDevice : public DeviceTest, public ::testing::WithParamInterface<Case> {};

TEST_P(CompressorsOnDevice, AdvertiseCuda) {
  Plugin plugin(GetParam().plugin);
  Instance c(plugin, GetParam().params);
  ASSERT_TRUE(c.ok()) << c.lastError();
  EXPECT_EQ(c.caps().devices, static_cast<terse_device_v1>(TERSE_DEVICE_HOST | TERSE_DEVICE_CUDA));
}

TEST_P(CompressorsOnDevice, PayloadAndDecodeEqualTheHostBitForBit) {
  Plugin plugin(GetParam().plugin);
  Instance c(plugin, GetParam().params);
  ASSERT_TRUE(c.ok()) << c.lastError();
  // One stream of each priority: the results must not depend on which one a chunk is scheduled on.
  Stream high(Stream::Priority::kHigh), low(Stream::Priority::kLow);
  for (uint64_t n : kSizes) {
    SCOPED_TRACE("numel " + std::to_string(n));
    Stream& stream = n % 2 ? high : low;
    DeviceCalls dev(c, stream);
    const terse_tensor_info_v1 host_info = tensorInfo(n, {.rank = 1, .world_size = 3, .step = 5, .seed = 99});
    const terse_tensor_info_v1 dev_info = onDevice(host_info, device_);
    const std::vector<float> x = input(n, static_cast<uint32_t>(n) + 1);

    Bytes want;
    ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(c, dev, host_info, device_, x, GetParam().fixed_size, &want));

    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "write");
      std::vector<float> host_out = input(n, 7), dev_out = host_out;
      ASSERT_EQ(c.decompress(host_info, want, host_out, accumulate), TERSE_OK) << c.lastError();
      ASSERT_EQ(dev.decompress(dev_info, want, dev_out, accumulate), TERSE_OK) << c.lastError();
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)))
          << "device decode differs from the host's";
    }
  }
}

// The host's verdict on a payload, decoded (accumulated) onto `out`: its status and message, the instance's log cleared
// before and after, so that the device call that follows is judged by its own message.
struct HostVerdict {
  terse_status_v1 status;
  std::string error;
};
HostVerdict hostVerdict(Instance& c, const terse_tensor_info_v1& info, const Bytes& payload, std::vector<float>& out,
                        Scratch* scratch = nullptr) {
  c.host().clear();
  HostVerdict v{c.decompress(info, payload, out, true, scratch), c.lastError()};
  c.host().clear();
  return v;
}

// Corruptions of a valid payload: one byte of every section kind (header, parameters, first scale, the middle, the
// last: padding bits for the bit-packed payloads), then a truncated and an overlong payload.
std::vector<std::pair<std::string, Bytes>> corruptionsOf(const Bytes& good) {
  std::vector<std::pair<std::string, Bytes>> bad;
  for (size_t at : {size_t{0}, size_t{8}, size_t{20}, size_t{32}, good.size() / 2, good.size() - 1}) {
    if (at >= good.size()) continue;
    Bytes b = good;
    b[at] ^= std::byte{0x01};
    bad.emplace_back("byte " + std::to_string(at) + " flipped", std::move(b));
  }
  Bytes shorter(good.begin(), good.end() - 1), longer = good;
  longer.push_back(std::byte{0});
  bad.emplace_back("truncated", std::move(shorter));
  bad.emplace_back("overlong", std::move(longer));
  return bad;
}

TEST_P(CompressorsOnDevice, CorruptPayloadsGetTheHostVerdict) {
  Plugin plugin(GetParam().plugin);
  Instance c(plugin, GetParam().params);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  // 70,001: past the sparsifiers' one-block cut (terse/kit/one_block.hpp), so their grid-wide decodes refuse too.
  for (uint64_t n : {uint64_t{0}, uint64_t{1000}, uint64_t{70001}}) {
    const terse_tensor_info_v1 host_info = tensorInfo(n);
    const terse_tensor_info_v1 dev_info = onDevice(host_info, device_);
    const Bytes good = c.compress(host_info, input(n, 3));
    ASSERT_FALSE(good.empty());
    for (const auto& [what, payload] : corruptionsOf(good)) {
      SCOPED_TRACE("numel " + std::to_string(n) + ", " + what);
      const std::vector<float> base = input(n, 11);
      std::vector<float> host_out = base, dev_out = base;
      const auto [host_status, host_error] = hostVerdict(c, host_info, payload, host_out);
      const terse_status_v1 dev_status = dev.decompress(dev_info, payload, dev_out, true);
      EXPECT_EQ(dev_status, host_status) << "host: " << host_error << "\ndevice: " << c.lastError();
      if (host_status == TERSE_OK) {
        EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
      } else {
        EXPECT_EQ(c.lastError(), host_error);
        EXPECT_EQ(0, std::memcmp(dev_out.data(), base.data(), base.size() * sizeof(float)))
            << "a refused payload changed the output";
      }
    }
  }
}

// Stalls a stream until the host sets *flag (mapped host memory), for at most max_cycles of the SM's clock: a call
// queued behind it that synchronizes the stream waits for the cap, one that does not returns with the stream busy.
__global__ void stallUntilReleased(const volatile uint32_t* flag, long long max_cycles) {
  const long long start = clock64();
  while (*flag == 0 && clock64() - start < max_cycles) {
  }
}

// stallUntilReleased around one call: stall(stream) queues it (about 2 s at most), released() checks that the stream is
// still busy -- the call queued work without waiting for it -- and lets the kernel go. The first launch of a kernel may
// load its module (lazy loading, CUDA 12.2's default), which can synchronize the context: warm the call's kernels up
// unstalled first.
class Staller {
 public:
  Staller() {
    TERSE_CUDA_CHECK(cudaHostAlloc(&flag_, sizeof(uint32_t), cudaHostAllocMapped));
    TERSE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev_), flag_, 0));
  }
  ~Staller() { cudaFreeHost(flag_); }
  Staller(const Staller&) = delete;
  Staller& operator=(const Staller&) = delete;

  void stall(cudaStream_t stream) {
    *flag_ = 0;
    stallUntilReleased<<<1, 1, 0, stream>>>(flag_dev_, 4'000'000'000LL);
    TERSE_CUDA_CHECK(cudaGetLastError());
  }
  void released(cudaStream_t stream) {
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the deferred call waited on its stream";
    *flag_ = 1;
  }

 private:
  uint32_t* flag_ = nullptr;
  uint32_t* flag_dev_ = nullptr;
};

// The deferred decompress (terse/device_verdict_v1.h) of `good`, a clean payload of `c` for `host_info`, and of each
// payload in `bad`, on `device`: the plugin exports it and defers, so a payload of the right size is checked on the
// device with nothing waited for (the stream is still busy behind a stalled kernel when the call returns). The clean
// payload decodes as the host's, written and accumulated, the word left at zero; a bad one is refused either at once,
// with the host's status and message (a size the host path refuses), or in the word, and either way the output is as
// it was. (One the host accepts must decode as the host's.)
void expectDeferredVerdictsAsTheHost(Plugin& plugin, Instance& c, int device, const terse_tensor_info_v1& host_info,
                                     const Bytes& good, const std::vector<std::pair<std::string, Bytes>>& bad) {
  const terse_decompress_deferred_fn_v1 deferred = plugin.deferred();
  ASSERT_NE(deferred, nullptr) << plugin.path() << " does not export "
                               << TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL;
  Stream stream;
  Staller staller;
  DeviceBuffer word(sizeof(uint32_t), stream.get());
  // One deferred call on the device: returns its status; *raised and `out` after the stream ran it.
  const auto call = [&](const terse_tensor_info_v1& info, const Bytes& payload, std::vector<float>& out,
                        bool accumulate, bool stall, uint32_t* raised) {
    const terse_compressor_sizes_v1 sizes = c.sizes(info);
    DeviceBuffer p(payload.size(), stream.get()), o(out.size() * sizeof(float), stream.get());
    p.copyFromHost(payload.data(), payload.size(), stream.get());
    o.copyFromHost(out.data(), o.size(), stream.get());
    DeviceBuffer workspace(sizes.workspace_bytes, stream.get());
    terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
    word.fill(0, stream.get());
    if (stall) staller.stall(stream.get());
    const terse_status_v1 status = deferred(c.ctx(), &info, p.data(), p.size(), &scratch, o.data(), accumulate ? 1 : 0,
                                            static_cast<uint32_t*>(word.data()), stream.handle());
    if (stall) staller.released(stream.get());
    o.copyToHost(out.data(), o.size(), stream.get());
    word.copyToHost(raised, sizeof(uint32_t), stream.get());
    stream.synchronize();
    return status;
  };
  const terse_tensor_info_v1 dev_info = onDevice(host_info, device);
  const uint64_t n = host_info.numel;
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "clean payload, accumulate" : "clean payload, write");
    std::vector<float> host_out = input(n, 7), dev_out = host_out;
    ASSERT_EQ(c.decompress(host_info, good, host_out, accumulate), TERSE_OK) << c.lastError();
    uint32_t raised = 99;
    // Unstalled first (Staller says why).
    std::vector<float> warm = dev_out;
    ASSERT_EQ(call(dev_info, good, warm, accumulate, false, &raised), TERSE_OK) << c.lastError();
    ASSERT_EQ(call(dev_info, good, dev_out, accumulate, true, &raised), TERSE_OK) << c.lastError();
    EXPECT_EQ(raised, 0u);
    EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
  }
  for (const auto& [what, payload] : bad) {
    SCOPED_TRACE(what);
    const std::vector<float> base = input(n, 11);
    std::vector<float> host_out = base, dev_out = base;
    const auto [host_status, host_error] = hostVerdict(c, host_info, payload, host_out);
    uint32_t raised = 99;
    const terse_status_v1 dev_status = call(dev_info, payload, dev_out, true, false, &raised);
    if (host_status == TERSE_OK) {
      EXPECT_EQ(dev_status, TERSE_OK) << c.lastError();
      EXPECT_EQ(raised, 0u);
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
      continue;
    }
    if (dev_status == TERSE_OK) {
      EXPECT_NE(raised, 0u) << "a payload the host refuses passed the deferred check";
    } else {
      EXPECT_EQ(dev_status, host_status);
      EXPECT_EQ(c.lastError(), host_error);
    }
    EXPECT_EQ(0, std::memcmp(dev_out.data(), base.data(), base.size() * sizeof(float)))
        << "a refused payload changed the output";
  }
}

// expectDeferredVerdictsAsTheHost for every built-in in `cases()` and its corrupted payloads, at sizes on both sides
// of the sparsifiers' one-block cut, and the empty tensor.
TEST_P(CompressorsOnDevice, DeferredVerdictsWaitForNothingAndRefuseAsTheHost) {
  Plugin plugin(GetParam().plugin);
  Instance c(plugin, GetParam().params);
  ASSERT_TRUE(c.ok()) << c.lastError();
  for (uint64_t n : {uint64_t{0}, uint64_t{1000}, uint64_t{70001}}) {
    SCOPED_TRACE("numel " + std::to_string(n));
    const terse_tensor_info_v1 info = tensorInfo(n);
    const Bytes good = c.compress(info, input(n, 3));
    ASSERT_FALSE(good.empty());
    ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, info, good, corruptionsOf(good)));
  }
}

// signSGD with majority vote: raw payloads, reductions (raw + raw, reduced + raw) and both kinds of decode, over three
// ranks, the device against the host byte for byte.
class SignSgdOnDevice : public DeviceTest {};

TEST_F(SignSgdOnDevice, PayloadsReductionsAndDecodesEqualTheHost) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  EXPECT_EQ(c.caps().devices, static_cast<terse_device_v1>(TERSE_DEVICE_HOST | TERSE_DEVICE_CUDA));
  Stream stream;
  DeviceCalls dev(c, stream);
  constexpr int kWorld = 3;
  for (uint64_t n : kSizes) {
    SCOPED_TRACE("numel " + std::to_string(n));
    std::vector<Bytes> raw;
    for (int r = 0; r < kWorld; ++r) {
      const terse_tensor_info_v1 info = tensorInfo(n, {.rank = r, .world_size = kWorld});
      const std::vector<float> x = input(n, static_cast<uint32_t>(n * 3 + r));
      raw.push_back(c.compress(info, x));
      DeviceBuffer payload;
      const Bytes got = dev.compress(onDevice(info, device_), x, &payload);
      ASSERT_EQ(got.size(), raw.back().size());
      EXPECT_EQ(0, std::memcmp(got.data(), raw.back().data(), got.size())) << "rank " << r;
    }
    const terse_tensor_info_v1 agg = aggregateInfo(tensorInfo(n, {.world_size = kWorld}));
    const Bytes two = c.reduce(agg, raw[0], raw[1]);
    const Bytes all = c.reduce(agg, two, raw[2]);
    Bytes dev_two, dev_all;
    ASSERT_EQ(dev.reduce(onDevice(agg, device_), raw[0], raw[1], &dev_two), TERSE_OK) << c.lastError();
    ASSERT_EQ(dev.reduce(onDevice(agg, device_), two, raw[2], &dev_all), TERSE_OK) << c.lastError();
    EXPECT_EQ(dev_two, two);
    EXPECT_EQ(dev_all, all);

    for (bool accumulate : {false, true}) {
      std::vector<float> host_out = input(n, 5), dev_out = host_out;
      ASSERT_EQ(c.decompress(agg, all, host_out, accumulate), TERSE_OK) << c.lastError();
      ASSERT_EQ(dev.decompress(onDevice(agg, device_), all, dev_out, accumulate), TERSE_OK) << c.lastError();
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float))) << "aggregate";
      const terse_tensor_info_v1 own = tensorInfo(n, {.rank = 1, .world_size = kWorld});
      host_out = input(n, 6), dev_out = host_out;
      ASSERT_EQ(c.decompress(own, raw[1], host_out, accumulate), TERSE_OK) << c.lastError();
      ASSERT_EQ(dev.decompress(onDevice(own, device_), raw[1], dev_out, accumulate), TERSE_OK) << c.lastError();
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float))) << "rank 1";
    }

    // The host's verdicts on what does not fit: a raw payload as the aggregate of 3, a partial aggregate, and an
    // aggregate that would count more voters than there are ranks.
    std::vector<float> host_out(static_cast<size_t>(n)), dev_out(static_cast<size_t>(n));
    for (const Bytes* bad : std::initializer_list<const Bytes*>{&raw[0], &two}) {
      c.host().clear();
      const terse_status_v1 host_status = c.decompress(agg, *bad, host_out, true);
      const std::string host_error = c.lastError();
      EXPECT_EQ(dev.decompress(onDevice(agg, device_), *bad, dev_out, true), host_status);
      EXPECT_EQ(c.lastError(), host_error);
    }
    Bytes out;
    c.host().clear();
    EXPECT_EQ(dev.reduce(onDevice(agg, device_), all, raw[0], &out), TERSE_ERR_INVALID_PAYLOAD);
    const std::string dev_error = c.lastError();
    EXPECT_EQ(c.tryReduce(agg, all, raw[0], &out), TERSE_ERR_INVALID_PAYLOAD);
    EXPECT_EQ(c.lastError(), dev_error);
  }
}

// `p` with the 32-bit word at byte `offset` (a signsgd prefix field) set to `value`.
Bytes withWord(Bytes p, std::size_t offset, uint32_t value) {
  std::memcpy(p.data() + offset, &value, sizeof value);
  return p;
}

// signsgd's device reduce reads its inputs' kinds and voters from their prefixes on the device: every pair the host
// reduce accepts gives the host's bytes, and every pair it refuses is refused with the host's status and message.
// World sizes 1, 2 and 3 (1-byte counts), 200 (2-byte) and 40,000 (4-byte); sizes 0 and 7, where a raw and a reduced
// payload have the same size at 1-byte counts so only the prefix tells them apart, and two larger ones. The pairs:
// raw + raw, reduced + raw in both orders, too many voters, each input's corruptions, and its prefix fields rewritten
// (kind 0 and 3, a count width the kind does not have, a reduced input of one voter or of more than world_size, a raw
// input relabelled reduced and a reduced one relabelled raw).
TEST_F(SignSgdOnDevice, ReduceReadsKindsOnTheDeviceAndRefusesAsTheHost) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  constexpr std::size_t kKind = 16, kVoters = 20, kCountBytes = 24;
  for (int world : {1, 2, 3, 200, 40000}) {
    for (uint64_t n : {uint64_t{0}, uint64_t{7}, uint64_t{1000}, uint64_t{70001}}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", numel " + std::to_string(n));
      std::vector<Bytes> raw;
      for (int r = 0; r < std::min(world, 3); ++r) {
        raw.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = world}), input(n, static_cast<uint32_t>(r))));
      }
      const terse_tensor_info_v1 agg = aggregateInfo(tensorInfo(n, {.world_size = world}));
      const Bytes& last = raw.back();
      std::vector<std::tuple<std::string, Bytes, Bytes>> pairs = {{"raw + raw", raw[0], last}};
      const auto edits = [&](const std::string& what, const Bytes& p, const Bytes& other, bool first) {
        const auto add = [&](const std::string& how, const Bytes& edited) {
          pairs.emplace_back(what + " " + how, first ? edited : other, first ? other : edited);
        };
        for (const auto& [how, bad] : corruptionsOf(p)) add(how, bad);
        for (uint32_t kind : {0u, 3u}) add("of kind " + std::to_string(kind), withWord(p, kKind, kind));
        for (uint32_t width : {0u, 1u, 2u, 4u}) {
          add("of count width " + std::to_string(width), withWord(p, kCountBytes, width));
        }
        add("of 1 voter", withWord(p, kVoters, 1));
        add("of world_size + 1 voters", withWord(p, kVoters, static_cast<uint32_t>(world) + 1));
      };
      edits("raw", last, raw[0], false);
      // A raw payload relabelled reduced (two voters, the aggregate's width): at sizes where both kinds are the same
      // length its sections are read as counts.
      pairs.emplace_back("raw relabelled reduced + raw",
                         withWord(withWord(withWord(raw[0], kKind, 2), kVoters, 2), kCountBytes,
                                  terse::compressors::signsgd::countBytes(world)),
                         last);
      if (world >= 2) {
        const Bytes two = c.reduce(agg, raw[0], raw[1]);
        pairs.emplace_back("reduced + raw", two, last);
        pairs.emplace_back("raw + reduced", last, two);
        pairs.emplace_back("reduced + reduced", two, two);
        edits("reduced", two, last, true);
        pairs.emplace_back("reduced relabelled raw + raw",
                           withWord(withWord(withWord(two, kKind, 1), kVoters, 1), kCountBytes, 0), last);
      }
      for (const auto& [what, a, b] : pairs) {
        SCOPED_TRACE(what);
        Bytes host_out, dev_out;
        c.host().clear();
        const terse_status_v1 host_status = c.tryReduce(agg, a, b, &host_out);
        const std::string host_error = c.lastError();
        c.host().clear();
        const terse_status_v1 dev_status = dev.reduce(onDevice(agg, device_), a, b, &dev_out);
        EXPECT_EQ(dev_status, host_status) << "host: " << host_error << "\ndevice: " << c.lastError();
        if (host_status == TERSE_OK) {
          EXPECT_EQ(dev_out, host_out);
        } else {
          EXPECT_EQ(c.lastError(), host_error);
        }
      }
    }
  }
}

// The device cannot refuse a NaN at compress without waiting for it, so it marks the payload (its kind word 0); every
// decode refuses it, the deferred one in its word.
TEST_F(SignSgdOnDevice, NanGradientsPoisonThePayload) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  const terse_tensor_info_v1 info = tensorInfo(1000);
  std::vector<float> x = input(1000, 1);
  x[777] = std::numeric_limits<float>::quiet_NaN();
  Bytes host_payload;
  EXPECT_EQ(c.tryCompress(info, x, &host_payload), TERSE_ERR_INVALID_ARGUMENT);
  DeviceBuffer payload;
  const Bytes poisoned = dev.compress(onDevice(info, device_), x, &payload);
  ASSERT_FALSE(poisoned.empty());
  std::vector<float> out(1000, 1.0f);
  EXPECT_EQ(dev.decompress(onDevice(info, device_), poisoned, out, true), TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_NE(c.lastError().find("holds a NaN"), std::string::npos) << c.lastError();
  EXPECT_EQ(c.decompress(info, poisoned, out, true), TERSE_ERR_INVALID_PAYLOAD);
  for (float v : out) ASSERT_EQ(v, 1.0f);
  // The deferred decompress raises its word for it instead, the output as it was.
  x[777] = 0.5f;
  const Bytes good = c.compress(info, x);
  ASSERT_EQ(poisoned.size(), good.size());
  ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, info, good,
                                                          {{"a NaN gradient's poisoned payload", poisoned}}));
}

// signsgd's decompress knows from the call which payload it takes (one rank's raw payload, or the reduced aggregate of
// all voters), so it defers its whole check, prefix included: expectDeferredVerdictsAsTheHost for a rank's raw
// payload, the aggregate of three ranks and a raw payload as the aggregate of one, with their corruptions, the other
// kind in their place (a raw payload as the aggregate of three, a reduced one as a rank's) and a partial aggregate
// (a reduced payload of the aggregate's size with two voters, refused on the device). The poisoned payload of a NaN
// gradient: NanGradientsPoisonThePayload.
TEST_F(SignSgdOnDevice, DeferredVerdictsWaitForNothingAndRefuseAsTheHost) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  constexpr int kWorld = 3;
  for (uint64_t n : {uint64_t{0}, uint64_t{1000}, uint64_t{70001}}) {
    SCOPED_TRACE("numel " + std::to_string(n));
    std::vector<Bytes> raw;
    for (int r = 0; r < kWorld; ++r) {
      raw.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = kWorld}), input(n, static_cast<uint32_t>(r))));
    }
    const terse_tensor_info_v1 own = tensorInfo(n, {.rank = 1, .world_size = kWorld});
    const terse_tensor_info_v1 agg = aggregateInfo(tensorInfo(n, {.world_size = kWorld}));
    const Bytes two = c.reduce(agg, raw[0], raw[1]);
    const Bytes all = c.reduce(agg, two, raw[2]);
    ASSERT_EQ(two.size(), all.size());
    auto bad = corruptionsOf(raw[1]);
    bad.emplace_back("the aggregate in place of a rank's payload", all);
    {
      SCOPED_TRACE("rank 1's raw payload");
      ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, own, raw[1], bad));
    }
    bad = corruptionsOf(all);
    bad.emplace_back("a rank's payload in place of the aggregate", raw[0]);
    bad.emplace_back("a partial aggregate (two voters of three)", two);
    {
      SCOPED_TRACE("the aggregate of three");
      ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, agg, all, bad));
    }
    const terse_tensor_info_v1 alone = aggregateInfo(tensorInfo(n));
    const Bytes mine = c.compress(tensorInfo(n), input(n, 4));
    {
      SCOPED_TRACE("a raw payload as the aggregate of one");
      ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, alone, mine, corruptionsOf(mine)));
    }
  }
}

// topk on heavily tied data (a few distinct magnitudes, both signs), at ratios whose cut falls inside a crowded key,
// and at sizes around the compaction's 4096-element tiles: the device must break ties by index exactly as the host.
class TopKOnDevice : public DeviceTest {};

std::vector<float> tied(uint64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(d(g)) * 0.5f;
  return v;
}

TEST_F(TopKOnDevice, TiesGoToTheLowerIndexAsOnTheHost) {
  Plugin plugin("topk");
  Stream stream;
  for (const char* ratio : {"0.01", "0.3", "0.5", "0.9"}) {
    Instance c(plugin, {{"ratio", ratio}});
    ASSERT_TRUE(c.ok()) << c.lastError();
    DeviceCalls dev(c, stream);
    for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{4095}, uint64_t{4096}, uint64_t{4097}, uint64_t{3 * 4096 + 5},
                       (uint64_t{1} << 20) + 3}) {
      SCOPED_TRACE(std::string("ratio ") + ratio + ", numel " + std::to_string(n));
      const terse_tensor_info_v1 info = tensorInfo(n);
      const std::vector<float> x = tied(n, static_cast<uint32_t>(n));
      Bytes want;
      ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(c, dev, info, device_, x, true, &want));
      ASSERT_NO_FATAL_FAILURE(expectAccumulatedDecodeIsTheHosts(c, dev, info, device_, want, tied(n, 1)));
    }
  }
}

// Sets the sparsifiers' one-block cut (terse/kit/one_block.hpp's kOneBlockEnv) for the instances made in its scope;
// whatever the variable held before is put back after.
class OneBlockCut {
 public:
  explicit OneBlockCut(const char* value) {
    if (const char* before = std::getenv(terse::kit::kOneBlockEnv)) before_ = before;
    EXPECT_EQ(setenv(terse::kit::kOneBlockEnv, value, 1), 0);
  }
  ~OneBlockCut() {
    if (before_) {
      setenv(terse::kit::kOneBlockEnv, before_->c_str(), 1);
    } else {
      unsetenv(terse::kit::kOneBlockEnv);
    }
  }
  OneBlockCut(const OneBlockCut&) = delete;
  OneBlockCut& operator=(const OneBlockCut&) = delete;

 private:
  std::optional<std::string> before_;  // the run's own value, put back afterwards
};

// An instance made while the one-block cut is `cut` (it reads the cut once, when it is made).
std::unique_ptr<Instance> instanceWithCut(const Plugin& plugin, const Instance::ParamList& params, const char* cut) {
  const OneBlockCut scoped(cut);
  return std::make_unique<Instance>(plugin, params);
}

// x through a one-block instance and a grid-wide one (cut 0) of the same plugin: both payloads must be the host's byte
// for byte, and the decodes of the host's payload, accumulated on both and written on the one-block one, the host's
// bit for bit. Call it under ASSERT_NO_FATAL_FAILURE.
void expectBothWaysAreTheHosts(Instance& one_block, DeviceCalls& dev_one, Instance& grid, DeviceCalls& dev_grid,
                               const terse_tensor_info_v1& info, int device, const std::vector<float>& x,
                               bool fixed_size) {
  Bytes want, again;
  ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(one_block, dev_one, info, device, x, fixed_size, &want));
  ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(grid, dev_grid, info, device, x, fixed_size, &again));
  const std::vector<float> base = input(info.numel, 21);
  ASSERT_NO_FATAL_FAILURE(expectAccumulatedDecodeIsTheHosts(one_block, dev_one, info, device, want, base));
  ASSERT_NO_FATAL_FAILURE(expectAccumulatedDecodeIsTheHosts(grid, dev_grid, info, device, want, base));
  std::vector<float> host_out = base, dev_out = base;
  ASSERT_EQ(one_block.decompress(info, want, host_out, false), TERSE_OK) << one_block.lastError();
  ASSERT_EQ(dev_one.decompress(onDevice(info, device), want, dev_out, false), TERSE_OK) << one_block.lastError();
  EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)))
      << "the written decode differs from the host's";
}

// Both ways of the device selection (terse/kit/topk_candidates.cuh's selectTopK), each the host's payload byte for
// byte: normal data at 1% finishes on the candidates (the keys at or above the top digit's boundary bin, about 1.2% of
// n); heavily tied data at 1% on the tensor, since its boundary bin (|g| = 1.5) holds about 2/7 of the elements, more
// than the candidate buffer (2k + n/64 + 4096). Small tensors fit the buffer whatever their data. The way taken is the
// mode word of the kit's State at the start of the workspace ({prefix u32, mode u32, greater u64}; 1 = candidates).
// The small tensors would be selected in one block by default, so this instance is made with the one-block cut at 0.
TEST_F(TopKOnDevice, BothWaysOfTheSelectionEqualTheHost) {
  Plugin plugin("topk");
  const std::unique_ptr<Instance> made = instanceWithCut(plugin, {{"ratio", "0.01"}}, "0");
  Instance& c = *made;
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  struct Way {
    bool ties;
    uint64_t n;
    uint32_t mode;
  };
  for (const Way& w : {Way{false, (uint64_t{1} << 20) + 3, 1}, Way{true, (uint64_t{1} << 20) + 3, 0},
                       Way{true, 4097, 1}, Way{false, 3 * 4096 + 5, 1}}) {
    SCOPED_TRACE(std::string(w.ties ? "tied" : "normal") + ", numel " + std::to_string(w.n));
    const terse_tensor_info_v1 info = tensorInfo(w.n);
    const std::vector<float> x = w.ties ? tied(w.n, 11) : input(w.n, 11);
    Bytes want;
    ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(c, dev, info, device_, x, true, &want));
    ASSERT_EQ(dev.workspaceHead().size(), 16u);
    uint32_t mode = ~0u;
    std::memcpy(&mode, dev.workspaceHead().data() + 4, sizeof mode);
    EXPECT_EQ(mode, w.mode) << "the selection took the other way (1 = candidates, 0 = tensor)";
  }
}

// Small tensors are selected and decoded by one block in one launch (terse/kit/topk_one_block.cuh), with no workspace,
// up to the cut (topk_cuda.h: 2^16 elements); the grid-wide selection must give the same payload at the same sizes
// (an instance made with the cut at 0), and both the host's, byte for byte, on normal and on heavily tied data, at
// sizes around the one-block kernel's 4096-element compaction tiles and its warps, and at the cut and one past it.
// Both decodes, written and accumulated, must be the host's bit for bit.
TEST_F(TopKOnDevice, OneBlockAndGridSelectionsGiveTheHostsPayloadAndDecode) {
  Plugin plugin("topk");
  Stream stream;
  const uint64_t cut = terse::kit::kOneBlockMaxNumel;
  for (const char* ratio : {"0.001", "0.01", "0.3", "0.9"}) {
    Instance one_block(plugin, {{"ratio", ratio}});
    const std::unique_ptr<Instance> made = instanceWithCut(plugin, {{"ratio", ratio}}, "0");
    Instance& grid = *made;
    ASSERT_TRUE(one_block.ok()) << one_block.lastError();
    ASSERT_TRUE(grid.ok()) << grid.lastError();
    DeviceCalls dev_one(one_block, stream), dev_grid(grid, stream);
    for (uint64_t n : {uint64_t{2}, uint64_t{31}, uint64_t{1023}, uint64_t{1025}, uint64_t{4096}, uint64_t{4097},
                       uint64_t{3 * 4096 + 5}, uint64_t{20000}, cut, cut + 1}) {
      for (bool ties : {false, true}) {
        SCOPED_TRACE(std::string("ratio ") + ratio + ", numel " + std::to_string(n) + (ties ? ", tied" : ", normal"));
        const terse_tensor_info_v1 info = tensorInfo(n);
        const uint64_t k = terse::kit::topk::targetCount(std::stod(ratio), n);
        const terse_compressor_sizes_v1 one_sizes = one_block.sizes(onDevice(info, device_));
        if (n <= cut) {
          EXPECT_EQ(one_sizes.workspace_bytes, 0u) << "a one-block selection needs no workspace";
        } else if (k < n) {
          EXPECT_GT(one_sizes.workspace_bytes, 0u) << "past the cut the grid-wide selection runs";
        }
        if (k < n) EXPECT_GT(grid.sizes(onDevice(info, device_)).workspace_bytes, 0u);
        const std::vector<float> x = ties ? tied(n, static_cast<uint32_t>(n) + 5) : input(n, static_cast<uint32_t>(n));
        ASSERT_NO_FATAL_FAILURE(expectBothWaysAreTheHosts(one_block, dev_one, grid, dev_grid, info, device_, x, true));
      }
    }
  }
}

// The one-block decode validates before it writes: a payload it refuses leaves the output as it was, with the host's
// status and message, for every kind of fault a sparse payload can have (CorruptPayloadsGetTheHostVerdict flips bytes;
// these are the faults a flipped byte rarely makes: indices out of order, repeated, out of range, a non-finite value).
TEST_F(TopKOnDevice, TheOneBlockDecodeRefusesEveryFaultAsTheHost) {
  Plugin plugin("topk");
  Instance c(plugin, {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  const uint64_t n = 5000, k = 50;
  const terse_tensor_info_v1 info = tensorInfo(n);
  const Bytes good = c.compress(info, input(n, 4));
  ASSERT_EQ(good.size(), terse::kit::sparse::payloadBytes(k));
  const size_t values = terse::kit::sparse::kFixedBytes, indices = values + 4 * k;
  const auto withIndex = [&](uint64_t j, uint32_t index) {
    Bytes b = good;
    std::memcpy(b.data() + indices + 4 * j, &index, 4);
    return b;
  };
  uint32_t second = 0;
  std::memcpy(&second, good.data() + indices + 4, 4);
  Bytes nan_value = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_value.data() + values + 4 * (k - 1), &nan, 4);
  for (const auto& [what, payload] :
       std::vector<std::pair<std::string, Bytes>>{{"index past numel", withIndex(k - 1, static_cast<uint32_t>(n))},
                                                  {"indices out of order", withIndex(0, second + 1)},
                                                  {"an index repeated", withIndex(0, second)},
                                                  {"a NaN value", nan_value}}) {
    SCOPED_TRACE(what);
    for (bool accumulate : {false, true}) {
      const std::vector<float> base = input(n, 8);
      std::vector<float> host_out = base, dev_out = base;
      c.host().clear();
      ASSERT_EQ(c.decompress(info, payload, host_out, accumulate), TERSE_ERR_INVALID_PAYLOAD);
      const std::string host_error = c.lastError();
      c.host().clear();
      EXPECT_EQ(dev.decompress(onDevice(info, device_), payload, dev_out, accumulate), TERSE_ERR_INVALID_PAYLOAD);
      EXPECT_EQ(c.lastError(), host_error);
      EXPECT_EQ(0, std::memcmp(dev_out.data(), base.data(), base.size() * sizeof(float)))
          << "a refused payload changed the output";
    }
  }
}

// dgc and threshold on both sides of the one-block cut (terse/kit/one_block.hpp), each against an instance made with
// the cut at 0: every decode of a small tensor is one block's, and dgc's exact selection from the start (a tensor no
// larger than its 1,024-key sample, or everything sent) too, with no workspace. Payloads byte for byte and decodes bit
// for bit, the host's either way; a sampled dgc tensor keeps its grid-wide plan.
class SparseOneBlockOnDevice : public DeviceTest {};

TEST_F(SparseOneBlockOnDevice, DgcAndThresholdGiveTheHostsPayloadAndDecodeEitherWay) {
  struct Way {
    const char* plugin;
    Instance::ParamList params;
  };
  for (const Way& w : {Way{"dgc", {}}, Way{"dgc", {{"ratio", "1"}}}, Way{"dgc", {{"ratio", "0.3"}}},
                       Way{"threshold", {{"tau", "0.5"}}}, Way{"threshold", {{"tau", "3"}}}}) {
    Plugin plugin(w.plugin);
    Instance one_block(plugin, w.params);
    const std::unique_ptr<Instance> made = instanceWithCut(plugin, w.params, "0");
    Instance& grid = *made;
    ASSERT_TRUE(one_block.ok()) << one_block.lastError();
    ASSERT_TRUE(grid.ok()) << grid.lastError();
    Stream stream;
    DeviceCalls dev_one(one_block, stream), dev_grid(grid, stream);
    for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{1024}, uint64_t{4097}, uint64_t{20000}}) {
      SCOPED_TRACE(std::string(w.plugin) + (w.params.empty() ? "" : " " + w.params[0].second) + ", numel " +
                   std::to_string(n));
      const terse_tensor_info_v1 info = tensorInfo(n, {.step = 2, .seed = 5});
      const bool everything = !w.params.empty() && w.params[0].second == "1";
      if (std::string(w.plugin) == "dgc" && (n <= 1024 || everything)) {
        EXPECT_EQ(one_block.sizes(onDevice(info, device_)).workspace_bytes, 0u) << "an exact selection in one block";
      }
      const std::vector<float> x = input(n, static_cast<uint32_t>(n) + 3);
      ASSERT_NO_FATAL_FAILURE(expectBothWaysAreTheHosts(one_block, dev_one, grid, dev_grid, info, device_, x, false));
    }
  }
}

// The cut comes from the environment, so a value that is not a count of elements refuses the instance by name,
// before any tensor. The plugin reads it only when built with CUDA; this needs no device.
TEST(OneBlockCutTest, ABadValueRefusesTheInstanceNamingIt) {
  Plugin plugin("topk");
  for (const char* bad : {"abc", "-1", "4294967296", " 5", "1e6", "99999999999"}) {
    SCOPED_TRACE(bad);
    const std::unique_ptr<Instance> made = instanceWithCut(plugin, {}, bad);
    EXPECT_EQ(made->initStatus(), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(made->lastError().find(std::string("TERSE_SPARSE_ONE_BLOCK_MAX='") + bad + "'"), std::string::npos)
        << made->lastError();
  }
  for (const char* good : {"", "0", "4294967295"}) {
    SCOPED_TRACE(std::string("'") + good + "'");
    const OneBlockCut cut(good);
    Instance c(plugin);
    EXPECT_TRUE(c.ok()) << c.lastError();
  }
}

// The device cannot refuse a non-finite gradient at compress without waiting for the selection; the non-finite value
// has the largest key, so it is selected and travels, and every decompress refuses the payload with the host's words.
TEST_F(TopKOnDevice, NonFiniteGradientsPoisonThePayload) {
  Plugin plugin("topk");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  // 1,000 elements take the one-block kernels, 70,001 the grid-wide ones (terse/kit/one_block.hpp). The poisoned
  // payload is refused also when it is marked as this rank's own (TERSE_CALL_OWN_PAYLOAD, error feedback's decode):
  // topk does not trust its own payloads, since that refusal is what keeps a failed step's residual untouched.
  for (uint64_t n : {uint64_t{1000}, uint64_t{70001}}) {
    const terse_tensor_info_v1 info = tensorInfo(n);
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
      for (bool own : {false, true}) {
        SCOPED_TRACE("numel " + std::to_string(n) + ", " + std::to_string(bad) + (own ? ", own payload" : ""));
        std::vector<float> x = input(n, 1);
        x[777] = bad;
        Bytes host_payload;
        EXPECT_EQ(c.tryCompress(info, x, &host_payload), TERSE_ERR_INVALID_ARGUMENT);
        DeviceBuffer payload;
        const Bytes poisoned = dev.compress(onDevice(info, device_), x, &payload);
        ASSERT_FALSE(poisoned.empty());
        terse_tensor_info_v1 dev_info = onDevice(info, device_);
        if (own) dev_info.reserved0 = TERSE_CALL_OWN_PAYLOAD;
        std::vector<float> out(n, 1.0f);
        c.host().clear();
        EXPECT_EQ(dev.decompress(dev_info, poisoned, out, !own), TERSE_ERR_INVALID_PAYLOAD);
        EXPECT_NE(c.lastError().find("is not finite"), std::string::npos) << c.lastError();
        for (float v : out) ASSERT_EQ(v, 1.0f);
      }
    }
  }
}

// natural on the device cannot refuse an input with no power of two at compress (inf, NaN, or a value past 2^127 that
// rounds up) without waiting for it, so its exponent byte 255 travels and every decompress refuses the payload with
// the host's words, the sender's own (error feedback's decode) included, the output as it was; the deferred
// decompress raises its word instead. Subnormal inputs round between 0 and 2^-126 as on the host. And payloads whose
// exponent byte is 255, or whose padding byte or sign bit is set, get the host's verdict.
class NaturalOnDevice : public DeviceTest {};

TEST_F(NaturalOnDevice, InputsWithNoPowerOfTwoPoisonThePayloadAndCorruptionsGetTheHostVerdict) {
  Plugin plugin("natural");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  const uint64_t n = 1001;  // 1001 exponent bytes padded to 1008, 16 sign words, the last with 23 padding bits
  const terse_tensor_info_v1 info = tensorInfo(n);
  std::vector<float> x = input(n, 1);
  for (uint64_t i = 0; i < n; i += 7) x[i] *= 1e-39f;  // subnormal
  DeviceBuffer payload;
  const Bytes good = dev.compress(onDevice(info, device_), x, &payload);
  ASSERT_TRUE(good == c.compress(info, x)) << "subnormals round on the device as on the host";
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::max()}) {
    for (bool own : {false, true}) {
      SCOPED_TRACE(std::to_string(bad) + (own ? ", own payload" : ""));
      std::vector<float> y = x;
      y[777] = bad;
      // FLT_MAX rounds up past 2^127 unless its draw is within 2^-23 of 1: at this seed and step it does.
      Bytes host_payload;
      ASSERT_EQ(c.tryCompress(info, y, &host_payload), TERSE_ERR_INVALID_ARGUMENT);
      DeviceBuffer poisoned_buffer;
      const Bytes poisoned = dev.compress(onDevice(info, device_), y, &poisoned_buffer);
      ASSERT_EQ(poisoned.size(), good.size());
      terse_tensor_info_v1 dev_info = onDevice(info, device_);
      if (own) dev_info.reserved0 = TERSE_CALL_OWN_PAYLOAD;
      std::vector<float> out(n, 1.0f);
      c.host().clear();
      EXPECT_EQ(dev.decompress(dev_info, poisoned, out, !own), TERSE_ERR_INVALID_PAYLOAD);
      EXPECT_NE(c.lastError().find("exponent 777 is 255"), std::string::npos) << c.lastError();
      EXPECT_EQ(c.decompress(info, poisoned, out, true), TERSE_ERR_INVALID_PAYLOAD);
      for (float v : out) ASSERT_EQ(v, 1.0f);
    }
  }
  std::vector<float> y = x;
  y[777] = std::numeric_limits<float>::infinity();
  DeviceBuffer poisoned_buffer;
  const Bytes poisoned = dev.compress(onDevice(info, device_), y, &poisoned_buffer);
  const uint64_t signs = 32 + 1008;
  ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(
      plugin, c, device_, info, good,
      {{"an infinite gradient's poisoned payload", poisoned},
       {"exponent 255", patched<uint8_t>(good, 32 + 5, 255)},
       {"a padding byte", patched<uint8_t>(good, 32 + 1004, 1)},
       {"a padding sign bit",
        patched<uint64_t>(good, signs + 15 * 8, readAt<uint64_t>(good, signs + 15 * 8) | (uint64_t{1} << 60))}}));
}

// This rank's own payload (TERSE_CALL_OWN_PAYLOAD: error feedback decoding what it sent) is decoded without a
// verdict by the plugins whose own payloads always validate (terse/kit/device.hpp's OwnPayload::kTrust: none, the
// casts, random-k, dgc and threshold), and validated as before by the others: either way the decode must be the host's,
// bit for bit, onto an output of NaN (every element written), on both sides of the sparsifiers' one-block cut.
class OwnPayloadOnDevice : public DeviceTest {};

TEST_F(OwnPayloadOnDevice, DecodesAsTheHostWithAndWithoutTrust) {
  struct Way {
    const char* plugin;
    Instance::ParamList params;
  };
  for (const Way& w : {Way{"none", {}}, Way{"fp16", {}}, Way{"bf16", {}}, Way{"randomk", {}}, Way{"dgc", {}},
                       Way{"threshold", {{"tau", "0.5"}}}, Way{"topk", {}}, Way{"qsgd", {}}, Way{"onebit", {}}}) {
    Plugin plugin(w.plugin);
    Instance c(plugin, w.params);
    ASSERT_TRUE(c.ok()) << c.lastError();
    Stream stream;
    DeviceCalls dev(c, stream);
    for (uint64_t n : {uint64_t{7}, uint64_t{1000}, uint64_t{70001}}) {
      SCOPED_TRACE(std::string(w.plugin) + ", numel " + std::to_string(n));
      const terse_tensor_info_v1 info = tensorInfo(n, {.rank = 1, .world_size = 2, .step = 3, .seed = 8});
      const Bytes payload = c.compress(info, input(n, static_cast<uint32_t>(n)));
      ASSERT_FALSE(payload.empty());
      std::vector<float> host_out(n, std::numeric_limits<float>::quiet_NaN()), dev_out = host_out;
      terse_tensor_info_v1 own = info;
      own.source_rank = info.rank;
      ASSERT_EQ(c.decompress(own, payload, host_out, false), TERSE_OK) << c.lastError();
      terse_tensor_info_v1 dev_own = onDevice(own, device_);
      dev_own.reserved0 = TERSE_CALL_OWN_PAYLOAD;
      ASSERT_EQ(dev.decompress(dev_own, payload, dev_out, false), TERSE_OK) << c.lastError();
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
    }
  }
}

// For the compressors that refuse a bad gradient at compress (they synchronize there anyway): x is refused on the host
// (`info`) and on the device (`dev_info`) with INVALID_ARGUMENT and the same message.
void expectCompressRefusedAsOnTheHost(Instance& c, Stream& stream, const terse_tensor_info_v1& info,
                                      const terse_tensor_info_v1& dev_info, const std::vector<float>& x) {
  Bytes host_payload;
  c.host().clear();
  EXPECT_EQ(c.tryCompress(info, x, &host_payload), TERSE_ERR_INVALID_ARGUMENT);
  const std::string host_error = c.lastError();
  const terse_compressor_sizes_v1 sizes = c.sizes(dev_info);
  DeviceBuffer in(x.size() * sizeof(float), stream.get());
  in.copyFromHost(x.data(), in.size(), stream.get());
  DeviceBuffer out(sizes.max_output_bytes, stream.get()), workspace(sizes.workspace_bytes, stream.get());
  terse_scratch_v1 scratch{workspace.data(), workspace.size(), nullptr, 0};
  uint64_t written = 0;
  c.host().clear();
  EXPECT_EQ(c.api().compress(c.ctx(), &dev_info, in.data(), nullptr, 0, &scratch, out.data(), out.size(), &written,
                             stream.handle()),
            TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c.lastError(), host_error);
  stream.synchronize();
}

// threshold on the device (DeviceTest skips without one before a test makes its stream).
class ThresholdOnDevice : public DeviceTest {};

// threshold: compress synchronizes to learn the count, so unlike the fixed-size compressors it refuses a non-finite
// gradient at compress, with the host's status and message.
TEST_F(ThresholdOnDevice, RefusesNonFiniteGradientsAsTheHost) {
  Plugin plugin("threshold");
  Instance c(plugin, {{"tau", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  const terse_tensor_info_v1 info = tensorInfo(1000);
  const terse_tensor_info_v1 dev_info = onDevice(info, device_);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = input(1000, 2);
    x[999] = bad;
    expectCompressRefusedAsOnTheHost(c, stream, info, dev_info, x);
  }
}

// threshold's decompress also checks that every value reaches tau (no honest sender sends less): a payload with one
// value just below tau, or just above -tau, is refused as on the host, by the one-block decode (1,000 elements) and
// the grid's (70,001), ordinary and deferred, the output left as it was. The corruptions the generic cases make
// (flipped bytes) almost never land a value just under tau, so nothing else reaches this check.
TEST_F(ThresholdOnDevice, AValueBelowTauIsRefusedAsOnTheHost) {
  Plugin plugin("threshold");
  Instance c(plugin, {{"tau", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  for (uint64_t n : {uint64_t{1000}, uint64_t{70001}}) {
    SCOPED_TRACE("numel " + std::to_string(n));
    const terse_tensor_info_v1 info = tensorInfo(n);
    const Bytes good = c.compress(info, input(n, 3));
    ASSERT_GT(good.size(), 24u + 8u) << "nothing passed tau";
    std::vector<std::pair<std::string, Bytes>> bad;
    bad.emplace_back("the first value just below tau", patched<float>(good, 24, std::nextafter(0.5f, 0.0f)));
    bad.emplace_back("the first value just above -tau", patched<float>(good, 24, std::nextafter(-0.5f, 0.0f)));
    for (const auto& [what, payload] : bad) {
      SCOPED_TRACE(what);
      std::vector<float> host_out = input(n, 11);
      const auto [status, error] = hostVerdict(c, info, payload, host_out);
      EXPECT_EQ(status, TERSE_ERR_INVALID_PAYLOAD) << "the host accepts it: the test's payload is wrong";
      EXPECT_NE(error.find("threshold"), std::string::npos) << error;
    }
    ASSERT_NO_FATAL_FAILURE(expectDeferredVerdictsAsTheHost(plugin, c, device_, info, good, bad));
    Stream stream;
    DeviceCalls dev(c, stream);
    for (const auto& [what, payload] : bad) {
      SCOPED_TRACE(std::string("ordinary, ") + what);
      std::vector<float> host_out = input(n, 11), dev_out = host_out;
      const auto [status, error] = hostVerdict(c, info, payload, host_out);
      c.host().clear();
      EXPECT_EQ(dev.decompress(onDevice(info, device_), payload, dev_out, true), status);
      EXPECT_EQ(c.lastError(), error);
      EXPECT_EQ(dev_out, input(n, 11)) << "a refused payload changed the output";
    }
  }
}

// threshold parks the indices past n values and then places them at 24 + 4c (threshold.cu) in one of three ways: no
// move when every element is sent, a copy when the two ranges do not overlap (2c <= n, touching at 2c == n), a second
// select otherwise. Each, at its edge, gives the host's payload byte for byte and the host's decode.
TEST_F(ThresholdOnDevice, EveryWayOfPlacingTheIndicesEqualsTheHost) {
  Plugin plugin("threshold");
  Instance c(plugin, {{"tau", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  struct Way {
    const char* what;
    uint64_t n;
    uint64_t every;  // element i is sent when i % every == 0 (1: all of them)
  };
  for (const Way& w : {Way{"all sent, no move", 1, 1}, Way{"all sent, no move", 1001, 1},
                       Way{"half sent, ranges touch, copy", 1000, 2}, Way{"half + 1 sent, second select", 1001, 2},
                       Way{"a third sent, copy", 4099, 3}}) {
    SCOPED_TRACE(std::string(w.what) + ", numel " + std::to_string(w.n));
    std::vector<float> x(static_cast<size_t>(w.n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % w.every == 0 ? 1.0f : 0.25f) * (i % 5 == 0 ? -1.0f : 1.0f);
    const terse_tensor_info_v1 info = tensorInfo(w.n);
    Bytes want;
    ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(c, dev, info, device_, x, false, &want));
    ASSERT_NO_FATAL_FAILURE(
        expectAccumulatedDecodeIsTheHosts(c, dev, info, device_, want, std::vector<float>(x.size(), 3.0f)));
  }
}

// dgc: the sampled thresholds, the refinement passes and the exact fallback, each on the device with the host's sample
// (Philox) and the host's decisions, so the payload is the host's byte for byte. The grid is chosen so that every path
// occurs (the host's own plan says which one each case takes, and the test checks that each was taken at least once):
// one pass, several passes, the exact fallback after max_passes misses; the one-pass compaction (every key equal to
// the threshold taken, or none) and the tiled one (some taken: the cut inside a crowded key of heavily tied data,
// ties to the lower index); sizes around the compaction's 4096-element tiles.
class DgcOnDevice : public DeviceTest {};

namespace dg = terse::compressors::dgc;
namespace sparse = terse::kit::sparse;
namespace tk = terse::kit::topk;

TEST_F(DgcOnDevice, SampledThresholdsAndTheExactFallbackEqualTheHost) {
  Plugin plugin("dgc");
  Stream stream;
  struct Config {
    const char* ratio;
    const char* sample_ratio;
    int max_passes;
  };
  int one_pass = 0, several = 0, fallback = 0, whole_ties = 0, split_ties = 0;
  for (const Config& cfg : {Config{"0.001", "0.01", 4}, Config{"0.001", "0.001", 1}, Config{"0.01", "0.001", 2},
                            Config{"0.1", "0.01", 4}}) {
    Instance c(
        plugin,
        {{"ratio", cfg.ratio}, {"sample_ratio", cfg.sample_ratio}, {"max_passes", std::to_string(cfg.max_passes)}});
    ASSERT_TRUE(c.ok()) << c.lastError();
    DeviceCalls dev(c, stream);
    const double ratio = std::stod(cfg.ratio), sample_ratio = std::stod(cfg.sample_ratio);
    for (bool ties : {false, true}) {
      for (uint64_t n : {uint64_t{4097}, uint64_t{3 * 4096 + 5}, uint64_t{300007}, (uint64_t{1} << 20) + 3}) {
        const std::vector<float> x = ties ? tied(n, static_cast<uint32_t>(n)) : input(n, static_cast<uint32_t>(n) + 1);
        for (uint64_t step = 0; step < 4; ++step) {
          SCOPED_TRACE(std::string("ratio ") + cfg.ratio + ", sample_ratio " + cfg.sample_ratio + ", max_passes " +
                       std::to_string(cfg.max_passes) + (ties ? ", tied" : ", smooth") + ", numel " +
                       std::to_string(n) + ", step " + std::to_string(step));
          const terse_tensor_info_v1 info = tensorInfo(n, {.step = step, .seed = 99});
          Bytes want;
          ASSERT_NO_FATAL_FAILURE(expectPayloadIsTheHosts(c, dev, info, device_, x, false, &want));
          ASSERT_NO_FATAL_FAILURE(expectAccumulatedDecodeIsTheHosts(c, dev, info, device_, want, input(n, 5)));

          // Which path the host took, from its own plan on the same sample.
          const uint64_t k = tk::targetCount(ratio, n);
          ASSERT_TRUE(dg::samples(sample_ratio, n));
          std::vector<uint32_t> sample(static_cast<size_t>(dg::sampleCount(sample_ratio, n)));
          std::vector<uint32_t> hist(tk::kHistogramBytes / sizeof(uint32_t));
          const dg::Plan p = dg::plan(x, k, sample_ratio, cfg.max_passes,
                                      sdk::PhiloxStream(info.seed, info.step, info.tensor_id), sample, hist.data());
          ASSERT_FALSE(p.nonfinite);
          if (p.exact) {
            ++fallback;
          } else {
            ++(p.passes == 1 ? one_pass : several);
            // Which compaction the device ran: one DeviceSelect when the count takes every key equal to the threshold
            // or none of them, the tiled one when it splits them (dgc.cu's write).
            uint64_t at_or_above = 0;
            for (float v : x) at_or_above += tk::magnitudeKey(v) >= p.cut.key ? 1 : 0;
            ++(p.count == p.cut.greater || p.count == at_or_above ? whole_ties : split_ties);
          }
        }
      }
    }
  }
  EXPECT_GT(one_pass, 0);
  EXPECT_GT(several, 0);
  EXPECT_GT(fallback, 0);
  EXPECT_GT(whole_ties, 0);
  EXPECT_GT(split_ties, 0);
}

// dgc synchronizes at compress (variable size), so it refuses a non-finite gradient there with the host's status and
// message, on every path: everything sent (numel 1), exact top-k from the start (1000), sampled (2^20 + 3).
TEST_F(DgcOnDevice, RefusesNonFiniteGradientsAsTheHost) {
  Plugin plugin("dgc");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  for (uint64_t n : {uint64_t{1}, uint64_t{1000}, (uint64_t{1} << 20) + 3}) {
    const terse_tensor_info_v1 info = tensorInfo(n);
    const terse_tensor_info_v1 dev_info = onDevice(info, device_);
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
      SCOPED_TRACE("numel " + std::to_string(n) + ", " + std::to_string(bad));
      std::vector<float> x = input(n, 2);
      x[n / 2] = bad;
      expectCompressRefusedAsOnTheHost(c, stream, info, dev_info, x);
    }
  }
}

// Payloads whose count the host refuses (outside the band [0.8k, 1.3k], or not matching the size), whose indices or
// values are bad: the device gives the host's status and message, and leaves the output untouched.
TEST_F(DgcOnDevice, CorruptCountsIndicesAndValuesGetTheHostVerdict) {
  Plugin plugin("dgc");
  Instance c(plugin, {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  const uint64_t n = 300007;
  const terse_tensor_info_v1 info = tensorInfo(n);
  const Bytes good = c.compress(info, input(n, 3));
  uint64_t count = 0;
  std::memcpy(&count, good.data() + sparse::kCountOffset, sizeof count);
  const uint64_t k = tk::targetCount(0.01, n);
  ASSERT_GE(count, dg::minCount(k));
  ASSERT_LE(count, dg::maxCount(k));
  // A payload of `c` entries: the good one's first entries, or zeros past its end, with the count field set to c.
  const auto withCount = [&](uint64_t c_new) {
    Bytes b(static_cast<size_t>(sparse::payloadBytes(c_new)), std::byte{0});
    std::memcpy(b.data(), good.data(), sparse::kCountOffset);
    std::memcpy(b.data() + sparse::kCountOffset, &c_new, sizeof c_new);
    const uint64_t keep = c_new < count ? c_new : count;
    std::memcpy(b.data() + sparse::kFixedBytes, good.data() + sparse::kFixedBytes, sizeof(float) * keep);
    std::memcpy(b.data() + sparse::kFixedBytes + sizeof(float) * c_new,
                good.data() + sparse::kFixedBytes + sizeof(float) * count, sizeof(uint32_t) * keep);
    return b;
  };
  const auto patchedAt = [&](uint64_t offset, uint32_t word) {
    Bytes b = good;
    std::memcpy(b.data() + offset, &word, sizeof word);
    return b;
  };
  const uint64_t indices = sparse::kFixedBytes + sizeof(float) * count;
  uint32_t first_index = 0;
  std::memcpy(&first_index, good.data() + indices, sizeof first_index);
  std::vector<std::pair<std::string, Bytes>> bad = {
      {"count below the band", withCount(dg::minCount(k) - 1)},
      {"count above the band", withCount(dg::maxCount(k) + 1)},
      {"truncated by one entry", Bytes(good.begin(), good.end() - 8)},
      {"count beyond numel", withCount(n + 1)},
      {"repeated index", patchedAt(indices + 4, first_index)},
      {"index out of range", patchedAt(indices + 4 * (count - 1), static_cast<uint32_t>(n))},
      {"NaN value", patchedAt(sparse::kFixedBytes + 4, 0x7fc00000u)},
  };
  {
    Bytes b = withCount(count - 1);  // the right size for count - 1 entries, but the count field says count
    std::memcpy(b.data() + sparse::kCountOffset, &count, sizeof count);
    bad.emplace_back("count disagreeing with the size", std::move(b));
  }
  for (const auto& [what, payload] : bad) {
    SCOPED_TRACE(what);
    const std::vector<float> base = input(n, 11);
    std::vector<float> host_out = base, dev_out = base;
    c.host().clear();
    const terse_status_v1 host_status = c.decompress(info, payload, host_out, true);
    const std::string host_error = c.lastError();
    EXPECT_EQ(host_status, TERSE_ERR_INVALID_PAYLOAD);
    c.host().clear();
    EXPECT_EQ(dev.decompress(onDevice(info, device_), payload, dev_out, true), host_status);
    EXPECT_EQ(c.lastError(), host_error);
    EXPECT_EQ(0, std::memcmp(dev_out.data(), base.data(), base.size() * sizeof(float)))
        << "a refused payload changed the output";
  }
}

INSTANTIATE_TEST_SUITE_P(Builtins, CompressorsOnDevice, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

// ---- powersgd: two SUM rounds, a warm-started Q in the state and P^ in the workspace, on device memory against the
// host plugin, over 1 and 3 simulated ranks (summed by hand, as the core would) and several steps. cuBLAS sums in f32
// where the host sums in double, so the device matches the host to the tolerance derived in powersgd.cc's header,
//   ||D_dev - D_host||_F <= 8 u K S ||M||_F   (u = 2^-24, K = max(n, m), S = steps since Q was drawn),
// not bit for bit; passthrough tensors (not matrices, too small to gain) travel exactly as on the host. Each chain
// keeps its own state, so a difference would carry over through the warm start and accumulate over the steps. The data
// are standard normal, whose P is well conditioned (kappa about 2), as the tolerance assumes: input()'s outliers (a
// few entries 10^4 times the rest) make P ill-conditioned, and the device's P^ then differs from the host's by more.

// N(0, 1) entries.
std::vector<float> psgdGaussian(uint64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

terse_tensor_info_v1 psgdMatrix(uint64_t n, uint64_t m, const InfoOptions& o = {}) {
  terse_tensor_info_v1 info = tensorInfo(n * m, o);
  info.ndim = 2;
  info.shape[0] = static_cast<int64_t>(n);
  info.shape[1] = static_cast<int64_t>(m);
  return info;
}

double psgdTolerance(const terse_tensor_info_v1& info, uint64_t steps) {
  const uint64_t n = info.ndim >= 2 ? static_cast<uint64_t>(info.shape[0]) : info.numel;
  const uint64_t m = n == 0 ? 0 : info.numel / n;
  return 8.0 * 0x1p-24 * static_cast<double>(std::max<uint64_t>({n, m, 1})) * static_cast<double>(steps);
}

double psgdNorm(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double psgdDistance(const float* a, const float* b, size_t count) {
  double s = 0;
  for (size_t i = 0; i < count; ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

std::vector<float> psgdFloats(const Bytes& b, size_t offset) {
  std::vector<float> v((b.size() - offset) / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data() + offset, 4 * v.size());
  return v;
}

// One rank of a device run: its gradient on the device and its per-tensor memory, kept across steps (the state
// zero-filled once, as the core does).
struct PsgdDeviceRank {
  DeviceBuffer grad, workspace, state;
};

// Raw calls with a rank's scratch and a prev (host bytes copied to the device); payloads come back as host bytes.
class PsgdDeviceCalls {
 public:
  PsgdDeviceCalls(Instance& c, Stream& stream) : c_(c), stream_(stream) {}

  PsgdDeviceRank rank(const terse_tensor_info_v1& info, const std::vector<float>& grad) {
    const terse_compressor_sizes_v1 s0 = c_.sizes(info);
    terse_tensor_info_v1 r1 = info;
    r1.round = 1;
    const terse_compressor_sizes_v1 s1 = c_.sizes(r1);
    PsgdDeviceRank r;
    r.grad = DeviceBuffer(grad.size() * sizeof(float), stream_.get());
    r.grad.copyFromHost(grad.data(), r.grad.size(), stream_.get());
    r.workspace = DeviceBuffer(std::max(s0.workspace_bytes, s1.workspace_bytes), stream_.get());
    r.workspace.fill(0xCD, stream_.get());  // undefined when a step starts: garbage, not zeros
    r.state = DeviceBuffer(std::max(s0.state_bytes, s1.state_bytes), stream_.get());
    r.state.fill(0, stream_.get());
    stream_.synchronize();
    return r;
  }

  terse_status_v1 compress(const terse_tensor_info_v1& info, PsgdDeviceRank& r, const Bytes& prev, Bytes* out) {
    return compressAs(nullptr, info, r, prev, out, nullptr, nullptr);
  }

  terse_status_v1 decompress(const terse_tensor_info_v1& info, PsgdDeviceRank& r, const Bytes& payload,
                             std::vector<float>& out, bool accumulate) {
    DeviceBuffer p(payload.size(), stream_.get());
    if (!payload.empty()) p.copyFromHost(payload.data(), payload.size(), stream_.get());
    DeviceBuffer o(out.size() * sizeof(float), stream_.get());
    if (!out.empty()) o.copyFromHost(out.data(), o.size(), stream_.get());
    terse_scratch_v1 scratch = scratchOf(r);
    const terse_status_v1 status = c_.api().decompress(c_.ctx(), &info, p.data(), p.size(), &scratch, o.data(),
                                                       accumulate ? 1 : 0, stream_.handle());
    if (!out.empty()) o.copyToHost(out.data(), o.size(), stream_.get());
    stream_.synchronize();
    return status;
  }

  // compress through the deferred entry point `deferred` (terse/device_verdict_v1.h) with a zeroed device word, as
  // compress above; *raised says whether the word came back raised. With a `staller`, the stream is stalled across the
  // call, which must not wait for it.
  terse_status_v1 compressDeferred(terse_compress_deferred_fn_v1 deferred, const terse_tensor_info_v1& info,
                                   PsgdDeviceRank& r, const Bytes& prev, Bytes* out, bool* raised,
                                   Staller* staller = nullptr) {
    return compressAs(deferred, info, r, prev, out, raised, staller);
  }

  // decompress through the deferred entry point `deferred` (terse/device_verdict_v1.h) with a zeroed device word;
  // *raised says whether the word came back raised.
  terse_status_v1 decompressDeferred(terse_decompress_deferred_fn_v1 deferred, const terse_tensor_info_v1& info,
                                     PsgdDeviceRank& r, const Bytes& payload, std::vector<float>& out, bool accumulate,
                                     bool* raised, Staller* staller = nullptr) {
    DeviceBuffer p(payload.size(), stream_.get());
    if (!payload.empty()) p.copyFromHost(payload.data(), payload.size(), stream_.get());
    DeviceBuffer o(out.size() * sizeof(float), stream_.get());
    if (!out.empty()) o.copyFromHost(out.data(), o.size(), stream_.get());
    DeviceBuffer word(sizeof(uint32_t), stream_.get());
    word.fill(0, stream_.get());
    terse_scratch_v1 scratch = scratchOf(r);
    if (staller != nullptr) staller->stall(stream_.get());
    const terse_status_v1 status = deferred(c_.ctx(), &info, p.data(), p.size(), &scratch, o.data(), accumulate ? 1 : 0,
                                            static_cast<uint32_t*>(word.data()), stream_.handle());
    if (staller != nullptr) staller->released(stream_.get());
    if (!out.empty()) o.copyToHost(out.data(), o.size(), stream_.get());
    uint32_t w = 0;
    word.copyToHost(&w, sizeof w, stream_.get());
    stream_.synchronize();
    *raised = w != 0;
    return status;
  }

  Bytes read(const DeviceBuffer& b, size_t bytes) {
    Bytes out(std::min(bytes, b.size()));
    if (!out.empty()) b.copyToHost(out.data(), out.size(), stream_.get());
    stream_.synchronize();
    return out;
  }

 private:
  // compress with a prev (host bytes copied to the device) into an output filled with 0xCD; the payload comes back as
  // host bytes. Through `deferred` when given, with a zeroed device word that *raised reports.
  terse_status_v1 compressAs(terse_compress_deferred_fn_v1 deferred, const terse_tensor_info_v1& info,
                             PsgdDeviceRank& r, const Bytes& prev, Bytes* out, bool* raised, Staller* staller) {
    const terse_compressor_sizes_v1 sizes = c_.sizes(info);
    DeviceBuffer p(prev.size(), stream_.get());
    if (!prev.empty()) p.copyFromHost(prev.data(), prev.size(), stream_.get());
    DeviceBuffer o(sizes.max_output_bytes, stream_.get());
    o.fill(0xCD, stream_.get());
    DeviceBuffer word(sizeof(uint32_t), stream_.get());
    word.fill(0, stream_.get());
    terse_scratch_v1 scratch = scratchOf(r);
    uint64_t written = ~uint64_t{0};
    if (staller != nullptr) staller->stall(stream_.get());
    const terse_status_v1 status =
        deferred != nullptr ? deferred(c_.ctx(), &info, r.grad.data(), p.data(), p.size(), &scratch, o.data(), o.size(),
                                       &written, static_cast<uint32_t*>(word.data()), stream_.handle())
                            : c_.api().compress(c_.ctx(), &info, r.grad.data(), p.data(), p.size(), &scratch, o.data(),
                                                o.size(), &written, stream_.handle());
    if (staller != nullptr) staller->released(stream_.get());
    uint32_t w = 0;
    word.copyToHost(&w, sizeof w, stream_.get());
    stream_.synchronize();
    if (raised != nullptr) *raised = w != 0;
    if (status == TERSE_OK) {
      EXPECT_EQ(written, sizes.max_output_bytes);
      out->resize(static_cast<size_t>(std::min<uint64_t>(written, o.size())));
      o.copyToHost(out->data(), out->size(), stream_.get());
      stream_.synchronize();
    }
    return status;
  }

  static terse_scratch_v1 scratchOf(PsgdDeviceRank& r) {
    return terse_scratch_v1{r.workspace.data(), r.workspace.size(), r.state.data(), r.state.size()};
  }

  Instance& c_;
  Stream& stream_;
};

struct PsgdCase {
  std::string label;
  terse_tensor_info_v1 info;  // rank 0, world 1, step 0, round 0
  std::string rank;           // the plugin's parameter
  bool compressed;
};

std::vector<PsgdCase> psgdCases() {
  std::vector<PsgdCase> out;
  for (const char* r : {"1", "2", "4"}) {
    out.push_back({std::string("33x31_rank") + r, psgdMatrix(33, 31), r, true});
    out.push_back({std::string("300x257_rank") + r, psgdMatrix(300, 257), r, true});
  }
  // A 4-d tensor is shape[0] rows of the rest.
  terse_tensor_info_v1 conv = tensorInfo(64 * 3 * 3 * 3);
  conv.ndim = 4;
  conv.shape[0] = 64, conv.shape[1] = 3, conv.shape[2] = 3, conv.shape[3] = 3;
  out.push_back({"conv64x3x3x3_rank4", conv, "4", true});
  // Taller than one block's slice of the orthogonalization (powersgd_cuda.h, kOrthoSliceRows): three slices.
  out.push_back({"70001x5_rank4", psgdMatrix(70001, 5), "4", true});
  // Passthrough: r (n + m) >= n m, empty, a vector, a flat tensor.
  out.push_back({"1x1_rank1", psgdMatrix(1, 1), "1", false});
  out.push_back({"8x8_rank4", psgdMatrix(8, 8), "4", false});
  out.push_back({"0x5_rank2", psgdMatrix(0, 5), "2", false});
  out.push_back({"vector101_rank2", tensorInfo(101), "2", false});
  terse_tensor_info_v1 flat = tensorInfo(77);
  flat.ndim = 0;
  flat.shape[0] = 0;
  out.push_back({"flat77_rank2", flat, "2", false});
  return out;
}

terse_tensor_info_v1 psgdAt(terse_tensor_info_v1 info, int rank, int world, uint64_t step, int round, int source_rank) {
  info.rank = rank;
  info.world_size = world;
  info.step = step;
  info.round = round;
  info.source_rank = source_rank;
  info.seed = 99;  // shared
  return info;
}

// One rank (world 1) at step 0 on both paths: the host's scratch (at round 1's sizes, the larger), the device's memory
// with the gradient, and the two rounds' tensor infos.
struct PsgdFirstStep {
  PsgdFirstStep(Instance& c, PsgdDeviceCalls& dev, const terse_tensor_info_v1& shape, const std::vector<float>& grad,
                int device_index)
      : host(c.sizes(psgdAt(shape, 0, 1, 0, 1, 0))),
        device(dev.rank(onDevice(shape, device_index), grad)),
        info0(psgdAt(shape, 0, 1, 0, 0, 0)),
        info1(psgdAt(shape, 0, 1, 0, 1, 0)) {}
  Scratch host;
  PsgdDeviceRank device;
  terse_tensor_info_v1 info0, info1;
};

class PowerSgdOnDevice : public DeviceTest {};

// One rank-4 instance and its device calls, for the cases about P^ at rank 4. Made in SetUp, after the device check:
// a stream cannot be made without a device.
class PowerSgdRank4OnDevice : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    plugin_.emplace("powersgd");
    stream_.emplace();
    c_.emplace(*plugin_, Instance::ParamList{{"rank", "4"}});
    ASSERT_TRUE(c_->ok()) << c_->lastError();
    dev_.emplace(*c_, *stream_);
  }
  std::optional<Plugin> plugin_;
  std::optional<Stream> stream_;
  std::optional<Instance> c_;
  std::optional<PsgdDeviceCalls> dev_;
};

TEST_F(PowerSgdOnDevice, MatchesTheHostWithinTheToleranceOverStepsAndRanks) {
  Plugin plugin("powersgd");
  Stream stream;
  constexpr uint64_t kSteps = 4;
  for (const PsgdCase& k : psgdCases()) {
    Instance c(plugin, {{"rank", k.rank}});
    ASSERT_TRUE(c.ok()) << c.lastError();
    EXPECT_EQ(c.caps().devices, static_cast<terse_device_v1>(TERSE_DEVICE_HOST | TERSE_DEVICE_CUDA));
    PsgdDeviceCalls dev(c, stream);
    for (int world : {1, 3}) {
      SCOPED_TRACE(k.label + ", world " + std::to_string(world));
      const uint64_t numel = k.info.numel;
      const uint64_t r = std::stoull(k.rank);
      const uint64_t n = k.compressed ? static_cast<uint64_t>(k.info.shape[0]) : 0;
      std::vector<std::vector<float>> grads;
      std::vector<Scratch> host;
      std::vector<PsgdDeviceRank> device;
      double scale = 0;  // sum_w ||M_w||, the aggregate's scale
      for (int w = 0; w < world; ++w) {
        grads.push_back(psgdGaussian(numel, static_cast<uint32_t>(1000 * w + numel)));
        scale += psgdNorm(grads.back());
        terse_tensor_info_v1 r1 = k.info;
        r1.round = 1;
        const terse_compressor_sizes_v1 s0 = c.sizes(k.info), s1 = c.sizes(r1);
        terse_compressor_sizes_v1 s = s0;
        s.workspace_bytes = std::max(s0.workspace_bytes, s1.workspace_bytes);
        s.state_bytes = std::max(s0.state_bytes, s1.state_bytes);
        host.emplace_back(s);
        device.push_back(dev.rank(onDevice(k.info, device_), grads.back()));
      }
      for (uint64_t step = 0; step < kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const double tau = psgdTolerance(k.info, step + 1);
        std::vector<Bytes> hp, dp, hq, dq;
        for (int w = 0; w < world; ++w) {
          const terse_tensor_info_v1 info = psgdAt(k.info, w, world, step, 0, w);
          hp.push_back(c.compress(info, grads[static_cast<size_t>(w)], &host[static_cast<size_t>(w)]));
          Bytes got;
          ASSERT_EQ(dev.compress(onDevice(info, device_), device[static_cast<size_t>(w)], {}, &got), TERSE_OK)
              << c.lastError();
          ASSERT_EQ(got.size(), hp.back().size());
          EXPECT_EQ(0, std::memcmp(got.data(), hp.back().data(), 16)) << "round-0 header";
          if (!k.compressed) EXPECT_EQ(got, hp.back());
          dp.push_back(std::move(got));
        }
        const Bytes host_prev = sumPayloads(hp, 16, TERSE_DTYPE_F32), dev_prev = sumPayloads(dp, 16, TERSE_DTYPE_F32);
        for (int w = 0; w < world; ++w) {
          const terse_tensor_info_v1 info = psgdAt(k.info, w, world, step, 1, w);
          hq.push_back(c.compress(info, grads[static_cast<size_t>(w)], &host[static_cast<size_t>(w)], host_prev));
          Bytes got;
          ASSERT_EQ(dev.compress(onDevice(info, device_), device[static_cast<size_t>(w)], dev_prev, &got), TERSE_OK)
              << c.lastError();
          ASSERT_EQ(got.size(), hq.back().size());
          EXPECT_EQ(0, std::memcmp(got.data(), hq.back().data(), 16)) << "round-1 header";
          if (!k.compressed) EXPECT_EQ(got, hq.back());
          dq.push_back(std::move(got));

          // Error feedback's view: this rank's own payload, decoded before the aggregate arrives.
          std::vector<float> host_own(static_cast<size_t>(numel)), dev_own(static_cast<size_t>(numel));
          ASSERT_EQ(c.decompress(info, hq.back(), host_own, false, &host[static_cast<size_t>(w)]), TERSE_OK)
              << c.lastError();
          ASSERT_EQ(dev.decompress(onDevice(info, device_), device[static_cast<size_t>(w)], dq.back(), dev_own, false),
                    TERSE_OK)
              << c.lastError();
          if (!k.compressed) {
            EXPECT_EQ(dev_own, host_own);
          } else {
            EXPECT_LE(psgdDistance(dev_own.data(), host_own.data(), dev_own.size()),
                      tau * psgdNorm(grads[static_cast<size_t>(w)]))
                << "rank " << w << "'s own decode";
          }
        }
        if (k.compressed) {
          // P^ on the device: orthonormal (the host's Gram-Schmidt), and the host's to the tolerance.
          const Bytes ws = dev.read(device[0].workspace, 64 + 8 * n * r);
          const std::vector<double> phat = [&] {
            std::vector<double> v(static_cast<size_t>(n * r));
            std::memcpy(v.data(), ws.data() + 64, 8 * v.size());
            return v;
          }();
          for (uint64_t a = 0; a < r; ++a) {
            for (uint64_t b = 0; b < r; ++b) {
              double d = 0;
              for (uint64_t i = 0; i < n; ++i) d += phat[a * n + i] * phat[b * n + i];
              EXPECT_NEAR(d, a == b ? 1.0 : 0.0, 1e-12) << "P^ columns " << a << ", " << b;
            }
          }
          double diff = 0;
          for (size_t e = 0; e < phat.size(); ++e) {
            double h = 0;
            std::memcpy(&h, host[0].workspace().data() + 64 + 8 * e, 8);
            diff += (phat[e] - h) * (phat[e] - h);
          }
          EXPECT_LE(std::sqrt(diff), tau * std::sqrt(static_cast<double>(r))) << "P^ differs from the host's";
          EXPECT_EQ(0, std::memcmp(ws.data(), host[0].workspace().data(), 64)) << "workspace tag";
        }

        // The aggregate, written and accumulated.
        const Bytes host_q = sumPayloads(hq, 16, TERSE_DTYPE_F32), dev_q = sumPayloads(dq, 16, TERSE_DTYPE_F32);
        for (int w = 0; w < world; ++w) {
          const terse_tensor_info_v1 info = psgdAt(k.info, w, world, step, 1, -1);
          for (bool accumulate : {true, false}) {  // the write last: its decode stores Q' on both paths alike
            std::vector<float> host_out = input(numel, 7), dev_out = host_out;
            // Accumulating rounds each sum once more, on both paths: 2 u of the result.
            const double base = accumulate ? psgdNorm(host_out) : 0.0;
            ASSERT_EQ(c.decompress(info, host_q, host_out, accumulate, &host[static_cast<size_t>(w)]), TERSE_OK)
                << c.lastError();
            ASSERT_EQ(
                dev.decompress(onDevice(info, device_), device[static_cast<size_t>(w)], dev_q, dev_out, accumulate),
                TERSE_OK)
                << c.lastError();
            if (!k.compressed) {
              EXPECT_EQ(dev_out, host_out);
            } else {
              EXPECT_LE(psgdDistance(dev_out.data(), host_out.data(), dev_out.size()),
                        tau * scale + 2 * 0x1p-24 * (base + scale))
                  << "rank " << w << (accumulate ? ", accumulate" : ", write");
            }
          }
        }
        if (k.compressed) {
          // The warm start: the state holds Q' (the host's to the tolerance) under the host's header.
          const Bytes st = dev.read(device[0].state, device[0].state.size());
          EXPECT_EQ(0, std::memcmp(st.data(), host[0].state().data(), 64)) << "state header";
          const std::vector<float> dq_state = psgdFloats(st, 64), hq_state = psgdFloats(host[0].state(), 64);
          ASSERT_EQ(dq_state.size(), hq_state.size());
          EXPECT_LE(psgdDistance(dq_state.data(), hq_state.data(), dq_state.size()), tau * scale) << "Q'";
        }
      }
    }
  }
}

// The decode alone, bit for bit: given the same P^ and the same Q', the device's decode is the host's (the same double
// products summed in the same order, both built without contraction into FMA). One device step makes P^ and Q'; P^
// (with the workspace tag) is copied into a host workspace, and both paths decode the device's Q', written and
// accumulated. The shapes cover the kernel's tiles: rows that are not a multiple of its 8 (33, 300), columns
// narrower than a warp (31, 27) and wider than a block (257), and ranks past the 8 Q entries it holds at once (12:
// two chunks, the second partial), which take its second kernel.
TEST_F(PowerSgdOnDevice, DecodeOfTheSameFactorsIsTheHostsBitForBit) {
  Plugin plugin("powersgd");
  Stream stream;
  terse_tensor_info_v1 conv = tensorInfo(64 * 3 * 3 * 3);
  conv.ndim = 4;
  conv.shape[0] = 64, conv.shape[1] = 3, conv.shape[2] = 3, conv.shape[3] = 3;
  const std::vector<std::pair<terse_tensor_info_v1, std::string>> shapes = {
      {psgdMatrix(33, 31), "1"},   {psgdMatrix(33, 31), "4"},    {psgdMatrix(300, 257), "4"},
      {psgdMatrix(300, 257), "8"}, {psgdMatrix(300, 257), "12"}, {conv, "4"},
      {psgdMatrix(40, 600), "9"}};
  for (const auto& [shape, rank] : shapes) {
    SCOPED_TRACE(std::to_string(shape.shape[0]) + " rows, " + std::to_string(shape.numel) + " entries, rank " + rank);
    Instance c(plugin, {{"rank", rank}});
    ASSERT_TRUE(c.ok()) << c.lastError();
    PsgdDeviceCalls dev(c, stream);
    const std::vector<float> grad = psgdGaussian(shape.numel, 17);
    PsgdDeviceRank device = dev.rank(onDevice(shape, device_), grad);
    Bytes p, q;
    ASSERT_EQ(dev.compress(onDevice(psgdAt(shape, 0, 1, 0, 0, 0), device_), device, {}, &p), TERSE_OK) << c.lastError();
    ASSERT_EQ(dev.compress(onDevice(psgdAt(shape, 0, 1, 0, 1, 0), device_), device, p, &q), TERSE_OK) << c.lastError();
    const uint64_t n = static_cast<uint64_t>(shape.shape[0]), r = std::stoull(rank);
    ASSERT_EQ(q.size(), 16 + 4 * (shape.numel / n) * r) << "compressed (not passed through)";

    const terse_tensor_info_v1 info = psgdAt(shape, 0, 1, 0, 1, -1);
    Scratch host(c.sizes(info));
    const Bytes ws = dev.read(device.workspace, 64 + 8 * n * r);
    ASSERT_LE(ws.size(), host.workspace().size());
    std::memcpy(host.workspace().data(), ws.data(), ws.size());
    for (bool accumulate : {true, false}) {
      std::vector<float> host_out = input(shape.numel, 3), dev_out = host_out;
      ASSERT_EQ(c.decompress(info, q, host_out, accumulate, &host), TERSE_OK) << c.lastError();
      ASSERT_EQ(dev.decompress(onDevice(info, device_), device, q, dev_out, accumulate), TERSE_OK) << c.lastError();
      size_t differing = 0;
      for (size_t i = 0; i < host_out.size(); ++i) {
        differing += std::memcmp(&host_out[i], &dev_out[i], sizeof(float)) != 0 ? 1 : 0;
      }
      EXPECT_EQ(differing, 0u) << (accumulate ? "accumulated" : "written") << " decode, of " << host_out.size();
    }
  }
}

// A rank-1 gradient whose P is exactly rank 1 in f32 (a_i b^T with b = e_0 and every a_i a power of two, so P's
// columns are a times one float each, every product exact), so that columns 1-3 of P^ collapse by a wide margin and
// take the basis-vector pick: e_k for the smallest |a_k| outside the span so far, the lowest k on ties. Most |a_i| are
// 1; `picks` are the rows planted smaller: the smallest alone, then two equal ones (the tie), in that order of picking.
std::vector<float> psgdPlantedRankOne(uint64_t n, uint64_t m, const std::array<uint64_t, 3>& picks) {
  std::vector<float> a(static_cast<size_t>(n));
  for (uint64_t i = 0; i < n; ++i) a[i] = i % 2 == 0 ? 1.0f : -1.0f;
  a[picks[0]] *= 0x1p-8f;
  a[picks[1]] *= 0x1p-6f;
  a[picks[2]] *= 0x1p-6f;
  std::vector<float> g(static_cast<size_t>(n * m), 0.0f);
  for (uint64_t i = 0; i < n; ++i) g[i * m] = a[i];
  return g;
}

// P^ of one device step (world 1) of `grad`, read back from the workspace.
std::vector<double> psgdDevicePhat(Instance& c, PsgdDeviceCalls& dev, const terse_tensor_info_v1& shape,
                                   const std::vector<float>& grad, int device_index, uint64_t r) {
  PsgdFirstStep one(c, dev, shape, grad, device_index);
  Bytes dp, dq;
  EXPECT_EQ(dev.compress(onDevice(one.info0, device_index), one.device, {}, &dp), TERSE_OK) << c.lastError();
  EXPECT_EQ(dev.compress(onDevice(one.info1, device_index), one.device, dp, &dq), TERSE_OK) << c.lastError();
  const uint64_t n = static_cast<uint64_t>(shape.shape[0]);
  const Bytes ws = dev.read(one.device.workspace, 64 + 8 * n * r);
  std::vector<double> phat(static_cast<size_t>(n * r));
  if (ws.size() == 64 + 8 * phat.size()) std::memcpy(phat.data(), ws.data() + 64, 8 * phat.size());
  return phat;
}

// The orthogonalization on one block (33 rows) and on several (70,001 rows: three slices of powersgd_cuda.h's
// kOrthoSliceRows, rows [0, 23334), [23334, 46668), [46668, 70001), a cooperative launch of three blocks on any GPU
// that can hold them), for full-rank, rank-1 and zero gradients at rank 4. P^ must be orthonormal and the host's to
// the tolerance. The rank-1 gradient (psgdPlantedRankOne) collapses columns 1-3: on 70,001 rows the picks are the
// third slice's smallest |a| (row 60000), then a tie between the second slice's row 30000 and the third's row 50000,
// which the lower index wins, then row 50000; a block that preferred its own, the first or the last block's pick would
// pick otherwise. The zero gradient collapses every column and every row ties: P^ must be e_0 .. e_3 exactly.
TEST_F(PowerSgdRank4OnDevice, TallAndDegenerateFactorsAreOrthonormalAndTheHosts) {
  Instance& c = *c_;
  PsgdDeviceCalls& dev = *dev_;
  constexpr uint64_t r = 4;
  for (const uint64_t n : {uint64_t{33}, uint64_t{70001}}) {
    const uint64_t m = n == 33 ? 31 : 5;
    const terse_tensor_info_v1 shape = psgdMatrix(n, m);
    const std::array<uint64_t, 3> picks =
        n == 33 ? std::array<uint64_t, 3>{20, 8, 26} : std::array<uint64_t, 3>{60000, 30000, 50000};
    for (const auto& [what, grad] : std::vector<std::pair<std::string, std::vector<float>>>{
             {"full rank", psgdGaussian(n * m, 5)},
             {"rank 1", psgdPlantedRankOne(n, m, picks)},
             {"zero", std::vector<float>(static_cast<size_t>(n * m), 0.0f)}}) {
      SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(m) + ", " + what);
      PsgdFirstStep one(c, dev, shape, grad, device_);
      const Bytes hp = c.compress(one.info0, grad, &one.host);
      const Bytes hq = c.compress(one.info1, grad, &one.host, hp);
      ASSERT_FALSE(hq.empty()) << c.lastError();
      const std::vector<double> phat = psgdDevicePhat(c, dev, shape, grad, device_, r);
      std::vector<double> want(phat.size());
      std::memcpy(want.data(), one.host.workspace().data() + 64, 8 * want.size());
      for (uint64_t x = 0; x < r; ++x) {
        for (uint64_t y = 0; y < r; ++y) {
          double d = 0;
          for (uint64_t i = 0; i < n; ++i) d += phat[x * n + i] * phat[y * n + i];
          EXPECT_NEAR(d, x == y ? 1.0 : 0.0, 1e-12) << "P^ columns " << x << ", " << y;
        }
      }
      if (what == "zero") {
        EXPECT_EQ(phat, want) << "every row ties: e_0 .. e_3, as on the host";
        for (uint64_t x = 0; x < r; ++x) EXPECT_EQ(phat[x * n + x], 1.0) << "column " << x;
        continue;
      }
      if (what == "rank 1") {
        for (uint64_t x = 1; x < r; ++x) {
          EXPECT_GT(std::abs(phat[x * n + picks[x - 1]]), 0.99) << "column " << x << " is e_" << picks[x - 1];
        }
      }
      double diff = 0;
      for (size_t e = 0; e < phat.size(); ++e) diff += (phat[e] - want[e]) * (phat[e] - want[e]);
      EXPECT_LE(std::sqrt(diff), psgdTolerance(shape, 1) * std::sqrt(static_cast<double>(r)))
          << "P^ differs from the host's";
    }
  }
}

// A tall P's slices give the same P^ bits whether each has a block of its own (a cooperative launch) or one block
// takes them all (powersgd_cuda.h's kOneBlockEnv, what a device that cannot hold every slice's block gets), and twice
// the same from the same launch: every rank must orthogonalize its summed P alike, whatever its GPU.
TEST_F(PowerSgdRank4OnDevice, TallFactorsHaveTheSameBitsFromOneBlockAndFromMany) {
  Instance& c = *c_;
  PsgdDeviceCalls& dev = *dev_;
  const terse_tensor_info_v1 shape = psgdMatrix(70001, 5);
  struct RestoreEnv {
    ~RestoreEnv() { unsetenv(terse::compressors::powersgd::cuda::kOneBlockEnv); }
  } restore;
  for (const auto& [what, grad] : std::vector<std::pair<std::string, std::vector<float>>>{
           {"full rank", psgdGaussian(shape.numel, 5)},
           {"rank 1", psgdPlantedRankOne(70001, 5, {60000, 30000, 50000})}}) {
    SCOPED_TRACE(what);
    // "0": the cooperative launch or a failed call, never its one-block fallback (which would compare a launch with
    // itself).
    ASSERT_EQ(setenv(terse::compressors::powersgd::cuda::kOneBlockEnv, "0", 1), 0);
    const std::vector<double> many = psgdDevicePhat(c, dev, shape, grad, device_, 4);
    const std::vector<double> again = psgdDevicePhat(c, dev, shape, grad, device_, 4);
    ASSERT_EQ(setenv(terse::compressors::powersgd::cuda::kOneBlockEnv, "1", 1), 0);
    const std::vector<double> one_block = psgdDevicePhat(c, dev, shape, grad, device_, 4);
    unsetenv(terse::compressors::powersgd::cuda::kOneBlockEnv);
    ASSERT_EQ(many.size(), one_block.size());
    EXPECT_EQ(0, std::memcmp(many.data(), again.data(), 8 * many.size())) << "two cooperative launches";
    EXPECT_EQ(0, std::memcmp(many.data(), one_block.data(), 8 * many.size())) << "one block against one a slice";
  }
}

// Untrusted bytes: a corrupted aggregate Q and a corrupted prev get the host's status and message on the device, and a
// refused payload leaves the output and the warm-start state untouched.
TEST_F(PowerSgdOnDevice, CorruptPayloadsAndPrevGetTheHostVerdictAlsoDeferred) {
  Plugin plugin("powersgd");
  Instance c(plugin, {{"rank", "2"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  PsgdDeviceCalls dev(c, stream);
  const terse_tensor_info_v1 base = psgdMatrix(33, 31);
  const std::vector<float> grad = psgdGaussian(base.numel, 5);
  PsgdFirstStep one(c, dev, base, grad, device_);
  Scratch& host = one.host;
  PsgdDeviceRank& device = one.device;

  // One good step on both paths (world 1: the aggregate is this rank's payload).
  const terse_tensor_info_v1 &info0 = one.info0, &info1 = one.info1;
  const Bytes p = c.compress(info0, grad, &host);
  Bytes dp, dq;
  ASSERT_EQ(dev.compress(onDevice(info0, device_), device, {}, &dp), TERSE_OK) << c.lastError();
  const Bytes q = c.compress(info1, grad, &host, p);
  ASSERT_EQ(dev.compress(onDevice(info1, device_), device, dp, &dq), TERSE_OK) << c.lastError();
  const terse_tensor_info_v1 agg = psgdAt(base, 0, 1, 0, 1, -1);

  std::vector<std::pair<std::string, Bytes>> bad;
  for (size_t at : {size_t{0}, size_t{4}, size_t{6}, size_t{8}}) {
    Bytes b = dq;
    b[at] ^= std::byte{0x01};
    bad.emplace_back("header byte " + std::to_string(at) + " flipped", std::move(b));
  }
  bad.emplace_back("NaN in Q", patched<float>(dq, 16 + 4 * 7, std::numeric_limits<float>::quiet_NaN()));
  bad.emplace_back("inf in Q", patched<float>(dq, dq.size() - 4, std::numeric_limits<float>::infinity()));
  bad.emplace_back("truncated", truncated(dq, 4));
  Bytes longer = dq;
  longer.resize(longer.size() + 4);
  bad.emplace_back("overlong", std::move(longer));
  bad.emplace_back("empty", Bytes{});
  bad.emplace_back("round-0 payload", dp);
  const Bytes state_before = dev.read(device.state, device.state.size());
  for (const auto& [what, payload] : bad) {
    SCOPED_TRACE(what);
    std::vector<float> host_out = input(base.numel, 11), dev_out = host_out;
    const std::vector<float> before = host_out;
    c.host().clear();
    const terse_status_v1 host_status = c.decompress(agg, payload, host_out, true, &host);
    const std::string host_error = c.lastError();
    EXPECT_EQ(host_status, TERSE_ERR_INVALID_PAYLOAD) << host_error;
    c.host().clear();
    EXPECT_EQ(dev.decompress(onDevice(agg, device_), device, payload, dev_out, true), host_status);
    EXPECT_EQ(c.lastError(), host_error);
    EXPECT_EQ(dev_out, before) << "a refused payload changed the output";
    EXPECT_EQ(dev.read(device.state, device.state.size()), state_before) << "a refused payload touched the state";
  }

  // The deferred decompress (terse/device_verdict_v1.h): the good aggregate decodes as the ordinary call does and
  // writes the same warm start into the state (the deferred call runs first, onto the state no decode has touched),
  // and, its kernels warmed up, returns with the stream still stalled behind a kernel; every bad one above is refused
  // at once with the host's status and message, or in the word, and either way leaves the output and the state as they
  // were.
  const terse_decompress_deferred_fn_v1 deferred = plugin.deferred();
  ASSERT_NE(deferred, nullptr);
  {
    std::vector<float> got = input(base.numel, 12), want = got, again = got;
    bool raised = true;
    ASSERT_EQ(dev.decompressDeferred(deferred, onDevice(agg, device_), device, dq, got, true, &raised), TERSE_OK)
        << c.lastError();
    EXPECT_FALSE(raised);
    const Bytes state_deferred = dev.read(device.state, device.state.size());
    EXPECT_NE(state_deferred, state_before) << "the deferred decode of the aggregate wrote no warm start";
    ASSERT_EQ(dev.decompress(onDevice(agg, device_), device, dq, want, true), TERSE_OK) << c.lastError();
    EXPECT_EQ(got, want);
    EXPECT_EQ(dev.read(device.state, device.state.size()), state_deferred);
    Staller staller;
    ASSERT_EQ(dev.decompressDeferred(deferred, onDevice(agg, device_), device, dq, again, true, &raised, &staller),
              TERSE_OK)
        << c.lastError();
    EXPECT_EQ(again, want);
  }
  const Bytes state_kept = dev.read(device.state, device.state.size());
  for (const auto& [what, payload] : bad) {
    SCOPED_TRACE(std::string("deferred, ") + what);
    std::vector<float> dev_out = input(base.numel, 11);
    const std::vector<float> before = dev_out;
    bool raised = false;
    std::vector<float> host_out = dev_out;
    const auto [host_status, host_error] = hostVerdict(c, agg, payload, host_out, &host);
    const terse_status_v1 status =
        dev.decompressDeferred(deferred, onDevice(agg, device_), device, payload, dev_out, true, &raised);
    EXPECT_TRUE(status == host_status || (status == TERSE_OK && raised)) << status << c.lastError();
    if (status != TERSE_OK) EXPECT_EQ(c.lastError(), host_error);
    EXPECT_EQ(dev_out, before) << "a refused payload changed the output";
    EXPECT_EQ(dev.read(device.state, device.state.size()), state_kept) << "a refused payload touched the state";
  }

  // A payload of another step, and a workspace that never saw round 1: the host's InvalidArgument.
  for (uint64_t step : {uint64_t{1}}) {
    std::vector<float> host_out(base.numel), dev_out(base.numel);
    terse_tensor_info_v1 later = agg;
    later.step = step;
    c.host().clear();
    EXPECT_EQ(c.decompress(later, q, host_out, false, &host), TERSE_ERR_INVALID_ARGUMENT);
    const std::string host_error = c.lastError();
    c.host().clear();
    EXPECT_EQ(dev.decompress(onDevice(later, device_), device, dq, dev_out, false), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(c.lastError(), host_error);
    // Deferred, the workspace's tag goes to the same word as the payload's faults, and the output stays as it was.
    std::vector<float> deferred_out(base.numel, 3.0f);
    bool raised = false;
    EXPECT_EQ(dev.decompressDeferred(deferred, onDevice(later, device_), device, dq, deferred_out, false, &raised),
              TERSE_OK)
        << c.lastError();
    EXPECT_TRUE(raised) << "a workspace without this step's P^ passed the deferred check";
    EXPECT_EQ(deferred_out, std::vector<float>(base.numel, 3.0f));
  }

  // prev of round 1 is untrusted too.
  std::vector<std::pair<std::string, Bytes>> bad_prev;
  bad_prev.emplace_back("NaN in P", patched<float>(dp, 16, std::numeric_limits<float>::quiet_NaN()));
  bad_prev.emplace_back("truncated prev", truncated(dp, 4));
  bad_prev.emplace_back("Q payload as prev", dq);
  bad_prev.emplace_back("no prev", Bytes{});
  for (const auto& [what, prev] : bad_prev) {
    SCOPED_TRACE(what);
    Bytes host_out, dev_out;
    c.host().clear();
    const terse_status_v1 host_status = c.tryCompress(info1, grad, &host_out, &host, prev);
    const std::string host_error = c.lastError();
    EXPECT_NE(host_status, TERSE_OK);
    c.host().clear();
    EXPECT_EQ(dev.compress(onDevice(info1, device_), device, prev, &dev_out), host_status);
    EXPECT_EQ(c.lastError(), host_error);
  }
}

// The deferred compress (terse/device_verdict_v1.h): round 1's check of prev, the summed P, stays on the device. A
// clean prev gives the ordinary call's payload and workspace, the word at zero, and the call waits for nothing (the
// stream is still stalled when it returns). A prev with a fault only device memory shows (a NaN in P, a flipped header
// byte), or a state that round 0 found unusable, raises the word instead of failing the call; the payload then has a
// zeroed header and the workspace no round-1 tag, so this step's decompress refuses both the aggregate and this rank's
// own payload, deferred or not, and the warm start is as it was. The ordinary compress still refuses that prev with the
// host's message (the core's explanation of a raised word). A prev of the wrong size is refused at once, as compress
// refuses it. Every shape: compressed (33 x 31) and passed through (a vector).
TEST_F(PowerSgdOnDevice, DeferredCompressLeavesTheCheckOfPrevOnTheDeviceAndTheStepRefuses) {
  Plugin plugin("powersgd");
  Instance c(plugin, {{"rank", "2"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compress_deferred_fn_v1 deferred = plugin.deferredCompress();
  ASSERT_NE(deferred, nullptr) << "powersgd exports no " << TERSE_COMPRESSOR_COMPRESS_DEFERRED_V1_SYMBOL;
  const terse_decompress_deferred_fn_v1 deferred_decompress = plugin.deferred();
  ASSERT_NE(deferred_decompress, nullptr);
  Stream stream;
  PsgdDeviceCalls dev(c, stream);
  for (const terse_tensor_info_v1& base : {psgdMatrix(33, 31), tensorInfo(70)}) {
    SCOPED_TRACE(base.ndim == 2 ? "33 x 31" : "a vector of 70 (passed through)");
    const std::vector<float> grad = psgdGaussian(base.numel, 21);
    const terse_tensor_info_v1 info0 = psgdAt(base, 0, 1, 0, 0, 0), info1 = psgdAt(base, 0, 1, 0, 1, 0);
    terse_tensor_info_v1 agg = psgdAt(base, 0, 1, 0, 1, -1), own = psgdAt(base, 0, 1, 0, 1, 0);
    own.reserved0 = TERSE_CALL_OWN_PAYLOAD;

    // A clean step both ways: the same payload and workspace.
    PsgdDeviceRank a = dev.rank(onDevice(base, device_), grad), b = dev.rank(onDevice(base, device_), grad);
    Bytes pa, pb, qa, qb;
    ASSERT_EQ(dev.compress(onDevice(info0, device_), a, {}, &pa), TERSE_OK) << c.lastError();
    ASSERT_EQ(dev.compress(onDevice(info0, device_), b, {}, &pb), TERSE_OK) << c.lastError();
    ASSERT_EQ(pa, pb);
    ASSERT_EQ(dev.compress(onDevice(info1, device_), a, pa, &qa), TERSE_OK) << c.lastError();
    bool raised = true;
    Staller staller;
    ASSERT_EQ(dev.compressDeferred(deferred, onDevice(info1, device_), b, pb, &qb, &raised, &staller), TERSE_OK)
        << c.lastError();
    EXPECT_FALSE(raised);
    EXPECT_EQ(qa, qb);
    EXPECT_EQ(dev.read(a.workspace, a.workspace.size()), dev.read(b.workspace, b.workspace.size()));

    // Faults only the device sees: the word, the call's status ok, and the step's decompress refuses.
    std::vector<std::pair<std::string, Bytes>> bad;
    Bytes flipped = pa;
    flipped[0] ^= std::byte{0x01};
    bad.emplace_back("header byte 0 flipped", std::move(flipped));
    if (pa.size() > 16) bad.emplace_back("NaN in P", patched<float>(pa, 16, std::numeric_limits<float>::quiet_NaN()));
    for (const auto& [what, prev] : bad) {
      SCOPED_TRACE(what);
      PsgdDeviceRank r = dev.rank(onDevice(base, device_), grad);
      Bytes p, q;
      ASSERT_EQ(dev.compress(onDevice(info0, device_), r, {}, &p), TERSE_OK) << c.lastError();
      const Bytes state_before = dev.read(r.state, r.state.size());
      raised = false;
      ASSERT_EQ(dev.compressDeferred(deferred, onDevice(info1, device_), r, prev, &q, &raised), TERSE_OK)
          << c.lastError();
      EXPECT_TRUE(raised) << "the deferred compress accepted a prev the host refuses";
      EXPECT_EQ(dev.read(r.state, r.state.size()), state_before) << "a refused prev touched the state";
      ASSERT_GE(q.size(), 16u);
      EXPECT_EQ(Bytes(q.begin(), q.begin() + 16), Bytes(16, std::byte{0})) << "a refused prev left a valid header";
      // The clean step's payloads, this step's on another rank: this workspace has no round-1 tag, so they refuse.
      for (const terse_tensor_info_v1& call : {agg, own}) {
        SCOPED_TRACE(call.source_rank == -1 ? "the aggregate" : "this rank's own payload");
        std::vector<float> out(base.numel, 3.0f);
        bool word = false;
        EXPECT_EQ(dev.decompressDeferred(deferred_decompress, onDevice(call, device_), r, qa, out, false, &word),
                  TERSE_OK)
            << c.lastError();
        EXPECT_TRUE(word || base.ndim != 2) << "a step whose prev was refused decoded";
        if (base.ndim == 2) EXPECT_EQ(out, std::vector<float>(base.numel, 3.0f));
        // The payload the refused call wrote: its zeroed header refuses whatever the workspace holds.
        std::fill(out.begin(), out.end(), 3.0f);
        word = false;
        const terse_status_v1 status =
            dev.decompressDeferred(deferred_decompress, onDevice(call, device_), r, q, out, false, &word);
        EXPECT_TRUE(status == TERSE_ERR_INVALID_PAYLOAD || (status == TERSE_OK && word)) << c.lastError();
        EXPECT_EQ(out, std::vector<float>(base.numel, 3.0f));
        EXPECT_NE(dev.decompress(onDevice(call, device_), r, q, out, false), TERSE_OK);
        EXPECT_EQ(out, std::vector<float>(base.numel, 3.0f));
      }
      EXPECT_EQ(dev.read(r.state, r.state.size()), state_before) << "a refused step touched the warm start";
      // The ordinary compress refuses it, with the host's message: what the core reports for the raised word.
      Scratch host(c.sizes(info1));
      Bytes host_p, host_q;
      ASSERT_EQ(c.tryCompress(info0, grad, &host_p, &host), TERSE_OK) << c.lastError();
      c.host().clear();
      const terse_status_v1 host_status = c.tryCompress(info1, grad, &host_q, &host, prev);
      const std::string host_error = c.lastError();
      EXPECT_EQ(host_status, TERSE_ERR_INVALID_PAYLOAD);
      c.host().clear();
      EXPECT_EQ(dev.compress(onDevice(info1, device_), r, prev, &q), host_status);
      EXPECT_EQ(c.lastError(), host_error);
    }

    // A prev of the wrong size: refused at once, as compress refuses it, the word left alone.
    {
      PsgdDeviceRank r = dev.rank(onDevice(base, device_), grad);
      Bytes p, q;
      ASSERT_EQ(dev.compress(onDevice(info0, device_), r, {}, &p), TERSE_OK) << c.lastError();
      raised = false;
      EXPECT_EQ(dev.compressDeferred(deferred, onDevice(info1, device_), r, truncated(p, 4), &q, &raised),
                TERSE_ERR_INVALID_PAYLOAD);
      EXPECT_FALSE(raised);
    }
  }

  // A state round 0 found unusable (neither zero-filled nor PowerSGD's): raised too, the state as it was, and the
  // ordinary compress reports it with the host's message (InvalidArgument).
  const terse_tensor_info_v1 base = psgdMatrix(40, 30);
  const std::vector<float> grad = psgdGaussian(base.numel, 4);
  const terse_tensor_info_v1 info0 = psgdAt(base, 0, 1, 0, 0, 0), info1 = psgdAt(base, 0, 1, 0, 1, 0);
  PsgdDeviceRank r = dev.rank(onDevice(base, device_), grad);
  r.state.fill(0xCD, stream.get());
  Bytes p, q;
  ASSERT_EQ(dev.compress(onDevice(info0, device_), r, {}, &p), TERSE_OK) << c.lastError();
  const Bytes state_before = dev.read(r.state, r.state.size());
  bool raised = false;
  ASSERT_EQ(dev.compressDeferred(deferred, onDevice(info1, device_), r, p, &q, &raised), TERSE_OK) << c.lastError();
  EXPECT_TRUE(raised) << "an unusable state passed the deferred check";
  EXPECT_EQ(dev.read(r.state, r.state.size()), state_before);
  c.host().clear();
  EXPECT_EQ(dev.compress(onDevice(info1, device_), r, p, &q), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(c.lastError().find("state"), std::string::npos) << c.lastError();
}

// What the device cannot report without waiting, it reports one call later with the host's words: a non-finite
// gradient poisons P, and round 1 refuses the summed P as InvalidPayload (the host refuses the gradient at round 0 with
// InvalidArgument); a state that is neither zero-filled nor PowerSGD's is found at round 0 and reported by round 1 with
// the host's message.
TEST_F(PowerSgdOnDevice, WhatRoundZeroCannotReportRoundOneDoes) {
  Plugin plugin("powersgd");
  Instance c(plugin, {{"rank", "2"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  PsgdDeviceCalls dev(c, stream);
  const terse_tensor_info_v1 base = psgdMatrix(40, 30);
  const terse_tensor_info_v1 info0 = psgdAt(base, 0, 1, 0, 0, 0), info1 = psgdAt(base, 0, 1, 0, 1, 0);

  std::vector<float> nan_grad = psgdGaussian(base.numel, 3);
  nan_grad[123] = std::numeric_limits<float>::quiet_NaN();
  {
    Scratch host(c.sizes(info1));
    Bytes out;
    EXPECT_EQ(c.tryCompress(info0, nan_grad, &out, &host), TERSE_ERR_INVALID_ARGUMENT);
    PsgdDeviceRank device = dev.rank(onDevice(base, device_), nan_grad);
    Bytes dp, dq;
    ASSERT_EQ(dev.compress(onDevice(info0, device_), device, {}, &dp), TERSE_OK) << c.lastError();
    c.host().clear();
    EXPECT_EQ(dev.compress(onDevice(info1, device_), device, dp, &dq), TERSE_ERR_INVALID_PAYLOAD);
    EXPECT_NE(c.lastError().find("factor P holds a non-finite value"), std::string::npos) << c.lastError();
  }
  {
    const std::vector<float> grad = psgdGaussian(base.numel, 4);
    Scratch host(c.sizes(info1));
    std::fill(host.state().begin(), host.state().end(), std::byte{0xCD});
    Bytes out;
    c.host().clear();
    EXPECT_EQ(c.tryCompress(info0, grad, &out, &host), TERSE_ERR_INVALID_ARGUMENT);
    const std::string host_error = c.lastError();
    PsgdDeviceRank device = dev.rank(onDevice(base, device_), grad);
    device.state.fill(0xCD, stream.get());
    Bytes dp, dq;
    ASSERT_EQ(dev.compress(onDevice(info0, device_), device, {}, &dp), TERSE_OK) << c.lastError();
    c.host().clear();
    EXPECT_EQ(dev.compress(onDevice(info1, device_), device, dp, &dq), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(c.lastError(), host_error);
  }
}

}  // namespace
}  // namespace terse::testing
