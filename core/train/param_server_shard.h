// The parameter server of async mode (DESIGN.md section 2; issue 7): the flat parameter vector is sharded by key
// ranges over S server shards, workers pull parameters and push compressed gradient chunks, each shard applies a push
// with an SGD step the moment it may (Li et al., "Scaling Distributed Machine Learning with the Parameter Server",
// OSDI 2014). Everything travels as frames over any comm::Transport, so the same shard serves threads (inproc) or
// processes (tcp) and every byte is counted by the transport's accounting. This file is one server shard; the job's
// ranks and pieces are param_server_plan.h, the frames param_server_wire.h, the worker's side param_server_client.h.
//
// Consistency: stale synchronous parallel (Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
// Parameter Server", NIPS 2013). Each shard keeps every worker's clock: the step it last pulled and the number of
// steps it completed (kClock). A pull for step t is held until every live worker completed t - s steps, and a push of
// step t until every live worker pulled step t - s; with s = 0 every worker reads exactly the parameters after all
// pushes of step t - 1 and none of step t, so the run is bulk synchronous and equals sync data-parallel SGD up to
// the summation order of the workers' gradients. s = kNoStalenessBound is plain async (apply on arrival).
//
// Elastic workers. A worker with a held request is live (it waits on the shard); otherwise it is live while the shard
// heard from it or replied to it within `worker_timeout`. A worker silent for longer is declared dead, dropped from
// the SSP minimum (so it no longer blocks the others) and refused from then on. Clients send kPing while they wait
// on another shard, so the timeout only has to exceed one step's compute time. A kBye leaves cleanly.
//
// Compression. A push's payload comes from the worker's codec chain for its piece (make_codec.h: error feedback and
// momentum correction stay on the worker, where the residual belongs) and is decoded on the shard by a plain plugin
// codec, one per (worker, piece): a stateful decoder's state follows one encoder's stream, as each source rank's does
// in the allgather path, so one decoder shared by several workers would mix their histories (cost: W x the plugin's
// state; stateless plugins keep none). Only SUM and ALLGATHER compressors with one round qualify: every push must be
// decodable on its own, and a parameter server has no aggregate of the other workers' payloads for CUSTOM's reduce or
// a later round's `prev`. A payload the plugin refuses, or one that decodes to a non-finite value, is refused.
//
// Compressed pulls. With a pull compressor the shard keeps, per worker, a replica of its range as that worker holds
// it: a full f32 pull (kPull) sets it to the parameters sent; a delta pull (kPullDelta) sends each piece's change since
// then, d = params - replica, through the pull compressor, and adds the decoded payload to the replica exactly as the
// worker adds it to its own copy (param_server_client.h): the shard decodes with a decoder per (worker, piece) that has
// seen the same payloads as the worker's, so both copies stay the same bits. What the compressor dropped stays in
// params - replica and travels with a later pull: error feedback on the way down, as in DoubleSqueeze's bidirectional
// compression (Tang et al., ICML 2019), with a replica per worker because asynchronous workers pull at different
// versions. A pull whose encode fails or decodes to a non-finite value is refused and the replica left as it was.
// Cost: W x the shard's range in replicas and two codecs per (worker, piece) (the encoder and the mirrored decoder).
// Row-sparse pieces travel as rows and are refused with a pull compressor.
//
// Accounting. ServerStats counts wire bytes (frame headers included) per worker in each direction, exactly what the
// transport counts on the shard's rank, except a frame the transport's receive itself refuses (longer than any valid
// request): the transport counts it but does not report its length to the shard.
//
// Replies. A reply is sent without waiting for it (isend): a step's W pull replies leave together and share the
// shard's NIC (with `nic: unlimited`, each on its own wire) as the link model says, rather than taking turns at one
// reply's latency and transfer each (W of them a step). Each reply's frame is held until its send completed; workers
// pulling the same step between the same pushes share one frame, so in lockstep one pull frame is in flight, and at
// worst one per worker (W x psMaxReplyBytes of the shard). A worker that dies before reading its reply no longer holds
// up the shard's other replies: its send is left in flight and dropped when run() returns.
//
// Known limits (next parts of issue 7): dead workers cannot rejoin; one thread per shard sweeps its workers'
// receives, since the transport has no any-source receive: it blocks on the transport's doorbell between sweeps where
// there is one (simulated time), and polls with a back-off elsewhere. stop() is seen at the next sweep (with a
// doorbell: after the next frame or timeout; aborting the transport rings it at once).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/comm/transport.h"
#include "core/common/runtime.h"
#include "core/compress/codec.h"
#include "core/train/optimizer.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_wire.h"

