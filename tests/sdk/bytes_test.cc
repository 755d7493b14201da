// sdk::ByteWriter / ByteReader and the shared payload header: every overrun of untrusted bytes is an InvalidPayload
// that says what was expected and what was there, never a read out of bounds.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "sdk_test_util.h"
#include "terse/sdk.hpp"

namespace terse::sdk {
namespace {

using testing::makeInfo;

template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected exception not thrown";
  return "";
}

TEST(SdkBytes, WriterAndReaderRoundTrip) {
  alignas(16) std::array<std::byte, 64> buf{};
  ByteWriter w(buf);
  w.put<uint32_t>(0xdeadbeefu);
  w.put<uint16_t>(7);
  w.padTo(8);
  w.put<double>(-2.5);
  const std::array<std::byte, 3> raw{std::byte{1}, std::byte{2}, std::byte{3}};
  w.putBytes(raw);
  w.padTo(4);
  std::span<float> arr = w.putArray<float>(3);
  arr[0] = 1.0f, arr[1] = 2.0f, arr[2] = 3.0f;
  EXPECT_EQ(w.offset(), 32u);
  EXPECT_EQ(w.remaining(), 32u);
  EXPECT_EQ(w.written().size(), 32u);

  ByteReader r(w.written());
  EXPECT_EQ(r.get<uint32_t>(), 0xdeadbeefu);
  EXPECT_EQ(r.get<uint16_t>(), 7u);
  r.skipTo(8);
  EXPECT_EQ(r.get<double>(), -2.5);
  std::span<const std::byte> t = r.take(3);
  EXPECT_EQ(std::memcmp(t.data(), raw.data(), 3), 0);
  r.skipTo(4);
  std::span<const float> f = r.getArray<float>(3);
  EXPECT_EQ(f[2], 3.0f);
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_NO_THROW(r.expectEnd());

  // Padding must be the zeros padTo wrote: one encoding per payload.
  std::vector<std::byte> dirty(w.written().begin(), w.written().end());
  dirty[6] = std::byte{1};
  ByteReader d(dirty);
  d.get<uint32_t>();
  d.get<uint16_t>();
  EXPECT_THROW(d.skipTo(8), InvalidPayload);
}

TEST(SdkBytes, WriterOverflowIsAnArgumentError) {
  alignas(16) std::array<std::byte, 6> buf{};
  ByteWriter w(buf);
  w.put<uint32_t>(1);
  EXPECT_EQ(messageOf<InvalidArgument>([&] { w.put<uint32_t>(2); }),
            "payload writer: no room for 4 bytes of value at offset 4: the output holds 6 bytes");
  EXPECT_EQ(w.offset(), 4u);  // a failed write moves nothing
  EXPECT_THROW(w.putArray<uint16_t>(2), InvalidArgument);
  EXPECT_THROW(w.putArray<uint16_t>(std::numeric_limits<size_t>::max()), InvalidArgument);  // no size overflow
  EXPECT_NO_THROW(w.putArray<uint16_t>(1));
  EXPECT_THROW(w.padTo(8), InvalidArgument);
}

TEST(SdkBytes, ReaderOverrunsAreInvalidPayload) {
  alignas(16) std::array<std::byte, 8> buf{};
  ByteReader r(buf);
  r.get<uint32_t>();
  EXPECT_EQ(messageOf<InvalidPayload>([&] { r.get<uint64_t>("scale"); }),
            "payload truncated at offset 4: expected 8 bytes of scale, only 4 of 8 bytes left");
  EXPECT_EQ(r.offset(), 4u);
  EXPECT_EQ(messageOf<InvalidPayload>([&] { r.take(5, "codes"); }),
            "payload truncated at offset 4: expected 5 bytes of codes, only 4 of 8 bytes left");
  EXPECT_EQ(messageOf<InvalidPayload>([&] { r.getArray<float>(2, "values"); }),
            "payload truncated at offset 4: expected 2 elements of 4 bytes (values), only 4 of 8 bytes left");
  // A count read from the payload must not overflow the size check.
  EXPECT_THROW(r.getArray<uint64_t>(std::numeric_limits<size_t>::max() / 4), InvalidPayload);
  EXPECT_EQ(messageOf<InvalidPayload>([&] { r.expectEnd(); }),
            "payload has 4 unexpected trailing bytes: expected 4 bytes, got 8");
  r.take(4);
  EXPECT_THROW(r.get<uint8_t>(), InvalidPayload);
  EXPECT_NO_THROW(r.take(0));
  EXPECT_NO_THROW(r.expectEnd());

  ByteReader empty(std::span<const std::byte>{});
  EXPECT_THROW(empty.get<uint8_t>(), InvalidPayload);
  EXPECT_NO_THROW(empty.expectEnd());
}

TEST(SdkBytes, MisalignedSectionsAreRejected) {
  alignas(16) std::array<std::byte, 16> buf{};
  ByteReader r(buf);
  r.take(2);
  EXPECT_EQ(messageOf<InvalidPayload>([&] { r.getArray<float>(1, "values"); }),
            "payload section 'values' at offset 2 is not aligned to 4 bytes");
  EXPECT_NO_THROW(r.getArray<float>(0));  // an empty section has no alignment to keep
  ByteWriter w(buf);
  w.put<uint8_t>(1);
  EXPECT_THROW(w.putArray<uint32_t>(1), InvalidArgument);
}

TEST(SdkBytes, FourccSpellsItsBytes) {
  const uint32_t m = fourcc("TOPK");
  char bytes[4];
  std::memcpy(bytes, &m, 4);
  EXPECT_EQ(std::string(bytes, 4), "TOPK");
}

TEST(SdkBytes, DtypeHelpers) {
  EXPECT_EQ(dtypeSize(TERSE_DTYPE_F32), 4u);
  EXPECT_EQ(dtypeSize(TERSE_DTYPE_BF16), 2u);
  EXPECT_EQ(dtypeSize(TERSE_DTYPE_I64), 8u);
  EXPECT_EQ(dtypeSize(99), 0u);
  EXPECT_EQ(dtypeName(TERSE_DTYPE_F16), "f16");
  EXPECT_EQ(dtypeName(99), "dtype(99)");
  EXPECT_TRUE(isValidDtype(TERSE_DTYPE_I8));
  EXPECT_FALSE(isValidDtype(TERSE_DTYPE_COUNT_V1));
  EXPECT_FALSE(isValidDtype(-1));
  EXPECT_TRUE(dtypeMatches<float>(TERSE_DTYPE_F32));
  EXPECT_FALSE(dtypeMatches<float>(TERSE_DTYPE_I32));
  EXPECT_TRUE(dtypeMatches<uint16_t>(TERSE_DTYPE_BF16));
  EXPECT_FALSE(dtypeMatches<uint16_t>(TERSE_DTYPE_F32));
}

constexpr PayloadFormat kTopk{"topk", fourcc("TOPK"), 3};

TEST(SdkHeader, IsSixteenBytesAndRoundTrips) {
  static_assert(kPayloadHeaderBytes == 16);
  alignas(16) std::array<std::byte, 32> buf{};
  const terse_tensor_info_v1 info = makeInfo(12);
  ByteWriter w(buf);
  writeHeader(w, kTopk, info);
  EXPECT_EQ(w.offset(), 16u);
  ByteReader r(w.written());
  const PayloadHeader h = readHeader(r, kTopk, info);
  EXPECT_EQ(h.magic, kTopk.magic);
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.dtype, TERSE_DTYPE_F32);
  EXPECT_EQ(h.numel, 12u);
  EXPECT_EQ(r.offset(), 16u);
  // Layout: magic at 0, version at 4, dtype at 6, numel at 8.
  uint16_t version = 0;
  uint64_t numel = 0;
  std::memcpy(&version, buf.data() + 4, 2);
  std::memcpy(&numel, buf.data() + 8, 8);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(numel, 12u);
}

