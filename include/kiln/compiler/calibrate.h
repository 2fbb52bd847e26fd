// Activation-aware weight scaling from a calibration text (kiln lower --calibrate FILE; issue 39).
//
// kiln runs the fp32 program in its own runtime over the tokenized text and collects, for every input that linear
// layers read (a norm's output feeding q/k/v, the gated product feeding down_proj, ...), per input channel i the
// mean |x_i| and mean x_i^2. Per such input it then picks s_i = mean|x_i|^alpha (normalised by sqrt(max s * min s);
// alpha on a grid 0, 0.1, ..., 1, the AWQ rule) minimising the quantized layers' output error proxy
//   sum_layers sum_rows sum_i (W[r,i] - Q(W diag(s))[r,i] / s_i)^2 * mean x_i^2
// (Q: the lowering's own quantizer and scale rule; alpha 0 is today's weights, so the proxy never gets worse),
// multiplies the weights' columns by s and folds 1/s into what produces the input: the RMSNorm's weight (a
// constant 1-D multiplier whose output only these layers read) or the rows of the linear layer whose output is
// one factor of the gated product. Then, for 8da4w with mse scales, each int4 group of the scaled weights gets the
// bf16 scale and codes minimising its error weighted by the input's mean x^2 (calibrate.cpp), written back as the
// grid values s q, which the payload's mse rule finds again exactly (counted: int4_groups_not_reproduced). Same
// graph, same format: only constants change. An input with neither producer is left alone. The weights changed
// are held in memory as fp32 until the payload quantizes them (the peak: ~1.2 GB for SmolLM2-135M).
#pragma once

#include "kiln/backends/xnnpack/quantize.h"
#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::compiler {

struct CalibrationResult {
  int64_t tokens = 0;           // calibration tokens run
  int64_t inputs_scaled = 0;    // inputs whose channels were rescaled (alpha > 0)
  int64_t inputs_found = 0;     // inputs with a foldable producer
  int64_t layers_scaled = 0;    // linear layers whose weight columns were rescaled
  double proxy_before = 0, proxy_after = 0;  // the error proxy summed over the inputs, alpha 0 and chosen
  // 8da4w with mse scales: int4 groups given output-aware codes (calibrate.cpp; the others keep the plain rule's,
  // which were as good), and how many of them the payload's quantizer does not store exactly as found (0
  // expected: the written grid is re-found exactly)
  int64_t groups = 0, groups_kept = 0;
  double run_seconds = 0, search_seconds = 0;
  std::vector<std::string> choices;  // one line per input: the producer, the layers, alpha, the proxy's change
  // GPTQ (CalibrationMethod::gptq): the layers quantized with error feedback, the inputs never seen
  // (zero diagonal), the Gram matrices' memory (float, k^2 per input, all held from the run to the search), the
  // GPTQ objective sum (w - q) H (w - q)^T over a sample of rows (every 32nd) for the plain rule's q and GPTQ's
  std::string method;
  int64_t gptq_layers = 0, gptq_dead_inputs = 0, gram_bytes = 0;
  int64_t gptq_stages = 0;  // +seq: the stages (one run of the program each but the first)
  double gptq_objective_plain = 0, gptq_objective = 0, gptq_seconds = 0;
  // per weight: its quantization (GPTQ), for PayloadOptions::precomputed
  std::map<graph::ValueId, std::pair<backends::xnnpack::QuantScheme, backends::xnnpack::QuantizedWeights>> precomputed;
};

// What --calibrate-method names, its parts joined by '+' (parse_calibration_method):
// awq: AWQ channel scales + output-aware int4 groups (the diagonal mean x^2 proxy); gptq: GPTQ's error feedback on
// the Gram matrix X^T X per input (quantize.h: quantize_weights_gptq); awq+gptq: AWQ's scales, then GPTQ on the
// rescaled weights and H. GPTQ's damping: 1% of H's mean diagonal with at least 2k calibration tokens for k inputs,
// 10% with at least k, else 100% (calibrate.cpp).
// gptq-act: GPTQ with its act-order in the "static groups" form (the columns in decreasing diag(H) order, every
// group's scale the plain rule's on the original weights).
// +refit: after GPTQ, with its int4 codes kept, each row's bf16 group scales re-fitted jointly to the layer objective
// (w - Q s)^T H (w - Q s), H damped as GPTQ's (exact least squares over the row's scales; kept per row only where
// the stored scales lower it). Same file format; 8da4w layers only.
// +seq: sequential GPTQ: without it every layer's H comes from one run of the fp32 program; with it the inputs are
// taken in the program's order, in stages, and each stage's H from a run of the program whose earlier layers already
// hold their quantized weights (GPTQ's own procedure: a layer compensates the error of the layers before it). One run
// of the program per stage (calibrate.cpp: about one per transformer block).
struct CalibrationMethod {
  bool awq = true, gptq = false, act_order = false, refit = false, sequential = false;
  bool operator==(const CalibrationMethod&) const = default;
};
std::optional<CalibrationMethod> parse_calibration_method(std::string_view text, std::string* error);
std::string calibration_method_name(const CalibrationMethod& m);

// `scheme` is the lowering's (8da4w or 8da8w); `keep_fp32` the --quantize-skip test (layers it keeps count no
// error, their weights are still rescaled so the product is unchanged); `max_positions` the KV cache's length
// (texts are cut into windows of that many tokens, each from position 0). Throws kiln::Error with one line on
// bad input (an unreadable text, no tokenizer, a program that is not forward(tokens, input_pos)).
// --quantize auto: called once AWQ's scales are folded into `edge` (before GPTQ); returns the scheme per weight
// (int4 or int8), which GPTQ and the result's precomputed weights then use
using CalibrationPlanner =
    std::function<std::map<graph::ValueId, backends::xnnpack::QuantScheme>(passes::EdgeProgram&)>;
CalibrationResult calibrate_awq(passes::EdgeProgram& edge, const std::string& text_path,
                                const std::string& tokenizer_path, int64_t max_positions,
                                const backends::xnnpack::QuantScheme& scheme,
                                const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                                const std::function<void(std::string_view)>& progress,
                                CalibrationMethod method = {}, int64_t self_tokens = 0,
                                bool scales_only = false,
                                const std::map<graph::ValueId, backends::xnnpack::QuantScheme>& per_weight = {},
                                const CalibrationPlanner& plan = {});
// (self_tokens > 0: data-free self-calibration, --calibrate-self N: the text is N tokens the fp32 program samples
// itself, windows of max_positions from the BOS token; text_path is not read)
// (scales_only: AWQ's channel scales only, no output-aware int4 groups: --quantize auto, which picks int4 or int8
// per layer after calibration, so no weight may be rounded to an int4 grid here; with GPTQ, `plan` gives the
// schemes GPTQ quantizes to)

}  // namespace kiln::compiler
