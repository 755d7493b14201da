// Broadcast along a binomial tree rooted at `root`: in round k every rank that has the data sends it to the rank 2^k
// further (relative to the root), so all n ranks have it after ceil(log2 n) rounds and every non-root rank receives it
// exactly once (MPICH's MPIR_Bcast_binomial). Bytes: each non-root rank receives S (+ 32 per frame); a rank sends S
// (+ headers) to each of its children.
#pragma once

#include <span>

#include "core/comm/collective.h"

namespace terse::comm {

// data: the root's bytes to send, every other rank's buffer of the same size to receive into.
void broadcastBinomial(CollectiveContext& ctx, std::span<std::byte> data, int root);

}  // namespace terse::comm
