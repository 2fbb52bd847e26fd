// `kiln lower`: model spec (.pt2) -> ExecuTorch program (.pte) + metadata JSON.
// The lowering is kiln::lower (kiln/compiler/lower.h); this file parses the
// flags, prints progress and the summary.
#include "commands.h"
#include "kiln/compiler/lower.h"
#include "kiln/core/error.h"
#include "kiln/pt2/model_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct LowerOptions {
  std::string spec;
  std::string backend;  // empty: portable, or what --recipe chooses
  std::string out;
  bool quiet = false;
  bool verify = true;
  bool debug_map = true;
  std::string etrecord;
  bool per_op = false;
  std::string quantize;
  std::string quantize_scales;
  std::string quantize_embedding;
  int64_t quantize_head = 4;
  std::string quantize_skip;
  std::string dtype;
  std::string io_dtype;
  std::string calibrate;
  std::string calibrate_method;
  int64_t calibrate_self = 0;
  double max_size_mb = 0;
  std::string recipe;
};

// --recipe NAME: the flags it stands for, each taken unless the same flag is given beside it (which then wins
// and is reported as given). llm-int4: a decoder LLM for a small board (Gemma 4 E2B on an 8 GB Raspberry Pi):
//   --backend xnnpack              XNNPACK's int8 x int4 products (kiln's and ExecuTorch's runtimes)
//   --quantize 8da4w:32            every linear layer, the tied LM head included: int4 weights in groups of 32,
//                                  int8 activations per token (ExecuTorch's LLM export's default)
//   --quantize-scales minmax       torchao's max(|w|) rule, on the weights' own bf16/fp16 values: what torchao and
//                                  ExecuTorch's export give (mse: less error, ~8x the quantization time)
//   --quantize-embedding 4:32      the token table and Gemma 4's per-layer table as embedding_4bit lookups
//   --dtype fp32                   everything else (norms, the few small non-linear weights) fp32, widened exactly
//                                  from bf16: XNNPACK's regions take no bf16, and the values are ~0.1% of the file
// Returns the lines that say what was chosen; throws for an unknown recipe.
std::vector<std::string> apply_recipe(LowerOptions& o) {
  check(o.recipe == "llm-int4", "--recipe {}: unknown recipe (llm-int4)", o.recipe);
  std::vector<std::string> lines;
  auto take = [&](std::string& field, const char* flag, const char* value, const char* why) {
    if (field.empty()) {
      field = value;
      lines.push_back(fmt::format("{} {} ({})", flag, value, why));
    } else if (field == value) {
      lines.push_back(fmt::format("{} {} (given, the recipe's own choice)", flag, value));
    } else {
      lines.push_back(fmt::format("{} {} (given: overrides the recipe's {})", flag, field, value));
    }
  };
  take(o.backend, "--backend", "xnnpack", "XNNPACK's int8 x int4 products");
  take(o.quantize, "--quantize", "8da4w:32", "linear layers and the tied LM head: int4 weights in groups of 32");
  take(o.quantize_scales, "--quantize-scales", "minmax", "torchao's rule on the weights' own values");
  take(o.quantize_embedding, "--quantize-embedding", "4:32",
       "token and per-layer embedding tables as int4 lookups, groups of 32");
  take(o.dtype, "--dtype", "fp32", "the rest widened exactly to fp32: XNNPACK's regions take no bf16");
  return lines;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The delegation summary, and ExecuTorch's own lowering of the same model
// beside it when its reference JSON (bench/reference/lower_with_executorch.py) is there.
void print_delegation(const backends::xnnpack::DelegationSummary& d, const emit::EmitReport& report,
                      const pt2::ModelSpec& spec, const std::string& out, uint64_t size, int64_t untied) {
  fmt::print("  delegation: {} XnnpackBackend call site{} covering {} edge nodes ({} XNNPACK nodes); {} named data "
             "entries ({:.1f} MB), {} constant{} passed as delegate inputs\n",
             d.delegate_call_sites, d.delegate_call_sites == 1 ? "" : "s", d.delegated_node_count, d.xnnpack_nodes,
             report.named_data, static_cast<double>(report.named_data_bytes) / 1e6, d.constant_inputs,
             d.constant_inputs == 1 ? "" : "s");
  if (d.quantization != "none")
    fmt::print("  quantized: {} fully connected node{} ({}{}){}\n", d.quantized_nodes, d.quantized_nodes == 1 ? "" : "s",
               d.quantization,
               d.affine_nodes ? fmt::format("; {} int4 with offsets", d.affine_nodes) : "",
               untied ? fmt::format("; {} tied weight{} quantized for the linear products, fp32 for its other "
                                    "readers (an embedding lookup)", untied, untied == 1 ? "" : "s")
                      : "");
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

int run_lower(const LowerOptions& given) {
  auto t0 = Clock::now();
  LowerOptions o = given;
  std::vector<std::string> recipe_lines;
  if (!o.recipe.empty()) recipe_lines = apply_recipe(o);
  if (o.backend.empty()) o.backend = "portable";
  check(o.backend == "portable" || o.backend == "xnnpack", "--backend {}: kiln lowers portable or xnnpack",
        o.backend);
  check(!o.per_op || o.backend == "xnnpack", "--per-op applies to --backend xnnpack only");
  kiln::LowerOptions lo;
  lo.backend = o.backend == "xnnpack" ? LowerBackend::Xnnpack : LowerBackend::Portable;
  lo.out = o.out;
  lo.per_op = o.per_op;
  lo.quantize = o.quantize;
  lo.quantize_scales = o.quantize_scales;
  lo.quantize_embedding = o.quantize_embedding;
  lo.quantize_head = o.quantize_head;
  lo.quantize_skip = o.quantize_skip;
  lo.dtype = o.dtype;
  lo.io_dtype = o.io_dtype;
  lo.recipe = o.recipe;
  lo.recipe_choices = recipe_lines;
  lo.calibrate = o.calibrate;
  lo.calibrate_method = o.calibrate_method;
  lo.calibrate_self = o.calibrate_self;
  check(o.max_size_mb >= 0 && o.max_size_mb < 1e7, "--max-size {}: give the budget in megabytes, above 0",
        o.max_size_mb);
  lo.max_size_bytes = std::llround(o.max_size_mb * 1e6);
  lo.verify = o.verify;
  lo.debug_map = o.debug_map;
  lo.etrecord = o.etrecord;
  if (!o.quiet)
    lo.progress = [t0](std::string_view what) {
      fmt::print(stderr, "kiln lower: [{:6.2f}s] {}\n", seconds_since(t0), what);
    };
  pt2::ModelSpec spec = pt2::read_model_spec(o.spec);
  check(o.out.empty() || fs::path(o.out).extension() == ".pte", "--out {}: the output must end in .pte", o.out);
  const LowerResult r = kiln::lower(spec, lo);
  for (const auto& w : r.warnings) fmt::print(stderr, "kiln lower: warning: {}\n", w);
  const emit::EmitReport& report = r.report;
  const double size = static_cast<double>(r.pte_size);

  fmt::print("{} ({}) -> {}\n", spec.name, o.backend, r.pte_path);
  fmt::print("  size {:.2f} MB, {} kernel calls, {} delegate calls, {} distinct constants ({:.1f} MB, {} shared)\n",
             size / 1e6, report.kernel_calls, report.delegate_calls, report.constants,
             static_cast<double>(report.constant_bytes) / 1e6, report.deduplicated_constants);
  fmt::print("  planned memory {:.2f} MB (naive {:.2f} MB); {} nodes folded ahead of time, {} views shared\n",
             static_cast<double>(report.planned_bytes) / 1e6, static_cast<double>(report.naive_bytes) / 1e6,
             r.lowering.folded_nodes, report.aliased_views);
  if (r.program_dtype != "float32")
    fmt::print("  dtype: a {} program, {}\n", r.program_dtype,
               r.stored_dtype != r.program_dtype
                   ? r.portable_quantization != "none"
                         ? fmt::format("widened to float32 (exactly) for the quantized products' float32 "
                                       "activations, quantized from its {} weights", r.program_dtype)
                         : fmt::format("widened to float32 (exactly) for XNNPACK's float32 regions{}{}; --dtype bf16 "
                                       "keeps bfloat16 for the portable backend (kiln's and ExecuTorch's portable "
                                       "kernels)",
                                       r.delegation && r.delegation->quantized_nodes > 0
                                           ? fmt::format(", quantized from its {} weights", r.program_dtype)
                                           : "",
                                       r.io_widened ? ", its inputs and outputs too (--io-dtype fp32)"
                                                    : fmt::format(", its inputs and outputs kept {} (converted at the "
                                                                  "edges; --io-dtype fp32 widens them)",
                                                                  r.program_dtype))
                   : fmt::format("kept {} (portable kernels: kiln's runtime and ExecuTorch's compute it; XNNPACK's "
                                 "regions take float32 only: --dtype fp32 widens it)",
                                 r.stored_dtype));
  if (r.portable_quantization != "none")
    fmt::print("  quantized: {} linear product{} ({}; {} weight{}, {} kept fp32) as ExecuTorch's quantized_decomposed "
               "ops on the portable path\n",
               r.portable_quantized_nodes, r.portable_quantized_nodes == 1 ? "" : "s", r.portable_quantization,
               r.portable_quantized_weights, r.portable_quantized_weights == 1 ? "" : "s", r.portable_kept_fp32);
  if (!r.recipe.empty())
    fmt::print("  recipe {}: {}\n", r.recipe, fmt::join(r.recipe_choices, "; "));
  if (r.embedding_quantization != "none") {
    fmt::print("  quantized: {} embedding table{} ({})\n", r.quantized_embeddings,
               r.quantized_embeddings == 1 ? "" : "s", r.embedding_quantization);
    for (const auto& t : r.embedding_tables) fmt::print("    {}\n", t);
    if (!r.streamed_embeddings.empty())
      fmt::print("    quantized block by block as the file was written (never whole in memory): {}\n",
                 fmt::join(r.streamed_embeddings, ", "));
  }
  if (r.calibration)
    fmt::print("  calibrated: {} tokens, {} of {} linear-layer inputs rescaled ({} layers), error proxy {:+.1f}%; "
               "run {:.1f} s, search {:.1f} s\n",
               r.calibration->tokens, r.calibration->inputs_scaled, r.calibration->inputs_found,
               r.calibration->layers_scaled,
               r.calibration->proxy_before > 0
                   ? 100.0 * (r.calibration->proxy_after - r.calibration->proxy_before) / r.calibration->proxy_before
                   : 0.0,
               r.calibration->run_seconds, r.calibration->search_seconds);
  if (r.calibration && r.calibration->gptq_layers > 0)
    fmt::print("  GPTQ ({}): {} layers, objective sum (w - q) H (w - q)^T {:+.1f}% against the plain rule (sampled "
               "rows), Gram matrices {:.0f} MB, {:.1f} s{}\n",
               r.calibration->method, r.calibration->gptq_layers,
               r.calibration->gptq_objective_plain > 0
                   ? 100.0 * (r.calibration->gptq_objective - r.calibration->gptq_objective_plain) /
                         r.calibration->gptq_objective_plain
                   : 0.0,
               static_cast<double>(r.calibration->gram_bytes) / 1e6, r.calibration->gptq_seconds,
               r.calibration->gptq_stages > 0 ? fmt::format(" ({} stages)", r.calibration->gptq_stages) : "");
  if (r.auto_plan) {
    const auto& a = *r.auto_plan;
    int64_t int8 = 0;
    std::string upgraded;
    for (const auto& L : a.layers)
      if (L.int8) upgraded += fmt::format("{}{}", int8++ ? ", " : "", L.layer);
    fmt::print("  auto: {} of {} linear layers 8da8w, the others 8da4w; estimated {:.2f} MB within --max-size {:.2f} "
               "MB (all 8da4w {:.2f} MB, all 8da8w {:.2f} MB){}{}\n",
               int8, a.layers.size(), static_cast<double>(a.estimate) / 1e6,
               static_cast<double>(r.max_size_bytes) / 1e6, static_cast<double>(a.min_bytes) / 1e6,
               static_cast<double>(a.max_bytes) / 1e6, int8 ? ": " : "", upgraded);
  }
  if (r.delegation) print_delegation(*r.delegation, report, spec, r.pte_path, r.pte_size, r.untied_weights);
  fmt::print("  lowered in {:.2f} s; metadata {}\n", r.seconds.total, r.metadata_path);
  if (!r.debug_map_path.empty())
    fmt::print("  debug map {} ({:.2f} s)\n", r.debug_map_path, r.seconds.debug_map);
  if (!r.etrecord_path.empty()) fmt::print("  etrecord {} ({:.2f} s)\n", r.etrecord_path, r.seconds.etrecord);
  return 0;
}

}  // namespace

void add_lower_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_lower);
  cmd->add_option("--spec", opts->spec, "model_spec.json written by the export front end")->required();
  cmd->add_option("--backend", opts->backend,
                  "portable (core-ATen kernels only, the default) or xnnpack (delegated)")
      ->check(CLI::IsMember({"portable", "xnnpack"}));
  cmd->add_option("--recipe", opts->recipe,
                  "a named set of the flags below; a flag given beside it overrides the recipe's choice (the summary "
                  "and the metadata's \"recipe\" say what it chose). llm-int4: a decoder LLM for a small board: "
                  "--backend xnnpack --quantize 8da4w:32 --quantize-scales minmax (torchao's rule on the weights' "
                  "own bf16/fp16 values) --quantize-embedding 4:32 (the token table and Gemma 4's per-layer table) "
                  "--dtype fp32 (what stays unquantized: norms and small weights, widened exactly)");
  cmd->add_option("--out", opts->out, "output .pte (default: <spec dir>/<name>_<backend>.pte); metadata goes beside it");
  cmd->add_flag("-q,--quiet", opts->quiet, "no progress lines on stderr");
  cmd->add_flag("--per-op", opts->per_op, "xnnpack: delegate every supported node as a call of its own");
  cmd->add_option("--quantize", opts->quantize,
                  "8da4w[:32|64|128|256] (int8 activations per token x int4 weights per group of inputs, "
                  "default 32) or 8da8w (x int8 weights per channel); linear layers only (the tied LM head included). "
                  "xnnpack: XNNPACK's dynamically quantized fully connected nodes (int4 packed two a byte); portable: "
                  "ExecuTorch's quantized_decomposed per-token ops and mixed_linear (int4 values one a byte); "
                  "int8w: int8 weights, fp32 activations; auto (xnnpack): 8da4w or 8da8w per layer by its measured "
                  "sensitivity, within --max-size");
  cmd->add_option("--max-size", opts->max_size_mb,
                  "with --quantize auto: the file's size budget in MB (10^6 bytes); the layers whose int8 form cuts "
                  "the most error per extra byte are int8, the others int4");
  cmd->add_option("--quantize-scales", opts->quantize_scales,
                  "with --quantize: mse (default: each scale minimises its weights' squared error), minmax "
                  "(torchao's max(|w|) rule), or asym (8da4w and auto, xnnpack: an affine int4 grid per group, "
                  "w ~ scale q + offset, the fp32 offsets applied by two small fp32 products on the input's group "
                  "sums in the same XNNPACK region; +4 bytes per group of weights; the form of a 4-bit GGUF's "
                  "Q4_1 / Q4_K weights, which a symmetric grid cannot hold)");
  cmd->add_option("--quantize-embedding", opts->quantize_embedding,
                  "4[:GROUP] (int4, groups of 32 columns by default) or 8[:GROUP] (int8, one scale per row by "
                  "default): embedding tables as ExecuTorch's quantized embedding lookups");
  cmd->add_option("--quantize-head", opts->quantize_head,
                  "4 or 8, with --quantize 8da4w or auto (xnnpack): the LM head (the output projection, tied to the "
                  "token table or not) as 8da4w like the other layers (4, the default) or 8da8w, int8 weights per "
                  "channel "
                  "(8: about 1 byte per weight instead of 0.56; llama.cpp's Q4_0 keeps its head at 8 bits too; with "
                  "auto, the head is 8da8w whatever the plan, which fills the rest of the budget)");
  cmd->add_option("--quantize-skip", opts->quantize_skip,
                  "with --quantize: keep linear layers fp32 whose module path, node or weight name this regex "
                  "matches (e.g. lm_head)");
  cmd->add_option("--dtype", opts->dtype,
                  "fp32 or bf16: what a bfloat16 / float16 program's (its parameters or inputs 16-bit; a float32 program "
                  "keeps its own 16-bit casts) unquantized values are stored and computed as. "
                  "fp32 (the default for xnnpack) widens them exactly (XNNPACK regions are float32; --quantize then "
                  "quantizes from the 16-bit weights); bf16 keeps a bfloat16 program as it is (portable backend: "
                  "kiln's and ExecuTorch's portable kernels run it). Default for portable: the program's own type "
                  "(fp32 with --quantize: the quantized products take float32 activations)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--io-dtype", opts->io_dtype,
                  "program or fp32: when a 16-bit program is widened (--dtype fp32), whether its 16-bit inputs and "
                  "outputs keep their type (program: the .pte takes and returns what the exported program does, "
                  "converted at the edges) or become float32 too. Default: program; fp32 with --quantize or "
                  "--quantize-embedding (an LLM's sampler reads float32 logits). A 16-bit input the program writes in place (an external cache) is "
                  "widened either way")
      ->check(CLI::IsMember({"program", "fp32"}));
  cmd->add_option("--calibrate", opts->calibrate,
                  "with --quantize (xnnpack): a text file the fp32 program runs over in kiln's runtime; its activation "
                  "statistics rescale the weights' input channels (AWQ-style, folded into constants)");
  cmd->add_option("--calibrate-self", opts->calibrate_self,
                  "with --quantize: data-free self-calibration, --calibrate's work on N tokens the fp32 program "
                  "samples itself (from its BOS token, temperature 1, top 40; a fixed seed) instead of a text")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--calibrate-method", opts->calibrate_method,
                  "with --calibrate: awq+gptq (the default): AWQ's scales, then GPTQ; awq "
                  "(AWQ's channel scales and activation-weighted int4 groups) or gptq (GPTQ's error feedback on "
                  "each input's X^T X); gptq-act, awq+gptq-act: the same with GPTQ's act-order (static groups); any GPTQ "
                  "method with +refit (e.g. awq+gptq-act+refit): GPTQ's int4 group scales then re-fitted to its "
                  "objective; and/or +seq (e.g. awq+gptq-act+refit+seq): sequential GPTQ, each stage of layers "
                  "calibrated on a run of the program with the layers before it already quantized (about one run "
                  "per transformer block). --quantize auto takes any of them: AWQ's scales, then the plan, then GPTQ to each "
                  "layer's chosen form");
  cmd->add_flag("!--no-verify", opts->verify, "skip loading the written program with kiln's runtime before renaming it into place");
  cmd->add_flag("!--no-debug-map", opts->debug_map,
                "do not write the debug map X.debug.json beside X.pte (debug handles -> .pt2 nodes, source lines, "
                "module paths, delegate regions; docs/PROFILING.md)");
  cmd->add_option("--etrecord", opts->etrecord,
                  "also write an ETRecord here (ExecuTorch's devtools format: executorch.devtools.Inspector maps an "
                  "ETDump of this program back to the model with it; docs/PROFILING.md)");
}

}  // namespace kiln::cli
