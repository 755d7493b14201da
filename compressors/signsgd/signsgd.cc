// signsgd: signSGD with majority vote (Bernstein, Zhao, Azizzadenesheli, Anandkumar, "signSGD with Majority Vote is
// Communication Efficient and Fault Tolerant", ICLR 2019; Bernstein, Wang, Azizzadenesheli, Anandkumar, "signSGD:
// Compressed Optimisation for Non-Convex Problems", ICML 2018).
//
// Each worker m sends sign(g_m), one bit per element; the server (here: a CUSTOM reduce that every rank folds) sums
// the votes and every worker applies
//
//   x <- x - lr * sign( sum_m sign(g_m) )                                          (majority vote, Algorithm 1)
//
// so the aggregate must reach the optimizer as scale * sign(sum of votes). The ABI's aggregate is the SUM of the
// contributions that the core divides by world_size, so the fully reduced payload of V = world_size voters decodes to
// V * scale * sign(c_i), c_i = the vote count; after the core's averaging that is scale * sign(c_i). A tie (c_i = 0,
// possible with an even number of voters) decodes to 0: no majority, no step. One rank's raw payload decodes to its
// own contribution scale * sign(g_i), what error feedback needs. The bit is the IEEE sign bit: +0 votes +1, -0 votes
// -1 (one bit has no room for 0).
//
// Parameters:
//   scale  the magnitude of one vote, > 0 (default 1). The paper applies the learning rate to the sign itself, so 1
//          (the optimizer's lr does the scaling) is the natural choice; another value rescales the step.
//
// Payloads (CUSTOM aggregation; raw payloads are fixed size). Both start with
//   [0, 16)   sdk::PayloadHeader {magic "SIGN", version 1, dtype f32, numel N}
//   [16, 32)  u32 kind (1 raw, 2 reduced), u32 voters V, u32 count bytes (raw 0; reduced 1, 2 or 4), f32 scale
// raw (compress; V = 1), 32 + 8 ceil(N / 64) bytes:
//   [32, end) ceil(N / 64) u64 words of sign bits (bitpack width 1): bit i % 64 of word i / 64 is g_i's sign bit;
//             the bits are N/8 bytes rounded up to whole 8-byte words, the padding zero
// reduced (reduce; 2 <= V <= world_size), 32 + 8 ceil(N b / 8) bytes:
//   [32, end) N signed vote counts c_i of b = 1 (world_size <= 127), 2 (<= 32767) or 4 bytes, |c_i| <= V and c_i of
//             V's parity, then zero padding to a multiple of 8 bytes
// reduce accepts raw + raw, raw + reduced and reduced + reduced in either order (counts add; voters add, never past
// world_size) and always writes a reduced payload, so max_reduced_bytes = 32 + 8 ceil(N b / 8). decompress takes a
// raw payload for one rank (source_rank >= 0, or the aggregate when world_size is 1) and a reduced one only as the
// aggregate of all world_size voters (source_rank = -1). Host memory, f32 gradients; NaN inputs are refused (they have
// no sign to vote with).
//
// CUDA (signsgd.cu, when built with CUDA): device tensors give the host's payloads, aggregates and values bit for bit
// (the same sign bits and integer votes). What differs is waiting: compress cannot refuse a NaN without reading back
// from the device, so it marks the payload as kind 0 instead, which every decompress and reduce refuses as
// InvalidPayload. decompress knows from the call which prefix to expect, so it checks the whole payload on the device
// and synchronizes `stream` once for the verdict, or not at all when the core defers the verdict
// (terse/device_verdict_v1.h). reduce reads its inputs' prefixes on the device too (their kinds and voters decide what
// to check and how to fold) and synchronizes once for the verdict (terse/kit/device.hpp).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "signsgd_cuda.h"
#include "signsgd_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/kit/sign_bits.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/bitpack.hpp"

namespace {

namespace sdk = terse::sdk;
namespace bitpack = terse::sdk::bitpack;
namespace math = terse::compressors::signsgd;

constexpr sdk::PayloadFormat kFormat{"signsgd", sdk::fourcc("SIGN"), 1};
constexpr unsigned kGroup = bitpack::kGroup;
constexpr uint32_t kRaw = 1;
constexpr uint32_t kReduced = 2;

struct WireBlock {
  uint32_t kind;
  uint32_t voters;
  uint32_t count_bytes;
  float scale;
};
static_assert(sizeof(WireBlock) == 16);
// signsgd.cu reads prefixes on the device with these offsets and kinds.
static_assert(terse::sdk::kPayloadHeaderBytes == 16 && terse::sdk::kPayloadHeaderBytes + offsetof(WireBlock, voters) ==
                                                           terse::compressors::signsgd::cuda::kVotersOffset);
static_assert(kRaw == terse::compressors::signsgd::cuda::kRawKind &&
              kReduced == terse::compressors::signsgd::cuda::kReducedKind);
constexpr uint64_t kPrefixBytes = sdk::kPayloadHeaderBytes + sizeof(WireBlock);

namespace device = terse::kit::device;
namespace kernels = terse::compressors::signsgd::cuda;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
  if (info.world_size < 1) throw sdk::InvalidArgument("world_size " + std::to_string(info.world_size) + " < 1");
}

