// `kiln lower`: model spec (.pt2) -> ExecuTorch program (.pte) + metadata JSON.
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/emit/emitter.h"
#include "kiln/partition/xnnpack_partitioner.h"
#include "kiln/passes/edge_program.h"
#include "kiln/pt2/model_spec.h"
#include "kiln/pt2/pt2_reader.h"
#include "kiln/pte/pte_writer.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct LowerOptions {
  std::string spec;
  std::string backend = "portable";
  std::string out;
  bool quiet = false;
  bool verify = true;
  bool per_op = false;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Removes a staging file unless released: failures leave nothing behind.
struct StagedFile {
  std::string path;
  bool keep = false;
  ~StagedFile() {
    if (!keep) {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
};

void write_text_atomically(const std::string& path, const std::string& text) {
  StagedFile staged{path + ".kiln-tmp"};
  {
    std::ofstream f(staged.path, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    check(f.good(), "{}: cannot write", staged.path);
  }
  std::error_code ec;
  fs::rename(staged.path, path, ec);
  check(!ec, "{}: cannot rename into place: {}", path, ec.message());
  staged.keep = true;
}

// The delegation summary, and ExecuTorch's own lowering of the same model
// beside it when its reference JSON (bench/reference/lower_with_executorch.py) is there.
void print_delegation(const partition::XnnpackDelegation& delegation, const emit::EmitReport& report,
                      const pt2::ModelSpec& spec, const std::string& out, uint64_t size) {
  const auto& d = delegation.summary;
  fmt::print("  delegation: {} XnnpackBackend call site{} covering {} edge nodes ({} XNNPACK nodes); {} named data "
             "entries ({:.1f} MB), {} constant{} passed as delegate inputs\n",
             d.delegate_call_sites, d.delegate_call_sites == 1 ? "" : "s", d.delegated_node_count, d.xnnpack_nodes,
             report.named_data, static_cast<double>(report.named_data_bytes) / 1e6, d.constant_inputs,
             d.constant_inputs == 1 ? "" : "s");
  fmt::print("  fallback: {} edge node{} on the portable path\n", d.fallback_count, d.fallback_count == 1 ? "" : "s");
  for (const auto& [target, count] : d.fallback_ops) {
    const auto& reasons = d.fallback_reasons.at(target);
    fmt::print("    {:>4}  {}: {}{}\n", count, target, reasons.front(),
               reasons.size() > 1 ? fmt::format(" (+{} other reasons)", reasons.size() - 1) : "");
  }
  std::string et_name = fmt::format("{}_xnnpack_et.json", spec.name);
  for (const fs::path& dir : {fs::path(out).parent_path(), fs::path(spec.directory)}) {
    fs::path et = dir / et_name;
    std::error_code ec;
    if (!fs::is_regular_file(et, ec)) continue;
    try {
      std::ifstream in(et);
      json j = json::parse(in);
      const json& ed = j.at("delegation");
      fmt::print("  vs ExecuTorch ({}): delegate call sites {} vs {}; fallback ops {} vs {} ({} in its edge graph); "
                 "size {:.2f} MB vs {:.2f} MB\n",
                 et.string(), d.delegate_call_sites, ed.at("delegate_call_sites").get<int64_t>(), d.fallback_count,
                 ed.at("fallback_count").get<int64_t>(), ed.value("edge_fallback_count", int64_t{-1}),
                 static_cast<double>(size) / 1e6, j.at("pte_size_mb").get<double>());
    } catch (const std::exception& e) {
      fmt::print("  vs ExecuTorch: {} is not a reference lowering's JSON ({})\n", et.string(), e.what());
    }
    break;
  }
}

int run_lower(const LowerOptions& o) {
  auto t0 = Clock::now();
  auto progress = [&](const std::string& what) {
    if (!o.quiet) fmt::print(stderr, "kiln lower: [{:6.2f}s] {}\n", seconds_since(t0), what);
  };
  check(o.backend == "portable" || o.backend == "xnnpack", "--backend {}: kiln lowers portable or xnnpack",
        o.backend);
  check(!o.per_op || o.backend == "xnnpack", "--per-op applies to --backend xnnpack only");
  const bool xnnpack = o.backend == "xnnpack";

  pt2::ModelSpec spec = pt2::read_model_spec(o.spec);
  std::string out = o.out.empty() ? (fs::path(spec.directory) / fmt::format("{}_{}.pte", spec.name, o.backend)).string()
                                  : o.out;
  check(fs::path(out).extension() == ".pte", "--out {}: the output must end in .pte", out);
  std::string meta_path = fs::path(out).replace_extension(".json").string();

  progress(fmt::format("reading {}", spec.exported_program));
  pt2::ExportedProgram ep = pt2::read_pt2(spec.exported_program);
  double t_read = seconds_since(t0);

  progress(fmt::format("lowering {} nodes to edge form", ep.graph.nodes.size()));
  passes::LoweringStats lstats;
  passes::EdgeProgram edge = passes::to_edge(ep, &lstats);
  double t_edge = seconds_since(t0);

  std::optional<partition::XnnpackDelegation> delegation;
  if (xnnpack) {
    progress(fmt::format("partitioning {} edge nodes for XNNPACK{}, building payloads", edge.graph.nodes.size(),
                         o.per_op ? " (one region per node)" : ""));
    delegation = partition::delegate_to_xnnpack(edge, partition::PartitionOptions{o.per_op});
  }
  double t_partition = seconds_since(t0);

  emit::EmitReport report;
  pte::Program program;
  if (delegation) {
    progress(fmt::format("emitting {} delegate calls and {} portable nodes, planning memory",
                         delegation->regions.size(), delegation->summary.fallback_count));
    program = emit::emit_program(edge, delegation->regions, &report);
  } else {
    progress(fmt::format("emitting {} kernel calls, planning memory", edge.graph.nodes.size()));
    program = emit::emit_program(edge, &report);
  }
  double t_emit = seconds_since(t0);

  progress(fmt::format("writing {} ({:.1f} MB of constants, {:.1f} MB of named data)", out,
                       static_cast<double>(report.constant_bytes) / 1e6,
                       static_cast<double>(report.named_data_bytes) / 1e6));
  StagedFile staged{out + ".kiln-staging"};
  pte::write_pte(program, staged.path);
  double t_write = seconds_since(t0);

  // Round trip: the file must load in kiln's verified loader and its method
  // must prepare (kernels resolved, memory planned) before it takes the final name.
  // A method whose delegates name a backend kiln's runtime lacks is checked
  // by the loader only (every offset, index and payload reference).
  if (o.verify) {
    std::set<std::string> missing;
    for (const auto& plan : program.plans)
      for (const auto& d : plan.delegates)
        if (rt::find_backend(d.id) == nullptr) missing.insert(d.id);
    progress(missing.empty() ? std::string("verifying: loading the program with kiln's runtime")
                             : fmt::format("verifying: loading the program with kiln's verified loader; the method is "
                                           "not prepared: kiln's runtime has no {} yet",
                                           fmt::join(missing, ", ")));
    rt::ErrorMessage err;
    auto loaded = rt::Program::load(staged.path.c_str(), &err);
    if (!loaded.ok()) fail("{}: written program does not load: {}", out, err.c_str());
    if (missing.empty()) {
      auto method = loaded->load_method("forward", &err);
      if (!method.ok()) fail("{}: written program's method does not prepare: {}", out, err.c_str());
    }
  }

  std::error_code ec;
  fs::rename(staged.path, out, ec);
  check(!ec, "{}: cannot rename into place: {}", out, ec.message());
  staged.keep = true;
  double total = seconds_since(t0);
  uint64_t size = fs::file_size(out);

  json meta;
  meta["model"] = spec.name;
  meta["model_id"] = spec.model_id;
  meta["backend"] = o.backend;
  meta["exported_program"] = spec.exported_program;
  meta["pte"] = out;
  meta["pte_size_mb"] = static_cast<double>(size) / 1e6;
  meta["seq_len"] = spec.seq_len;
  meta["delegation"] = nullptr;
  if (delegation) {
    const auto& d = delegation->summary;
    meta["delegation"] = {{"backend", "XnnpackBackend"},
                          {"mode", o.per_op ? "per_op" : "regions"},
                          {"delegate_call_sites", d.delegate_call_sites},
                          {"delegated_node_count", d.delegated_node_count},
                          {"fallback_ops", d.fallback_ops},
                          {"fallback_count", d.fallback_count},
                          {"fallback_reasons", d.fallback_reasons},
                          {"xnnpack_nodes", d.xnnpack_nodes},
                          {"constants_as_delegate_inputs", d.constant_inputs},
                          {"named_data", report.named_data},
                          {"named_data_bytes", report.named_data_bytes},
                          {"payload_bytes", report.delegate_payload_bytes},
                          {"partition_rounds", d.partition_rounds}};
  }
  meta["program"] = {{"kernel_calls", report.kernel_calls},
                     {"delegate_calls", report.delegate_calls},
                     {"operators", report.operators},
                     {"values", report.values},
                     {"aliased_views", report.aliased_views}};
  meta["memory"] = {{"planned_bytes", report.planned_bytes}, {"naive_bytes", report.naive_bytes}};
  meta["constants"] = {{"buffers", report.constants},
                       {"bytes", report.constant_bytes},
                       {"deduplicated_values", report.deduplicated_constants}};
  meta["lowering"] = {{"source_nodes", lstats.source_nodes},
                      {"edge_nodes", lstats.edge_nodes},
                      {"folded_nodes", lstats.folded_nodes},
                      {"removed_nodes", lstats.removed_nodes}};
  meta["lowering_seconds"] = {{"read_pt2", t_read},
                              {"to_edge", t_edge - t_read},
                              {"partition", t_partition - t_edge},
                              {"emit", t_emit - t_partition},
                              {"write", t_write - t_emit},
                              {"total", total}};
  write_text_atomically(meta_path, meta.dump(2) + "\n");

  fmt::print("{} ({}) -> {}\n", spec.name, o.backend, out);
  fmt::print("  size {:.2f} MB, {} kernel calls, {} delegate calls, {} distinct constants ({:.1f} MB, {} shared)\n",
             static_cast<double>(size) / 1e6, report.kernel_calls, report.delegate_calls, report.constants,
             static_cast<double>(report.constant_bytes) / 1e6, report.deduplicated_constants);
  fmt::print("  planned memory {:.2f} MB (naive {:.2f} MB); {} nodes folded ahead of time, {} views shared\n",
             static_cast<double>(report.planned_bytes) / 1e6, static_cast<double>(report.naive_bytes) / 1e6,
             lstats.folded_nodes, report.aliased_views);
  if (delegation) print_delegation(*delegation, report, spec, out, size);
  fmt::print("  lowered in {:.2f} s; metadata {}\n", total, meta_path);
  return 0;
}

}  // namespace

void add_lower_command(CLI::App& app, std::function<int()>& run) {
  auto opts = std::make_shared<LowerOptions>();
  CLI::App* cmd = app.add_subcommand("lower", "Lower an exported program (.pt2) to an ExecuTorch program (.pte)");
  cmd->add_option("--spec", opts->spec, "model_spec.json written by the export front end")->required();
  cmd->add_option("--backend", opts->backend, "portable (core-ATen kernels only) or xnnpack (delegated)")
      ->check(CLI::IsMember({"portable", "xnnpack"}))
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "output .pte (default: <spec dir>/<name>_<backend>.pte); metadata goes beside it");
  cmd->add_flag("-q,--quiet", opts->quiet, "no progress lines on stderr");
  cmd->add_flag("--per-op", opts->per_op, "xnnpack: delegate every supported node as a call of its own");
  cmd->add_flag("!--no-verify", opts->verify, "skip loading the written program with kiln's runtime before renaming it into place");
  cmd->callback([opts, &run] { run = [opts] { return run_lower(*opts); }; });
}

}  // namespace kiln::cli
