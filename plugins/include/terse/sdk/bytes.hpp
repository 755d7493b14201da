// terse plugin SDK: bounds-checked bytes for self-describing payloads (DESIGN.md section 4).
//
// A payload is a 16-byte PayloadHeader (magic, format version, dtype, numel) followed by the plugin's sections. The
// header is 16 bytes so that, with the ABI's 16-byte aligned buffers, sections after it stay aligned for any element
// type. Every read is checked: a payload comes from the network and a short or garbled one must end in
// sdk::InvalidPayload, never in a read out of bounds.
//
// Host memory only: on the CUDA path build the header in host memory and copy it, and launch kernels on the sections.
// Values are stored in host byte order; the static_assert below makes that little-endian, the wire format.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "terse/compressor_v1.h"
#include "terse/sdk/dtype.hpp"
#include "terse/sdk/error.hpp"

namespace terse::sdk {

static_assert(std::endian::native == std::endian::little, "terse payloads are little-endian; add byte swaps here");

// Writes into a fixed output buffer. Running out of space means the plugin's sizes() under-reported its output or the
// core passed less than max_output_bytes, an argument error rather than bad data, hence InvalidArgument.
class ByteWriter {
 public:
  explicit ByteWriter(std::span<std::byte> out) noexcept : out_(out) {}

  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "put<T> copies bytes: T must be trivially copyable");
    std::memcpy(reserve(sizeof(T), "value"), &value, sizeof(T));
  }

  void putBytes(std::span<const std::byte> bytes) {
    if (!bytes.empty()) std::memcpy(reserve(bytes.size(), "bytes"), bytes.data(), bytes.size());
  }

  // Hands out room for `count` elements of T at the current offset, to be filled in place (by a loop or a kernel).
  template <class T>
  std::span<T> putArray(size_t count) {
    static_assert(std::is_trivially_copyable_v<T>, "putArray<T>: T must be trivially copyable");
    if (count > remaining() / sizeof(T)) {
      overflow(std::to_string(count) + " elements of " + std::to_string(sizeof(T)) + " bytes");
    }
    std::byte* p = out_.data() + offset_;
    if (count > 0 && reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
      throw InvalidArgument("payload writer: array at offset " + std::to_string(offset_) + " is not aligned to " +
                            std::to_string(alignof(T)) + " bytes");
    }
    offset_ += count * sizeof(T);
    return {reinterpret_cast<T*>(p), count};
  }

  // Zero bytes up to the next multiple of `alignment` (a power of two), so the next section starts aligned.
  void padTo(size_t alignment) {
    const size_t pad = (alignment - offset_ % alignment) % alignment;
    if (pad > 0) std::memset(reserve(pad, "padding"), 0, pad);
  }

  size_t offset() const noexcept { return offset_; }
  size_t remaining() const noexcept { return out_.size() - offset_; }
  std::span<std::byte> written() const noexcept { return out_.first(offset_); }

 private:
  std::byte* reserve(size_t n, const char* what) {
    if (n > remaining()) overflow(std::to_string(n) + " bytes of " + what);
    std::byte* p = out_.data() + offset_;
    offset_ += n;
    return p;
  }

  [[noreturn]] void overflow(const std::string& needed) const {
    throw InvalidArgument("payload writer: no room for " + needed + " at offset " + std::to_string(offset_) +
                          ": the output holds " + std::to_string(out_.size()) + " bytes");
  }

  std::span<std::byte> out_;
  size_t offset_ = 0;
};