// Packs the sign bits; returns numel, or the index of the first NaN.
uint64_t signsAll(uint64_t numel, const float* __restrict x, uint64_t* __restrict words) {
  uint32_t codes[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, numel - i0));
    uint32_t nan = 0;
    if (len == kGroup) {
      for (unsigned j = 0; j < kGroup; ++j) nan |= math::isNan(x[i0 + j]);
      words[g] = terse::kit::signBits64(x + i0);
    } else {
      for (unsigned j = 0; j < len; ++j) {
        codes[j] = math::signBit(x[i0 + j]);
        nan |= math::isNan(x[i0 + j]);
      }
      bitpack::packTail<1>(codes, len, words + g);
    }
    if (nan != 0) {
      for (unsigned j = 0;; ++j) {
        if (math::isNan(x[i0 + j])) return i0 + j;
      }
    }
  }
  return numel;
}

// One rank's raw payload decoded: scale * sign per element. Full groups run loops of constant length, which
// vectorize (2.3x the per-element loop a short group needs, at 64 MiB).
void signsToValues(uint64_t numel, float scale, const uint64_t* __restrict words, float* __restrict out,
                   bool accumulate) {
  uint32_t bits[kGroup];
  for (uint64_t i0 = 0, g = 0; i0 < numel; i0 += kGroup, ++g) {
    float* o = out + i0;
    if (numel - i0 >= kGroup) {
      bitpack::unpackGroup<1>(words + g, bits);
      if (accumulate) {
        for (unsigned j = 0; j < kGroup; ++j) o[j] += math::decodeSign(bits[j], scale);
      } else {
        for (unsigned j = 0; j < kGroup; ++j) o[j] = math::decodeSign(bits[j], scale);
      }
      continue;
    }
    const unsigned len = static_cast<unsigned>(numel - i0);
    bitpack::unpackTail<1>(words + g, len, bits);
    if (accumulate) {
      for (unsigned j = 0; j < len; ++j) o[j] += math::decodeSign(bits[j], scale);
    } else {
      for (unsigned j = 0; j < len; ++j) o[j] = math::decodeSign(bits[j], scale);
    }
  }
}

// One validated payload, raw or reduced.
struct Parsed {
  WireBlock block;
  std::span<const uint64_t> words;    // raw
  std::span<const std::byte> counts;  // reduced: numel counts of block.count_bytes each
};

// The counts section starts at byte 32 of a buffer the ABI aligns to 16 bytes, so it is aligned for int8..int32.
template <class T>
T countAt(std::span<const std::byte> counts, uint64_t i) {
  return reinterpret_cast<const T*>(counts.data())[i];
}