namespace terse::train {

inline constexpr uint64_t kNoStalenessBound = std::numeric_limits<uint64_t>::max();

struct ServerOptions {
  double lr = 0.1;
  // The learning rate of a push computed at worker step t (the run's schedule: warm-up, step decay, cosine); empty =
  // `lr` at every step. Called on the shard's thread.
  std::function<double(uint64_t step)> lr_schedule;
  // Momentum, Nesterov and weight decay, PyTorch-SGD formulas (optimizer.h) applied per push -- each push is one
  // optimizer update of its piece, as in MXNet's kvstore -- to d = (g + weight_decay * w) / W (with
  // average_over_workers), so W pushes of one step add up to one sync step's weight decay. With momentum the buffer
  // decays once per push, W times per round of the workers: s = 0 equals sync exactly only without momentum.
  SgdOptions sgd;
  // Applied gradients are scaled by 1 / num_workers, so that with s = 0 one step's W pushes sum to the mean gradient
  // of sync data-parallel SGD (sync_trainer.h averages the same way).
  bool average_over_workers = true;
  // Staleness-aware learning rate lr / tau (Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep
  // Learning", IJCAI 2016), tau = piece version now - the version the worker computed on, clamped to >= 1.
  bool staleness_aware_lr = false;
  uint64_t staleness_bound = kNoStalenessBound;  // s; 0 = lockstep (BSP)
  std::chrono::milliseconds worker_timeout{5000};
  // The compressor workers push with (SUM or ALLGATHER, one round); null = raw f32 payloads.
  std::shared_ptr<const Compressor> compressor;
  // The compressor of delta pulls ("Compressed pulls" above; SUM or ALLGATHER, one round); null = pulls carry the
  // parameters themselves and a delta pull is refused.
  std::shared_ptr<const Compressor> pull_compressor;
  uint64_t run_seed = 0;
  // Global steps (completed steps summed over every worker, dead ones included, divided by W: the step a sync run
  // would be at after as many gradients), increasing, at which the shard copies its parameters for evaluation. The
  // copy is taken while processing the clock that reaches the step, so with s = 0 it holds exactly the pushes of
  // steps < t: the parameters a sync run has after t steps.
  std::vector<uint64_t> snapshot_steps;
};

struct ServerStats {
  uint64_t pushes_applied = 0;
  uint64_t pulls_served = 0;
  uint64_t refused = 0;
  std::map<uint64_t, uint64_t> staleness;  // tau (unclamped) -> pushes applied with it
  std::vector<uint64_t> bytes_in;          // per worker: wire bytes received (frame headers included)
  std::vector<uint64_t> bytes_out;         // per worker: wire bytes sent
  std::vector<bool> dead;                  // per worker: declared dead after the timeout
  std::vector<std::chrono::steady_clock::time_point> dead_at;  // per worker: when (meaningful where dead)
  std::vector<std::string> errors;                             // the refusals' messages, in order
  // Compressed pulls: delta pulls served, and over them the sums of ||params - replica||^2 after each (what a worker's
  // copy still lacks: the compressor's residual) and of ||params||^2, both over the shard's range. sqrt of their ratio
  // is how far, relative to the parameters, the workers' copies are from the shard's parameters when they compute.
  uint64_t delta_pulls = 0;
  double pull_residual_sq = 0;
  double pull_params_sq = 0;
  // Pull reply frames (full and delta) allocated: the pools reuse them, so this stays near the most replies in flight
  // at once (W at worst), not the number of pulls.
  uint64_t pull_frames_allocated = 0;
};

struct ShardSnapshot {
  uint64_t step = 0;
  std::vector<float> params;  // the shard's range
  std::chrono::steady_clock::time_point taken;
  // Per worker, the steps it had completed (its clocks) when the snapshot was taken: the progress the snapshot holds.
  std::vector<uint64_t> completed;
  ServerStats stats;  // the shard's counters then
};

// One shard. run() serves until every worker said bye or was declared dead, or stop() was called; it throws
// CommError when the transport fails. The parameters and stats may be read after run() returned (or any time via
// stats(), under the shard's lock).
class ParamServerShard {
 public:
  // initial: the shard's range of the flat initial parameters (plan.ranges[shard] long). Throws InvalidArgument for a
  // bad shard, transport size != S + W, wrong initial size, or a compressor with CUSTOM aggregation or several rounds
  // (a push must be decodable alone: no aggregate of other workers' payloads exists on a parameter server).
  ParamServerShard(comm::Transport& transport, PsPlan plan, int shard, int num_workers, std::vector<float> initial,
                   ServerOptions options);
  ~ParamServerShard();

