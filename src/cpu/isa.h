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