class SignSgd final : public sdk::Compressor {
 public:
  SignSgd(sdk::Params& params, sdk::Host& /*host*/)
      : scale_(static_cast<float>(params.getDouble("scale", 1.0, sdk::Range::greaterThan(0)))) {
    if (!(scale_ > 0.0f && scale_ <= FLT_MAX)) {
      throw sdk::InvalidArgument("signsgd: 'scale' must be a positive number within the range of f32, got " +
                                 sdk::formatNumber(scale_));
    }
  }

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    terse::kit::requireF32(dtype);
    return sdk::Caps::custom(TERSE_CAP_FIXED_SIZE, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireSupported(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = rawBytes(info.numel);
    sizes.max_reduced_bytes = std::max(sizes.max_output_bytes, reducedBytes(info));
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> in = args.input<float>();
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, kFormat, args.info);
    w.put(WireBlock{kRaw, 1, 0, scale_});
    const std::span<uint64_t> words = w.putArray<uint64_t>(bitpack::wordCount(args.info.numel, 1));
    const uint64_t nan = sdk::cpu::clones<signsAll>(args.info.numel, in.data(), words.data());
    if (nan != args.info.numel) {
      throw sdk::InvalidArgument("signsgd: gradient element " + std::to_string(nan) + " is NaN, which has no sign");
    }
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    const terse_tensor_info_v1& info = args.info;
    requireSupported(info);
#if TERSE_COMPRESSOR_CUDA
    if (info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const Parsed p = parse(args.payload, info, "payload");
    const std::span<float> out = args.output<float>();
    if (p.block.kind == kRaw) {
      if (info.source_rank < 0 && info.world_size != 1) {
        throw sdk::InvalidPayload("signsgd: a raw payload carries 1 vote, but the aggregate of world_size " +
                                  std::to_string(info.world_size) + " needs " + std::to_string(info.world_size));
      }
      decodeRaw(p.words.data(), info.numel, out.data(), args.accumulate);
      return;
    }
    if (info.source_rank >= 0) {
      throw sdk::InvalidPayload("signsgd: a reduced payload (" + std::to_string(p.block.voters) +
                                " voters) is not one rank's payload (source_rank " + std::to_string(info.source_rank) +
                                ")");
    }
    if (p.block.voters != static_cast<uint32_t>(info.world_size)) {
      throw sdk::InvalidPayload("signsgd: the aggregate holds " + std::to_string(p.block.voters) +
                                " voters, but world_size is " + std::to_string(info.world_size));
    }
    const int32_t voters = static_cast<int32_t>(p.block.voters);
    const float magnitude = static_cast<float>(voters) * scale_;
    switch (p.block.count_bytes) {
      case 1:
        decodeCounts<int8_t>(p.counts, info.numel, voters, magnitude, out.data(), args.accumulate);
        break;
      case 2:
        decodeCounts<int16_t>(p.counts, info.numel, voters, magnitude, out.data(), args.accumulate);
        break;
      default:
        decodeCounts<int32_t>(p.counts, info.numel, voters, magnitude, out.data(), args.accumulate);
        break;
    }
  }

  uint64_t reduce(const sdk::ReduceArgs& args) const override {
    const terse_tensor_info_v1& info = args.info;
    requireSupported(info);
#if TERSE_COMPRESSOR_CUDA
    if (info.device == TERSE_DEVICE_CUDA) return reduceDevice(args);
#endif
    const Parsed a = parse(args.a, info, "reduce input a");
    const Parsed b = parse(args.b, info, "reduce input b");
    const uint64_t voters = uint64_t{a.block.voters} + b.block.voters;
    if (voters > static_cast<uint64_t>(info.world_size)) {
      throw sdk::InvalidPayload("signsgd: reduce inputs hold " + std::to_string(a.block.voters) + " + " +
                                std::to_string(b.block.voters) + " voters, more than world_size " +
                                std::to_string(info.world_size));
    }
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, kFormat, info);
    const uint32_t width = math::countBytes(info.world_size);
    w.put(WireBlock{kReduced, static_cast<uint32_t>(voters), width, scale_});
    switch (width) {
      case 1:
        fold(a, b, w.putArray<int8_t>(info.numel));
        break;
      case 2:
        fold(a, b, w.putArray<int16_t>(info.numel));
        break;
      default:
        fold(a, b, w.putArray<int32_t>(info.numel));
        break;
    }
    w.padTo(8);
    return w.offset();
  }

 private:
  static uint64_t rawBytes(uint64_t numel) {
    return kPrefixBytes + 8 * bitpack::wordCount(numel, 1);
  }
  static uint64_t reducedBytes(const terse_tensor_info_v1& info) {
    return kPrefixBytes + (info.numel * math::countBytes(info.world_size) + 7) / 8 * 8;
  }

  // Checks everything but the counts' values (checked where they are read, before anything depends on them). Any
  // failure names which input it was ("reduce input b: ...").
  Parsed parse(std::span<const std::byte> payload, const terse_tensor_info_v1& info, const char* what) const {
    const std::string who = std::string("signsgd: ") + what + ": ";
    try {
      return parseUnlabelled(payload, info);
    } catch (const sdk::InvalidPayload& e) {
      const std::string_view m = e.what();
      const std::string_view own = "signsgd: ";
      throw sdk::InvalidPayload(who + std::string(m.starts_with(own) ? m.substr(own.size()) : m));
    }
  }

