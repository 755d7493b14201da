// The checks of one plugin's contract on one rank (compressor_v1.h), whatever its aggregation: that it instantiates for
// f32 on the device asked for, sizes every shape, compresses and decodes within the sizes it declared, meets the
// caller's error bound, is deterministic per (seed, step, tensor id), honours a shared seed, accumulates, leaves its
// workspace alone in decompress. (Unbiasedness, with its statistics, is unbiasedness.cc's.)
#include "core/conformance/checks.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/conformance/message.h"
#include "terse/compressor.h"

namespace terse::conformance {
namespace {

// Inputs that stress size and range handling: the fixed-size promise must hold for all of them.
std::vector<std::pair<std::string, Floats>> varietyInputs(uint64_t numel, uint64_t seed) {
  std::vector<std::pair<std::string, Floats>> out;
  out.emplace_back("normal", normalInput(numel, seed));
  out.emplace_back("zeros", Floats(numel, 0.0f));
  out.emplace_back("ones", Floats(numel, 1.0f));
  Floats spike(numel, 0.0f);
  for (uint64_t i = 0; i < numel; i += 97) spike[i] = (i / 97) % 2 ? -1000.0f : 1000.0f;
  out.emplace_back("sparse spikes", std::move(spike));
  Floats wide = normalInput(numel, seed + 1);
  for (uint64_t i = 0; i < numel; ++i) wide[i] *= i % 3 == 0 ? 1e20f : (i % 3 == 1 ? 1e-20f : 1.0f);
  out.emplace_back("dynamic range 1e-20..1e20", std::move(wide));
  Floats tiny = normalInput(numel, seed + 2);
  for (auto& v : tiny) v *= 1e-30f;
  out.emplace_back("tiny (1e-30)", std::move(tiny));
  return out;
}

std::string devicesName(uint32_t devices) {
  std::string out;
  if (devices & TERSE_DEVICE_HOST) out += "host";
  if (devices & TERSE_DEVICE_CUDA) out += out.empty() ? "cuda" : ",cuda";
  return out.empty() ? "none" : out;
}

// One rank, a normal input, every round; returns the relative error and checks the decode is finite.
double roundTrip(Context& c, const ConformanceShape& shape) {
  if (auto it = c.round_trip_error.find(shape.label()); it != c.round_trip_error.end()) return it->second;
  Simulation sim = c.sim(shape, 1);
  const Floats x = normalInput(shape.numel, c.inputSeed(shape, 1));
  const Step s = sim.runOne(0, x);
  if (!allFinite(s.result[0])) {
    throw Violation(cat(tag(shape), ": decoding a standard-normal input gave a non-finite value"));
  }
  const double nx = norm(x);
  const double e = nx == 0 ? 0 : diffNorm(s.result[0], x) / nx;
  c.round_trip_error[shape.label()] = e;
  return e;
}

}  // namespace

Outcome checkInstantiate(Context& c) {
  c.instance = c.plugin.instantiate(c.params);
  try {
    c.caps = c.instance->caps(DType::kF32);
  } catch (const Unsupported& e) {
    c.instance.reset();
    return fail(cat("the plugin does not handle f32 gradients, which every check drives: ", e.what()));
  }
  const bool on_device = c.memory->device() != TERSE_DEVICE_HOST;
  if (!on_device && (c.caps.devices & TERSE_DEVICE_HOST) == 0) {
    c.instance.reset();
    return skip("the plugin runs on CUDA only and the suite drives host memory: nothing else can be checked");
  }
  // SKIP, not FAIL: CUDA support is optional in the ABI (a plugin answers what it runs on, and the core asks before a
  // run, never assumes), so a host-only plugin breaks no rule by not running there. Asked to check it on a device, the
  // suite says why it checked nothing; the host mode is where such a plugin is judged.
  if (on_device && (c.caps.devices & c.memory->device()) == 0) {
    c.instance.reset();
    return skip(cat("the plugin does not advertise CUDA (f32 caps.devices: ", devicesName(c.caps.devices),
                    ") and the suite was asked to drive ", c.memory->describe(), ": nothing else can be checked"));
  }
  return pass(cat("f32 caps: aggregation ", aggregationText(c.caps), ", ", c.caps.fixed_size ? "fixed" : "variable",
                  " size, ", plural(static_cast<std::size_t>(c.caps.num_rounds), "round", "rounds"), ", ",
                  c.caps.stateful ? "stateful" : "stateless", ", ", c.caps.shared_seed ? "shared" : "per-rank", " seed",
                  on_device ? "; buffers on " + c.memory->describe() : std::string()));
}

Outcome checkSizes(Context& c) {
  std::vector<std::string> notes, problems;
  for (const auto& shape : c.options.shapes) {
    const uint64_t id = c.tensorId();
    try {
      std::string entry = tag(shape) + ":";
      for (int r = 0; r < c.caps.num_rounds; ++r) {
        TensorInfo t = tensorInfo(shape, id, c.options.world_size, *c.memory);
        t.round = r;
        const CompressorSizes s0 = c.instance->sizes(t);
        if (c.caps.aggregation == Aggregation::kSum) {
          // Every rank's payload must have the same length and header split, or the wire sum is meaningless.
          t.rank = c.options.world_size - 1;
          const CompressorSizes s1 = c.instance->sizes(t);
          if (s1.max_output_bytes != s0.max_output_bytes || s1.sum_header_bytes != s0.sum_header_bytes) {
            problems.push_back(cat(tag(shape), " round ", r, ": rank ", t.rank, " gets max_output_bytes ",
                                   s1.max_output_bytes, " / sum_header_bytes ", s1.sum_header_bytes, ", rank 0 gets ",
                                   s0.max_output_bytes, " / ", s0.sum_header_bytes));
          }
        }
        entry += cat(" ", s0.max_output_bytes, " B");
      }
      notes.push_back(entry);
      c.shapes.push_back(shape);
    } catch (const Unsupported& e) {
      if (shape.numel == 0) {
        problems.push_back(
            cat("the empty tensor is unsupported (the ABI: numel 0 is valid and must work): ", e.what()));
      } else {
        notes.push_back(tag(shape) + ": unsupported");
      }
    }
  }
  if (!problems.empty()) return fail(problems.front());
  if (c.shapes.empty()) return fail("get_sizes refused every shape");
  return pass("max_output_bytes per round: " + [&] {
    std::string s;
    for (const auto& n : notes) s += (s.empty() ? "" : "; ") + n;
    return s;
  }());
}

Outcome checkShapes(Context& c) {
  std::string sizes;
  for (const auto& shape : c.shapes) {
    Simulation sim = c.sim(shape, 1);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 1));
    const Step s = sim.runOne(0, x);
    if (!allFinite(s.result[0]) || !allFinite(s.own[0])) {
      return fail(cat(tag(shape), ": decoding a standard-normal input gave a non-finite value"));
    }
    const double nx = norm(x);
    c.round_trip_error[shape.label()] = nx == 0 ? 0 : diffNorm(s.result[0], x) / nx;
    sizes += cat(sizes.empty() ? "" : ", ", tag(shape), " -> ");
    for (int r = 0; r < sim.rounds(); ++r)
      sizes += cat(r ? "+" : "", s.payloads[static_cast<std::size_t>(r)][0].size());
    sizes += " B";
  }
  return pass(cat("compressed and decoded every accepted shape, guard zones intact: ", sizes));
}

