// Weight quantization at lowering time (kiln lower --quantize), in C++. The
// formats are torchao's Int8DynamicActivationIntxWeightConfig (SYMMETRIC, no zero
// point) as ExecuTorch's XNNPACK delegate stores them:
//   8da4w[:G]  int4 weights per group of G inputs (32 default; 64, 128, 256),
//              q = clamp(round(w / scale), -8, 7), one bf16 scale per group
//   8da8w      int8 weights per output channel, q = clamp(round(w / scale),
//              -128, 127), one fp32 scale per channel
// How each scale is chosen (--quantize-scales, ScaleRule):
//   minmax     torchao's rule (AFFINE, eps None = the smallest normal float):
//              scale = max(|w|) / 7.5 (int4) or / 127.5 (int8) over the group,
//              q from that fp32 scale (w * (1 / scale), round half to even),
//              the scale then rounded to bf16 for int4 as the file stores it
//   mse        (the default) the scale, as stored (bf16 for int4), that
//              minimises the group's reconstruction error sum (w - scale q)^2
//              by a clipping-ratio search with least-squares refits
//              (quantize.cpp), q from the stored scale; never a larger error
//              than minmax's for the same group (minmax is one candidate)
//   asym       (8da4w, opt-in) an affine grid per group: w ~ scale q + offset,
//              q in [-8, 7], the bf16 scale and the fp32 offset least-squares
//              fits (quantize.cpp: asym_fit; never a larger error than mse's,
//              which is one candidate with offset 0). The codes and scales are
//              stored as mse's (qb4w, bf16 scales: ExecuTorch's format); the
//              offsets as an fp32 [N, K/G] matrix C, applied in the same XNNPACK
//              region by two small fp32 fully connected nodes: the input's group
//              sums S = x G^T (G [K/G, K] of ones) and the product S C^T, added
//              to the int4 product (y = Q(x) (scale q)^T + S C^T). A 4-bit GGUF's
//              Q4_1 / Q4_K weights (a minimum and a scale per group) lie on such a
//              grid; a symmetric one cannot hold them. 8da8w layers keep mse.
// Activations are quantized per row at run time (int8, asymmetric; see
// kiln/cpu/quant.h). Stored in ExecuTorch's XNNPACK layouts: int4 two per byte,
// the even input in the low nibble, as q + 8, with bf16 scales; int8 as is,
// with fp32 scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::graph {
struct Node;
using ValueId = int32_t;
}  // namespace kiln::graph
namespace kiln::passes {
struct EdgeProgram;
}

