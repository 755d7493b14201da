// Exact top-k by magnitude on the host: a radix select over the 31-bit keys of |g| (topk_math.hpp), O(n) with small
// constants, followed by one compaction pass in index order. Used by the built-ins topk (the whole selection) and dgc
// (its sample threshold and its exact fallback). The GPU path (topk_select_kernels.cuh, shared by their .cu files) runs
// the same radix select with the same keys, digits and tie rule, so both paths select the same elements.
//
// How the cut is found: a histogram of the top digit (bits 30..18) over all keys says in which bin the k-th largest key
// lies and how many keys lie above that bin; the next digit's histogram over the keys of that bin narrows further, and
// so on for three digits, which gives the k-th largest key exactly ("cut") and the number of keys strictly above it.
// The selection is every key above the cut plus the first (k - greater) keys equal to it in index order, so ties go to
// the lower index and the output is sorted by index.
//
// The fast path: after a digit's histogram, the elements whose key is at least the smallest key with the narrowed
// prefix are the candidates (every selected element is one). As soon as they fit the candidate buffer (2k + n/64 +
// 4096), one branch-free pass copies them (value, index) in index order, and the remaining digits and the compaction
// run on that short list instead of the full tensor: two full passes for smooth data (histogram, copy), three when the
// top digit's boundary bin is dense (ties). Heavily tied data narrows all three digits on the full tensor and compacts
// it (four passes). The result never depends on the buffer's size, only the time. All loops are branch-free in the
// element data except for the rare taken element, so a random sign or magnitude pattern costs no mispredictions.
//
// Memory: everything lives in a caller-provided workspace (the core's, sized by selectWorkspaceBytes); nothing here
// allocates.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "terse/kit/topk_math.hpp"

namespace terse::kit::topk {

// The k-th largest key and how many keys are strictly larger: select key > key, plus (count - greater) ties.
struct Cut {
  uint32_t key = 0;
  uint64_t greater = 0;
};

// One candidate of the fast path: the value itself (so the compaction need not touch the tensor again) and its index.
struct Candidate {
  float value;
  uint32_t index;
};

// Histogram scratch: 4 interleaved copies of the counters, so that runs of equal digits (gradients cluster in a few
// octaves, and sparse ones are mostly exact zeros) do not serialize on one counter's store-to-load latency. Copies lie
// 64 bytes off a multiple of 4 KiB apart: at a 4 KiB multiple, loads from one copy falsely wait on stores to another
// (4K aliasing), which cost 3x on mostly-zero data. The top digit has 8192 bins per copy, the others at most 1024.
inline constexpr size_t kCopies = 4;
inline constexpr size_t kTopStride = kMaxBins + 16;
inline constexpr size_t kLowBins = 1024;
inline constexpr size_t kLowStride = kLowBins + 16;
inline constexpr size_t kHistogramBytes = kCopies * kTopStride * sizeof(uint32_t);
static_assert((1u << digitBits(0)) == kMaxBins && (1u << digitBits(1)) <= kLowBins && (1u << digitBits(2)) <= kLowBins);

// Candidate buffer entries for n elements and k selected: room for every selected element, as many again, and n/64
// for the boundary bin of the top digit, which holds about 1/32 of an octave's elements (uniform data: 1.6% of n;
// normal data at 1%: 0.3%). Denser boundary bins (heavily tied data) narrow the next digit on the full tensor first.
inline uint64_t candidateCapacity(uint64_t n, uint64_t k) {
  return std::min<uint64_t>(n, 2 * k + n / 64 + 4096);
}

// Workspace for selectTopK with `candidates` buffer entries (0 allowed: always the full-tensor path).
inline uint64_t selectWorkspaceBytes(uint64_t candidates) {
  return kHistogramBytes + candidates * sizeof(Candidate);
}

// The caller's workspace split into the histogram and the candidate buffer. `workspace` must be 16-byte aligned.
struct SelectScratch {
  uint32_t* hist = nullptr;  // kHistogramBytes
  std::span<Candidate> candidates;

