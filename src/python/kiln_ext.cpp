// kiln._kiln: the Python package's extension module (python/kiln/ wraps it).
// kiln's own libraries behind a thin nanobind layer: kiln::lower and kiln::write_lowered for
// lowering, rt::Program / rt::Method for running. No torch, no ExecuTorch: tensors arrive as
// DLPack / buffer-protocol arrays (numpy, torch, ...) through nanobind's ndarray.
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/compiler/lower.h"
#include "kiln/core/error.h"
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/llm/runner.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/pt2/model_spec.h"
#include "kiln/runtime/program.h"

#include <nlohmann/json.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;
namespace fs = std::filesystem;

namespace {

using kiln::ScalarType;

// ---- lowering ----

struct Lowered {
  kiln::LowerResult result;
};

kiln::pt2::ModelSpec spec_for_pt2(const std::string& pt2, const std::string& name, const std::string& model_id,
                                  int64_t seq_len) {
  std::error_code ec;
  kiln::check(fs::is_regular_file(pt2, ec), "{}: exported program not found", pt2);
  kiln::pt2::ModelSpec spec;
  spec.path = pt2;
  spec.directory = fs::absolute(fs::path(pt2)).parent_path().string();
  spec.name = name.empty() ? fs::path(pt2).stem().string() : name;
  kiln::check(!spec.name.empty() && spec.name.find('/') == std::string::npos && spec.name != "." && spec.name != "..",
              "name '{}': the model's name must be a file name", spec.name);
  spec.model_id = model_id;
  spec.seq_len = seq_len;
  spec.exported_program = fs::absolute(fs::path(pt2)).lexically_normal().string();
  return spec;
}

// kiln.lower of a torch.export.ExportedProgram: kiln read it from a private temporary .pt2 that is gone once
// lowered, so the metadata and the debug map name it by `source` (what the caller's program is) instead of
// that file's path. Both are kiln.lower's private files (the debug map is re-read by write_lowered, which
// builds the metadata from r.spec): rewritten in place, in the formats kiln::lower writes them.
void relabel_exported_program(kiln::LowerResult& r, const std::string& source) {
  using json = nlohmann::json;
  r.spec.exported_program = source;
  json meta = json::parse(r.metadata_json);
  meta["exported_program"] = source;
  r.metadata_json = meta.dump(2) + "\n";
  auto rewrite = [](const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    kiln::check(f.good(), "{}: cannot write", path);
  };
  rewrite(r.metadata_path, r.metadata_json);
  if (!r.debug_map_path.empty()) {
    std::ifstream in(r.debug_map_path);
    kiln::check(in.good(), "{}: cannot read the debug map", r.debug_map_path);
    json map = json::parse(in);
    in.close();
    map["exported_program"] = source;
    rewrite(r.debug_map_path, map.dump(1) + "\n");
  }
}

Lowered lower(const std::string& spec_path, const std::string& pt2_path, const std::string& name,
              const std::string& model_id, int64_t seq_len, const std::string& out, const std::string& backend,
              bool per_op, const std::string& quantize, const std::string& quantize_scales,
              const std::string& quantize_embedding, const std::string& quantize_skip, bool verify, bool debug_map,
              const nb::dict& constant_methods, const std::string& source) {
  kiln::check(backend == "portable" || backend == "xnnpack", "backend '{}': kiln lowers portable or xnnpack",
              backend);
  kiln::check(!per_op || backend == "xnnpack", "per_op applies to backend 'xnnpack' only");
  kiln::LowerOptions o;
  o.backend = backend == "xnnpack" ? kiln::LowerBackend::Xnnpack : kiln::LowerBackend::Portable;
  o.out = out;
  o.per_op = per_op;
  o.quantize = quantize;
  o.quantize_scales = quantize_scales;
  o.quantize_embedding = quantize_embedding;
  o.quantize_skip = quantize_skip;
  o.verify = verify;
  o.debug_map = debug_map;
  kiln::pt2::ModelSpec spec =
      spec_path.empty() ? spec_for_pt2(pt2_path, name, model_id, seq_len) : kiln::pt2::read_model_spec(spec_path);
  // {name: value or [values]}: methods that return constants (ExecuTorch's LLM runner reads get_max_seq_len ...)
  for (auto [key, value] : constant_methods) {
    kiln::pt2::ConstantMethod cm{nb::cast<std::string>(nb::str(key)), {}};
    auto add = [&](nb::handle v) {
      if (nb::isinstance<nb::bool_>(v)) cm.values.emplace_back(nb::cast<bool>(v));
      else if (nb::isinstance<nb::int_>(v)) cm.values.emplace_back(nb::cast<int64_t>(v));
      else if (nb::isinstance<nb::float_>(v)) cm.values.emplace_back(nb::cast<double>(v));
      else if (nb::isinstance<nb::str>(v)) cm.values.emplace_back(nb::cast<std::string>(v));
      else kiln::fail("constant method '{}' must return ints, floats, bools or strings", cm.name);
    };
    if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
      for (nb::handle v : value) add(v);
    } else {
      add(value);
    }
    std::erase_if(spec.constant_methods, [&](const auto& m) { return m.name == cm.name; });
    spec.constant_methods.push_back(std::move(cm));
  }
  nb::gil_scoped_release unlocked;  // lowering a large model takes seconds: other Python threads run meanwhile
  Lowered l{kiln::lower(spec, o)};
  if (!source.empty()) relabel_exported_program(l.result, source);
  return l;
}