  Parsed parseUnlabelled(std::span<const std::byte> payload, const terse_tensor_info_v1& info) const {
    sdk::ByteReader r(payload);
    sdk::readHeader(r, kFormat, info);
    Parsed p{};
    p.block = r.get<WireBlock>("kind, voters, count bytes, scale");
    if (p.block.scale != scale_) {
      throw sdk::InvalidPayload("made with scale " + sdk::formatNumber(p.block.scale) + ", this instance has scale " +
                                sdk::formatNumber(scale_));
    }
    if (p.block.kind == kRaw) {
      if (p.block.voters != 1 || p.block.count_bytes != 0) {
        throw sdk::InvalidPayload("a raw payload must say 1 voter and 0 count bytes, not " +
                                  std::to_string(p.block.voters) + " and " + std::to_string(p.block.count_bytes));
      }
      p.words = r.getArray<uint64_t>(bitpack::wordCount(info.numel, 1), "sign bits");
      r.expectEnd();
      if (!bitpack::paddingIsZero(p.words.data(), info.numel, 1)) {
        throw sdk::InvalidPayload("nonzero padding bits after the last sign bit");
      }
      return p;
    }
    if (p.block.kind == kernels::kPoisonedKind) {
      throw sdk::InvalidPayload(
          "payload kind 0: the gradient it was made from holds a NaN, which has no sign to vote with (compress on "
          "CUDA marks the payload instead of waiting for the device to refuse the input)");
    }
    if (p.block.kind != kReduced) {
      throw sdk::InvalidPayload("unknown payload kind " + std::to_string(p.block.kind) + " (1 raw, 2 reduced)");
    }
    if (p.block.voters < 2 || p.block.voters > static_cast<uint32_t>(info.world_size)) {
      throw sdk::InvalidPayload("a reduced payload of " + std::to_string(p.block.voters) +
                                " voters; expected 2 .. world_size " + std::to_string(info.world_size));
    }
    const uint32_t width = math::countBytes(info.world_size);
    if (p.block.count_bytes != width) {
      throw sdk::InvalidPayload("vote counts of " + std::to_string(p.block.count_bytes) + " bytes; world_size " +
                                std::to_string(info.world_size) + " uses " + std::to_string(width));
    }
    p.counts = r.take(info.numel * width, "vote counts");
    r.skipTo(8, "after the vote counts");
    r.expectEnd();
    return p;
  }

  // Counts of one input for elements [i0, i0 + len) into dst, checking reduced counts as they are read.
  template <class T>
  static void loadVotes(const Parsed& p, uint64_t i0, unsigned len, int32_t* dst) {
    if (p.block.kind == kRaw) {
      uint32_t bits[kGroup];
      if (len == kGroup) {
        bitpack::unpackGroup<1>(p.words.data() + i0 / kGroup, bits);
      } else {
        bitpack::unpackTail<1>(p.words.data() + i0 / kGroup, len, bits);
      }
      for (unsigned j = 0; j < len; ++j) dst[j] = math::vote(bits[j]);
      return;
    }
    const int32_t voters = static_cast<int32_t>(p.block.voters);
    bool bad = false;
    for (unsigned j = 0; j < len; ++j) {
      dst[j] = countAt<T>(p.counts, i0 + j);
      bad |= !math::countIsValid(dst[j], voters);
    }
    if (bad) {
      for (unsigned j = 0;; ++j) {
        if (!math::countIsValid(dst[j], voters)) {
          throw sdk::InvalidPayload("signsgd: vote count " + std::to_string(dst[j]) + " of element " +
                                    std::to_string(i0 + j) + " is impossible for " + std::to_string(voters) +
                                    " voters");
        }
      }
    }
  }

  template <class T>
  static void fold(const Parsed& a, const Parsed& b, std::span<T> out) {
    int32_t va[kGroup], vb[kGroup];
    for (uint64_t i0 = 0; i0 < out.size(); i0 += kGroup) {
      const unsigned len = static_cast<unsigned>(std::min<uint64_t>(kGroup, out.size() - i0));
      loadVotes<T>(a, i0, len, va);
      loadVotes<T>(b, i0, len, vb);
      for (unsigned j = 0; j < len; ++j) out[i0 + j] = static_cast<T>(va[j] + vb[j]);  // |sum| <= world_size fits
    }
  }

  void decodeRaw(const uint64_t* words, uint64_t numel, float* out, bool accumulate) const {
    sdk::cpu::clones<signsToValues>(numel, scale_, words, out, accumulate);
  }

