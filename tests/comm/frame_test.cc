// The frame header: encoding, and validation of every field a receiver reads from an untrusted peer.
#include <gtest/gtest.h>

#include <string>

#include "core/comm/frame.h"
#include "core/common/error.h"

namespace terse::comm {
namespace {

FrameHeader sample() {
  FrameHeader h;
  h.meta = FrameMeta{OpKind::kAllgather, kCollectiveTagBit | 42, 7};
  h.length = 1234;
  return h;
}

void expectRejected(EncodedHeader bytes, const std::string& needle, uint64_t max = kDefaultMaxFrameBytes) {
  try {
    decodeFrameHeader(bytes, max, "frame from rank 3");
    ADD_FAILURE() << "accepted a bad header, expected: " << needle;
  } catch (const InvalidPayload& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("frame from rank 3"), std::string::npos) << what;
  }
}

TEST(Frame, RoundTripAndLayout) {
  const EncodedHeader bytes = encodeFrameHeader(sample());
  static_assert(sizeof(EncodedHeader) == kFrameHeaderBytes);
  // Little-endian magic "TRSF", version 1, kind, flags 0.
  EXPECT_EQ(bytes[0], std::byte{'T'});
  EXPECT_EQ(bytes[3], std::byte{'F'});
  EXPECT_EQ(bytes[4], std::byte{1});
  EXPECT_EQ(bytes[6], std::byte{static_cast<uint8_t>(OpKind::kAllgather)});
  EXPECT_EQ(bytes[7], std::byte{0});
  const FrameHeader h = decodeFrameHeader(bytes, kDefaultMaxFrameBytes, "test");
  EXPECT_EQ(h.meta.kind, OpKind::kAllgather);
  EXPECT_EQ(h.meta.tag, kCollectiveTagBit | 42);
  EXPECT_EQ(h.meta.tensor, 7u);
  EXPECT_EQ(h.length, 1234u);
  EXPECT_EQ(frameWireBytes(1234), 1266u);
}

TEST(Frame, EveryFieldIsValidated) {
  EncodedHeader b = encodeFrameHeader(sample());
  b[0] = std::byte{'X'};
  expectRejected(b, "bad magic");
  b = encodeFrameHeader(sample());
  b[4] = std::byte{9};
  expectRejected(b, "frame version 9");
  b = encodeFrameHeader(sample());
  b[6] = std::byte{200};
  expectRejected(b, "unknown op kind 200");
  b = encodeFrameHeader(sample());
  b[7] = std::byte{1};
  expectRejected(b, "reserved flags");
  expectRejected(encodeFrameHeader(sample()), "exceeds the limit of 1000 bytes", 1000);
  EXPECT_THROW(decodeFrameHeader(std::span<const std::byte>(b.data(), 31), 1, "x"), InvalidPayload);
}

TEST(Frame, KindNames) {
  EXPECT_EQ(opKindName(OpKind::kP2P), "p2p");
  EXPECT_EQ(opKindName(OpKind::kAllreduce), "allreduce");
  EXPECT_EQ(opKindName(OpKind::kBarrier), "barrier");
}

}  // namespace
}  // namespace terse::comm
