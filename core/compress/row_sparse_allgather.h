// Aggregation of a row-sparse gradient (an embedding table's: ParamTensor::row_sparse, DESIGN.md section 2) as
// (row ids, rows) instead of a dense vector, the way sparse embedding gradients are allgathered in data-parallel
// training (TensorFlow's IndexedSlices, PyTorch's sparse gradients under DDP, Horovod's sparse_as_dense=False).
//
// One call, on every rank in the same order (it is a collective):
//   1. this rank's payload: the distinct rows it names (a repeated id is sent once), encoded as below;
//   2. an 8-byte size exchange (Communicator::allgatherSizes), so every rank knows every payload's size;
//   3. if the payloads together are no larger than twice the dense tensor -- a ring allreduce sends 2 (n-1)/n of the
//      dense bytes per rank, an allgather (n-1)/n of the payloads' sum -- one allgatherv moves them and each rank sums
//      every rank's rows into the dense buffer in rank order; otherwise (a batch touching most rows) one dense
//      allreduce does. Every rank sees the same sizes, so every rank takes the same branch.
//   4. grad /= world size, like every engine path (engine.h): the result is the average.
// Summing per rank in rank order makes the sparse result bit-identical on every rank and for any row order.
//
// Payload (little-endian, self-describing and checked on receipt like a compressor's, DESIGN.md section 4):
//   u32 magic "TRSP" | u32 row count k | u32 row length | u32 zero | u32 ids[k] (ascending, < rows) | f32 rows[k][len]
// A payload from the network whose sizes, ids or order do not add up is an error naming the rank, never a write out of
// bounds.
//
// Compressors do not apply here: a row-sparse tensor is sent as its rows (the trainer's compressor keeps serving the
// dense tensors). Bytes: what the communicator counts for the size exchange and the allgatherv or allreduce, labelled
// with the tensor's id; payload_bytes is this rank's encoded block (or the dense tensor on the fallback).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/comm/communicator.h"

namespace terse {

struct RowSparseResult {
  bool sparse = true;          // false: the dense allreduce ran
  uint64_t payload_bytes = 0;  // this rank's block (sparse) or its dense tensor (fallback)
  comm::WireBytes wire;        // what this rank put on the wire, size exchange included
  // run(..., timed): when the size exchange began and ended and when the allgatherv or allreduce after it ended (the
  // runtime's clock), for a step trace; with one rank nothing runs and they stay empty.
  std::vector<uint64_t> sizes;  // every rank's payload bytes, as the size exchange told them
  std::chrono::steady_clock::time_point exchange_start, exchange_end, collective_end;
};

inline constexpr std::size_t kRowSparseHeaderBytes = 16;

// Bytes of a payload of k rows of `row_length` floats.
constexpr uint64_t rowSparsePayloadBytes(uint64_t k, uint64_t row_length) {
  return kRowSparseHeaderBytes + k * 4 + k * row_length * 4;
}

class RowSparseAllgather {
 public:
  // A tensor of `rows` x `row_length` floats labelled `tensor` in the byte accounting. Throws InvalidArgument for zero
  // rows or row length, more than 2^32 - 1 rows, or a device communicator (host memory only).
  RowSparseAllgather(comm::Communicator& comm, uint64_t rows, uint64_t row_length, uint64_t tensor);

  // grad: this rank's gradient, zero outside `rows` (any order, repeats allowed, each < the tensor's rows; empty is
  // fine). Replaces it with the average over ranks and fills union_rows with the ascending rows of the average that may
  // be nonzero (every row on the dense fallback). Throws InvalidArgument for a row out of range, CommError /
  // InvalidArgument for a malformed payload from a peer (naming it).
  // `timed`: fill the result's sizes and time points (a step trace asks; an untraced run reads no extra clock).
  RowSparseResult run(float* grad, std::span<const int64_t> rows, std::vector<int64_t>& union_rows, bool timed = false);

 private:
  comm::Communicator& comm_;
  uint64_t rows_, row_length_, tensor_;
  std::vector<uint32_t> mine_;  // this rank's distinct rows, ascending
  std::vector<std::byte> send_, recv_;
  std::vector<uint64_t> sizes_;
  std::vector<uint8_t> touched_;  // per row: in the union
};

}  // namespace terse
