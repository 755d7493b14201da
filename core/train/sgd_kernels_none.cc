// core/train/sgd_kernels.h for builds without CUDA.
#include "core/common/error.h"
#include "core/train/sgd_kernels.h"

namespace terse::train::sgd_kernels {

void update(float*, const float*, float*, std::size_t, float, float, float, bool, void*) {
  TERSE_THROW(Unsupported, "an SGD update of device parameters: this build has no CUDA (TERSE_CUDA=OFF or no nvcc)");
}

}  // namespace terse::train::sgd_kernels