  void run();
  void stop() noexcept { stop_.store(true); }

  std::vector<float> params() const;
  std::vector<uint64_t> versions() const;  // per piece of this shard
  // With a pull compressor: worker's replica of the shard's range (what it holds after its last pull), empty before its
  // first full pull. Read it after run() returned (the shard's thread writes it).
  std::vector<float> replica(int worker) const;
  ServerStats stats() const;
  // Waits up to `timeout` (milliseconds::max(): as long as it takes) for the snapshot of options.snapshot_steps entry
  // `step` and hands it over (each is taken once); nullopt on timeout or once run() returned without taking it.
  std::optional<ShardSnapshot> takeSnapshot(uint64_t step, std::chrono::milliseconds timeout);
  bool finished() const;  // run() returned (or threw)

 private:
  struct Slot;
  bool process(int worker, Slot& slot);  // false: hold
  bool processPush(int worker, Slot& slot, const PsRequestHeader& h, std::span<const std::byte> payload);
  // A kPullDelta that SSP lets through: encodes each piece's change into a pull frame and sends it.
  void processDeltaPull(int worker, const PsRequestHeader& h);
  // A frame of `bytes` from `pool`, or a new one (counted in stats_.pull_frames_allocated).
  std::shared_ptr<std::vector<std::byte>> frameFrom(std::vector<std::shared_ptr<std::vector<std::byte>>>& pool,
                                                    std::size_t bytes);
  // One optimizer update of n elements at `at` in the shard's range with gradient g (caller holds mutex_).
  void update(uint64_t at, const float* g, uint64_t n, double lr);
  void refuse(int worker, const PsRequestHeader* h, const std::string& why);
  void reply(int worker, const PsReplyHeader& h, std::span<const std::byte> body);
  // Starts sending frame[0, n) to the worker; the frame is held until the send completed.
  void send(int worker, std::shared_ptr<const std::vector<std::byte>> frame, std::size_t n, uint64_t piece);
  // Lets go of the replies whose sends completed (their pull frames back to spare_); drops a worker whose send failed.
  void collectSends();
  void releasePull();  // last_pull_ is out of date: its frame goes back to spare_ unless a send still holds it
  bool live(int worker, std::chrono::steady_clock::time_point now) const;
  uint64_t minCompleted() const;
  uint64_t minPulled() const;
  // After a clock: copies the parameters for every snapshot step now reached.
  void maybeSnapshot();
  // The worker's connection failed while the job goes on (an expendable peer): dropped as dead at once.
  void lose(int worker, const std::string& why);

