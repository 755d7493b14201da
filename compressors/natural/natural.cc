// natural: natural compression (Horvath, Ho, Horvath, Sahu, Canini, Richtarik, "Natural Compression for Distributed
// Deep Learning", MSML 2022; arXiv 1905.10988): every element rounded at random to one of the two powers of two around
// it, so that it travels as its sign and its exponent, 9 bits instead of 32.
//
//   C(g)_i = sign(g_i) 2^floor(log2 |g_i|) * (1 + b_i),   b_i ~ Bernoulli(|g_i| / 2^floor(log2 |g_i|) - 1)
//
// (paper, eq. (2)), so E[C(g)] = g and E||C(g) - g||^2 <= (1/8) ||g||^2 (Theorem 1: omega = 1/8, against QSGD's
// min(d/s^2, sqrt(d)/s) that grows with the bucket), with no norm or scale pass and nothing shared between elements.
// The draw for element i is its own Philox word keyed by (seed, step, tensor id, i), so the result depends on nothing
// but those and the input. In f32 the rounding is exact and cheap: keep the exponent or add one to it, and clear the
// mantissa (natural_math.h). A subnormal rounds between 0 and 2^-126 the same way (still unbiased); a zero stays zero.
//
// Parameters:
//   threads        host compress of one tensor on this many threads, in [1, 64] (default 1); the same bytes for any
//                  value (sdk/parallel.hpp)
//   rounding_bits  b, the resolution of the draw: 24 (default), 16 or 8. Element i rounds up iff r_i < 2 m_i, with
//                  r_i uniform on [0, 2^24) in steps of 2^(24 - b) (sdk/philox.hpp's drawAt: at 24 the top
//                  24 bits of element i's own Philox word, at 16 (8) the i-th u16 (u8) of the same stream, so one
//                  Philox block serves 8 (16) elements instead of 4). At 24 P(up) = m_i 2^-23 exactly, since the
//                  mantissa m_i has 23 bits; at b < 24 P(up) = ceil(m_i 2^(b - 24)) 2^-b, a bias away from zero below
//                  2^-b of the gap between the two powers of two. Compress only: not on the wire.
//
// Payload (ALLGATHER, fixed size): 9 bits per element.
//   [0, 16)    sdk::PayloadHeader {magic "NATC", version 1, dtype f32, numel N}
//   [16, 32)   u32 code bits (9), u32 0, u64 0      the format's constants; decompress insists on them
//   [32, end)  bitpack::wordCount(N, 9) u64 words of 9-bit codes (sdk/bitpack.hpp): code i = e_i | s_i << 8, e_i the
//              f32 biased exponent of C(g)_i (0 for zero), s_i its sign bit (0 for zero)
// Total 32 + 8 ceil(9 N / 64) bytes: 3.5x smaller than f32 for large N. Decompress of one rank's payload gives that
// rank's C(g) exactly (a code is an f32 with an empty mantissa); the core decompress-accumulates every rank's. A code
// with exponent 255, a signed zero (code 256) or nonzero padding bits is an InvalidPayload. f32 gradients; an input
// that is inf or NaN, or that rounds up past 2^127 (the largest f32 power of two), is refused with InvalidArgument.
//
// CUDA (natural.cu, when built with CUDA): device tensors give the host's payload bit for bit (the same math
// functions, the same Philox counters, one pass with no reduction). Two differences, both for the sake of not waiting
// on the stream: compress does not report an input it cannot code (it would have to read back); the payload then
// carries exponent 255 there, and every decompress of it, the sender's own error feedback included, refuses it as
// InvalidPayload. And decompress synchronizes `stream` once, to learn the validation verdict (terse/kit/device.hpp).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "natural_cuda.h"
#include "natural_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/parallel.hpp"
#include "terse/sdk/philox.hpp"