Outcome checkRoundTrip(Context& c) {
  std::string text;
  double worst = 0;
  bool any = false;
  for (const auto& shape : c.shapes) {
    if (shape.numel == 0) continue;
    const double e = roundTrip(c, shape);
    text += cat(text.empty() ? "" : ", ", tag(shape), ": ", e);
    if (shape.numel >= kRoundTripMinNumel) {
      worst = std::max(worst, e);
      any = true;
    }
  }
  if (text.empty()) return skip("no nonempty shape");
  const std::string what = "relative error ||D(C(x)) - x|| / ||x|| on N(0, 1) inputs, one rank: " + text;
  if (!c.options.max_rel_error) return pass(what + " (no bound given: reported only)");
  if (!any) return skip(what + cat(" (no shape of at least ", kRoundTripMinNumel, " elements to hold to the bound)"));
  if (worst > *c.options.max_rel_error) {
    return fail(what + cat("; ", worst, " exceeds the bound ", *c.options.max_rel_error));
  }
  return pass(what + cat(" <= bound ", *c.options.max_rel_error));
}

Outcome checkOutputSize(Context& c) {
  uint64_t runs = 0, smallest = std::numeric_limits<uint64_t>::max(), largest = 0;
  bool varied = false;
  for (const auto& shape : c.shapes) {
    Simulation sim = c.sim(shape, 1);
    auto inputs = varietyInputs(shape.numel, c.inputSeed(shape, 2));
    if (shape.numel > kModerateNumel) inputs.resize(2);  // normal and zeros: the large shape is slow to repeat
    std::vector<uint64_t> first_sizes;
    for (uint64_t i = 0; i < inputs.size(); ++i) {
      Step s;
      try {
        s = sim.runOne(i, inputs[i].second);
      } catch (const std::exception& e) {
        throw Violation(cat(tag(shape), ", input '", inputs[i].first, "': ", e.what()));
      }
      for (int r = 0; r < sim.rounds(); ++r) {
        const uint64_t n = s.payloads[static_cast<std::size_t>(r)][0].size();
        ++runs;
        smallest = std::min(smallest, n);
        largest = std::max(largest, n);
        if (first_sizes.size() <= static_cast<std::size_t>(r)) first_sizes.push_back(n);
        varied = varied || n != first_sizes[static_cast<std::size_t>(r)];
      }
    }
  }
  // The core's checked compress already refuses a payload above max_output_bytes and, for fixed-size caps, one of any
  // other length; reaching here means every payload kept the promise.
  if (c.caps.fixed_size) {
    return pass(cat("fixed size: all ", runs,
                    " payloads (6 inputs per shape incl. zeros, spikes, 1e-20..1e20) were "
                    "exactly max_output_bytes, nothing written past it"));
  }
  return pass(cat("variable size: ", runs, " payloads of ", smallest, "..", largest,
                  " B, never above max_output_bytes, nothing written past it",
                  varied ? "" : " (all inputs gave one size)"));
}

