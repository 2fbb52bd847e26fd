// Test-only driver: runs one registered kernel on arguments given as JSON and
// prints the out tensors as JSON, so Python tests can compare kiln's kernels
// with values torch computed.
//
// stdin:  {"op": "aten::add", "overload": "out",
//          "args": [ARG, ...]}          ARG is one of
//            {"tensor": {"dtype": "float32", "shape": [2, 3], "data": [...]}}   (data row-major, flat)
//            {"int": 3} {"double": 1.5} {"bool": true} {"none": null} {"string": "tanh"}
//            {"ints": [1, 2]} {"doubles": [..]} {"bools": [..]}
//            {"tensors": [TENSOR, ...]} {"optional_tensors": [TENSOR or null, ...]}
//          "outs": [i, ...]             indices of args whose tensors to print
// stdout: {"ok": true, "outs": [{"dtype":..., "shape":..., "data": [...]}, ...]}
//      or {"ok": false, "status": "...", "message": "..."}   (exit 0 either way; 2 on bad JSON)
#include "kiln/runtime/kernel.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using json = nlohmann::json;
using namespace kiln;
using namespace kiln::rt;

namespace {

ScalarType dtype_from(const std::string& s) {
  static const std::pair<const char*, ScalarType> table[] = {
      {"float32", ScalarType::Float}, {"float64", ScalarType::Double}, {"float16", ScalarType::Half},
      {"bfloat16", ScalarType::BFloat16}, {"int64", ScalarType::Long}, {"int32", ScalarType::Int},
      {"int16", ScalarType::Short}, {"int8", ScalarType::Char}, {"uint8", ScalarType::Byte},
      {"bool", ScalarType::Bool}};
  for (const auto& [n, t] : table)
    if (s == n) return t;
  throw std::runtime_error("unknown dtype " + s);
}

double json_number(const json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  return v.get<double>();
}

uint16_t to_half_bits(float f);   // defined below
uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_half_bits(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float from_half_bits(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

struct Arena {
  std::deque<Tensor> tensors;
  std::deque<std::vector<std::byte>> buffers;
  std::deque<std::vector<int64_t>> int_lists;
  std::deque<std::vector<double>> double_lists;
  std::deque<std::unique_ptr<bool[]>> bool_lists;
  std::deque<std::vector<Tensor*>> tensor_lists;
  std::deque<std::string> strings;
};

Tensor* make_tensor(Arena& a, const json& j) {
  ScalarType dt = dtype_from(j.at("dtype").get<std::string>());
  std::vector<int64_t> shape = j.at("shape").get<std::vector<int64_t>>();
  const json& data = j.at("data");
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  if (static_cast<int64_t>(data.size()) != numel) throw std::runtime_error("tensor data length != numel");
  auto& buf = a.buffers.emplace_back(static_cast<size_t>(numel) * static_cast<size_t>(element_size(dt)) + 1);
  auto* p = buf.data();
  for (int64_t i = 0; i < numel; ++i) {
    double v = json_number(data[static_cast<size_t>(i)]);
    switch (dt) {
      case ScalarType::Float: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
      case ScalarType::Double: reinterpret_cast<double*>(p)[i] = v; break;
      case ScalarType::Half: reinterpret_cast<uint16_t*>(p)[i] = to_half_bits(static_cast<float>(v)); break;
      case ScalarType::BFloat16: reinterpret_cast<uint16_t*>(p)[i] = to_bf16_bits(static_cast<float>(v)); break;
      case ScalarType::Long: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
      case ScalarType::Int: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
      case ScalarType::Short: reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); break;
      case ScalarType::Char: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
      case ScalarType::Byte: reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
      case ScalarType::Bool: reinterpret_cast<bool*>(p)[i] = v != 0; break;
      default: throw std::runtime_error("unsupported dtype");
    }
  }
  Tensor& t = a.tensors.emplace_back();
  if (make_contiguous_tensor(t, dt, shape, p, buf.size() - 1) != Status::Ok)
    throw std::runtime_error("bad tensor shape");
  return &t;
}

json tensor_json(const Tensor& t) {
  json data = json::array();
  const auto* p = static_cast<const std::byte*>(t.data);
  for (int64_t i = 0; i < t.numel; ++i) {
    double v = 0;
    switch (t.dtype) {
      case ScalarType::Float: v = reinterpret_cast<const float*>(p)[i]; break;
      case ScalarType::Double: v = reinterpret_cast<const double*>(p)[i]; break;
      case ScalarType::Half: v = from_half_bits(reinterpret_cast<const uint16_t*>(p)[i]); break;
      case ScalarType::BFloat16: v = from_bf16_bits(reinterpret_cast<const uint16_t*>(p)[i]); break;
      case ScalarType::Long: data.push_back(reinterpret_cast<const int64_t*>(p)[i]); continue;
      case ScalarType::Int: v = reinterpret_cast<const int32_t*>(p)[i]; break;
      case ScalarType::Short: v = reinterpret_cast<const int16_t*>(p)[i]; break;
      case ScalarType::Char: v = reinterpret_cast<const int8_t*>(p)[i]; break;
      case ScalarType::Byte: v = reinterpret_cast<const uint8_t*>(p)[i]; break;
      case ScalarType::Bool: data.push_back(reinterpret_cast<const bool*>(p)[i]); continue;
      default: v = std::nan("");
    }
    if (std::isnan(v)) data.push_back("nan");
    else if (std::isinf(v)) data.push_back(v > 0 ? "inf" : "-inf");
    else data.push_back(v);
  }
  return {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", std::vector<int64_t>(t.sizes, t.sizes + t.dim)},
          {"data", data}};
}

EValue make_arg(Arena& a, const json& j) {
  auto it = j.begin();
  const std::string& k = it.key();
  const json& v = it.value();
  EValue e;
  if (k == "tensor") return EValue::from_tensor(make_tensor(a, v));
  if (k == "int") return EValue::from_int(v.get<int64_t>());
  if (k == "double") return EValue::from_double(json_number(v));
  if (k == "bool") return EValue::from_bool(v.get<bool>());
  if (k == "none") return e;
  if (k == "string") {
    e.tag = EValue::Tag::String;
    e.str = a.strings.emplace_back(v.get<std::string>());
    return e;
  }
  if (k == "ints") {
    e.tag = EValue::Tag::IntList;
    e.ints = a.int_lists.emplace_back(v.get<std::vector<int64_t>>());
    return e;
  }
  if (k == "doubles") {
    e.tag = EValue::Tag::DoubleList;
    auto& l = a.double_lists.emplace_back();
    for (const auto& x : v) l.push_back(json_number(x));
    e.doubles = l;
    return e;
  }
  if (k == "bools") {
    e.tag = EValue::Tag::BoolList;
    auto& l = a.bool_lists.emplace_back(new bool[v.size() + 1]);
    for (size_t i = 0; i < v.size(); ++i) l[i] = v[i].get<bool>();
    e.bools = std::span<const bool>(l.get(), v.size());
    return e;
  }
  if (k == "tensors" || k == "optional_tensors") {
    e.tag = k == "tensors" ? EValue::Tag::TensorList : EValue::Tag::OptionalTensorList;
    auto& l = a.tensor_lists.emplace_back();
    for (const auto& x : v) l.push_back(x.is_null() ? nullptr : make_tensor(a, x));
    e.tensors = l;
    return e;
  }
  throw std::runtime_error("unknown argument kind " + k);
}

// One request -> its response. Throws std::exception on a malformed request (an argument it cannot build).
json handle(const json& in) {
  Arena arena;
  std::vector<EValue> values;
  for (const auto& a : in.at("args")) values.push_back(make_arg(arena, a));
  std::string op = in.at("op"), overload = in.at("overload");
  KernelFn fn = find_kernel(op, overload);
  if (fn == nullptr) return {{"ok", false}, {"status", "not found"}, {"message", "no kernel " + op + "." + overload}};
  std::vector<EValue*> ptrs;
  for (auto& v : values) ptrs.push_back(&v);
  KernelContext ctx;
  fn(ctx, ptrs);
  if (!ctx.ok()) return {{"ok", false}, {"status", status_name(ctx.status())}, {"message", ctx.message()}};
  json out = {{"ok", true}, {"outs", json::array()}};
  for (int i : in.value("outs", std::vector<int>{})) {
    const EValue& v = values.at(static_cast<size_t>(i));
    if (v.tag == EValue::Tag::Tensor) out["outs"].push_back(tensor_json(v.tensor()));
    else if (v.tag == EValue::Tag::TensorList)
      for (Tensor* t : v.tensors) out["outs"].push_back(tensor_json(*t));
  }
  return out;
}

}  // namespace

// kernel_runner: one request on stdin, its response on stdout (exit 2 on a malformed request).
// kernel_runner --serve: one request per line, one response per line (flushed), until stdin ends; a malformed
// request answers {"bad_request": "..."}. The Python harness keeps one such process for a whole test session
// instead of starting a process per kernel call (5,700 calls in the kernel tables).
int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--serve") {
    std::string line;
    while (std::getline(std::cin, line)) {
      json out;
      try {
        out = handle(json::parse(line));
      } catch (const std::exception& e) {
        out = {{"bad_request", e.what()}};
      }
      std::cout << out.dump() << std::endl;
    }
    return 0;
  }
  json in;
  try {
    in = json::parse(std::cin);
  } catch (const std::exception& e) {
    std::cerr << "kernel_runner: bad JSON: " << e.what() << "\n";
    return 2;
  }
  json out;
  try {
    out = handle(in);
  } catch (const std::exception& e) {
    std::cerr << "kernel_runner: bad argument: " << e.what() << "\n";
    return 2;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
