// Elementwise math of DGC momentum correction, written once for the CPU loops and the CUDA kernels (DESIGN.md
// section 5). The equations live in momentum_correction.h; these are their per-element bodies, kept branch-free so
// plain loops vectorize.
#pragma once

#include "terse/hd.h"

namespace terse {

// u_t = m u_{t-1} + g_t (eq. 4): momentum accumulated locally, before compression, so that what is accumulated into v
// is the momentum-SGD update and not the raw gradient.
TERSE_HD float dgcMomentum(float u, float g, float m) {
  return m * u + g;
}

// Nesterov variant (DGC's reference code, dgc/memory.py): u_t = m (u_{t-1} + g_t); the accumulated input is u_t + g_t.
TERSE_HD float dgcNesterovMomentum(float u, float g, float m) {
  return m * (u + g);
}
TERSE_HD float dgcNesterovInput(float u_t, float g) {
  return u_t + g;
}

// Momentum factor masking (section 3.2): u <- u ⊙ ¬mask, mask = the coordinates this rank transmitted, so a sent
// coordinate's stale momentum does not keep pushing it after the update has been applied.
TERSE_HD float dgcMask(float u, float transmitted) {
  return transmitted != 0.0f ? 0.0f : u;
}

}  // namespace terse
