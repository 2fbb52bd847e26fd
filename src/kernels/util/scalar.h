// The Scalar argument type of kiln's portable kernels (an int, float or bool
// from a schema's Scalar), convertible to any compute type.
#pragma once

#include "dtype.h"

#include <cstdint>

namespace kiln::rt::kernels {

// A "Scalar" argument: what a Python number becomes in a schema.
struct Scalar {
  enum class Kind : uint8_t { Bool, Int, Double } kind = Kind::Int;
  int64_t i = 0;
  double d = 0;
  bool b = false;

  // The dtype torch gives the scalar when it promotes it as a wrapped number.
  ScalarType wrapped_dtype() const {
    return kind == Kind::Double ? ScalarType::Float : kind == Kind::Int ? ScalarType::Long : ScalarType::Bool;
  }
  template <typename C>
  C as() const {
    if (kind == Kind::Double) return convert<C>(d);
    if (kind == Kind::Int) return convert<C>(i);
    return convert<C>(b);
  }
  double as_double() const { return kind == Kind::Double ? d : kind == Kind::Int ? static_cast<double>(i) : b; }
};

}  // namespace kiln::rt::kernels
