// Bruck's allgather (Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient algorithms for all-to-all communications in
// multiport message-passing systems", IEEE TPDS 1997), with a block size of its own per rank (an allgatherv, as
// MPICH's MPIR_Allgatherv_intra_brucks): every rank ends with all blocks in rank order after ceil(log2 n) rounds, for
// any n (odd and non-powers of two included). Rank r keeps the blocks it holds in the order r, r + 1, ..., so they are
// always one contiguous prefix: in round k it sends the first min(2^k, n - 2^k) of them to r - 2^k and appends as many
// received from r + 2^k (that rank's first ones: blocks r + 2^k, ...). The blocks are held at the front of the receive
// buffer itself; a final rotation puts block i at its offset. For latency-bound exchanges: the ring takes n - 1 rounds,
// which at 1,024 ranks on 5 us links is 5.1 ms where this takes 0.05 ms.
//
// Bytes per rank: every rank receives the n - 1 other blocks once, as in the ring. It sends, in round k, its first
// min(2^k, n - 2^k) held blocks, so with equal blocks (n - 1) blocks, as in the ring, and with unequal ones a rank
// sends more or less than another (the total over ranks stays the sum of what they receive). Frames: one per round
// and segment of the round's message, ceil(log2 n) per rank for messages within a segment (the ring: n - 1), none
// for a round whose blocks are all empty; each carries a 32-byte header.
#pragma once

#include <cstdint>
#include <span>

#include "core/comm/collective.h"

namespace terse::comm {

// recv holds the sum of sizes; block i lands at offset sizes[0] + ... + sizes[i-1]. send (sizes[rank] bytes) may lie
// anywhere in recv (in place) or outside it.
void allgathervBruck(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv,
                     std::span<const uint64_t> sizes);

// Every rank's value of `mine`, in rank order: allgathervBruck of 8-byte little-endian words.
void exchangeWordsBruck(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all);

}  // namespace terse::comm
