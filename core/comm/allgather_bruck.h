// Bruck's allgather (Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient algorithms for all-to-all communications in
// multiport message-passing systems", IEEE TPDS 1997): every rank contributes a block of the same size and ends with
// all of them in rank order after ceil(log2 n) rounds, for any n (odd and non-powers of two included). In round k
// rank r sends the first min(2^k, n - 2^k) blocks it holds (its own and those after it, in rank order from r) to
// r - 2^k and appends as many received from r + 2^k; a final rotation puts block i at i. For latency-bound exchanges
// (a word per rank, as the scheduler negotiation's): the ring takes n - 1 rounds, which at 1,024 ranks on 50 us links
// is 51 ms where this takes 0.5 ms.
//
// Bytes sent per rank: (n - 1) blocks, as in the ring, + 32 per frame in ceil(log2 n) frames (the ring: n - 1).
#pragma once

#include <span>

#include "core/comm/collective.h"

namespace terse::comm {

// recv holds n blocks of send.size() bytes; block i is rank i's send.
void allgatherBruck(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv);

// Every rank's value of `mine`, in rank order: allgatherBruck of 8-byte little-endian words.
void exchangeWordsBruck(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all);

}  // namespace terse::comm
