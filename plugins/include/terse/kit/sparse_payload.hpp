// The wire layout of sparsifiers that send (value, index) pairs (the built-ins topk, threshold and dgc), its writer
// and its validating reader.
//
//   offset 0                 sdk::PayloadHeader (16 B: magic, format version, dtype = f32, numel)
//   offset 16                u64 count
//   offset 24                f32 values[count]
//   offset 24 + 4 * count    u32 indices[count], strictly increasing, each < numel
//
// size = 24 + 8 * count, exactly. Indices are u32, so these plugins handle tensors of fewer than 2^32 elements.
// Strictly increasing indices make validation one linear pass (no duplicate can slip through to be added twice), and
// make decompression's scatter a forward walk through the output.
//
// readSparse validates everything before the caller writes a byte of output: the header against the tensor, the count
// against the plugin's bounds and numel, the exact size, every index, and that every value is finite (the plugins'
// compress refuses non-finite gradients, so a non-finite value on the wire is corruption).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "terse/kit/topk_math.hpp"
#include "terse/sdk.hpp"

namespace terse::kit::sparse {

namespace sdk = terse::sdk;

inline constexpr uint64_t kCountOffset = sdk::kPayloadHeaderBytes;
inline constexpr uint64_t kFixedBytes = sdk::kPayloadHeaderBytes + sizeof(uint64_t);
// Indices are u32: numel - 1 must fit.
inline constexpr uint64_t kMaxNumel = 0xffffffffull;

constexpr uint64_t payloadBytes(uint64_t count) {
  return kFixedBytes + (sizeof(float) + sizeof(uint32_t)) * count;
}

// The count a payload of `bytes` bytes must hold (the inverse of payloadBytes), or false when no count gives that size.
// The device decoders of the variable-size sparsifiers take the count from the size instead of reading the payload's
// count field back (a synchronization): the field is part of the prefix their validation compares, so a payload whose
// field disagrees with its size is refused there and gets the host's verdict, as before.
constexpr bool countForSize(uint64_t bytes, uint64_t* count) {
  if (bytes < kFixedBytes || (bytes - kFixedBytes) % (sizeof(float) + sizeof(uint32_t)) != 0) return false;
  *count = (bytes - kFixedBytes) / (sizeof(float) + sizeof(uint32_t));
  return true;
}

// The decoded sections, views into the payload.
struct SparseView {
  std::span<const float> values;
  std::span<const uint32_t> indices;
};

inline void requireF32(const char* plugin, terse_dtype_v1 dtype) {
  if (dtype != TERSE_DTYPE_F32) {
    throw sdk::Unsupported(std::string(plugin) + ": only f32 gradients are supported, got " + sdk::dtypeName(dtype));
  }
}

// The device check of a sparsifier that has CUDA kernels: `devices` is what it advertises (device::kDevices), so a
// build without the kernels refuses CUDA tensors (host memory only), and no build accepts a device it does not know.
inline void requireDevice(const char* plugin, terse_device_v1 device, terse_device_v1 devices) {
  if (device != TERSE_DEVICE_HOST && device != TERSE_DEVICE_CUDA) {
    throw sdk::Unsupported(std::string(plugin) + ": unknown device " + std::to_string(device));
  }
  if ((device & devices) == 0) {
    throw sdk::Unsupported(std::string(plugin) +
                           ": only host memory is supported (this build of the plugin has no CUDA kernels)");
  }
}

inline void requireIndexable(const char* plugin, uint64_t numel) {
  if (numel > kMaxNumel) {
    throw sdk::Unsupported(std::string(plugin) + ": tensors of " + std::to_string(numel) +
                           " elements are too large for u32 indices (at most " + std::to_string(kMaxNumel) + ")");
  }
}

// Writes header and count, and returns the two sections to fill.
struct SparseSections {
  std::span<float> values;
  std::span<uint32_t> indices;
};
inline SparseSections writeSparse(std::span<std::byte> output, const sdk::PayloadFormat& format,
                                  const terse_tensor_info_v1& info, uint64_t count) {
  sdk::ByteWriter w(output);
  sdk::writeHeader(w, format, info);
  w.put(count);
  SparseSections s;
  s.values = w.putArray<float>(static_cast<size_t>(count));
  s.indices = w.putArray<uint32_t>(static_cast<size_t>(count));
  return s;
}

// Validates a payload whose count must lie in [min_count, max_count] (clamped to numel) and returns its sections.
// `min_key` is the least magnitude key a value may have (0: any finite value): threshold passes its tau.
inline SparseView readSparse(std::span<const std::byte> payload, const sdk::PayloadFormat& format,
                             const terse_tensor_info_v1& info, uint64_t min_count, uint64_t max_count,
                             uint32_t min_key = 0) {
  const std::string who = std::string(format.plugin) + ": ";
  requireIndexable(format.plugin, info.numel);
  sdk::ByteReader r(payload);
  sdk::readHeader(r, format, info);
  const auto count = r.get<uint64_t>("count");
  if (count > info.numel) {
    throw sdk::InvalidPayload(who + "payload count " + std::to_string(count) + " exceeds numel " +
                              std::to_string(info.numel));
  }
  if (count < min_count || count > max_count) {
    throw sdk::InvalidPayload(who + "payload count " + std::to_string(count) + " is outside [" +
                              std::to_string(min_count) + ", " + std::to_string(max_count) + "] for " +
                              std::to_string(info.numel) + " elements");
  }
  // count <= numel < 2^32, so the exact size cannot overflow.
  if (payload.size() != payloadBytes(count)) {
    throw sdk::InvalidPayload(who + "payload of " + std::to_string(payload.size()) + " bytes, expected " +
                              std::to_string(payloadBytes(count)) + " for " + std::to_string(count) + " entries");
  }
  SparseView v;
  v.values = r.getArray<float>(static_cast<size_t>(count), "values");
  v.indices = r.getArray<uint32_t>(static_cast<size_t>(count), "indices");
  r.expectEnd();

  // One pass each, with no early exit on the common (valid) path; the error path then finds the first culprit.
  uint32_t bad_index = 0;
  uint64_t prev = 0;  // the previous entry's index (entry 0 has none)
  for (size_t j = 0; j < v.indices.size(); ++j) {
    const uint64_t idx = v.indices[j];
    bad_index |= (idx >= info.numel || (j > 0 && idx <= prev)) ? 1u : 0u;
    prev = idx;
  }
  if (bad_index != 0) {
    for (size_t j = 0; j < v.indices.size(); ++j) {
      if (v.indices[j] >= info.numel) {
        throw sdk::InvalidPayload(who + "index " + std::to_string(v.indices[j]) + " at entry " + std::to_string(j) +
                                  " is out of range for " + std::to_string(info.numel) + " elements");
      }
      if (j > 0 && v.indices[j] <= v.indices[j - 1]) {
        throw sdk::InvalidPayload(who + "indices are not strictly increasing: entry " + std::to_string(j) + " is " +
                                  std::to_string(v.indices[j]) + " after " + std::to_string(v.indices[j - 1]));
      }
    }
  }
  uint32_t bad_value = 0;
  for (float x : v.values) {
    const uint32_t key = topk::magnitudeKey(x);
    bad_value |= (topk::isNonFiniteKey(key) || key < min_key) ? 1u : 0u;
  }
  if (bad_value != 0) {
    for (size_t j = 0; j < v.values.size(); ++j) {
      const uint32_t key = topk::magnitudeKey(v.values[j]);
      if (topk::isNonFiniteKey(key)) {
        throw sdk::InvalidPayload(who + "value at entry " + std::to_string(j) + " is not finite");
      }
      if (key < min_key) {
        throw sdk::InvalidPayload(who + "value " + sdk::formatNumber(v.values[j]) + " at entry " + std::to_string(j) +
                                  " is below the selection threshold " + sdk::formatNumber(topk::bitsToFloat(min_key)));
      }
    }
  }
  return v;
}

// out = decoded (zeros elsewhere), or out += decoded when accumulate.
inline void scatter(const SparseView& v, std::span<float> out, bool accumulate) {
  float* o = out.data();
  if (!accumulate) {
    for (float& x : out) x = 0.0f;
    for (size_t j = 0; j < v.values.size(); ++j) o[v.indices[j]] = v.values[j];
  } else {
    for (size_t j = 0; j < v.values.size(); ++j) o[v.indices[j]] += v.values[j];
  }
}

}  // namespace terse::kit::sparse
