// terngrad: ternary gradients (Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: Ternary Gradients to Reduce
// Communication in Distributed Deep Learning", NeurIPS 2017), with per-bucket scalers.
//
// For each bucket of `bucket_size` consecutive elements (the paper's layer-wise scaler is bucket_size = 0, one bucket
// for the whole tensor):
//
//   s_t = max_i |g_i|,   b_i ~ Bernoulli(|g_i| / s_t),   tern(g)_i = s_t * sign(g_i) * b_i            (paper, eq. (5))
//
// so E[tern(g)] = g (unbiased, up to rounding_bits' resolution below). b_i is drawn from element i's own Philox draw
// keyed by (seed, step, tensor id, i). The paper's optional gradient clipping (to 2.5 sigma, section 3.4) is not done
// here: it is a biased transformation of the gradient rather than part of the code, and per-bucket scalers already
// bound the variance it was meant to reduce (s_t is the max of 512 elements, not of a whole layer).
//
// Parameters:
//   bucket_size  elements per scaler, >= 0 (default 512); 0 means one scaler for the whole tensor (the paper's)
//   threads      host compress of one tensor on this many threads, in [1, 64] (default 1): ranges of whole buckets
//                and 64-code groups, the same bytes for any value (sdk/parallel.hpp)
//   rounding_bits  b, the resolution of u: 24 (default), 16 or 8. Element i is sent iff r_i 2^-b s_t < |g_i| with r_i
//                uniform on b bits (sdk/philox.hpp's drawAt: at 24 the top 24 bits of element i's own Philox word,
//                at 16 (8) the i-th u16 (u8) of the same stream, so one Philox block serves 8 (16) elements instead of
//                4; Philox was 60% of compress's time). So P(b_i = 1) = ceil(2^b f) / 2^b for f = |g_i| / s_t (exactly
//                so where u s_t rounds exactly, as for s_t a power of 2; else up to the rounding of u s_t, an f32 ulp
//                of s_t, as at any b), and E[tern(g)_i] - g_i = sign(g_i) s_t (ceil(2^b f) - 2^b f) / 2^b: a bias
//                away from zero below 2^-b of the single level s_t (s_t / 256 at b = 8, e.g. an element of |g| =
//                s_t / 512 is sent with probability 1/256 rather than 1/512). Compress only: the codes and the
//                payload are the same format for every b, so rounding_bits is not on the wire (the reserved word
//                stays 0, and the default's payloads are the ones 24-bit draws always made) and decompress takes any.
//
// Payload (ALLGATHER, fixed size): B buckets, 2 bits per element.
//   [0, 16)    sdk::PayloadHeader {magic "TERN", version 1, dtype f32, numel N}
//   [16, 32)   u64 bucket_size, u32 code bits (2), u32 0       the parameters it was made with; decompress insists
//   [32, ...)  B f32 scalers s_t (finite, >= 0), then zero padding to a multiple of 8 bytes
//   [..., end) bitpack::wordCount(N, 2) = ceil(N / 32) u64 words of 2-bit codes: 0 -> 0, 1 -> +s_t, 2 -> -s_t
// Total 32 + 8 ceil(B / 2) + 8 ceil(N / 32) bytes. Code 3, nonzero padding bits or a bad scaler are an
// InvalidPayload. f32 gradients; inputs holding inf or NaN are refused (no finite scaler covers them).
//
// CUDA (terngrad.cu, when built with CUDA): device tensors give the host's payload bit for bit (the same math
// functions and Philox counters; the scaler is a max, exact in any order). Two differences, both for the sake of not
// waiting on the stream: compress does not report a non-finite scaler (it would have to read the scalers back); the
// payload then carries it, and every decompress of it, the sender's own error feedback included, refuses it as
// InvalidPayload. And decompress synchronizes `stream` once, to learn the validation verdict
// (terse/kit/device.hpp).
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>

#include "terngrad_cuda.h"
#include "terngrad_host.h"
#include "terngrad_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/parallel.hpp"
#include "terse/sdk/philox.hpp"

