// The workloads' GEMM (experiments/workloads/gemm.h): the fixed-order kernel is its definition bit for bit (the scalar
// loop below, compiled like the kernel with -ffp-contract=off) for every transpose, odd and empty sizes and alpha /
// beta, within float rounding of a double-precision product, and the same bits from each x86-64 level's build; the
// OpenBLAS option is within rounding too; TERSE_GEMM's values and errors. ctest runs these again under each
// TERSE_CPU_ISA cap (isa_<cap>.workloads_gemm), where gemm() runs the capped clone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "experiments/workloads/gemm.h"
#include "experiments/workloads/nn_ops.h"
#include "terse/sdk/cpu.hpp"

namespace terse::workloads {
namespace {

namespace cpu = sdk::cpu;

constexpr int64_t kGemmSizes[] = {0, 1, 3, 17, 64, 129};

struct GemmScale {
  float alpha, beta;
};
// beta 0 must not read C (it starts as NaN there); alpha 1 / beta 1 is the models' bias-then-accumulate call.
constexpr GemmScale kGemmScales[] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.75f, 1.5f}};

// Values with full 24-bit mantissas and both signs, from a fixed generator: every case's sums round.
std::vector<float> gemmValues(std::size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 22);
  }
  return v;
}

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  GemmScale s;
  std::vector<float> a, b, c0;  // a: op(A) stored transposed when ta; b likewise
};

GemmCase makeGemmCase(bool ta, bool tb, int64_t m, int64_t n, int64_t k, GemmScale s) {
  GemmCase c{ta, tb, m, n, k, s, {}, {}, {}};
  const auto seed = static_cast<uint64_t>((m * 131 + n) * 131 + k) * 4 + (ta ? 2 : 0) + (tb ? 1 : 0);
  c.a = gemmValues(static_cast<std::size_t>(m * k), seed);
  c.b = gemmValues(static_cast<std::size_t>(k * n), seed + 7);
  c.c0 = s.beta == 0.0f ? std::vector<float>(static_cast<std::size_t>(m * n), std::numeric_limits<float>::quiet_NaN())
                        : gemmValues(static_cast<std::size_t>(m * n), seed + 13);
  return c;
}

float gemmOpA(const GemmCase& c, int64_t i, int64_t p) {
  return c.ta ? c.a[static_cast<std::size_t>(p * c.m + i)] : c.a[static_cast<std::size_t>(i * c.k + p)];
}
float gemmOpB(const GemmCase& c, int64_t p, int64_t j) {
  return c.tb ? c.b[static_cast<std::size_t>(j * c.k + p)] : c.b[static_cast<std::size_t>(p * c.n + j)];
}

// gemm.h's definition, literally.
std::vector<float> gemmDefinition(const GemmCase& c) {
  std::vector<float> out = c.c0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      float s = 0.0f;
      for (int64_t p = 0; p < c.k; ++p) {
        const float prod = gemmOpA(c, i, p) * gemmOpB(c, p, j);
        s = s + prod;
      }
      float& dst = out[static_cast<std::size_t>(i * c.n + j)];
      const float scaled = c.s.alpha * s;
      if (c.s.beta == 0.0f) {
        dst = scaled;
      } else {
        const float old = c.s.beta * dst;
        dst = scaled + old;
      }
    }
  return out;
}

std::vector<float> runFixed(const GemmCase& c) {
  std::vector<float> out = c.c0;
  gemmFixed(c.ta, c.tb, c.m, c.n, c.k, c.s.alpha, c.a.data(), c.b.data(), c.s.beta, out.data());
  return out;
}

std::vector<float> runAtLevel(int level, const GemmCase& c) {
  std::vector<float> out = c.c0;
  gemmFixedAtLevel(level, c.ta, c.tb, c.m, c.n, c.k, c.s.alpha, c.a.data(), c.b.data(), c.s.beta, out.data());
  return out;
}

