// Elementwise sums for the collectives: dst[i] = dst[i] + src[i].
//
// 16-bit types are summed the way compressor_v1.h promises for SUM payloads: each pairwise add converts both operands
// to f32, adds once in f32 and rounds the result back to the 16-bit type once (round to nearest even, via the SDK's
// bit-exact conversions in terse/sdk/half.hpp). An f32 add is commutative, so a + b and b + a round to the same bits:
// two ranks that add the same pair in either order agree bit for bit, which the recursive-doubling allreduce relies on.
// The loops use faster code where the CPU has it (F16C for f16, AVX2 for bf16), always bit-identical to the SDK's
// conversions (tests/comm/reduce_test.cc), apart from which payload a NaN + NaN keeps.
#pragma once

#include <cstddef>

#include "core/common/dtype.h"

namespace terse::comm {

// The dtypes sumInto handles: f32, f16, bf16.
bool isSummable(DType dtype) noexcept;

// Throws Unsupported for another dtype. dst and src must not overlap. Runs inside a kernel region of kind kSum
// (core/common/runtime.h: a simulation charges what runs in one, and nothing else, as the rank's computation), so every
// sum is a rank's work wherever it is called from: a transport's receive-and-add or an algorithm's own adds (recursive
// doubling, the fold to a power of two, the tree, reduce-broadcast). In real time the region costs nothing.
void sumInto(void* dst, const void* src, std::size_t count, DType dtype);

}  // namespace terse::comm
