// Byte accounting (DESIGN.md section 6): every frame a transport moves is counted with its header, per rank, per
// operation kind and per tensor label, on the sending side and on the receiving side. Results report these measured
// wire bytes beside the payload bytes a compressor produced.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/comm/frame.h"

namespace terse::comm {

struct FrameCount {
  uint64_t bytes = 0;  // wire bytes: headers + payloads
  uint64_t frames = 0;
  FrameCount& operator+=(const FrameCount& o) {
    bytes += o.bytes;
    frames += o.frames;
    return *this;
  }
  friend bool operator==(const FrameCount&, const FrameCount&) = default;
};

// One direction (sent or received) of one rank's traffic.
struct DirectionTraffic {
  std::array<FrameCount, kNumOpKinds> by_kind{};
  std::map<uint64_t, FrameCount> by_tensor;  // kNoTensor collects frames without a label
  FrameCount total() const {
    FrameCount t;
    for (const auto& k : by_kind) t += k;
    return t;
  }
  const FrameCount& kind(OpKind k) const { return by_kind[static_cast<std::size_t>(k)]; }
  FrameCount tensor(uint64_t id) const {
    auto it = by_tensor.find(id);
    return it == by_tensor.end() ? FrameCount{} : it->second;
  }
};

struct RankTraffic {
  int rank = 0;
  DirectionTraffic sent;
  DirectionTraffic received;
};

// The counters of one rank. record* are called from any thread (a rank's own threads when it sends, the peer's when
// it delivers); snapshot and reset from any thread. One mutex per rank and direction, never a global one: two ranks
// counting never contend.
class TrafficCounter {
 public:
  explicit TrafficCounter(int rank) : rank_(rank) {}
  void recordSent(const FrameMeta& meta, uint64_t payload_bytes) { record(sent_, meta, payload_bytes); }
  void recordReceived(const FrameMeta& meta, uint64_t payload_bytes) { record(received_, meta, payload_bytes); }
  RankTraffic snapshot() const;
  void reset();

 private:
  // A line of its own each: a rank's sent side is written by its own thread, its received side by its peers'
  // (the inproc transport counts both ends at send).
  struct alignas(64) Side {
    mutable std::mutex mutex;
    // Guarded by mutex.
    DirectionTraffic traffic;
    // The by_tensor entry the last frame went to: a collective's frames come in runs of one tensor, and at a
    // thousand simulated ranks the map walk per frame was 1-3% of a step in cache misses. A map's nodes stay put
    // until erased, which only reset() does (it clears this too).
    uint64_t last_tensor = 0;
    FrameCount* last = nullptr;
  };
  static void record(Side& side, const FrameMeta& meta, uint64_t payload_bytes);

  int rank_;
  Side sent_;
  Side received_;
};

}  // namespace terse::comm