// ---- running ----

ScalarType scalar_type_of(const nb::dlpack::dtype& d) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  kiln::check(d.lanes == 1, "an input of vector dtype (lanes {})", d.lanes);
  if (code == C::Float && d.bits == 32) return ScalarType::Float;
  if (code == C::Float && d.bits == 64) return ScalarType::Double;
  if (code == C::Float && d.bits == 16) return ScalarType::Half;
  if (code == C::Bfloat && d.bits == 16) return ScalarType::BFloat16;
  if (code == C::Int && d.bits == 64) return ScalarType::Long;
  if (code == C::Int && d.bits == 32) return ScalarType::Int;
  if (code == C::Int && d.bits == 16) return ScalarType::Short;
  if (code == C::Int && d.bits == 8) return ScalarType::Char;
  if (code == C::UInt && d.bits == 8) return ScalarType::Byte;
  if (code == C::Bool && d.bits == 8) return ScalarType::Bool;
  if (code == C::Complex && d.bits == 64) return ScalarType::ComplexFloat;
  if (code == C::Complex && d.bits == 128) return ScalarType::ComplexDouble;
  kiln::fail("an input of dtype code {} with {} bits: kiln takes float, int, uint8, bool and complex tensors", d.code,
             d.bits);
}

nb::dlpack::dtype dlpack_of(ScalarType t) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C c, int bits) {
    nb::dlpack::dtype d;
    d.code = static_cast<uint8_t>(c);
    d.bits = static_cast<uint8_t>(bits);
    d.lanes = 1;
    return d;
  };
  switch (t) {
    case ScalarType::Float: return make(C::Float, 32);
    case ScalarType::Double: return make(C::Float, 64);
    case ScalarType::Half: return make(C::Float, 16);
    case ScalarType::BFloat16: return make(C::Bfloat, 16);
    case ScalarType::Long: return make(C::Int, 64);
    case ScalarType::Int: return make(C::Int, 32);
    case ScalarType::Short: return make(C::Int, 16);
    case ScalarType::Char: return make(C::Int, 8);
    case ScalarType::Byte: return make(C::UInt, 8);
    case ScalarType::Bool: return make(C::Bool, 8);
    case ScalarType::ComplexFloat: return make(C::Complex, 64);
    case ScalarType::ComplexDouble: return make(C::Complex, 128);
    default: kiln::fail("an output of dtype {}: the Python package returns float, int, uint8, bool and complex tensors",
                        kiln::dtype_name(t));
  }
}

using InputArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

// One prepared method of a loaded program; its state (mutable buffers) lives as long as it does.
struct MethodHandle {
  std::shared_ptr<kiln::rt::Program> program;  // the mapped file the method reads
  kiln::rt::Method method;
  std::vector<uintptr_t> last_input_data;  // what the method's inputs pointed at in the last call
  std::vector<bool> last_shared;           // which inputs were read in place (no copy)
};

struct Loaded {
  Loaded() = default;
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;
  std::shared_ptr<kiln::rt::Program> program;
  size_t threads = 1;
  std::string engine;
  bool share_inputs = true;
  std::map<std::string, std::unique_ptr<MethodHandle>> methods;
};

// kiln.load's and kiln.generate's threads and engine, checked, and the XNNPACK backend registered.
void check_backend(size_t threads, const std::string& engine) {
  kiln::check(engine == "kiln" || engine == "xnnpack", "engine '{}': kiln's XNNPACK backend has the engines kiln "
              "and xnnpack", engine);
  kiln::check(threads >= 1, "threads must be at least 1");
  kiln::check(kiln::backends::xnnpack::register_runtime_backend(), "the XNNPACK backend cannot be initialized "
              "on this CPU");
}

Loaded* load(const std::string& path, size_t threads, const std::string& engine, bool share_inputs) {
  check_backend(threads, engine);
  kiln::rt::ErrorMessage err;
  auto p = kiln::rt::Program::load(path.c_str(), &err);
  kiln::check(p.ok(), "{}", err.c_str());
  auto* l = new Loaded;
  l->program = std::make_shared<kiln::rt::Program>(std::move(p.value()));
  l->threads = threads;
  l->engine = engine;
  l->share_inputs = share_inputs;
  return l;
}

