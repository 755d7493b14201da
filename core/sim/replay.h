// What-if replay (issue 40, `terse whatif`): a recorded step trace (core/train/step_trace.h) played on a simulated
// cluster of N workers, N far beyond what the full simulation of every worker's math can reach (16,384 workers of a
// ResNet-50-sized trace, where the full simulation stops near a thousand workers of softmax regression).
//
// What is simulated, and how (DESIGN.md section 9):
//   - Compute. Each worker runs its recorded segments in order, scaled by compute_scale (and a straggler's factor,
//     and a seeded lognormal jitter per segment): the forward of layer i waits for the previous step's update of the
//     tensors of layer i (a PyTorch trace's for its whole optimizer step); the backward of layer i makes its `ready`
//     tensors ready.
//   - Communication. The groups run in the recorded issue order (the scheduler's: fifo and priority differ here), one
//     at a time on each worker's communication side, each once all its tensors are ready on that worker (a group of no
//     tensor, a PyTorch local SGD averaging's check or buffers, once the step's computation has ended). Compress and
//     decompress take their recorded times (scaled); a collective starts when the last worker reaches it and ends,
//     for all, its network time later; then the updates of the tensors whose last chunk it carried (recorded times,
//     scaled), on the communication side. The step ends when every update is in. A PyTorch trace (source "pytorch",
//     experiments/python/hook_trace.h) updates after its step's last group instead, one tensor after the other (after
//     its computation where the step has no group: a local SGD step): the script's optimizer.step() runs once backward
//     has returned.
//   - The scheduler negotiation. The recorded rounds (rank 0's; their count depends on the recorded paces) are
//     8-byte allgathers of every worker, by the algorithm they ran (Bruck's), priced at N. The last round before a
//     group agreed on its tensors: it starts once they are ready on every worker, and the group after it. The earlier
//     ones ran while the communication side waited, from when it was free; rounds after a step's last group hold up
//     the next step's communication.
//   - Collectives at N. The algorithm is the one the trace's configuration asks for, `auto` resolved at N by the
//     communicator's own rule (core/comm/allreduce_auto.h, allgather_auto.h); allgatherv blocks are redrawn at N from
//     the recorded per-rank sizes (worker w sends rank_bytes[w mod W]), so what each worker receives grows with N.
//
// The network macro-model. The full simulation sends each of a ring's 2 (N-1) steps as N messages; at 16,384 workers
// and 160 buckets a step that is 5e9 SimGrid messages. Here each algorithm is a short list of rounds, each round a
// pattern of flows (a ring: every worker to its successor; recursive doubling: one pattern per distance; a tree: each
// child to its parent) carrying equal bytes and paying a count of latencies:
//     round time = latencies x L + bytes x s
// where L is the longest route latency among the pattern's flows and s the seconds per byte of its slowest flow when
// all of them run at once on the SimGrid platform (CM02 max-min sharing, the topology's links: the NICs, the racks'
// oversubscribed uplinks). s is measured once per pattern, before the replay, in one simulation: the pattern's flows
// that share a link form a component (max-min couples nothing else), and whole components are timed together in
// batches of about 512 flows, with a probe size; the replay then prices every collective from the rounds. So the
// measurement is linear in N (but for one component of all N flows: a flat core link shared by every inter-node
// flow), and the steps add only the per-worker timeline (O(N x segments) with jitter; one worker per behaviour
// without it, since identical workers have identical timelines).
//
// Where it must differ from the full simulation: a round's flows are taken to start together and to share for the
// whole round (a ring's 2 (N-1) steps are one flow of their summed bytes and 2 (N-1) latencies; a tree's phase is
// D latencies and D + k - 1 segment times, scripts/validate-alpha-beta's per-segment pipeline); frames' 32-byte
// headers, the streams' pieces and the communicator's CPU work per message are not modelled; blocks of unequal size
// (allgatherv) are priced at their mean; one collective runs at a time in the whole cluster (each worker issues one
// group at a time and a collective needs every worker), so two groups never share the network. Codec and update times
// are the recorded ones: a codec whose time depends on the world size (an allgather's decode) keeps the recorded
// world's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/comm/link_emulation.h"
#include "core/sim/platform.h"
#include "core/train/step_trace.h"

