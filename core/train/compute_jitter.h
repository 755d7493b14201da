// Seeded per-step compute noise of a worker (experiment compute_jitter; docs/async-training.md): step s's
// compute takes exp(sigma |Z|) times as long, Z ~ N(0, 1) drawn from (seed, worker, s) alone. Keyed rather than drawn
// in call order (docs/STYLE.md 7), so a rerun draws the same factors however its threads are timed, and a factor
// never depends on how many steps another worker ran. |Z|: the factor is a delay, never a speed-up, because real time
// can only add delay (it sleeps it, as it sleeps a worker_settings slowdown). Mean: E[exp(sigma |Z|)] =
// 2 exp(sigma^2 / 2) Phi(sigma).
#pragma once

#include <cstdint>

namespace terse::train {

struct ComputeJitter {
  double sigma = 0;   // 0: off (every factor exactly 1)
  uint64_t seed = 0;  // the run's seed
  int worker = 0;

  // Throws InvalidArgument for a negative or non-finite sigma: a trainer calls it before anything runs.
  void validate() const;
  // Step `step`'s factor, >= 1. Throws as validate() does.
  double factor(int64_t step) const;
};

}  // namespace terse::train
