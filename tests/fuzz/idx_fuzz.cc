// Fuzz target: the IDX reader (experiments/workloads/fashion_mnist.h) on the decompressed bytes of an image file and
// a label file. A data set it accepts holds what its headers say, pixels in [0, 1] and labels below 10, and memory
// follows the bytes given, not the sizes claimed.
#include <cmath>
#include <vector>

#include "core/common/error.h"
#include "experiments/workloads/fashion_mnist.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const int64_t max_examples = in.byte() % 8;
  const std::size_t split = static_cast<std::size_t>(in.byte()) * 4;
  const auto images = in.take(split);
  const auto labels = in.rest();
  auto u8 = [](std::span<const std::byte> b) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  };
  try {
    const workloads::Dataset d = workloads::decodeIdxDataset(u8(images), u8(labels), max_examples, "images", "labels");
    TERSE_FUZZ_CHECK(d.dims == d.rows * d.cols && d.rows > 0 && d.cols > 0, "dimensions");
    TERSE_FUZZ_CHECK(d.features.size() == static_cast<std::size_t>(d.num_examples * d.dims), "feature count");
    TERSE_FUZZ_CHECK(d.labels.size() == static_cast<std::size_t>(d.num_examples), "label count");
    TERSE_FUZZ_CHECK(max_examples == 0 || d.num_examples <= max_examples, "max_examples ignored");
    TERSE_FUZZ_CHECK(d.features.size() <= images.size(), "more pixels than bytes");
    for (float f : d.features) TERSE_FUZZ_CHECK(f >= 0.0f && f <= 1.0f, "a pixel outside [0, 1]");
    for (auto l : d.labels) TERSE_FUZZ_CHECK(l >= 0 && l < 10, "a label outside 0..9");
  } catch (const InvalidPayload&) {
  }
  return 0;
}