namespace {

namespace sdk = terse::sdk;
namespace bitpack = terse::sdk::bitpack;
namespace math = terse::compressors::terngrad;

constexpr sdk::PayloadFormat kFormat{"terngrad", sdk::fourcc("TERN"), 1};
constexpr unsigned kGroup = math::kGroup;
constexpr unsigned kW = math::kCodeBits;

struct WireParams {
  uint64_t bucket_size;
  uint32_t code_bits;
  uint32_t reserved;
};
static_assert(sizeof(WireParams) == 16);

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

// As in qsgd.cc: the max pass streams the input from DRAM, the codes read it again; prefetching 8 KiB ahead of the
// codes brings the max pass's lines in early.
constexpr uint64_t kPrefetchAhead = 2048;

// Groups whose codes are made in one run: a run shares one bucket's scale and its Philox bits are drawn together
// (sdk::PhiloxStream::groups, two groups at a time on AVX-512).
constexpr uint64_t kRunGroups = 16;

// Fills scales[] and words[]; returns numel on success or the first element of a bucket whose scaler is not finite.
// `bucket` is the effective size in [1, numel], so (b + 1) * bucket cannot overflow. Each scaler is computed just
// ahead of the group that first needs it, while its bucket is still in cache.
// g0: the index of x[0]'s 64-element group in the tensor (its Philox counter), when x is a range of it that starts
// on a bucket and a group boundary (compress on several threads).
// Runs of whole groups inside one bucket go to `run` (terngrad_host.h: the widest SIMD loop this host has, the same
// bits as the scalar loop); a group that is short or straddles buckets is made here. `max_abs` is bucketMaxAbs, with
// vectors where the host has them.
// draw_bits: rounding_bits, 8, 16 or 24 (sdk/philox.hpp's drawAt; `run` must read the same width).
uint64_t ternarizeAll(uint64_t numel, uint64_t bucket, const float* __restrict x, const sdk::PhiloxStream rng,
                      unsigned draw_bits, uint64_t g0, float* __restrict scales, uint64_t* __restrict words,
                      const math::host::TernarizeGroups run, const math::host::BucketMaxAbs max_abs) {
  const uint64_t buckets = numel == 0 ? 0 : (numel - 1) / bucket + 1;
  uint64_t next = 0;
  uint32_t bits[kRunGroups * kGroup];
  uint32_t codes[kGroup];
  float scale[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel;) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    while (next < buckets && next * bucket < i0 + len) {
      const uint64_t start = next * bucket;
      const float s = max_abs(x + start, std::min(bucket, numel - start));
      if (!(s <= FLT_MAX)) return start;
      scales[next++] = s;
    }
    const uint64_t b0 = i0 / bucket;
    const uint64_t run_end = std::min((b0 + 1) * bucket, numel);  // the whole groups from i0 up to here
    if (i0 + kGroup <= run_end) {
      const uint64_t n = std::min<uint64_t>(kRunGroups, (run_end - i0) / kGroup);
      if (i0 + kPrefetchAhead + n * kGroup <= numel) {
        for (uint64_t line = 0; line < n * kGroup; line += 16) __builtin_prefetch(x + i0 + kPrefetchAhead + line);
      }
      run(x + i0, scales[b0], rng.drawGroups(draw_bits, g0 + g, n, bits), n, words + g * kW);
      i0 += n * kGroup;
      g += n;
      continue;
    }
    for (unsigned j = 0; j < len;) {
      const uint64_t b = (i0 + j) / bucket;
      const unsigned stop = static_cast<unsigned>(std::min<uint64_t>(len, (b + 1) * bucket - i0));
      const float s = scales[b];
      for (; j < stop; ++j) scale[j] = s;
    }
    if (i0 + kPrefetchAhead + kGroup <= numel) {
      for (unsigned line = 0; line < kGroup; line += 16) __builtin_prefetch(x + i0 + kPrefetchAhead + line);
    }
    const uint32_t* draws = rng.drawGroups(draw_bits, g0 + g, 1, bits);
    for (unsigned j = 0; j < len; ++j) {
      codes[j] = math::quantizeValue(x[i0 + j], scale[j], sdk::drawAt(draw_bits, draws, j));
    }
    if (len == kGroup) {
      bitpack::packGroup<kW>(codes, words + g * kW);
    } else {
      bitpack::packTail<kW>(codes, len, words + g * kW);
    }
    i0 += kGroup;
    ++g;
  }
  return numel;
}

