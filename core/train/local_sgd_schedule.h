// When local SGD averages on schedule (core/train/sync_trainer.h, "Local SGD"): every `period` steps from start_step,
// or, with the quadratic synchronization rule, rounds that lengthen as the learning rate decays.
//
// QSR (Gu, Lyu, Arora, Zhang, Huang, "A Quadratic Synchronization Rule for Distributed Deep Learning", ICLR 2024):
// the round that begins after d steps lasts H = max(period, floor((qsr_alpha / eta)^2)) steps, eta the learning rate
// of the last step before it (of step 0 for a round that begins at 0). So H grows as 1 / eta^2 while the rate decays
// (a cosine or step decay), and stays at `period` (the paper's H_base) while eta >= qsr_alpha / sqrt(period). The rate
// of the step just taken is what both the native trainer and a PyTorch script (terse.torch.LocalSGD, which reads the
// optimizer's rate when a round begins) know at the averaging that begins the next round, so both draw the same
// rounds from the same schedule. A rate that rises inside a round (a warm-up's, a scheduler's restart) shortens the
// round to what the higher rate asks for, counted from the round's start, so that a round drawn from a warm-up's
// small first rate does not outlast it; the config still refuses QSR over a warm-up (rule local-sgd), as the paper
// begins its local steps after it. A rate that is not positive and finite asks for no averaging on schedule.
//
// The end of training and the runner's evaluation points average too (SyncTrainer::averagingStep); those forced
// averagings do not move the schedule's rounds.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace terse::train {

// Rounds longer than this are "never on schedule" (only forced averagings remain): every run is far shorter.
inline constexpr int64_t kLongestLocalRound = int64_t{1} << 50;

// The length of a round that begins with `rate` as its learning rate: `period` without QSR (qsr_alpha 0), else
// max(period, floor((qsr_alpha / rate)^2)), kLongestLocalRound at most (and for a rate that is not positive and
// finite). terse.torch.LocalSGD calls it too (terse._terse.local_round_length), so both sides draw alike.
int64_t localRoundLength(int64_t period, double qsr_alpha, double rate);

// The step counts after which local SGD averages on schedule, ascending, within (start_step, total_steps]: rounds
// from start_step, the round after d steps of length localRoundLength(period, qsr_alpha, rate(max(d - 1, 0))), cut to
// max(s, d + localRoundLength(period, qsr_alpha, rate(s - 1))) where that is shorter at a step count s inside it.
// `rate(step)`: the learning rate of 0-based step `step`. period >= 1.
std::vector<int64_t> scheduledAveragings(int64_t period, int64_t start_step, double qsr_alpha, int64_t total_steps,
                                         const std::function<double(int64_t)>& rate);

// The same schedule as a question, in constant memory without the rule (the period's grid) and O(rounds) with it
// (its round ends, which only lengthen as the rate decays): a run may be billions of steps long.
class LocalSgdSchedule {
 public:
  LocalSgdSchedule() = default;  // local SGD off: no averaging on schedule
  LocalSgdSchedule(int64_t period, int64_t start_step, double qsr_alpha, int64_t total_steps,
                   const std::function<double(int64_t)>& rate);
  // Whether the schedule averages after `done` steps (the forced averagings aside).
  bool averagesAfter(int64_t done) const noexcept;
  // The averagings on schedule in (start_step, total_steps].
  int64_t count() const noexcept;

 private:
  int64_t period_ = 0;
  int64_t start_ = 0;
  int64_t total_ = 0;
  bool qsr_ = false;
  std::vector<int64_t> ends_;  // with the rule: its rounds' ends, ascending
};

}  // namespace terse::train
