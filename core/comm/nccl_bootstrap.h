// The store side of starting an NCCL communicator (nccl_communicator.h), kept free of NCCL and CUDA so every build
// compiles it and CPU-only CI tests it: which key carries the job's NCCL unique id, how it is published and fetched
// (a missing rank 0 becomes a CommError naming the key and the timeout, never a hang), and which GPU a process takes.
//
// The unique id is NCCL's opaque 128-byte handle (NCCL_UNIQUE_ID_BYTES, checked against nccl.h where NCCL is built):
// rank 0 gets it from ncclGetUniqueId and `set`s it, raw, under `<prefix>nccl/unique_id`; every other rank `get`s it.
// Store values are bytes on every store (store.proto's value is `bytes`), so no encoding is needed, and the length is
// checked on the way in because a store is shared: a value of another length is another writer's, not an id.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "core/comm/store.h"

namespace terse::comm {

inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<std::byte, kNcclUniqueIdBytes>;

// `<prefix>nccl/unique_id`: the prefix is the job's (or the benchmark's) namespace in a shared store.
std::string ncclUniqueIdKey(std::string_view prefix);

// Rank 0: publishes the id for the others.
void publishNcclUniqueId(Store& store, std::string_view prefix, const NcclUniqueIdBytes& id);

// Ranks > 0: waits up to `timeout` for rank 0's id. Throws CommError naming this rank, the key and the timeout when it
// does not appear (rank 0 did not start, or runs with another prefix), InvalidPayload when the value is not 128 bytes.
NcclUniqueIdBytes fetchNcclUniqueId(Store& store, std::string_view prefix, int rank, std::chrono::milliseconds timeout);

// The CUDA device a process takes, one process per GPU: local rank i takes device i when the node shows at least
// local_world_size devices; when it shows exactly one, every process takes device 0, because the launcher gave each
// its own GPU through CUDA_VISIBLE_DEVICES (SLURM's --gpus-per-task does). Any other shortfall is a configuration
// error (two processes on one GPU make NCCL fail later with a less clear message): InvalidArgument naming the local
// rank, the local world size and the device count.
int selectCudaDevice(int local_rank, int local_world_size, int device_count);

}  // namespace terse::comm
