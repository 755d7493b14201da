// Dissemination barrier (Hensgen, Finkel and Manber 1988): in round k every rank sends an empty frame to rank + 2^k and
// waits for one from rank - 2^k; after ceil(log2 n) rounds every rank has heard, transitively, from every other, so
// none leaves before all have entered. Bytes: ceil(log2 n) header-only frames (32 bytes) sent and received per rank.
#pragma once

#include "core/comm/collective.h"

namespace terse::comm {

void barrierDissemination(CollectiveContext& ctx);

}  // namespace terse::comm
