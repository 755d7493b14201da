// Ring allgatherv: every rank contributes a block of its own size (0 included) and every rank ends with all blocks
// concatenated in rank order. In step s (0 <= s < n-1) rank r sends block (r - s) mod n to r + 1 and receives block
// (r - s - 1) mod n from r - 1 straight into place (Gloo's allgather_ring.h, with per-rank sizes). Every rank must
// know every size beforehand (Communicator::allgatherSizes does that in a first, fixed-size allgather).
//
// Bytes sent per rank: sum over the n-1 blocks it forwards (every block but block r + 1) of bytes + 32 per frame; an
// empty block takes no frame.
#pragma once

#include <cstdint>
#include <span>

#include "core/comm/collective.h"

namespace terse::comm {

// recv holds the sum of sizes; block i lands at offset sizes[0] + ... + sizes[i-1]. send (sizes[rank] bytes) is copied
// to its place first unless it is already there (in place).
void allgathervRing(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv,
                    std::span<const uint64_t> sizes);

}  // namespace terse::comm
