#include "core/comm/link_emulation.h"

#include <sys/prctl.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include "core/common/cpu_relax.h"
#include "core/common/error.h"

namespace terse::comm {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "12.5Gbps" into 12.5 and "Gbps" (as written; lower-cased when `fold_case`); false when there is no leading
// number.
bool splitNumber(std::string_view text, double& value, std::string& unit, bool fold_case = true) {
  const std::string s(trim(text));
  if (s.empty()) return false;
  char* end = nullptr;
  value = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return false;
  unit = std::string(trim(std::string_view(end)));
  if (fold_case) unit = lower(unit);
  return std::isfinite(value);
}

// A rate unit's bits per second: a decimal prefix (k, M, G, T, any case) and "bps" or "bit/s" for bits, "Bps" or
// "B/s" for bytes (x 8), the rest in lower case ("GBPS" is refused as ambiguous). The b's case is the one that
// matters: "10GBps" is 80 Gbit/s, as a NIC's data sheet means it, where folding case took it for 10 Gbit/s. -1 when the
// unit is none of these.
double rateUnitScale(std::string_view unit) {
  double prefix = 1;
  if (!unit.empty()) {
    switch (std::tolower(static_cast<unsigned char>(unit.front()))) {
      case 'k':
        prefix = 1e3;
        break;
      case 'm':
        prefix = 1e6;
        break;
      case 'g':
        prefix = 1e9;
        break;
      case 't':
        prefix = 1e12;
        break;
      default:
        prefix = 0;
    }
    if (prefix > 0)
      unit.remove_prefix(1);
    else
      prefix = 1;
  }
  if (unit.empty()) return -1;  // a bare prefix: "10G" says neither bits nor bytes
  // The rest as written: "GBPS" or "MBIT/S" could be either, and a rate off by 8 would run without a word.
  const std::string_view rest = unit.substr(1);
  if (rest != "ps" && rest != "/s" && !(unit.front() == 'b' && rest == "it/s")) return -1;
  if (unit.front() == 'b') return prefix;
  if (unit.front() == 'B') return prefix * 8;
  return -1;
}

std::string formatNumber(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

bool EmulationConfig::enabled() const noexcept {
  if (link.emulated() || nic_egress_bps > 0 || nic_ingress_bps > 0) return true;
  for (const auto& o : overrides)
    if (o.spec.emulated()) return true;
  return false;
}

LinkSpec EmulationConfig::linkSpec(int from, int to) const noexcept {
  LinkSpec spec = link;
  for (const auto& o : overrides)
    if (o.from == from && o.to == to) spec = o.spec;
  return spec;
}

void EmulationConfig::validate(int world_size) const {
  auto check = [](double v, const char* what) {
    TERSE_CHECK(std::isfinite(v) && v >= 0, InvalidArgument,
                "link emulation: " << what << " must be finite and >= 0, got " << v);
  };
  check(link.bandwidth_bps, "bandwidth");
  check(link.latency_s, "latency");
  check(nic_egress_bps, "nic egress bandwidth");
  check(nic_ingress_bps, "nic ingress bandwidth");
  TERSE_CHECK(slice_bytes > 0, InvalidArgument, "link emulation: slice_bytes must be > 0");
  for (const auto& o : overrides) {
    TERSE_CHECK(o.from >= 0 && o.from < world_size && o.to >= 0 && o.to < world_size, InvalidArgument,
                "link emulation: override for link " << o.from << " -> " << o.to << " names a rank outside [0, "
                                                     << world_size << ")");
    check(o.spec.bandwidth_bps, "override bandwidth");
    check(o.spec.latency_s, "override latency");
  }
}

std::string EmulationConfig::describe() const {
  if (!enabled()) return "off";
  std::string out = "link " + formatBandwidth(link.bandwidth_bps) + " " + formatDuration(link.latency_s);
  if (nic_egress_bps > 0) out += ", nic egress " + formatBandwidth(nic_egress_bps);
  if (nic_ingress_bps > 0) out += ", nic ingress " + formatBandwidth(nic_ingress_bps);
  if (!overrides.empty()) out += ", " + std::to_string(overrides.size()) + " link override(s)";
  return out;
}

double parseBandwidth(std::string_view text) {
  const std::string t = lower(trim(text));
  if (t == "off" || t == "unlimited" || t == "inf") return 0;
  double v = 0;
  std::string unit;
  const bool ok = splitNumber(text, v, unit, /*fold_case=*/false);
  const double scale = !ok ? -1 : unit.empty() ? 1 : rateUnitScale(unit);
  TERSE_CHECK(ok && scale > 0 && v >= 0, InvalidArgument,
              "bandwidth '" << text
                            << "' is not valid: expected a number with bps, Kbps, Mbps, Gbps or Tbps for bits per "
                               "second (e.g. 10Gbps), Bps ... TBps or B/s ... TB/s for bytes (e.g. 25GB/s), or "
                               "'unlimited'");
  // The number is finite, its product with the unit need not be; an infinite rate would reach the pacers as 0 s per
  // byte and 1 / rate as 0.
  TERSE_CHECK(std::isfinite(v * scale), InvalidArgument, "bandwidth '" << text << "' is too large");
  return v * scale;
}

double parseDuration(std::string_view text, double max_s) {
  double v = 0;
  std::string unit;
  const bool ok = splitNumber(text, v, unit);
  double scale = -1;
  if (ok) {
    if (unit == "ns") scale = 1e-9;
    if (unit == "us" || unit == "\xc2\xb5s") scale = 1e-6;
    if (unit == "ms") scale = 1e-3;
    if (unit == "s") scale = 1;
    if (unit.empty() && v == 0) scale = 1;
  }
  TERSE_CHECK(ok && scale > 0 && v >= 0, InvalidArgument,
              "duration '" << text << "' is not valid: expected a number with ns, us, ms or s (e.g. 50us)");
  TERSE_CHECK(v * scale <= max_s, InvalidArgument,
              "duration '" << text << "' is " << v * scale << " s, longer than the limit of " << max_s << " s");
  return v * scale;
}

std::string formatBandwidth(double bps) {
  if (bps <= 0) return "unlimited";
  if (bps >= 1e12) return formatNumber(bps / 1e12) + "Tbps";
  if (bps >= 1e9) return formatNumber(bps / 1e9) + "Gbps";
  if (bps >= 1e6) return formatNumber(bps / 1e6) + "Mbps";
  if (bps >= 1e3) return formatNumber(bps / 1e3) + "Kbps";
  return formatNumber(bps) + "bps";
}

std::string formatDuration(double secs) {
  if (secs <= 0) return "0";
  if (secs >= 1) return formatNumber(secs) + "s";
  if (secs >= 1e-3) return formatNumber(secs * 1e3) + "ms";
  if (secs >= 1e-6) return formatNumber(secs * 1e6) + "us";
  return formatNumber(secs * 1e9) + "ns";
}

EmulationConfig parseEmulation(std::string_view text) {
  EmulationConfig c;
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    TERSE_CHECK(eq != std::string_view::npos, InvalidArgument,
                "link emulation '" << text << "': expected key=value, got '" << item << "'");
    const std::string key = lower(trim(item.substr(0, eq)));
    const std::string_view value = trim(item.substr(eq + 1));
    if (key == "bandwidth") {
      c.link.bandwidth_bps = parseBandwidth(value);
    } else if (key == "latency") {
      c.link.latency_s = parseDuration(value);
    } else if (key == "nic" || key == "nic_egress") {
      c.nic_egress_bps = parseBandwidth(value);
    } else if (key == "nic_ingress") {
      c.nic_ingress_bps = parseBandwidth(value);
    } else if (key == "slice") {
      c.slice_bytes = parseByteSize(value);
    } else {
      TERSE_THROW(InvalidArgument, "link emulation '" << text << "': unknown key '" << key
                                                      << "' (bandwidth, latency, nic, nic_ingress, slice)");
    }
  }
  return c;
}

uint64_t parseByteSize(std::string_view text) {
  double v = 0;
  std::string unit;
  const bool ok = splitNumber(text, v, unit);
  double scale = -1;
  if (ok) {
    if (unit.empty() || unit == "b") scale = 1;
    if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
    if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
    if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  }
  TERSE_CHECK(ok && scale > 0 && v >= 0 && v * scale < 1.8e19 && std::floor(v * scale) == v * scale, InvalidArgument,
              "size '" << text
                       << "' is not valid: expected a whole number of bytes, optionally with K, M or G "
                          "(binary multiples, e.g. 4K, 256M)");
  return static_cast<uint64_t>(v * scale);
}

void sleepUntilPrecise(std::chrono::steady_clock::time_point t) {
  using namespace std::chrono;
  // The last stretch is spun, not yielded: sched_yield on a core shared with a busy process hands it a whole time
  // slice (milliseconds), far more than the microseconds being measured.
  constexpr auto kSpin = microseconds(50);
  auto now = steady_clock::now();
  if (t - now > kSpin) {
    // A sleep overshoots by the thread's timer slack (50 us by default); shrink it for this sleep only, since the
    // thread belongs to the caller.
    const int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old_slack >= 0) prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::this_thread::sleep_until(t - kSpin);
    if (old_slack >= 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(old_slack), 0UL, 0UL, 0UL);
    now = steady_clock::now();
  }
  while (now < t) {
    cpuRelax();
    now = steady_clock::now();
  }
}

}  // namespace terse::comm