Outcome checkDeterministic(Context& c) {
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  bool stochastic = false;
  for (const auto& shape : shapes) {
    // Two instances, as two processes would have: nothing may depend on addresses, clocks or call counts.
    const uint64_t id = c.tensorId();
    Simulation a(c.plugin.instantiate(c.params), c.memory, shape, 1, c.options.seed, id);
    Simulation b(c.plugin.instantiate(c.params), c.memory, shape, 1, c.options.seed, id);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 3));
    Bytes step0;
    for (uint64_t step : {0, 1, 2}) {
      const Step sa = a.runOne(step, x), sb = b.runOne(step, x);
      for (int r = 0; r < a.rounds(); ++r) {
        const Bytes& pa = sa.payloads[static_cast<std::size_t>(r)][0];
        const Bytes& pb = sb.payloads[static_cast<std::size_t>(r)][0];
        if (int64_t at = firstByteDifference(pa, pb); at >= 0) {
          return fail(cat(tag(shape), ", step ", step, ", round ", r,
                          ": two compressions of one input with the same (seed, step, tensor id) differ at byte ", at,
                          " (", pa.size(), " and ", pb.size(), " bytes)"));
        }
      }
      if (int64_t at = firstBitDifference(sa.result[0], sb.result[0]); at >= 0) {
        return fail(cat(tag(shape), ", step ", step, ": equal payloads decoded to different values at element ", at));
      }
      if (step == 0) step0 = sa.payloads.back()[0];
      if (step == 1 && step0 != sa.payloads.back()[0]) stochastic = true;
    }
  }
  return pass(
      cat("two instances gave byte-identical payloads and decodes for steps 0-2 on ", shapes.size(), " shape(s); ",
          stochastic ? "the payload changes with the step (stochastic)" : "the step does not change the payload"));
}

Outcome checkSharedSeed(Context& c) {
  if (!c.caps.shared_seed) return skip("caps do not ask for a shared seed");
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 4));
    for (uint64_t step : {0, 1}) {
      const Step s = sim.runOne(step, x);
      for (int r = 0; r < sim.rounds(); ++r) {
        const auto& p = s.payloads[static_cast<std::size_t>(r)];
        for (int k = 1; k < w; ++k) {
          if (int64_t at = firstByteDifference(p[0], p[static_cast<std::size_t>(k)]); at >= 0) {
            return fail(cat(tag(shape), ", step ", step, ", round ", r, ": ranks 0 and ", k,
                            " share the seed and the input but their payloads differ at byte ", at,
                            " (the random choices must depend on (seed, step, tensor id) only)"));
          }
        }
      }
    }
  }
  return pass(cat(w,
                  " ranks with the shared seed and one input sent byte-identical payloads in every round, steps 0-1, ",
                  shapes.size(), " shape(s)"));
}

