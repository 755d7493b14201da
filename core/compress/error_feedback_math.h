// Elementwise math of error feedback, written once for the CPU loops and the CUDA kernels (DESIGN.md section 5). The
// equations live in error_feedback.h; these are their per-element bodies, kept branch-free so plain loops vectorize.
#pragma once

#include "terse/hd.h"

namespace terse {

// p_t = g_t + e_t: the gradient corrected by what earlier steps failed to transmit.
TERSE_HD float efCorrect(float g, float e) {
  return g + e;
}

// e_{t+1} = p_t - D(C(p_t)): what this step fails to transmit, carried into the next one.
TERSE_HD float efResidual(float p, float transmitted) {
  return p - transmitted;
}

}  // namespace terse
