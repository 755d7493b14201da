// qsgd: Quantized SGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
// Quantization and Encoding", NeurIPS 2017), bucketed as in the paper's experiments.
//
// The gradient is cut into buckets v of `bucket_size` consecutive elements (the last one shorter). With s = levels:
//
//   Q_s(v)_i = ||v||_2 * sign(v_i) * xi_i(v, s) / s,
//   xi_i = l + 1 with probability s|v_i|/||v|| - l, else l,   l = floor(s|v_i|/||v||)        (paper, eq. (3)-(4))
//
// so E[Q_s(v)] = v (unbiased, up to rounding_bits' resolution below), |Q_s(v)_i - v_i| <= ||v|| / s, and E||Q_s(v) -
// v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 for a bucket of d elements (Lemma 3.1). u for the rounding is element i's own
// Philox draw keyed by (seed, step, tensor id, i), so the result depends on nothing but those and the input.
//
// Parameters:
//   levels       s, an integer in [1, 2^24 - 1] (default 127). 127 makes each code sign + 7 bits = exactly one byte:
//                4x smaller than f32, and with 512-element buckets the variance bound min(512/127^2, ...) ~ 0.032
//                ||v||^2 is small enough to train without error feedback. s above 2^24 - 1 would not be exact in
//                f32.
//   bucket_size  elements per norm, >= 1 (default 512, the paper's choice for its CNN experiments); larger than numel
//                means one norm for the whole tensor.
//   threads      host compress of one tensor on this many threads, in [1, 64] (default 1): ranges of whole buckets
//                and 64-code groups, the same bytes for any value (sdk/parallel.hpp). Off by default so that codec
//                timings compare with other tools' single-threaded ones.
//   rounding_bits  b, the resolution of u: 24 (default), 16 or 8. Element i rounds up iff r_i 2^-b < x_i - l with
//                r_i uniform on b bits (sdk/philox.hpp's drawAt: at 24 the top 24 bits of element i's own Philox word,
//                at 16 (8) the i-th u16 (u8) of the same stream, so one Philox block serves 8 (16) elements instead of
//                4; Philox was half of compress's time). So P(xi_i = l + 1) = ceil(2^b (x_i - l)) / 2^b: E[Q(v)_i] -
//                v_i = sign(v_i) (||v|| / s) (ceil(2^b f) - 2^b f) / 2^b for f = x_i - l, a bias away from zero below
//                2^-b of one quantization step ||v|| / s (1/256 of a step at b = 8, 1/65536 at 16; at 24 below f32's
//                own resolution of u). The error bound |Q(v)_i - v_i| <= ||v|| / s and the variance bound still hold
//                (xi_i stays l or l + 1). Compress only: the codes and the payload are the same format for every b, so
//                rounding_bits is not on the wire and decompress takes any (a different draw is a different
//                sample, not a different code); the default's payloads are the ones 24-bit draws always made.
//
// Payload (ALLGATHER, fixed size): W = 1 + bitsFor(s) bits per element (bitsFor(127) = 7, so W = 8), B buckets.
//   [0, 16)    sdk::PayloadHeader {magic "QSGD", version 1, dtype f32, numel N}
//   [16, 32)   u32 levels, u32 W, u64 bucket_size        the parameters it was made with; decompress insists on its own
//   [32, ...)  B f32 bucket norms ||v|| (finite, >= 0), then zero padding to a multiple of 8 bytes
//   [..., end) bitpack::wordCount(N, W) u64 words of W-bit codes (sdk/bitpack.hpp): code i = xi_i | negative_i << (W-1)
// Total 32 + 8 ceil(B / 2) + 8 ceil(N W / 64) bytes. Decompress of one rank's payload gives that rank's Q(v); the
// core decompress-accumulates every rank's payload. f32 gradients; inputs holding inf or NaN (or whose bucket norm
// overflows f32) are refused with InvalidArgument, since no finite norm could describe them.
//
// CUDA (qsgd.cu, when built with CUDA): device tensors give the host's payload bit for bit (the same math functions,
// the same Philox counters, the norms summed in the host's order). Two differences, both for the sake of not waiting
// on the stream: compress does not report a non-finite norm (it would have to read the norms back); the payload then
// carries it, and every decompress of it, the sender's own error feedback included, refuses it as InvalidPayload.
// And decompress synchronizes `stream` once, to learn the validation verdict (terse/kit/device.hpp).
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>

