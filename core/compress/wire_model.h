// What the aggregation engine (engine.h) puts on the wire per worker for one tensor alone, under the ring model of
// core/comm/ring_model.h (no frame headers): the prediction `terse plugins show --numel N --world W` prints beside a
// compressor's payload bytes, and the dense baseline it is compared with.
//
// A payload ratio (dense bytes / payload bytes) is not the wire ratio: the paths move different multiples of it.
//   SUM        ring allreduce of the summable body (payload minus sum_header_bytes, which every rank already has):
//              2(n-1)/n x body per round, the same factor as the dense f32 baseline, so the wire ratio is the
//              payload ratio.
//   ALLGATHER  every rank receives, and the ring forwards, the n - 1 other payloads: (n-1) x payload, plus one 8-byte
//              size per rank when the size varies; against the dense 2(n-1)/n x 4N the wire ratio is the payload
//              ratio x 2/n (a 3.56x payload is 1.78x on the wire at 4 workers). Bruck's allgather, which `auto` picks
//              for small gathers (core/comm/allgather_auto.h), sends the same (n-1) x payload per rank when payloads
//              are equal (fewer frames, so fewer headers); the hierarchical one of a multi-node world moves other
//              bytes per worker (core/comm/allgatherv_hierarchical.h), which this flat model does not predict.
//   CUSTOM     per round, the raw payloads are gathered like ALLGATHER's and folded by the plugin's reduce.
#pragma once

#include <cstdint>
#include <span>

#include "core/plugin/compressor.h"

namespace terse {

// One round's payload for the tensor: bytes compress produced (or its bound) and the SUM header among them.
struct RoundBytes {
  uint64_t payload_bytes = 0;
  uint64_t sum_header_bytes = 0;
};

// Bytes one worker sends per step for a tensor with these rounds, aggregated as `caps` says across `world` ranks.
uint64_t modeledWireBytes(const CompressorCaps& caps, std::span<const RoundBytes> rounds, int world);

// The dense baseline: a ring allreduce of `numel` f32 values.
uint64_t denseWireBytes(uint64_t numel, int world);

}  // namespace terse
