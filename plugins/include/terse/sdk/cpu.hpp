// terse plugin SDK: which x86 vector instructions the host loops may use, decided once per process for every plugin
// and the core alike, so one environment variable steers all of them (DESIGN.md section 5, "Host vector paths"):
//
//   TERSE_CPU_ISA=native      what the CPU has (the default, also when the variable is unset or empty)
//   TERSE_CPU_ISA=avx512ifma  the same on x86 (AVX-512 with IFMA where the CPU has it); named so a script can say it
//   TERSE_CPU_ISA=avx512      AVX-512 (F, BW, VL, the x86-64-v4 set) without IFMA, plus everything below
//   TERSE_CPU_ISA=avx2        AVX2 and its companions FMA, F16C, BMI2, POPCNT (the x86-64-v3 set), no AVX-512
//   TERSE_CPU_ISA=scalar      baseline x86-64 (SSE2) only: no hand-written vector loop, no wider clone
//
// A cap only takes away: a feature the CPU lacks is never reported, whatever the variable says. The payloads do not
// depend on the cap (every vector loop is bit-for-bit its scalar loop), only the speed does; the cap lets one machine
// stand in for an AVX2-only one and lets the tests run each loop through the plugins.
//
//   cpu::has(Feature::kAvx2)        a hand-written loop's dispatch: true when the CPU has it and the cap allows it
//   cpu::clones<fn>(args...)        calls fn compiled for x86-64-v4, x86-64-v3 or baseline, the widest has() allows
//   cpu::check()                    throws InvalidArgument for a TERSE_CPU_ISA it does not know; the plugin export
//                                   macros call it at init, so a typo fails at plugin load with the accepted values
//
// Header-only and host-only: plugins built out of the tree see the same variable and the same features as the core.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "terse/sdk/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_CPU_X86 1
#include <cpuid.h>
#else
#define TERSE_CPU_X86 0
#endif

// cpu::clones compiles its function three times where TERSE_CPU_CLONES used GCC's target_clones before (GCC, x86-64
// Linux); elsewhere (clang, the fuzz build) the function runs once, as compiled.
#if TERSE_CPU_X86 && defined(__linux__) && !defined(__clang__)
#define TERSE_CPU_CLONE_LEVELS 1
#else
#define TERSE_CPU_CLONE_LEVELS 0
#endif

