// The runtime's error values (status.h) for code built without exceptions:
// KILN_TRY, the early return, and failure(), the one helper that formats a
// failure's message into an ErrorMessage and returns its Status.
#pragma once

#include "kiln/runtime/status.h"

#include <cstdarg>

// Evaluates `expr` (a Status) and returns it from the calling function unless it is Ok
// (the caller returns a Status, or a Result<T>, which a Status converts to).
#define KILN_TRY(expr)                                                        \
  do {                                                                        \
    const ::kiln::rt::Status kiln_try_status_ = (expr);                       \
    if (kiln_try_status_ != ::kiln::rt::Status::Ok) return kiln_try_status_;  \
  } while (0)

namespace kiln::rt {

class ErrorMessage;

// Formats into `error` (when given) and returns `s`.
Status failure(ErrorMessage* error, Status s, const char* format, ...) __attribute__((format(printf, 3, 4)));
// The same with `prefix` before the formatted text ("XnnpackBackend: ").
Status vfailure(ErrorMessage* error, Status s, const char* prefix, const char* format, va_list args)
    __attribute__((format(printf, 4, 0)));

}  // namespace kiln::rt
