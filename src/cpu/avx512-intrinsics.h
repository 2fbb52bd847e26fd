// Internal to kiln_cpu: <immintrin.h> for the files built for AVX-512, included after their
// target pragma. GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized (and -Wuninitialized, in some inlining orders) reports once they are
// inlined: a known false positive, silenced here for the rest of the including file.
#pragma once

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
