#include "core/comm/nccl_bootstrap.h"

#include <cstring>

#include "core/comm/transport.h"
#include "core/common/error.h"

namespace terse::comm {

std::string ncclUniqueIdKey(std::string_view prefix) {
  return std::string(prefix) + "nccl/unique_id";
}

void publishNcclUniqueId(Store& store, std::string_view prefix, const NcclUniqueIdBytes& id) {
  store.set(ncclUniqueIdKey(prefix), std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
}

NcclUniqueIdBytes fetchNcclUniqueId(Store& store, std::string_view prefix, int rank,
                                    std::chrono::milliseconds timeout) {
  const std::string key = ncclUniqueIdKey(prefix);
  std::string value;
  try {
    value = store.get(key, timeout);
  } catch (const CommError& e) {
    TERSE_THROW(CommError, "nccl bootstrap: rank " << rank << " got no NCCL unique id under '" << key << "' within "
                                                   << timeout.count()
                                                   << " ms (rank 0 publishes it: is it running, with the same store "
                                                      "and prefix?): "
                                                   << e.what());
  }
  TERSE_CHECK(value.size() == kNcclUniqueIdBytes, InvalidPayload,
              "nccl bootstrap: the value under '" << key << "' has " << value.size() << " bytes, an NCCL unique id has "
                                                  << kNcclUniqueIdBytes);
  NcclUniqueIdBytes id;
  std::memcpy(id.data(), value.data(), id.size());
  return id;
}

int selectCudaDevice(int local_rank, int local_world_size, int device_count) {
  TERSE_CHECK(local_world_size >= 1 && local_rank >= 0 && local_rank < local_world_size, InvalidArgument,
              "nccl: local rank " << local_rank << " outside a local world of " << local_world_size);
  TERSE_CHECK(device_count >= 1, InvalidArgument, "nccl: no CUDA device visible to local rank " << local_rank);
  if (device_count >= local_world_size) return local_rank;
  if (device_count == 1) return 0;
  TERSE_THROW(InvalidArgument, "nccl: " << local_world_size << " processes on this node but " << device_count
                                        << " visible CUDA devices (one process per GPU; local rank " << local_rank
                                        << " has none of its own)");
}

}  // namespace terse::comm