namespace terse::sdk::cpu {

// The features a dispatch site may ask for. kX86_64_v3 / kX86_64_v4 are the whole psABI levels (v3: AVX2, FMA, F16C,
// BMI1/2, LZCNT, MOVBE; v4: v3 plus AVX-512 F, BW, CD, DQ, VL), what a clone compiled with arch=x86-64-v3/v4 may use.
enum class Feature : unsigned {
  kPopcnt,
  kAvx,
  kAvx2,
  kFma,
  kF16c,
  kBmi2,
  kX86_64_v3,
  kAvx512f,
  kAvx512bw,
  kAvx512vl,
  kX86_64_v4,
  kAvx512ifma,
  kCount
};

// The caps TERSE_CPU_ISA accepts, narrowest first.
enum class Isa : unsigned { kScalar, kAvx2, kAvx512, kAvx512ifma, kNative };

inline constexpr const char* kIsaVariable = "TERSE_CPU_ISA";
inline constexpr const char* kIsaAccepted = "native, avx512ifma, avx512, avx2, scalar";

using Mask = uint32_t;
constexpr Mask bit(Feature f) {
  return Mask{1} << static_cast<unsigned>(f);
}

namespace detail {

// TERSE_CPU_ISA's value as a cap; an unknown value throws, naming the variable, the value and the accepted ones.
inline Isa parseIsa(const char* value) {
  if (value == nullptr) return Isa::kNative;
  const std::string_view v(value);
  if (v.empty() || v == "native") return Isa::kNative;
  if (v == "avx512ifma") return Isa::kAvx512ifma;
  if (v == "avx512") return Isa::kAvx512;
  if (v == "avx2") return Isa::kAvx2;
  if (v == "scalar") return Isa::kScalar;
  throw InvalidArgument(std::string(kIsaVariable) + "='" + std::string(v) +
                        "' is not a CPU ISA cap; accepted: " + kIsaAccepted);
}

// The features a cap leaves (before intersecting with the CPU's).
constexpr Mask allowedBy(Isa cap) {
  constexpr Mask v3 = bit(Feature::kPopcnt) | bit(Feature::kAvx) | bit(Feature::kAvx2) | bit(Feature::kFma) |
                      bit(Feature::kF16c) | bit(Feature::kBmi2) | bit(Feature::kX86_64_v3);
  constexpr Mask v4 =
      v3 | bit(Feature::kAvx512f) | bit(Feature::kAvx512bw) | bit(Feature::kAvx512vl) | bit(Feature::kX86_64_v4);
  switch (cap) {
    case Isa::kScalar:
      return 0;
    case Isa::kAvx2:
      return v3;
    case Isa::kAvx512:
      return v4;
    case Isa::kAvx512ifma:
    case Isa::kNative:
      break;
  }
  return ~Mask{0};
}

// The CPU's own features, from cpuid, with the OS's consent (XCR0) for the AVX and AVX-512 registers: what GCC's
// __builtin_cpu_supports reports, computed here so every compiler (clang 14 knows neither "f16c" nor the levels)
// sees the same set.
inline Mask detectNative() {
#if TERSE_CPU_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return 0;
  const unsigned c1 = c;
  unsigned b7 = 0, c7 = 0, d7 = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) == 0) b7 = 0;
  unsigned ext = 0;
  if (__get_cpuid(0x80000001U, &a, &b, &c, &d) != 0) ext = c;
  uint64_t xcr0 = 0;
  if ((c1 & bit_OSXSAVE) != 0) {
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t{hi} << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;           // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;  // opmask, upper ZMM0-15, ZMM16-31
  Mask m = 0;
  const auto set = [&](Feature f, bool on) { m |= on ? bit(f) : 0; };
  set(Feature::kPopcnt, (c1 & bit_POPCNT) != 0);
  set(Feature::kAvx, ymm && (c1 & bit_AVX) != 0);
  set(Feature::kAvx2, ymm && (b7 & bit_AVX2) != 0);
  set(Feature::kFma, ymm && (c1 & bit_FMA) != 0);
  set(Feature::kF16c, ymm && (c1 & bit_F16C) != 0);
  set(Feature::kBmi2, (b7 & bit_BMI2) != 0);
  set(Feature::kAvx512f, zmm && (b7 & bit_AVX512F) != 0);
  set(Feature::kAvx512bw, zmm && (b7 & bit_AVX512BW) != 0);
  set(Feature::kAvx512vl, zmm && (b7 & bit_AVX512VL) != 0);
  set(Feature::kAvx512ifma, zmm && (b7 & bit_AVX512IFMA) != 0);
  const bool v3 = (m & bit(Feature::kAvx2)) && (m & bit(Feature::kFma)) && (m & bit(Feature::kF16c)) &&
                  (m & bit(Feature::kBmi2)) && (m & bit(Feature::kPopcnt)) && (b7 & bit_BMI) != 0 &&
                  (ext & bit_LZCNT) != 0 && (c1 & bit_MOVBE) != 0;
  set(Feature::kX86_64_v3, v3);
  set(Feature::kX86_64_v4, v3 && (m & bit(Feature::kAvx512f)) && (m & bit(Feature::kAvx512bw)) &&
                               (m & bit(Feature::kAvx512vl)) && (b7 & bit_AVX512DQ) != 0 && (b7 & bit_AVX512CD) != 0);
  return m;
#else
  return 0;
#endif
}

// The features reported: the CPU's, less what the cap takes away. Separate from the process-wide value so tests can
// check any combination.
constexpr Mask reported(Mask native, Isa cap) {
  return native & allowedBy(cap);
}

// Evaluated once per process (per plugin library, each with the same inputs). A bad TERSE_CPU_ISA throws on every
// call (a throwing static initializer runs again next time), so no loop ever runs under a cap nobody asked for.
// noinline and cold: sdk::cpu::clones' wrappers are `flatten`, which would otherwise inline the cpuid reading, the
// parsing and the error message's string building into every clone of every hot loop that asks has() (ten times the
// compile time and the object size of qsgd's plugin).
__attribute__((noinline, cold)) inline Mask readFeatures() {
  return reported(detectNative(), parseIsa(std::getenv(kIsaVariable)));
}

inline Mask features() {
  static const Mask m = readFeatures();
  return m;
}

}  // namespace detail

