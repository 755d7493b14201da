// The parameter server's frames (param_server_shard.h): the request and reply headers and the pull reply's body,
// encoded by their senders and validated field by field by their receivers.
//
// Wire format: every request is one frame (OpKind::kP2P, tag kPsRequestTag) from worker to shard: a fixed 56-byte
// little-endian PsRequestHeader followed by `payload_bytes` bytes; every request but kPing and kBye gets exactly one
// reply frame (tag kPsReplyTag): a 32-byte PsReplyHeader, then for a pull the pieces' versions (u64 each) and values
// (f32/f16/bf16), for an error the message text. Row-sparse pieces (param_server_plan.h) travel as rows: see the
// row-sparse frames below; a compressed pull (kPullDelta) carries each piece's compressed change: see the delta pull
// frames at the end. Headers are decoded field by field and validated like frame headers
// (frame.h) because a shard must assume any worker may be buggy or hostile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/comm/transport.h"
#include "core/common/dtype.h"
#include "core/train/param_server_plan.h"

namespace terse::train {

inline constexpr comm::Tag kPsRequestTag = 0x5053'0001;  // "PS" requests, worker -> shard
inline constexpr comm::Tag kPsReplyTag = 0x5053'0002;    // replies, shard -> worker

enum class PsOp : uint8_t {
  kPush = 1,
  kPull = 2,
  kClock = 3,
  kPing = 4,
  kBye = 5,
  kPushRows = 6,
  kPullRows = 7,
  kPullDelta = 8,
};

inline constexpr uint32_t kPsRequestMagic = 0x52535054u;  // "TPSR"
inline constexpr uint32_t kPsReplyMagic = 0x41535054u;    // "TPSA"
inline constexpr uint16_t kPsWireVersion = 1;
inline constexpr std::size_t kPsRequestHeaderBytes = 56;
inline constexpr std::size_t kPsReplyHeaderBytes = 32;
// An error reply's text is cut to this length, so a reply buffer sized for it takes any refusal.
inline constexpr std::size_t kPsMaxErrorText = 1024;

//   offset size field
//        0    4 magic "TPSR"       4 2 version        6 1 op        7 1 dtype (pull: wire dtype of values; else 0)
//        8    8 step (the worker's clock)             16 8 piece id (push, push rows) or 0
//       24    8 offset in the tensor (push, push rows)  32 8 numel (push, push rows)
//       40    8 worker_version (pushes: the piece's version the gradient was computed on)
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
// The longest reply `shard` sends: an f32 pull or an error text, whichever is longer; with `delta_pull_max_payloads`
// (a pull compressor's largest payload per piece of the shard) also a delta pull's.
std::size_t psMaxReplyBytes(const PsPlan& plan, int shard, std::span<const uint64_t> delta_pull_max_payloads = {});

// A pull reply's body: versions (u64 each), then the values cast to `dtype` (f32/f16/bf16). `out` holds exactly
// versions.size() * 8 + values.size() * dtypeSize(dtype) bytes.
void encodePsPullBody(std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                      std::span<std::byte> out) noexcept;
// The inverse, into versions and values (whose sizes give the layout). Throws InvalidPayload when the body's length
// is not the one they imply.
void decodePsPullBody(std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                      std::span<float> values);

// ---- Row-sparse frames (the pieces of tensors markRowSparse named; DESIGN.md section 2). Row ids are u32, strictly
// ascending (no repeats), each < the tensor's rows and overlapping the piece; a row's values are its segment in the
// piece (rowSegment), so every length follows from the ids. All little-endian.
//
// kPushRows payload, one piece:  u32 row count k | u32 row length | u32 ids[k] | f32 values[sum of the segments]
// kPullRows request payload, for each row-sparse piece of the shard in order:  u32 k | u32 ids[k]
// kPullRows reply body: the shard's pieces' versions (u64 each), then per piece in order its values in the pull dtype:
// a dense piece whole, a row-sparse one the segments of the rows asked for.
inline constexpr std::size_t kPsRowPushHeaderBytes = 8;

// Elements of the segments of `ids` in piece `p`.
uint64_t psRowElements(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids);
// Payload bytes of a kPushRows of `ids` (the row ids must be valid).
uint64_t psRowPushBytes(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids);
// Encodes a kPushRows payload into `out` (psRowPushBytes long) from the piece's gradient `grad` (p.numel elements).
void encodePsRowPush(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids, const float* grad,
                     std::span<std::byte> out) noexcept;
// Validates a kPushRows payload for piece `p` and returns its ids; its values start at payload + 8 + 4 k. Throws
// InvalidPayload naming the field (row count, row length, row id, payload size) for a payload that does not add up.
std::vector<uint32_t> decodePsRowPush(const PsPlan& plan, const PsPiece& p, std::span<const std::byte> payload);
// Encodes a kPullRows request payload to `shard`: `ids` per piece of the shard, as decodePsRowPull returns them (the
// entries of dense pieces are not sent).
std::vector<std::byte> encodePsRowPull(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids);
// Validates a kPullRows request payload for `shard`: per piece of the shard, the ids asked for (empty for a dense
// piece). Throws InvalidPayload naming the field as decodePsRowPush does.
std::vector<std::vector<uint32_t>> decodePsRowPull(const PsPlan& plan, int shard, std::span<const std::byte> payload);
// Bytes of a kPullRows reply body from `shard` for `ids` (per piece of the shard, as decodePsRowPull returns them).
uint64_t psRowPullBodyBytes(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids, DType dtype);
// Encodes a kPullRows reply body: `values` is the shard's range, `ids` as above; `out` psRowPullBodyBytes long.
void encodePsRowPullBody(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids,
                         std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                         std::span<std::byte> out) noexcept;
// The inverse, into `params` (the whole flat vector: only the pieces' values that travelled are written) and
// `versions` (per piece of the shard). Throws InvalidPayload when the body's length is not the one the ids imply.
void decodePsRowPullBody(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids,
                         std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                         std::span<float> params);

// ---- Delta pull frames: a pull through a pull compressor (param_server_shard.h, "Compressed pulls"). The request is
// a header alone (dtype 0, no payload). The reply (dtype f32) has as body the shard's pieces' versions (u64 each), then
// per piece in order: u64 payload length L, the L bytes of the pull compressor's payload of the piece's change since
// the worker's last pull, and zero bytes up to a multiple of 8, so that every length and payload starts 8-aligned in a
// reply buffer (plugins may read their payloads as words); last, a u64 psValuesChecksum of the shard's replica of the
// worker's copy after the pull, which the worker compares with its own.
inline constexpr uint64_t psPad8(uint64_t n) noexcept {
  return (n + 7) & ~uint64_t{7};
}
// The longest delta pull body of a shard whose pieces' payloads are at most `max_payloads` (one per piece).
uint64_t psDeltaPullMaxBodyBytes(std::span<const uint64_t> max_payloads);
struct PsDeltaPullBody {
  std::vector<std::span<const std::byte>> payloads;  // per piece, views of the body
  uint64_t checksum = 0;                             // of the shard's replica after the pull
};
// Splits a delta pull body: the versions into `versions` (per piece of the shard), each piece's payload and the
// checksum. Throws InvalidPayload naming the piece (its index in the shard) for a length over that piece's maximum or
// past the body's end, padding that is not zero, or a body that does not end with the checksum right after the last
// piece.
PsDeltaPullBody decodePsDeltaPullBody(std::span<const std::byte> body, std::span<uint64_t> versions,
                                      std::span<const uint64_t> max_payloads);
// Writes a piece's length at `at` of a delta pull body (the payload follows it) and zeroes the padding after the
// payload; returns the bytes of the entry (8 + the padded payload).
uint64_t encodePsDeltaPullEntry(std::span<std::byte> body, uint64_t at, uint64_t payload_bytes) noexcept;
// Writes the checksum at `at`, after the last entry; returns the body's length (at + 8).
uint64_t encodePsDeltaPullChecksum(std::span<std::byte> body, uint64_t at, uint64_t checksum) noexcept;
// A 64-bit hash of the values' bits (four FNV-1a lanes over the 32-bit words, folded), cheap beside a codec pass: the
// worker's copy and the shard's replica of it must be the same bits, and a plugin whose decode differs between two
// hosts (another instruction set, a contraction) would otherwise let them drift apart unseen.
uint64_t psValuesChecksum(std::span<const float> values) noexcept;

}  // namespace terse::train
