// onebit: 1-bit quantization with per-bucket reconstruction values.
//
//   two_means (default): Seide, Fu, Droppo, Li, Yu, "1-Bit Stochastic Gradient Descent and its Application to
//     Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014. Each element is sent as its sign bit and
//     decoded to the mean of the bucket's elements on its side of zero:
//       Q(g)_i = mean{g_j : g_j >= 0}  if g_i >= 0,   mean{g_j : g_j < 0}  if g_i < 0            (0 for an empty side)
//     (the side decided by the IEEE sign bit: +0 positive, -0 negative), the reconstruction that minimizes the squared
//     error for a fixed sign pattern.
//   mean_abs: the scaled sign of Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other Gradient
//     Compression Schemes", ICML 2019 (EF-signSGD):
//       Q(g)_i = sign(g_i) * ||g||_1 / d        (d = the bucket's element count; sign(+0) = +1, sign(-0) = -1)
//     one value per bucket instead of two.
// Both are deterministic and biased: use them with the core's error feedback, as both papers do (Seide's "error
// feedback" carries the quantization error into the next minibatch). The bit is the IEEE sign bit: +0 is sent as
// positive, -0 as negative (either decodes to a value of its side; a zero has no better 1-bit code).
//
// Parameters:
//   scale        "two_means" (default) or "mean_abs"
//   bucket_size  elements per set of reconstruction values, >= 0 (default 512; 0 = the whole tensor). Seide uses one
//                pair per matrix column; a fixed bucket is the layout-independent equivalent.
//
// Payload (ALLGATHER, fixed size): B buckets, k = 2 (two_means) or 1 (mean_abs) scales per bucket, 1 bit per element.
//   [0, 16)    sdk::PayloadHeader {magic "1BIT", version 1, dtype f32, numel N}
//   [16, 32)   u64 bucket_size, u32 scale mode (0 two_means, 1 mean_abs), u32 k      decompress insists on its own
//   [32, ...)  B * k f32 magnitudes (finite, >= 0): per bucket {mean of the positive side, -mean of the negative side}
//              or {mean |g|}, then zero padding to a multiple of 8 bytes
//   [..., end) ceil(N / 64) u64 words of sign bits (bitpack width 1): bit i % 64 of word i / 64 is g_i's sign bit
// Total 32 + 8 ceil(B k / 2) + 8 ceil(N / 64) bytes: the bits are N/8 bytes rounded up to whole 8-byte words (at most
// 7 bytes of zero padding, which decompress checks). For N = 2^20, bucket_size 512, two_means: 32 + 16384 + 131072
// = 147488 bytes (0.035 of 4N).
// f32 gradients; inputs holding inf or NaN are refused (no finite mean covers them).
//
// CUDA (onebit.cu, when built with CUDA): device tensors give the host's payload bit for bit (the same math functions,
// the sums in the host's order). Two differences, both for the sake of not waiting on the stream: compress does not
// report a non-finite scale (it would have to read the scales back); the payload then carries it, and every decompress
// of it, the sender's own error feedback included, refuses it as InvalidPayload. And decompress synchronizes `stream`
// once, to learn the validation verdict (terse/kit/device.hpp).
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <span>
#include <string>

#include "onebit_cuda.h"
#include "onebit_host.h"
#include "onebit_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/kit/sign_bits.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"

namespace {

namespace sdk = terse::sdk;
namespace bitpack = terse::sdk::bitpack;
namespace math = terse::compressors::onebit;

constexpr sdk::PayloadFormat kFormat{"onebit", sdk::fourcc("1BIT"), 1};
constexpr unsigned kGroup = bitpack::kGroup;
constexpr uint32_t kTwoMeans = 0;
constexpr uint32_t kMeanAbs = 1;

struct WireParams {
  uint64_t bucket_size;
  uint32_t mode;
  uint32_t scales_per_bucket;
};
static_assert(sizeof(WireParams) == 16);

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

// Writes bucket b's k scales from its sums; false if one is not finite.
bool putScales(const math::BucketSums& s, uint64_t n, uint32_t k, uint64_t b, float* scales) {
  float pos = 0, neg = 0;
  if (k == 2) {
    math::twoMeans(s, n, &pos, &neg);
    scales[2 * b] = pos;
    scales[2 * b + 1] = neg;
  } else {
    pos = neg = math::meanAbs(s, n);
    scales[b] = pos;
  }
  return pos <= FLT_MAX && neg <= FLT_MAX;
}

// Fills scales[] (k per bucket) and words[]; returns numel, or the first element of a bucket whose scale is not
// finite. `bucket` is the effective size in [1, numel]. Each bucket's sums are taken just before the group that
// first needs them, so the sign pass reads the bucket from cache. `sums`, where not null, is a vector bucketSums
// (onebit_host.h, called without words).
uint64_t binarizeAll(uint64_t numel, uint64_t bucket, uint32_t k, const float* __restrict x, float* __restrict scales,
                     uint64_t* __restrict words, math::host::SumsAndSigns sums) {
  const uint64_t buckets = numel == 0 ? 0 : (numel - 1) / bucket + 1;
  uint64_t next = 0;
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    while (next < buckets && next * bucket < i0 + len) {
      const uint64_t start = next * bucket;
      const uint64_t n = std::min(bucket, numel - start);
      const math::BucketSums s = sums != nullptr ? sums(x + start, n, nullptr) : math::bucketSums(x + start, n);
      if (!putScales(s, n, k, next, scales)) return start;
      ++next;
    }
    if (len == kGroup) {
      words[g] = terse::kit::signBits64(x + i0);
    } else {
      for (unsigned j = 0; j < len; ++j) codes[j] = math::signBit(x[i0 + j]);
      bitpack::packTail<1>(codes, len, words + g);
    }
  }
  return numel;
}

