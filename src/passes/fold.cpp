#include "fold.h"

#include "kiln/core/error.h"
#include "kiln/runtime/kernel.h"

#include <deque>
#include <memory>

namespace kiln::passes {
namespace {

using graph::Argument;

// Owns everything the EValues point at while one kernel runs.
struct Frame {
  std::deque<std::vector<std::byte>> buffers;
  std::deque<rt::Tensor> tensors;
  std::deque<std::vector<int64_t>> int_lists;
  std::deque<std::vector<double>> double_lists;
  std::deque<std::unique_ptr<bool[]>> bool_lists;
  std::deque<std::vector<rt::Tensor*>> tensor_lists;
  std::deque<std::string> strings;
};

rt::Tensor* tensor_of(Frame& f, const graph::TensorMeta& meta, std::vector<std::byte> bytes) {
  auto& buf = f.buffers.emplace_back(std::move(bytes));
  auto& t = f.tensors.emplace_back();
  if (rt::make_contiguous_tensor(t, meta.dtype, meta.sizes, buf.data(), buf.size()) != rt::Status::Ok) return nullptr;
  return &t;
}

bool to_evalue(Frame& f, const EdgeProgram& program, const Argument& a, rt::EValue& out) {
  using K = Argument::Kind;
  switch (a.kind) {
    case K::None: out = rt::EValue{}; return true;
    case K::Int: out = rt::EValue::from_int(std::get<int64_t>(a.payload)); return true;
    case K::Float: out = rt::EValue::from_double(std::get<double>(a.payload)); return true;
    case K::Bool: out = rt::EValue::from_bool(std::get<bool>(a.payload)); return true;
    case K::ScalarType:
      out = rt::EValue::from_int(static_cast<int64_t>(std::get<ScalarType>(a.payload)));
      return true;
    case K::String:
      out.tag = rt::EValue::Tag::String;
      out.str = f.strings.emplace_back(std::get<std::string>(a.payload));
      return true;
    case K::Ints:
      out.tag = rt::EValue::Tag::IntList;
      out.ints = f.int_lists.emplace_back(std::get<std::vector<int64_t>>(a.payload));
      return true;
    case K::Floats:
      out.tag = rt::EValue::Tag::DoubleList;
      out.doubles = f.double_lists.emplace_back(std::get<std::vector<double>>(a.payload));
      return true;
    case K::Bools: {
      const auto& v = std::get<std::vector<bool>>(a.payload);
      auto& l = f.bool_lists.emplace_back(new bool[v.size() + 1]);
      for (size_t i = 0; i < v.size(); ++i) l[i] = v[i];
      out.tag = rt::EValue::Tag::BoolList;
      out.bools = std::span<const bool>(l.get(), v.size());
      return true;
    }
    case K::Tensor: {
      auto v = std::get<graph::ValueId>(a.payload);
      rt::Tensor* t = tensor_of(f, program.graph.value(v).meta, program.constant_bytes(v));
      if (!t) return false;
      out = rt::EValue::from_tensor(t);
      return true;
    }
    case K::Tensors:
    case K::OptionalTensors: {
      auto& l = f.tensor_lists.emplace_back();
      if (a.kind == K::Tensors) {
        for (auto v : std::get<std::vector<graph::ValueId>>(a.payload)) {
          l.push_back(tensor_of(f, program.graph.value(v).meta, program.constant_bytes(v)));
          if (!l.back()) return false;
        }
        out.tag = rt::EValue::Tag::TensorList;
      } else {
        for (const auto& v : std::get<std::vector<std::optional<graph::ValueId>>>(a.payload)) {
          if (!v) {
            l.push_back(nullptr);
            continue;
          }
          l.push_back(tensor_of(f, program.graph.value(*v).meta, program.constant_bytes(*v)));
          if (!l.back()) return false;
        }
        out.tag = rt::EValue::Tag::OptionalTensorList;
      }
      out.tensors = l;
      return true;
    }
    default: return false;
  }
}

}  // namespace

std::optional<std::vector<std::vector<std::byte>>> evaluate_constant_node(const EdgeProgram& program,
                                                                          const graph::Node& node,
                                                                          const OpSchema& schema, std::string* why) {
  rt::KernelFn fn = rt::find_kernel(schema.kernel, schema.overload);
  if (fn == nullptr) {
    *why = fmt::format("no kernel {}.{}", schema.kernel, schema.overload);
    return std::nullopt;
  }
  Frame f;
  std::vector<graph::Argument> args = ordered_arguments(schema, node);
  std::deque<rt::EValue> values;
  for (const auto& a : args) {
    rt::EValue v;
    if (!to_evalue(f, program, a, v)) {
      *why = "argument not representable";
      return std::nullopt;
    }
    values.push_back(v);
  }
  std::vector<graph::ValueId> outs = node.output_ids();
  std::vector<rt::Tensor*> out_tensors;
  for (auto v : outs) {
    const auto& meta = program.graph.value(v).meta;
    rt::Tensor* t = tensor_of(f, meta, std::vector<std::byte>(static_cast<size_t>(meta.nbytes())));
    if (!t) {
      *why = "output shape not representable";
      return std::nullopt;
    }
    out_tensors.push_back(t);
  }
  if (schema.out_is_list) {
    rt::EValue l;
    l.tag = rt::EValue::Tag::TensorList;
    l.tensors = f.tensor_lists.emplace_back(out_tensors);
    values.push_back(l);
  } else {
    for (auto* t : out_tensors) values.push_back(rt::EValue::from_tensor(t));
  }
  std::vector<rt::EValue*> ptrs;
  for (auto& v : values) ptrs.push_back(&v);
  rt::KernelContext ctx;
  fn(ctx, ptrs);
  if (!ctx.ok()) {
    *why = fmt::format("{}.{} failed: {}", schema.kernel, schema.overload, ctx.message());
    return std::nullopt;
  }
  std::vector<std::vector<std::byte>> result;
  for (auto* t : out_tensors) {
    const auto* p = static_cast<const std::byte*>(t->data);
    result.emplace_back(p, p + t->nbytes());
  }
  return result;
}

}  // namespace kiln::passes
