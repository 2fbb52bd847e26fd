// kiln::lower (kiln/compiler/lower.h): spec -> .pte + metadata JSON.
#include "kiln/compiler/lower.h"

#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/compiler/debug_map.h"
#include "kiln/compiler/etrecord.h"
#include "kiln/core/error.h"
#include "kiln/core/output_file.h"
#include "kiln/passes/dynamic.h"
#include "kiln/passes/quantize_portable.h"
#include "kiln/pt2/pt2_reader.h"
#include "kiln/pte/pte_writer_staged.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/program.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <future>
#include <optional>
#include <regex>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string metadata(const LowerResult& r) {
  const emit::EmitReport& report = r.report;
  const passes::LoweringStats& lstats = r.lowering;
  json meta;
  meta["model"] = r.spec.name;
  meta["model_id"] = r.spec.model_id;
  meta["backend"] = std::string(lower_backend_name(r.backend));
  meta["exported_program"] = r.spec.exported_program;
  meta["pte"] = r.pte_path;
  meta["pte_size_mb"] = static_cast<double>(r.pte_size) / 1e6;
  meta["pte_size_bytes"] = r.pte_size;
  meta["pte_sha256"] = r.pte_sha256;
  meta["seq_len"] = r.spec.seq_len;
  meta["delegation"] = nullptr;
  if (r.delegation) {
    const auto& d = *r.delegation;
    meta["delegation"] = {{"backend", "XnnpackBackend"},
                          {"mode", r.per_op ? "per_op" : "regions"},
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
                          {"partition_rounds", d.partition_rounds},
                          {"quantization", d.quantization},
                          {"quantized_nodes", d.quantized_nodes},
                          {"prequantized_nodes", d.prequantized_nodes},
                          {"int4_offset_nodes", d.affine_nodes},
                          {"kept_fp32_nodes", d.kept_fp32_nodes},
                          {"untied_weights", r.untied_weights}};
  }
  if (r.calibration) {
    const auto& c = *r.calibration;
    meta["calibration"] = {{"tokens", c.tokens},           {"inputs_found", c.inputs_found},
                           {"inputs_scaled", c.inputs_scaled}, {"layers_scaled", c.layers_scaled},
                           {"proxy_before", c.proxy_before}, {"proxy_after", c.proxy_after},
                           {"run_seconds", c.run_seconds},   {"search_seconds", c.search_seconds},
                           {"int4_groups", c.groups}, {"int4_groups_not_reproduced", c.groups_kept},
                           {"choices", c.choices},
                           {"method", c.method},
                           {"gptq_layers", c.gptq_layers},
                           {"gptq_dead_inputs", c.gptq_dead_inputs},
                           {"gram_bytes", c.gram_bytes},
                           {"gptq_objective_plain", c.gptq_objective_plain},
                           {"gptq_objective", c.gptq_objective},
                           {"gptq_seconds", c.gptq_seconds},
                           {"gptq_stages", c.gptq_stages}};
  }
  // "io": the type the program's 16-bit user inputs and outputs have in the .pte (kept unless widened too)
  meta["dtype"] = {{"program", r.program_dtype},
                   {"stored", r.stored_dtype},
                   {"widened", r.program_dtype != r.stored_dtype},
                   {"io", r.io_widened ? "float32" : r.program_dtype}};
  if (r.auto_plan) {
    const auto& a = *r.auto_plan;
    json layers = json::array();
    for (const auto& L : a.layers)
      layers.push_back({{"layer", L.layer}, {"weight", L.name},          {"norm", L.norm},       {"n", L.n},
                        {"k", L.k},                  {"scheme", L.int8 ? "8da8w" : "8da4w"},
                        {"err_int4", L.err4},        {"err_int8", L.err8},   {"bytes_int4", L.bytes4},
                        {"bytes_int8", L.bytes8},    {"int4_possible", L.int4_possible},
                        {"forced_int8", L.forced_int8}});
    meta["quantize_auto"] = {{"max_size_bytes", r.max_size_bytes}, {"estimate_bytes", a.estimate},
                             {"all_int4_bytes", a.min_bytes},      {"all_int8_bytes", a.max_bytes},
                             {"other_bytes", a.other_bytes},       {"proxy_error", a.error},
                             {"int8_layers", std::count_if(a.layers.begin(), a.layers.end(),
                                                           [](const auto& L) { return L.int8; })},
                             {"layers", layers}};
  }
  if (r.head_8bit)
    meta["quantize_head"] = {{"bits", 8},           {"scheme", "8da8w"}, {"layer", r.head_8bit->layer},
                             {"weight", r.head_8bit->name}, {"n", r.head_8bit->n}, {"k", r.head_8bit->k}};
  if (r.backend == LowerBackend::Portable)
    meta["quantization"] = {{"scheme", r.portable_quantization},
                            {"quantized_nodes", r.portable_quantized_nodes},
                            {"quantized_weights", r.portable_quantized_weights},
                            {"kept_fp32_nodes", r.portable_kept_fp32}};
  meta["embedding_quantization"] = {{"scheme", r.embedding_quantization},
                                    {"quantized_embeddings", r.quantized_embeddings},
                                    {"tables", r.embedding_tables},
                                    {"streamed_while_writing", r.streamed_embeddings}};
  if (!r.recipe.empty()) meta["recipe"] = {{"name", r.recipe}, {"choices", r.recipe_choices}};
  meta["program"] = {{"kernel_calls", report.kernel_calls},
                     {"delegate_calls", report.delegate_calls},
                     {"operators", report.operators},
                     {"values", report.values},
                     {"aliased_views", report.aliased_views}};
  meta["memory"] = {{"planned_bytes", report.planned_bytes}, {"naive_bytes", report.naive_bytes}};
  if (report.mutable_buffers > 0)  // state kept across calls (planned, in place)
    meta["state"] = {{"mutable_buffers", report.mutable_buffers},
                     {"bytes", report.mutable_buffer_bytes},
                     {"zero_initialized", report.zero_initialized_buffers},
                     {"initial_data_bytes", report.mutable_data_bytes}};
  meta["constants"] = {{"buffers", report.constants},
                       {"bytes", report.constant_bytes},
                       {"deduplicated_values", report.deduplicated_constants}};
  meta["lowering"] = {{"source_nodes", lstats.source_nodes},
                      {"edge_nodes", lstats.edge_nodes},
                      {"folded_nodes", lstats.folded_nodes},
                      {"removed_nodes", lstats.removed_nodes}};
  const LowerTimings& t = r.seconds;
  meta["lowering_seconds"] = {{"read_pt2", t.read_pt2}, {"to_edge", t.to_edge}, {"partition", t.partition},
                              {"emit", t.emit},         {"write", t.write},     {"total", t.total},
                              {"debug_map", t.debug_map}, {"etrecord", t.etrecord}};
  return meta.dump(2) + "\n";
}

