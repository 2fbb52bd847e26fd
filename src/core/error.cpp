#include "kiln/core/error.h"

// Error is header-only today; this unit anchors the kiln_core library.
namespace kiln {}
