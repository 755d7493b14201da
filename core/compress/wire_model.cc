#include "core/compress/wire_model.h"

#include "core/comm/ring_model.h"

namespace terse {

uint64_t modeledWireBytes(const CompressorCaps& caps, std::span<const RoundBytes> rounds, int world) {
  uint64_t total = 0;
  for (const RoundBytes& r : rounds) {
    if (caps.aggregation == Aggregation::kSum) {
      // engine.cc's runSum: only the body travels; the header is identical on every rank by the SUM contract.
      const uint64_t body = r.payload_bytes > r.sum_header_bytes ? r.payload_bytes - r.sum_header_bytes : 0;
      total += comm::ringAllreduceBytes(body, world);
    } else {
      // engine.cc's gather: an 8-byte size exchange unless every payload has the same size, then the payloads.
      if (!caps.fixed_size) total += comm::ringAllgatherBytes(sizeof(uint64_t), world);
      total += comm::ringAllgatherBytes(r.payload_bytes, world);
    }
  }
  return total;
}

uint64_t denseWireBytes(uint64_t numel, int world) {
  return comm::ringAllreduceBytes(numel * sizeof(float), world);
}

}  // namespace terse
