// core's Communicator (core/comm/communicator.h) over a torch.distributed process group, so that core's aggregation
// engine (core/compress/engine.h) runs unchanged inside a PyTorch DDP communication hook: every collective the engine
// issues becomes one torch.distributed call on the hook's process group, made through pybind11 on the thread that runs
// the aggregation (the hook's worker thread, or the hook itself), which takes the GIL for the call and lets it go
// again: the encode and decode around it run without the GIL, overlapping the rest of backward.
//
// Buffers. The engine hands raw memory (its payload buffers, the bucket's gradient); each call wraps it as a torch
// tensor without a copy -- a DLPack capsule (dlpack/dlpack.h) that torch.utils.dlpack.from_dlpack consumes -- so
// torch.distributed reads and writes the engine's memory directly. One wrapping for both placements: the DLPack device
// says host (kDLCPU) or the bound CUDA device (kDLCUDA), so the host path's tests run the device path's code but for
// that field. The descriptor's deleter frees only the descriptor (the engine owns the memory) and needs no GIL.
//
// What maps to what:
//   allreduce, allreducePayload   dist.all_reduce (SUM) on the summed bytes viewed as f32 / f64 / f16. Gloo has no
//                                 bf16 sum, so supportsSum(bf16) is false and a bf16-wire SUM compressor is refused
//                                 when its pipeline is built (pipeline.h), before any step.
//   allgatherv                    dist.all_gather of equal blocks. torch.distributed has no variable-size all-gather,
//                                 so unequal blocks are padded to the largest (the sizes are known from
//                                 allgatherSizes) and compacted into `recv` afterwards: one collective, as the engine
//                                 expects, at the price of the padding, which the wire bytes count.
//   allgatherSizes                dist.all_gather of one int64 per rank.
//   broadcast, barrier            dist.broadcast, dist.barrier.
//   i* (non-blocking)             run at once and return a completed request: the engine's rounds run one after the
//                                 other on the aggregating thread, which is itself what overlaps backward.
//
// Byte accounting. torch.distributed does not report what it moved, so traffic() and each call's WireBytes count what
// gloo's algorithms move per rank, the model NCCL's communicator uses (nccl_communicator.h): a ring allreduce of B
// bytes sends and receives 2(n-1)/n x B (reduce-scatter then allgather, rounded down); a ring all-gather of n blocks of
// b (padded) sends and receives (n-1) x b; a broadcast runs a binomial tree from the root (gloo's), each rank sending B
// per child and receiving B once unless it is the root. No frame headers (gloo's are not visible from here); one
// frame per direction per call that moves bytes. World size 1 moves nothing.
//
// Devices (useDevice). A hook on CUDA gradients puts the communicator in device mode before any pipeline is built:
// every buffer the engine hands over is then CUDA memory of one device, ordered on one stream (deviceStream(), the
// stream the hook's codecs run on), and each call wraps it as a CUDA tensor (a DLPack capsule on kDLCUDA: no copy, no
// synchronization). The collectives are torch's on that device: NCCL, or gloo, which stages CUDA tensors through host
// memory itself. The caller runs the aggregation with torch's current stream set to
// deviceStream() (terse/torch.py does), so torch.distributed orders each collective after the kernels that produced its
// input and the kernels after it wait for it -- no host synchronization. Two calls need host words: allgatherSizes
// (variable-size payloads only) gathers them as a device tensor under NCCL and reads them back, one small copy each
// way; under gloo they stay host tensors. Unequal all-gather blocks are padded in device scratch, stream-ordered.
// supportsSum: NCCL sums f32, f64, f16 and bf16; gloo has no bf16 sum on either device.
//
// Failures. A torch.distributed error (a peer gone, the group's timeout) comes back as a Python exception, which this
// class turns into CommError carrying its message. Gloo cannot be aborted from here: abort() makes every later call of
// this communicator throw, and peers blocked in a collective are released by gloo itself when this process's
// connections close (process exit or destroy_process_group) or when the group's timeout expires.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compress/tensor_buffer.h"

namespace terse::python {

class TorchCommunicator final : public comm::Communicator {
 public:
  // `group`: a torch.distributed ProcessGroup, or None for the default group (looked up on every call, so a
  // re-initialized default group is seen). Rank and size are read now and checked by checkGroup(). Throws
  // InvalidArgument when torch.distributed is not initialized.
  explicit TorchCommunicator(pybind11::object group);
  ~TorchCommunicator() override;

  // Throws InvalidArgument when the group's rank or size is no longer the one this communicator (and every pipeline
  // built on it) was made for: a re-formed group needs a new hook.
  void checkGroup() const;
  // The group to pass to torch.distributed calls (None = the default group).
  pybind11::object groupObject() const;
  // The group's backend as torch names it ("gloo"), for provenance.
  const std::string& torchBackend() const noexcept { return torch_backend_; }
  // Device mode (see the top of this file): every later call's buffers are CUDA memory of `device`, ordered on
  // `stream` (a cudaStream_t, never null). Once, before the first call; throws Unsupported when the group's backend
  // cannot carry CUDA tensors (neither nccl nor gloo), naming it.
  void useDevice(int device, void* stream);
  bool deviceMemory() const noexcept override { return device_ >= 0; }
  void* deviceStream() const noexcept override { return stream_; }

