// KILN_TRY: the runtime's early return on an error value (status.h), for code built
// without exceptions.
#pragma once

#include "kiln/runtime/status.h"

// Evaluates `expr` (a Status) and returns it from the calling function unless it is Ok
// (the caller returns a Status, or a Result<T>, which a Status converts to).
#define KILN_TRY(expr)                                                        \
  do {                                                                        \
    const ::kiln::rt::Status kiln_try_status_ = (expr);                       \
    if (kiln_try_status_ != ::kiln::rt::Status::Ok) return kiln_try_status_;  \
  } while (0)