MethodHandle& method_of(Loaded& l, const std::string& name) {
  auto it = l.methods.find(name);
  if (it != l.methods.end()) return *it->second;
  kiln::rt::MethodOptions mo;
  mo.backend.threads = l.threads;
  mo.backend.engine = l.engine.c_str();
  kiln::rt::ErrorMessage err;
  auto m = l.program->load_method(name.c_str(), mo, &err);
  kiln::check(m.ok(), "method '{}': {}", name, err.c_str());
  auto h = std::unique_ptr<MethodHandle>(new MethodHandle{l.program, std::move(m.value()), {}, {}});
  return *l.methods.emplace(name, std::move(h)).first->second;
}

nb::object output_object(const kiln::rt::EValue& v) {
  using T = kiln::rt::EValue::Tag;
  switch (v.tag) {
    case T::Int: return nb::int_(v.to_int());
    case T::Double: return nb::float_(v.to_double());
    case T::Bool: return nb::bool_(v.to_bool());
    case T::None: return nb::none();
    case T::String: return nb::str(v.str.data(), v.str.size());
    case T::Tensor: {
      const kiln::rt::Tensor& t = v.tensor();
      kiln::check(t.is_contiguous(), "an output in a non-contiguous dim order");
      const size_t bytes = t.nbytes();
      auto* copy = new std::byte[bytes > 0 ? bytes : 1];
      if (bytes) std::memcpy(copy, t.data, bytes);
      nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<std::byte*>(p); });
      std::vector<size_t> shape(t.shape().begin(), t.shape().end());
      return nb::ndarray<nb::numpy>(copy, shape.size(), shape.data(), owner, nullptr, dlpack_of(t.dtype)).cast();
    }
    default: kiln::fail("an output that is a list: the Python package returns tensors and scalars");
  }
}

// Runs `name` on `inputs`: each is read in place where the program allows it (Method::share_input),
// copied otherwise. Outputs are copied into new numpy arrays (the method's memory is reused next call).
nb::list call(Loaded& l, const std::string& name, std::vector<InputArray> inputs) {
  MethodHandle& h = method_of(l, name);
  kiln::rt::Method& m = h.method;
  kiln::check(inputs.size() == m.num_inputs(), "method '{}' takes {} input{}, {} given", name, m.num_inputs(),
              m.num_inputs() == 1 ? "" : "s", inputs.size());
  kiln::rt::ErrorMessage err;
  h.last_input_data.assign(inputs.size(), 0);
  h.last_shared.assign(inputs.size(), false);
  struct Unshare {
    kiln::rt::Method& m;
    ~Unshare() { m.unshare_inputs(); }  // no pointer into the caller's arrays outlives the call
  } unshare{m};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputArray& a = inputs[i];
    const kiln::rt::Tensor& slot = m.input(i);
    const ScalarType dt = scalar_type_of(a.dtype());
    kiln::check(dt == slot.dtype, "method '{}' input {}: dtype {} given, the program takes {}", name, i,
                kiln::dtype_name(dt), kiln::dtype_name(slot.dtype));
    std::vector<int64_t> shape(a.ndim());
    for (size_t d = 0; d < a.ndim(); ++d) shape[d] = static_cast<int64_t>(a.shape(d));
    const size_t bytes = a.nbytes();
    bool shared = false;
    kiln::rt::Status s = l.share_inputs ? m.share_input(i, a.data(), bytes, shape, &shared, &err)
                                        : m.set_input(i, a.data(), bytes, shape, &err);
    kiln::check(s == kiln::rt::Status::Ok, "method '{}' input {}: {}", name, i, err.c_str());
    h.last_input_data[i] = reinterpret_cast<uintptr_t>(m.input(i).data);
    h.last_shared[i] = shared;
  }
  kiln::rt::Status s = kiln::rt::Status::Ok;
  {
    nb::gil_scoped_release unlocked;  // the inputs stay referenced by `inputs` meanwhile
    s = m.execute(&err);
  }
  kiln::check(s == kiln::rt::Status::Ok, "method '{}': {}", name, err.c_str());
  nb::list out;
  for (size_t k = 0; k < m.num_outputs(); ++k) out.append(output_object(m.output_value(k)));
  return out;
}

// ---- text generation ----

std::unique_ptr<kiln::tok::Tokenizer> load_tokenizer(const std::string& path) {
  std::string err;
  auto t = kiln::tok::Tokenizer::load(path, &err);
  kiln::check(t != nullptr, "{}", err);
  return t;
}

std::unique_ptr<kiln::llm::Runner> load_runner(const std::string& pte, size_t threads, const std::string& engine) {
  check_backend(threads, engine);
  kiln::rt::MethodOptions mo;
  mo.backend.threads = threads;
  mo.backend.engine = engine.c_str();
  std::string err;
  auto r = kiln::llm::Runner::load(pte, mo, &err);
  kiln::check(r != nullptr, "{}", err);
  return r;
}

