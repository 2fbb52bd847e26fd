// The kiln CLI's subcommands. Each registers its options on the CLI11 app and
// runs through the libraries; main() turns any kiln::Error into one line.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kiln::cli {

// Adds `kiln inspect`; `run` is set to the action to take if it is chosen.
void add_inspect_command(CLI::App& app, std::function<int()>& run);

}  // namespace kiln::cli
