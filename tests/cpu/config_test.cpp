// The selection tables: ISA names, KILN_CPU_ISA resolution, what was selected.
#include "kiln/cpu/config.h"
#include "kiln/cpu/gemm.h"
#include "kiln/cpu/quant.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

namespace kiln::cpu {
namespace {

// This build's ISA levels (lowest first) and the other family's, which it never runs.
#if defined(__aarch64__)
const Isa kLevels[] = {Isa::Generic, Isa::Neon, Isa::Dotprod, Isa::I8mm};
const Isa kOtherFamily[] = {Isa::Avx2, Isa::Avx512, Isa::Amx};
#else
const Isa kLevels[] = {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Amx};
const Isa kOtherFamily[] = {Isa::Neon, Isa::Dotprod, Isa::I8mm};
#endif

TEST(Config, IsaNamesRoundTrip) {
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon, Isa::Dotprod, Isa::I8mm}) {
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
  EXPECT_EQ(resolve_isa("avx512", Isa::Amx, &warn), Isa::Avx512);  // an AMX machine's VNNI path
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("amx", Isa::Avx512, &warn), Isa::Avx512);  // no AMX (or no grant): capped
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("amx", Isa::I8mm, &warn), Isa::I8mm);
  EXPECT_TRUE(warn);
  // the Arm levels, and the two families never mixed
  EXPECT_EQ(resolve_isa("dotprod", Isa::I8mm, &warn), Isa::Dotprod);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("neon", Isa::Dotprod, &warn), Isa::Neon);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("generic", Isa::I8mm, &warn), Isa::Generic);
  EXPECT_FALSE(warn);
  EXPECT_EQ(resolve_isa("i8mm", Isa::Dotprod, &warn), Isa::Dotprod);  // a Cortex-A76 has no i8mm
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("avx2", Isa::I8mm, &warn), Isa::I8mm);
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("neon", Isa::Avx512, &warn), Isa::Avx512);
  EXPECT_TRUE(warn);
  EXPECT_EQ(resolve_isa("dotprod", Isa::Generic, &warn), Isa::Generic);
  EXPECT_TRUE(warn);
}

TEST(Config, IsaLevelsAreOrdered) {
  EXPECT_TRUE(isa_supported(Isa::Generic));
  const Isa best = best_isa();
  EXPECT_TRUE(isa_supported(best));
  for (Isa isa : kLevels)
    EXPECT_EQ(isa_supported(isa), isa <= best) << isa_name(isa) << " (best: " << isa_name(best) << ")";
  for (Isa isa : kOtherFamily) EXPECT_FALSE(isa_supported(isa)) << isa_name(isa);
}

// The widest variant of a family at or below `want` (what the selection must have taken).
template <typename V>
const char* widest_at_or_below(std::span<const V> variants, Isa want) {
  for (const V& v : variants)
    if (v.isa <= want) return v.name;
  return "(none)";
}

// The tables follow KILN_CPU_ISA (ctest also runs this with it set to generic and avx2).
TEST(Config, SelectionFollowsEnvironment) {
  const char* request = std::getenv("KILN_CPU_ISA");
  const Isa want = resolve_isa(request, best_isa(), nullptr);
  EXPECT_EQ(active_isa(), want) << "KILN_CPU_ISA=" << (request ? request : "(unset)");
  const char* gemm = "(none)";  // f32-gemm: the widest of the rows for this CPU's vendor
  for (const F32GemmVariant& v : f32_gemm_variants())
    if (v.isa <= want && f32_gemm_for_this_cpu(v)) {
      gemm = v.name;
      break;
    }
  EXPECT_STREQ(f32_gemm_config().name, gemm);
  // f32-gemv: the AVX2 row where an AVX-512 level meets one measured 512-bit pipe (its loads stream faster
  // there), else the widest at or below the level
  const bool one_pipe = (want == Isa::Avx512 || want == Isa::Amx) && cpu_fma512_pipes() == 1;
  EXPECT_STREQ(f32_gemv_config().name, widest_at_or_below(f32_gemv_variants(), one_pipe ? Isa::Avx2 : want));
  EXPECT_STREQ(f32_vunary_config().name, widest_at_or_below(f32_vunary_variants(), want));
  EXPECT_STREQ(f32_vbinary_config().name, widest_at_or_below(f32_vbinary_variants(), want));
  EXPECT_STREQ(f32_rows_config().name, widest_at_or_below(f32_rows_variants(), want));
  EXPECT_LE(f32_gemm_config().isa, want);
  EXPECT_EQ(sgemm_isa(), f32_gemm_config().isa);
  EXPECT_STREQ(sgemm_isa_name(sgemm_isa()), isa_name(f32_gemm_config().isa));
#if !defined(__aarch64__)
  // on x86-64 every family has a variant per level up to Avx512 (Amx: only qd8-gemm)
  const Isa f32_want = want == Isa::Amx ? Isa::Avx512 : want;
  EXPECT_EQ(f32_gemm_config().isa, f32_want) << f32_gemm_config().name;
  EXPECT_EQ(f32_rows_config().isa, f32_want) << f32_rows_config().name;
#endif
  // qd8-gemm: the widest runnable variant at or below the level (KILN_CPU_ISA=avx512 on an AMX
  // machine: the avx512vnni one)
  const char* qd8 = "(none)";
  for (const Qd8GemmVariant& v : qd8_gemm_variants())
    if (v.isa <= want && qd8_gemm_runnable(v)) {
      qd8 = v.name;
      break;
    }
  EXPECT_STREQ(qd8_gemm_config().name, qd8);
}