Outcome checkAccumulate(Context& c) {
  std::size_t cases = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, 1);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 5));
    const Step s = sim.runOne(0, x);
    struct Source {
      int rank;
      const Bytes* payload;
      const Floats* reference;
    };
    std::vector<Source> sources{{0, &s.payloads.back()[0], &s.own[0]}};
    if (sim.aggregated()) sources.push_back({-1, &s.aggregates.back(), &s.result[0]});
    for (const auto& src : sources) {
      ++cases;
      // accumulate = 0 overwrites whatever the buffer held: a NaN left anywhere means an element was not written.
      Floats over(shape.numel, std::numeric_limits<float>::quiet_NaN());
      sim.decompress(0, 0, *src.payload, src.rank, over, false);
      if (int64_t at = firstBitDifference(over, *src.reference); at >= 0) {
        return fail(cat(tag(shape), ", source_rank ", src.rank, ": with accumulate = 0 onto a buffer of NaN, element ",
                        at, " is ", over[static_cast<std::size_t>(at)], " instead of ",
                        (*src.reference)[static_cast<std::size_t>(at)], " (the output must be overwritten)"));
      }
      if (src.rank == 0) {
        // The same own payload marked trusted (TERSE_CALL_OWN_PAYLOAD, as error feedback decodes what it sent): a
        // plugin may skip its validation then, but must decode the same.
        Floats own(shape.numel, std::numeric_limits<float>::quiet_NaN());
        sim.decompress(0, 0, *src.payload, 0, own, false, TERSE_CALL_OWN_PAYLOAD);
        if (int64_t at = firstBitDifference(own, *src.reference); at >= 0) {
          return fail(cat(tag(shape), ": its own payload decompressed with TERSE_CALL_OWN_PAYLOAD, element ", at,
                          " is ", own[static_cast<std::size_t>(at)], " instead of ",
                          (*src.reference)[static_cast<std::size_t>(at)],
                          " (the flag may skip checks, not change the "
                          "decode)"));
        }
      }
      Floats acc(shape.numel);
      for (uint64_t i = 0; i < shape.numel; ++i)
        acc[i] = 0.75f + 0.25f * static_cast<float>(i % 13) - (i % 2 ? 2.0f : 0.0f);
      const Floats before = acc;
      sim.decompress(0, 0, *src.payload, src.rank, acc, true);
      for (uint64_t i = 0; i < shape.numel; ++i) {
        const float want = before[i] + (*src.reference)[i];
        // A few ulps: the plugin may fuse the add into its decode (an FMA rounds once where we round twice).
        const float tol =
            4 * std::numeric_limits<float>::epsilon() * (std::abs(before[i]) + std::abs((*src.reference)[i]));
        if (!(std::abs(acc[i] - want) <= tol) && !(std::isnan(want) && std::isnan(acc[i]))) {
          return fail(cat(tag(shape), ", source_rank ", src.rank, ": with accumulate = 1, element ", i, " is ", acc[i],
                          ", expected previous ", before[i], " + decoded ", (*src.reference)[i], " = ", want));
        }
      }
    }
  }
  return pass(
      cat("accumulate = 1 adds the decode to a nonzero buffer and accumulate = 0 overwrites a NaN buffer, also "
          "for the own payload marked trusted (",
          cases, " shape/source cases)"));
}

Outcome checkPurity(Context& c) {
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  std::size_t calls = 0, source_calls = 0;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    sim.watchPurity(true);
    std::vector<Floats> x;
    for (int k = 0; k < w; ++k) x.push_back(normalInput(shape.numel, c.inputSeed(shape, 6, k)));
    std::vector<const Floats*> inputs;
    for (const auto& v : x) inputs.push_back(&v);
    for (uint64_t step : {0, 1}) sim.run(step, inputs);
    for (const auto& i : sim.issues())
      if (i.find("decompress") != std::string::npos) return fail(tag(shape) + ": " + i);
    calls += sim.decompressCalls();
    source_calls += sim.sourceRankDecompressCalls();
  }
  return pass(cat("workspace unchanged by all ", calls, " decompress calls, state unchanged by the ", source_calls,
                  " that decode one rank's payload (", w, " ranks, 2 steps, ", shapes.size(), " shape(s))"));
}

}  // namespace terse::conformance
