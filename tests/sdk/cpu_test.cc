// terse/sdk/cpu.hpp: TERSE_CPU_ISA's parsing, the cap table, and the cpuid reading against GCC's own. The process-wide
// value (read once) is checked under each cap by tests/compressors/isa_cap_test.cc, run with the variable set.

#include "terse/sdk/cpu.hpp"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace terse::sdk {
namespace {

using cpu::Feature;
using cpu::Isa;

cpu::Mask cpuTestAll() {
  cpu::Mask m = 0;
  for (unsigned f = 0; f < static_cast<unsigned>(Feature::kCount); ++f) m |= cpu::bit(static_cast<Feature>(f));
  return m;
}

TEST(CpuIsa, ParsesEveryAcceptedName) {
  EXPECT_EQ(cpu::detail::parseIsa(nullptr), Isa::kNative);
  EXPECT_EQ(cpu::detail::parseIsa(""), Isa::kNative);
  EXPECT_EQ(cpu::detail::parseIsa("native"), Isa::kNative);
  EXPECT_EQ(cpu::detail::parseIsa("avx512ifma"), Isa::kAvx512ifma);
  EXPECT_EQ(cpu::detail::parseIsa("avx512"), Isa::kAvx512);
  EXPECT_EQ(cpu::detail::parseIsa("avx2"), Isa::kAvx2);
  EXPECT_EQ(cpu::detail::parseIsa("scalar"), Isa::kScalar);
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512ifma, Isa::kNative})
    EXPECT_EQ(cpu::detail::parseIsa(cpu::isaName(i)), i);
}

TEST(CpuIsa, UnknownValueNamesTheVariableTheValueAndTheAcceptedOnes) {
  for (const char* bad : {"AVX2", "avx-512", "sse2", " avx2", "avx2 ", "none", "x86-64-v3"}) {
    try {
      cpu::detail::parseIsa(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("TERSE_CPU_ISA='") + bad +
                    "' is not a CPU ISA cap; accepted: native, avx512ifma, avx512, avx2, scalar");
      EXPECT_EQ(e.status(), TERSE_ERR_INVALID_ARGUMENT);
    }
  }
}

TEST(CpuIsa, CapsKeepTheirLevelAndDropTheRest) {
  const cpu::Mask all = cpuTestAll();
  const cpu::Mask v3 = cpu::bit(Feature::kPopcnt) | cpu::bit(Feature::kAvx) | cpu::bit(Feature::kAvx2) |
                       cpu::bit(Feature::kFma) | cpu::bit(Feature::kF16c) | cpu::bit(Feature::kBmi2) |
                       cpu::bit(Feature::kX86_64_v3);
  const cpu::Mask v4 = v3 | cpu::bit(Feature::kAvx512f) | cpu::bit(Feature::kAvx512bw) | cpu::bit(Feature::kAvx512vl) |
                       cpu::bit(Feature::kX86_64_v4);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kNative), all);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kAvx512ifma), all);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kAvx512), v4);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kAvx2), v3);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kScalar), 0u);
  EXPECT_EQ(cpu::detail::reported(all, Isa::kAvx512) & cpu::bit(Feature::kAvx512ifma), 0u);
}

// A cap never adds a feature: an AVX2-only CPU under avx512 reports AVX2, a CPU without AVX2 under avx2 reports none.
TEST(CpuIsa, NeverReportsWhatTheCpuLacks) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const cpu::Mask native = static_cast<cpu::Mask>(rng()) & cpuTestAll();
    for (Isa cap : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512ifma, Isa::kNative}) {
      const cpu::Mask r = cpu::detail::reported(native, cap);
      EXPECT_EQ(r & ~native, 0u) << cpu::isaName(cap) << " on " << native;
    }
  }
  const cpu::Mask avx2_only = cpu::bit(Feature::kAvx) | cpu::bit(Feature::kAvx2) | cpu::bit(Feature::kFma);
  EXPECT_EQ(cpu::detail::reported(avx2_only, Isa::kAvx512), avx2_only);
  EXPECT_EQ(cpu::detail::reported(cpu::bit(Feature::kPopcnt), Isa::kAvx2), cpu::bit(Feature::kPopcnt));
}

#if TERSE_CPU_X86 && !defined(__clang__)
// The SDK reads cpuid itself (clang 14 has no name for F16C or the levels); it must agree with GCC's reading.
TEST(CpuIsa, CpuidReadingAgreesWithTheCompiler) {
  const cpu::Mask m = cpu::detail::detectNative();
  const auto got = [&](Feature f) { return (m & cpu::bit(f)) != 0; };
  EXPECT_EQ(got(Feature::kPopcnt), __builtin_cpu_supports("popcnt") != 0);
  EXPECT_EQ(got(Feature::kAvx), __builtin_cpu_supports("avx") != 0);
  EXPECT_EQ(got(Feature::kAvx2), __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(got(Feature::kFma), __builtin_cpu_supports("fma") != 0);
  EXPECT_EQ(got(Feature::kBmi2), __builtin_cpu_supports("bmi2") != 0);
  EXPECT_EQ(got(Feature::kAvx512f), __builtin_cpu_supports("avx512f") != 0);
  EXPECT_EQ(got(Feature::kAvx512bw), __builtin_cpu_supports("avx512bw") != 0);
  EXPECT_EQ(got(Feature::kAvx512vl), __builtin_cpu_supports("avx512vl") != 0);
  EXPECT_EQ(got(Feature::kAvx512ifma), __builtin_cpu_supports("avx512ifma") != 0);
#if __GNUC__ >= 12
  EXPECT_EQ(got(Feature::kX86_64_v3), __builtin_cpu_supports("x86-64-v3") != 0);
  EXPECT_EQ(got(Feature::kX86_64_v4), __builtin_cpu_supports("x86-64-v4") != 0);
#endif
  for (unsigned f = 0; f < static_cast<unsigned>(Feature::kCount); ++f)
    EXPECT_EQ(cpu::hostHas(static_cast<Feature>(f)), (m & cpu::bit(static_cast<Feature>(f))) != 0) << f;
}
#endif

}  // namespace
}  // namespace terse::sdk
