// Fuzz target: the frame header (core/comm/frame.h) that every transport and the store read off untrusted bytes
// before trusting a length. An accepted header must respect the limit and re-encode to the very bytes it came from.
#include <cstring>

#include "core/comm/frame.h"
#include "core/common/error.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  // The receiver's limit varies too, so both sides of the length check are explored.
  const uint64_t max_length = kDefaultMaxFrameBytes >> (in.byte() % 64);
  const auto header = in.take(kFrameHeaderBytes);
  try {
    const FrameHeader h = decodeFrameHeader(header, max_length, "fuzz");
    TERSE_FUZZ_CHECK(header.size() == kFrameHeaderBytes, "a short header was accepted");
    TERSE_FUZZ_CHECK(h.length <= max_length, "a length over the limit was accepted");
    TERSE_FUZZ_CHECK(opKindName(h.meta.kind) != "?", "an unknown kind was accepted");
    const EncodedHeader again = encodeFrameHeader(h);
    TERSE_FUZZ_CHECK(std::memcmp(again.data(), header.data(), kFrameHeaderBytes) == 0,
                     "an accepted header does not re-encode to its bytes (a field is ignored)");
  } catch (const InvalidPayload&) {
  }
  return 0;
}