  std::string_view backend() const noexcept override { return name_; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  bool supportsSum(DType dtype) const noexcept override;

  comm::WireBytes allreduce(void* data, std::size_t count, DType dtype, comm::ReduceOp op = comm::ReduceOp::kSum,
                            uint64_t tensor = comm::kNoTensor) override;
  comm::WireBytes allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                   uint64_t tensor = comm::kNoTensor) override;
  comm::WireBytes allgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                             std::span<const uint64_t> sizes, uint64_t tensor = comm::kNoTensor) override;
  comm::WireBytes allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = comm::kNoTensor) override;
  comm::WireBytes broadcast(std::span<std::byte> data, int root, uint64_t tensor = comm::kNoTensor) override;
  comm::WireBytes barrier() override;

  comm::CommRequest iallreduce(void* data, std::size_t count, DType dtype, comm::ReduceOp op = comm::ReduceOp::kSum,
                               uint64_t tensor = comm::kNoTensor) override;
  comm::CommRequest iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                      uint64_t tensor = comm::kNoTensor) override;
  comm::CommRequest iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                std::span<const uint64_t> sizes, uint64_t tensor = comm::kNoTensor) override;
  comm::CommRequest ibroadcast(std::span<std::byte> data, int root, uint64_t tensor = comm::kNoTensor) override;
  comm::CommRequest ibarrier() override;

  // The chained path (ddp_aggregator.h, beginChained): a view the caller passes to torch.distributed's asynchronous
  // all_reduce itself, and the accounting of that allreduce once it completed -- what call() records for the
  // blocking one: the op, `bytes` summed as `dtype`, `seconds` from issue to completion, the ring model's wire bytes
  // (returned). The view is not kept here: the caller holds it until the collective and its decode are done. Needs
  // the GIL (the view).
  pybind11::object sumView(void* data, std::size_t bytes, DType dtype);
  comm::WireBytes recordAllreduce(std::size_t bytes, uint64_t tensor, double seconds);

  void abort(const std::string& reason) override;
  comm::RankTraffic traffic() const override { return traffic_; }
  void resetTraffic() override;
  comm::CommStats stats() const override { return stats_; }

 private:
  // A torch tensor of `dtype` viewing `bytes` bytes at `data` (no copy), remembered in `in_call_` until the call ends.
  // In device mode `data` is device memory (see the top of this file).
  pybind11::object view(void* data, std::size_t bytes, DType dtype);
  // The same over host memory in either mode (allgatherSizes' words under gloo).
  pybind11::object hostView(void* data, std::size_t bytes, DType dtype);
  // All three (and sumView): a DLPack view on `device` (-1: the host), remembered nowhere.
  pybind11::object wrap(void* data, std::size_t bytes, DType dtype, int device);
  // Adds one collective to the accounting: its op, bytes and seconds under `kind`, `wire` under `kind` and `tensor`.
  // Returns `wire`.
  comm::WireBytes record(comm::OpKind kind, uint64_t tensor, uint64_t bytes, const comm::WireBytes& wire,
                         double seconds);
  // Runs one torch.distributed call: checks the GIL and the abort flag, turns a Python error into CommError, times it
  // and adds `wire` to the accounting under `kind` and `tensor`.
  template <class Fn>
  comm::WireBytes call(comm::OpKind kind, uint64_t tensor, uint64_t bytes, const comm::WireBytes& wire,
                       const char* what, Fn&& fn);

  pybind11::object dist_;
  pybind11::object torch_;
  pybind11::object group_;  // None = the default group
  pybind11::object from_dlpack_, all_reduce_, all_gather_, broadcast_, barrier_, get_rank_, get_world_size_;
  pybind11::object device_object_;  // device mode: torch.device("cuda", device_)
  int device_ = -1;                 // the CUDA device in device mode, -1 on the host
  void* stream_ = nullptr;
  std::string name_;           // "torch:<backend>"
  std::string torch_backend_;  // "gloo"
  int rank_ = 0;
  int size_ = 1;
  std::string aborted_;  // the reason, once aborted
  comm::RankTraffic traffic_;
  comm::CommStats stats_;
  // Unequal all-gather blocks, padded (grow-only), in the calls' memory: host, or the bound device in device mode.
  TensorBuffer pad_send_, pad_recv_;
  // The tensors handed to the last torch.distributed call, kept until the next call starts (or this communicator
  // dies). Gloo's worker thread (ProcessGroupGloo::runLoop in torch 1.13) drops its reference to a work's tensors
  // after the caller's wait has returned; were that the last reference, a tensor made in Python would need the GIL to
  // die there. Whoever holds the GIL while destroying the process group -- DDP's reducer, deallocated by the main
  // thread -- joins that thread, and the two wait for each other forever (seen at the end of a `terse run` of a
  // pytorch workload). Holding our reference past the call makes gloo's the earlier one, which needs no GIL.
  // When the call fails, gloo may still hold them and drop the last reference after ours; if the interpreter is
  // finalizing by then (the process is leaving after the error) the thread is killed inside a noexcept frame and the
  // process aborts ("terminate called without an active exception"). A failed call therefore leaks one reference to
  // each of its tensors: a few views per failed job, and every later call fails fast on aborted_.
  // Gloo's drop comes after the wait has returned, so a caller that goes on at once -- the next call's start, or this
  // communicator's destruction right after a step -- can still beat it: a run of bench_ddp_hooks.py hung so at its
  // end, in ~ProcessGroupGloo joining a gloo thread that waited for the GIL to free a tensor. So a call's tensors are
  // kept one call longer (before_call_), and the destructor leaves the last two calls' views alive (a few small
  // objects per communicator) rather than race gloo for the last reference.
  std::vector<pybind11::object> in_call_;
  std::vector<pybind11::object> before_call_;
};

}  // namespace terse::python
