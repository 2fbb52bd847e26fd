// The kiln CLI's subcommands. Each registers its options on the CLI11 app and
// runs through the libraries; main() turns any kiln::Error into one line.
#pragma once

#include "kiln/backends/xnnpack/runtime.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cli {

// --threads, for every command (run, bench, generate, profile, bench-llm): one rule, checked here.
// From 1 to the larger of kMinThreadsCap and the machine's hardware threads: more threads than
// cores only slow a pool down, and --threads 20000 would start 20,000 threads.
inline constexpr unsigned kMinThreadsCap = 256;
int max_threads();
// Throws kiln::Error ("--threads N: thread counts go from 1 to ...") outside that range.
void check_threads(int64_t threads, std::string_view flag = "--threads");

// Peak resident memory of this process so far, in MB (bench, generate).
double peak_rss_mb();

// What `kiln bench` and `kiln profile` run and how often: the .pte, its method and inputs (.npy),
// warm-up and measured runs, the XNNPACK backend's threads and engine.
struct TimedRunOptions {
  std::string file;
  std::string method = "forward";
  std::vector<std::string> inputs;
  int iters = 10;
  int warmup = 1;
  int threads = 1;
  std::string engine = "kiln";
};

// Adds the subcommand `name` whose options fill an `Options` (shared with CLI11's bindings): when it
// is chosen, `run` is set to `body(options)`. Returns the subcommand (to add options to) and them.
template <class Options>
std::pair<CLI::App*, std::shared_ptr<Options>> add_command(CLI::App& app, std::function<int()>& run,
                                                           int (*body)(const Options&), const std::string& name,
                                                           const std::string& help) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->callback([options, body, &run] { run = [options, body] { return body(*options); }; });
  return {cmd, options};
}

// Adds `kiln inspect`; `run` is set to the action to take if it is chosen.
void add_inspect_command(CLI::App& app, std::function<int()>& run);
// `kiln inspect FILE.pte`: prints what a .pte program holds (as JSON if asked);
// returns the exit status. Throws kiln::Error if the file does not load.
int inspect_pte(const std::string& path, bool as_json);
// Adds `kiln bench`.
void add_bench_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln run`.
void add_run_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln lower`.
void add_lower_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln generate`.
void add_generate_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln tokenize`.
void add_tokenize_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln profile`.
void add_profile_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln bench-llm`.
void add_bench_llm_command(CLI::App& app, std::function<int()>& run);
// Adds `kiln view`.
void add_view_command(CLI::App& app, std::function<int()>& run);

}  // namespace kiln::cli
