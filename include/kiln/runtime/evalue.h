// rt::EValue: one runtime value of a method (a slot of the program's value
// table): none, int, double, bool, string, tensor, or a list. Lists are views
// into memory the method prepared at load time; nothing here allocates.
#pragma once

#include "kiln/runtime/tensor.h"

#include <cstdint>
#include <span>
#include <string_view>

namespace kiln::rt {

struct EValue {
  enum class Tag : uint8_t { None, Int, Double, Bool, String, Tensor, IntList, DoubleList, BoolList, TensorList,
                             OptionalTensorList };
  Tag tag = Tag::None;
  union {
    int64_t i;
    double d;
    bool b;
    Tensor* t;
  } scalar{.i = 0};
  std::string_view str;                        // String
  std::span<const int64_t> ints;               // IntList (materialized from its Int items at load time)
  std::span<const double> doubles;             // DoubleList
  std::span<const bool> bools;                 // BoolList
  std::span<Tensor* const> tensors;            // TensorList; OptionalTensorList uses nullptr for "none"

  bool is_none() const { return tag == Tag::None; }
  bool is_tensor() const { return tag == Tag::Tensor; }
  Tensor& tensor() const { return *scalar.t; }
  int64_t to_int() const { return scalar.i; }
  double to_double() const { return scalar.d; }
  bool to_bool() const { return scalar.b; }

  // A "Scalar" argument (Int, Double or Bool) as a double; false if not a scalar.
  bool scalar_as_double(double* out) const;
  // A "Scalar" argument as an int64 (Bool -> 0/1); false if Double or not a scalar.
  bool scalar_as_int(int64_t* out) const;

  static EValue from_int(int64_t v) { EValue e; e.tag = Tag::Int; e.scalar.i = v; return e; }
  static EValue from_double(double v) { EValue e; e.tag = Tag::Double; e.scalar.d = v; return e; }
  static EValue from_bool(bool v) { EValue e; e.tag = Tag::Bool; e.scalar.b = v; return e; }
  static EValue from_tensor(Tensor* t) { EValue e; e.tag = Tag::Tensor; e.scalar.t = t; return e; }
};

}  // namespace kiln::rt