std::string describeGemm(const GemmCase& c) {
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " m " + std::to_string(c.m) + " n " +
         std::to_string(c.n) + " k " + std::to_string(c.k) + " alpha " + std::to_string(c.s.alpha) + " beta " +
         std::to_string(c.s.beta);
}

// The first element whose bits differ, or -1.
int64_t firstBitDifference(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    uint32_t bx = 0, by = 0;
    std::memcpy(&bx, &x[i], 4);
    std::memcpy(&by, &y[i], 4);
    if (bx != by) return static_cast<int64_t>(i);
  }
  return -1;
}

// Every transpose, size triple and scale: calls fn(case).
template <class Fn>
void forEachGemmCase(Fn fn) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : kGemmSizes)
        for (int64_t n : kGemmSizes)
          for (int64_t k : kGemmSizes)
            for (const GemmScale& s : kGemmScales) fn(makeGemmCase(ta, tb, m, n, k, s));
}

TEST(Gemm, FixedIsTheDefinitionBitForBit) {
  int failures = 0;
  forEachGemmCase([&](const GemmCase& c) {
    const std::vector<float> want = gemmDefinition(c), got = runFixed(c);
    const int64_t at = firstBitDifference(want, got);
    if (at >= 0 && ++failures <= 10)
      ADD_FAILURE() << describeGemm(c) << ": element " << at << " is " << got[static_cast<std::size_t>(at)]
                    << ", the definition gives " << want[static_cast<std::size_t>(at)];
  });
  EXPECT_EQ(failures, 0);
}

// Float rounding of a double-precision product: |error| <= (k + 2) u (|alpha| sum |a||b| + |beta c|) (Higham's bound
// for a sum of k products, plus the two scalings and the final sum).
void expectWithinRounding(const char* kernel, const GemmCase& c, const std::vector<float>& got, int* failures) {
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double prod = static_cast<double>(gemmOpA(c, i, p)) * gemmOpB(c, p, j);
        exact += prod;
        magnitude += std::fabs(prod);
      }
      const double old = c.s.beta == 0.0f ? 0.0 : static_cast<double>(c.c0[static_cast<std::size_t>(i * c.n + j)]);
      const double want = c.s.alpha * exact + c.s.beta * old;
      const double bound =
          static_cast<double>(c.k + 2) * u * (std::fabs(c.s.alpha) * magnitude + std::fabs(c.s.beta * old)) +
          std::numeric_limits<float>::denorm_min();
      const float g = got[static_cast<std::size_t>(i * c.n + j)];
      if (!(std::fabs(g - want) <= bound) && ++*failures <= 10)
        ADD_FAILURE() << kernel << " " << describeGemm(c) << ": C[" << i << "][" << j << "] = " << g << ", exact "
                      << want << ", allowed error " << bound;
    }
}

TEST(Gemm, FixedAndOpenBlasAreWithinRoundingOfDoubles) {
  int failures = 0;
  forEachGemmCase([&](const GemmCase& c) {
    expectWithinRounding("fixed", c, runFixed(c), &failures);
    std::vector<float> ob = c.c0;
    gemmOpenBlas(c.ta, c.tb, c.m, c.n, c.k, c.s.alpha, c.a.data(), c.b.data(), c.s.beta, ob.data());
    expectWithinRounding("openblas", c, ob, &failures);
  });
  EXPECT_EQ(failures, 0);
}

