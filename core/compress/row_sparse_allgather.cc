#include "core/compress/row_sparse_allgather.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"
#include "core/common/runtime.h"

namespace terse {
namespace {

constexpr uint32_t kMagic = 0x50535254;  // "TRSP" little-endian

void putU32(std::byte* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
uint32_t getU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

RowSparseAllgather::RowSparseAllgather(comm::Communicator& comm, uint64_t rows, uint64_t row_length, uint64_t tensor)
    : comm_(comm), rows_(rows), row_length_(row_length), tensor_(tensor) {
  TERSE_CHECK(rows >= 1 && rows <= UINT32_MAX && row_length >= 1, InvalidArgument,
              "row-sparse tensor " << tensor << ": " << rows << " rows of " << row_length
                                   << " elements (need 1 .. 2^32 - 1 rows of at least one element)");
  TERSE_CHECK(!comm.deviceMemory(), InvalidArgument,
              "row-sparse tensor " << tensor << ": the '" << comm.backend()
                                   << "' communicator works on device memory; sparse rows go through host memory only");
  sizes_.resize(static_cast<std::size_t>(comm.size()));
  touched_.assign(rows, 0);
}

RowSparseResult RowSparseAllgather::run(float* grad, std::span<const int64_t> rows, std::vector<int64_t>& union_rows,
                                        bool timed) {
  const std::size_t len = row_length_;
  mine_.clear();
  for (int64_t r : rows) {
    TERSE_CHECK(r >= 0 && static_cast<uint64_t>(r) < rows_, InvalidArgument,
                "row-sparse tensor " << tensor_ << ": row " << r << " is outside [0, " << rows_ << ")");
    mine_.push_back(static_cast<uint32_t>(r));
  }
  std::sort(mine_.begin(), mine_.end());
  mine_.erase(std::unique(mine_.begin(), mine_.end()), mine_.end());
  const uint64_t k = mine_.size();
  const int n = comm_.size();
  RowSparseResult result;
  union_rows.clear();
  if (n == 1) {
    union_rows.assign(mine_.begin(), mine_.end());
    return result;
  }

  send_.resize(rowSparsePayloadBytes(k, len));
  std::byte* p = send_.data();
  putU32(p, kMagic);
  putU32(p + 4, static_cast<uint32_t>(k));
  putU32(p + 8, static_cast<uint32_t>(len));
  putU32(p + 12, 0);
  if (k > 0) std::memcpy(p + kRowSparseHeaderBytes, mine_.data(), k * 4);  // mine_.data() may be null when empty
  float* values = reinterpret_cast<float*>(p + kRowSparseHeaderBytes + k * 4);
  for (uint64_t m = 0; m < k; ++m) std::memcpy(values + m * len, grad + mine_[m] * len, len * sizeof(float));

  if (timed) result.exchange_start = rt::now();
  result.wire += comm_.allgatherSizes(send_.size(), sizes_, tensor_);
  if (timed) {
    result.exchange_end = rt::now();
    result.sizes = sizes_;
  }
  uint64_t total = 0;
  for (uint64_t s : sizes_) total += s;
  const uint64_t dense = rows_ * len * sizeof(float);
  const float scale = 1.0f / static_cast<float>(n);
  if (total > 2 * dense) {
    // Most rows are touched: the dense allreduce is cheaper, and every rank knows it from the same sizes.
    result.sparse = false;
    result.payload_bytes = dense;
    result.wire += comm_.allreduce(grad, rows_ * len, DType::kF32, comm::ReduceOp::kSum, tensor_);
    if (timed) result.collective_end = rt::now();
    {
      // A simulation's kernels (core/common/runtime.h); the FLOP model has never charged this path's passes.
      const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = static_cast<double>(rows_ * len)});
      for (uint64_t i = 0; i < rows_ * len; ++i) grad[i] *= scale;
    }
    union_rows.resize(rows_);
    for (uint64_t r = 0; r < rows_; ++r) union_rows[r] = static_cast<int64_t>(r);
    return result;
  }
  result.payload_bytes = send_.size();
  recv_.resize(total);
  result.wire += comm_.allgatherv(send_, recv_, sizes_, tensor_);
  if (timed) result.collective_end = rt::now();

  // The sum of every rank's rows into the gradient: its size is known once the payloads are read.
  rt::Kernel sum({.kind = rt::CostKind::kSum});
  for (uint32_t r : mine_) std::fill(grad + r * len, grad + (r + 1) * len, 0.0f);
  uint64_t offset = 0;
  for (int src = 0; src < n; ++src) {
    const uint64_t size = sizes_[static_cast<std::size_t>(src)];
    const std::byte* q = recv_.data() + offset;
    offset += size;
    TERSE_CHECK(size >= kRowSparseHeaderBytes && getU32(q) == kMagic && getU32(q + 8) == len && getU32(q + 12) == 0,
                InvalidArgument,
                "row-sparse tensor " << tensor_ << ": rank " << src << " sent a malformed payload header (" << size
                                     << " bytes)");
    const uint64_t count = getU32(q + 4);
    TERSE_CHECK(size == rowSparsePayloadBytes(count, len), InvalidArgument,
                "row-sparse tensor " << tensor_ << ": rank " << src << " sent " << size << " bytes for " << count
                                     << " rows of " << len << " (expected " << rowSparsePayloadBytes(count, len)
                                     << ")");
    const std::byte* ids = q + kRowSparseHeaderBytes;
    const std::byte* vals = ids + count * 4;
    sum.cost().size += static_cast<double>(count * len);
    uint32_t prev = 0;
    for (uint64_t m = 0; m < count; ++m) {
      const uint32_t r = getU32(ids + m * 4);
      TERSE_CHECK(r < rows_ && (m == 0 || r > prev), InvalidArgument,
                  "row-sparse tensor " << tensor_ << ": rank " << src << " sent row " << r << " at position " << m
                                       << " (rows must ascend and be < " << rows_ << ")");
      prev = r;
      float* dst = grad + static_cast<uint64_t>(r) * len;
      const std::byte* src_row = vals + m * len * 4;
      for (std::size_t c = 0; c < len; ++c) {
        float v;
        std::memcpy(&v, src_row + c * 4, 4);
        dst[c] += v;
      }
      if (!touched_[r]) {
        touched_[r] = 1;
        union_rows.push_back(r);
      }
    }
  }
  std::sort(union_rows.begin(), union_rows.end());
  rt::Kernel average({.kind = rt::CostKind::kAccumulate, .size = static_cast<double>(union_rows.size() * len)});
  for (int64_t r : union_rows) {
    touched_[static_cast<std::size_t>(r)] = 0;
    for (std::size_t c = 0; c < len; ++c) grad[static_cast<std::size_t>(r) * len + c] *= scale;
  }
  return result;
}

}  // namespace terse