// Reads an untrusted payload front to back. Every overrun throws InvalidPayload saying what was expected and what was
// there; `what` labels name the field in those messages.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) noexcept : in_(in) {}

  template <class T>
  T get(std::string_view what = "value") {
    static_assert(std::is_trivially_copyable_v<T> && std::is_default_constructible_v<T>,
                  "get<T> copies bytes: T must be trivially copyable");
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }

  // The next n bytes as a view into the payload.
  std::span<const std::byte> take(size_t n, std::string_view what = "bytes") {
    if (n > remaining()) truncated(std::to_string(n) + " bytes of " + std::string(what));
    std::span<const std::byte> s = in_.subspan(offset_, n);
    offset_ += n;
    return s;
  }

  // The next `count` elements of T as a view into the payload; the section must be aligned for T.
  template <class T>
  std::span<const T> getArray(size_t count, std::string_view what = "array") {
    static_assert(std::is_trivially_copyable_v<T>, "getArray<T>: T must be trivially copyable");
    if (count > remaining() / sizeof(T)) {
      truncated(std::to_string(count) + " elements of " + std::to_string(sizeof(T)) + " bytes (" + std::string(what) +
                ")");
    }
    const std::byte* p = in_.data() + offset_;
    if (count > 0 && reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
      throw InvalidPayload("payload section '" + std::string(what) + "' at offset " + std::to_string(offset_) +
                           " is not aligned to " + std::to_string(alignof(T)) + " bytes");
    }
    offset_ += count * sizeof(T);
    return {reinterpret_cast<const T*>(p), count};
  }

  // Skips to the next multiple of `alignment` (a power of two), over the zero bytes ByteWriter::padTo wrote. Nonzero
  // padding is refused: it keeps one encoding per payload and catches corruption the section lengths cannot.
  void skipTo(size_t alignment, std::string_view what = "padding") {
    const size_t pad = (alignment - offset_ % alignment) % alignment;
    for (const std::byte b : take(pad, what)) {
      if (b != std::byte{0}) throw InvalidPayload(std::string(what) + ": nonzero padding bytes");
    }
  }

  // Throws InvalidPayload if bytes are left: a payload longer than its header says is as malformed as a short one.
  void expectEnd() const {
    if (remaining() != 0) {
      throw InvalidPayload("payload has " + std::to_string(remaining()) + " unexpected trailing bytes: expected " +
                           std::to_string(offset_) + " bytes, got " + std::to_string(in_.size()));
    }
  }

  size_t offset() const noexcept { return offset_; }
  size_t remaining() const noexcept { return in_.size() - offset_; }
  size_t size() const noexcept { return in_.size(); }

 private:
  [[noreturn]] void truncated(const std::string& expected) const {
    throw InvalidPayload("payload truncated at offset " + std::to_string(offset_) + ": expected " + expected +
                         ", only " + std::to_string(remaining()) + " of " + std::to_string(in_.size()) + " bytes left");
  }

  std::span<const std::byte> in_;
  size_t offset_ = 0;
};

// Four characters as a magic number whose bytes read as those characters in a hex dump: fourcc("TOPK").
constexpr uint32_t fourcc(const char (&s)[5]) noexcept {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[0])) |
         static_cast<uint32_t>(static_cast<unsigned char>(s[1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[3])) << 24;
}

namespace detail {
inline std::string hex32(uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s += kDigits[(v >> shift) & 0xfu];
  return s;
}
}  // namespace detail

// Identifies one payload layout of one plugin. Bump `version` whenever the bytes after the header change meaning.
struct PayloadFormat {
  const char* plugin;  // named in validation messages
  uint32_t magic;
  uint16_t version;
};

// The shared header. Identical on every rank for the same tensor, so SUM compressors can declare it as their
// sum_header_bytes.
struct alignas(16) PayloadHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t dtype;  // the tensor's terse_dtype_v1
  uint64_t numel;  // the tensor's element count
};
static_assert(sizeof(PayloadHeader) == 16 && alignof(PayloadHeader) == 16);
inline constexpr size_t kPayloadHeaderBytes = sizeof(PayloadHeader);

inline void writeHeader(ByteWriter& w, const PayloadFormat& format, const terse_tensor_info_v1& info) {
  if (w.offset() % kPayloadHeaderBytes != 0) {
    throw InvalidArgument("payload header must start at a multiple of 16 bytes, not at offset " +
                          std::to_string(w.offset()));
  }
  w.put(PayloadHeader{format.magic, format.version, static_cast<uint16_t>(info.dtype), info.numel});
}

// Reads the header and checks it against the format and the tensor this call is about.
inline PayloadHeader readHeader(ByteReader& r, const PayloadFormat& format, const terse_tensor_info_v1& info) {
  const std::string who = std::string(format.plugin) + ": ";
  if (r.remaining() < kPayloadHeaderBytes) {
    throw InvalidPayload(who + "payload of " + std::to_string(r.remaining()) + " bytes is too short for the " +
                         std::to_string(kPayloadHeaderBytes) + "-byte header");
  }
  const auto h = r.get<PayloadHeader>("header");
  if (h.magic != format.magic) {
    throw InvalidPayload(who + "payload magic " + detail::hex32(h.magic) + " is not " + format.plugin + "'s (" +
                         detail::hex32(format.magic) + ")");
  }
  if (h.version != format.version) {
    throw InvalidPayload(who + "payload format version " + std::to_string(h.version) +
                         " is not supported (this build reads version " + std::to_string(format.version) + ")");
  }
  if (h.dtype != info.dtype) {
    throw InvalidPayload(who + "payload dtype " + dtypeName(h.dtype) + " does not match the tensor's " +
                         dtypeName(info.dtype));
  }
  if (h.numel != info.numel) {
    throw InvalidPayload(who + "payload numel " + std::to_string(h.numel) + " does not match the tensor's " +
                         std::to_string(info.numel));
  }
  return h;
}

}  // namespace terse::sdk
