// One rank's loop of a sync run, the same code for every World (world.h): threads over inproc, actors in a
// simulation, one process of a tcp or NCCL job (issue 41: in-process runs execute exactly the multi-process code).
//
// At every evaluation point (every eval.every_steps steps, each epoch end when eval.per_epoch, and always after the
// last step) a rank drains its trainer and publishes its evaluation slot -- wire and payload bytes, the negotiation's
// bytes and rounds, its parameter checksum and time totals, a fixed record of 8-byte words -- to rank 0 over the
// control channel. Rank 0 checks that the replicas are still identical, evaluates on the held-out set and appends the
// metrics record; the other ranks go straight on to the next step: they block in its collectives until rank 0 joins,
// which is what makes the published numbers belong to the same step.
//
// The control channel is a transport of its own (no link emulation, no simulated network), never the trainer's
// communicator: the trainer's communication thread issues collectives of its own (the scheduler's negotiation rounds)
// whose timing differs per rank, so a collective issued from the rank's thread on the same communicator would be
// ordered differently on different ranks -- a mismatch, not a measurement. It also keeps the exchange out of the
// trainer's byte accounting, and in a simulation it takes no simulated time: a rank other than 0 sends its slot and
// goes on, as it went on after leaving its slot in shared memory before the ranks were one code.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "core/comm/transport.h"
#include "core/common/runtime.h"
#include "core/train/sync_trainer.h"
#include "experiments/config/config.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/world.h"
#include "results/result_writer.h"

namespace terse::runner::detail {

// Fixed-size records of 8-byte words between the ranks of a job, over a transport of their own. Every rank must make
// the same sequence of calls (each call takes the next tag); a record of another size than the caller's is an
// InvalidPayload naming the rank. Abort the transport to fail a call pending on any rank.
class ControlChannel {
 public:
  explicit ControlChannel(comm::Transport& link) : link_(link) {}
  int rank() const noexcept { return link_.rank(); }
  int size() const noexcept { return link_.size(); }
  // Rank 0 gets every rank's words in rank order; the others send theirs and return at once with nothing.
  std::vector<std::vector<uint64_t>> gather(std::span<const uint64_t> mine);
  // Every rank gets every rank's words in rank order (a gather, then rank 0 sends the lot to each).
  std::vector<std::vector<uint64_t>> allgather(std::span<const uint64_t> mine);
  // Returns once every rank has called it.
  void barrier() { allgather({}); }

 private:
  comm::Transport& link_;
  uint64_t next_tag_ = 0;
};

// A rank's numbers at an evaluation point.
struct EvalSlot {
  uint64_t wire_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t control_bytes = 0;  // the negotiation's completed rounds: their frames' bytes and their number
  uint64_t control_rounds = 0;
  uint64_t checksum = 0;
  train::StepTimes times;  // totals since the start

  static constexpr std::size_t kWords = 11;
  std::array<uint64_t, kWords> words() const;
  static EvalSlot fromWords(std::span<const uint64_t> words);
};

// Bytes this rank sent that the in-process transport would have sent too: everything but a transport's own control
// frames (tcp: handshake, heartbeats, abort notices) and the scheduler negotiation's (reported on their own, as
// control_bytes_per_worker).
uint64_t dataBytesSent(const comm::Communicator& comm);

// What rank 0 writes with: the results folder, the run's summary, the progress line, and the time the records' wall_s
// counts from (the World's clock: simulated in a simulation).
struct SyncReport {
  results::ResultWriter& writer;
  RunSummary& summary;
  Progress& progress;
  rt::Clock::time_point start;
};

// One rank of a sync run: its trainer and replica, the trainer's communicator and the control channel.
struct SyncRank {
  train::SyncTrainer& trainer;
  train::Workload& model;
  comm::Communicator& comm;
  ControlChannel& control;
};

class SyncRankDriver {
 public:
  // `report`: rank 0's, nullptr on the others.
  SyncRankDriver(const experiments::Experiment& e, const World& world, SyncRank rank, SyncReport* report);
  // Checks that every replica starts from rank 0's parameters, trains to the end publishing every evaluation point,
  // and leaves with the other ranks (after rank 0's last record). Throws on any failure; the World aborts the rest.
  void run();

 private:
  bool isEvalPoint(int64_t done) const;
  void checkInitialReplicas();
  // Drains, publishes this rank's slot, and on rank 0 writes the record.
  void evaluationPoint(const train::StepRecord& rec, int64_t done);
  // Rank 0: the record of evaluation point `done` from every rank's slot.
  void writeRecord(const std::vector<EvalSlot>& all, const train::StepRecord& rec, int64_t done);

  const experiments::Experiment& e_;
  const World& world_;
  SyncRank rank_;
  SyncReport* report_;
  int64_t total_ = 0;
  int64_t per_epoch_ = 0;
  double loss_since_ = 0;
  int64_t steps_since_ = 0;
  // The progress line's rate and ETA are for the person waiting: host time, also when the records' times are simulated.
  std::chrono::steady_clock::time_point host_start_;
};

}  // namespace terse::runner::detail