// True when the CPU has `f` and TERSE_CPU_ISA allows it. Throws InvalidArgument for an unknown TERSE_CPU_ISA.
inline bool has(Feature f) {
  return (detail::features() & bit(f)) != 0;
}

// True when the CPU has `f`, whatever the cap: for tests that run every loop the host can.
inline bool hostHas(Feature f) {
  static const Mask m = detail::detectNative();
  return (m & bit(f)) != 0;
}

// Validates TERSE_CPU_ISA (InvalidArgument naming it, its value and the accepted values); the export macros call it
// in init so a typo fails when the plugin is set up, not in the middle of a step.
inline void check() {
  (void)detail::features();
}

// The SDK's name for each cap, for messages and tests.
inline const char* isaName(Isa cap) {
  switch (cap) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512ifma:
      return "avx512ifma";
    case Isa::kNative:
      break;
  }
  return "native";
}

// cpu::clones<fn>(args...): fn compiled for each psABI level and called at the widest one has() allows. The wrappers
// are `flatten`, so fn and the TERSE_HD helpers it calls are inlined into each and compiled for its instruction set
// (GCC vectorizes the plain loops with AVX-512, AVX2 or SSE2). It replaces GCC's target_clones, whose load-time
// resolver reads the CPU and so would ignore TERSE_CPU_ISA. The levels must round alike: terse builds with
// -ffp-contract=off (no a*b+c fused into FMA in one clone only). Any function a wrapper must not absorb (register
// pressure) is marked noinline, as philox.hpp's vector blocks are.
namespace detail {
#if TERSE_CPU_CLONE_LEVELS
template <auto Fn, class... Args>
__attribute__((target("arch=x86-64-v4"), flatten)) decltype(auto) cloneV4(Args... args) {
  return Fn(args...);
}
template <auto Fn, class... Args>
__attribute__((target("arch=x86-64-v3"), flatten)) decltype(auto) cloneV3(Args... args) {
  return Fn(args...);
}
#endif
template <auto Fn, class... Args>
__attribute__((flatten)) decltype(auto) cloneBase(Args... args) {
  return Fn(args...);
}
}  // namespace detail

// The clone has() picks for fn with these argument types (exposed so tests can check the pick under each cap).
template <auto Fn, class... Args>
auto pickClone() {
  using Ptr = decltype(&detail::cloneBase<Fn, Args...>);
#if TERSE_CPU_CLONE_LEVELS
  if (has(Feature::kX86_64_v4)) return static_cast<Ptr>(&detail::cloneV4<Fn, Args...>);
  if (has(Feature::kX86_64_v3)) return static_cast<Ptr>(&detail::cloneV3<Fn, Args...>);
#endif
  return static_cast<Ptr>(&detail::cloneBase<Fn, Args...>);
}

// The clone levels pickClone can return, widest first, for tests: 4, 3, 0 (x86-64-v4, v3, baseline).
inline int cloneLevel() {
#if TERSE_CPU_CLONE_LEVELS
  if (has(Feature::kX86_64_v4)) return 4;
  if (has(Feature::kX86_64_v3)) return 3;
#endif
  return 0;
}

template <auto Fn, class... Args>
decltype(auto) clones(Args... args) {
  static const auto f = pickClone<Fn, Args...>();
  return f(args...);
}

}  // namespace terse::sdk::cpu