void deternarizeAll(uint64_t numel, uint64_t bucket, const float* __restrict scales, const uint64_t* __restrict words,
                    float* __restrict out, bool accumulate) {
  uint32_t codes[kGroup];
  float scale[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    float* o = out + i0;
    const uint64_t b0 = i0 / bucket;
    if (len == kGroup && i0 + kGroup <= (b0 + 1) * bucket) {
      // A full group inside one bucket: constant-length loops with the scale in a register, which vectorize. The
      // codes are read straight from the group's four 32-bit quarters (code 16q + l is bits [2l, 2l + 2) of quarter q,
      // as unpackGroup<2> reads them): a quarter broadcast and shifted lane by lane is 16 codes in one vector, where
      // unpackGroup's byte-at-a-time loop took as long as the decode.
      const float s = scales[b0];
      uint32_t quarter[4];
      std::memcpy(quarter, words + g * kW, sizeof quarter);
      for (unsigned q = 0; q < 4; ++q) {
        float* oq = o + 16 * q;
        if (accumulate) {
          for (unsigned l = 0; l < 16; ++l) oq[l] += math::decodeValue((quarter[q] >> (2 * l)) & 3u, s);
        } else {
          for (unsigned l = 0; l < 16; ++l) oq[l] = math::decodeValue((quarter[q] >> (2 * l)) & 3u, s);
        }
      }
      continue;
    }
    if (len == kGroup) {
      bitpack::unpackGroup<kW>(words + g * kW, codes);
    } else {
      bitpack::unpackTail<kW>(words + g * kW, len, codes);
    }
    for (unsigned j = 0; j < len;) {
      const uint64_t b = (i0 + j) / bucket;
      const unsigned stop = static_cast<unsigned>(std::min<uint64_t>(len, (b + 1) * bucket - i0));
      const float s = scales[b];
      for (; j < stop; ++j) scale[j] = s;
    }
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeValue(codes[j], scale[j]);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeValue(codes[j], scale[j]);
    }
  }
}

class TernGrad final : public sdk::Compressor {
 public:
  TernGrad(sdk::Params& params, sdk::Host& /*host*/)
      : bucket_size_(params.getUint("bucket_size", 512, sdk::Range::atLeast(0))),
        threads_(params.getInt("threads", 1, sdk::Range::closed(1, sdk::kMaxThreads))),
        rounding_bits_(static_cast<unsigned>(std::stoul(params.getChoice("rounding_bits", "24", {"8", "16", "24"})))) {}

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
    const std::span<float> scales = w.putArray<float>(l.buckets);
    w.padTo(8);
    const std::span<uint64_t> words = w.putArray<uint64_t>(l.words);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    static const math::host::TernarizeGroups runs[] = {math::host::pickTernarizeGroups<8>(),
                                                       math::host::pickTernarizeGroups<16>(),
                                                       math::host::pickTernarizeGroups<24>()};
    const math::host::TernarizeGroups run = runs[rounding_bits_ / 8 - 1];
    static const math::host::BucketMaxAbs max_abs = math::host::pickBucketMaxAbs();
    // As in qsgd.cc: ranges of whole buckets and 64-code groups give the bytes of one thread.
    const uint64_t bad = sdk::firstFailure(
        args.info.numel, std::lcm(l.bucket, uint64_t{kGroup}), threads_, [&](uint64_t begin, uint64_t end) {
          return begin + sdk::cpu::clones<ternarizeAll>(end - begin, l.bucket, in.data() + begin, rng, rounding_bits_,
                                                        begin / kGroup, scales.data() + begin / l.bucket,
                                                        words.data() + begin / kGroup * kW, run, max_abs);
        });
    if (bad != args.info.numel) {
      throw sdk::InvalidArgument("terngrad: the bucket starting at element " + std::to_string(bad) +
                                 " has no finite scaler max|g| (the gradient holds inf or NaN)");
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
    if (p.bucket_size != bucket_size_ || p.code_bits != kW || p.reserved != 0) {
      throw sdk::InvalidPayload(
          "terngrad: payload made with bucket_size=" + std::to_string(p.bucket_size) +
          ", code bits=" + std::to_string(p.code_bits) + ", reserved=" + std::to_string(p.reserved) +
          "; this instance has bucket_size=" + std::to_string(bucket_size_) + ", code bits=2, reserved=0");
    }
    const Layout l = layout(args.info.numel);
    const std::span<const float> scales = r.getArray<float>(l.buckets, "scalers");
    r.skipTo(8, "terngrad: after the scalers");
    const std::span<const uint64_t> words = r.getArray<uint64_t>(l.words, "codes");
    r.expectEnd();
    for (size_t b = 0; b < scales.size(); ++b) {
      if (!(scales[b] >= 0.0f && scales[b] <= FLT_MAX)) {
        throw sdk::InvalidPayload("terngrad: bucket " + std::to_string(b) + " has scaler " +
                                  sdk::formatNumber(scales[b]) + ", not a finite number >= 0");
      }
    }
    bool bad = false;
    for (const uint64_t word : words) bad |= math::wordHasInvalidCode(word);
    if (bad) {
      for (size_t k = 0;; ++k) {
        if (math::wordHasInvalidCode(words[k])) {
          throw sdk::InvalidPayload("terngrad: code word " + std::to_string(k) + " holds code 3 (only 0, 1, 2 exist)");
        }
      }
    }
    if (!bitpack::paddingIsZero(words.data(), args.info.numel, kW)) {
      throw sdk::InvalidPayload("terngrad: nonzero padding bits after the last code");
    }
    const std::span<float> out = args.output<float>();
    sdk::cpu::clones<deternarizeAll>(args.info.numel, l.bucket, scales.data(), words.data(), out.data(),
                                     args.accumulate);
  }

