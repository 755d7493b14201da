// Optional multi-threaded compress of one large tensor: a plugin whose output for elements [a, b) depends only on
// those elements (and on blocks it aligns to: qsgd's buckets, 64-code words) cuts the tensor into contiguous ranges
// and runs them on several threads, giving the same bytes as one thread. Plugins expose it as a `threads` parameter,
// 1 by default, so that timings stay comparable with other tools' single-threaded codecs unless a study asks.
//
// In simulated time (DESIGN.md section 9) the runtime charges the calling thread's CPU time: its own range plus no
// CPU while it waits for the others, i.e. the parallel section's time on a device with `threads` cores.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace terse::sdk {

// Below this many elements per thread, starting a thread (tens of microseconds) costs more than it saves: a range of
// 64K f32 takes 20-40 us to quantize on one core of a Zen 5 EPYC (50-250 us on older x86). The default of forEachRange.
inline constexpr uint64_t kMinElementsPerThread = uint64_t{1} << 16;

// The same bound for a cast (fp16, bf16), which does a few instructions an element: 2M f32 (8 MiB) per thread. On a
// 2-core Zen 5 EPYC (`terse-bench-compressors --benchmark_filter=compress_wall/`, medians of 5-7) two threads made
// fp16 slower at 4 and 8 MiB (61 -> 91 us, 119 -> 154: the tensor is in cache and one core already streams it) and
// faster from 16 MiB (344 -> 259 us; bf16 424 -> 230), where one core no longer keeps memory busy.
inline constexpr uint64_t kMinCastElementsPerThread = uint64_t{1} << 21;

// The `threads` parameter's bounds, for params.getInt("threads", 1, sdk::Range::closed(1, kMaxThreads)).
inline constexpr int64_t kMaxThreads = 64;

// Calls fn(begin, end) for contiguous ranges covering [0, n), each but the last a whole number of `unit` elements,
// on up to `threads` threads: the first range on the calling thread, the others on threads joined before it returns.
// Fewer threads when n is small (at least min_per_thread elements each). Ranges are never empty; n == 0 calls nothing.
// The first exception a range throws is rethrown after every thread has joined. unit must be >= 1.
template <class Fn>
void forEachRange(uint64_t n, uint64_t unit, int64_t threads, Fn&& fn,
                  uint64_t min_per_thread = kMinElementsPerThread) {
  const uint64_t units = n == 0 ? 0 : (n - 1) / unit + 1;
  const uint64_t by_size = std::max<uint64_t>(1, n / std::max<uint64_t>(min_per_thread, 1));
  const uint64_t pieces = std::min({static_cast<uint64_t>(std::max<int64_t>(threads, 1)), by_size, units});
  if (pieces <= 1) {
    if (n > 0) fn(uint64_t{0}, n);
    return;
  }
  // Units split as evenly as they go: the first (units % pieces) ranges get one unit more.
  const auto bound = [&](uint64_t piece) {
    const uint64_t u = piece * (units / pieces) + std::min(piece, units % pieces);
    return std::min(n, u * unit);
  };
  std::vector<std::exception_ptr> errors(pieces);
  std::vector<std::thread> helpers;
  helpers.reserve(pieces - 1);
  const auto run = [&](uint64_t piece) {
    try {
      fn(bound(piece), bound(piece + 1));
    } catch (...) {
      errors[piece] = std::current_exception();
    }
  };
  try {
    for (uint64_t p = 1; p < pieces; ++p) helpers.emplace_back(run, p);
  } catch (...) {
    // No thread to be had: what has started finishes, the rest runs here.
    for (uint64_t p = helpers.size() + 1; p < pieces; ++p) run(p);
  }
  run(0);
  for (auto& t : helpers) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// forEachRange over a pass that checks its input as it goes: fn(begin, end) returns the first failing element of its
// range, or `end` when there is none. Returns the first failing element of [0, n), or n: the same answer as one
// thread's, which stops at the first.
template <class Fn>
uint64_t firstFailure(uint64_t n, uint64_t unit, int64_t threads, Fn&& fn) {
  std::atomic<uint64_t> first{n};
  forEachRange(n, unit, threads, [&](uint64_t begin, uint64_t end) {
    const uint64_t bad = fn(begin, end);
    if (bad == end) return;
    uint64_t seen = first.load();
    while (bad < seen && !first.compare_exchange_weak(seen, bad)) {
    }
  });
  return first.load();
}

}  // namespace terse::sdk
