// `kiln bench`: load time, first run, median and minimum latency, peak RSS.
#include "commands.h"
#include "method_inputs.h"
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/core/error.h"
#include "kiln/cpu/config.h"
#include "kiln/cpu/quant.h"
#include "kiln/io/npy.h"
#include "kiln/runtime/program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions : TimedRunOptions {
  bool as_json = false;
  bool profile = false;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int run_bench(const BenchOptions& o) {
  check(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  check_threads(o.threads);
  auto t0 = Clock::now();
  auto program = load_program(o);
  auto method = load_method(program.value(), o, o.profile);
  rt::ErrorMessage err;
  auto t1 = Clock::now();
  rt::Method& m = method.value();

  // Inputs: the given .npy files, or zeros (valid token ids for language models).
  const MethodInputs inputs = method_inputs(m, o.inputs, o.file);
  auto run_once = [&] {
    set_method_inputs(m, inputs);
    auto a = Clock::now();
    if (m.execute(&err) != rt::Status::Ok) fail("{}: execution failed: {}", o.file, err.c_str());
    return ms_between(a, Clock::now());
  };
  double first_ms = run_once();
  for (int i = 1; i < o.warmup; ++i) run_once();
  m.enable_profiling(o.profile);
  std::vector<double> times;
  for (int i = 0; i < o.iters; ++i) times.push_back(run_once());
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                    : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  double load_ms = ms_between(t0, t1);

  // Profile: time per operator / backend, summed over the measured iterations.
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_label;  // label -> (calls, ns)
  // A delegate whose backend profiles its own steps is shown as those steps
  // ("XnnpackBackend: kiln batch matmul"), plus what the call spent outside them.
  if (o.profile)
    for (size_t i = 0; i < m.num_instructions(); ++i) {
      uint64_t calls = m.profile()[i].calls, ns = m.profile()[i].total_ns;
      int d = m.instruction_delegate(i);
      std::vector<rt::BackendProfileEntry> steps(d >= 0 ? 64 : 0);
      size_t n = d >= 0 ? m.delegate_profile(static_cast<size_t>(d), steps) : 0;
      for (size_t k = 0; k < std::min(n, steps.size()); ++k) {
        auto& e = by_label[fmt::format("{}: {}", m.instruction_label(i), steps[k].label)];
        e.first += steps[k].calls;
        e.second += steps[k].total_ns;
        ns -= std::min(ns, steps[k].total_ns);
      }
      auto& e = by_label[n ? fmt::format("{}: call overhead", m.instruction_label(i)) : std::string(m.instruction_label(i))];
      e.first += calls;
      e.second += ns;
    }

  if (o.as_json) {
    nlohmann::json j = {{"file", o.file},       {"threads", o.threads},      {"iters", o.iters},
                        {"load_ms", load_ms},   {"first_run_ms", first_ms},  {"median_ms", median},
                        {"min_ms", sorted[0]},  {"peak_rss_mb", peak_rss_mb()},
                        {"planned_mb", static_cast<double>(m.planned_bytes()) / 1e6},
                        {"instructions", m.num_instructions()}, {"times_ms", times},
                        {"isa", cpu::isa_name(cpu::active_isa())}, {"best_isa", cpu::isa_name(cpu::best_isa())}};
    // the variant each compute family selected (tests/python/test_aarch64.py checks them under qemu's CPU models)
    j["kernels"] = {{"f32_gemm", cpu::f32_gemm_config().name},     {"f32_gemv", cpu::f32_gemv_config().name},
                    {"f32_vunary", cpu::f32_vunary_config().name}, {"f32_vbinary", cpu::f32_vbinary_config().name},
                    {"f32_rows", cpu::f32_rows_config().name},     {"qd8_gemm", cpu::qd8_gemm_config().name}};
    if (o.profile) {
      nlohmann::json p = nlohmann::json::object();
      for (const auto& [label, e] : by_label)
        p[label] = {{"calls", e.first}, {"ms_per_run", static_cast<double>(e.second) / 1e6 / o.iters}};
      j["profile"] = p;
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("{}: {} instructions, {} thread(s), kernels for {} (the CPU's best: {}; KILN_CPU_ISA picks)\n", o.file,
             m.num_instructions(), o.threads, cpu::isa_name(cpu::active_isa()), cpu::isa_name(cpu::best_isa()));
  fmt::print("  load {:.1f} ms, first run {:.1f} ms, median {:.2f} ms, min {:.2f} ms over {} runs\n", load_ms, first_ms,
             median, sorted[0], o.iters);
  fmt::print("  peak RSS {:.1f} MB, planned memory {:.1f} MB\n", peak_rss_mb(), static_cast<double>(m.planned_bytes()) / 1e6);
  if (o.profile) {
    std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> rows(by_label.begin(), by_label.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    uint64_t total = 0;
    for (const auto& r : rows) total += r.second.second;
    fmt::print("  profile (per run):\n");
    for (const auto& [label, e] : rows)
      fmt::print("    {:>8.2f} ms {:5.1f}%  {:>4} calls  {}\n", static_cast<double>(e.second) / 1e6 / o.iters,
                 total ? 100.0 * static_cast<double>(e.second) / static_cast<double>(total) : 0.0, e.first / static_cast<uint64_t>(o.iters), label);
  }
  return 0;
}

}  // namespace

void add_bench_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_bench);
  cmd->add_option("file", opts->file, "the .pte program")->required()->check(CLI::ExistingFile);
  cmd->add_option("--input,-i", opts->inputs, "input tensors (.npy), one per method input (default: zeros)");
  cmd->add_option("--iters", opts->iters, "measured runs")->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "runs before measuring (the first is reported separately)")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "threads of the XNNPACK backend's pool (XNNPACK and kiln's own steps in it)")->capture_default_str();
  cmd->add_option("--engine", opts->engine,
                  "who runs XNNPACK delegates' nodes that both can: kiln (its GEMM/GEMV on the mapped weights, fused "
                  "elementwise rows) or xnnpack (Debian's XNNPACK for every node it has, weights packed at load)")
      ->check(CLI::IsMember({"kiln", "xnnpack"}))->capture_default_str();
  cmd->add_option("--method", opts->method, "method to run")->capture_default_str();
  cmd->add_flag("--profile", opts->profile, "time every instruction and report time per operator (inside XNNPACK delegates too: their subgraphs are then built per node)");
  cmd->add_flag("--json", opts->as_json, "print JSON (keys: load_ms, first_run_ms, median_ms, min_ms, peak_rss_mb, ...)");
}

}  // namespace kiln::cli
