// The row-sparse tensors of a synchronous step (SyncTrainerOptions::sparse_rows; DESIGN.md sections 1 and 2): each
// tensor the workload marks row_sparse, when the run asks for sparse rows, is aggregated on its own by a
// RowSparseAllgather (its rows' union, then only those rows) outside the scheduler's groups. The group scheduler
// admits such a tensor in the negotiated order and hands it here; this unit owns the per-tensor allgathers, the union
// of the last aggregation's rows and the payload bytes they sent, and says how one aggregation reads in a step trace.
// The communication thread's alone (it is not locked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/runtime.h"
#include "core/compress/row_sparse_allgather.h"
#include "core/train/step_trace.h"
#include "core/train/workload.h"

namespace terse::train {

class RowSparseTensors {
 public:
  // One allgather per row-sparse tensor of `params` when `enabled`. Throws InvalidArgument naming the tensor when one
  // is row-sparse on a device workload (`device`): sparse rows are aggregated on the host only.
  RowSparseTensors(std::span<const ParamTensor> params, comm::Communicator& comm, bool enabled, bool device);

  // Whether tensor `t` is aggregated here (row-sparse, sparse rows on) rather than by the scheduler's groups.
  bool handles(std::size_t t) const { return t < by_tensor_.size() && by_tensor_[t] != nullptr; }
  bool any() const;
  // Aggregates tensor `t`'s gradient rows (`p` is params()[t]) on every rank, in the same order everywhere: it is a
  // collective. `timed`: record the phases' times for a step trace.
  RowSparseResult run(std::size_t t, ParamTensor& p, bool timed);
  // The rows the last run's average covers in the gradient (every other row is zero).
  const std::vector<int64_t>& rows() const noexcept { return union_rows_; }
  // This rank's encoded blocks (or dense tensors on the fallback), every run so far.
  uint64_t payloadBytes() const noexcept { return payload_bytes_; }
  // One run of tensor `t` (`numel` elements) as a step trace group numbered `seq`: its encoding, the size exchange,
  // the gather of every rank's rows (or the dense allreduce a crowded step falls back to) and the sum into the
  // gradient, as a compressor's group would show them, their spans into `spans`. One rank runs nothing (the average of
  // one is itself): a group without phases.
  TraceGroup traceGroup(std::size_t t, uint64_t numel, uint64_t seq, const RowSparseResult& result,
                        rt::Clock::time_point start, rt::Clock::time_point end,
                        std::vector<StepTraceRecorder::Span>& spans) const;

 private:
  comm::Communicator& comm_;
  std::vector<std::unique_ptr<RowSparseAllgather>> by_tensor_;  // null for a tensor the groups move
  std::vector<int64_t> union_rows_;
  uint64_t payload_bytes_ = 0;
};

}  // namespace terse::train
