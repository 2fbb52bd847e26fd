// `kiln run`: execute a .pte with kiln's runtime on .npy inputs.
#include "commands.h"
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/core/error.h"
#include "kiln/core/output_file.h"
#include "kiln/io/npy.h"
#include "kiln/runtime/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace kiln::cli {
namespace {

constexpr std::string_view kKeep = "keep";  // --input keep: leave the input as it is

using Clock = std::chrono::steady_clock;

struct RunOptions {
  std::string file;
  std::string method = "forward";
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> compare;
  int threads = 1;
  std::string engine = "kiln";
  int steps = 1;  // input sets run one after another in one method (its state kept between them)
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double element_as_double(const void* data, ScalarType dtype, int64_t i) {
  switch (dtype) {
    case ScalarType::Float: return static_cast<const float*>(data)[i];
    case ScalarType::Double: return static_cast<const double*>(data)[i];
    case ScalarType::Long: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case ScalarType::Int: return static_cast<const int32_t*>(data)[i];
    case ScalarType::Short: return static_cast<const int16_t*>(data)[i];
    case ScalarType::Char: return static_cast<const int8_t*>(data)[i];
    case ScalarType::Byte: return static_cast<const uint8_t*>(data)[i];
    case ScalarType::Bool: return static_cast<const bool*>(data)[i] ? 1.0 : 0.0;
    default: fail("--compare: dtype {} is not supported", dtype_name(dtype));
  }
}

std::string shape_str(std::span<const int64_t> s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int run_run(const RunOptions& o) {
  check_threads(o.threads);
  auto t0 = Clock::now();
  rt::ErrorMessage err;
  auto program = rt::Program::load(o.file.c_str(), &err);
  if (!program.ok()) fail("{}: {} ({})", o.file, err.c_str(), rt::status_name(program.status()));
  rt::MethodOptions mo;
  mo.backend.threads = static_cast<size_t>(o.threads);
  mo.backend.engine = o.engine.c_str();
  auto method = program->load_method(o.method.c_str(), mo, &err);
  if (!method.ok()) fail("{}: method '{}': {} ({})", o.file, o.method, err.c_str(), rt::status_name(method.status()));
  double load_ms = ms_since(t0);
  rt::Method& m = method.value();

  check(o.steps >= 1, "--steps must be >= 1");
  const auto steps = static_cast<size_t>(o.steps);
  check(o.inputs.size() == m.num_inputs() * steps, "{}: method '{}' takes {} input(s), {} given with --input for {} step(s)",
        o.file, o.method, m.num_inputs(), o.inputs.size(), steps);
  check(o.outputs.size() <= m.num_outputs() * steps, "{}: {} --output given for {} output(s) x {} step(s)", o.file,
        o.outputs.size(), m.num_outputs(), steps);
  std::vector<io::NpyArray> inputs;  // "keep": not set (the method's tensor as the last step left it)
  for (const auto& f : o.inputs) inputs.push_back(f == kKeep ? io::NpyArray{} : io::read_npy(f));
  double exec_ms = 0;
  // Every --output is staged as it is computed and published once the whole run has succeeded:
  // a later step's failure leaves no earlier step's files (kiln/core/output_file.h).
  std::vector<std::unique_ptr<StagedFile>> staged;
  auto stage_output = [&](const std::string& path, const rt::Tensor& t) {
    staged.push_back(std::make_unique<StagedFile>(path));
    io::write_npy(*staged.back(), t.dtype, t.shape(),
                  std::span<const std::byte>(static_cast<const std::byte*>(t.data), t.nbytes()));
  };
  // Steps before the last: run, stage their outputs (--output lists them step by step), keep the state.
  for (size_t k = 0; k < steps; ++k) {
    for (size_t i = 0; i < m.num_inputs(); ++i) {
      const size_t f = k * m.num_inputs() + i;
      if (o.inputs[f] == kKeep) continue;
      auto& a = inputs[f];
      const rt::Tensor& t = m.input(i);
      io::float_to_bfloat16(a, t.dtype);  // NumPy has no bfloat16: a float32 file, rounded as torch rounds
      // A dynamic (DYNAMIC_BOUND) input takes any shape within its bound: set_input checks it.
      check(a.dtype == t.dtype && (m.input_is_dynamic(i) || t.same_shape(a.shape)),
            "--input {}: {}{} given, input {} expects {}{}", o.inputs[f], dtype_name(a.dtype), shape_str(a.shape), i,
            dtype_name(t.dtype), shape_str(t.shape()));
      if (m.set_input(i, a.data.data(), a.data.size(), a.shape, &err) != rt::Status::Ok)
        fail("--input {}: {}", o.inputs[f], err.c_str());
    }
    auto t1 = Clock::now();
    if (m.execute(&err) != rt::Status::Ok)
      fail("{}: execution failed{}: {}", o.file, steps > 1 ? fmt::format(" at step {}", k) : "", err.c_str());
    exec_ms += ms_since(t1);
    if (k + 1 == steps) break;
    for (size_t i = 0; i < m.num_outputs(); ++i) {
      const size_t f = k * m.num_outputs() + i;
      if (f >= o.outputs.size() || !m.output_is_tensor(i)) continue;
      stage_output(o.outputs[f], m.output(i));
    }
  }
  std::vector<std::string> last_outputs;
  for (size_t f = (steps - 1) * m.num_outputs(); f < o.outputs.size(); ++f) last_outputs.push_back(o.outputs[f]);

  fmt::print("{}: loaded in {:.1f} ms ({:.1f} MB planned memory), executed in {:.1f} ms\n", o.file, load_ms,
             static_cast<double>(m.planned_bytes()) / 1e6, exec_ms);
  check(o.compare.size() <= m.num_outputs(), "{}: {} --compare given for {} output(s)", o.file, o.compare.size(),
        m.num_outputs());
  int status = 0;
  for (size_t i = 0; i < m.num_outputs(); ++i) {
    if (!m.output_is_tensor(i)) {  // a constant method's value
      const rt::EValue& v = m.output_value(i);
      check(i >= last_outputs.size() && i >= o.compare.size(), "output {} is a {} value, not a tensor (no --output or "
            "--compare for it)", i, v.tag == rt::EValue::Tag::Int ? "an int" : v.tag == rt::EValue::Tag::Bool ? "a bool" : "a double");
      if (v.tag == rt::EValue::Tag::Int) fmt::print("  output {}: int {}\n", i, v.to_int());
      else if (v.tag == rt::EValue::Tag::Bool) fmt::print("  output {}: bool {}\n", i, v.to_bool() ? "true" : "false");
      else fmt::print("  output {}: double {}\n", i, v.to_double());
      continue;
    }
    const rt::Tensor& t = m.output(i);
    fmt::print("  output {}: {}{}\n", i, dtype_name(t.dtype), shape_str(t.shape()));
    if (i < last_outputs.size()) {
      stage_output(last_outputs[i], t);
      fmt::print("    wrote {}\n", last_outputs[i]);
    }
    if (i < o.compare.size()) {
      io::NpyArray ref = io::read_npy(o.compare[i]);
      check(t.same_shape(ref.shape), "--compare {}: shape {} differs from the output's {}", o.compare[i],
            shape_str(ref.shape), shape_str(t.shape()));
      double max_abs = 0, max_ref = 0;
      for (int64_t k = 0; k < t.numel; ++k) {
        double a = element_as_double(t.data, t.dtype, k), b = element_as_double(ref.data.data(), ref.dtype, k);
        double d = std::fabs(a - b);
        if (std::isnan(d)) d = INFINITY;
        max_abs = std::max(max_abs, d);
        max_ref = std::max(max_ref, std::fabs(b));
      }
      double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
      fmt::print("    vs {}: max |diff| {:.3g}, max |diff| / max |ref| {:.3g}\n", o.compare[i], max_abs, rel);
    }
  }
  std::vector<StagedFile*> files;
  for (auto& f : staged) files.push_back(f.get());
  publish_together(files);
  return status;
}

}  // namespace

void add_run_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_run);
  cmd->add_option("file", opts->file, "the .pte program")->required()->check(CLI::ExistingFile);
  cmd->add_option("--input,-i", opts->inputs, "input tensor (.npy), once per method input, in order (a bfloat16 input takes a float32 file, rounded to nearest even; a bfloat16 output is written as float32, exactly)");
  cmd->add_option("--output,-o", opts->outputs, "where to write output tensors (.npy), in order");
  cmd->add_option("--compare", opts->compare, "reference outputs (.npy) to report max abs/rel difference against");
  cmd->add_option("--engine", opts->engine,
                  "who runs XNNPACK delegates' nodes that both can: kiln (its GEMM/GEMV on the mapped weights, fused "
                  "elementwise rows) or xnnpack (Debian's XNNPACK for every node it has, weights packed at load)")
      ->check(CLI::IsMember({"kiln", "xnnpack"}))->capture_default_str();
  cmd->add_option("--method", opts->method, "method to run")->capture_default_str();
  cmd->add_option("--steps", opts->steps,
                  "run N input sets one after another in the same method, keeping its state (a KV cache) between "
                  "them: --input lists N x inputs in step order, --output N x outputs; --compare checks the last step. "
                  "An --input of 'keep' leaves that input as the previous step left it (zeros at the first): a cache "
                  "the program updates in place, passed as an input")
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads, "threads of the XNNPACK backend's pool")->capture_default_str();
}

}  // namespace kiln::cli
