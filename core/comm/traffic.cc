#include "core/comm/traffic.h"

namespace terse::comm {

void TrafficCounter::record(Side& side, const FrameMeta& meta, uint64_t payload_bytes) {
  const FrameCount one{frameWireBytes(payload_bytes), 1};
  std::lock_guard lock(side.mutex);
  side.traffic.by_kind[static_cast<std::size_t>(meta.kind)] += one;
  if (side.last == nullptr || side.last_tensor != meta.tensor) {
    side.last = &side.traffic.by_tensor[meta.tensor];
    side.last_tensor = meta.tensor;
  }
  *side.last += one;
}

RankTraffic TrafficCounter::snapshot() const {
  RankTraffic t;
  t.rank = rank_;
  {
    std::lock_guard lock(sent_.mutex);
    t.sent = sent_.traffic;
  }
  {
    std::lock_guard lock(received_.mutex);
    t.received = received_.traffic;
  }
  return t;
}

void TrafficCounter::reset() {
  {
    std::lock_guard lock(sent_.mutex);
    sent_.traffic = DirectionTraffic{};
    sent_.last = nullptr;
  }
  std::lock_guard lock(received_.mutex);
  received_.traffic = DirectionTraffic{};
  received_.last = nullptr;
}

}  // namespace terse::comm
