// The checks of what a plugin's outputs hold, beyond their size: a decode of finite inputs is finite everywhere
// (finite_decode), and every payload byte is written, so that payloads are deterministic and byte-comparable
// (zero_padding).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/conformance/checks.h"
#include "core/conformance/message.h"

namespace terse::conformance {
namespace {

// The largest magnitude a SUM payload of this wire dtype can carry: a plugin whose wire is f16 sends f16 values by
// contract, so an input beyond 65504 has no finite encoding and becoming infinity is the documented cast, not a defect.
// (Allgather and CUSTOM payloads are the plugin's own bytes: nothing in the caps bounds them.)
double wireLimit(const CompressorCaps& caps) {
  if (caps.aggregation != Aggregation::kSum) return FLT_MAX;
  if (caps.wire_dtype == DType::kF16) return 65504.0;
  if (caps.wire_dtype == DType::kBF16) return 0x1.fep127;  // the largest finite bfloat16
  return FLT_MAX;
}

// Normal values scaled so that the largest magnitude is exactly m: in f32 (FLT_MAX = 3.4e38) a square, a sum of a few
// elements or a division by a small step overflows well below that, which is the defect this looks for.
Floats scaledTo(uint64_t numel, uint64_t seed, double m) {
  Floats x = normalInput(numel, seed);
  double top = 0;
  for (float v : x) top = std::max(top, static_cast<double>(std::abs(v)));
  if (top == 0) return x;
  for (auto& v : x) v = static_cast<float>(static_cast<double>(v) / top * m);
  return x;
}

std::string magnitude(double m) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", m);
  return text;
}

struct Input {
  std::string name;
  Floats x;
  // Whether a clear refusal is an answer: a plugin whose payload holds a norm or a scale in f32 cannot encode a tensor
  // whose norm exceeds 3.4e38 (512 elements of 1e30 already do), and saying so (INVALID_ARGUMENT or UNSUPPORTED) is
  // honest; a silent infinity is not. A device codec that does not wait on its stream says it one step later: compress
  // writes the non-finite norm, and every decompress of that payload refuses it (INVALID_PAYLOAD), the sender's own
  // included (qsgd.cc, onebit.cc, powersgd.cc say why). Normal and subnormal inputs must always be encoded.
  bool may_refuse = false;
};

std::vector<Input> extremeInputs(uint64_t numel, uint64_t seed, double limit) {
  std::vector<Input> out;
  out.push_back({"N(0, 1)", normalInput(numel, seed)});
  std::vector<double> tops;
  for (double m : {1e30, 3e38}) {
    const double t = std::min(m, limit);
    if (std::find(tops.begin(), tops.end(), t) == tops.end()) tops.push_back(t);
  }
  for (double m : tops) {
    out.push_back({"normal, max |x| = " + magnitude(m), scaledTo(numel, seed + 1, m), true});
    // Every element at the top: a bucket's sum, mean or squared norm taken in f32 overflows here first.
    out.push_back({"every element " + magnitude(m), Floats(numel, static_cast<float>(m)), true});
  }
  // Subnormal floats (below 2^-126 = 1.2e-38): a scale computed as 1 / max |x| overflows to infinity on them.
  Floats denormal = normalInput(numel, seed + 2);
  for (auto& v : denormal) v *= 1e-39f;
  out.push_back({"subnormal (|x| ~ 1e-39)", std::move(denormal), false});
  Floats mixed = scaledTo(numel, seed + 3, tops.back());
  for (std::size_t i = 1; i < mixed.size(); i += 2) mixed[i] *= static_cast<float>(1e-39 / tops.back());
  out.push_back({"subnormals and max |x| = " + magnitude(tops.back()) + " alternating", std::move(mixed), true});
  return out;
}

}  // namespace

