// kiln::cpu's selection tables: the variants of each family, and the one picked
// for this process (once, at first use) from the CPU's features and KILN_CPU_ISA.
#include "kiln/cpu/config.h"

#include "ukernels.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#ifdef KILN_CPU_X86
#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif
#ifdef KILN_CPU_ARM64
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#endif

namespace kiln::cpu {

// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and the kernel's grant of the tile
// data state to this process: Linux (5.16+) enables AMX per process on request, and a tile
// instruction before the grant faults. Asked once; a refusal (older kernel, or a sigaltstack too
// small for the tile state somewhere in the process) leaves the Amx level unsupported.
bool amx_permitted() {
#if defined(KILN_CPU_X86) && defined(__linux__)
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    if ((d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

namespace {

bool cpu_has_vnni();

// Does this CPU run `isa`? (The build's side is the variant lists below.)
bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Generic: return true;
#ifdef KILN_CPU_X86
#if defined(__clang__) && __clang_major__ < 18  // no level names before clang 18: the levels' features it knows
    case Isa::Avx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2");
    case Isa::Avx512:
      return cpu_has(Isa::Avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    case Isa::Avx2: __builtin_cpu_init(); return __builtin_cpu_supports("x86-64-v3");
    case Isa::Avx512: __builtin_cpu_init(); return __builtin_cpu_supports("x86-64-v4");
#endif
    case Isa::Amx: return cpu_has(Isa::Avx512) && cpu_has_vnni() && amx_permitted();
#endif
#ifdef KILN_CPU_ARM64
    // the kernel's view of the CPU (what qemu-user's -cpu models too); each level includes the one below
    case Isa::Neon: return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
    case Isa::Dotprod: return cpu_has(Isa::Neon) && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    case Isa::I8mm: return cpu_has(Isa::Dotprod) && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#endif
    default: return false;
  }
}

// Each family's variants, widest ISA first.
#ifdef KILN_CPU_X86
#define KILN_X86_ONLY(...) __VA_ARGS__,
#else
#define KILN_X86_ONLY(...)
#endif
#ifdef KILN_CPU_ARM64
#define KILN_ARM64_ONLY(...) __VA_ARGS__,
#else
#define KILN_ARM64_ONLY(...)
#endif

// two_pipes: see F32GemmVariant::two_pipes (the other avx512 row is skipped on such cores; generic and avx2 rows are for every core);
// the last flag: pack_once (both AVX-512 rows: measured on an Intel Xeon and on AMD's Zen 4)
const F32GemmVariant kF32Gemm[] = {
    KILN_X86_ONLY({"f32_gemm_4x64__avx512", Isa::Avx512, 4, 64, 768, f32_gemm_4x64__avx512, f32_gemm_4x64__avx512_bt, f32_gemm_4x64__avx512_packed, false, true})
    KILN_X86_ONLY({"f32_gemm_6x64__avx512", Isa::Avx512, 6, 64, 128, f32_gemm_6x64__avx512,
                   f32_gemm_6x64__avx512_bt, f32_gemm_6x64__avx512_packed, true, true})
    KILN_X86_ONLY({"f32_gemm_4x24__avx2", Isa::Avx2, 4, 24, 256, f32_gemm_4x24__avx2, f32_gemm_4x24__avx2_bt, f32_gemm_4x24__avx2_packed})
    KILN_ARM64_ONLY({"f32_gemm_8x8__neon", Isa::Neon, 8, 8, 1024, f32_gemm_8x8__neon, f32_gemm_8x8__neon_bt, f32_gemm_8x8__neon_packed})
    {"f32_gemm_6x8__generic", Isa::Generic, 6, 8, 1024, f32_gemm_6x8__generic, f32_gemm_6x8__generic_bt, f32_gemm_6x8__generic_packed},
};

#define KILN_GEMV_ROW(isa, ISA) {"f32_gemv__" #isa, Isa::ISA, f32_gemv_axpy_rows__##isa, f32_gemv_dot__##isa, \
                                 f32_gemv_dot_rows__##isa, f32_gemv_dot_block__##isa}
const F32GemvVariant kF32Gemv[] = {
    KILN_X86_ONLY(KILN_GEMV_ROW(avx512, Avx512))
    KILN_X86_ONLY(KILN_GEMV_ROW(avx2, Avx2))
    KILN_GEMV_ROW(generic, Generic),
};

#define KILN_VUNARY_PTR(op, isa) f32_v##op##__##isa,
#define KILN_VUNARY_ROW(isa, ISA, lanes) \
  {"f32_vunary__" #isa, Isa::ISA, lanes, KILN_F32_VUNARY_OPS(KILN_VUNARY_PTR, isa) f32_vclamp__##isa}
const F32VUnaryVariant kF32VUnary[] = {
    KILN_X86_ONLY(KILN_VUNARY_ROW(avx512, Avx512, 16))
    KILN_X86_ONLY(KILN_VUNARY_ROW(avx2, Avx2, 8))
    KILN_VUNARY_ROW(generic, Generic, 4),
};

#define KILN_VBINARY_FORMS(op, isa) {f32_v##op##_vv__##isa, f32_v##op##_vs__##isa, f32_v##op##_sv__##isa},
#define KILN_VBINARY_ROW(isa, ISA, lanes) \
  {"f32_vbinary__" #isa, Isa::ISA, lanes, KILN_F32_VBINARY_OPS(KILN_VBINARY_FORMS, isa)}
const F32VBinaryVariant kF32VBinary[] = {
    KILN_X86_ONLY(KILN_VBINARY_ROW(avx512, Avx512, 16))
    KILN_X86_ONLY(KILN_VBINARY_ROW(avx2, Avx2, 8))
    KILN_VBINARY_ROW(generic, Generic, 4),
};

// Each qd8 variant's row is defined in its own file, beside its products (ukernels.h).
const Qd8GemmVariant* const kQd8Gemm[] = {
    KILN_X86_ONLY(&qd8_gemm__amx)
    KILN_X86_ONLY(&qd8_gemm__avx512vnni)
    KILN_X86_ONLY(&qd8_gemm__avx512)
    KILN_X86_ONLY(&qd8_gemm__avx2)
    KILN_ARM64_ONLY(&qd8_gemm__i8mm)
    KILN_ARM64_ONLY(&qd8_gemm__dotprod)
    &qd8_gemm__generic,
};

// The 512-bit FMA rate over the 256-bit one, in flops per second of this thread's CPU time, best of
// five alternating probes of ~40 us each (f32_fma_probe__*: independent FMA chains, no memory traffic):
// ~2 on a core with two full-width pipes, ~1 where 512-bit FMAs are split in two (bench/RESULTS.md has
// 1.86 on a Xeon with AMX).
int measure_fma512_pipes() {
#ifdef KILN_CPU_X86
  if (!cpu_has(Isa::Avx512)) return 0;
  double best512 = 0, best256 = 0;
  for (int round = 0; round < 5; ++round) {
    best512 = std::max(best512, f32_fma_probe__avx512(4000));
    best256 = std::max(best256, f32_fma_probe__avx2(4000));
  }
  return best512 > 1.5 * best256 ? 2 : 1;
#else
  return 0;
#endif
}

bool cpu_has_vnni() {
#ifdef KILN_CPU_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const F32RowsVariant kF32Rows[] = {
    KILN_X86_ONLY({"f32_rows__avx512", Isa::Avx512, 16, f32_softmax__avx512, f32_softmax_scaled__avx512, f32_transpose__avx512})
    KILN_X86_ONLY({"f32_rows__avx2", Isa::Avx2, 8, f32_softmax__avx2, f32_softmax_scaled__avx2, f32_transpose__avx2})
    {"f32_rows__generic", Isa::Generic, 4, f32_softmax__generic, f32_softmax_scaled__generic, f32_transpose__generic},
};

#ifdef KILN_CPU_ARM64
constexpr const char* kIsaChoices = "generic|neon|dotprod|i8mm";
constexpr Isa kLevels[] = {Isa::I8mm, Isa::Dotprod, Isa::Neon};  // this build's levels above Generic, widest first
#else
constexpr const char* kIsaChoices = "generic|avx2|avx512|amx";
constexpr Isa kLevels[] = {Isa::Amx, Isa::Avx512, Isa::Avx2};
#endif

// x86 (1) or Arm (2) for the levels above Generic (0)
int isa_family(Isa isa) {
  switch (isa) {
    case Isa::Generic: return 0;
    case Isa::Avx2:
    case Isa::Avx512:
    case Isa::Amx: return 1;
    case Isa::Neon:
    case Isa::Dotprod:
    case Isa::I8mm: return 2;
  }
  return 0;
}

// The widest variant of a family at or below `isa` (every family has a generic one).
template <typename V, size_t N>
const V* pick(const V (&variants)[N], Isa isa) {
  for (const V& v : variants)
    if (v.isa <= isa) return &v;
  return &variants[N - 1];
}

struct Tables {
  Isa isa;
  const F32GemmVariant* f32_gemm;
  const F32GemvVariant* f32_gemv;
  const F32VUnaryVariant* f32_vunary;
  const F32VBinaryVariant* f32_vbinary;
  const F32RowsVariant* f32_rows;
  const Qd8GemmVariant* qd8_gemm;
};

const Tables& tables() {
  static const Tables t = [] {
    const char* request = std::getenv("KILN_CPU_ISA");
    const Isa best = best_isa();
    bool warning = false;
    const Isa isa = resolve_isa(request, best, &warning);
    if (warning)
      std::fprintf(stderr, "kiln: KILN_CPU_ISA=%s is not an ISA this CPU runs (%s); using %s\n", request,
                   kIsaChoices, isa_name(isa));
    const Qd8GemmVariant* qd8 = &qd8_gemm_variants().back();
    for (const Qd8GemmVariant& v : qd8_gemm_variants())
      if (v.isa <= isa && (!v.vnni || cpu_has_vnni())) {
        qd8 = &v;
        break;
      }
    const F32GemmVariant* gemm = &kF32Gemm[std::size(kF32Gemm) - 1];
    for (const F32GemmVariant& v : kF32Gemm)
      if (v.isa <= isa && f32_gemm_for_this_cpu(v)) {
        gemm = &v;
        break;
      }
    // f32-gemv streams weights from memory: where the core measures one 512-bit FMA pipe (AMD's Zen 4 splits
    // 512-bit operations in halves) the AVX2 row, whose 256-bit loads stream weights faster there (a
    // one-token GPT-2: 28 against 23-25 GB/s; bench/RESULTS.md, issue 42)
    const Isa gemv_isa = (isa == Isa::Avx512 || isa == Isa::Amx) && cpu_fma512_pipes() == 1 ? Isa::Avx2 : isa;
    return Tables{isa, gemm, pick(kF32Gemv, gemv_isa), pick(kF32VUnary, isa), pick(kF32VBinary, isa),
                  pick(kF32Rows, isa), qd8};
  }();
  return t;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return "neon";
    case Isa::Dotprod: return "dotprod";
    case Isa::I8mm: return "i8mm";
    case Isa::Generic: break;
  }
  return "generic";
}

bool parse_isa(const char* name, Isa* isa) {
  for (Isa i : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon, Isa::Dotprod, Isa::I8mm})
    if (name != nullptr && std::strcmp(name, isa_name(i)) == 0) {
      *isa = i;
      return true;
    }
  return false;
}

bool isa_supported(Isa isa) {
  bool built = false;  // some family has a variant for it (Amx, Dotprod and I8mm: only qd8-gemm)
  for (const F32GemmVariant& v : kF32Gemm) built = built || v.isa == isa;
  for (const Qd8GemmVariant& v : qd8_gemm_variants()) built = built || v.isa == isa;
  return built && cpu_has(isa);
}

Isa best_isa() {
  for (Isa isa : kLevels)
    if (isa_supported(isa)) return isa;
  return Isa::Generic;
}

Isa resolve_isa(const char* request, Isa best, bool* warning) {
  if (warning) *warning = false;
  if (request == nullptr || request[0] == '\0') return best;
  Isa isa;
  if (!parse_isa(request, &isa) || isa > best || (isa != Isa::Generic && isa_family(isa) != isa_family(best))) {
    if (warning) *warning = true;
    return best;
  }
  return isa;
}

Isa active_isa() { return tables().isa; }

std::span<const F32GemmVariant> f32_gemm_variants() { return kF32Gemm; }

int cpu_fma512_pipes() {
  static const int pipes = [] {
    const char* env = std::getenv("KILN_FMA512_PIPES");
    if (env != nullptr && (std::strcmp(env, "1") == 0 || std::strcmp(env, "2") == 0)) return env[0] - '0';
    return measure_fma512_pipes();
  }();
  return pipes;
}

bool f32_gemm_for_this_cpu(const F32GemmVariant& v) {
  const bool two = cpu_fma512_pipes() == 2;
  if (v.two_pipes) return two;
  if (!two) return true;
  for (const F32GemmVariant& w : kF32Gemm)  // there, an ISA's row tuned for two pipes replaces the general one
    if (w.two_pipes && w.isa == v.isa) return false;
  return true;
}
const F32GemmVariant& f32_gemm_config() { return *tables().f32_gemm; }

std::span<const F32GemvVariant> f32_gemv_variants() { return kF32Gemv; }
const F32GemvVariant& f32_gemv_config() { return *tables().f32_gemv; }

std::span<const F32VUnaryVariant> f32_vunary_variants() { return kF32VUnary; }
const F32VUnaryVariant& f32_vunary_config() { return *tables().f32_vunary; }

std::span<const F32VBinaryVariant> f32_vbinary_variants() { return kF32VBinary; }
const F32VBinaryVariant& f32_vbinary_config() { return *tables().f32_vbinary; }

std::span<const Qd8GemmVariant> qd8_gemm_variants() {
  static const auto variants = [] {  // the rows, copied in order (at first use: they are other files' constants)
    std::array<Qd8GemmVariant, std::size(kQd8Gemm)> v{};
    for (size_t i = 0; i < v.size(); ++i) v[i] = *kQd8Gemm[i];
    return v;
  }();
  return variants;
}
bool qd8_gemm_runnable(const Qd8GemmVariant& v) { return cpu_has(v.isa) && (!v.vnni || cpu_has_vnni()); }
const Qd8GemmVariant& qd8_gemm_config() { return *tables().qd8_gemm; }

std::span<const F32RowsVariant> f32_rows_variants() { return kF32Rows; }
const F32RowsVariant& f32_rows_config() { return *tables().f32_rows; }

}  // namespace kiln::cpu