// binarizeAll in one pass per bucket (sums and sign words together, onebit_host.h), for buckets that each start a
// 64-element group: bucket a multiple of 64, or one bucket. Its payload is binarizeAll's, byte for byte.
uint64_t binarizeFused(uint64_t numel, uint64_t bucket, uint32_t k, const float* x, float* scales, uint64_t* words,
                       math::host::SumsAndSigns fused) {
  for (uint64_t start = 0, b = 0; start < numel; start += bucket, ++b) {
    const uint64_t n = std::min(bucket, numel - start);
    if (!putScales(fused(x + start, n, words + start / kGroup), n, k, b, scales)) return start;
  }
  return numel;
}

void debinarizeAll(uint64_t numel, uint64_t bucket, uint32_t k, const float* __restrict scales,
                   const uint64_t* __restrict words, float* __restrict out, bool accumulate) {
  uint32_t codes[kGroup];
  float pos[kGroup], neg[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    if (len == kGroup) {
      bitpack::unpackGroup<1>(words + g, codes);
    } else {
      bitpack::unpackTail<1>(words + g, len, codes);
    }
    float* o = out + i0;
    const uint64_t b0 = i0 / bucket;
    if (len == kGroup && i0 + kGroup <= (b0 + 1) * bucket) {
      // A full group inside one bucket (every group but those straddling a boundary): loops of constant length with
      // the scales in registers, which vectorize (2.9x the per-element loops below at 64 MiB).
      const float p = scales[k * b0], n = scales[k * b0 + k - 1];
      if (accumulate) {
        for (unsigned j = 0; j < kGroup; ++j) o[j] += math::decodeValue(codes[j], p, n);
      } else {
        for (unsigned j = 0; j < kGroup; ++j) o[j] = math::decodeValue(codes[j], p, n);
      }
      continue;
    }
    for (unsigned j = 0; j < len;) {
      const uint64_t b = (i0 + j) / bucket;
      const unsigned stop = static_cast<unsigned>(std::min<uint64_t>(len, (b + 1) * bucket - i0));
      const float p = scales[k * b], n = scales[k * b + k - 1];
      for (; j < stop; ++j) pos[j] = p, neg[j] = n;
    }
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeValue(codes[j], pos[j], neg[j]);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeValue(codes[j], pos[j], neg[j]);
    }
  }
}

