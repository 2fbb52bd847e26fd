// The selection tables: ISA names, KILN_CPU_ISA resolution, what was selected.
#include "kiln/cpu/config.h"
#include "kiln/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

namespace kiln::cpu {
namespace {

TEST(Config, IsaNamesRoundTrip) {
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512}) {
    Isa parsed = Isa::Generic;
    ASSERT_TRUE(parse_isa(isa_name(isa), &parsed)) << isa_name(isa);
    EXPECT_EQ(parsed, isa);
  }
  Isa unchanged = Isa::Avx2;
  EXPECT_FALSE(parse_isa("sse4", &unchanged));
  EXPECT_FALSE(parse_isa("AVX2", &unchanged));
  EXPECT_FALSE(parse_isa(nullptr, &unchanged));
  EXPECT_EQ(unchanged, Isa::Avx2);
}

TEST(Config, ResolveIsaRequest) {
  bool warn = true;
  EXPECT_EQ(resolve_isa(nullptr, Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("", Isa::Avx2, &warn), Isa::Avx2);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("avx2", Isa::Avx512, &warn), Isa::Avx2);  // a narrower ISA: taken
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("generic", Isa::Avx512, &warn), Isa::Generic);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("avx512", Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("avx512", Isa::Avx2, &warn), Isa::Avx2);  // above the CPU: capped, with a warning
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("avx2", Isa::Generic, &warn), Isa::Generic);
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("neon-bf16", Isa::Avx2, &warn), Isa::Avx2);  // unknown: the best, with a warning
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("avx512", Isa::Avx512, nullptr), Isa::Avx512);
}

TEST(Config, IsaLevelsAreOrdered) {
  EXPECT_TRUE(isa_supported(Isa::Generic));
  const Isa best = best_isa();
  EXPECT_TRUE(isa_supported(best));
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512})
    EXPECT_EQ(isa_supported(isa), isa <= best) << isa_name(isa) << " (best: " << isa_name(best) << ")";
}

// The tables follow KILN_CPU_ISA (ctest also runs this with it set to generic and avx2).
TEST(Config, SelectionFollowsEnvironment) {
  const char* request = std::getenv("KILN_CPU_ISA");
  const Isa want = resolve_isa(request, best_isa(), nullptr);
  EXPECT_EQ(active_isa(), want) << "KILN_CPU_ISA=" << (request ? request : "(unset)");
  EXPECT_EQ(f32_gemm_config().isa, want) << f32_gemm_config().name;
  EXPECT_EQ(f32_gemv_config().isa, want) << f32_gemv_config().name;
  EXPECT_EQ(f32_vunary_config().isa, want) << f32_vunary_config().name;
  EXPECT_EQ(f32_vbinary_config().isa, want) << f32_vbinary_config().name;
  EXPECT_EQ(f32_rows_config().isa, want) << f32_rows_config().name;
  EXPECT_EQ(sgemm_isa(), want);
  EXPECT_STREQ(sgemm_isa_name(sgemm_isa()), isa_name(want));
}

template <typename V>
void check_family(std::span<const V> variants) {
  ASSERT_FALSE(variants.empty());
  EXPECT_EQ(variants.back().isa, Isa::Generic);
  std::set<std::string> names;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_TRUE(names.insert(variants[i].name).second) << variants[i].name << " twice";
    if (i > 0) {
      EXPECT_LT(variants[i].isa, variants[i - 1].isa) << "not widest first, or two variants for one ISA";
    }
    EXPECT_NE(std::string(variants[i].name).find(std::string("__") + isa_name(variants[i].isa)), std::string::npos)
        << variants[i].name << " is not named for its ISA";
  }
}

TEST(Config, VariantTables) {
  check_family(f32_gemm_variants());
  for (const F32GemmVariant& v : f32_gemm_variants()) {
    EXPECT_NE(v.gemm, nullptr);
    EXPECT_GT(v.mr, 0);
    EXPECT_GT(v.nr, 0);
    EXPECT_GT(v.kc, 1);
    EXPECT_NE(std::string(v.name).find(std::to_string(v.mr) + "x" + std::to_string(v.nr)), std::string::npos) << v.name;
  }
  check_family(f32_gemv_variants());
  for (const F32GemvVariant& v : f32_gemv_variants()) {
    EXPECT_NE(v.axpy_rows, nullptr);
    EXPECT_NE(v.dot, nullptr);
    EXPECT_NE(v.dot_rows, nullptr);
  }
  check_family(f32_vunary_variants());
  check_family(f32_vbinary_variants());
  check_family(f32_rows_variants());
}

TEST(Config, SgemmWithRefusesWhatTheCpuLacks) {
  const float a[1] = {2}, b[1] = {3};
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512}) {
    float c[1] = {7};
    EXPECT_EQ(sgemm_with(isa, 1, 1, 1, 1.0f, a, 1, b, 1, false, c, 1), isa_supported(isa)) << isa_name(isa);
    EXPECT_EQ(c[0], isa_supported(isa) ? 6.0f : 7.0f) << isa_name(isa);
  }
}

}  // namespace
}  // namespace kiln::cpu
