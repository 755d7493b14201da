// randomk: k coordinates chosen at random, the same ones on every rank, so the payloads can be summed.
//
// Paper: Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS 2018: the rand_k operator
//     rand_k(g)_i = g_i  if i is in the random k-subset omega,  0 otherwise            (Definition 2.1)
// with omega uniform among the k-subsets of [numel]. With `unbiased`, values are scaled by numel / k, the unbiased
// variant (Wangni et al., "Gradient Sparsification for Communication-Efficient Distributed Optimization", NeurIPS
// 2018, with uniform probabilities p_i = k / numel): E[decoded] = g. Error feedback is the core's decorator.
//
// omega is a function of (info.seed, info.step, info.tensor_id) only (randomk_math.h: the first k outputs of a
// Philox-keyed Feistel permutation of [0, numel)), and the plugin declares TERSE_CAP_SHARED_SEED, so every rank picks
// the same omega: the indices need not travel, and the k values can be summed elementwise by the core's allreduce
// (TERSE_AGG_SUM). The decoded aggregate is the sum over ranks of their values on omega; one rank's own payload
// decodes to its own contribution (error feedback's view). Fresh omega every step and for every tensor.
//
// Payload, SUM over f32 (sum_header_bytes = 16), fixed size:
//     header (16 B, magic "RNDK", version 1; identical on every rank, carried unsummed) | f32 values[k]
//     value j = s * g[pi(j)], s = numel / k with unbiased, 1 otherwise  -> 16 + 4k bytes.
// Values are not checked for being finite: the core sums them, and a sum of finite values may overflow.
//
// Parameters: ratio in (0, 1] (default 0.01), k = min(numel, max(1, round(ratio * numel))), 0 for numel = 0;
// unbiased (bool, default false). No workspace, no state: decompress recomputes pi(j) as compress did, so it needs
// nothing from the compress side. f32 gradients in host memory, any numel.
//
// CUDA (randomk.cu, when built with CUDA): device tensors give the host's payload byte for byte and decode to the
// host's floats bit for bit (one thread per coordinate computes pi(j) with the same integer math and Philox keys).
// Decompress synchronizes `stream` once, to learn the verdict on the header (terse/kit/device.hpp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "randomk_cuda.h"
#include "randomk_math.h"
#include "terse/kit/device.hpp"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace rk = terse::compressors::randomk;
namespace device = terse::kit::device;

constexpr const char* kName = "randomk";
constexpr sdk::PayloadFormat kFormat{kName, sdk::fourcc("RNDK"), 1};

// Calls visit(j, pi(j)) for j = 0 .. k-1 in order. The indices land anywhere in a tensor that is usually far larger
// than the caches, so each access would wait for DRAM on its own: computing kBatch indices first and prefetching their
// lines lets those misses overlap (about 2x on 64 MiB tensors). The order of the visits is unchanged, so are the bytes.
template <class Visit>
void forEachSelected(const rk::Permutation& pi, uint64_t k, const float* data, Visit visit) {
  constexpr uint64_t kBatch = 64;
  uint64_t index[kBatch];
  for (uint64_t j0 = 0; j0 < k; j0 += kBatch) {
    const uint64_t len = std::min(kBatch, k - j0);
    for (uint64_t t = 0; t < len; ++t) {
      index[t] = rk::selectedIndex(pi, j0 + t);
      __builtin_prefetch(data + index[t]);
    }
    for (uint64_t t = 0; t < len; ++t) visit(j0 + t, index[t]);
  }
}