Outcome checkFiniteDecode(Context& c) {
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const double wire = wireLimit(c.caps);
  const double limit = std::min(wire, c.options.finite_input_limit.value_or(FLT_MAX));
  std::size_t runs = 0;
  std::vector<std::string> refused;
  for (const auto& shape : shapes) {
    const auto inputs = extremeInputs(shape.numel, c.inputSeed(shape, 18), limit);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      Simulation sim = c.sim(shape, 1);  // fresh per input: a refused compress leaves nothing half done behind
      Step s;
      try {
        s = sim.runOne(i, inputs[i].x);
      } catch (const Error& e) {
        const bool refusal = dynamic_cast<const InvalidArgument*>(&e) || dynamic_cast<const Unsupported*>(&e) ||
                             dynamic_cast<const InvalidPayload*>(&e);
        if (!refusal || !inputs[i].may_refuse) {
          throw Violation(cat(tag(shape), ", input '", inputs[i].name, "': ", e.what()));
        }
        if (refused.size() < 2) refused.push_back(cat("'", inputs[i].name, "' (", e.what(), ")"));
        continue;
      }
      ++runs;
      for (const Floats* decoded : {&s.own[0], &s.result[0]}) {
        const auto bad = std::find_if(decoded->begin(), decoded->end(), [](float v) { return !std::isfinite(v); });
        if (bad == decoded->end()) continue;
        const auto at = static_cast<std::size_t>(bad - decoded->begin());
        return fail(cat(tag(shape), ", input '", inputs[i].name, "': element ", at, " decodes to ", *bad,
                        " from the finite input ", inputs[i].x[at],
                        "; a decode of finite values must be finite (compute scales and norms so they cannot "
                        "overflow, e.g. in double or after dividing by the largest magnitude)"));
      }
    }
  }
  std::string range = "the f32 range";
  if (limit < FLT_MAX) {
    range = cat("|x| <= ", magnitude(limit),
                limit == wire ? cat(" (the largest ", dtypeName(c.caps.wire_dtype), " the SUM wire carries)")
                              : std::string(" (the limit given)"));
  }
  std::string refusals;
  for (const auto& r : refused) refusals += (refusals.empty() ? "; refused with an error, as it may: " : ", ") + r;
  return pass(cat(runs, " decodes of finite inputs within ", range,
                  " (normal, max |x| 1e30 and 3e38, constant, subnormal, mixed) were finite everywhere, ",
                  shapes.size(), " shape(s)", refusals));
}