// Loads the staged file with kiln's verified loader and, when the runtime has
// every backend its delegates name, prepares its method.
void verify(const pte::Program& program, const std::string& staged, const std::string& out, LowerResult& r,
            const std::function<void(const std::string&)>& progress) {
  for (const auto& plan : program.plans)
    for (const auto& d : plan.delegates)
      if (rt::find_backend(d.id) == nullptr) r.unverified_backends.insert(d.id);
  progress(r.unverified_backends.empty()
               ? std::string("verifying: loading the program with kiln's runtime")
               : fmt::format("verifying: loading the program with kiln's verified loader; the method is "
                             "not prepared: kiln's runtime has no {} yet",
                             fmt::join(r.unverified_backends, ", ")));
  rt::ErrorMessage err;
  auto loaded = rt::Program::load(staged.c_str(), &err);
  if (!loaded.ok()) fail("{}: written program does not load: {}", out, err.c_str());
  if (r.unverified_backends.empty()) {
    auto method = loaded->load_method("forward", &err);
    if (!method.ok()) fail("{}: written program's method does not prepare: {}", out, err.c_str());
  }
  r.verified = true;
}

}  // namespace

namespace {

// --calibrate: the tokenizer beside the spec (tokenizer.json, else tokenizer.model; or in a tokenizer/ folder)
compiler::CalibrationResult calibrate(passes::EdgeProgram& edge, const pt2::ModelSpec& spec, const LowerOptions& o,
                                      const backends::xnnpack::QuantScheme& quant,
                                      const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                                      const std::map<graph::ValueId, backends::xnnpack::QuantScheme>& per_weight,
                                      const compiler::CalibrationPlanner& plan) {
  std::string tokenizer;
  std::error_code ec;
  for (const fs::path& d : {fs::path(spec.directory), fs::path(spec.directory) / "tokenizer"})
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
      if (tokenizer.empty() && fs::is_regular_file(d / name, ec)) tokenizer = (d / name).string();
  int64_t max_positions = 0;
  for (const auto& cm : spec.constant_methods)
    if (cm.name == "get_max_seq_len" && cm.values.size() == 1 && std::holds_alternative<int64_t>(cm.values[0]))
      max_positions = std::get<int64_t>(cm.values[0]);
  std::string why;
  const auto method = compiler::parse_calibration_method(
      // the default: awq+gptq (SmolLM2: perplexity 1.46x fp32 against awq's 1.63x; auto at 130 MB 1.16x against
      // awq's 1.20x, KL 0.215 against 0.258; bench/RESULTS.md)
      !o.calibrate_method.empty() ? o.calibrate_method : "awq+gptq", &why);
  check(method.has_value(), "{}", why);
  return compiler::calibrate_awq(edge, o.calibrate, tokenizer, max_positions, quant, keep_fp32, o.progress, *method,
                                 o.calibrate_self, o.quantize == "auto", per_weight, plan);
}

}  // namespace

std::string_view lower_backend_name(LowerBackend b) { return b == LowerBackend::Xnnpack ? "xnnpack" : "portable"; }

LowerResult lower(const std::string& spec_path, const LowerOptions& options) {
  check(!options.per_op || options.backend == LowerBackend::Xnnpack, "per-op delegation applies to XNNPACK only");
  return lower(pt2::read_model_spec(spec_path), options);
}