class RandomK final : public sdk::Compressor {
 public:
  RandomK(sdk::Params& params, sdk::Host& /*host*/)
      : ratio_(params.getDouble("ratio", 0.01, sdk::Range::openClosed(0, 1))),
        unbiased_(params.getBool("unbiased", false)) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    return sdk::Caps::sum(TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE | TERSE_CAP_SHARED_SEED, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = payloadBytes(rk::targetCount(ratio_, info.numel));
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> g = args.input<float>();
    const uint64_t k = rk::targetCount(ratio_, g.size());
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, kFormat, args.info);
    const std::span<float> values = w.putArray<float>(static_cast<size_t>(k));
    if (k == 0) return w.offset();
    const rk::Permutation pi = rk::makePermutation(args.info.seed, args.info.step, args.info.tensor_id, g.size());
    const float scale = unbiased_ ? rk::unbiasedScale(g.size(), k) : 1.0f;
    forEachSelected(pi, k, g.data(), [&](uint64_t j, uint64_t i) { values[j] = scale * g[i]; });
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const uint64_t k = rk::targetCount(ratio_, args.info.numel);
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    if (args.payload.size() != payloadBytes(k)) {
      throw sdk::InvalidPayload(std::string(kName) + ": payload of " + std::to_string(args.payload.size()) +
                                " bytes, expected " + std::to_string(payloadBytes(k)) + " (k = " + std::to_string(k) +
                                " of " + std::to_string(args.info.numel) + " elements)");
    }
    const std::span<const float> values = r.getArray<float>(static_cast<size_t>(k), "values");
    r.expectEnd();
    const std::span<float> out = args.output<float>();
    if (!args.accumulate) {
      for (float& x : out) x = 0.0f;
    }
    if (k == 0) return;
    const rk::Permutation pi = rk::makePermutation(args.info.seed, args.info.step, args.info.tensor_id, out.size());
    forEachSelected(pi, k, out.data(), [&](uint64_t j, uint64_t i) { out[i] += values[j]; });
  }

 private:
  static uint64_t payloadBytes(uint64_t k) {
    return sdk::kPayloadHeaderBytes + sizeof(float) * k;
  }

  static void requireF32(terse_dtype_v1 dtype) {
    if (dtype != TERSE_DTYPE_F32) {
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
    }
  }
  static void check(const terse_tensor_info_v1& info) {
    requireF32(info.dtype);
    if (info.device != TERSE_DEVICE_HOST && !(info.device == TERSE_DEVICE_CUDA && device::kBuilt)) {
      throw sdk::Unsupported("only host memory is supported");
    }
  }

#if TERSE_COMPRESSOR_CUDA
  static device::Prefix prefix(const terse_tensor_info_v1& info) {
    return device::makePrefix([&](sdk::ByteWriter& w) { sdk::writeHeader(w, kFormat, info); });
  }

  // The permutation compress and decompress walk; none for an empty tensor (k = 0: nothing is selected).
  static rk::Permutation permutation(const terse_tensor_info_v1& info) {
    if (info.numel == 0) return rk::Permutation{};
    return rk::makePermutation(info.seed, info.step, info.tensor_id, info.numel);
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t numel = args.info.numel;
    const uint64_t k = rk::targetCount(ratio_, numel);
    device::requireCapacity(args.output, payloadBytes(k), kName);
    const device::Scope scope(args.info);
    const float scale = unbiased_ ? rk::unbiasedScale(numel, k) : 1.0f;
    rk::cuda::compress(prefix(args.info), args.input<float>().data(), permutation(args.info), k, scale,
                       args.output.data(), args.stream);
    return payloadBytes(k);
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const uint64_t k = rk::targetCount(ratio_, args.info.numel);
    device::checkedDecompress(
        args, status_, args.payload.size() == payloadBytes(k),
        [&](uint32_t* status) { rk::cuda::validate(prefix(args.info), args.payload.data(), status, args.stream); },
        [&](const uint32_t* gate) {
          rk::cuda::decode(args.payload.data(), permutation(args.info), k, args.output<float>().data(), args.accumulate,
                           args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); }, device::OwnPayload::kTrust);
  }

  mutable device::StatusWords status_;
#endif

  double ratio_;
  bool unbiased_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(RandomK, "randomk",
                        "k shared random coordinates (ratio, unbiased), values summed across ranks, indices not sent",
                        "1.0.0");