#include "qsgd_cuda.h"
#include "qsgd_host.h"
#include "qsgd_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/parallel.hpp"
#include "terse/sdk/philox.hpp"

namespace {

namespace sdk = terse::sdk;
namespace bitpack = terse::sdk::bitpack;
namespace math = terse::compressors::qsgd;

constexpr sdk::PayloadFormat kFormat{"qsgd", sdk::fourcc("QSGD"), 1};
constexpr int64_t kMaxLevels = (int64_t{1} << 24) - 1;
// The device kernels are built for the code widths levels in [1, kMaxLevels] give, and only those (qsgd_cuda.h).
static_assert(bitpack::bitsFor(1) + 1 == math::cuda::kMinCodeBits &&
                  bitpack::bitsFor(kMaxLevels) + 1 == math::cuda::kMaxCodeBits,
              "qsgd's device code widths no longer match its levels");
constexpr unsigned kGroup = math::kGroup;
// The input is read twice, for the bucket norm and then for the codes; the norm pass is the one that streams from
// DRAM. Prefetching 8 KiB ahead of the codes (a few buckets) lets it find its lines in cache: 0.47 -> 0.52x memcpy at
// 64 MiB on a 2-vCPU EPYC (medians of 7 alternating runs; 16 KiB ahead gave 0.48x).
constexpr uint64_t kPrefetchAhead = 2048;

// The parameters as they travel, right after the header.
struct WireParams {
  uint32_t levels;
  uint32_t code_bits;
  uint64_t bucket_size;
};
static_assert(sizeof(WireParams) == 16);

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

// The loops' fixed inputs.
struct Config {
  uint64_t numel;
  uint64_t bucket;  // min(bucket_size, numel): (b + 1) * bucket cannot overflow
  int32_t levels;
  unsigned mag_bits;
  unsigned draw_bits;  // rounding_bits: 8, 16 or 24 (sdk/philox.hpp's drawAt)
};

// Groups whose codes are made in one run: a run shares one bucket's norm and its Philox bits are drawn together
// (sdk::PhiloxStream::groups, two groups at a time on AVX-512).
constexpr uint64_t kRunGroups = 16;

// Fills norms[] and words[]; returns numel on success, or the first element of a bucket whose norm is not finite.
// Norms are computed bucket by bucket just ahead of the group that first needs them, so a bucket is still in cache
// when its elements are quantized.
// g0: the index of x[0]'s 64-element group in the tensor (its Philox counter), when x is a range of it that starts
// on a bucket and a group boundary (compress on several threads).
// Runs of whole groups inside one bucket go to `run` (qsgd_host.h: the widest SIMD loop this host has, the same bits
// as the scalar loop); a group that is short or straddles buckets is made here. `sum_squares` sums the squares of
// several buckets at once (the same bits as sumSquares).
template <unsigned W>
uint64_t quantizeAll(const Config c, const float* __restrict x, const sdk::PhiloxStream rng, uint64_t g0,
                     float* __restrict norms, uint64_t* __restrict words, const math::host::QuantizeGroups run,
                     const math::host::SumSquaresBuckets sum_squares) {
  const uint64_t buckets = c.numel == 0 ? 0 : (c.numel - 1) / c.bucket + 1;
  const float levels_f = static_cast<float>(c.levels);
  uint64_t next = 0;  // first bucket whose norm is not computed yet
  uint32_t bits[kRunGroups * kGroup];
  uint32_t codes[kGroup];
  float divisor[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < c.numel;) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, c.numel - i0));
    while (next < buckets && next * c.bucket < i0 + len) {
      const uint64_t start = next * c.bucket;
      // Up to kNormBuckets whole buckets at once (independent chains of adds), the last, short one alone.
      const auto count =
          static_cast<unsigned>(std::min<uint64_t>(math::host::kNormBuckets, (c.numel - start) / c.bucket));
      if (count == 0) {
        const float norm = math::bucketNorm(x + start, c.numel - start);
        if (!(norm <= FLT_MAX)) return start;  // inf or NaN
        norms[next++] = norm;
        continue;
      }
      double sums[math::host::kNormBuckets];
      sum_squares(x + start, c.bucket, count, sums);
      for (unsigned k = 0; k < count; ++k) {
        const float norm = math::normOf(sums[k]);
        if (!(norm <= FLT_MAX)) return start + k * c.bucket;
        norms[next++] = norm;
      }
    }
    const uint64_t b0 = i0 / c.bucket;
    const uint64_t run_end = std::min((b0 + 1) * c.bucket, c.numel);  // the whole groups from i0 up to here
    if (i0 + kGroup <= run_end) {
      const uint64_t n = std::min<uint64_t>(kRunGroups, (run_end - i0) / kGroup);
      if (i0 + kPrefetchAhead + n * kGroup <= c.numel) {
        for (uint64_t line = 0; line < n * kGroup; line += 16) __builtin_prefetch(x + i0 + kPrefetchAhead + line);
      }
      run(x + i0, math::normDivisor(norms[b0]), c.levels, rng.drawGroups(c.draw_bits, g0 + g, n, bits), n,
          words + g * W);
      i0 += n * kGroup;
      g += n;
      continue;
    }
    for (unsigned j = 0; j < len;) {
      const uint64_t b = (i0 + j) / c.bucket;
      const unsigned stop = static_cast<unsigned>(std::min<uint64_t>(len, (b + 1) * c.bucket - i0));
      const float d = math::normDivisor(norms[b]);
      for (; j < stop; ++j) divisor[j] = d;
    }
    if (i0 + kPrefetchAhead + kGroup <= c.numel) {
      for (unsigned line = 0; line < kGroup; line += 16) __builtin_prefetch(x + i0 + kPrefetchAhead + line);
    }
    const uint32_t* draws = rng.drawGroups(c.draw_bits, g0 + g, 1, bits);
    for (unsigned j = 0; j < len; ++j) {
      codes[j] = math::quantizeValue(x[i0 + j], divisor[j], levels_f, c.levels, c.mag_bits,
                                     sdk::drawAt(c.draw_bits, draws, j));
    }
    if (len == kGroup) {
      bitpack::packGroup<W>(codes, words + g * W);
    } else {
      bitpack::packTail<W>(codes, len, words + g * W);
    }
    i0 += kGroup;
    ++g;
  }
  return c.numel;
}

