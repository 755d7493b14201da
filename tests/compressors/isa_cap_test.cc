// TERSE_CPU_ISA steers every host dispatch site (terse/sdk/cpu.hpp): under each cap the pickers return the loops of
// that level (never one the CPU lacks), and a bad value fails compressor init with a message naming it. CMake runs
// these cases, and the bit-for-bit payload tests, once more under TERSE_CPU_ISA=avx512, avx2, scalar and a bad value
// (tests/compressors/CMakeLists.txt); in the plain run (no variable) they check the native picks.
//
// The expectations come from the variable's text and GCC's __builtin_cpu_supports, not from sdk::cpu, so a wrong cap
// table or a wrong cpuid reading in the SDK fails here.

#include <cpuid.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "compressors/bf16/bf16_avx2.h"
#include "compressors/fp16/fp16_f16c.h"
#include "compressors/onebit/onebit_host.h"
#include "compressors/qsgd/qsgd_host.h"
#include "compressors/terngrad/terngrad_host.h"
#include "plugin_harness.h"
#include "terse/sdk/cpu.hpp"
#include "terse/sdk/philox.hpp"

namespace terse {
namespace {

namespace cpu = sdk::cpu;

// The level TERSE_CPU_ISA asks for: 3 all (native, avx512ifma), 2 AVX-512 without IFMA, 1 AVX2, 0 scalar, -1 a value
// the SDK must refuse.
int isaCapRequested() {
  const char* env = std::getenv("TERSE_CPU_ISA");
  const std::string v = env == nullptr ? "" : env;
  if (v.empty() || v == "native" || v == "avx512ifma") return 3;
  if (v == "avx512") return 2;
  if (v == "avx2") return 1;
  if (v == "scalar") return 0;
  return -1;
}

bool isaCapHostF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

#if TERSE_QSGD_X86 && TERSE_TERNGRAD_X86 && TERSE_ONEBIT_X86 && TERSE_FP16_F16C && TERSE_BF16_AVX2 && TERSE_PHILOX_AVX2
TEST(IsaCap, HandWrittenLoopsFollowTheCap) {
  const int cap = isaCapRequested();
  if (cap < 0) GTEST_SKIP() << "TERSE_CPU_ISA is not a cap: IsaCap.BadValueFailsAtCompressorInit covers this run";
  const bool avx512 = cap >= 2 && __builtin_cpu_supports("avx512f");
  const bool avx2 = cap >= 1 && __builtin_cpu_supports("avx2");
  SCOPED_TRACE("TERSE_CPU_ISA level " + std::to_string(cap));

  namespace q = compressors::qsgd::host;
  // Every draw width (rounding_bits) has its own loops; the cap picks among them alike.
  const auto quantizeAt = [&]<unsigned B>() {
    const q::QuantizeGroups want = avx512 ? q::quantizeGroupsAvx512<4, B>
                                   : avx2 ? q::quantizeGroupsAvx2<4, B>
                                          : q::quantizeGroupsScalar<4, B>;
    EXPECT_EQ(q::pickQuantizeGroups<4>(B), want) << "draw width " << B;
  };
  quantizeAt.operator()<8>();
  quantizeAt.operator()<16>();
  quantizeAt.operator()<24>();
  EXPECT_EQ(q::pickSumSquaresBuckets(), avx512                                  ? q::sumSquaresBucketsAvx512
                                        : avx2 && __builtin_cpu_supports("fma") ? q::sumSquaresBucketsAvx2
                                                                                : q::sumSquaresBucketsScalar);
  namespace t = compressors::terngrad::host;
  EXPECT_EQ(t::pickBucketMaxAbs(), avx512 ? t::bucketMaxAbsAvx512 : avx2 ? t::bucketMaxAbsAvx2 : t::bucketMaxAbsScalar);
  const auto ternarizeAt = [&]<unsigned B>() {
    const t::TernarizeGroups want = avx512 && __builtin_cpu_supports("bmi2") ? t::ternarizeGroupsAvx512<B>
                                    : avx2                                   ? t::ternarizeGroupsAvx2<B>
                                                                             : t::ternarizeGroupsScalar<B>;
    EXPECT_EQ(t::pickTernarizeGroups(B), want) << "draw width " << B;
  };
  ternarizeAt.operator()<8>();
  ternarizeAt.operator()<16>();
  ternarizeAt.operator()<24>();
  namespace o = compressors::onebit::host;
  const bool popcnt = __builtin_cpu_supports("popcnt");
  EXPECT_EQ(o::pickSumsAndSigns<true>(), avx512 && popcnt ? o::sumsAndSignsAvx512<true>
                                         : avx2 && popcnt ? o::sumsAndSignsAvx2<true>
                                                          : nullptr);
  EXPECT_EQ(o::pickSumsAndSigns<false>(), avx512 && popcnt ? o::sumsAndSignsAvx512<false>
                                          : avx2 && popcnt ? o::sumsAndSignsAvx2<false>
                                                           : nullptr);
  EXPECT_EQ(compressors::fp16::hasF16c(), cap >= 1 && isaCapHostF16c());
  EXPECT_EQ(compressors::bf16::hasAvx2(), avx2);
  EXPECT_EQ(sdk::detail::haveAvx2(), avx2);
  EXPECT_EQ(sdk::detail::haveAvx512(), avx512);
  EXPECT_EQ(sdk::detail::haveAvx512Ifma(), cap >= 3 && avx512 && __builtin_cpu_supports("avx512ifma"));
  // What the cap takes away is gone from every query, whatever the CPU has.
  if (cap < 3) {
    EXPECT_FALSE(cpu::has(cpu::Feature::kAvx512ifma));
  }
  if (cap < 2) {
    for (auto f :
         {cpu::Feature::kAvx512f, cpu::Feature::kAvx512bw, cpu::Feature::kAvx512vl, cpu::Feature::kX86_64_v4}) {
      EXPECT_FALSE(cpu::has(f)) << static_cast<unsigned>(f);
    }
  }
  if (cap < 1) {
    for (unsigned f = 0; f < static_cast<unsigned>(cpu::Feature::kCount); ++f) {
      EXPECT_FALSE(cpu::has(static_cast<cpu::Feature>(f))) << f;
    }
  }
}
#endif

int isaCapSquare(int x) {
  return x * x;
}

#if TERSE_CPU_CLONE_LEVELS
TEST(IsaCap, ClonesFollowTheCap) {
  const int cap = isaCapRequested();
  if (cap < 0) GTEST_SKIP() << "TERSE_CPU_ISA is not a cap: IsaCap.BadValueFailsAtCompressorInit covers this run";
  const int level = cap >= 2 && __builtin_cpu_supports("x86-64-v4")   ? 4
                    : cap >= 1 && __builtin_cpu_supports("x86-64-v3") ? 3
                                                                      : 0;
  EXPECT_EQ(cpu::cloneLevel(), level);
  using Clone = int (*)(int);
  const Clone picked = cpu::pickClone<isaCapSquare, int>();
  const Clone want = level == 4   ? &cpu::detail::cloneV4<isaCapSquare, int>
                     : level == 3 ? &cpu::detail::cloneV3<isaCapSquare, int>
                                  : &cpu::detail::cloneBase<isaCapSquare, int>;
  EXPECT_EQ(picked, want);
  EXPECT_EQ(cpu::clones<isaCapSquare>(7), 49);
}
#endif

// A value the SDK does not know fails the plugin's init, with the variable, the value and the accepted values in the
// message the plugin logs; an accepted value lets init succeed.
TEST(IsaCap, BadValueFailsAtCompressorInit) {
  const char* env = std::getenv("TERSE_CPU_ISA");
  testing::Plugin fp16("fp16");
  testing::Instance c(fp16);
  if (isaCapRequested() >= 0) {
    EXPECT_TRUE(c.ok()) << c.lastError();
    EXPECT_NO_THROW(cpu::check());
    return;
  }
  EXPECT_EQ(c.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  const std::string want = std::string("TERSE_CPU_ISA='") + env +
                           "' is not a CPU ISA cap; accepted: native, avx512ifma, avx512, avx2, scalar";
  EXPECT_NE(c.lastError().find(want), std::string::npos) << c.lastError();
  EXPECT_THROW(cpu::has(cpu::Feature::kAvx2), sdk::InvalidArgument);
}

}  // namespace
}  // namespace terse
