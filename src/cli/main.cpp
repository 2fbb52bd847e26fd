// kiln: lower torch.export programs (.pt2) to ExecuTorch programs (.pte) and run them.
#include "commands.h"
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/core/error.h"
#include "kiln/cpu/config.h"
#include "kiln/cpu/quant.h"

#include <cstdio>
#include <exception>
#include <new>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"kiln: lower PyTorch exported programs (.pt2) to ExecuTorch programs (.pte) and run them on CPUs",
               "kiln"};
  app.require_subcommand(1);
  // the version and the kernels this process selects (a test log says where it ran: scripts/test prints it)
  app.set_version_flag("--version", [] {
    namespace cpu = kiln::cpu;
    return std::string("kiln 0.1.0 (kernels for ") + cpu::isa_name(cpu::active_isa()) + ", the CPU's best: " +
           cpu::isa_name(cpu::best_isa()) + ", KILN_CPU_ISA picks; qd8-gemm " + cpu::qd8_gemm_config().name + ")";
  });
  std::function<int()> run;
  kiln::cli::add_lower_command(app, run);
  kiln::cli::add_inspect_command(app, run);
  kiln::cli::add_run_command(app, run);
  kiln::cli::add_bench_command(app, run);
  kiln::cli::add_tokenize_command(app, run);
  kiln::cli::add_generate_command(app, run);
  kiln::cli::add_profile_command(app, run);
  kiln::cli::add_bench_llm_command(app, run);
  kiln::cli::add_view_command(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: internal: %s\n", e.what());
  }
  return 1;
}