LowerResult lower(const pt2::ModelSpec& spec, const LowerOptions& o) {
  const auto t0 = Clock::now();
  auto progress = [&](const std::string& what) {
    if (o.progress) o.progress(what);
  };
  check(!o.per_op || o.backend == LowerBackend::Xnnpack, "per-op delegation applies to XNNPACK only");
  const bool xnnpack = o.backend == LowerBackend::Xnnpack;
  backends::xnnpack::QuantScheme quant;
  const bool quant_auto = o.quantize == "auto";
  if (!o.quantize.empty()) {
    check(xnnpack || !quant_auto, "--quantize auto: mixed precision is lowered for --backend xnnpack (portable: "
                                  "--quantize 8da4w[:G], 8da8w or int8w)");
    std::string why;
    auto q = quant_auto ? backends::xnnpack::parse_quant_scheme("8da4w", &why)
                        : backends::xnnpack::parse_quant_scheme(o.quantize, &why);
    check(q.has_value(), "{}", why);
    quant = *q;
  }
  check(!quant_auto || o.max_size_bytes > 0,
        "--quantize auto needs --max-size MB (the file's size budget, in megabytes)");
  check(quant_auto || o.max_size_bytes == 0, "--max-size applies to --quantize auto only");
  // --quantize auto with --calibrate: AWQ's channel scales (folded), then the plan (int4 or int8 per layer), then
  // GPTQ (where the method has it) to each layer's chosen form
  check(o.quantize_head == 4 || o.quantize_head == 8, "--quantize-head {}: --quantize-head takes 4 or 8", o.quantize_head);
  check(o.quantize_head == 4 || (xnnpack && quant.kind == backends::xnnpack::QuantScheme::Kind::Int4Groups),
        "--quantize-head 8 needs --quantize 8da4w[:G] with --backend xnnpack (given: --quantize {}{})",
        o.quantize.empty() ? "none" : o.quantize, xnnpack ? "" : ", --backend portable");
  if (!o.quantize_scales.empty()) {
    check(!o.quantize.empty(), "--quantize-scales {}: --quantize-scales needs --quantize", o.quantize_scales);
    std::string why;
    auto rule = backends::xnnpack::parse_scale_rule(o.quantize_scales, &why);
    check(rule.has_value(), "{}", why);
    quant.scales = *rule;
  }
  if (quant.scales == backends::xnnpack::ScaleRule::Asym) {
    check(quant.kind == backends::xnnpack::QuantScheme::Kind::Int4Groups,
          "--quantize-scales asym is an int4 rule: it needs --quantize 8da4w[:G] or auto (given: --quantize {})",
          o.quantize);
    check(xnnpack, "--quantize-scales asym: the int4 offsets are applied inside XNNPACK regions (--backend xnnpack)");
    check(o.calibrate_method.find("refit") == std::string::npos,
          "--calibrate-method {}: +refit fits the symmetric grid's scales; --quantize-scales asym takes the "
          "methods without it", o.calibrate_method);
  }
  check(o.calibrate_method.empty() || !o.calibrate.empty() || o.calibrate_self > 0,
        "--calibrate-method {}: --calibrate-method needs --calibrate FILE or --calibrate-self N", o.calibrate_method);
  check(o.calibrate.empty() || o.calibrate_self == 0, "--calibrate-self {}: give --calibrate FILE or --calibrate-self, not both",
        o.calibrate_self);
  if (o.calibrate_self > 0) {
    using QK = backends::xnnpack::QuantScheme::Kind;
    check(!quant_auto && (quant.kind == QK::Int4Groups || quant.kind == QK::Int8Channels),
          "--calibrate-self {}: --calibrate-self needs --quantize 8da4w or 8da8w", o.calibrate_self);
  }
  if (!o.calibrate.empty()) {
    check(xnnpack, "--calibrate {}: --calibrate is lowered for --backend xnnpack", o.calibrate);
    using QK = backends::xnnpack::QuantScheme::Kind;
    check(quant.kind == QK::Int4Groups || quant.kind == QK::Int8Channels,
          "--calibrate {}: --calibrate needs --quantize 8da4w or 8da8w", o.calibrate);
    if (!o.calibrate_method.empty()) {
      std::string why;
      check(compiler::parse_calibration_method(o.calibrate_method, &why).has_value(), "{}", why);
    }
    std::ifstream probe(o.calibrate, std::ios::binary);  // before any work: a missing text fails at once
    check(static_cast<bool>(probe), "{}: cannot open the calibration text", o.calibrate);
  }
  std::optional<std::regex> skip;
  if (!o.quantize_skip.empty()) {
    check(!o.quantize.empty(), "--quantize-skip {}: --quantize-skip needs --quantize", o.quantize_skip);
    try {
      skip.emplace(o.quantize_skip, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail("invalid --quantize-skip regex '{}': {}", o.quantize_skip, e.what());
    }
  }
  backends::xnnpack::EmbeddingQuant embedding_quant;
  if (!o.quantize_embedding.empty()) {
    std::string why;
    auto q = backends::xnnpack::parse_embedding_quant(o.quantize_embedding, &why);
    check(q.has_value(), "{}", why);
    embedding_quant = *q;
  }
  const std::string_view backend = lower_backend_name(o.backend);

  LowerResult r;
  r.recipe = o.recipe;
  r.recipe_choices = o.recipe_choices;
  r.spec = spec;
  r.backend = o.backend;
  r.per_op = o.per_op;
  const std::string out =
      o.out.empty() ? (fs::path(spec.directory) / fmt::format("{}_{}.pte", spec.name, backend)).string() : o.out;
  check(fs::path(out).extension() == ".pte", "{}: the output must end in .pte", out);
  r.pte_path = out;
  r.metadata_path = fs::path(out).replace_extension(".json").string();

  progress(fmt::format("reading {}", spec.exported_program));
  pt2::ExportedProgram ep = pt2::read_pt2(spec.exported_program);
  check(o.dtype.empty() || o.dtype == "fp32" || o.dtype == "bf16", "--dtype {}: kiln stores fp32 or bf16", o.dtype);
  {
    // the program's 16-bit float type, if it is a 16-bit program: one whose inputs (parameters, buffers or user
    // inputs) are bfloat16 / float16 (widen_to_float refuses a mix of two). A float32 program that casts to 16 bits
    // inside (x.half() * 2, then .float()) is not one: widening would drop the roundings eager does there, so
    // it keeps its casts, and its 16-bit nodes run on the portable path
    std::optional<ScalarType> narrow;
    bool both = false;  // bfloat16 and float16 inputs: kept as they are (each step on the portable path)
    auto see = [&](ScalarType t) {
      if (t != ScalarType::BFloat16 && t != ScalarType::Half) return;
      if (narrow && *narrow != t) both = true;
      if (!narrow) narrow = t;
    };
    for (graph::ValueId v : ep.graph.inputs) see(ep.graph.value(v).meta.dtype);
    for (const auto& c : ep.constants) see(c.meta.dtype);
    for (const auto& v : ep.graph.values)  // a cast inside to the other 16-bit type counts too
      if (narrow && (v.meta.dtype == ScalarType::BFloat16 || v.meta.dtype == ScalarType::Half) && v.meta.dtype != *narrow)
        both = true;
    const bool keep_both = both && o.dtype.empty() && o.quantize.empty();
    if (narrow) r.program_dtype = r.stored_dtype = std::string(dtype_name(*narrow));
    // quantized products take float32 activations on either backend
    const std::string want = o.dtype.empty() ? (xnnpack || !o.quantize.empty() ? "fp32" : "") : o.dtype;
    if (want == "bf16") {
      check(narrow == ScalarType::BFloat16,
            "--dtype bf16: {} is a {} program; kiln keeps a bfloat16 program's values bfloat16 but does not narrow "
            "another type (export it in bf16: python -m kiln_export llm --dtype bf16)",
            spec.exported_program, r.program_dtype);
      check(o.quantize.empty(),
            "--quantize {} with --dtype bf16: the quantized products (XNNPACK's, or mixed_linear on the portable path) "
            "take float32 activations; use --dtype fp32 (the default with --quantize: the bfloat16 weights widened "
            "exactly, quantized from their bf16 values)",
            o.quantize);
      check(!xnnpack,
            "--backend xnnpack with --dtype bf16: XNNPACK's regions are float32 only and would take no part of a "
            "bfloat16 program; use --dtype fp32 (the default for xnnpack) or --backend portable");
    }
    // a quantized program (an LLM recipe: its sampler reads float32 logits) widens its edges too, by default
    const bool quantized = !o.quantize.empty() || embedding_quant.bits != 0;
    const std::string io = o.io_dtype.empty() ? (quantized ? "fp32" : "program") : o.io_dtype;
    check(io == "program" || io == "fp32", "--io-dtype {}: program or fp32", o.io_dtype);
    if (want == "fp32" && narrow && !keep_both) {
      progress(fmt::format("widening the {} program to float32{}", r.program_dtype,
                           io == "fp32" ? ", its inputs and outputs too" : ""));
      pt2::widen_to_float(ep, io == "fp32" ? pt2::WidenIo::Widen : pt2::WidenIo::Keep);
      r.io_widened = ep.io_widened;
      r.stored_dtype = "float32";
      quant.source = *narrow == ScalarType::BFloat16 ? backends::xnnpack::QuantScheme::Source::BFloat16
                                                       : backends::xnnpack::QuantScheme::Source::Half;
    }
  }
  const double t_read = seconds_since(t0);

  progress(fmt::format("lowering {} nodes to edge form", ep.graph.nodes.size()));
  // A program with symbolic sizes is lowered at its upper bounds and its size expressions recovered (dynamic.h).
  // 8da4w / 8da8w read each linear weight from the .pt2 as it is quantized (no transposed fp32 copy of
  // the model in memory: what lets a 1B-parameter model lower in a fraction of its fp32 size)
  passes::EdgeOptions edge_options;
  using QK = backends::xnnpack::QuantScheme::Kind;
  edge_options.fold_weight_transposes = quant.kind != QK::Int4Groups && quant.kind != QK::Int8Channels;
  // A dynamic program's XNNPACK delegates keep linear weights [N, K], as the file has them: the layout
  // one-token steps stream (kiln's runtime keeps one layout for every size; its GEMM reads it too)
  if (!ep.graph.symbols.empty() && xnnpack) edge_options.fold_weight_transposes = false;
  passes::EdgeProgram edge = ep.graph.symbols.empty() ? passes::to_edge(ep, &r.lowering, edge_options)
                                                      : passes::to_edge_dynamic(ep, &r.lowering, edge_options);
  if (embedding_quant.bits != 0) {
    progress(fmt::format("quantizing embedding tables (int{})", embedding_quant.bits));
    backends::xnnpack::EmbeddingQuantReport eq_report;
    r.quantized_embeddings = backends::xnnpack::quantize_embeddings(edge, embedding_quant, &eq_report);
    r.embedding_tables = std::move(eq_report.tables);
    r.streamed_embeddings = std::move(eq_report.streamed);
    r.embedding_quantization = embedding_quant.name();
  }
  const double t_edge = seconds_since(t0);
  if (r.lowering.prequantized_linears > 0)
    check(xnnpack, "{}: the program is quantized already ({} linear layers with torchao's quantized weights and "
                   "dynamically quantized activations): kiln lowers quantized programs for --backend xnnpack",
          spec.exported_program, r.lowering.prequantized_linears);

  if (!xnnpack && quant.kind != QK::None) {
    std::function<bool(const graph::Node&, graph::ValueId)> keep_fp32;
    if (skip)  // as on the XNNPACK path: the layer's module path, its node's name, its weight's names
      keep_fp32 = [&](const graph::Node& n, graph::ValueId w) {
        auto hit = [&](const std::string& s) { return !s.empty() && std::regex_search(s, *skip); };
        const auto c = edge.constants.find(w);
        return hit(n.module_path) || hit(n.name) || hit(edge.graph.value(w).name) ||
               (c != edge.constants.end() && hit(c->second.name));
      };
    r.portable_quantization = quant.name();
    if (quant.kind == QK::Int8WeightOnly) {
      progress("quantizing linear weights to int8 (weight only)");
      const auto st = backends::xnnpack::quantize_weights_int8_only(edge, keep_fp32, quant.scales);
      r.portable_quantized_nodes = r.portable_quantized_weights = st.quantized;
      r.portable_kept_fp32 = st.kept_fp32;
    } else {
      progress(fmt::format("quantizing linear layers ({}: ExecuTorch's quantized_decomposed ops)", quant.name()));
      passes::PortableQuantOptions po;
      po.group = quant.kind == QK::Int4Groups ? quant.group : 0;
      po.keep_fp32 = keep_fp32;
      po.quantize = [&](const float* w, int64_t n, int64_t k) {
        // the XNNPACK path's quantizer (the same values): int4 two a byte (even input low, q + 8) with bf16
        // scales, or int8 with fp32 scales; ExecuTorch's mixed_linear reads int8 values and fp32 scales
        backends::xnnpack::QuantizedWeights qw = backends::xnnpack::quantize_weights(w, n, k, quant);
        passes::PortableQuantizedWeight pq;
        pq.q.resize(static_cast<size_t>(n * k));
        if (quant.kind == QK::Int4Groups) {
          for (size_t i = 0; i < pq.q.size(); ++i) {
            const auto b = static_cast<uint8_t>(qw.data.at(i / 2));
            pq.q[i] = static_cast<int8_t>(((i & 1) ? (b >> 4) : (b & 0x0f)) - 8);
          }
          pq.scales.resize(qw.scales.size() / 2);
          for (size_t i = 0; i < pq.scales.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, qw.scales.data() + 2 * i, 2);
            const uint32_t u = static_cast<uint32_t>(h) << 16;
            std::memcpy(&pq.scales[i], &u, 4);
          }
        } else {
          std::memcpy(pq.q.data(), qw.data.data(), pq.q.size());
          pq.scales.resize(qw.scales.size() / 4);
          std::memcpy(pq.scales.data(), qw.scales.data(), qw.scales.size());
        }
        return pq;
      };
      const auto st = passes::quantize_linears_portable(edge, po);
      r.portable_quantized_nodes = st.quantized;
      r.portable_quantized_weights = st.weights;
      r.portable_kept_fp32 = st.kept_fp32;
    }
    if (r.portable_quantized_nodes == 0)
      fail("--quantize {}: nothing in {} was quantized: {}", o.quantize, spec.exported_program,
           r.portable_kept_fp32 > 0
               ? fmt::format("--quantize-skip '{}' keeps all {} linear layers fp32", o.quantize_skip,
                             r.portable_kept_fp32)
               : fmt::format("it has no linear layer (mm, addmm or linear) whose weight is a constant float32 [N, K] "
                             "matrix (the program is {})", r.program_dtype));
    if (skip && r.portable_kept_fp32 == 0)
      r.warnings.push_back(fmt::format("--quantize-skip '{}' matches no linear layer: every layer is quantized",
                                       o.quantize_skip));
  }

  std::optional<backends::xnnpack::XnnpackDelegation> delegation;
  if (xnnpack) {
    progress(fmt::format("partitioning {} edge nodes for XNNPACK{}, building payloads", edge.graph.nodes.size(),
                         o.per_op ? " (one region per node)" : ""));
    backends::xnnpack::PayloadOptions payload_options;
    std::function<bool(const graph::Node&, graph::ValueId)> keep_fp32;
    if (skip)  // the layer's module path, its node's name, its weight's value name and parameter name
      keep_fp32 = [&](const graph::Node& n, graph::ValueId w) {
        auto hit = [&](const std::string& s) { return !s.empty() && std::regex_search(s, *skip); };
        const auto c = edge.constants.find(w);
        return hit(n.module_path) || hit(n.name) || hit(edge.graph.value(w).name) ||
               (c != edge.constants.end() && hit(c->second.name));
      };
    partition::PartitionOptions partition_options;
    partition_options.per_op = o.per_op;
    int64_t kept_tied = 0;  // tied linear products --quantize-skip keeps fp32
    backends::xnnpack::WeightOnlyStats weight_only;
    if (quant.kind == backends::xnnpack::QuantScheme::Kind::Int8WeightOnly) {
      progress("quantizing linear weights to int8 (weight only)");
      weight_only = backends::xnnpack::quantize_weights_int8_only(edge, keep_fp32, quant.scales);
    } else {
      payload_options.quantize = quant;
      payload_options.keep_fp32 = keep_fp32;
      if (quant.kind != backends::xnnpack::QuantScheme::Kind::None) {
        const auto untied = backends::xnnpack::untie_quantized_linear_weights(edge, keep_fp32);
        partition_options.transformed_constants.insert(untied.copies.begin(), untied.copies.end());
        r.untied_weights = static_cast<int64_t>(untied.copies.size());
        kept_tied = untied.kept_fp32;
        if (o.quantize_head == 8) {  // the head's weight (its own copy when tied) 8da8w, as --quantize auto's choices
          r.head_8bit = backends::xnnpack::find_output_head(edge, keep_fp32);
          check(r.head_8bit.has_value(), "--quantize-head 8: {} has no linear layer to call its head",
                spec.exported_program);
          check(!r.head_8bit->kept_fp32, "--quantize-head 8: --quantize-skip '{}' keeps the head '{}' fp32",
                o.quantize_skip, r.head_8bit->layer);
          backends::xnnpack::QuantScheme q8 = quant;
          q8.kind = backends::xnnpack::QuantScheme::Kind::Int8Channels;
          payload_options.per_weight[r.head_8bit->weight] = q8;
        }
        // --quantize auto: the plan (with --calibrate, after AWQ's scales and before GPTQ); --quantize-head 8 makes
        // the head int8 outside the knapsack
        std::set<graph::ValueId> forced_int8;
        if (r.head_8bit) forced_int8.insert(r.head_8bit->weight);
        auto make_plan = [&](passes::EdgeProgram& e) {
          progress(fmt::format("--quantize auto: measuring each linear layer's int4 and int8 error, budget {:.2f} MB",
                               static_cast<double>(o.max_size_bytes) / 1e6));
          r.max_size_bytes = o.max_size_bytes;
          r.auto_plan = backends::xnnpack::plan_mixed_precision(e, o.max_size_bytes, quant, keep_fp32, forced_int8);
          return r.auto_plan->schemes;
        };
        if (!o.calibrate.empty() || o.calibrate_self > 0) {
          r.calibration = calibrate(edge, spec, o, quant, keep_fp32, payload_options.per_weight,
                                    quant_auto ? compiler::CalibrationPlanner(make_plan)
                                               : compiler::CalibrationPlanner{});
          payload_options.precomputed = std::move(r.calibration->precomputed);
          r.calibration->precomputed.clear();
        }
        if (quant_auto) {
          if (!r.auto_plan) make_plan(edge);
          payload_options.per_weight = r.auto_plan->schemes;
        }
      }
    }
    delegation = backends::xnnpack::delegate_to_xnnpack(edge, partition_options, payload_options);
    r.delegation = delegation->summary;
    r.delegation->kept_fp32_nodes += kept_tied;
    if (r.auto_plan) {
      int64_t int8 = 0;
      for (const auto& L : r.auto_plan->layers) int8 += L.int8;
      r.delegation->quantization =
          fmt::format("auto: {} x {}, {} x 8da8w", static_cast<int64_t>(r.auto_plan->layers.size()) - int8,
                      quant.name(), int8);
    }
    if (r.head_8bit) r.delegation->quantization = fmt::format("{}, head 8da8w", r.delegation->quantization);
    if (quant.kind == backends::xnnpack::QuantScheme::Kind::Int8WeightOnly) {
      r.delegation->quantization = quant.name();
      r.delegation->quantized_nodes = weight_only.quantized;  // dequantize nodes (one per weight)
      r.delegation->kept_fp32_nodes = weight_only.kept_fp32;
    }
    if (r.delegation->prequantized_nodes != r.lowering.prequantized_linears)
      fail("{}: {} of the {} quantized linear layers did not become XNNPACK's dynamically quantized fully connected "
           "nodes (their activations would run unquantized): kiln cannot lower this program faithfully",
           spec.exported_program, r.lowering.prequantized_linears - r.delegation->prequantized_nodes,
           r.lowering.prequantized_linears);
    if (r.delegation->prequantized_nodes > 0) {
      const auto& d = *r.delegation;
      std::string pre = d.prequantized_bits == 4   ? (d.prequantized_group > 0 ? fmt::format("8da4w:{}", d.prequantized_group)
                                                                               : std::string("8da4w"))
                        : d.prequantized_bits == 8 ? std::string("8da8w")
                                                   : std::string("8da4w+8da8w");
      pre += " (quantized in the .pt2)";
      r.delegation->quantization = r.delegation->quantization == "none" ? pre : r.delegation->quantization + ", " + pre;
    }
    if (quant.kind != QK::None && r.delegation->quantized_nodes == 0)
      fail("--quantize {}: nothing in {} was quantized: {}", o.quantize, spec.exported_program,
           r.delegation->kept_fp32_nodes > 0
               ? fmt::format("--quantize-skip '{}' keeps all {} linear layers fp32", o.quantize_skip,
                             r.delegation->kept_fp32_nodes)
               : fmt::format("it has no linear layer (mm, addmm or linear) whose weight is a constant float32 "
                             "[N, K] matrix{} that XNNPACK's quantized fully connected node takes (the program is {})",
                             quant.kind == QK::Int4Groups ? fmt::format(" with K a multiple of {}", quant.group) : "",
                             r.program_dtype));
    if (skip && r.delegation->kept_fp32_nodes == 0)
      r.warnings.push_back(fmt::format("--quantize-skip '{}' matches no linear layer: every layer is quantized",
                                       o.quantize_skip));
  }
  const double t_partition = seconds_since(t0);

  pte::Program program;
  if (delegation) {
    progress(fmt::format("emitting {} delegate calls and {} portable nodes, planning memory",
                         delegation->regions.size(), delegation->summary.fallback_count));
    program = emit::emit_program(edge, delegation->regions, &r.report);
  } else {
    progress(fmt::format("emitting {} kernel calls, planning memory", edge.graph.nodes.size()));
    program = emit::emit_program(edge, &r.report);
  }
  // Constant methods: no inputs, no instructions, every value an output (ExecuTorch's form).
  for (const auto& cm : spec.constant_methods) {
    check(cm.name != "forward", "{}: a constant method cannot be called 'forward'", spec.path);
    pte::ExecutionPlan plan;
    plan.name = cm.name;
    for (const auto& v : cm.values) {
      std::visit([&](const auto& x) { plan.values.emplace_back(x); }, v);
      plan.outputs.push_back(static_cast<int32_t>(plan.values.size() - 1));
    }
    program.plans.push_back(std::move(plan));
  }
  const double t_emit = seconds_since(t0);

  progress(fmt::format("writing {} ({:.1f} MB of constants, {:.1f} MB of named data)", out,
                       static_cast<double>(r.report.constant_bytes) / 1e6,
                       static_cast<double>(r.report.named_data_bytes) / 1e6));
  // The .pte, its metadata and its debug map are staged beside the output and published as one set
  // (kiln/core/output_file.h): a failure leaves none of them, concurrent lowerings one whole set each.
  StagedFile pte_file(out);
  pte_file.hash_contents();  // the metadata's pte_sha256, computed as the file is written (not read back)
  pte::write_pte(program, pte_file);
  const double t_write = seconds_since(t0);
  // What kiln computed for the file (quantized weights, folded constants) is in it now: freed before
  // verifying, which maps the file and prepares the method (repacking int4 weights into kiln's own
  // memory), so the two never coexist. The blobs keep their sizes; nothing reads their bytes again.
  auto drop_bytes = [](pte::DataBlob& b) { b.write = nullptr; };
  for (auto& nb : program.named_data) drop_bytes(nb.data);
  for (auto& b : program.constants) drop_bytes(b);
  if (delegation)
    for (auto& region : delegation->regions)
      for (auto& nb : region.named_data) drop_bytes(nb.data);
  malloc_trim(0);  // glibc keeps freed heap blocks otherwise

  // Round trip: the file must load in kiln's verified loader and its method
  // must prepare (kernels resolved, memory planned, delegates initialized)
  // before it takes the final name. kiln's XNNPACK backend is registered
  // here if the caller has not done it (registering it again would reset the
  // caller's settings).
  r.pte_sha256 = pte_file.sha256();  // (closes the file: the hash is of what was written)
  // The debug map (JSON of the edge graph, ~0.2 s for an LLM) is built on a thread of its own while the file is
  // verified: neither changes what the other reads (the map reads the edge graph, the delegation and the report;
  // verification the written file, and it sets only r.verified and r.unverified_backends)
  const std::string map_path = fs::path(out).replace_extension(".debug.json").string();
  std::future<std::pair<std::string, double>> map_json;
  if (o.debug_map) {
    DebugMapInput dm{&edge, delegation ? &*delegation : nullptr, &r.report, fs::path(out).filename().string(),
                     spec.exported_program, std::string(backend), r.pte_sha256};
    map_json = std::async(std::launch::async, [dm] {
      const auto t_map = Clock::now();
      std::string json = debug_map_json(dm);
      return std::make_pair(std::move(json), seconds_since(t_map));
    });
  }
  if (o.verify) {
    if (xnnpack && rt::find_backend("XnnpackBackend") == nullptr) backends::xnnpack::register_runtime_backend();
    verify(program, pte_file.path(), out, r, progress);
  }
  r.pte_size = pte_file.written();
  if (r.auto_plan && r.pte_size > static_cast<uint64_t>(o.max_size_bytes))
    fail("--max-size {:.2f} MB: the file came out at {:.2f} MB (estimated {:.2f} MB); the estimate "
         "was short: give --max-size {:.2f} MB less",
         static_cast<double>(o.max_size_bytes) / 1e6, static_cast<double>(r.pte_size) / 1e6,
         static_cast<double>(r.auto_plan->estimate) / 1e6,
         static_cast<double>(r.pte_size - static_cast<uint64_t>(o.max_size_bytes)) / 1e6);
  const double total = seconds_since(t0);
  r.seconds = {t_read, t_edge - t_read, t_partition - t_edge, t_emit - t_partition, t_write - t_emit, total};

  std::optional<StagedFile> map_file;
  if (o.debug_map) {  // X.pte -> X.debug.json
    const auto t_map = Clock::now();
    r.debug_map_path = map_path;
    auto [json, build_seconds] = map_json.get();
    map_file.emplace(map_path);
    map_file->write(json);
    map_file->close();
    r.seconds.debug_map = build_seconds + seconds_since(t_map);  // building it (beside verification) and writing it
  }
  std::optional<StagedFile> etrecord_file;
  if (!o.etrecord.empty()) {  // ExecuTorch's devtools format, published with the set
    const auto t_etr = Clock::now();
    progress(fmt::format("writing the ETRecord {}", o.etrecord));
    r.etrecord_path = o.etrecord;
    etrecord_file.emplace(o.etrecord);
    write_etrecord({&ep, &edge, delegation ? &*delegation : nullptr, &r.report, &spec}, *etrecord_file);
    etrecord_file->close();
    r.seconds.etrecord = seconds_since(t_etr);
  }
  r.metadata_json = metadata(r);
  StagedFile meta_file(r.metadata_path);
  meta_file.write(r.metadata_json);
  std::vector<StagedFile*> set;
  if (map_file) set.push_back(&*map_file);
  if (etrecord_file) set.push_back(&*etrecord_file);
  set.push_back(&meta_file);
  set.push_back(&pte_file);  // last: a new .pte appears only once its metadata and debug map are in place
  std::vector<std::string> stale;
  if (!o.debug_map) stale.push_back(map_path);  // a map from an earlier lowering would describe another program
  publish_together(set, stale);
  return r;
}