// The first code that quantizeValue could not have produced, or numel if all are valid.
// Full groups are checked with a loop of constant length, which vectorizes.
template <unsigned W>
uint64_t firstInvalidCode(const Config c, const uint64_t* __restrict words) {
  const auto levels = static_cast<uint32_t>(c.levels);
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < c.numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, c.numel - i0));
    bool bad = false;
    if (len == kGroup) {
      bitpack::unpackGroup<W>(words + g * W, codes);
      for (unsigned j = 0; j < kGroup; ++j) bad |= !math::codeIsValid(codes[j], levels, c.mag_bits);
    } else {
      bitpack::unpackTail<W>(words + g * W, len, codes);
      for (unsigned j = 0; j < len; ++j) bad |= !math::codeIsValid(codes[j], levels, c.mag_bits);
    }
    if (bad) {
      for (unsigned j = 0;; ++j) {
        if (!math::codeIsValid(codes[j], levels, c.mag_bits)) return i0 + j;
      }
    }
  }
  return c.numel;
}

template <unsigned W>
void dequantizeAll(const Config c, const float* __restrict norms, const uint64_t* __restrict words,
                   float* __restrict out, bool accumulate) {
  const float levels_f = static_cast<float>(c.levels);
  uint32_t codes[kGroup];
  float unit[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < c.numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, c.numel - i0));
    if (len == kGroup) {
      bitpack::unpackGroup<W>(words + g * W, codes);
    } else {
      bitpack::unpackTail<W>(words + g * W, len, codes);
    }
    float* o = out + i0;
    const uint64_t b0 = i0 / c.bucket;
    if (len == kGroup && i0 + kGroup <= (b0 + 1) * c.bucket) {
      // A full group inside one bucket: constant-length loops with the unit in a register, which vectorize.
      const float u = norms[b0] / levels_f;
      if (accumulate) {
        for (unsigned j = 0; j < kGroup; ++j) o[j] += math::decodeValue(codes[j], u, c.mag_bits);
      } else {
        for (unsigned j = 0; j < kGroup; ++j) o[j] = math::decodeValue(codes[j], u, c.mag_bits);
      }
      continue;
    }
    for (unsigned j = 0; j < len;) {
      const uint64_t b = (i0 + j) / c.bucket;
      const unsigned stop = static_cast<unsigned>(std::min<uint64_t>(len, (b + 1) * c.bucket - i0));
      const float u = norms[b] / levels_f;
      for (; j < stop; ++j) unit[j] = u;
    }
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeValue(codes[j], unit[j], c.mag_bits);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeValue(codes[j], unit[j], c.mag_bits);
    }
  }
}

