// Internal to kiln_cpu: shared by the micro-kernel files.
//
// A variant is one function whose body is an always-inline template (the
// family's header), compiled for one ISA by a target attribute on that function
// alone: nothing else in its file (no inline function that a header shares
// with other files) is built for the wider ISA, so the linker can never hand a
// baseline caller AVX-512 code. config.cpp calls a variant only on a CPU that
// has its ISA (see kiln/cpu/config.h for what each ISA level requires).
#pragma once

#define KILN_CPU_INLINE inline __attribute__((always_inline))
#define KILN_CPU_LAMBDA __attribute__((always_inline))  // after a lambda's parameter list

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_CPU_X86 1
#endif
#if defined(__aarch64__) && defined(__GNUC__)
#define KILN_CPU_ARM64 1
#endif

// The rest of a file built for one ISA: KILN_CPU_TARGET_BEGIN("arch=x86-64-v4") ... KILN_CPU_TARGET_END
// (GCC's `#pragma GCC target`, which clang ignores; clang's attribute pragma does the same there).
#define KILN_CPU_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KILN_CPU_TARGET_BEGIN(isa) \
  KILN_CPU_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define KILN_CPU_TARGET_END KILN_CPU_PRAGMA(clang attribute pop)
#else
#define KILN_CPU_TARGET_BEGIN(isa) KILN_CPU_PRAGMA(GCC target(isa))
#define KILN_CPU_TARGET_END
#endif
