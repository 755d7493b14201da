// What one step of a plugin sends per round (conformance.h, measurePayloadSizes): one rank of the simulator in host
// memory, for the payload table of `terse plugins show --numel`.
#include "core/common/error.h"
#include "core/conformance/conformance.h"
#include "core/conformance/memory.h"
#include "core/conformance/simulation.h"
#include "core/conformance/vectors.h"

namespace terse {

using conformance::mixSeed;
using conformance::normalInput;
using conformance::Simulation;
using conformance::Step;

PayloadSizes measurePayloadSizes(const CompressorPlugin& plugin, const Params& params, const ConformanceShape& shape,
                                 uint64_t seed) {
  auto instance = plugin.instantiate(params);
  PayloadSizes out;
  out.caps = instance->caps(DType::kF32);
  TERSE_CHECK((out.caps.devices & TERSE_DEVICE_HOST) != 0, Unsupported,
              plugin.info().name << " runs on CUDA only; payload sizes are measured on the host");
  Simulation sim(instance, conformance::hostMemory(), shape, 1, seed, 1);
  const Step s = sim.runOne(0, normalInput(shape.numel, mixSeed(seed, 99)));
  for (int r = 0; r < sim.rounds(); ++r) {
    out.rounds.push_back({r, sim.sizes(r).max_output_bytes, s.payloads[static_cast<std::size_t>(r)][0].size(),
                          sim.sizes(r).sum_header_bytes});
  }
  return out;
}

}  // namespace terse