class Qsgd final : public sdk::Compressor {
 public:
  Qsgd(sdk::Params& params, sdk::Host& /*host*/)
      : levels_(params.getInt("levels", 127, sdk::Range::atLeast(1))),
        bucket_size_(params.getUint("bucket_size", 512, sdk::Range::atLeast(1))),
        threads_(params.getInt("threads", 1, sdk::Range::closed(1, sdk::kMaxThreads))),
        rounding_bits_(static_cast<unsigned>(std::stoul(params.getChoice("rounding_bits", "24", {"8", "16", "24"})))) {
    if (levels_ > kMaxLevels) {
      throw sdk::InvalidArgument("qsgd: 'levels' must be an integer <= " + std::to_string(kMaxLevels) +
                                 " (2^24 - 1: larger levels are not exact in f32), got " + std::to_string(levels_));
    }
    mag_bits_ = bitpack::bitsFor(static_cast<uint64_t>(levels_));
    code_bits_ = mag_bits_ + 1;
  }

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
    const std::span<float> norms = w.putArray<float>(l.buckets);
    w.padTo(8);
    const std::span<uint64_t> words = w.putArray<uint64_t>(l.words);
    const Config c = config(args.info.numel);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    static const math::host::SumSquaresBuckets sum_squares = math::host::pickSumSquaresBuckets();
    // A range that starts on a bucket and a group boundary has its own norms and words: any such cut gives the bytes
    // of one thread (the Philox counters are the tensor's group indices).
    const uint64_t bad =
        sdk::firstFailure(c.numel, std::lcm(c.bucket, uint64_t{kGroup}), threads_, [&](uint64_t begin, uint64_t end) {
          Config range = c;
          range.numel = end - begin;
          uint64_t local = range.numel;
          TERSE_BITPACK_DISPATCH(code_bits_,
                                 local = sdk::cpu::clones<quantizeAll<kW>>(
                                     range, in.data() + begin, rng, begin / kGroup, norms.data() + begin / c.bucket,
                                     words.data() + begin / kGroup * code_bits_,
                                     math::host::pickQuantizeGroups<kW>(c.draw_bits), sum_squares));
          return begin + local;
        });
    if (bad != c.numel) {
      throw sdk::InvalidArgument("qsgd: the bucket starting at element " + std::to_string(bad) +
                                 " has no finite L2 norm (the gradient holds inf or NaN, or the norm exceeds f32)");
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
    if (p.levels != static_cast<uint32_t>(levels_) || p.code_bits != code_bits_ || p.bucket_size != bucket_size_) {
      throw sdk::InvalidPayload(
          "qsgd: payload made with levels=" + std::to_string(p.levels) + ", code bits=" + std::to_string(p.code_bits) +
          ", bucket_size=" + std::to_string(p.bucket_size) + "; this instance has levels=" + std::to_string(levels_) +
          ", code bits=" + std::to_string(code_bits_) + ", bucket_size=" + std::to_string(bucket_size_));
    }
    const Layout l = layout(args.info.numel);
    const std::span<const float> norms = r.getArray<float>(l.buckets, "bucket norms");
    r.skipTo(8, "qsgd: after the bucket norms");
    const std::span<const uint64_t> words = r.getArray<uint64_t>(l.words, "codes");
    r.expectEnd();
    for (size_t b = 0; b < norms.size(); ++b) {
      if (!(norms[b] >= 0.0f && norms[b] <= FLT_MAX)) {
        throw sdk::InvalidPayload("qsgd: bucket " + std::to_string(b) + " has norm " + sdk::formatNumber(norms[b]) +
                                  ", not a finite number >= 0");
      }
    }
    if (!bitpack::paddingIsZero(words.data(), args.info.numel, code_bits_)) {
      throw sdk::InvalidPayload("qsgd: nonzero padding bits after the last code");
    }
    const Config c = config(args.info.numel);
    // Every W-bit code is valid when s = 2^(W-1) - 1 (the default 127 among them); otherwise look first, so that a
    // bad payload leaves the output untouched.
    if (static_cast<uint32_t>(levels_) != bitpack::lowMask(mag_bits_)) {
      uint64_t bad = c.numel;
      TERSE_BITPACK_DISPATCH(code_bits_, bad = sdk::cpu::clones<firstInvalidCode<kW>>(c, words.data()));
      if (bad != c.numel) {
        throw sdk::InvalidPayload("qsgd: code of element " + std::to_string(bad) + " has a magnitude above levels " +
                                  std::to_string(levels_));
      }
    }
    const std::span<float> out = args.output<float>();
    TERSE_BITPACK_DISPATCH(
        code_bits_, sdk::cpu::clones<dequantizeAll<kW>>(c, norms.data(), words.data(), out.data(), args.accumulate));
  }

