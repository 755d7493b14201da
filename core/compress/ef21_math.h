// Elementwise math of EF21 and EF21-SGDM, written once for the CPU loops and the CUDA kernels (DESIGN.md section 5).
// The equations live in ef21.h; these are their per-element bodies, branch-free so plain loops vectorize.
#pragma once

#include "terse/hd.h"

namespace terse {

// EF21-SGDM's momentum: v_t = (1 - eta) v_{t-1} + eta g_t.
TERSE_HD float ef21Momentum(float v, float g, float eta) {
  return (1.0f - eta) * v + eta * g;
}

// The compressor's input: how far this rank's estimate h is from what it should now say (g_t, or v_t).
TERSE_HD float ef21Difference(float target, float h) {
  return target - h;
}

// h_{t+1} = h_t + D(C(target - h_t)): the estimate moves by what was sent. The aggregate side's running sum moves by
// what every rank sent, with the same addition.
TERSE_HD float ef21Advance(float h, float transmitted) {
  return h + transmitted;
}

}  // namespace terse
