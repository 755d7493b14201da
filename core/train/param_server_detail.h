// What the shard (param_server_shard.cc) and the client (param_server_client.cc) must agree on beyond the frames:
// which compressors can push, the tensor a piece is to both ends' codecs, and how both wait on the transport. Internal
// to core/train.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string_view>
#include <thread>

#include "core/comm/transport.h"
#include "core/common/error.h"
#include "core/compress/codec.h"
#include "core/train/param_server_plan.h"

namespace terse::train::ps_detail {

// Only SUM and ALLGATHER compressors with one round qualify: every push must be decodable on its own, and a parameter
// server has no aggregate of the other workers' payloads for CUSTOM's reduce or a later round's `prev`. The same holds
// for a pull compressor (`role` "pull compressor"): each delta pull decodes on its own.
inline void checkCompressor(const std::shared_ptr<const Compressor>& c, const char* role = "compressor") {
  if (!c) return;
  const CompressorCaps caps = c->caps(DType::kF32);
  const bool pull = std::string_view(role) != "compressor";
  TERSE_CHECK(caps.aggregation != Aggregation::kCustom, InvalidArgument,
              "parameter server: " << role << " '" << c->plugin().name << "' has CUSTOM aggregation; a "
                                   << (pull ? "pull" : "push") << " must be decodable on its own");
  TERSE_CHECK(caps.num_rounds == 1, InvalidArgument,
              "parameter server: " << role << " '" << c->plugin().name << "' has " << caps.num_rounds
                                   << " rounds; only single-round compressors can " << (pull ? "pull" : "push"));
  TERSE_CHECK((caps.devices & TERSE_DEVICE_HOST) != 0, InvalidArgument,
              "parameter server: " << role << " '" << c->plugin().name << "' has no host implementation");
}

// The seed of the pull compressor's codecs: another stream than the push codecs' of the same piece, rank and step, so
// that a stochastic compressor's rounding on the way down is independent of the worker's own on the way up.
inline uint64_t pullCodecSeed(uint64_t run_seed) {
  return run_seed ^ 0x9e37'79b9'7f4a'7c15ull;
}

// The worker's encoder and the shard's decoder of a piece must see the same tensor, or the payload would not decode.
inline TensorInfo pieceInfo(const PsPiece& p, int worker, int num_workers) {
  TensorInfo t;
  t.dtype = DType::kF32;
  t.numel = p.numel;
  t.ndim = 1;
  t.shape = {static_cast<int64_t>(p.numel), 0, 0, 0};
  t.tensor_id = p.id;
  t.rank = worker;
  t.world_size = num_workers;
  t.source_rank = worker;
  return t;
}

// The FLOP model of a simulation (rt::Kernel), as the sync path charges it (core/compress/pipeline.cc,
// core/train/sync_trainer.cc): a codec pass and an optimizer update read and write each element a few times.
inline constexpr double kCodecFlopsPerElement = 4;
inline constexpr double kUpdateFlopsPerElement = 4;

// No any-source receive exists on the transport, so shards and clients sweep over their receives and, when none was
// ready, wait. On a transport with a doorbell (comm::ActivityBell: the inproc transport in simulated time) they block
// until a frame reaches them or their own deadline (a heartbeat, a liveness timeout): a polling loop in simulated time
// would either advance the clock by its sleeps or, without them, never let another actor run. Elsewhere they poll,
// backing off when idle so that a waiting rank does not eat a core the others need.
class IdleWait {
 public:
  explicit IdleWait(comm::Transport& transport) : bell_(transport.activityBell()) {}
  // Before a sweep: what the bell had rung so far.
  void mark() {
    if (bell_) seen_ = bell_->rings();
  }
  // After a sweep that made `progress` or not; `deadline` (time_point::max(): none) is when the caller must look again
  // whatever arrives.
  void wait(bool progress, std::chrono::steady_clock::time_point deadline) {
    if (bell_) {
      if (!progress) bell_->waitUntil(seen_, deadline);
    } else if (progress) {
      idle_ = 0;
    } else if (++idle_ > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(50 * (idle_ - 64), 1000)));
    } else {
      std::this_thread::yield();
    }
  }

 private:
  comm::ActivityBell* bell_;
  uint64_t seen_ = 0;
  int idle_ = 0;  // rounds without progress (polling)
};

}  // namespace terse::train::ps_detail