// The x86-64-v4, v3 and baseline builds the host can run, each called directly, give the bits that gemm() gives under
// whatever TERSE_CPU_ISA this process has (ctest runs this under each cap).
TEST(Gemm, EveryLevelGivesTheSameBits) {
  std::vector<int> levels = {0};
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v3)) levels.push_back(3);
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v4)) levels.push_back(4);
  std::cout << "levels run:";
  for (int l : levels) std::cout << ' ' << l;
  std::cout << "; gemm() runs level " << cpu::cloneLevel() << " (TERSE_CPU_ISA "
            << (std::getenv(cpu::kIsaVariable) ? std::getenv(cpu::kIsaVariable) : "unset") << ")\n";
  int failures = 0;
  forEachGemmCase([&](const GemmCase& c) {
    std::vector<float> viaGemm = c.c0;
    gemm(c.ta, c.tb, c.m, c.n, c.k, c.s.alpha, c.a.data(), c.b.data(), c.s.beta, viaGemm.data());
    for (int level : levels) {
      const std::vector<float> got = runAtLevel(level, c);
      const int64_t at = firstBitDifference(viaGemm, got);
      if (at >= 0 && ++failures <= 10)
        ADD_FAILURE() << describeGemm(c) << ": level " << level << " differs from gemm() at element " << at << ": "
                      << got[static_cast<std::size_t>(at)] << " vs " << viaGemm[static_cast<std::size_t>(at)];
    }
  });
  EXPECT_EQ(failures, 0);
}

// The models' shapes (the quickstart's MLP, batch 32 and 64) and sizes past the kernel's blocks of rows (k large
// enough that a block holds one tile's rows, m past it), at every level, against the definition.
TEST(Gemm, ModelShapesAndBlocksAtEveryLevel) {
  struct GemmShape {
    bool ta, tb;
    int64_t m, n, k;
  };
  const GemmShape shapes[] = {{false, true, 32, 256, 784}, {true, false, 256, 784, 32}, {false, false, 32, 784, 256},
                              {false, true, 64, 10, 128},  {true, false, 10, 128, 64},  {false, false, 64, 128, 10},
                              {false, true, 40, 33, 9000}, {true, true, 37, 45, 9000},  {true, false, 300, 20, 500}};
  std::vector<int> levels = {0};
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v3)) levels.push_back(3);
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v4)) levels.push_back(4);
  for (const GemmShape& sh : shapes) {
    const GemmCase c = makeGemmCase(sh.ta, sh.tb, sh.m, sh.n, sh.k, {1.0f, 1.0f});
    const std::vector<float> want = gemmDefinition(c);
    for (int level : levels)
      EXPECT_EQ(firstBitDifference(want, runAtLevel(level, c)), -1) << describeGemm(c) << " level " << level;
  }
}

TEST(Gemm, KernelNamesAndErrors) {
  EXPECT_EQ(parseGemmKernel(nullptr), GemmKernel::kFixed);
  EXPECT_EQ(parseGemmKernel(""), GemmKernel::kFixed);
  EXPECT_EQ(parseGemmKernel("fixed"), GemmKernel::kFixed);
  EXPECT_EQ(parseGemmKernel("openblas"), GemmKernel::kOpenBlas);
  for (const char* bad : {"OpenBLAS", "fast", "blas"}) {
    try {
      parseGemmKernel(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("TERSE_GEMM='") + bad + "' is not a GEMM kernel"), std::string::npos) << m;
      EXPECT_NE(m.find("accepted: fixed, openblas"), std::string::npos) << m;
    }
  }
  // This process's kernel: ctest leaves TERSE_GEMM unset, so the fixed order, which provenance names.
  const char* env = std::getenv(kGemmVariable);
  if (env == nullptr || std::string(env).empty() || std::string(env) == "fixed") {
    EXPECT_EQ(gemmKernel(), GemmKernel::kFixed);
    EXPECT_EQ(gemmDescription(), "terse-fixed-order-v1");
  }
  EXPECT_THROW(gemmFixedAtLevel(2, false, false, 1, 1, 1, 1.0f, nullptr, nullptr, 0.0f, nullptr), InvalidArgument);
  float x = 1.0f;
  EXPECT_THROW(gemmFixed(false, false, -1, 1, 1, 1.0f, &x, &x, 0.0f, &x), InvalidArgument);
}

}  // namespace
}  // namespace terse::workloads
