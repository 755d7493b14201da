// Recursive-doubling allreduce (sum) for small messages: log2(n) rounds in which every rank exchanges its whole buffer
// with the partner at distance 1, 2, 4, ... and adds what it receives (Thakur, Rabenseifner and Gropp 2005,
// "Optimization of Collective Communication Operations in MPICH", section 4). It sends more bytes than the ring
// (S per round instead of S/n per step) but takes log2(n) round trips instead of 2(n-1), so it wins while latency
// dominates; the communicator picks it below a size threshold.
//
// A world that is not a power of two: with p the largest power of two <= n and rem = n - p, the first 2*rem ranks
// pair up before the doubling: each even rank 2i sends its buffer to 2i+1, which adds it and joins the doubling as
// virtual rank i; ranks from 2*rem on join as virtual rank r - rem. After the doubling, 2i+1 sends the result back to
// 2i.
//
// Every rank ends with the same bits: the partners of a round add the same two values (a + b rounds like b + a), and
// the even ranks receive a copy. The summation order is the tree above (tests/comm replays it to get exact expected
// values for f16 and bf16).
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// The non-power-of-two handling above, shared with allreduce_halving_doubling.h: p, rem, and this rank's virtual rank
// in the power-of-two phase (-1 for the even ranks below 2*rem, which sit it out).
struct PowerOfTwoFold {
  int p = 1;
  int rem = 0;
  int vrank = -1;
  // The rank that plays virtual rank v.
  int rankOf(int v) const noexcept { return v < rem ? 2 * v + 1 : v + rem; }
};
// The fold before the power-of-two phase (tmp: data.size() bytes of scratch), and the copy back after it.
PowerOfTwoFold foldToPowerOfTwo(CollectiveContext& ctx, std::span<std::byte> data, DType dtype,
                                std::span<std::byte> tmp);
void unfoldFromPowerOfTwo(CollectiveContext& ctx, std::span<std::byte> data, DType dtype, const PowerOfTwoFold& fold);

void allreduceRecursiveDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
