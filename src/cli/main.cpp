// kiln: lower torch.export programs (.pt2) to ExecuTorch programs (.pte) and run them.
#include "commands.h"
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/core/error.h"
#include "kiln/cpu/config.h"
#include "kiln/cpu/quant.h"

#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <exception>
#include <new>
#include <string>

namespace kiln::cli {

int max_threads() {
  return static_cast<int>(std::max<unsigned>(kMinThreadsCap, std::thread::hardware_concurrency()));
}

void check_threads(int64_t threads, std::string_view flag) {
  check(threads >= 1 && threads <= max_threads(),
        "{} {}: thread counts go from 1 to {} (the larger of {} and this machine's {} hardware threads)", flag,
        threads, max_threads(), kMinThreadsCap, std::thread::hardware_concurrency());
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  CLI::App app{"kiln: lower PyTorch exported programs (.pt2) to ExecuTorch programs (.pte) and run them on CPUs",
               "kiln"};
  app.require_subcommand(1);
  // the version and the kernels this process selects (a test log says where it ran: scripts/test prints it)
  app.set_version_flag("--version", [] {
    namespace cpu = kiln::cpu;
    return std::string("kiln 0.1.0 (kernels for ") + cpu::isa_name(cpu::active_isa()) + ", the CPU's best: " +
           cpu::isa_name(cpu::best_isa()) + ", KILN_CPU_ISA picks; f32-gemm " + cpu::f32_gemm_config().name +
           ", 512-bit FMA pipes " + std::to_string(cpu::cpu_fma512_pipes()) + "; f32-gemv " +
           cpu::f32_gemv_config().name + "; qd8-gemm " +
           cpu::qd8_gemm_config().name + ")";
  });
  std::function<int()> run;
#define KILN_COMMAND(id, name, help) kiln::cli::add_##id##_options(app.add_subcommand(name, help), run);
#include "commands.def"
#undef KILN_COMMAND
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0; a usage error is one line and exit 1, like every error
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n' || c == '\r') c = ' ';
    while (!what.empty() && what.back() == ' ') what.pop_back();
    std::fprintf(stderr, "kiln: error: %s (kiln --help lists the commands and their options)\n", what.c_str());
    return 1;
  }
  // kiln's runtime backends (run and bench pass --threads/--engine per method, rt::MethodOptions)
  if (!kiln::backends::xnnpack::register_runtime_backend())
    std::fprintf(stderr, "kiln: warning: XNNPACK cannot run on this CPU; delegated programs will not load\n");
  try {
    return run ? run() : 2;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kiln: error: out of memory\n");
  } catch (const nlohmann::json::exception& e) {  // a JSON input (a profile, a debug map) of the wrong shape
    std::fprintf(stderr, "kiln: error: a JSON input is not of the form kiln reads: %s\n", e.what());
  } catch (const std::exception& e) {  // a library's exception kiln did not turn into its own: one line still
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n' || c == '\r') c = ' ';
    std::fprintf(stderr, "kiln: error: internal: %s\n", what.c_str());
  } catch (...) {
    std::fprintf(stderr, "kiln: error: internal: unknown exception\n");
  }
  return 1;
}
