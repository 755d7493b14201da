#include "experiments/python/torch_communicator.h"

#include <Python.h>
#include <dlpack/dlpack.h>

#include <algorithm>

#include "core/comm/ring_model.h"
#include "core/comm/transport.h"
#include "core/common/error.h"

namespace py = pybind11;

namespace terse::python {
namespace {

using Clock = std::chrono::steady_clock;

// ---- The byte model of torch_communicator.h.

// A binomial tree from `root` (gloo's broadcast): relative rank v receives once from v minus its lowest set bit and
// sends to v + 2^k for every 2^k below that bit (below n for the root) that names a rank.
comm::WireBytes treeBroadcastWire(uint64_t bytes, int root, int rank, int n) {
  comm::WireBytes w;
  if (n <= 1 || bytes == 0) return w;
  const int v = (rank - root + n) % n;
  const int low = v == 0 ? n : (v & -v);
  if (v != 0) {
    w.received_bytes = bytes;
    w.received_frames = 1;
  }
  for (int k = 1; k < low && v + k < n; k <<= 1) {
    w.sent_bytes += bytes;
    ++w.sent_frames;
  }
  return w;
}

// DLPack's type of a dtype the engine may hand over; lanes 0 for one it never does.
DLDataType dlpackType(DType d) {
  switch (d) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF64:
      return {kDLFloat, 64, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kU8:
      return {kDLUInt, 8, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
    default:
      return {kDLFloat, 0, 0};
  }
}

// One view's DLPack descriptor with the shape and strides it points to. torch calls the deleter when its tensor's
// storage dies, from whichever thread drops the last reference: it frees this holder only, never the engine's memory.
struct DlpackView {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  int64_t strides[1] = {1};
};

void deleteDlpackView(DLManagedTensor* m) {
  delete static_cast<DlpackView*>(m->manager_ctx);
}

// The capsule's destructor: torch renames a capsule it consumed ("used_dltensor", the tensor then owns the view); one
// it never consumed (a failed call) still owns it.
void dlpackCapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor") != 0) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    m->deleter(m);
  }
}

}  // namespace

TorchCommunicator::TorchCommunicator(py::object group) : group_(std::move(group)) {
  TERSE_CHECK(PyGILState_Check(), InternalError, "TorchCommunicator: created without the GIL");
  dist_ = py::module_::import("torch.distributed");
  torch_ = py::module_::import("torch");
  TERSE_CHECK(dist_.attr("is_available")().cast<bool>() && dist_.attr("is_initialized")().cast<bool>(), InvalidArgument,
              "terse.torch: torch.distributed is not initialized; call torch.distributed.init_process_group first");
  from_dlpack_ = py::module_::import("torch.utils.dlpack").attr("from_dlpack");
  all_reduce_ = dist_.attr("all_reduce");
  all_gather_ = dist_.attr("all_gather");
  broadcast_ = dist_.attr("broadcast");
  barrier_ = dist_.attr("barrier");
  get_rank_ = dist_.attr("get_rank");
  get_world_size_ = dist_.attr("get_world_size");
  rank_ = get_rank_(groupObject()).cast<int>();
  size_ = get_world_size_(groupObject()).cast<int>();
  TERSE_CHECK(rank_ >= 0 && size_ >= 1, InvalidArgument,
              "terse.torch: this process is not a member of the given process group (rank " << rank_ << ")");
  torch_backend_ = py::str(dist_.attr("get_backend")(groupObject())).cast<std::string>();
  name_ = "torch:" + torch_backend_;
  traffic_.rank = rank_;
}

TorchCommunicator::~TorchCommunicator() {
  // The Python references must be dropped with the GIL held; the owner may be destroyed from a thread without it.
  py::gil_scoped_acquire gil;
  for (py::object* o : {&dist_, &torch_, &group_, &from_dlpack_, &all_reduce_, &all_gather_, &broadcast_, &barrier_,
                        &get_rank_, &get_world_size_, &device_object_})
    *o = py::object();
  // The last calls' tensors are left alive, not dropped: this may run right after the last collective, before gloo's
  // thread has let go of it, and ours would then not be the last reference (see in_call_ in the header).
  for (std::vector<py::object>* calls : {&before_call_, &in_call_})
    for (py::object& t : *calls) t.release();
}