Outcome checkZeroPadding(Context& c) {
  std::vector<ConformanceShape> shapes = c.probes();
  // The smallest tensor leaves the most unused bits in a last partially filled word.
  if (auto small = c.smallest(); small && std::none_of(shapes.begin(), shapes.end(), [&](const ConformanceShape& s) {
                                   return s.label() == small->label();
                                 })) {
    shapes.push_back(*small);
  }
  if (shapes.empty()) return skip("no nonempty shape");
  const int w = c.options.world_size;
  std::size_t payloads = 0;
  for (const auto& shape : shapes) {
    // One compression each into output buffers filled with 0x00 and with 0xFF beforehand: a byte the plugin leaves
    // unwritten reads back as the fill, so the two payloads differ exactly there, whatever the format.
    const uint64_t id = c.tensorId();
    // A third into zeros again tells a payload that differs anyway (the deterministic check's business) from one that
    // shows its buffer.
    Simulation a(c.instance, c.memory, shape, w, c.options.seed, id);
    Simulation b(c.instance, c.memory, shape, w, c.options.seed, id);
    Simulation again(c.instance, c.memory, shape, w, c.options.seed, id);
    a.fillOutputs(std::byte{0x00});
    b.fillOutputs(std::byte{0xFF});
    again.fillOutputs(std::byte{0x00});
    const RankInputs in = rankInputs(c, shape, 19, w);
    Bytes prev_a, prev_b;
    for (int r = 0; r < a.rounds(); ++r) {
      std::vector<Bytes> pa, pb;
      for (int k = 0; k < w; ++k) {
        const Floats& x = *in.pointers[static_cast<std::size_t>(k)];
        pa.push_back(a.compress(k, 0, r, x, prev_a));
        pb.push_back(b.compress(k, 0, r, x, prev_b));
        ++payloads;
        if (firstByteDifference(pa.back(), again.compress(k, 0, r, x, prev_a)) >= 0) {
          return skip(cat(tag(shape), ", round ", r, ", rank ", k,
                          ": two compressions into zeroed buffers already differ, so the buffer's part cannot be told "
                          "apart (see deterministic)"));
        }
        if (int64_t at = firstByteDifference(pa.back(), pb.back()); at >= 0) {
          const auto i = static_cast<std::size_t>(at);
          return fail(cat(tag(shape), ", round ", r, ", rank ", k, ": byte ", at, " of the ", pa.back().size(),
                          "-byte payload depends on what the output buffer held before compress (",
                          i < pa.back().size() ? static_cast<int>(pa.back()[i]) : -1, " over zeros, ",
                          i < pb.back().size() ? static_cast<int>(pb.back()[i]) : -1,
                          " over 0xFF): bytes that carry no information (padding bits after packed codes, reserved "
                          "header fields, alignment padding) must be written as zero"));
        }
      }
      if (!a.aggregated()) continue;
      // A CUSTOM reduce writes a payload too (the fills apply to its output as well); a SUM adds what is there.
      prev_a = a.aggregate(0, r, pa);
      prev_b = b.aggregate(0, r, pb);
      if (int64_t at = firstByteDifference(prev_a, prev_b); at >= 0) {
        return fail(cat(tag(shape), ", round ", r, ": byte ", at, " of the ", aggregationText(c.caps),
                        " aggregate depends on what the reduce output buffer held before the call: unused bytes "
                        "must be written as zero"));
      }
    }
  }
  return pass(cat(payloads, " payloads", c.caps.aggregation == Aggregation::kCustom ? " and their reductions" : "",
                  " compressed into output buffers prefilled with 0x00 and with 0xFF were byte-identical (", w,
                  " ranks, every round, ", shapes.size(), " shape(s)): no byte is left unwritten"));
}

Outcome checkIdentity(Context& c) {
  if (!c.caps.identity) return skip("caps do not declare TERSE_CAP_IDENTITY");
  // A core that trusts the flag never calls compress or decompress (the PyTorch hook sums the gradient in place), so
  // the promise is checked byte for byte, on the inputs where a conversion or a scale would show: extremes and
  // subnormals.
  const std::vector<ConformanceShape> shapes = c.moderate();
  std::size_t runs = 0;
  for (const auto& shape : shapes) {
    const auto inputs = extremeInputs(shape.numel, c.inputSeed(shape, 21), FLT_MAX);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      Simulation sim = c.sim(shape, 1);
      const Step s = sim.runOne(i, inputs[i].x);
      ++runs;
      const Bytes& payload = s.payloads[0][0];
      const auto header = static_cast<std::size_t>(std::min<uint64_t>(sim.sizes(0).sum_header_bytes, payload.size()));
      const auto body = std::span<const std::byte>(payload).subspan(header);
      if (int64_t at = firstByteDifference(body, asBytes(inputs[i].x)); at >= 0) {
        return fail(cat(tag(shape), ", input '", inputs[i].name, "': caps declare TERSE_CAP_IDENTITY, but byte ", at,
                        " of the payload's ", body.size(), "-byte body (after its ", header,
                        "-byte header) differs from the input's ", 4 * shape.numel,
                        " bytes; the body must be the input unchanged"));
      }
      if (int64_t at = firstBitDifference(s.own[0], inputs[i].x); at >= 0) {
        return fail(cat(tag(shape), ", input '", inputs[i].name, "': caps declare TERSE_CAP_IDENTITY, but element ", at,
                        " decodes to ", s.own[0][static_cast<std::size_t>(at)], " from ",
                        inputs[i].x[static_cast<std::size_t>(at)],
                        "; decompress must give the input back bit for bit"));
      }
    }
  }
  return pass(cat(runs, " payloads (", shapes.size(),
                  " shape(s), normal, extreme and subnormal inputs) held the input's bytes unchanged behind their "
                  "header and decoded to it bit for bit"));
}

}  // namespace terse::conformance
