// kiln::lower: the whole lowering as one library call (what `kiln lower` runs).
//
//   kiln::LowerOptions o;
//   o.backend = kiln::LowerBackend::Xnnpack;
//   o.progress = [](std::string_view line) { std::fprintf(stderr, "%.*s\n", int(line.size()), line.data()); };
//   kiln::LowerResult r = kiln::lower("artifacts/gpt2/model_spec.json", o);   // throws kiln::Error
//   // r.pte_path, r.metadata_path, r.report, r.delegation, r.seconds ...
//
// Stages: read the .pt2 the spec names -> passes (edge form) -> with XNNPACK,
// partition into convex regions and build their payloads -> emit (memory
// planning, constants) -> write the .pte under a temporary name -> verify (load
// it back with kiln's verified loader and prepare its method, delegates
// included, when kiln's runtime has their backends) -> rename into place ->
// write the metadata JSON beside it (also atomically). A failure at any stage
// throws kiln::Error and leaves no output file behind. Nothing is printed:
// progress goes to the optional callback.
#pragma once

#include "kiln/compiler/calibrate.h"
#include "kiln/emit/emitter.h"
#include "kiln/backends/xnnpack/partitioner.h"
#include "kiln/passes/edge_program.h"
#include "kiln/pt2/model_spec.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

enum class LowerBackend { Portable, Xnnpack };

// "portable" / "xnnpack": the name in file names, metadata and messages.
std::string_view lower_backend_name(LowerBackend b);

struct LowerOptions {
  LowerBackend backend = LowerBackend::Portable;
  // Output .pte; empty: <spec directory>/<name>_<backend>.pte. The metadata
  // JSON goes beside it with the same stem.
  std::string out;
  bool per_op = false;  // XNNPACK only: one delegate call per supported node
  // XNNPACK only: "8da4w[:32|64|128|256]" or "8da8w" quantizes the linear
  // layers' weights (backends/xnnpack/quantize.h); empty: fp32.
  std::string quantize;
  // With `quantize`: how the weight scales are chosen, "minmax" (torchao's rule)
  // or "mse" (the least reconstruction error); empty: mse (quantize.h).
  std::string quantize_scales;
  // "4[:G]" or "8[:G]": embedding tables of constants become ExecuTorch's
  // quantized_decomposed::embedding_4bit / embedding_byte lookups (portable
  // kernels; backends/xnnpack/quantize.h); empty: fp32. Either backend.
  std::string quantize_embedding;
  // With quantize 8da4w (xnnpack): 4 (the default) keeps the LM head (the output projection, tied or not) 8da4w like
  // the other layers; 8 makes it 8da8w (int8 per channel), through PayloadOptions::per_weight as --quantize auto does.
  int64_t quantize_head = 4;
  // A named recipe the caller expanded into the options above (kiln lower --recipe llm-int4): recorded in
  // the metadata with `recipe_choices`, one "flag value (why)" or "flag value (given: overrides ...)" line each.
  std::string recipe;
  std::vector<std::string> recipe_choices;
  // With `quantize`: linear layers whose module path (the .pt2's nn_module_stack,
  // "lm_head", "model.layers.0.mlp.down_proj"), node name or weight name the
  // regex (ECMAScript, searched) matches stay fp32. Matching none is a warning.
  std::string quantize_skip;
  // What a bfloat16 / float16 program's values become: "fp32" (widened exactly as they are read: XNNPACK's
  // regions, its quantized products among them, compute float32; `quantize` then quantizes from the 16-bit
  // weights, torchao's arithmetic on them under the minmax rule) or "bf16" (kept as they are: kiln's and
  // ExecuTorch's portable kernels compute bfloat16; no XNNPACK region takes them, so no `quantize`). Empty:
  // fp32 for XNNPACK, the program's own type for the portable backend. A float32 program stays float32.
  std::string dtype;
  // When a 16-bit program is widened (`dtype` fp32): "program" keeps its user inputs and outputs in their 16-bit
  // type (the .pte takes and returns what the exported program does, in any runtime; converted at the edges) or
  // "fp32" widens them too. Empty: fp32 with `quantize` or `quantize_embedding` (an LLM's sampler reads float32
  // logits; the quantized products take float32 activations anyway), "program" otherwise.
  std::string io_dtype;
  // With `quantize`: a text file the fp32 program runs over (kiln's runtime) before quantizing; its linear
  // layers' input statistics rescale their weights (compiler/calibrate.h). Empty: none.
  std::string calibrate;
  // With `calibrate`: a method as compiler/calibrate.h parses it (awq, gptq, awq+gptq, gptq-act, +refit, +seq). Empty: awq+gptq
  // (--quantize auto too: the plan after AWQ's scales, GPTQ to each layer's chosen form).
  std::string calibrate_method;
  // Data-free self-calibration (--calibrate-self N): instead of a text, N tokens the fp32 program samples itself
  // (compiler/calibrate.h). 0: none.
  int64_t calibrate_self = 0;
  // With quantize "auto": the file's size budget in bytes; each linear layer becomes 8da4w or 8da8w by its
  // measured sensitivity within it (backends/xnnpack/quantize.h: plan_mixed_precision). 0: none.
  int64_t max_size_bytes = 0;
  bool verify = true;   // load the written program back before it takes its name
  // Write the debug map beside the .pte (X.pte -> X.debug.json, docs/PROFILING.md).
  bool debug_map = true;
  // Also write an ETRecord (ExecuTorch's devtools format, kiln/compiler/etrecord.h) at this path,
  // published with the .pte; empty: none.
  std::string etrecord;
  // Called once per stage with a one-line description (no newline); may be empty.
  std::function<void(std::string_view)> progress;
};

