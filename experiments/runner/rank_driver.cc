#include "experiments/runner/rank_driver.h"

#include <array>
#include <cstring>
#include <sstream>
#include <string>

#include "core/common/error.h"
#include "core/train/label_partition.h"
#include "core/train/workload.h"
#include "experiments/runner/runner_detail.h"

namespace terse::runner::detail {
namespace {

uint64_t bitsOf(double v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}
double doubleOf(uint64_t u) {
  double v = 0;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

}  // namespace

std::vector<std::vector<uint64_t>> ControlChannel::gather(std::span<const uint64_t> mine) {
  const comm::FrameMeta meta{comm::OpKind::kP2P, next_tag_++, comm::kNoTensor};
  if (rank() != 0) {
    link_.send(0, meta, std::as_bytes(mine));
    return {};
  }
  std::vector<std::vector<uint64_t>> all(static_cast<std::size_t>(size()), std::vector<uint64_t>(mine.size()));
  all[0].assign(mine.begin(), mine.end());
  // Every receive posted before the first wait: the ranks' records arrive in any order.
  std::vector<comm::Request> pending;
  for (int r = 1; r < size(); ++r) {
    pending.push_back(link_.irecv(r, meta, std::as_writable_bytes(std::span(all[static_cast<std::size_t>(r)]))));
  }
  for (int r = 1; r < size(); ++r) {
    comm::Request& req = pending[static_cast<std::size_t>(r - 1)];
    req.wait();
    TERSE_CHECK(req.bytes() == mine.size_bytes(), InvalidPayload,
                "control record from rank " << r << ": " << req.bytes() << " bytes, expected " << mine.size_bytes()
                                            << " (do all ranks run the same build?)");
  }
  return all;
}

std::vector<std::vector<uint64_t>> ControlChannel::allgather(std::span<const uint64_t> mine) {
  std::vector<std::vector<uint64_t>> all = gather(mine);
  const comm::FrameMeta meta{comm::OpKind::kP2P, next_tag_++, comm::kNoTensor};
  const std::size_t n = mine.size();
  std::vector<uint64_t> flat(n * static_cast<std::size_t>(size()));
  if (rank() == 0) {
    for (std::size_t r = 0; r < all.size(); ++r) std::copy(all[r].begin(), all[r].end(), flat.begin() + r * n);
    for (int r = 1; r < size(); ++r) link_.send(r, meta, std::as_bytes(std::span(flat)));
    return all;
  }
  const uint64_t got = link_.recv(0, meta, std::as_writable_bytes(std::span(flat)));
  TERSE_CHECK(got == flat.size() * sizeof(uint64_t), InvalidPayload,
              "control record from rank 0: " << got << " bytes, expected " << flat.size() * sizeof(uint64_t)
                                             << " (do all ranks run the same build?)");
  all.assign(static_cast<std::size_t>(size()), std::vector<uint64_t>(n));
  for (std::size_t r = 0; r < all.size(); ++r) std::copy_n(flat.begin() + r * n, n, all[r].begin());
  return all;
}

std::array<uint64_t, EvalSlot::kWords> EvalSlot::words() const {
  return {wire_bytes,
          payload_bytes,
          control_bytes,
          control_rounds,
          checksum,
          bitsOf(times.compute_s),
          bitsOf(times.compress_s),
          bitsOf(times.decompress_s),
          bitsOf(times.comm_s),
          bitsOf(times.exposed_comm_s),
          bitsOf(times.step_s)};
}

EvalSlot EvalSlot::fromWords(std::span<const uint64_t> w) {
  TERSE_CHECK(w.size() == kWords, InvalidPayload, "evaluation slot of " << w.size() << " words, expected " << kWords);
  EvalSlot s;
  s.wire_bytes = w[0];
  s.payload_bytes = w[1];
  s.control_bytes = w[2];
  s.control_rounds = w[3];
  s.checksum = w[4];
  s.times.compute_s = doubleOf(w[5]);
  s.times.compress_s = doubleOf(w[6]);
  s.times.decompress_s = doubleOf(w[7]);
  s.times.comm_s = doubleOf(w[8]);
  s.times.exposed_comm_s = doubleOf(w[9]);
  s.times.step_s = doubleOf(w[10]);
  return s;
}

uint64_t dataBytesSent(const comm::Communicator& comm) {
  const comm::RankTraffic t = comm.traffic();
  return t.sent.total().bytes - t.sent.kind(comm::OpKind::kControl).bytes -
         t.sent.tensor(train::kNegotiationTensor).bytes;
}

SyncRankDriver::SyncRankDriver(const experiments::Experiment& e, const World& world, SyncRank rank, SyncReport* report)
    : e_(e),
      world_(world),
      rank_(rank),
      report_(report),
      total_(rank.trainer.totalSteps()),
      per_epoch_(rank.trainer.stepsPerEpoch()),
      host_start_(std::chrono::steady_clock::now()) {
  TERSE_CHECK((report != nullptr) == (rank.control.rank() == 0), InternalError,
              "rank " << rank.control.rank() << (report ? " has" : " has no") << " report: rank 0 alone writes");
}

bool SyncRankDriver::isEvalPoint(int64_t done) const {
  const int64_t every = e_.eval().every_steps();
  return (every > 0 && done % every == 0) || (e_.eval().per_epoch() && done % per_epoch_ == 0) || done == total_;
}

void SyncRankDriver::checkInitialReplicas() {
  // The initial parameters, and the non-IID shards every rank drew on its own (label_partition.h).
  std::array<uint64_t, 2> mine{};
  world_.aside([&] {
    mine[0] = train::parameterChecksum(rank_.model.params());
    mine[1] = train::partitionChecksum(rank_.trainer.options().partition.get());
  });
  const auto all = rank_.control.allgather(std::span(mine));
  for (std::size_t r = 1; r < all.size(); ++r) {
    TERSE_CHECK(all[r][0] == all[0][0], InternalError,
                "replica " << r << " of workload '" << e_.workload().name()
                           << "' starts with different parameters than replica 0 (same seed " << e_.seed()
                           << "): do all ranks run the same build and config?");
  }
  // Every rank's checksum, so that the odd one out shows whichever rank it is.
  std::ostringstream shards;
  bool agree = true;
  for (std::size_t r = 0; r < all.size(); ++r) {
    shards << (r ? ", " : "") << "rank " << r << " " << std::hex << all[r][1] << std::dec;
    agree = agree && all[r][1] == all[0][1];
  }
  TERSE_CHECK(agree, InvalidArgument,
              "the ranks drew different data shards (data.partition DIRICHLET; partition checksums: "
                  << shards.str() << "): do all ranks read the same data set, with the same build?");
}

void SyncRankDriver::run() {
  checkInitialReplicas();
  train::SyncTrainer& trainer = rank_.trainer;
  while (!trainer.finished()) {
    const train::StepRecord rec = trainer.step();
    const int64_t done = rec.step + 1;
    loss_since_ += rec.loss;
    ++steps_since_;
    if (isEvalPoint(done)) {
      evaluationPoint(rec, done);
    } else if (report_ != nullptr) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start_).count();
      world_.aside([&] {
        const RunSummary& s = report_->summary;
        report_->progress.update(done, s.records > 0 ? s.final_accuracy : -1, dataBytesSent(rank_.comm), elapsed,
                                 false);
      });
    }
  }
  if (report_ != nullptr) world_.aside([&] { report_->progress.finish(); });
  // Everyone leaves together, after rank 0's last record: a process that ran ahead into the next variant's connection
  // setup would otherwise spend its timeout waiting for rank 0's final evaluation.
  rank_.control.barrier();
}