namespace {

namespace sdk = terse::sdk;
namespace bitpack = terse::sdk::bitpack;
namespace math = terse::compressors::natural;

constexpr sdk::PayloadFormat kFormat{"natural", sdk::fourcc("NATC"), 1};
constexpr unsigned kGroup = math::kGroup;
constexpr unsigned kW = math::kCodeBits;

struct WireParams {
  uint32_t code_bits;
  uint32_t reserved0;
  uint64_t reserved1;
};
static_assert(sizeof(WireParams) == 16);
constexpr uint64_t kPrefixBytes = sdk::kPayloadHeaderBytes + sizeof(WireParams);

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

// Groups whose draws are made in one call (sdk::PhiloxStream::drawGroups, two groups at a time on AVX-512).
constexpr uint64_t kRunGroups = 16;

// Fills words[] with the codes of x[0, numel); returns numel, or the first element whose code is invalid (an input
// that is inf or NaN, or rounds past 2^127). g0: the index of x[0]'s 64-element group in the tensor (its Philox
// counter), when x is a range of it that starts on a group boundary (compress on several threads).
uint64_t encodeAll(uint64_t numel, const float* __restrict x, const sdk::PhiloxStream rng, unsigned draw_bits,
                   uint64_t g0, uint64_t* __restrict words) {
  uint32_t bits[kRunGroups * kGroup];
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel;) {
    const uint64_t n = std::max<uint64_t>(1, std::min<uint64_t>(kRunGroups, (numel - i0) / kGroup));
    const uint32_t* draws = rng.drawGroups(draw_bits, g0 + g, n, bits);
    for (uint64_t k = 0; k < n; ++k, ++g, i0 += kGroup) {
      const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
      uint32_t bad = 0;
      for (unsigned j = 0; j < len; ++j) {
        codes[j] = math::encodeValue(x[i0 + j], sdk::drawAt(draw_bits, draws, k * kGroup + j));
        bad |= (codes[j] & 0xFFu) == math::kBadExponent ? 1u : 0u;
      }
      if (bad != 0) {
        for (unsigned j = 0;; ++j) {
          if ((codes[j] & 0xFFu) == math::kBadExponent) return i0 + j;
        }
      }
      if (len == kGroup) {
        bitpack::packGroup<kW>(codes, words + g * kW);
      } else {
        bitpack::packTail<kW>(codes, len, words + g * kW);
      }
    }
  }
  return numel;
}

// out = (or +=) the codes' values, for codes firstInvalidCode accepted.
void decodeAll(uint64_t numel, const uint64_t* __restrict words, float* __restrict out, bool accumulate) {
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    float* o = out + i0;
    if (len == kGroup) {
      // Constant-length loops, which vectorize.
      bitpack::unpackGroup<kW>(words + g * kW, codes);
      if (accumulate) {
        for (unsigned j = 0; j < kGroup; ++j) o[j] += math::decodeValue(codes[j]);
      } else {
        for (unsigned j = 0; j < kGroup; ++j) o[j] = math::decodeValue(codes[j]);
      }
      continue;
    }
    bitpack::unpackTail<kW>(words + g * kW, len, codes);
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeValue(codes[j]);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeValue(codes[j]);
    }
  }
}

// Returns numel when every code is valid, else the first invalid one's index.
uint64_t firstInvalidCode(uint64_t numel, const uint64_t* __restrict words) {
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    if (len == kGroup) {
      bitpack::unpackGroup<kW>(words + g * kW, codes);
    } else {
      bitpack::unpackTail<kW>(words + g * kW, len, codes);
    }
    for (unsigned j = 0; j < len; ++j) {
      if (!math::codeIsValid(codes[j])) return i0 + j;
    }
  }
  return numel;
}