LowerResult write_lowered(const LowerResult& r, const std::string& out) {
  check(fs::path(out).extension() == ".pte", "{}: the output must end in .pte", out);
  LowerResult w = r;
  w.pte_path = out;
  w.metadata_path = fs::path(out).replace_extension(".json").string();
  const std::string map_path = fs::path(out).replace_extension(".debug.json").string();
  StagedFile pte_file(out);
  {
    std::ifstream in(r.pte_path, std::ios::binary);
    check(in.good(), "{}: cannot read the lowered program", r.pte_path);
    std::vector<char> buf(1 << 20);
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) pte_file.write(buf.data(), static_cast<size_t>(in.gcount()));
    }
    check(in.eof(), "{}: cannot read the lowered program", r.pte_path);
  }
  pte_file.close();
  check(pte_file.written() == r.pte_size, "{}: the lowered program changed size since it was written", r.pte_path);
  std::optional<StagedFile> map_file;
  if (!r.debug_map_path.empty()) {  // the map names its .pte's file name
    std::ifstream in(r.debug_map_path);
    check(in.good(), "{}: cannot read the debug map", r.debug_map_path);
    json map = json::parse(in);
    map["pte"] = fs::path(out).filename().string();
    w.debug_map_path = map_path;
    map_file.emplace(map_path);
    map_file->write(map.dump(1) + "\n");
  }
  w.metadata_json = metadata(w);
  StagedFile meta_file(w.metadata_path);
  meta_file.write(w.metadata_json);
  std::vector<StagedFile*> set;
  if (map_file) set.push_back(&*map_file);
  set.push_back(&meta_file);
  set.push_back(&pte_file);
  std::vector<std::string> stale;
  if (!map_file) stale.push_back(map_path);
  publish_together(set, stale);
  return w;
}

}  // namespace kiln
