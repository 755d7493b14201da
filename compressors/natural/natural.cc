// natural: natural compression (Horvath, Ho, Horvath, Sahu, Canini, Richtarik, "Natural Compression for Distributed
// Deep Learning", MSML 2022; arXiv 1905.10988): every element rounded at random to one of the two powers of two around
// it, so that it travels as its sign and its exponent, 9 bits instead of 32.
//
//   C(g)_i = sign(g_i) 2^floor(log2 |g_i|) * (1 + b_i),   b_i ~ Bernoulli(|g_i| / 2^floor(log2 |g_i|) - 1)
//
// (paper, eq. (2)), so E[C(g)] = g and E||C(g) - g||^2 <= (1/8) ||g||^2 (Theorem 1: omega = 1/8, against QSGD's
// min(d/s^2, sqrt(d)/s) that grows with the bucket), with no norm or scale pass and nothing shared between elements.
// The bound is the paper's for normal f32 values at rounding_bits 24: a subnormal rounds between 0 and 2^-126, whose
// gap is larger than itself (an absolute error below 2^-126 all the same), and rounding_bits 16 or 8 add their bias's
// share: about 3 delta / 16 for delta = 2^-b (0.125744 at b = 8, where p = 85/256 for a mantissa just above 84/256).
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
//                  mantissa m_i has 23 bits; at b < 24 P(up) = ceil(m_i 2^(b - 23)) 2^-b, a bias away from zero below
//                  2^-b of the gap between the two powers of two. Compress only: not on the wire.
//
// Payload (ALLGATHER, fixed size): 9 bits per element, as a byte and a bit.
//   [0, 16)    sdk::PayloadHeader {magic "NATC", version 1, dtype f32, numel N}
//   [16, 32)   u32 exponent bits (8), u32 0, u64 0      the format's constants; decompress insists on them
//   [32, E)    N exponent bytes e_i, the f32 biased exponent of C(g)_i (0 for zero; never 255), then zero padding to a
//              multiple of 8 bytes: E = 32 + 8 ceil(N / 8)
//   [E, end)   ceil(N / 64) u64 sign words: bit i % 64 of word i / 64 is g_i's sign bit (kept when C(g)_i is 0, which
//              then decodes to a zero of g_i's sign); the bits past N zero
// Total 32 + 8 ceil(N / 8) + 8 ceil(N / 64) bytes: 3.56x smaller than f32 for large N. Decompress of one rank's payload
// gives that rank's C(g) exactly (an f32 with an empty mantissa); the core decompress-accumulates every rank's. An
// exponent byte of 255, a nonzero padding byte or bit is an InvalidPayload. f32 gradients; an input that is inf or
// NaN, or that rounds up past 2^127 (the largest f32 power of two), is refused with InvalidArgument.
//
// CUDA (natural.cu, when built with CUDA): device tensors give the host's payload bit for bit (the same math
// functions, the same Philox counters, no reduction). Two differences, both for the sake of not waiting on the stream:
// compress does not report an input it cannot code (it would have to read back); the payload then carries exponent
// 255 there, and every decompress of it, the sender's own error feedback included, refuses it as InvalidPayload. And
// decompress synchronizes `stream` once, to learn the validation verdict (terse/kit/device.hpp).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "natural_cuda.h"
#include "natural_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/kit/sign_bits.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/parallel.hpp"
#include "terse/sdk/philox.hpp"