template <typename V>
void check_family(std::span<const V> variants) {
  ASSERT_FALSE(variants.empty());
  EXPECT_EQ(variants.back().isa, Isa::Generic);
  std::set<std::string> names;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_TRUE(names.insert(variants[i].name).second) << variants[i].name << " twice";
    if (i > 0) {
      // two rows for one ISA only where the second tunes the first for other cores (f32-gemm's two_pipes rows)
      bool vendor_row = false;
      if constexpr (requires { variants[i].two_pipes; })
        vendor_row = variants[i].two_pipes && !variants[i - 1].two_pipes;
      if (vendor_row) {
        EXPECT_EQ(variants[i].isa, variants[i - 1].isa) << variants[i].name << ": a vendor's row follows its ISA's row";
      } else {
        EXPECT_LT(variants[i].isa, variants[i - 1].isa) << "not widest first, or two variants for one ISA";
      }
    }
    EXPECT_NE(std::string(variants[i].name).find(std::string("__") + isa_name(variants[i].isa)), std::string::npos)
        << variants[i].name << " is not named for its ISA";
  }
}

// The measured 512-bit FMA pipes (or KILN_FMA512_PIPES): 0 exactly where the CPU lacks AVX-512, and the
// f32-gemm selection follows it: a two_pipes row is picked where it says 2 and AVX-512 is selected, never
// where it says 1.
TEST(Config, FmaPipesPickTheGemmRow) {
  const int pipes = cpu_fma512_pipes();
  const char* env = std::getenv("KILN_FMA512_PIPES");
  if (env != nullptr && (std::string(env) == "1" || std::string(env) == "2")) {
    EXPECT_EQ(pipes, env[0] - '0');
  } else {
    EXPECT_EQ(pipes == 0, !isa_supported(Isa::Avx512)) << pipes;
  }
  EXPECT_GE(pipes, 0);
  EXPECT_LE(pipes, 2);
  bool has_two_pipes_row = false;
  for (const F32GemmVariant& v : f32_gemm_variants())
    has_two_pipes_row = has_two_pipes_row || (v.two_pipes && v.isa == f32_gemm_config().isa);
  if (pipes == 2 && has_two_pipes_row) {
    EXPECT_TRUE(f32_gemm_config().two_pipes) << f32_gemm_config().name;
  }
  if (pipes != 2) {
    EXPECT_FALSE(f32_gemm_config().two_pipes) << f32_gemm_config().name;
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
    EXPECT_NE(v.dot_block, nullptr);
  }
  check_family(f32_vunary_variants());
  check_family(f32_vbinary_variants());
  check_family(f32_rows_variants());
}

TEST(Config, SgemmWithRefusesWhatTheCpuLacks) {
  const float a[1] = {2}, b[1] = {3};
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon, Isa::Dotprod, Isa::I8mm}) {
    bool has_gemm = false;  // Dotprod and I8mm have qd8 variants only
    for (const F32GemmVariant& v : f32_gemm_variants()) has_gemm = has_gemm || v.isa == isa;
    const bool runs = has_gemm && isa_supported(isa);
    float c[1] = {7};
    EXPECT_EQ(sgemm_with(isa, 1, 1, 1, 1.0f, a, 1, b, 1, false, c, 1), runs) << isa_name(isa);
    EXPECT_EQ(c[0], runs ? 6.0f : 7.0f) << isa_name(isa);
  }
}

}  // namespace
}  // namespace kiln::cpu