 private:
  struct Layout {
    uint64_t buckets;
    uint64_t words;
    uint64_t total;
  };

  Layout layout(uint64_t numel) const {
    Layout l{};
    l.buckets = numel == 0 ? 0 : (numel - 1) / bucket_size_ + 1;
    l.words = bitpack::wordCount(numel, code_bits_);
    l.total = sdk::kPayloadHeaderBytes + sizeof(WireParams) + (l.buckets * sizeof(float) + 7) / 8 * 8 + 8 * l.words;
    return l;
  }

  // The header and the parameters: everything before the bucket norms.
  void writePrefix(sdk::ByteWriter& w, const terse_tensor_info_v1& info) const {
    sdk::writeHeader(w, kFormat, info);
    w.put(WireParams{static_cast<uint32_t>(levels_), code_bits_, bucket_size_});
  }

#if TERSE_COMPRESSOR_CUDA
  terse::compressors::qsgd::cuda::Shape deviceShape(uint64_t numel) const {
    const Layout l = layout(numel);
    const Config c = config(numel);
    const uint64_t norms_offset = sdk::kPayloadHeaderBytes + sizeof(WireParams);
    return {numel, c.bucket, l.buckets, c.levels, c.mag_bits, code_bits_, norms_offset, l.total - 8 * l.words};
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const Layout l = layout(args.info.numel);
    device::requireCapacity(args.output, l.total, "qsgd");
    const device::Scope scope(args.info);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    terse::compressors::qsgd::cuda::compress(
        deviceShape(args.info.numel), device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, args.info); }),
        args.input<float>().data(), rng, rounding_bits_, args.output.data(), args.stream);
    return l.total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const auto shape = deviceShape(args.info.numel);
    // As on the host: every W-bit code is valid when s = 2^(W-1) - 1, so only other levels need the code scan.
    const bool check_codes = static_cast<uint32_t>(levels_) != bitpack::lowMask(mag_bits_);
    device::checkedDecompress(
        args, status_, args.payload.size() == layout(args.info.numel).total,
        [&](uint32_t* status) {
          terse::compressors::qsgd::cuda::validate(
              shape, device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, args.info); }), args.payload.data(),
              check_codes, status, args.stream);
        },
        [&](const uint32_t* gate) {
          terse::compressors::qsgd::cuda::decode(shape, args.payload.data(), args.output<float>().data(),
                                                 args.accumulate, args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  mutable device::StatusWords status_;
#endif

  Config config(uint64_t numel) const {
    return Config{numel, std::max<uint64_t>(1, std::min(bucket_size_, numel)), static_cast<int32_t>(levels_), mag_bits_,
                  rounding_bits_};
  }

  int64_t levels_;
  uint64_t bucket_size_;
  int64_t threads_;         // host compress threads (sdk/parallel.hpp)
  unsigned rounding_bits_;  // draw width of the stochastic rounding; compress only (the codes do not change form)
  unsigned mag_bits_ = 0;
  uint32_t code_bits_ = 0;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Qsgd, "qsgd", "QSGD stochastic quantization, s levels per bucket norm (Alistarh et al. 2017)",
                        "1.0.0");
