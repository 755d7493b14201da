// The draw of compute_jitter.h: SeededRng (platform-independent, unlike std::normal_distribution) keyed by the seed
// and by worker and step packed into the stream.
#include "core/train/compute_jitter.h"

#include <cmath>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"

namespace terse::train {

void ComputeJitter::validate() const {
  TERSE_CHECK(sigma >= 0 && std::isfinite(sigma), InvalidArgument,
              "compute_jitter must be a finite sigma >= 0, got " << sigma);
}

double ComputeJitter::factor(int64_t step) const {
  validate();
  if (sigma == 0) return 1.0;
  // Workers < 2^24 (limits::kWorkers is 1,024) and steps < 2^40 pack into one stream without overlap; the tag keeps
  // these streams apart from the shard sampler's (seed, epoch).
  constexpr uint64_t kTag = 0x4A49545445520000ull;  // "JITTER"
  const uint64_t stream = (static_cast<uint64_t>(worker) << 40) ^ static_cast<uint64_t>(step);
  SeededRng rng(seed ^ kTag, stream);
  return std::exp(sigma * std::fabs(rng.normal()));
}

}  // namespace terse::train
