// Helpers of the fuzz targets (tests/fuzz): a check that crashes the process -- what libFuzzer reports and keeps the
// input of -- and a reader that cuts the fuzzer's one input into the pieces a target needs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

// A property of the code under test that the input broke: print it and abort, so the fuzzer saves the input.
#define TERSE_FUZZ_CHECK(cond, what)                                                                  \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (0)

namespace terse::fuzz {

class Input {
 public:
  Input(const uint8_t* data, std::size_t size) : bytes_(reinterpret_cast<const std::byte*>(data), size) {}
  // The next n bytes (fewer at the end of the input).
  std::span<const std::byte> take(std::size_t n) {
    const std::size_t k = std::min(n, bytes_.size());
    auto out = bytes_.first(k);
    bytes_ = bytes_.subspan(k);
    return out;
  }
  uint8_t byte() {
    const auto b = take(1);
    return b.empty() ? 0 : std::to_integer<uint8_t>(b[0]);
  }
  std::span<const std::byte> rest() { return take(bytes_.size()); }
  bool empty() const noexcept { return bytes_.empty(); }

 private:
  std::span<const std::byte> bytes_;
};

}  // namespace terse::fuzz
