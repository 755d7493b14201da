// core/compress/device_kernels.h for builds without CUDA: only a CUDA tensor reaches these, and none can exist here.
#include "core/common/error.h"
#include "core/compress/device_kernels.h"

namespace terse::device_kernels {
namespace {

[[noreturn]] void noCuda(const char* what) {
  TERSE_THROW(Unsupported, what << " on a CUDA tensor: this build has no CUDA (TERSE_CUDA=OFF or no nvcc)");
}

}  // namespace

void efCorrect(const float*, const float*, float*, std::size_t, void*) {
  noCuda("error feedback");
}
void efResidual(const float*, const float*, float*, std::size_t, void*, const uint32_t*) {
  noCuda("error feedback");
}
void dgcStage(const float*, const float*, float, bool, float*, float*, std::size_t, void*) {
  noCuda("momentum correction");
}
void dgcCommit(const float*, const float*, bool, float*, std::size_t, void*, const uint32_t*) {
  noCuda("momentum correction");
}
void ef21Stage(const float*, const float*, const float*, float, const uint32_t*, float*, float*, std::size_t, void*) {
  noCuda("EF21");
}
void ef21StageNext(const float*, const float*, float*, std::size_t, void*) {
  noCuda("EF21");
}
void ef21Commit(float*, float*, const float*, float*, const float*, float*, uint32_t*, std::size_t, void*,
                const uint32_t*, std::size_t, const uint32_t*) {
  noCuda("EF21");
}
void divide(void*, std::size_t, DType, int, void*) {
  noCuda("averaging");
}

void copySegments(std::span<const CopySegment> segments, void*) {
  if (!segments.empty()) noCuda("batched device copies");
}
void copyWords(const uint32_t*, uint32_t*, std::size_t, void*) {
  noCuda("reading payload verdicts");
}

}  // namespace terse::device_kernels