void TorchCommunicator::useDevice(int device, void* stream) {
  TERSE_CHECK(device >= 0 && stream != nullptr, InvalidArgument,
              "terse.torch: a CUDA communicator needs a device ordinal and a stream, got device " << device);
  TERSE_CHECK(device_ < 0 || (device_ == device && stream_ == stream), InvalidArgument,
              "terse.torch: the communicator is bound to cuda:" << device_ << " already");
  // NCCL carries CUDA tensors; gloo stages them through the host itself. Others (mpi, ucc) are not known to carry
  // every collective the engine issues on CUDA tensors, so they are refused before any collective.
  TERSE_CHECK(torch_backend_ == "nccl" || torch_backend_ == "gloo", Unsupported,
              "terse.torch: the process group's backend '" << torch_backend_
                                                           << "' cannot carry the CUDA payloads of this hook; use a "
                                                              "process group with backend 'nccl' (or 'gloo')");
  py::gil_scoped_acquire gil;
  device_object_ = torch_.attr("device")("cuda", device);
  device_ = device;
  stream_ = stream;
}

py::object TorchCommunicator::groupObject() const {
  return group_ ? group_ : py::none();
}

void TorchCommunicator::checkGroup() const {
  py::gil_scoped_acquire gil;
  const int size = get_world_size_(groupObject()).cast<int>();
  const int rank = get_rank_(groupObject()).cast<int>();
  TERSE_CHECK(size == size_ && rank == rank_, InvalidArgument,
              "terse.torch: the hook was built for rank " << rank_ << " of a process group of " << size_
                                                          << ", the group is now rank " << rank << " of " << size
                                                          << "; build a new terse.torch.CompressionState for the new "
                                                             "group");
}

bool TorchCommunicator::supportsSum(DType dtype) const noexcept {
  // Gloo's allreduce sums float, double and half; it rejects bfloat16 ("Invalid scalar type"). NCCL sums all four.
  if (dtype == DType::kBF16) return torch_backend_ == "nccl";
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16;
}

py::object TorchCommunicator::view(void* data, std::size_t bytes, DType dtype) {
  in_call_.push_back(wrap(data, bytes, dtype, device_));
  return in_call_.back();
}

py::object TorchCommunicator::hostView(void* data, std::size_t bytes, DType dtype) {
  in_call_.push_back(wrap(data, bytes, dtype, -1));
  return in_call_.back();
}

py::object TorchCommunicator::sumView(void* data, std::size_t bytes, DType dtype) {
  TERSE_CHECK(
      supportsSum(dtype), Unsupported,
      "terse.torch: allreduce of " << dtypeName(dtype) << " is not supported by " << name_ << " (f32, f64, f16 sums)");
  return wrap(data, bytes, dtype, device_);  // not in in_call_: the caller keeps it (see the header)
}

comm::WireBytes TorchCommunicator::recordAllreduce(std::size_t bytes, uint64_t tensor, double seconds) {
  if (bytes == 0) return {};
  return record(comm::OpKind::kAllreduce, tensor, bytes, comm::symmetricWire(comm::ringAllreduceBytes(bytes, size_)),
                seconds);
}

comm::WireBytes TorchCommunicator::record(comm::OpKind kind, uint64_t tensor, uint64_t bytes,
                                          const comm::WireBytes& wire, double seconds) {
  comm::OpStats& s = stats_.by_kind[static_cast<std::size_t>(kind)];
  ++s.ops;
  s.bytes += bytes;
  s.seconds += seconds;
  const auto add = [&](comm::DirectionTraffic& d, uint64_t b, uint64_t frames) {
    const comm::FrameCount c{b, frames};
    d.by_kind[static_cast<std::size_t>(kind)] += c;
    d.by_tensor[tensor] += c;
  };
  add(traffic_.sent, wire.sent_bytes, wire.sent_frames);
  add(traffic_.received, wire.received_bytes, wire.received_frames);
  return wire;
}

py::object TorchCommunicator::wrap(void* data, std::size_t bytes, DType dtype, int device) {
  const DLDataType type = dlpackType(dtype);
  TERSE_CHECK(type.lanes != 0, Unsupported, "terse.torch: no torch dtype for " << dtypeName(dtype));
  auto view = std::make_unique<DlpackView>();
  view->shape[0] = static_cast<int64_t>(bytes / dtypeSize(dtype));
  DLTensor& t = view->managed.dl_tensor;
  t.data = data;
  t.device = device >= 0 ? DLDevice{kDLCUDA, device} : DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = type;
  t.shape = view->shape;
  t.strides = view->strides;
  t.byte_offset = 0;
  view->managed.manager_ctx = view.get();
  view->managed.deleter = deleteDlpackView;
  PyObject* capsule = PyCapsule_New(&view->managed, "dltensor", dlpackCapsuleDestructor);
  if (capsule == nullptr) throw py::error_already_set();
  view.release();  // the capsule owns it now, then the tensor
  return from_dlpack_(py::reinterpret_steal<py::object>(capsule));
}

