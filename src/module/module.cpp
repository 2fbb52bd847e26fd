// kiln::Module (kiln/runtime/module.h): Program + Method behind one object.
#include "kiln/runtime/module.h"

#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/runtime/backend.h"

#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

namespace kiln {

struct Module::Impl {
  std::string path;
  ModuleOptions options;
  std::optional<rt::Program> program;
  std::optional<rt::Method> method;
  std::vector<TensorView> outputs;
  rt::ErrorMessage error;
};

Module::Module(std::string path, ModuleOptions options) : impl_(new (std::nothrow) Impl) {
  if (impl_) {
    impl_->path = std::move(path);
    impl_->options = std::move(options);
  }
}

Module::Module(Module&&) noexcept = default;
Module& Module::operator=(Module&&) noexcept = default;
Module::~Module() = default;

bool Module::is_loaded() const { return impl_ && impl_->method.has_value(); }

Status Module::load() {
  if (!impl_) return Status::OutOfMemory;
  Impl& m = *impl_;
  if (m.method) return Status::Ok;
  const ModuleOptions& o = m.options;
  if (o.engine != "kiln" && o.engine != "xnnpack") {
    m.error.set("engine '%.40s': kiln's XNNPACK backend has the engines kiln and xnnpack", o.engine.c_str());
    return Status::InvalidArgument;
  }
  if (o.threads == 0) {
    m.error.set("threads must be at least 1");
    return Status::InvalidArgument;
  }
  if (!backends::xnnpack::register_runtime_backend()) {
    m.error.set("the XNNPACK backend cannot be initialized on this CPU");
    return Status::NotSupported;
  }
  if (!m.program) {
    Result<rt::Program> p = rt::Program::load(m.path.c_str(), &m.error);
    if (!p.ok()) return p.status();
    m.program.emplace(std::move(p.value()));
  }
  rt::MethodOptions mo;
  mo.backend.threads = o.threads;
  mo.backend.engine = o.engine.c_str();
  mo.profiling = o.profiling;
  Result<rt::Method> method = m.program->load_method(o.method.c_str(), mo, &m.error);
  if (!method.ok()) return method.status();
  m.method.emplace(std::move(method.value()));
  return Status::Ok;
}

size_t Module::num_inputs() const { return is_loaded() ? impl_->method->num_inputs() : 0; }

Result<TensorView> Module::input_meta(size_t i) const {
  if (!is_loaded()) return Status::InvalidArgument;
  if (i >= impl_->method->num_inputs()) return Status::OutOfRange;
  const rt::Tensor& t = impl_->method->input(i);
  return TensorView{t.dtype, t.shape(), nullptr};
}

rt::Method& Module::method() { return *impl_->method; }

const char* Module::error_message() const { return impl_ ? impl_->error.c_str() : "out of memory"; }

Result<std::vector<TensorView>> Module::forward(std::span<const TensorView> inputs) {
  if (Status s = load(); s != Status::Ok) return s;
  Impl& m = *impl_;
  rt::Method& method = *m.method;
  if (inputs.size() != method.num_inputs()) {
    m.error.set("method '%.64s' takes %zu inputs, %zu given", method.name(), method.num_inputs(), inputs.size());
    return Status::InvalidArgument;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const rt::Tensor& t = method.input(i);
    if (inputs[i].dtype != t.dtype || (!method.input_is_dynamic(i) && !t.same_shape(inputs[i].shape))) {
      m.error.set("input %zu: dtype or shape differs from the program's (%.20s, rank %d)", i,
                  std::string(dtype_name(t.dtype)).c_str(), t.dim);
      return Status::InvalidArgument;
    }
    if (inputs[i].data == nullptr && inputs[i].nbytes() > 0) {
      m.error.set("input %zu has no data", i);
      return Status::InvalidArgument;
    }
    if (Status s = method.set_input(i, inputs[i].data, inputs[i].nbytes(), inputs[i].shape, &m.error); s != Status::Ok)
      return s;
  }
  if (Status s = method.execute(&m.error); s != Status::Ok) return s;
  std::vector<TensorView> out;
  out.reserve(method.num_outputs());
  for (size_t i = 0; i < method.num_outputs(); ++i) {
    if (!method.output_is_tensor(i)) {
      m.error.set("output %zu is not a tensor (a constant method's value)", i);
      return Status::InvalidArgument;
    }
    const rt::Tensor& t = method.output(i);
    out.push_back(TensorView{t.dtype, t.shape(), t.data});
  }
  return out;
}

}  // namespace kiln