  // Validates every count before writing any output, so a bad aggregate leaves the output untouched.
  template <class T>
  static void decodeCounts(std::span<const std::byte> counts, uint64_t numel, int32_t voters, float magnitude,
                           float* out, bool accumulate) {
    const T* c = reinterpret_cast<const T*>(counts.data());
    bool bad = false;
    for (uint64_t i = 0; i < numel; ++i) bad |= !math::countIsValid(c[i], voters);
    if (bad) {
      for (uint64_t i = 0;; ++i) {
        if (!math::countIsValid(c[i], voters)) {
          throw sdk::InvalidPayload("signsgd: vote count " + std::to_string(c[i]) + " of element " + std::to_string(i) +
                                    " is impossible for " + std::to_string(voters) + " voters");
        }
      }
    }
    if (accumulate) {
      for (uint64_t i = 0; i < numel; ++i) out[i] += math::decodeCount(c[i], magnitude);
    } else {
      for (uint64_t i = 0; i < numel; ++i) out[i] = math::decodeCount(c[i], magnitude);
    }
  }

#if TERSE_COMPRESSOR_CUDA
  device::Prefix prefixFor(const terse_tensor_info_v1& info, const WireBlock& block) const {
    return device::makePrefix([&](sdk::ByteWriter& w) {
      sdk::writeHeader(w, kFormat, info);
      w.put(block);
    });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t total = rawBytes(args.info.numel);
    device::requireCapacity(args.output, total, "signsgd");
    const device::Scope scope(args.info);
    kernels::compress(prefixFor(args.info, WireBlock{kRaw, 1, 0, scale_}), args.input<float>().data(), args.info.numel,
                      args.output.data(), args.stream);
    return total;
  }

  // Which payload decompress takes follows from the call alone (see the top of this file): one rank's raw payload, or
  // the reduced aggregate of all world_size voters (a raw payload when world_size is 1). So its whole prefix is known
  // and checked on the device with its sections: nothing is read back, and a deferred call waits for nothing.
  void decompressDevice(const sdk::DecompressArgs& args) const {
    const terse_tensor_info_v1& info = args.info;
    const bool raw = info.source_rank >= 0 || info.world_size == 1;
    const WireBlock block =
        raw ? WireBlock{kRaw, 1, 0, scale_}
            : WireBlock{kReduced, static_cast<uint32_t>(info.world_size), math::countBytes(info.world_size), scale_};
    const uint64_t bytes = raw ? rawBytes(info.numel) : reducedBytes(info);
    device::checkedDecompress(
        args, status_, args.payload.size() == bytes,
        [&](uint32_t* status) {
          kernels::validate(prefixFor(info, block), args.payload.data(), info.numel, block.count_bytes,
                            static_cast<int32_t>(block.voters), status, args.stream);
        },
        [&](const uint32_t* gate) {
          float* out = args.output<float>().data();
          if (raw) {
            kernels::decodeRaw(args.payload.data(), info.numel, scale_, out, args.accumulate, args.stream, gate);
          } else {
            kernels::decodeCounts(args.payload.data(), info.numel, block.count_bytes,
                                  static_cast<float>(block.voters) * scale_, out, args.accumulate, args.stream, gate);
          }
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  // The inputs' kinds and voters decide what to check and how to fold, and either input may be raw or reduced, so the
  // device reads them from the prefixes (validatePair, fold): nothing is copied back, and the verdict costs one
  // synchronization. A size that is neither kind's gets the host's verdict at once.
  uint64_t reduceDevice(const sdk::ReduceArgs& args) const {
    const terse_tensor_info_v1& info = args.info;
    const device::Scope scope(info);
    const uint64_t raw = rawBytes(info.numel), reduced = reducedBytes(info);
    const auto sized = [&](std::span<const std::byte> p) { return p.size() == raw || p.size() == reduced; };
    // A short output, like a size of neither kind, gets the host's verdict on the whole call.
    if (sized(args.a) && sized(args.b) && args.output.size() >= reduced) {
      kernels::ReduceCheck check{};
      check.header = device::makePrefix([&](sdk::ByteWriter& w) { sdk::writeHeader(w, kFormat, info); });
      std::memcpy(&check.scale_bits, &scale_, sizeof check.scale_bits);
      check.world = info.world_size;
      check.width = math::countBytes(info.world_size);
      check.numel = info.numel;
      check.raw_bytes = raw;
      check.reduced_bytes = reduced;
      const auto status = status_.acquire();
      status.clear();
      kernels::validatePair(check, args.a.data(), args.a.size(), args.b.data(), args.b.size(), status.device(),
                            args.stream);
      device::synchronize(args.stream);
      if (!status.raised()) {
        // The voters are the one field of the output's prefix the host does not know: the kernel writes them.
        kernels::fold(prefixFor(info, WireBlock{kReduced, 0, check.width, scale_}), check, args.a.data(), args.b.data(),
                      args.output.data(), reduced, args.stream);
        return reduced;
      }
    }
    device::rethrowHostReduceVerdict(args, [this](const sdk::ReduceArgs& host) { return reduce(host); });
  }

  mutable device::StatusWords status_;
#endif

  float scale_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(SignSgd, "signsgd", "signSGD with majority vote: 1-bit signs, votes summed by reduce", "1.0.0");
