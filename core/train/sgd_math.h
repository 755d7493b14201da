// Elementwise math of the SGD update (optimizer.h), written once for the host loops and the CUDA kernel (DESIGN.md
// section 5), so a device workload's parameters follow the host's bit for bit (the host builds with -ffp-contract=off,
// the kernel with --fmad=false: no fused multiply-add on either side).
#pragma once

#include <cmath>

#include "terse/hd.h"

namespace terse::train {

// w - lr (g + wd w): plain SGD with L2 weight decay.
TERSE_HD float sgdPlain(float w, float g, float lr, float wd) {
  return w - lr * (g + wd * w);
}

// Heavy-ball or Nesterov momentum, PyTorch's semantics: g' = g + wd w; b = mu b + g'; w -= lr (nesterov ? g' + mu b :
// b).
TERSE_HD void sgdMomentum(float& w, float& b, float g, float lr, float wd, float mu, bool nesterov) {
  const float gd = g + wd * w;
  b = mu * b + gd;
  w = w - lr * (nesterov ? gd + mu * b : b);
}

// AdaGrad (Duchi, Hazan, Singer, JMLR 2011; PyTorch's torch.optim.Adagrad with its defaults): g' = g + wd w;
// G += g'^2; w -= lr g' / (sqrt(G) + eps). G starts at 0, so a zero gradient leaves w and G alone.
TERSE_HD void adagrad(float& w, float& sum_sq, float g, float lr, float wd, float eps) {
  const float gd = g + wd * w;
  sum_sq = sum_sq + gd * gd;
  w = w - lr * gd / (sqrtf(sum_sq) + eps);
}

}  // namespace terse::train