 private:
  struct Layout {
    uint64_t bucket;  // effective elements per scaler, in [1, numel] (1 for an empty tensor)
    uint64_t buckets;
    uint64_t words;
    uint64_t total;
  };

  Layout layout(uint64_t numel) const {
    Layout l{};
    const uint64_t requested = bucket_size_ == 0 ? numel : bucket_size_;
    l.bucket = std::max<uint64_t>(1, std::min(requested, numel));
    l.buckets = numel == 0 ? 0 : (numel - 1) / l.bucket + 1;
    l.words = bitpack::wordCount(numel, kW);
    l.total = sdk::kPayloadHeaderBytes + sizeof(WireParams) + (l.buckets * sizeof(float) + 7) / 8 * 8 + 8 * l.words;
    return l;
  }

  // The header and the parameters: everything before the scalers.
  void writePrefix(sdk::ByteWriter& w, const terse_tensor_info_v1& info) const {
    sdk::writeHeader(w, kFormat, info);
    w.put(WireParams{bucket_size_, kW, 0});
  }

#if TERSE_COMPRESSOR_CUDA
  terse::compressors::terngrad::cuda::Shape deviceShape(uint64_t numel) const {
    const Layout l = layout(numel);
    return {numel, l.bucket, l.buckets, sdk::kPayloadHeaderBytes + sizeof(WireParams), l.total - 8 * l.words};
  }

  device::Prefix prefixFor(const terse_tensor_info_v1& info) const {
    return device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const Layout l = layout(args.info.numel);
    device::requireCapacity(args.output, l.total, "terngrad");
    const device::Scope scope(args.info);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    terse::compressors::terngrad::cuda::compress(deviceShape(args.info.numel), prefixFor(args.info),
                                                 args.input<float>().data(), rng, rounding_bits_, args.output.data(),
                                                 args.stream);
    return l.total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const auto shape = deviceShape(args.info.numel);
    device::checkedDecompress(
        args, status_, args.payload.size() == layout(args.info.numel).total,
        [&](uint32_t* status) {
          terse::compressors::terngrad::cuda::validate(shape, prefixFor(args.info), args.payload.data(), status,
                                                       args.stream);
        },
        [&](const uint32_t* gate) {
          terse::compressors::terngrad::cuda::decode(shape, args.payload.data(), args.output<float>().data(),
                                                     args.accumulate, args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  mutable device::StatusWords status_;
#endif

  uint64_t bucket_size_;
  int64_t threads_;         // host compress threads (sdk/parallel.hpp)
  unsigned rounding_bits_;  // draw width of the stochastic rounding; compress only (the codes do not change form)
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TernGrad, "terngrad",
                        "TernGrad: stochastic {-1, 0, +1} times a per-bucket max (Wen et al. 2017)", "1.0.0");