// Seconds per stage (wall clock).
struct LowerTimings {
  double read_pt2 = 0, to_edge = 0, partition = 0, emit = 0, write = 0, total = 0;
  double debug_map = 0;  // after total: writing X.debug.json
  double etrecord = 0;   // after total: writing the ETRecord
};

struct LowerResult {
  pt2::ModelSpec spec;
  LowerBackend backend = LowerBackend::Portable;
  bool per_op = false;
  std::string pte_path;
  std::string metadata_path;
  std::string debug_map_path;  // empty when LowerOptions::debug_map is off
  std::string etrecord_path;   // empty unless LowerOptions::etrecord is set
  uint64_t pte_size = 0;  // bytes
  std::string pte_sha256;  // of the .pte as written (its metadata records it: the two belong together)
  passes::LoweringStats lowering;
  emit::EmitReport report;
  std::optional<backends::xnnpack::DelegationSummary> delegation;  // XNNPACK lowerings
  std::string embedding_quantization = "none";  // --quantize-embedding ("4:32", "8")
  int64_t quantized_embeddings = 0;              // embedding lookups rewritten to quantized tables
  std::vector<std::string> embedding_tables;     // one line per quantized table (its shape before and after)
  std::vector<std::string> streamed_embeddings;  // tables quantized again as the file was written (not held)
  std::string recipe;                            // LowerOptions::recipe
  std::vector<std::string> recipe_choices;
  std::optional<compiler::CalibrationResult> calibration;  // with LowerOptions::calibrate
  // The program's floating-point type as read ("float32", "bfloat16", "float16") and what its unquantized values
  // are stored and computed as in the .pte (the same, or "float32" when widened)
  std::string program_dtype = "float32", stored_dtype = "float32";
  bool io_widened = false;  // a widened program's 16-bit user inputs and outputs widened too (LowerOptions::io_dtype)
  std::optional<backends::xnnpack::AutoPlan> auto_plan;  // --quantize auto: the per-layer choices
  int64_t max_size_bytes = 0;                            // --max-size, in bytes
  std::optional<backends::xnnpack::HeadLayer> head_8bit;  // --quantize-head 8: the layer made 8da8w
  int64_t untied_weights = 0;  // tied weights given a copy of their own for their quantized linear products
  // --backend portable --quantize: the scheme ("8da4w:32 (mse scales)", "none") and the linear products rewritten to
  // ExecuTorch's quantized_decomposed per-token activation quantization and mixed_linear (kiln/passes/quantize_portable.h)
  std::string portable_quantization = "none";
  int64_t portable_quantized_nodes = 0, portable_quantized_weights = 0, portable_kept_fp32 = 0;
  // Verification: whether it ran, and the delegate backends kiln's runtime
  // lacked (then only the loader checked the file, the method was not prepared).
  bool verified = false;
  std::set<std::string> unverified_backends;
  LowerTimings seconds;
  std::vector<std::string> warnings;  // one line each (e.g. a --quantize-skip regex that matched nothing)
  std::string metadata_json;  // what was written to metadata_path
};

// Publishes a finished lowering's files again under another name (the Python package's
// LoweredProgram.write): the .pte's bytes from r.pte_path to `out`, its metadata JSON (as kiln::lower
// writes it, naming `out`) and debug map beside it, staged and published as one set as kiln::lower
// does. Returns the result with the new paths. Throws kiln::Error; leaves no partial file.
LowerResult write_lowered(const LowerResult& r, const std::string& out);

// Lowers the program `spec_path` (a model_spec.json) names. Throws kiln::Error.
LowerResult lower(const std::string& spec_path, const LowerOptions& options);
// The same for a spec already read (pt2::read_model_spec).
LowerResult lower(const pt2::ModelSpec& spec, const LowerOptions& options);

}  // namespace kiln
