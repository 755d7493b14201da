// The parameter server's frames (param_server_shard.h): the request and reply headers and the pull reply's body,
// encoded by their senders and validated field by field by their receivers.
//
// Wire format: every request is one frame (OpKind::kP2P, tag kPsRequestTag) from worker to shard: a fixed 56-byte
// little-endian PsRequestHeader followed by `payload_bytes` bytes; every request but kPing and kBye gets exactly one
// reply frame (tag kPsReplyTag): a 32-byte PsReplyHeader, then for a pull the pieces' versions (u64 each) and values
// (f32/f16/bf16), for an error the message text. Headers are decoded field by field and validated like frame headers
// (frame.h) because a shard must assume any worker may be buggy or hostile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/comm/transport.h"
#include "core/common/dtype.h"
#include "core/train/param_server_plan.h"

namespace terse::train {

inline constexpr comm::Tag kPsRequestTag = 0x5053'0001;  // "PS" requests, worker -> shard
inline constexpr comm::Tag kPsReplyTag = 0x5053'0002;    // replies, shard -> worker

enum class PsOp : uint8_t { kPush = 1, kPull = 2, kClock = 3, kPing = 4, kBye = 5 };

inline constexpr uint32_t kPsRequestMagic = 0x52535054u;  // "TPSR"
inline constexpr uint32_t kPsReplyMagic = 0x41535054u;    // "TPSA"
inline constexpr uint16_t kPsWireVersion = 1;
inline constexpr std::size_t kPsRequestHeaderBytes = 56;
inline constexpr std::size_t kPsReplyHeaderBytes = 32;
// An error reply's text is cut to this length, so a reply buffer sized for it takes any refusal.
inline constexpr std::size_t kPsMaxErrorText = 1024;

//   offset size field
//        0    4 magic "TPSR"       4 2 version        6 1 op        7 1 dtype (pull: wire dtype of values; else 0)
//        8    8 step (the worker's clock)             16 8 piece id (push) or 0
//       24    8 offset in the tensor (push)           32 8 numel (push)
//       40    8 worker_version (push: the piece's version the gradient was computed on)
//       48    8 payload_bytes (must equal the frame's length minus this header)
struct PsRequestHeader {
  PsOp op = PsOp::kPing;
  DType dtype = DType::kF32;
  uint64_t step = 0;
  uint64_t piece = 0;
  uint64_t offset = 0;
  uint64_t numel = 0;
  uint64_t worker_version = 0;
  uint64_t payload_bytes = 0;
};

enum class PsStatus : uint8_t { kOk = 0, kError = 1 };

//   offset size field
//        0    4 magic "TPSA"       4 2 version        6 1 status        7 1 dtype (pull values)
//        8    8 step echoed       16 8 piece echoed (push) or number of pieces (pull)
//       24    8 payload_bytes
struct PsReplyHeader {
  PsStatus status = PsStatus::kOk;
  DType dtype = DType::kF32;
  uint64_t step = 0;
  uint64_t piece = 0;
  uint64_t payload_bytes = 0;
};

void encodePsRequest(const PsRequestHeader& h, std::span<std::byte, kPsRequestHeaderBytes> out) noexcept;
// Throws InvalidPayload naming the field and value: bad magic/version/op/dtype, payload_bytes != frame_bytes - header.
PsRequestHeader decodePsRequest(std::span<const std::byte> frame);
void encodePsReply(const PsReplyHeader& h, std::span<std::byte, kPsReplyHeaderBytes> out) noexcept;
PsReplyHeader decodePsReply(std::span<const std::byte> frame);

// The transport's accounting label of a request this side encoded (at least a header long): the piece of a push,
// comm::kNoTensor otherwise.
uint64_t psRequestLabel(std::span<const std::byte> request) noexcept;

// The dtypes a pull may ask its values in: f32, or f16/bf16 to halve the bytes on the way down.
bool isPsPullDtype(DType d) noexcept;
// Bytes of the body of a pull reply from `shard`: its pieces' versions, then its range's values in `dtype`.
uint64_t psPullBodyBytes(const PsPlan& plan, int shard, DType dtype);
// The longest reply `shard` sends: an f32 pull or an error text, whichever is longer.
std::size_t psMaxReplyBytes(const PsPlan& plan, int shard);

// A pull reply's body: versions (u64 each), then the values cast to `dtype` (f32/f16/bf16). `out` holds exactly
// versions.size() * 8 + values.size() * dtypeSize(dtype) bytes.
void encodePsPullBody(std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                      std::span<std::byte> out) noexcept;
// The inverse, into versions and values (whose sizes give the layout). Throws InvalidPayload when the body's length
// is not the one they imply.
void decodePsPullBody(std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                      std::span<float> values);

}  // namespace terse::train
