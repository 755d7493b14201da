// The built-in compressors on CUDA tensors against the same plugins on host tensors (DESIGN.md section 5, issue 9):
// for the same input, seed, step and tensor the device payload is the host payload byte for byte, and decompressing
// it on the device (written, and accumulated onto an output that already holds values) gives the host's floats bit
// for bit. No tolerance is needed for any of them: the kernels call the host's TERSE_HD functions, draw the host's
// Philox numbers and sum in the host's order (see each compressor's .cu file). Untrusted payloads: corrupted bytes get
// the host's verdict and message on the device, and a refused payload leaves the output untouched. signSGD (CUSTOM
// aggregation) also reduces on the device.
//
// Skips with the reason on a machine without a GPU (CI compiles it there).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
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
      {"terngrad", {}, "terngrad"},
      {"terngrad", {{"bucket_size", "0"}}, "terngrad_whole_tensor"},
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

 private:
  Instance& c_;
  Stream& stream_;
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

    const Bytes want = c.compress(host_info, x);
    DeviceBuffer payload;
    const Bytes got = dev.compress(dev_info, x, &payload, GetParam().fixed_size);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size())) << "device payload differs from the host's";

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

TEST_P(CompressorsOnDevice, CorruptPayloadsGetTheHostVerdict) {
  Plugin plugin(GetParam().plugin);
  Instance c(plugin, GetParam().params);
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  DeviceCalls dev(c, stream);
  for (uint64_t n : {uint64_t{0}, uint64_t{1000}}) {
    const terse_tensor_info_v1 host_info = tensorInfo(n);
    const terse_tensor_info_v1 dev_info = onDevice(host_info, device_);
    const Bytes good = c.compress(host_info, input(n, 3));
    ASSERT_FALSE(good.empty());
    // One byte of every section kind: header, parameters, first scale, the middle, the last (padding bits for the
    // bit-packed payloads); then a truncated and an overlong payload.
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

    for (const auto& [what, payload] : bad) {
      SCOPED_TRACE("numel " + std::to_string(n) + ", " + what);
      const std::vector<float> base = input(n, 11);
      std::vector<float> host_out = base, dev_out = base;
      c.host().clear();
      const terse_status_v1 host_status = c.decompress(host_info, payload, host_out, true);
      const std::string host_error = c.lastError();
      c.host().clear();
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

// The device cannot refuse a NaN at compress without waiting for it, so it marks the payload; every decode refuses it.
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
      const Bytes want = c.compress(info, x);
      DeviceBuffer payload;
      const Bytes got = dev.compress(onDevice(info, device_), x, &payload);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size())) << "device payload differs from the host's";
      std::vector<float> host_out = tied(n, 1), dev_out = host_out;
      ASSERT_EQ(c.decompress(info, want, host_out, true), TERSE_OK) << c.lastError();
      ASSERT_EQ(dev.decompress(onDevice(info, device_), want, dev_out, true), TERSE_OK) << c.lastError();
      EXPECT_EQ(0, std::memcmp(dev_out.data(), host_out.data(), host_out.size() * sizeof(float)));
    }
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
  const terse_tensor_info_v1 info = tensorInfo(1000);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = input(1000, 1);
    x[777] = bad;
    Bytes host_payload;
    EXPECT_EQ(c.tryCompress(info, x, &host_payload), TERSE_ERR_INVALID_ARGUMENT);
    DeviceBuffer payload;
    const Bytes poisoned = dev.compress(onDevice(info, device_), x, &payload);
    ASSERT_FALSE(poisoned.empty());
    std::vector<float> out(1000, 1.0f);
    c.host().clear();
    EXPECT_EQ(dev.decompress(onDevice(info, device_), poisoned, out, true), TERSE_ERR_INVALID_PAYLOAD);
    EXPECT_NE(c.lastError().find("is not finite"), std::string::npos) << c.lastError();
    for (float v : out) ASSERT_EQ(v, 1.0f);
  }
}

// threshold: compress synchronizes to learn the count, so unlike the fixed-size compressors it refuses a non-finite
// gradient at compress, with the host's status and message.
TEST(ThresholdOnDevice, RefusesNonFiniteGradientsAsTheHost) {
  const cuda::DeviceSummary summary = cuda::deviceSummary();
  if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
  int device = 0;
  TERSE_CUDA_CHECK(cudaGetDevice(&device));
  Plugin plugin("threshold");
  Instance c(plugin, {{"tau", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Stream stream;
  const terse_tensor_info_v1 info = tensorInfo(1000);
  const terse_tensor_info_v1 dev_info = onDevice(info, device);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = input(1000, 2);
    x[999] = bad;
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
}

INSTANTIATE_TEST_SUITE_P(Builtins, CompressorsOnDevice, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace terse::testing