// A header for `info` with one field changed by `edit`, read back against kTopk and makeInfo(12).
template <class Edit>
std::string readError(Edit edit, size_t bytes = 16) {
  alignas(16) std::array<std::byte, 16> buf{};
  PayloadHeader h{kTopk.magic, kTopk.version, static_cast<uint16_t>(TERSE_DTYPE_F32), 12};
  edit(h);
  std::memcpy(buf.data(), &h, sizeof h);
  ByteReader r(std::span<const std::byte>(buf).first(bytes));
  return messageOf<InvalidPayload>([&] { readHeader(r, kTopk, makeInfo(12)); });
}

TEST(SdkHeader, ValidationMessages) {
  EXPECT_EQ(readError([](PayloadHeader& h) { h.magic = 0x12345678; }),
            "topk: payload magic 0x12345678 is not topk's (0x4b504f54)");
  EXPECT_EQ(readError([](PayloadHeader& h) { h.version = 4; }),
            "topk: payload format version 4 is not supported (this build reads version 3)");
  EXPECT_EQ(readError([](PayloadHeader& h) { h.dtype = TERSE_DTYPE_F16; }),
            "topk: payload dtype f16 does not match the tensor's f32");
  EXPECT_EQ(readError([](PayloadHeader& h) { h.dtype = 300; }),
            "topk: payload dtype dtype(300) does not match the tensor's f32");
  EXPECT_EQ(readError([](PayloadHeader& h) { h.numel = 10; }), "topk: payload numel 10 does not match the tensor's 12");
  EXPECT_EQ(readError([](PayloadHeader&) {}, 3), "topk: payload of 3 bytes is too short for the 16-byte header");
  EXPECT_EQ(readError([](PayloadHeader&) {}, 0), "topk: payload of 0 bytes is too short for the 16-byte header");
}

TEST(SdkHeader, MustStartAligned) {
  alignas(16) std::array<std::byte, 32> buf{};
  ByteWriter w(buf);
  w.put<uint32_t>(0);
  EXPECT_EQ(messageOf<InvalidArgument>([&] { writeHeader(w, kTopk, makeInfo(1)); }),
            "payload header must start at a multiple of 16 bytes, not at offset 4");
}

}  // namespace
}  // namespace terse::sdk