  comm::Transport& transport_;
  PsPlan plan_;
  int shard_;
  int num_workers_;
  ServerOptions options_;
  uint64_t begin_ = 0;
  uint64_t max_request_bytes_ = 0;
  std::vector<uint64_t> piece_versions_;              // by local piece index
  std::map<uint64_t, std::size_t> local_;             // piece id -> local index
  std::vector<std::unique_ptr<TensorCodec>> codecs_;  // [worker * local pieces + local], empty without compressor
  std::vector<float> grad_;  // decode scratch, the largest piece: a push's, or a delta pull's change and decode
  // Compressed pulls: per (worker, local piece), [worker * local pieces + local], the pull compressor's encoder (each
  // worker's random stream is its own), and the decoder that mirrors the worker's: per (worker, piece) too for a
  // stateful compressor, whose decoder's state follows one worker's stream; one per local piece for a stateless one
  // (each decode names its worker). Per local piece its largest payload; per worker its replica of the range.
  std::vector<std::unique_ptr<TensorCodec>> pull_encoders_, pull_mirrors_;
  std::vector<uint64_t> pull_max_payloads_;
  std::vector<std::vector<float>> replicas_;
  std::vector<bool> has_replica_;  // per worker: its full pull set replicas_ (a shard of empty pieces has an empty one)
  // Replies in flight (not waited on: replies to many workers share the shard's NIC). The frame is declared before the
  // request, so that a request dropped unfinished (at the end of run()) is destroyed while its frame still lives.
  struct Sending {
    int worker = 0;
    std::shared_ptr<const std::vector<std::byte>> frame;
    comm::Request request;
  };
  std::vector<Sending> sending_;
  // Pull frames (pull_frame_bytes_ each) whose sends completed, for the next pulls: at most as many exist as pull
  // replies were in flight at once, W x pull_frame_bytes_ at worst, one in lockstep (last_pull_).
  std::vector<std::shared_ptr<std::vector<std::byte>>> spare_;
  std::size_t pull_frame_bytes_ = 0;
  // The same for delta pull frames (delta_frame_bytes_ each: a compressed pull is sized by its compressor, a fraction
  // of a full pull's for a sparsifier).
  std::vector<std::shared_ptr<std::vector<std::byte>>> delta_spare_;
  std::size_t delta_frame_bytes_ = 0;
  // The last dense pull's frame: a pull of the same step and dtype before the next push (params_epoch_) is the same
  // bytes, sent again from the same frame.
  struct LastPull {
    std::shared_ptr<std::vector<std::byte>> frame;
    std::size_t bytes = 0;
    uint64_t epoch = 0;
    DType dtype = DType::kF32;
    uint64_t step = 0;
  };
  LastPull last_pull_;
  uint64_t params_epoch_ = 0;  // pushes applied: the parameters changed since a pull frame was encoded
  std::vector<std::unique_ptr<Slot>> slots_;
  std::atomic<bool> stop_{false};
  // The runtime's (core/common/runtime.h): the evaluation thread waits on snapshot_cv_, in simulated time too.
  mutable rt::Mutex mutex_;  // guards params_, stats_, snapshots_ and finished_ against readers on other threads
  std::vector<float> params_;
  std::vector<float> momentum_;  // the shard's range; empty when sgd.momentum is 0
  std::vector<float> sum_sq_;    // the shard's range; AdaGrad's sums of squared gradients (sgd.adagrad)
  ServerStats stats_;
  std::size_t next_snapshot_ = 0;                // index into options_.snapshot_steps (shard thread only)
  std::map<uint64_t, ShardSnapshot> snapshots_;  // taken, not yet handed over; guarded by mutex_
  rt::CondVar snapshot_cv_;
  bool finished_ = false;  // run() returned; guarded by mutex_
};

}  // namespace terse::train
