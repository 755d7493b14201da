#include "core/train/lane_pool.h"

#include "core/common/error.h"

namespace terse::train {

std::vector<Lane> openLanes(comm::Communicator& comm, int count) {
  std::vector<Lane> lanes;
  if (count <= 1) return lanes;
  for (int k = 0; k < count; ++k) {
    Lane lane;
    lane.channel = comm.openChannel();
    TERSE_CHECK(lane.channel != nullptr, InvalidArgument,
                "max_groups_in_flight " << count << " needs a communicator that runs collectives side by side; the '"
                                        << comm.backend() << "' communicator runs one at a time (use 1)");
    lane.engine = std::make_unique<AggregationEngine>(*lane.channel);
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

}  // namespace terse::train