template <class Fn>
comm::WireBytes TorchCommunicator::call(comm::OpKind kind, uint64_t tensor, uint64_t bytes, const comm::WireBytes& wire,
                                        const char* what, Fn&& fn) {
  py::gil_scoped_acquire gil;  // the aggregation runs without it (torch_communicator.h)
  if (!aborted_.empty()) throw comm::CommError("terse.torch: " + std::string(what) + " after abort: " + aborted_);
  const auto start = Clock::now();
  // The tensors of the call before the previous one: gloo let go of them long ago (see in_call_ in the header).
  before_call_.clear();
  std::swap(before_call_, in_call_);
  try {
    fn();
  } catch (py::error_already_set& e) {
    // The torch.distributed error (a peer gone, a timeout) with its own message; later calls fail fast.
    aborted_ = std::string(what) + " failed: " + e.what();
    for (py::object& t : in_call_) t.release();  // leaked on purpose: see in_call_ in the header
    in_call_.clear();
    throw comm::CommError("terse.torch: " + aborted_);
  }
  return record(kind, tensor, bytes, wire, std::chrono::duration<double>(Clock::now() - start).count());
}

comm::WireBytes TorchCommunicator::allreduce(void* data, std::size_t count, DType dtype, comm::ReduceOp op,
                                             uint64_t tensor) {
  TERSE_CHECK(
      op == comm::ReduceOp::kSum && supportsSum(dtype), Unsupported,
      "terse.torch: allreduce of " << dtypeName(dtype) << " is not supported by " << name_ << " (f32, f64, f16 sums)");
  const std::size_t bytes = count * dtypeSize(dtype);
  if (bytes == 0) return {};
  return call(comm::OpKind::kAllreduce, tensor, bytes, comm::symmetricWire(comm::ringAllreduceBytes(bytes, size_)),
              "all_reduce", [&] { all_reduce_(view(data, bytes, dtype), py::arg("group") = groupObject()); });
}

comm::WireBytes TorchCommunicator::allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                                    uint64_t tensor) {
  TERSE_CHECK(
      prefix_bytes <= payload.size(), InvalidArgument,
      "terse.torch: allreducePayload prefix of " << prefix_bytes << " bytes beyond a payload of " << payload.size());
  const std::size_t body = payload.size() - prefix_bytes;
  TERSE_CHECK(body % dtypeSize(wire) == 0, InvalidArgument,
              "terse.torch: a payload body of " << body << " bytes is not whole " << dtypeName(wire) << " elements");
  return allreduce(payload.data() + prefix_bytes, body / dtypeSize(wire), wire, comm::ReduceOp::kSum, tensor);
}

comm::WireBytes TorchCommunicator::allgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                              std::span<const uint64_t> sizes, uint64_t tensor) {
  TERSE_CHECK(sizes.size() == static_cast<std::size_t>(size_), InvalidArgument,
              "terse.torch: allgatherv got " << sizes.size() << " sizes for a group of " << size_);
  TERSE_CHECK(send.size() == sizes[static_cast<std::size_t>(rank_)], InvalidArgument,
              "terse.torch: allgatherv: rank " << rank_ << " sends " << send.size() << " bytes but sizes says "
                                               << sizes[static_cast<std::size_t>(rank_)]);
  uint64_t total = 0, largest = 0;
  for (uint64_t s : sizes) {
    total += s;
    largest = std::max(largest, s);
  }
  TERSE_CHECK(recv.size() == total, InvalidArgument,
              "terse.torch: allgatherv: recv holds " << recv.size() << " bytes, the blocks add up to " << total);
  if (largest == 0) return {};
  const auto n = static_cast<std::size_t>(size_);
  const bool equal = std::all_of(sizes.begin(), sizes.end(), [&](uint64_t s) { return s == largest; });
  const auto block = static_cast<std::size_t>(largest);
  // Equal blocks go straight into recv; unequal ones through padded scratch (see the header).
  std::byte* out = recv.data();
  const std::byte* in = send.data();
  const Placement where = device_ >= 0 ? Placement::cuda(stream_) : Placement::host();
  if (!equal) {
    // Scratch in the call's memory (host, or the bound device), copies ordered on its stream there.
    growBuffer(pad_send_, block, where);
    growBuffer(pad_recv_, block * n, where);
    copyBytes(pad_send_.data(), send.data(), send.size(), where);
    in = pad_send_.data();
    out = pad_recv_.data();
  }
  const comm::WireBytes wire = comm::symmetricWire(comm::ringAllgatherBytes(largest, size_));
  call(comm::OpKind::kAllgather, tensor, total, wire, "all_gather", [&] {
    py::list outputs;
    for (std::size_t r = 0; r < n; ++r) outputs.append(view(out + r * block, block, DType::kU8));
    // The input is only read: all_gather never writes its input.
    all_gather_(outputs, view(const_cast<std::byte*>(in), block, DType::kU8), py::arg("group") = groupObject());
  });
  if (!equal) {
    // Stream-ordered on the device: the gather's completion is already ordered before it on deviceStream().
    std::size_t at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      copyBytes(recv.data() + at, out + r * block, static_cast<std::size_t>(sizes[r]), where);
      at += static_cast<std::size_t>(sizes[r]);
    }
  }
  return wire;
}

