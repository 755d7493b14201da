// test_rounds: a 2-round SUM compressor that exercises the multi-round plumbing (prev, workspace) and is lossless, so
// a test can compare the decoded aggregate with the exact sum of the ranks' inputs.
//
// With W = world_size, n = numel and x_r the input of rank r (f32, host):
//   round 0:     payload = header "TRR0" + s_r = sum_i x_r[i] (accumulated in double, stored as f32).
//                The core sums it: prev of round 1 = header + S = sum_r s_r.
//   round 1:     c = nearbyint(S / (W * n)) (c = 0 when n == 0), the integer nearest the global mean, kept in the
//                workspace; payload = header "TRR1" + (x_r[i] - c) for every i. The core sums it: sum_r x_r[i] - W*c.
//   decompress:  out[i] (+)= aggregate[i] + W * c, with c read back from the workspace; for one rank's own payload
//                (source_rank >= 0, as error feedback decodes it) out[i] (+)= payload[i] + c, which is x_r[i].
// Mathematically out[i] = sum_r x_r[i], and the per-rank decodes sum to the aggregate's decode. c is an integer so
// that on integer-valued inputs of moderate size every f32 operation above is exact: that is what makes the test
// bit-exact; on other inputs the result is the sum up to f32 rounding. The workspace records which step and stage
// wrote it, so a core that loses it between rounds (the ABI keeps it from round 0's compress to the last decompress of
// the step) fails loudly; decompress only reads it, as the ABI requires. No state.
//
// Parameter fail_step = N (default -1: never): round 1's compress fails from step N on, on every rank -- a failure that
// happens between two rounds, which the hook's chained path meets on a collective's callback thread
// (tests/python/ddp_hook_test.py, chained_order).
// Parameter lax_deferred_prev = true plants a defect for the conformance suite: the deferred compress
// (terse/device_verdict_v1.h) takes any prev of the right size without checking its header and raises nothing.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

constexpr sdk::PayloadFormat kRound0{"test_rounds", sdk::fourcc("TRR0"), 1};
constexpr sdk::PayloadFormat kRound1{"test_rounds", sdk::fourcc("TRR1"), 1};

// The workspace, 16 bytes. stage: 1 after round 0's compress, 2 after round 1's.
struct Workspace {
  uint64_t step;
  float c;
  uint32_t stage;
};
static_assert(sizeof(Workspace) == 16);

class TestRounds final : public sdk::Compressor {
 public:
  TestRounds(sdk::Params& params, sdk::Host& /*host*/)
      : fail_step_(params.getInt("fail_step", -1, sdk::Range::atLeast(-1))),
        lax_deferred_prev_(params.getBool("lax_deferred_prev", false)) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_SUM;
    caps.wire_dtype = TERSE_DTYPE_F32;
    caps.flags = TERSE_CAP_FIXED_SIZE;
    caps.num_rounds = 2;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireF32(info.dtype);
    const uint64_t values = roundOf(info) == 0 ? 1 : info.numel;
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sdk::kPayloadHeaderBytes + sizeof(float) * values;
    sizes.workspace_bytes = sizeof(Workspace);
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireHost(args.info.device);
    const std::span<const float> in = args.input<float>();
    sdk::ByteWriter w(args.output);
    Workspace ws = load(args.workspace);
    if (roundOf(args.info) == 0) {
      if (!args.prev.empty())
        throw sdk::InvalidArgument("round 0 got a prev of " + std::to_string(args.prev.size()) + " bytes");
      double s = 0;
      for (float x : in) s += x;
      sdk::writeHeader(w, kRound0, args.info);
      w.put(static_cast<float>(s));
      ws = Workspace{args.info.step, 0.0f, 1};
    } else {
      expectStage(ws, args.info.step, 1, "round 1's compress");
      if (fail_step_ >= 0 && args.info.step >= static_cast<uint64_t>(fail_step_))
        throw sdk::InvalidArgument("round 1 fails from step " + std::to_string(fail_step_) +
                                   " on (fail_step), at step " + std::to_string(args.info.step));
      float total = 0;
      if (lax_deferred_prev_ && args.deferredVerdict() != nullptr) {
        // The defect lax_deferred_prev=true plants: the deferred call takes any prev of the right size at its word,
        // without its header's check, and raises nothing (conformance's deferred_verdicts must catch it).
        if (args.prev.size() >= sdk::kPayloadHeaderBytes + sizeof(float))
          std::memcpy(&total, args.prev.data() + sdk::kPayloadHeaderBytes, sizeof total);
      } else {
        sdk::ByteReader r(args.prev);
        sdk::readHeader(r, kRound0, args.info);
        total = r.get<float>("sum");
        r.expectEnd();
      }
      const double cells = static_cast<double>(args.info.world_size) * static_cast<double>(args.info.numel);
      ws.c = args.info.numel == 0 ? 0.0f : static_cast<float>(std::nearbyint(total / cells));
      ws.stage = 2;
      sdk::writeHeader(w, kRound1, args.info);
      std::span<float> out = w.putArray<float>(in.size());
      for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] - ws.c;
    }
    store(args.workspace, ws);
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireHost(args.info.device);
    if (args.info.round != 1) {
      throw sdk::InvalidArgument("decompress is for the last round (1), got round " + std::to_string(args.info.round));
    }
    const Workspace ws = load(args.workspace);
    expectStage(ws, args.info.step, 2, "decompress");
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kRound1, args.info);
    const std::span<const float> values = r.getArray<float>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    // The aggregate carries W offsets, one rank's own payload one.
    const double copies = args.info.source_rank < 0 ? static_cast<double>(args.info.world_size) : 1.0;
    const double back = copies * ws.c;
    std::span<float> out = args.output<float>();
    for (size_t i = 0; i < out.size(); ++i) {
      const auto v = static_cast<float>(values[i] + back);
      out[i] = args.accumulate ? out[i] + v : v;
    }
  }

 private:
  int64_t fail_step_;
  bool lax_deferred_prev_;

  static int roundOf(const terse_tensor_info_v1& info) {
    if (info.round != 0 && info.round != 1) {
      throw sdk::InvalidArgument("round must be 0 or 1, got " + std::to_string(info.round));
    }
    return info.round;
  }
  static void requireF32(terse_dtype_v1 dtype) {
    if (dtype != TERSE_DTYPE_F32)
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
  }
  static void requireHost(terse_device_v1 device) {
    if (device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory is supported");
  }

  static Workspace load(std::span<const std::byte> ws) {
    if (ws.size() < sizeof(Workspace)) {
      throw sdk::InvalidArgument("workspace of " + std::to_string(ws.size()) + " bytes, sizes() asked for " +
                                 std::to_string(sizeof(Workspace)));
    }
    Workspace w;
    std::memcpy(&w, ws.data(), sizeof w);
    return w;
  }
  static void store(std::span<std::byte> ws, const Workspace& w) { std::memcpy(ws.data(), &w, sizeof w); }

  static void expectStage(const Workspace& ws, uint64_t step, uint32_t stage, const char* who) {
    if (ws.step != step || ws.stage != stage) {
      throw sdk::InvalidArgument(std::string(who) + " of step " + std::to_string(step) +
                                 " found a workspace not prepared by the previous stage of that step (the core must "
                                 "keep it from round 0's compress to the last decompress)");
    }
  }
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TestRounds, "test_rounds", "test: 2-round lossless SUM (sum, then input minus mean)", "1.0.0");