  static SelectScratch carve(std::byte* workspace, uint64_t candidates) {
    return SelectScratch{reinterpret_cast<uint32_t*>(workspace),
                         {reinterpret_cast<Candidate*>(workspace + kHistogramBytes), static_cast<size_t>(candidates)}};
  }
};

namespace detail {

// Counts digit `level` of the keys whose higher digits equal `prefix` (all keys at level 0) into hist[0..bins), summed
// over the interleaved copies into the first. The unrolls are written out: GCC -O2 does not unroll the inner loop, and
// the interleaving is the point.
template <class KeyAt>
void histogram(size_t n, const KeyAt& keyAt, int level, uint32_t prefix, uint32_t* hist) {
  const uint32_t bins = 1u << digitBits(level);
  size_t i = 0;
  if (level == 0) {
    constexpr size_t kS = kTopStride;  // copy c at hist[c * kS]
    std::memset(hist, 0, kCopies * kS * sizeof(uint32_t));
    for (; i + 4 <= n; i += 4) {
      ++hist[0 * kS + digitOf(keyAt(i), 0)];
      ++hist[1 * kS + digitOf(keyAt(i + 1), 0)];
      ++hist[2 * kS + digitOf(keyAt(i + 2), 0)];
      ++hist[3 * kS + digitOf(keyAt(i + 3), 0)];
    }
    for (; i < n; ++i) ++hist[digitOf(keyAt(i), 0)];
    for (uint32_t b = 0; b < bins; ++b) hist[b] += hist[kS + b] + hist[2 * kS + b] + hist[3 * kS + b];
    return;
  }
  constexpr size_t kS = kLowStride;
  std::memset(hist, 0, kCopies * kS * sizeof(uint32_t));
  const uint32_t digit_shift = digitShift(level);
  const uint32_t digit_mask = bins - 1;
  const uint32_t prefix_shift = digitShift(level) + digitBits(level);
  // A key outside the prefix adds 0 to bin 0 of its copy instead of branching on data-dependent matches. These levels
  // run on the candidates (where most keys match), and on the full tensor only when ties crowd the boundary bin.
  const auto add = [&](uint32_t* h, uint32_t key) {
    const uint32_t hit = (key >> prefix_shift) == prefix ? 1u : 0u;
    h[((key >> digit_shift) & digit_mask) * hit] += hit;
  };
  for (; i + 4 <= n; i += 4) {
    add(hist + 0 * kS, keyAt(i));
    add(hist + 1 * kS, keyAt(i + 1));
    add(hist + 2 * kS, keyAt(i + 2));
    add(hist + 3 * kS, keyAt(i + 3));
  }
  for (; i < n; ++i) add(hist, keyAt(i));
  for (uint32_t b = 0; b < bins; ++b) hist[b] += hist[kS + b] + hist[2 * kS + b] + hist[3 * kS + b];
}

// Finds the bin holding the need-th largest key (1 <= need <= total of hist): returns the bin and adds the count of the
// bins above it to *above.
inline uint32_t pickBin(const uint32_t* hist, int level, uint64_t need, uint64_t* above) {
  uint64_t sum = 0;
  for (uint32_t b = (1u << digitBits(level)); b-- > 0;) {
    if (sum + hist[b] >= need) {
      *above += sum;
      return b;
    }
    sum += hist[b];
  }
  return 0;  // unreachable when need <= total; bin 0 keeps the caller in bounds regardless
}

}  // namespace detail

// Entries are scanned in blocks of kScanBlock: a block with no key >= the scan's lower bound (the common case when a
// small fraction is selected) is skipped after a compare loop GCC vectorizes, so only the few blocks that hold a
// selected element pay for the per-element work and for a branch that depends on the data.
inline constexpr size_t kScanBlock = 8;

// Calls visit(i) for every i in [0, n) whose block of kScanBlock holds a key >= lo (visit decides, branch-free, what
// to keep), in index order; stops after a block once done() says so. Keys are < 2^31, so the signed compare is exact
// (SSE2 has no unsigned one).
template <class KeyAt, class Visit, class Done>
void scanBlocks(size_t n, const KeyAt& keyAt, uint32_t lo, const Visit& visit, const Done& done) {
  const auto lo_signed = static_cast<int32_t>(lo);
  size_t i = 0;
  for (; i + kScanBlock <= n; i += kScanBlock) {
    uint32_t any = 0;
    for (size_t j = 0; j < kScanBlock; ++j) any |= static_cast<int32_t>(keyAt(i + j)) >= lo_signed ? 1u : 0u;
    if (any == 0) continue;
    for (size_t j = 0; j < kScanBlock; ++j) visit(i + j);
    if (done()) return;
  }
  for (; i < n; ++i) visit(i);
}

// The cut for the k largest of the n keys keyAt(0..n-1), 1 <= k <= n; three histogram passes over the keys.
template <class KeyAt>
Cut radixCut(size_t n, const KeyAt& keyAt, uint64_t k, uint32_t* hist) {
  Cut cut;
  uint32_t prefix = 0;
  for (int level = 0; level < kDigits; ++level) {
    detail::histogram(n, keyAt, level, prefix, hist);
    const uint32_t bin = detail::pickBin(hist, level, k - cut.greater, &cut.greater);
    prefix = (prefix << digitBits(level)) | bin;
  }
  cut.key = prefix;
  return cut;
}

// Writes the `count` elements selected by `cut` (count in [cut.greater, cut.greater + ties]) in index order: values[j]
// and indices[j] for j < count. valueAt(i)/indexAt(i) read entry i of the n scanned entries. Returns true if a selected
// value is inf or NaN.
template <class ValueAt, class IndexAt>
bool compactByCut(size_t n, const ValueAt& valueAt, const IndexAt& indexAt, Cut cut, uint64_t count, float* values,
                  uint32_t* indices) {
  if (count == 0) return false;
  uint64_t ties = count - cut.greater;
  uint64_t c = 0;
  uint32_t nonfinite = 0;
  float sink_value;  // where a store goes when its element is not taken: a select, not a branch
  uint32_t sink_index;
  const auto keyAt = [&](size_t i) { return magnitudeKey(valueAt(i)); };
  scanBlocks(
      n, keyAt, cut.key,
      [&](size_t i) {
        const float v = valueAt(i);
        const uint32_t key = magnitudeKey(v);
        const bool take = takeByCut(key, cut.key, ties);
        ties -= (take && key == cut.key) ? 1 : 0;
        *(take ? values + c : &sink_value) = v;
        *(take ? indices + c : &sink_index) = indexAt(i);
        nonfinite |= take && isNonFiniteKey(key) ? 1u : 0u;
        c += take ? 1 : 0;
      },
      [&] { return c == count; });
  return nonfinite != 0;
}

// Exact top-k of g (1 <= k <= g.size() < 2^32): values and indices of the k largest |g|, ties to the lower index,
// sorted by index. Returns true if a selected value is inf or NaN (then g holds one: those have the largest keys, so
// any non-finite element of g is reported).
inline bool selectTopK(std::span<const float> g, uint64_t k, const SelectScratch& scratch, float* values,
                       uint32_t* indices) {
  const size_t n = g.size();
  const float* data = g.data();
  const auto keyOf = [data](size_t i) { return magnitudeKey(data[i]); };
  const auto valueOf = [data](size_t i) { return data[i]; };
  const auto indexOf = [](size_t i) { return static_cast<uint32_t>(i); };
  if (k >= n) return compactByCut(n, valueOf, indexOf, Cut{0, 0}, n, values, indices);  // everything

  // Narrow digit by digit on the full tensor until the keys at or above the narrowed prefix (every selected element
  // among them) fit the candidate buffer; then finish on the candidates.
  Cut cut;
  uint32_t prefix = 0;
  for (int level = 0; level < kDigits; ++level) {
    detail::histogram(n, keyOf, level, prefix, scratch.hist);
    const uint32_t bin = detail::pickBin(scratch.hist, level, k - cut.greater, &cut.greater);
    prefix = (prefix << digitBits(level)) | bin;
    const uint64_t candidates = cut.greater + scratch.hist[bin];  // keys >= lo
    if (level + 1 < kDigits && candidates <= scratch.candidates.size()) {
      const uint32_t lo = prefix << digitShift(level);
      Candidate* out = scratch.candidates.data();
      size_t c = 0;
      Candidate sink;
      scanBlocks(
          n, keyOf, lo,
          [&](size_t i) {
            const float v = data[i];
            const bool take = magnitudeKey(v) >= lo;
            *(take ? out + c : &sink) = Candidate{v, static_cast<uint32_t>(i)};
            c += take ? 1 : 0;
          },
          [&] { return c == candidates; });
      const Cut candidate_cut = radixCut(
          c, [out](size_t i) { return magnitudeKey(out[i].value); }, k, scratch.hist);
      return compactByCut(
          c, [out](size_t i) { return out[i].value; }, [out](size_t i) { return out[i].index; }, candidate_cut, k,
          values, indices);
    }
  }
  cut.key = prefix;
  return compactByCut(n, valueOf, indexOf, cut, k, values, indices);
}

}  // namespace terse::kit::topk