comm::WireBytes TorchCommunicator::allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  TERSE_CHECK(all.size() == static_cast<std::size_t>(size_), InvalidArgument,
              "terse.torch: allgatherSizes got room for " << all.size() << " sizes in a group of " << size_);
  all[static_cast<std::size_t>(rank_)] = mine;
  if (size_ == 1) return {};
  const comm::WireBytes wire = comm::symmetricWire(comm::ringAllgatherBytes(sizeof(uint64_t), size_));
  if (device_ >= 0 && torch_backend_ == "nccl") {
    // NCCL gathers device tensors only: the word goes up, the n words come back (the read-back waits for the stream).
    return call(comm::OpKind::kAllgather, tensor, all.size() * sizeof(uint64_t), wire, "all_gather (sizes)", [&] {
      py::object int64 = torch_.attr("int64");
      py::object words = torch_.attr("empty")(static_cast<py::ssize_t>(all.size()), py::arg("dtype") = int64,
                                              py::arg("device") = device_object_);
      py::object word = torch_.attr("full")(py::make_tuple(1), static_cast<int64_t>(mine), py::arg("dtype") = int64,
                                            py::arg("device") = device_object_);
      in_call_.push_back(words);
      in_call_.push_back(word);
      all_gather_(py::list(words.attr("chunk")(static_cast<py::ssize_t>(all.size()))), word,
                  py::arg("group") = groupObject());
      const auto values = words.attr("tolist")().cast<std::vector<int64_t>>();
      for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<uint64_t>(values[r]);
    });
  }
  return call(comm::OpKind::kAllgather, tensor, all.size() * sizeof(uint64_t), wire, "all_gather (sizes)", [&] {
    py::list outputs;
    for (uint64_t& s : all) outputs.append(hostView(&s, sizeof s, DType::kI64));
    all_gather_(outputs, hostView(&mine, sizeof mine, DType::kI64), py::arg("group") = groupObject());
  });
}

comm::WireBytes TorchCommunicator::broadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  TERSE_CHECK(root >= 0 && root < size_, InvalidArgument,
              "terse.torch: broadcast root " << root << " outside a group of " << size_);
  if (data.empty()) return {};
  return call(comm::OpKind::kBroadcast, tensor, data.size(), treeBroadcastWire(data.size(), root, rank_, size_),
              "broadcast", [&] {
                // torch.distributed names the root by its global rank.
                py::object src = group_ ? dist_.attr("get_global_rank")(group_, root) : py::int_(root);
                broadcast_(view(data.data(), data.size(), DType::kU8), src, py::arg("group") = groupObject());
              });
}

comm::WireBytes TorchCommunicator::barrier() {
  return call(comm::OpKind::kBarrier, comm::kNoTensor, 0, {}, "barrier",
              [&] { barrier_(py::arg("group") = groupObject()); });
}

namespace {

// A request that completed before it was returned (torch_communicator.h: the i* calls run at once).
comm::CommRequest done(const comm::WireBytes& wire) {
  auto state = std::make_shared<comm::CommRequest::State>();
  state->wire = wire;
  state->done.complete();
  return comm::CommRequest(std::move(state));
}

}  // namespace

comm::CommRequest TorchCommunicator::iallreduce(void* data, std::size_t count, DType dtype, comm::ReduceOp op,
                                                uint64_t tensor) {
  return done(allreduce(data, count, dtype, op, tensor));
}
comm::CommRequest TorchCommunicator::iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes,
                                                       DType wire, uint64_t tensor) {
  return done(allreducePayload(payload, prefix_bytes, wire, tensor));
}
comm::CommRequest TorchCommunicator::iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                                 std::span<const uint64_t> sizes, uint64_t tensor) {
  return done(allgatherv(send, recv, sizes, tensor));
}
comm::CommRequest TorchCommunicator::ibroadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  return done(broadcast(data, root, tensor));
}
comm::CommRequest TorchCommunicator::ibarrier() {
  return done(barrier());
}

void TorchCommunicator::abort(const std::string& reason) {
  if (aborted_.empty()) aborted_ = reason;
}

void TorchCommunicator::resetTraffic() {
  traffic_ = comm::RankTraffic{};
  traffic_.rank = rank_;
}

}  // namespace terse::python
