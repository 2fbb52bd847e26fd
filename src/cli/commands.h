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

// Makes the subcommand `cmd` set `run` to `body(options)` when it is chosen. Returns the options, for CLI11's
// bindings to fill.
template <class Options>
std::shared_ptr<Options> bind_action(CLI::App* cmd, std::function<int()>& run, int (*body)(const Options&)) {
  auto options = std::make_shared<Options>();
  cmd->callback([options, body, &run] { run = [options, body] { return body(*options); }; });
  return options;
}

// void add_<id>_options(CLI::App* cmd, std::function<int()>& run) for each command in commands.def
#define KILN_COMMAND(id, name, help) void add_##id##_options(CLI::App* cmd, std::function<int()>& run);
#include "commands.def"
#undef KILN_COMMAND

// `kiln inspect FILE.pte`: prints what a .pte program holds (as JSON if asked);
// returns the exit status. Throws kiln::Error if the file does not load.
int inspect_pte(const std::string& path, bool as_json);

}  // namespace kiln::cli
