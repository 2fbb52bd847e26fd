// `kiln view FILE.pte|FILE.pt2 [--profile P.json] [-o graph.html] [--model-explorer graph.json]`
// `kiln view --compare A.pte B.pte [-o diff.html]`: the graph as one self-contained
// HTML page (kiln/view/graph_view.h does the work; this file parses flags and prints).
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/view/graph_view.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

struct ViewOptions {
  std::string file;
  std::string profile;
  std::string out;
  std::string model_explorer;
  std::vector<std::string> compare;
};

std::string beside(const std::string& path, const std::string& suffix) {
  fs::path p(path);
  return (p.parent_path() / (p.stem().string() + suffix)).string();
}

void summary(const std::string& out, const view::ViewGraph& g) {
  fmt::print("{}: {} ({} nodes, {} delegate region{} holding {} backend nodes, {} kernel calls{})\n", out, g.title,
             g.nodes.size(), g.delegate_regions, g.delegate_regions == 1 ? "" : "s", g.backend_nodes, g.kernel_calls,
             g.delegate_regions ? fmt::format(", {} fallback operators", g.fallback_ops) : std::string());
}

int run_view(const ViewOptions& o) {
  if (!o.compare.empty()) {
    if (!o.file.empty()) fail("view: give either FILE or --compare A B, not both");
    if (!o.model_explorer.empty() || !o.profile.empty()) fail("view: --compare takes no --profile or --model-explorer");
    view::ViewGraph a = view::read_graph(o.compare[0]);
    view::ViewGraph b = view::read_graph(o.compare[1]);
    std::string html = view::render_compare_html(a, b);
    std::string out = o.out.empty() ? beside(o.compare[0], ".compare.html") : o.out;
    view::write_file_atomically(out, html);
    summary(out, a);
    summary(out, b);
    return 0;
  }
  if (o.file.empty()) fail("view: give a .pte or .pt2 file (or --compare A B)");
  view::ViewGraph g = view::read_graph(o.file);
  if (!o.profile.empty()) view::attach_profile(g, o.profile);
  // everything is rendered before anything is written
  std::string html, me;
  const bool want_html = !o.out.empty() || o.model_explorer.empty();
  if (want_html) html = view::render_html(g);
  if (!o.model_explorer.empty()) me = view::model_explorer_json(g);
  std::string out = o.out.empty() ? beside(o.file, ".html") : o.out;
  if (want_html) {
    view::write_file_atomically(out, html);
    summary(out, g);
  }
  if (!o.model_explorer.empty()) {
    view::write_file_atomically(o.model_explorer, me);
    summary(o.model_explorer, g);
  }
  return 0;
}

}  // namespace

void add_view_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_view);
  cmd->add_option("file", opts->file, "a .pte program or a .pt2 exported program");
  cmd->add_option("--profile", opts->profile, "a profile to overlay (kiln bench --profile --json or kiln profile --json)");
  cmd->add_option("-o,--out", opts->out, "the HTML page to write (default: beside the file, .html)");
  cmd->add_option("--model-explorer", opts->model_explorer, "also (or only, without -o) write Model Explorer's graph JSON");
  cmd->add_option("--compare", opts->compare, "two programs side by side (A.pte B.pte)")->expected(2);
}

}  // namespace kiln::cli
