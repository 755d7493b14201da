// Link emulation (DESIGN.md section 6): a bandwidth and a latency per directed link, and optionally a per-rank NIC
// limit shared by all of that rank's links (egress, and optionally ingress), so that a laptop run at "1Gbps" takes the
// time a 1 Gbps network would.
//
// Timing model. Every frame (header included) crosses a chain of serialized resources: the sender's NIC egress port,
// the link's wire, the receiver's NIC ingress port. Each resource is a token bucket one slice deep, run as GCRA
// virtual scheduling: it keeps `busy_until`, the time its last reserved slice leaves it; a slice of b bytes starts at
// the latest `busy_until` of the resources it crosses, and no earlier than its frame was queued, and occupies each for
// b / rate. Starts are virtual times: when the pacer wakes late, the next slices keep their virtual starts (possibly in
// the past) and catch up, so timer overshoot never accumulates into a lower emulated rate. Frames are cut into slices
// (EmulationConfig::slice_bytes) so that two links sharing a NIC interleave their frames instead of one frame holding
// the NIC for its whole length. A frame has been sent when its last slice leaves the slowest resource; it is
// delivered `latency` later. The transport makes this time real: the sender's request completes no earlier than the
// send time and the receiver's no earlier than the delivery time (both sleep until then).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace terse::comm {

struct LinkSpec {
  double bandwidth_bps = 0;  // bits per second; 0 = unlimited
  double latency_s = 0;      // one-way, seconds
  bool emulated() const noexcept { return bandwidth_bps > 0 || latency_s > 0; }
};

struct LinkOverride {
  int from = 0;
  int to = 0;
  LinkSpec spec;
};

struct EmulationConfig {
  LinkSpec link;                        // every directed link, unless overridden
  std::vector<LinkOverride> overrides;  // per directed link (from -> to); the last matching entry wins
  double nic_egress_bps = 0;            // per rank, shared by all of its outgoing links; 0 = unlimited
  double nic_ingress_bps = 0;           // per rank, shared by all of its incoming links; 0 = unlimited
  uint64_t slice_bytes = 64 * 1024;     // pacing granularity (fair NIC sharing between links)

  bool enabled() const noexcept;
  LinkSpec linkSpec(int from, int to) const noexcept;
  // Throws InvalidArgument for negative or non-finite values, a zero slice, or an override naming a rank outside
  // [0, world_size).
  void validate(int world_size) const;
  // "link 10Gbps 5us, nic egress 25Gbps" or "off".
  std::string describe() const;
};

// "1Gbps", "10Gbps", "100Mbps", "2.5Gbps", "800kbps", "1e9bps", "10Gbit/s", "1000000" (bits/s) -> bits per second;
// "25GBps" and "25GB/s" are bytes per second (x 8). Prefixes are decimal (k = 1e3) in any case; the b of "bps" is
// case-sensitive, lower for bits and upper for bytes, and what follows it lower case ("10GBPS" is refused: bits or
// bytes?). "0", "off" and "unlimited" mean 0. Throws InvalidArgument
// quoting the text otherwise, and for a rate too large for a double ("1e300Tbps").
double parseBandwidth(std::string_view text);
// The longest duration parseDuration accepts unless given a shorter limit: about 31 years, inside what a clock's int64
// nanoseconds hold (292 years), so that converting a parsed duration to a std::chrono duration cannot overflow.
inline constexpr double kMaxDurationSeconds = 1e9;
// "50us", "5ms", "1.5s", "200ns", "0" -> seconds. Throws InvalidArgument quoting the text otherwise, and naming the
// limit for a duration longer than max_s.
double parseDuration(std::string_view text, double max_s = kMaxDurationSeconds);
std::string formatBandwidth(double bps);  // "10Gbps", "2.5Gbps", "unlimited"
std::string formatDuration(double secs);  // "50us", "5ms", "0"

// Parses "bandwidth=10Gbps,latency=5us,nic=25Gbps,nic_ingress=25Gbps,slice=64K" (any subset, any order).
EmulationConfig parseEmulation(std::string_view text);

// "4K" (KiB), "1M", "256M", "1G", "4096" -> bytes (binary multiples, as nccl-tests reads sizes). Throws
// InvalidArgument.
uint64_t parseByteSize(std::string_view text);

// One serialized resource of the timing model above: the time its last reserved slice leaves it.
class PacedResource {
 public:
  using Clock = std::chrono::steady_clock;
  PacedResource() = default;
  explicit PacedResource(double bandwidth_bps) : ns_per_byte_(bandwidth_bps > 0 ? 8e9 / bandwidth_bps : 0.0) {}

  bool limited() const noexcept { return ns_per_byte_ > 0; }
  Clock::time_point busyUntil() const noexcept { return busy_until_; }
  // Occupies the resource with `bytes` from `start` on; returns when they have left it.
  Clock::time_point occupy(Clock::time_point start, uint64_t bytes) noexcept {
    busy_until_ = start + duration(bytes);
    return busy_until_;
  }
  Clock::duration duration(uint64_t bytes) const noexcept {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::nano>(static_cast<double>(bytes) * ns_per_byte_));
  }

 private:
  double ns_per_byte_ = 0;
  Clock::time_point busy_until_{};
};

// Sleeps until `t` with microsecond precision: a kernel sleep with a minimal timer slack for most of the wait, then a
// spin for the last 50 us (a default sleep overshoots by ~50 us, which would swamp emulated latencies of a few
// microseconds).
void sleepUntilPrecise(std::chrono::steady_clock::time_point t);

}  // namespace terse::comm