class Natural final : public sdk::Compressor {
 public:
  Natural(sdk::Params& params, sdk::Host& /*host*/)
      : threads_(params.getInt("threads", 1, sdk::Range::closed(1, sdk::kMaxThreads))),
        rounding_bits_(static_cast<unsigned>(std::stoul(params.getChoice("rounding_bits", "24", {"8", "16", "24"})))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    terse::kit::requireF32(dtype);
    return sdk::Caps::allgather(TERSE_CAP_FIXED_SIZE, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireSupported(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = payloadBytes(info.numel);
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> in = args.input<float>();
    sdk::ByteWriter w(args.output);
    writePrefix(w, args.info);
    const std::span<uint64_t> words = w.putArray<uint64_t>(bitpack::wordCount(args.info.numel, kW));
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    // Ranges of whole 64-code groups (9 words each) give the bytes of one thread.
    const uint64_t bad = sdk::firstFailure(args.info.numel, kGroup, threads_, [&](uint64_t begin, uint64_t end) {
      return begin + sdk::cpu::clones<encodeAll>(end - begin, in.data() + begin, rng, rounding_bits_, begin / kGroup,
                                                 words.data() + begin / kGroup * kW);
    });
    if (bad != args.info.numel) {
      throw sdk::InvalidArgument("natural: gradient element " + std::to_string(bad) + " is " +
                                 sdk::formatNumber(in[bad]) +
                                 ", which has no power of two to round to (inf, NaN, or past 2^127)");
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
    if (p.code_bits != kW || p.reserved0 != 0 || p.reserved1 != 0) {
      throw sdk::InvalidPayload("natural: payload parameters code bits=" + std::to_string(p.code_bits) +
                                ", reserved=" + std::to_string(p.reserved0) + ", " + std::to_string(p.reserved1) +
                                "; the format has code bits=9, reserved=0, 0");
    }
    const std::span<const uint64_t> words = r.getArray<uint64_t>(bitpack::wordCount(args.info.numel, kW), "codes");
    r.expectEnd();
    if (!bitpack::paddingIsZero(words.data(), args.info.numel, kW)) {
      throw sdk::InvalidPayload("natural: nonzero padding bits after the last code");
    }
    // Validated before anything is written: a refused payload leaves the output as it was.
    const uint64_t bad = sdk::cpu::clones<firstInvalidCode>(args.info.numel, words.data());
    if (bad != args.info.numel) {
      throw sdk::InvalidPayload("natural: code " + std::to_string(bad) + " is " +
                                std::to_string(bitpack::get(words.data(), bad, kW)) +
                                ", no power of two (exponent 255 or a signed zero)");
    }
    const std::span<float> out = args.output<float>();
    sdk::cpu::clones<decodeAll>(args.info.numel, words.data(), out.data(), args.accumulate);
  }

 private:
  static uint64_t payloadBytes(uint64_t numel) {
    return kPrefixBytes + 8 * bitpack::wordCount(numel, kW);
  }

  static void writePrefix(sdk::ByteWriter& w, const terse_tensor_info_v1& info) {
    sdk::writeHeader(w, kFormat, info);
    w.put(WireParams{kW, 0, 0});
  }

#if TERSE_COMPRESSOR_CUDA
  static terse::compressors::natural::cuda::Shape deviceShape(uint64_t numel) {
    return {numel, kPrefixBytes};
  }

  static device::Prefix prefixFor(const terse_tensor_info_v1& info) {
    return device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t total = payloadBytes(args.info.numel);
    device::requireCapacity(args.output, total, "natural");
    const device::Scope scope(args.info);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    terse::compressors::natural::cuda::compress(deviceShape(args.info.numel), prefixFor(args.info),
                                                args.input<float>().data(), rng, rounding_bits_, args.output.data(),
                                                args.stream);
    return total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const auto shape = deviceShape(args.info.numel);
    device::checkedDecompress(
        args, status_, args.payload.size() == payloadBytes(args.info.numel),
        [&](uint32_t* status) {
          terse::compressors::natural::cuda::validate(shape, prefixFor(args.info), args.payload.data(), status,
                                                      args.stream);
        },
        [&](const uint32_t* gate) {
          terse::compressors::natural::cuda::decode(shape, args.payload.data(), args.output<float>().data(),
                                                    args.accumulate, args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  mutable device::StatusWords status_;
#endif

  int64_t threads_;         // host compress threads (sdk/parallel.hpp)
  unsigned rounding_bits_;  // draw width of the stochastic rounding; compress only (the codes do not change form)
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Natural, "natural",
                        "natural compression: stochastic rounding to a power of two, 9 bits (Horvath et al. 2019)",
                        "1.0.0");
