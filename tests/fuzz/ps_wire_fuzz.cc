// Fuzz target: the parameter server's frames (core/train/param_server_wire.h) as a shard reads a worker's request and
// a worker reads a shard's reply. An accepted header re-encodes to its bytes; a pull body is accepted exactly when
// its length is the one the layout implies, and an f32 one decodes and re-encodes bit for bit. Modes 128..255 feed the
// row-sparse frames of a fixed two-shard plan: an accepted row push or row pull re-encodes to its bytes. Modes 96..127
// feed a delta pull body (compressed pulls) for up to 7 pieces whose payload bounds the input gives: an accepted body
// re-encodes to its bytes.
#include <cstring>
#include <vector>

#include "core/common/error.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_wire.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::train;

namespace {

// Tensors of 5 rows of 4 (row-sparse), 3 (dense) and 6 rows of 1 (row-sparse) over two shards: the cut falls inside
// a row, so segments shorter than a row occur.
PsPlan rowPlan() {
  PsPlan plan = planShards(std::vector<uint64_t>{20, 3, 6}, 2);
  markRowSparse(plan, 0, 4);
  markRowSparse(plan, 2, 1);
  return plan;
}

void rowFrames(uint8_t mode, std::span<const std::byte> frame) {
  static const PsPlan plan = rowPlan();
  if (mode % 2 == 0) {
    const PsPiece& p = plan.pieces[(mode / 2) % plan.pieces.size()];
    if (!isRowSparse(plan, p)) return;
    try {
      const std::vector<uint32_t> ids = decodePsRowPush(plan, p, frame);
      TERSE_FUZZ_CHECK(frame.size() == psRowPushBytes(plan, p, ids), "a row push of the wrong length was accepted");
      std::vector<float> grad(p.numel, 0.0f);
      const std::byte* values = frame.data() + kPsRowPushHeaderBytes + 4 * ids.size();
      for (uint32_t r : ids) {
        const RowSegment seg = rowSegment(plan, p, r);
        TERSE_FUZZ_CHECK(seg.end > seg.begin && seg.end <= p.numel, "an accepted row lies outside its piece");
        std::memcpy(grad.data() + seg.begin, values, 4 * (seg.end - seg.begin));
        values += 4 * (seg.end - seg.begin);
      }
      std::vector<std::byte> again(frame.size());
      encodePsRowPush(plan, p, ids, grad.data(), again);
      TERSE_FUZZ_CHECK(std::memcmp(again.data(), frame.data(), frame.size()) == 0, "row push round trip");
    } catch (const InvalidPayload&) {
    }
  } else {
    const int shard = (mode / 2) % 2;
    try {
      const auto ids = decodePsRowPull(plan, shard, frame);
      const std::vector<std::byte> again = encodePsRowPull(plan, shard, ids);
      TERSE_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0,
                       "row pull round trip");
    } catch (const InvalidPayload&) {
    }
  }
}

// frame[0] % 8 pieces, frame[1 .. pieces] their payload bounds in bytes, then the body.
void deltaPullBody(std::span<const std::byte> frame) {
  const std::size_t pieces = frame.empty() ? 0 : std::to_integer<std::size_t>(frame[0]) % 8;
  if (frame.size() < 1 + pieces) return;
  std::vector<uint64_t> bounds;
  for (std::size_t i = 0; i < pieces; ++i) bounds.push_back(std::to_integer<uint64_t>(frame[1 + i]));
  const auto body = frame.subspan(1 + pieces);
  std::vector<uint64_t> versions(pieces);
  try {
    const PsDeltaPullBody decoded = decodePsDeltaPullBody(body, versions, bounds);
    const auto& payloads = decoded.payloads;
    TERSE_FUZZ_CHECK(payloads.size() == pieces, "a payload per piece");
    std::vector<std::byte> again(static_cast<std::size_t>(psDeltaPullMaxBodyBytes(bounds)));
    encodePsPullBody(versions, {}, DType::kF32, std::span<std::byte>(again).first(8 * pieces));
    uint64_t at = 8 * pieces;
    for (std::size_t i = 0; i < pieces; ++i) {
      TERSE_FUZZ_CHECK(payloads[i].size() <= bounds[i], "a payload over its bound was accepted");
      if (!payloads[i].empty()) std::memcpy(again.data() + at + 8, payloads[i].data(), payloads[i].size());
      at += encodePsDeltaPullEntry(again, at, payloads[i].size());
    }
    at = encodePsDeltaPullChecksum(again, at, decoded.checksum);
    TERSE_FUZZ_CHECK(at == body.size() && std::memcmp(again.data(), body.data(), body.size()) == 0,
                     "delta pull body round trip");
  } catch (const InvalidPayload&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const auto frame = in.rest();
  if (mode >= 128) {
    rowFrames(mode, frame);
    return 0;
  }
  if (mode >= 96) {
    deltaPullBody(frame);
    return 0;
  }
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