namespace {

namespace sdk = terse::sdk;
namespace math = terse::compressors::natural;

constexpr sdk::PayloadFormat kFormat{"natural", sdk::fourcc("NATC"), 1};
constexpr unsigned kGroup = sdk::bitpack::kGroup;  // a sign word's elements, and the unit of the loops
constexpr uint32_t kExponentBits = 8;

struct WireParams {
  uint32_t exponent_bits;
  uint32_t reserved0;
  uint64_t reserved1;
};
static_assert(sizeof(WireParams) == 16);
constexpr uint64_t kPrefixBytes = sdk::kPayloadHeaderBytes + sizeof(WireParams);

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

// Where the two arrays are, for N elements.
struct Layout {
  uint64_t exponents;  // offset of the exponent bytes (kPrefixBytes)
  uint64_t signs;      // offset of the sign words: after the exponent bytes padded to 8
  uint64_t sign_words;
  uint64_t total;
};
Layout layoutFor(uint64_t numel) {
  Layout l{};
  l.exponents = kPrefixBytes;
  l.signs = kPrefixBytes + (numel + 7) / 8 * 8;
  l.sign_words = (numel + kGroup - 1) / kGroup;
  l.total = l.signs + 8 * l.sign_words;
  return l;
}

// Groups whose draws are made in one call (sdk::PhiloxStream::drawGroups, two groups at a time on AVX-512).
constexpr uint64_t kRunGroups = 16;

// d[j] = sdk::drawAt<B>(stream, j) for a group's 64 elements at B = 16 or 8, written as loops over whole stream words
// with constant shifts, which vectorize: drawAt's own index arithmetic per element did not, and made rounding_bits 16
// and 8 twice as slow as 24 instead of faster.
template <unsigned B>
void spreadDraws(const uint32_t* __restrict stream, uint32_t* __restrict d) {
  static_assert(B == 16 || B == 8, "24-bit draws are the stream's words themselves");
  if constexpr (B == 16) {
    for (unsigned w = 0; w < kGroup / 2; ++w) {
      d[2 * w] = stream[w] << 16;
      d[2 * w + 1] = stream[w] & 0xFFFF0000u;
    }
  } else {
    for (unsigned w = 0; w < kGroup / 4; ++w) {
      d[4 * w] = stream[w] << 24;
      d[4 * w + 1] = (stream[w] << 16) & 0xFF000000u;
      d[4 * w + 2] = (stream[w] << 8) & 0xFF000000u;
      d[4 * w + 3] = stream[w] & 0xFF000000u;
    }
  }
}

// Fills exponents[0, numel) and signs[0, ceil(numel / 64)) for x[0, numel), drawing at width B; returns numel, or the
// first element whose exponent is 255 (an input that is inf or NaN, or rounds past 2^127). g0: the index of x[0]'s
// 64-element group in the tensor (its Philox counter), when x is a range of it that starts on a group boundary
// (compress on several threads).
template <unsigned B>
uint64_t encodeAll(uint64_t numel, const float* __restrict x, const sdk::PhiloxStream rng, uint64_t g0,
                   uint8_t* __restrict exponents, uint64_t* __restrict signs) {
  uint32_t bits[kRunGroups * kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel;) {
    const uint64_t n = std::max<uint64_t>(1, std::min<uint64_t>(kRunGroups, (numel - i0) / kGroup));
    const uint32_t* draws = rng.drawGroups(B, g0 + g, n, bits);
    for (uint64_t k = 0; k < n; ++k, ++g, i0 += kGroup) {
      const float* xg = x + i0;
      uint8_t* eg = exponents + i0;
      const uint32_t* dg = draws + k * kGroup / sdk::drawsPerWord(B);  // the group's first word (drawAt's j = 0)
      uint32_t bad = 0;
      if (numel - i0 >= kGroup) {
        // Constant-length loops of one operation each, which GCC -O2 vectorizes (a loop that also narrowed to bytes
        // and reduced did not: 5 ns an element); the sign bits four at a time (kit/sign_bits.hpp).
        // 24-bit draws are the stream's words as they are; narrower ones are spread to one word an element.
        uint32_t spread[kGroup];
        const uint32_t* d = dg;
        if constexpr (B != 24) {
          spreadDraws<B>(dg, spread);
          d = spread;
        }
        uint32_t e[kGroup];
        for (unsigned j = 0; j < kGroup; ++j) e[j] = math::roundedExponent(xg[j], d[j]);
        for (unsigned j = 0; j < kGroup; ++j) bad |= e[j] == math::kBadExponent ? 1u : 0u;
        for (unsigned j = 0; j < kGroup; ++j) eg[j] = static_cast<uint8_t>(e[j]);
        signs[g] = terse::kit::signBits64(xg);
      } else {
        const unsigned len = static_cast<unsigned>(numel - i0);
        uint64_t word = 0;
        for (unsigned j = 0; j < len; ++j) {
          const uint32_t e = math::roundedExponent(xg[j], sdk::drawAt<B>(dg, j));
          eg[j] = static_cast<uint8_t>(e);
          bad |= e == math::kBadExponent ? 1u : 0u;
          word |= uint64_t{sdk::floatBits(xg[j]) >> 31} << j;
        }
        signs[g] = word;
      }
      if (bad != 0) {
        for (unsigned j = 0;; ++j) {
          if (eg[j] == math::kBadExponent) return i0 + j;
        }
      }
    }
  }
  return numel;
}

// encodeAll at draw width b (rounding_bits), compiled for the widest instruction set the host allows.
uint64_t encodeRange(unsigned b, uint64_t n, const float* x, const sdk::PhiloxStream& rng, uint64_t g0,
                     uint8_t* exponents, uint64_t* signs) {
  switch (b) {
    case 8:
      return sdk::cpu::clones<encodeAll<8>>(n, x, rng, g0, exponents, signs);
    case 16:
      return sdk::cpu::clones<encodeAll<16>>(n, x, rng, g0, exponents, signs);
    default:
      return sdk::cpu::clones<encodeAll<24>>(n, x, rng, g0, exponents, signs);
  }
}

// The first exponent byte of 255 among n, or n.
uint64_t firstBadExponent(uint64_t n, const uint8_t* __restrict exponents) {
  for (uint64_t i0 = 0; i0 < n; i0 += kGroup) {
    uint32_t bad = 0;
    if (n - i0 >= kGroup) {
      for (unsigned j = 0; j < kGroup; ++j) bad |= exponents[i0 + j] == math::kBadExponent ? 1u : 0u;
    } else {
      for (uint64_t j = i0; j < n; ++j) bad |= exponents[j] == math::kBadExponent ? 1u : 0u;
    }
    if (bad != 0) {
      for (uint64_t j = 0;; ++j) {
        if (exponents[i0 + j] == math::kBadExponent) return i0 + j;
      }
    }
  }
  return n;
}

// out = (or +=) the values of exponents and signs firstBadExponent accepted.
void decodeAll(uint64_t numel, const uint8_t* __restrict exponents, const uint64_t* __restrict signs,
               float* __restrict out, bool accumulate) {
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const uint64_t word = signs[g];
    const uint8_t* eg = exponents + i0;
    float* o = out + i0;
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    if (len == kGroup) {
      // Constant-length loops, which vectorize: the signs spread to lanes first (32-bit halves: no 64-bit shifts).
      uint32_t sign[kGroup];
      const auto lo = static_cast<uint32_t>(word), hi = static_cast<uint32_t>(word >> 32);
      for (unsigned j = 0; j < 32; ++j) sign[j] = (lo >> j) & 1u;
      for (unsigned j = 0; j < 32; ++j) sign[32 + j] = (hi >> j) & 1u;
      if (accumulate) {
        for (unsigned j = 0; j < kGroup; ++j) o[j] += math::decodeValue(eg[j], sign[j]);
      } else {
        for (unsigned j = 0; j < kGroup; ++j) o[j] = math::decodeValue(eg[j], sign[j]);
      }
      continue;
    }
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeValue(eg[j], static_cast<uint32_t>(word >> j) & 1u);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeValue(eg[j], static_cast<uint32_t>(word >> j) & 1u);
    }
  }
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
    sizes.max_output_bytes = layoutFor(info.numel).total;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const uint64_t numel = args.info.numel;
    const std::span<const float> in = args.input<float>();
    sdk::ByteWriter w(args.output);
    writePrefix(w, args.info);
    const std::span<uint8_t> exponents = w.putArray<uint8_t>(numel);
    w.padTo(8);
    const std::span<uint64_t> signs = w.putArray<uint64_t>(layoutFor(numel).sign_words);
    const sdk::PhiloxStream rng(args.info.seed, args.info.step, args.info.tensor_id);
    // Ranges of whole 64-element groups (a sign word each) give the bytes of one thread.
    const uint64_t bad = sdk::firstFailure(numel, kGroup, threads_, [&](uint64_t begin, uint64_t end) {
      return begin + encodeRange(rounding_bits_, end - begin, in.data() + begin, rng, begin / kGroup,
                                 exponents.data() + begin, signs.data() + begin / kGroup);
    });
    if (bad != numel) {
      throw sdk::InvalidArgument("natural: gradient element " + std::to_string(bad) + " is " +
                                 sdk::formatNumber(in[bad]) +
                                 ": inf or NaN, or above 2^127 and rounded up past it (the largest f32 power of two)");
    }
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const uint64_t numel = args.info.numel;
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    const auto p = r.get<WireParams>("parameters");
    if (p.exponent_bits != kExponentBits || p.reserved0 != 0 || p.reserved1 != 0) {
      throw sdk::InvalidPayload("natural: payload parameters exponent bits=" + std::to_string(p.exponent_bits) +
                                ", reserved=" + std::to_string(p.reserved0) + ", " + std::to_string(p.reserved1) +
                                "; the format has exponent bits=8, reserved=0, 0");
    }
    const std::span<const uint8_t> exponents = r.getArray<uint8_t>(numel, "exponents");
    r.skipTo(8, "natural: after the exponents");
    const std::span<const uint64_t> signs = r.getArray<uint64_t>(layoutFor(numel).sign_words, "signs");
    r.expectEnd();
    if (numel % kGroup != 0 && (signs.back() >> (numel % kGroup)) != 0) {
      throw sdk::InvalidPayload("natural: nonzero padding bits after the last sign");
    }
    // Validated before anything is written: a refused payload leaves the output as it was.
    const uint64_t bad = sdk::cpu::clones<firstBadExponent>(numel, exponents.data());
    if (bad != numel) {
      throw sdk::InvalidPayload("natural: exponent " + std::to_string(bad) + " is 255, which no power of two has");
    }
    const std::span<float> out = args.output<float>();
    sdk::cpu::clones<decodeAll>(numel, exponents.data(), signs.data(), out.data(), args.accumulate);
  }

 private:
  static void writePrefix(sdk::ByteWriter& w, const terse_tensor_info_v1& info) {
    sdk::writeHeader(w, kFormat, info);
    w.put(WireParams{kExponentBits, 0, 0});
  }

#if TERSE_COMPRESSOR_CUDA
  static terse::compressors::natural::cuda::Shape deviceShape(uint64_t numel) {
    const Layout l = layoutFor(numel);
    return {numel, l.exponents, l.signs};
  }

  static device::Prefix prefixFor(const terse_tensor_info_v1& info) {
    return device::makePrefix([&](sdk::ByteWriter& w) { writePrefix(w, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t total = layoutFor(args.info.numel).total;
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
        args, status_, args.payload.size() == layoutFor(args.info.numel).total,
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
  unsigned rounding_bits_;  // draw width of the stochastic rounding; compress only (the payload does not change form)
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Natural, "natural",
                        "natural compression: stochastic rounding to a power of two, 9 bits (Horvath et al. 2019)",
                        "1.0.0");