void SyncRankDriver::evaluationPoint(const train::StepRecord& rec, int64_t done) {
  // Communication of the last step overlaps the next one; an evaluation point needs all of it done first.
  rank_.trainer.drain();
  // Gradient traffic apart from the scheduler's negotiation rounds (control frames whose count depends on how the
  // ranks' paces interleaved, sync_trainer.h), so that one seed gives one wire byte count; the negotiation is
  // reported in its own fields (control_bytes_per_worker, negotiation_rounds_per_worker).
  EvalSlot mine;
  mine.wire_bytes = dataBytesSent(rank_.comm);
  world_.aside([&] {
    const train::Negotiation nego = rank_.trainer.negotiation();
    mine.payload_bytes = rank_.trainer.payloadBytes();
    mine.control_bytes = nego.bytes;
    mine.control_rounds = nego.rounds;
    mine.checksum = rank_.trainer.checksum();
    mine.times = rank_.trainer.totals().times;
  });
  const auto words = mine.words();
  const std::vector<std::vector<uint64_t>> gathered = rank_.control.gather(words);
  if (report_ == nullptr) return;
  std::vector<EvalSlot> all;
  for (const auto& w : gathered) all.push_back(EvalSlot::fromWords(w));
  writeRecord(all, rec, done);
  loss_since_ = 0;
  steps_since_ = 0;
}

void SyncRankDriver::writeRecord(const std::vector<EvalSlot>& all, const train::StepRecord& rec, int64_t done) {
  const int world = static_cast<int>(all.size());
  for (int r = 1; r < world; ++r) {
    const uint64_t theirs = all[static_cast<std::size_t>(r)].checksum;
    TERSE_CHECK(theirs == all[0].checksum, InternalError,
                "replicas diverged: after step " << done << " rank " << r << "'s parameters differ from rank 0's"
                                                 << " (checksums " << theirs << " vs " << all[0].checksum << ")");
  }
  // Evaluation is outside the training time a simulated cluster models (wall_s is the time to train to this point).
  train::EvalResult ev;
  world_.aside([&] { ev = rank_.model.evaluate(0); });
  results::MetricsRecord m = evalRecord(done, per_epoch_, ev, loss_since_, steps_since_, rec.lr);
  train::StepTimes sum;
  uint64_t wire = 0, payload = 0, control = 0, rounds = 0;
  for (const auto& s : all) {
    wire += s.wire_bytes;
    payload += s.payload_bytes;
    control += s.control_bytes;
    rounds += s.control_rounds;
    sum.compute_s += s.times.compute_s;
    sum.compress_s += s.times.compress_s;
    sum.decompress_s += s.times.decompress_s;
    sum.comm_s += s.times.comm_s;
    sum.exposed_comm_s += s.times.exposed_comm_s;
    sum.step_s += s.times.step_s;
  }
  const auto w = static_cast<uint64_t>(world);
  const double n = static_cast<double>(done) * world;
  m.wire_bytes_per_worker = wire / w;
  m.payload_bytes_per_worker = payload / w;
  m.control_bytes_per_worker = static_cast<double>(control) / world;
  m.negotiation_rounds_per_worker = static_cast<double>(rounds) / world;
  m.wall_s = since(report_->start);
  m.compute_s_per_step = sum.compute_s / n;
  m.compress_s_per_step = sum.compress_s / n;
  m.decompress_s_per_step = sum.decompress_s / n;
  m.comm_s_per_step = sum.comm_s / n;
  m.exposed_comm_s_per_step = sum.exposed_comm_s / n;
  m.step_s_per_step = sum.step_s / n;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start_).count();
  world_.aside([&] {
    report_->writer.append(m);
    noteRecord(report_->summary, m, ev, report_->writer.records());
    report_->progress.update(done, ev.accuracy, m.wire_bytes_per_worker, elapsed, true);
  });
}

}  // namespace terse::runner::detail
