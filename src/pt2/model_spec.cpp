#include "kiln/pt2/model_spec.h"

#include "kiln/core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::pt2 {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string resolve(const fs::path& dir, const std::string& p) {
  fs::path path(p);
  return (path.is_absolute() ? path : dir / path).lexically_normal().string();
}

std::vector<SpecTensor> tensors(const json& doc, const char* key, const fs::path& dir, const std::string& file) {
  std::vector<SpecTensor> out;
  auto it = doc.find(key);
  if (it == doc.end()) return out;
  check(it->is_array(), "{}: '{}' is not a list", file, key);
  for (const auto& t : *it) {
    check(t.is_object(), "{}: entries of '{}' must be objects", file, key);
    auto text = [&](const char* field) -> std::string {
      auto f = t.find(field);
      if (f == t.end() || f->is_null()) return {};
      check(f->is_string(), "{}: '{}' field '{}' of an entry must be a string", file, key, field);
      return f->get<std::string>();
    };
    SpecTensor st;
    st.name = text("name");
    st.dtype = text("dtype");
    if (auto s = t.find("shape"); s != t.end()) {
      check(s->is_array(), "{}: '{}' shape of '{}' is not a list", file, key, st.name);
      for (const auto& d : *s) {
        const bool dim = d.is_number_integer() &&
                         (d.is_number_unsigned() ? d.get<uint64_t>() <= uint64_t{INT64_MAX} : d.get<int64_t>() >= 0);
        check(dim, "{}: '{}' shape of '{}' has a dim that is not a non-negative integer", file, key, st.name);
        st.shape.push_back(d.get<int64_t>());
      }
    }
    if (auto r = t.find("reference"); r != t.end() && r->is_string()) st.reference = resolve(dir, *r);
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace

ModelSpec read_model_spec(const std::string& path) {
  std::error_code ec;
  check(fs::is_regular_file(path, ec), "{}: model spec not found", path);
  std::ifstream in(path);
  check(in.good(), "{}: cannot open model spec", path);
  std::stringstream ss;
  ss << in.rdbuf();
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: model spec is not valid JSON ({})", path, e.what());
  }
  check(doc.is_object(), "{}: model spec must be a JSON object", path);
  ModelSpec spec;
  spec.path = path;
  fs::path dir = fs::absolute(fs::path(path)).parent_path();
  spec.directory = dir.string();
  auto str = [&](const char* key, bool required) -> std::string {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) {
      check(!required, "{}: model spec has no '{}'", path, key);
      return {};
    }
    check(it->is_string(), "{}: model spec field '{}' must be a string", path, key);
    return it->get<std::string>();
  };
  spec.name = str("name", true);
  // The name becomes file names (<name>_<backend>.pte beside the spec): a file name, never a path.
  check(!spec.name.empty() && spec.name != "." && spec.name != ".." &&
            spec.name.find_first_of('/') == std::string::npos && spec.name.find_first_of('\\') == std::string::npos &&
            std::none_of(spec.name.begin(), spec.name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }) &&
            spec.name.size() <= 200,
        "{}: model spec 'name' must be a file name (no '/', '\\', control characters, '.' or '..'; at most 200 bytes)", path);
  spec.model_id = str("model_id", false);
  spec.ir = str("ir", false);
  spec.exported_program = resolve(dir, str("exported_program", true));
  if (auto it = doc.find("seq_len"); it != doc.end()) {
    check(it->is_number_integer() && it->get<int64_t>() > 0, "{}: model spec 'seq_len' must be a positive integer", path);
    spec.seq_len = it->get<int64_t>();
  }
  if (auto it = doc.find("constant_methods"); it != doc.end()) {
    check(it->is_object(), "{}: 'constant_methods' must be an object of name: value", path);
    for (const auto& [name, v] : it->items()) {
      ConstantMethod m{name, {}};
      auto add = [&](const json& x) {
        if (x.is_boolean()) m.values.emplace_back(x.get<bool>());
        else if (x.is_number_integer()) m.values.emplace_back(x.get<int64_t>());
        else if (x.is_number()) m.values.emplace_back(x.get<double>());
        else if (x.is_string()) m.values.emplace_back(x.get<std::string>());
        else fail("{}: constant method '{}' must return ints, floats, bools or strings", path, name);
      };
      if (v.is_array()) {
        for (const auto& x : v) add(x);
      } else {
        add(v);
      }
      spec.constant_methods.push_back(std::move(m));
    }
  }
  spec.inputs = tensors(doc, "inputs", dir, path);
  spec.outputs = tensors(doc, "outputs", dir, path);
  check(fs::is_regular_file(spec.exported_program, ec), "{}: exported program '{}' not found", path,
        spec.exported_program);
  return spec;
}

}  // namespace kiln::pt2