namespace terse::sim {

struct ReplayOptions {
  int workers = 1;
  comm::EmulationConfig links;  // the mesh of per-pair wires, when `topology` is not enabled
  TwoLevelTopology topology;
  int steps = 0;               // steps to replay; 0: as many as the trace holds (a longer replay cycles its steps)
  double compute_scale = 1.0;  // every recorded compute, codec and update time is multiplied by this
  double jitter_sigma = 0;     // > 0: each compute segment is multiplied by exp(N(0, sigma^2)), seeded
  uint64_t seed = 1;
  int stragglers = 0;           // the first `stragglers` workers compute straggler_factor times slower
  double straggler_factor = 1;  // >= 1
  // Compute by a device's FLOP rate instead of a factor: with both > 0, compute_scale becomes (step_flops /
  // device_flops) / the trace's median step compute (rank 0's segments), so a step computes as long as the model's
  // training FLOPs per worker step take at the device's effective rate. compute_scale must then be left at 1.
  double step_flops = 0;
  double device_flops = 0;
  // Codec (compress, decompress) times are multiplied by this instead of compute_scale when it is > 0: a trace
  // recorded on a CPU replayed for a GPU, whose codecs and layers do not speed up alike.
  double codec_scale = 0;
  // The order the groups are issued in. kRecorded: the trace's (its scheduler's, or DDP's bucket order), with its
  // update rule (a PyTorch trace updates after the step's last group). kFifo and kPriority re-issue them as a
  // ByteScheduler-style scheduler would: whenever the communication side is free, the group ready first (kFifo) or
  // the ready group holding the front-most layer (kPriority: P3), and each tensor is updated as soon as its last
  // group is in, so the next step's forward starts on the front layers while the back ones still communicate (a
  // PyTorch trace's tensors no group carried, a local SGD step's, are updated one after the other after backward).
  // Neither applies to a trace whose scheduler negotiated its order (checkReorderable).
  enum class Order { kRecorded, kFifo, kPriority };
  Order order = Order::kRecorded;
  // The collective algorithms, when not the trace's configured ones ("auto" resolved at N, as the communicator
  // would): a name of comm::parseAllreduceAlgorithm / parseAllgatherAlgorithm, e.g. "ring" for NCCL's ring. Empty:
  // the trace's.
  std::string allreduce;
  std::string allgather;
  // Throws InvalidArgument naming the option (workers < 1, compute_scale <= 0, a topology that cannot hold the
  // workers...).
  void validate() const;
};

// One class of links (the NICs, the racks' uplinks...): how many, their summed capacity, what crossed them.
struct LinkClassUse {
  std::string name;
  int links = 0;
  double capacity_bytes_per_s = 0;  // summed over the class's links
  double bytes = 0;                 // bytes that crossed a link of the class, over the whole replay
  double utilisation = 0;           // bytes / (capacity x replayed time)
};

struct ReplayResult {
  int workers = 0;
  std::string platform;        // describePlatform
  std::vector<double> step_s;  // each replayed step's time (end of its last update minus the previous step's)
  double mean_step_s = 0;
  double median_step_s = 0;
  double compute_s = 0;    // per step: the busiest worker's compute (segments), mean over steps
  double optimizer_s = 0;  // per step: the busiest worker's updates (recorded, scaled), mean over steps
  // Per step, mean over steps: step time minus that compute; for a PyTorch trace as recorded minus the busiest
  // worker's compute and updates (its optimizer step runs after backward, on no communication's path).
  double exposed_comm_s = 0;
  double comm_s = 0;                     // per step: collectives' network time, mean over steps
  double bytes_per_worker = 0;           // per step: bytes a worker sends, mean over workers and steps
  std::vector<LinkClassUse> links;       // by class name
  std::vector<std::string> collectives;  // "allreduce halving_doubling x 160 per step", ... (what `auto` chose)
  double compute_scale = 1;              // the factor applied to compute (derived when step_flops was given)
  double recorded_compute_s = 0;         // the trace's median step compute (rank 0), before scaling
  int behaviours = 0;                    // distinct worker timelines computed (1 when all workers are alike)
  int patterns = 0;                      // flow patterns measured on SimGrid
  uint64_t flows = 0;                    // SimGrid flows those measurements ran
};

// Throws InvalidArgument naming `what` (the file) and the field when a trace cannot be replayed: another format or
// version, an async run, no steps, a step whose groups name an unknown tensor, an unknown collective op.
void checkReplayable(const train::StepTrace& trace, const std::string& what);

// Throws InvalidArgument naming `what` and the field when `trace` cannot be re-ordered (options.order other than
// kRecorded): its scheduler negotiated the order across workers (recorded 'negotiations'), which a re-issue would
// have to invent.
void checkReorderable(const train::StepTrace& trace, const std::string& what);
ReplayOptions::Order parseReplayOrder(const std::string& text);  // recorded, fifo, priority; InvalidArgument else
const char* replayOrderName(ReplayOptions::Order order);

// Replays `ranks` (one trace, or one per recorded rank: worker w behaves as ranks[w mod size]) as described above.
// Throws InvalidArgument for invalid options or traces (before anything runs), SimulationError when the simulation
// fails.
ReplayResult replayTrace(const std::vector<train::StepTrace>& ranks, const ReplayOptions& options);

// The first evaluation record of a run's metrics.jsonl (results/result_writer.h: one JSON object per line with `step`
// and `test_accuracy`) whose test accuracy reaches `target`: its step, or -1 when none does. The time to that accuracy
// at another world size is this step count x the replayed step time, the accuracy as recorded at the trace's world.
// Throws InvalidArgument naming the file (and line) when it cannot be read or a record is not a JSON object with a
// numeric step and test_accuracy.
int64_t stepToAccuracy(const std::filesystem::path& metrics, double target);

// A synthetic trace in the shape a sync run writes (core/train/step_trace.h), for tests and scale studies: layers with
// their tensors' element counts and forward and backward times; groups of whole tensors in backward order, closed
// once they hold bucket_bytes of f32 gradient (0: one group per tensor) and issued when their last tensor is ready,
// as a fusion scheduler does; one allreduce per group, recorded at `world` ranks with `allreduce` as configured.
struct SyntheticLayer {
  std::vector<uint64_t> tensors;  // element counts
  double forward_s = 0;
  double backward_s = 0;
};
struct SyntheticTraceSpec {
  std::vector<SyntheticLayer> layers;
  uint64_t bucket_bytes = 0;  // 0: one group per layer
  int steps = 1;
  int world = 1;
  std::string allreduce = "auto";  // the configured algorithm the header records
  double compress_s_per_byte = 0;  // codec times per bucket (compress and decompress each)
  double update_s_per_param = 0;   // the optimizer's time per parameter
  double wire_ratio = 1.0;         // the collective's bytes over the bucket's f32 bytes (0.5: fp16)
};
train::StepTrace syntheticStepTrace(const SyntheticTraceSpec& spec);

// ResNet-50 (He et al. 2016, torchvision's layout): 53 convolutions, each with its batch norm's two vectors, and the
// classifier's weight and bias: 161 tensors, 25.6 M parameters, in 54 layers. Per-layer compute is proportional to the
// layer's multiply-adds at 224 x 224 (backward twice forward), scaled so that a step's compute is `step_compute_s`.
std::vector<SyntheticLayer> resnet50Layers(double step_compute_s);

}  // namespace terse::sim
