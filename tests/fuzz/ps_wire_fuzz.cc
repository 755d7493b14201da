// Fuzz target: the parameter server's frames (core/train/param_server_wire.h) as a shard reads a worker's request and
// a worker reads a shard's reply. An accepted header re-encodes to its bytes; a pull body is accepted exactly when
// its length is the one the layout implies, and an f32 one decodes and re-encodes bit for bit.
#include <cstring>
#include <vector>

#include "core/common/error.h"
#include "core/train/param_server_wire.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const auto frame = in.rest();
  switch (mode % 3) {
    case 0:
      try {
        const PsRequestHeader h = decodePsRequest(frame);
        TERSE_FUZZ_CHECK(h.payload_bytes == frame.size() - kPsRequestHeaderBytes, "payload length not checked");
        std::array<std::byte, kPsRequestHeaderBytes> again{};
        encodePsRequest(h, again);
        TERSE_FUZZ_CHECK(std::memcmp(again.data(), frame.data(), again.size()) == 0,
                         "an accepted request header does not re-encode to its bytes");
        (void)psRequestLabel(frame);
      } catch (const InvalidPayload&) {
      }
      break;
    case 1:
      try {
        const PsReplyHeader h = decodePsReply(frame);
        TERSE_FUZZ_CHECK(isPsPullDtype(h.dtype), "a reply dtype outside f32/f16/bf16");
        std::array<std::byte, kPsReplyHeaderBytes> again{};
        encodePsReply(h, again);
        TERSE_FUZZ_CHECK(std::memcmp(again.data(), frame.data(), again.size()) == 0,
                         "an accepted reply header does not re-encode to its bytes");
      } catch (const InvalidPayload&) {
      }
      break;
    default: {
      // A pull body for a layout the fuzzer picks: up to 255 versions and 4095 values.
      const DType dtype = (mode / 3) % 3 == 0 ? DType::kF32 : ((mode / 3) % 3 == 1 ? DType::kF16 : DType::kBF16);
      std::vector<uint64_t> versions(frame.empty() ? 0 : std::to_integer<std::size_t>(frame[0]));
      std::vector<float> values(frame.size() < 2 ? 0 : std::to_integer<std::size_t>(frame[1]) * 16);
      const auto body = frame.subspan(std::min<std::size_t>(frame.size(), 2));
      try {
        decodePsPullBody(body, dtype, versions, values);
        TERSE_FUZZ_CHECK(body.size() == versions.size() * 8 + values.size() * dtypeSize(dtype),
                         "a body of the wrong length was accepted");
        if (dtype == DType::kF32) {
          std::vector<std::byte> again(body.size());
          encodePsPullBody(versions, values, dtype, again);
          TERSE_FUZZ_CHECK(body.empty() || std::memcmp(again.data(), body.data(), body.size()) == 0,
                           "f32 body round trip");
        }
      } catch (const InvalidPayload&) {
      }
    }
  }
  return 0;
}