// Feeds `tokens`; the last position's logits as a new float32 array.
nb::object feed(kiln::llm::Runner& r, const std::vector<int32_t>& tokens) {
  std::span<const float> logits;
  std::string err;
  bool ok;
  {
    nb::gil_scoped_release unlocked;
    ok = r.feed(tokens, &logits, &err);
  }
  kiln::check(ok, "{}", err);
  auto* copy = new float[logits.size() > 0 ? logits.size() : 1];
  std::memcpy(copy, logits.data(), logits.size_bytes());
  nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  size_t shape[1] = {logits.size()};
  return nb::ndarray<nb::numpy, float>(copy, 1, shape, owner).cast();
}

}  // namespace

NB_MODULE(_kiln, mod) {
  mod.doc() = "kiln's C++ libraries (lowering, runtime) for the Python package `kiln`";
  nb::exception<kiln::Error>(mod, "Error");

  nb::class_<Lowered>(mod, "_Lowered")
      .def_prop_ro("pte_path", [](const Lowered& l) { return l.result.pte_path; })
      .def_prop_ro("metadata_path", [](const Lowered& l) { return l.result.metadata_path; })
      .def_prop_ro("debug_map_path", [](const Lowered& l) { return l.result.debug_map_path; })
      .def_prop_ro("metadata_json", [](const Lowered& l) { return l.result.metadata_json; })
      .def_prop_ro("warnings", [](const Lowered& l) { return l.result.warnings; })
      .def("write", [](const Lowered& l, const std::string& out) { return Lowered{kiln::write_lowered(l.result, out)}; });
  mod.def("lower", &lower, nb::arg("spec_path"), nb::arg("pt2_path"), nb::arg("name"), nb::arg("model_id"),
          nb::arg("seq_len"), nb::arg("out"), nb::arg("backend"), nb::arg("per_op"), nb::arg("quantize"),
          nb::arg("quantize_scales"), nb::arg("quantize_embedding"), nb::arg("quantize_skip"), nb::arg("verify"),
          nb::arg("debug_map"), nb::arg("constant_methods"), nb::arg("source"));

  nb::class_<Loaded>(mod, "_Program")
      .def("method_names",
           [](const Loaded& l) {
             std::vector<std::string> names;
             const auto* plans = l.program->file().program().execution_plan();
             if (plans != nullptr)
               for (const auto* plan : *plans)
                 if (plan->name() != nullptr) names.emplace_back(plan->name()->str());
             return names;
           })
      .def("num_inputs", [](Loaded& l, const std::string& name) { return method_of(l, name).method.num_inputs(); })
      .def("call", &call)
      .def("last_input_data", [](Loaded& l, const std::string& name) { return method_of(l, name).last_input_data; })
      .def("last_shared", [](Loaded& l, const std::string& name) {
        nb::list shared;
        for (bool b : method_of(l, name).last_shared) shared.append(nb::bool_(b));
        return shared;
      });
  nb::class_<kiln::tok::Tokenizer>(mod, "_Tokenizer")
      .def("encode",
           [](const kiln::tok::Tokenizer& t, const std::string& text, bool special) {
             std::vector<int32_t> ids;
             std::string err;
             kiln::check(t.encode(text, &ids, &err, special), "{}", err);
             return ids;
           })
      .def("decode", [](const kiln::tok::Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
        const std::string text = t.decode(ids, skip_special);
        return nb::bytes(text.data(), text.size());
      })
      .def_prop_ro("vocab_size", &kiln::tok::Tokenizer::vocab_size)
      .def_prop_ro("bos_id", &kiln::tok::Tokenizer::bos_id)
      .def_prop_ro("eos_id", &kiln::tok::Tokenizer::eos_id)
      .def("is_special", &kiln::tok::Tokenizer::is_special);
  mod.def("load_tokenizer", &load_tokenizer);
  nb::class_<kiln::llm::Runner>(mod, "_Runner")
      .def("feed", &feed)
      .def("reset", &kiln::llm::Runner::reset)
      .def_prop_ro("position", &kiln::llm::Runner::position)
      .def_prop_ro("max_seq_len", [](const kiln::llm::Runner& r) { return r.metadata().max_seq_len; })
      .def_prop_ro("eos_ids", [](const kiln::llm::Runner& r) { return r.metadata().eos; })
      .def_prop_ro("bos_id", [](const kiln::llm::Runner& r) { return r.metadata().bos; });
  mod.def("load_runner", &load_runner);
  mod.def("load", &load, nb::arg("path"), nb::arg("threads"), nb::arg("engine"), nb::arg("share_inputs"),
          nb::rv_policy::take_ownership);
}
