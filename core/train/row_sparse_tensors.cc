// The row-sparse tensors of a synchronous step: row_sparse_tensors.h.
#include "core/train/row_sparse_tensors.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/common/error.h"

namespace terse::train {

RowSparseTensors::RowSparseTensors(std::span<const ParamTensor> params, comm::Communicator& comm, bool enabled,
                                   bool device)
    : comm_(comm) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool sparse = enabled && params[i].row_sparse;
    TERSE_CHECK(!sparse || !device, InvalidArgument,
                "tensor '" << params[i].name << "' is row-sparse, but sparse rows are aggregated on the host only");
    by_tensor_.push_back(sparse ? std::make_unique<RowSparseAllgather>(
                                      comm, static_cast<uint64_t>(params[i].shape.at(0)), params[i].rowLength(), i)
                                : nullptr);
  }
}

bool RowSparseTensors::any() const {
  return std::any_of(by_tensor_.begin(), by_tensor_.end(), [](const auto& s) { return s != nullptr; });
}

RowSparseResult RowSparseTensors::run(std::size_t t, ParamTensor& p, bool timed) {
  RowSparseResult result = by_tensor_.at(t)->run(p.grad.data(), p.grad_rows, union_rows_, timed);
  payload_bytes_ += result.payload_bytes;
  return result;
}

TraceGroup RowSparseTensors::traceGroup(std::size_t t, uint64_t numel, uint64_t seq, const RowSparseResult& result,
                                        rt::Clock::time_point start, rt::Clock::time_point end,
                                        std::vector<StepTraceRecorder::Span>& spans) const {
  TraceGroup g;
  g.seq = seq;
  g.chunks.emplace_back(t, 0);
  g.chunk_elements.push_back(numel);
  const auto phase = [&](TracePhase::Kind kind, rt::Clock::time_point a, rt::Clock::time_point b) {
    TracePhase p;
    p.kind = kind;
    g.phases.push_back(std::move(p));
    spans.emplace_back(a, b);
    return &g.phases.back();
  };
  if (result.sizes.empty()) return g;
  phase(TracePhase::Kind::kCompress, start, result.exchange_start);
  const uint64_t world = result.sizes.size();
  TracePhase* sizes = phase(TracePhase::Kind::kCollective, result.exchange_start, result.exchange_end);
  sizes->op = "allgather_sizes";
  sizes->algorithm = std::string(comm_.allgatherAlgorithmRun(8 * world));
  sizes->dtype = "u8";
  sizes->bytes = 8;
  TracePhase* main = phase(TracePhase::Kind::kCollective, result.exchange_end, result.collective_end);
  if (result.sparse) {
    uint64_t total = 0;
    for (uint64_t s : result.sizes) total += s;
    main->op = "allgatherv";
    main->algorithm = std::string(comm_.allgatherAlgorithmRun(total));
    main->dtype = "u8";
    main->bytes = result.sizes[static_cast<std::size_t>(comm_.rank())];
    main->rank_bytes = result.sizes;
  } else {
    main->op = "allreduce";
    main->algorithm = std::string(comm_.allreduceAlgorithmRun(result.payload_bytes));
    main->dtype = "f32";
    main->bytes = result.payload_bytes;
  }
  phase(TracePhase::Kind::kDecompress, result.collective_end, end);
  return g;
}

}  // namespace terse::train
