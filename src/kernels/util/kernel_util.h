// Internal helpers for kiln's portable kernels, for any kernel source to share:
// the umbrella over the topic headers, each usable alone:
//   dtype.h             float16/bfloat16 storage types, convert, dtype sets, dispatch, dtype_of
//   scalar.h            Scalar (a schema's Scalar argument)
//   promote.h           torch's type promotion (promote_types, can_cast, ResultType)
//   args.h              argument access and checks (TensorOrScalar, wrap_dim, resize_out, out dtypes)
//   broadcast.h         numpy broadcasting of shapes
//   load_store.h        chunked dtype-converting loads and stores (kChunk, load_as, store_as)
//   elementwise.h       a broadcasting elementwise loop with dtype conversion (make_plan, map_elements)
// Header-only; nothing here allocates (fixed-size stack state).
#pragma once

#include "args.h"
#include "broadcast.h"
#include "dtype.h"
#include "elementwise.h"
#include "load_store.h"
#include "promote.h"
#include "scalar.h"