namespace kiln::backends::xnnpack {

enum class ScaleRule : uint8_t { MinMax, Mse, Asym };

std::string_view scale_rule_name(ScaleRule r);  // "minmax", "mse", "asym"
// "minmax", "mse" or "asym"; std::nullopt and *error set otherwise.
std::optional<ScaleRule> parse_scale_rule(std::string_view text, std::string* error);

struct QuantScheme {
  // Int8WeightOnly (int8w): per-channel int8 weights, fp32 activations. ExecuTorch
  // lowers torchao's weight-only int8 into its XNNPACK fully connected node itself
  // (fp32 input x qcint8 filter); kiln's runtime has no such kernel yet, so kiln emits
  // the other form ExecuTorch's runtime runs: quantized_decomposed::dequantize_per_channel
  // on the portable path feeding the fp32 product (quantize_weights_int8_only).
  enum class Kind : uint8_t { None, Int4Groups, Int8Channels, Int8WeightOnly } kind = Kind::None;
  int64_t group = 32;  // Int4Groups
  ScaleRule scales = ScaleRule::Mse;  // how the weight scales are chosen (Int4Groups, Int8Channels, Int8WeightOnly)
  // The type the weights had in the .pt2 (a bf16 / fp16 program, widened to fp32 exactly, kiln/pt2/pt2_reader.h's
  // widen_to_float). Under ScaleRule::MinMax the arithmetic is torchao's on weights of that type: its
  // choose_qparams_affine and quantize_affine compute in the weight's dtype, each operation rounded to it:
  // scale = max(round(max|w| / 7.5), eps) with eps that type's smallest normal (int8: / 127.5),
  // q = clamp(round_half_even(round(w * round(1 / scale)))). The int4 scale is stored as bf16 (exact from bf16;
  // from fp16 rounded, as XNNPACK's int4 blockwise scales are bf16), the int8 one as fp32 (exact).
  enum class Source : uint8_t { Float, BFloat16, Half } source = Source::Float;
  // "8da4w:32", "8da8w", "int8w", "none"; with " (mse scales)" appended under ScaleRule::Mse, " (asym: scale +
  // offset per group)" for int4 under ScaleRule::Asym (8da8w under Asym: " (mse scales)", the rule it uses)
  std::string name() const;
};

// "8da4w", "8da4w:64", "8da8w", "int8w"; std::nullopt and *error set otherwise.
std::optional<QuantScheme> parse_quant_scheme(std::string_view text, std::string* error);

struct QuantizedWeights {
  std::vector<std::byte> data;    // int4: [n, k/2] bytes; int8: [n, k]
  std::vector<std::byte> scales;  // int4: bf16 [n, k/group]; int8: fp32 [n]
  std::vector<std::byte> offsets; // int4 under ScaleRule::Asym only: fp32 [n, k/group] (w ~ scale q + offset)
};

// True when `scheme` stores an fp32 offset per int4 group (ScaleRule::Asym on Int4Groups).
inline bool has_offsets(const QuantScheme& scheme) {
  return scheme.kind == QuantScheme::Kind::Int4Groups && scheme.scales == ScaleRule::Asym;
}

// w: [n, k] row-major fp32. Int4Groups needs k % group == 0 and k even.
QuantizedWeights quantize_weights(const float* w, int64_t n, int64_t k, const QuantScheme& scheme);

// The threads kiln lower quantizes weights and embedding tables on: KILN_LOWER_THREADS when set (1 to 64), else the
// CPU's cores (at most 8). The bytes written never depend on it: rows quantize independently, each into its own
// place, and blocks are written in order.
int64_t lower_threads();

// The fp32 bytes of the blocks that weights and tables stream through quantization in: `usual`, or
// KILN_LOWER_BLOCK_BYTES when set (tests set it small so that a tiny model takes many blocks; the bytes written
// never depend on it).
int64_t lower_block_bytes(int64_t usual);

// quantize_weights of a [n, k] weight whose rows arrive a block at a time, in order (read from the .pt2 as they
// are): the caller fills block() with up to block_rows() rows and submit()s them, and reads the next block while
// up to lower_threads() workers quantize the ones submitted. At most lower_threads() + 1 blocks are in memory.
// finish() waits for every block and returns quantize_weights' bytes for the whole weight.
class StreamingQuantizer {
 public:
  StreamingQuantizer(int64_t n, int64_t k, const QuantScheme& scheme, int64_t block_rows);
  ~StreamingQuantizer();
  StreamingQuantizer(const StreamingQuantizer&) = delete;
  StreamingQuantizer& operator=(const StreamingQuantizer&) = delete;
  int64_t block_rows() const;
  float* block();              // the buffer to fill next: block_rows() x k floats
  void submit(int64_t rows);   // its first `rows` rows are the weight's next rows
  QuantizedWeights finish();   // every row quantized (checks that all n came)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- GPTQ-style error feedback (kiln lower --calibrate; quantize_gptq.cpp) ----------------------------------------
// The upper Cholesky factor U of (H + damp mean(diag H) I)^-1 (row-major [k, k]; H^-1 = U^T U) of a symmetric Gram
// matrix H = X^T X [k, k] (row-major, both triangles). A zero diagonal entry (an input never seen) becomes the mean
// diagonal first; `dead` (may be null) counts those.
// gram [k, k] row-major += the upper triangle (j >= i) of x x^T, x [k]
void gptq_gram_update(float* gram, const float* x, int64_t k);
std::vector<float> gptq_inverse_factor(std::vector<double> h, int64_t k, double damp, int64_t* dead);
// w [n, k] row-major fp32, quantized column by column with GPTQ's error feedback through U (gptq_inverse_factor):
// each group's scale (the whole row's for 8da8w) is `scheme`'s rule applied to the row's error-fed values when the
// group starts, codes q = clamp(round(v / scale)). Returns quantize_weights' layout; w is left holding the
// dequantized values (scale q). Rows are split over the cores (they are independent).
// With `order` (act-order, "static groups"): a permutation of the k columns, u the factor of H permuted by it; every
// group's scale is the scheme's rule on the original row (the plain quantizer's scales, unchanged), and the columns
// are quantized in that order, the error fed to the columns after them in it.
QuantizedWeights quantize_weights_gptq(std::vector<float>& w, int64_t n, int64_t k, const std::vector<float>& u,
                                       const QuantScheme& scheme, const std::vector<int64_t>* order = nullptr);

// ---- embedding tables (kiln lower --quantize-embedding 4[:G] | 8[:G]) -----------
// torchao's IntxWeightOnlyConfig rules (SYMMETRIC, fp32 scales), as ExecuTorch's
// LLM export quantizes embeddings: scale = max(|w|) / 7.5 (int4) or / 127.5
// (int8) over each group of G columns of a row (G = the row by default for 8,
// 32 for 4), q = clamp(round(w / scale)). Stored as ExecuTorch's
// quantized_decomposed::embedding_4bit / embedding_byte operands: int4 two per
// byte, the even column in the HIGH nibble, as q + 8 (uint8 [V, D/2]); int8 as
// is (int8 [V, D]); scales fp32 [V, D/G]; no zero points.
struct EmbeddingQuant {
  int bits = 0;       // 0: none; 4 or 8
  int64_t group = 0;  // columns per scale; 0: the whole row
  // The type the table had in the .pt2 (set per table by quantize_embeddings from a widened bf16 / fp16
  // constant): torchao's arithmetic in that type, as QuantScheme::source (the scales stay exact in fp32).
  QuantScheme::Source source = QuantScheme::Source::Float;
  std::string name() const;  // "4:32", "8", "none"
};

// "4", "4:64", "8", "8:128"; std::nullopt and *error set otherwise.
std::optional<EmbeddingQuant> parse_embedding_quant(std::string_view text, std::string* error);

// w: [v, d] row-major fp32; d % group == 0 (and d even for 4 bits).
QuantizedWeights quantize_embedding_table(const float* w, int64_t v, int64_t d, const EmbeddingQuant& q);

// Rewrites every aten.embedding of a constant fp32 [V, D] table in `program`
// into the quantized lookup on new constants; the fp32 table stays only if
// something else still reads it (a tied LM head). Throws kiln::Error when a
// table's row does not divide into groups. Returns the tables rewritten.
// Every offset is 64-bit (a table may have more than 2^31 elements); a table read from the .pt2 is quantized as
// the .pte is written, block by block, in one read of the table (its data and scales are both
// passes::ConstantData::generated), so that neither the fp32 table nor its quantized form is ever whole in memory. `report` (may be null) gets one line per table and the names of the streamed ones.
struct EmbeddingQuantReport {
  std::vector<std::string> tables;    // "name [V, D] -> int4 [V, D/2] + fp32 scales [V, D/G]"
  std::vector<std::string> streamed;  // tables quantized as the file is written (not at lowering time)
};
int64_t quantize_embeddings(passes::EdgeProgram& program, const EmbeddingQuant& q,
                            EmbeddingQuantReport* report = nullptr);

// int8w: every linear layer's constant fp32 weight (the mat2 of mm/addmm, as is or
// through permute_copy [1,0]) becomes an int8 constant with fp32 scales per output
// channel (8da8w's rules, the scales chosen by `scales`) and a quantized_decomposed.dequantize_per_channel node
// computing the fp32 weight before the product. `keep_fp32` (may be empty) is asked
// per layer as in PayloadOptions. Returns {quantized, kept fp32}.
struct WeightOnlyStats {
  int64_t quantized = 0, kept_fp32 = 0;
};
WeightOnlyStats quantize_weights_int8_only(passes::EdgeProgram& program,
                                           const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                                           ScaleRule scales = ScaleRule::Mse);

// 8da4w / 8da8w: a linear layer's constant weight that something other than linear
// products also reads (a tied LM head, whose table the embedding lookup reads) gets
// a value of its own for its products, so the XNNPACK payload quantizes it as a
// constant of the delegate (as torchao quantizes `lm_head` and ExecuTorch's
// partitioner lowers it) while the other readers keep the fp32 tensor. Layers
// `keep_fp32` keeps (may be empty) stay tied. The forms: mm(W, x^T) (lowerer.h's
// tied head) and mm/addmm reading W through permute_copy [1,0]. Returns the
// new values (for PartitionOptions::transformed_constants) and the tied products
// `keep_fp32` kept (the payload never sees those as quantization candidates).
struct UntiedWeights {
  std::vector<graph::ValueId> copies;
  int64_t kept_fp32 = 0;
};
UntiedWeights untie_quantized_linear_weights(passes::EdgeProgram& program,
                                       const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32);

// ---- mixed precision on a size budget (kiln lower --quantize auto --max-size MB) ---------------------------------
// Every linear layer the payload would quantize (the forms untie_quantized_linear_weights and the payload read:
// mm/addmm on a constant [K, N], through permute_copy [1,0] of a constant [N, K], the tied head's mm(W, x^T)) is
// quantized both ways with the lowering's own quantizer (8da4w:G with `base`'s scale rule, and 8da8w), and its
// sensitivity measured without data: the output-error proxy
//   e = sum_rows sum_i c_i (W[r,i] - Q(W)[r,i])^2 / sum_rows sum_i c_i W[r,i]^2
// with c_i = gamma_i^2 when the layer's input is a norm's output scaled by a constant 1-D weight gamma (followed
// through view/permute copies), 1 otherwise. Then a greedy knapsack: every layer starts at int4 (or int8 when its
// input count is not a multiple of the group), and the layers with the largest (e4 - e8) per extra byte are
// upgraded to int8 while the estimated file stays within `max_bytes`. The estimate: every other constant the
// program still reads (fp32 norms, embedding tables, ...) plus each layer's data and scales, plus a small allowance
// for the graph and alignment (the lowering checks the written file against the budget afterwards).
struct AutoLayer {
  graph::ValueId weight = 0;
  std::string name;       // the weight's parameter name (its FQN) or value name
  std::string layer;      // the product's module path (or node name)
  std::string norm;       // the constant 1-D weight whose square weights the proxy ("" when none)
  int64_t n = 0, k = 0;   // output channels, inputs
  double err4 = 0, err8 = 0;        // the relative proxy error of each form (err4 = err8 when int4 does not apply)
  int64_t bytes4 = 0, bytes8 = 0;   // data + scales of each form
  bool int4_possible = true;
  bool int8 = false;      // the choice
  bool forced_int8 = false;  // int8 by the caller (--quantize-head 8), outside the knapsack
};
struct AutoPlan {
  std::vector<AutoLayer> layers;  // in graph order
  int64_t other_bytes = 0;        // the estimate's part that does not depend on the choices
  int64_t min_bytes = 0;          // the estimate with every layer int4 (where it can be)
  int64_t max_bytes = 0;          // the estimate with every layer int8
  int64_t estimate = 0;           // the estimate for the choices
  double error = 0;               // the sum of the chosen layers' proxies
  std::map<graph::ValueId, QuantScheme> schemes;  // per weight, for PayloadOptions::per_weight
};
// Throws kiln::Error (one line naming the minimum) when even the all-int4 estimate exceeds `max_bytes`.
// `forced_int8`: weights that are int8 whatever the knapsack says (their bytes are counted first).
AutoPlan plan_mixed_precision(const passes::EdgeProgram& program, int64_t max_bytes, const QuantScheme& base,
                              const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                              const std::set<graph::ValueId>& forced_int8 = {});

// kiln lower --quantize 8da4w --quantize-head 8: the output projection (the LM head, tied or not), the last linear
// layer in graph order (the layers plan_mixed_precision finds; after untie_quantized_linear_weights, the tied head's
// own copy). Its weight goes to PayloadOptions::per_weight as 8da8w, as --quantize auto's int8 choices do.
struct HeadLayer {
  graph::ValueId weight = 0;
  std::string name;      // the weight's parameter name (its FQN) or value name
  std::string layer;     // the product's module path (or node name)
  int64_t n = 0, k = 0;  // output channels, inputs
  bool kept_fp32 = false;  // keep_fp32 (--quantize-skip) keeps it fp32
};
std::optional<HeadLayer> find_output_head(const passes::EdgeProgram& program,
                                          const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32);

}  // namespace kiln::backends::xnnpack