class OneBit final : public sdk::Compressor {
 public:
  OneBit(sdk::Params& params, sdk::Host& /*host*/)
      : mode_(params.getChoice("scale", "two_means", {"two_means", "mean_abs"}) == "two_means" ? kTwoMeans : kMeanAbs),
        bucket_size_(params.getUint("bucket_size", 512, sdk::Range::atLeast(0))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    terse::kit::requireF32(dtype);
    return sdk::Caps::allgather(TERSE_CAP_FIXED_SIZE, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireSupported(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = layout(info.numel).total;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> in = args.input<float>();
    const Layout l = layout(args.info.numel);
    sdk::ByteWriter w(args.output);
    writePrefix(w, args.info);
    const std::span<float> scales = w.putArray<float>(l.buckets * scalesPerBucket());
    w.padTo(8);
    const std::span<uint64_t> words = w.putArray<uint64_t>(l.words);
    static const math::host::SumsAndSigns fused = math::host::pickSumsAndSigns<true>();
    static const math::host::SumsAndSigns sums = math::host::pickSumsAndSigns<false>();
    const uint64_t bad =
        fused != nullptr && (l.bucket % kGroup == 0 || l.buckets == 1)
            ? binarizeFused(args.info.numel, l.bucket, scalesPerBucket(), in.data(), scales.data(), words.data(), fused)
            : sdk::cpu::clones<binarizeAll>(args.info.numel, l.bucket, scalesPerBucket(), in.data(), scales.data(),
                                            words.data(), sums);
    if (bad != args.info.numel) {
      throw sdk::InvalidArgument("onebit: the bucket starting at element " + std::to_string(bad) +
                                 " has no finite mean (the gradient holds inf or NaN)");
    }
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    const auto p = r.get<WireParams>("parameters");
    if (p.bucket_size != bucket_size_ || p.mode != mode_ || p.scales_per_bucket != scalesPerBucket()) {
      throw sdk::InvalidPayload(
          "onebit: payload made with bucket_size=" + std::to_string(p.bucket_size) + ", scale mode " +
          std::to_string(p.mode) + ", " + std::to_string(p.scales_per_bucket) +
          " scales per bucket; this instance has " + "bucket_size=" + std::to_string(bucket_size_) + ", scale mode " +
          std::to_string(mode_) + " (" + modeName() + "), " + std::to_string(scalesPerBucket()) + " scales per bucket");
    }
    const Layout l = layout(args.info.numel);
    const std::span<const float> scales = r.getArray<float>(l.buckets * scalesPerBucket(), "scales");
    r.skipTo(8, "onebit: after the scales");
    const std::span<const uint64_t> words = r.getArray<uint64_t>(l.words, "sign bits");
    r.expectEnd();
    for (size_t i = 0; i < scales.size(); ++i) {
      if (!(scales[i] >= 0.0f && scales[i] <= FLT_MAX)) {
        throw sdk::InvalidPayload("onebit: scale " + std::to_string(i) + " (bucket " +
                                  std::to_string(i / scalesPerBucket()) + ") is " + sdk::formatNumber(scales[i]) +
                                  ", not a finite magnitude >= 0");
      }
    }
    if (!bitpack::paddingIsZero(words.data(), args.info.numel, 1)) {
      throw sdk::InvalidPayload("onebit: nonzero padding bits after the last sign bit");
    }
    const std::span<float> out = args.output<float>();
    sdk::cpu::clones<debinarizeAll>(args.info.numel, l.bucket, scalesPerBucket(), scales.data(), words.data(),
                                    out.data(), args.accumulate);
  }

 private:
  struct Layout {
    uint64_t bucket;  // effective elements per bucket, in [1, numel] (1 for an empty tensor)
    uint64_t buckets;
    uint64_t words;
    uint64_t total;
  };

  uint32_t scalesPerBucket() const {
    return mode_ == kTwoMeans ? 2 : 1;
  }
  const char* modeName() const {
    return mode_ == kTwoMeans ? "two_means" : "mean_abs";
  }

  Layout layout(uint64_t numel) const {
    Layout l{};
    const uint64_t requested = bucket_size_ == 0 ? numel : bucket_size_;
    l.bucket = std::max<uint64_t>(1, std::min(requested, numel));
    l.buckets = numel == 0 ? 0 : (numel - 1) / l.bucket + 1;
    l.words = bitpack::wordCount(numel, 1);
    l.total = sdk::kPayloadHeaderBytes + sizeof(WireParams) +
              (l.buckets * scalesPerBucket() * sizeof(float) + 7) / 8 * 8 + 8 * l.words;
    return l;
  }

  // The header and the parameters: everything before the scales.
  void writePrefix(sdk::ByteWriter& w, const terse_tensor_info_v1& info) const {
    sdk::writeHeader(w, kFormat, info);
    w.put(WireParams{bucket_size_, mode_, scalesPerBucket()});
  }

#if TERSE_COMPRESSOR_CUDA
  terse::compressors::onebit::cuda::Shape deviceShape(uint64_t numel) const {
    const Layout l = layout(numel);
    return {numel,
            l.bucket,
            l.buckets,
            scalesPerBucket(),
            sdk::kPayloadHeaderBytes + sizeof(WireParams),
            l.total - 8 * l.words};
  }

  device::Prefix prefixFor(const terse_tensor_info_v1& info) const {
    return device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const Layout l = layout(args.info.numel);
    device::requireCapacity(args.output, l.total, "onebit");
    const device::Scope scope(args.info);
    terse::compressors::onebit::cuda::compress(deviceShape(args.info.numel), prefixFor(args.info),
                                               args.input<float>().data(), args.output.data(), args.stream);
    return l.total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const auto shape = deviceShape(args.info.numel);
    device::checkedDecompress(
        args, status_, args.payload.size() == layout(args.info.numel).total,
        [&](uint32_t* status) {
          terse::compressors::onebit::cuda::validate(shape, prefixFor(args.info), args.payload.data(), status,
                                                     args.stream);
        },
        [&](const uint32_t* gate) {
          terse::compressors::onebit::cuda::decode(shape, args.payload.data(), args.output<float>().data(),
                                                   args.accumulate, args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  mutable device::StatusWords status_;
#endif

  uint32_t mode_;
  uint64_t bucket_size_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(OneBit, "onebit",
                        "1-bit signs with per-bucket means (Seide et al. 2014) or mean |g| (Karimireddy et al. 2019)",
                        "1.0.0");
