// kiln/passes/quantize_portable.h: linear products -> ExecuTorch's quantized_decomposed per-token activation
// quantization and mixed_linear, for the portable backend.
#include "kiln/passes/quantize_portable.h"

#include "kiln/core/error.h"
#include "kiln/passes/dynamic.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <optional>
#include <set>

namespace kiln::passes {
namespace {

using graph::Argument;
using graph::Node;
using graph::ValueId;
using K = Argument::Kind;

std::optional<ValueId> tensor_input(const Node& n, std::string_view name) {
  const graph::NamedArgument* a = n.input(name);
  if (a == nullptr || a->arg.kind != K::Tensor) return std::nullopt;
  return std::get<ValueId>(a->arg.payload);
}

bool is_one(const Node& n, std::string_view name) {  // an absent scalar is its default, 1
  const graph::NamedArgument* a = n.input(name);
  if (a == nullptr || a->arg.kind == K::None) return true;
  if (a->arg.kind == K::Int) return std::get<int64_t>(a->arg.payload) == 1;
  if (a->arg.kind == K::Float) return std::get<double>(a->arg.payload) == 1.0;
  return false;
}

bool is_transpose(const Node& t) {
  const graph::NamedArgument* dims = t.input("dims");
  return t.target == "aten.permute_copy.default" && dims && dims->arg.kind == K::Ints &&
         std::get<std::vector<int64_t>>(dims->arg.payload) == std::vector<int64_t>{1, 0};
}

Argument scalar_type(ScalarType t) {
  Argument a;
  a.kind = K::ScalarType;
  a.payload = t;
  return a;
}

graph::TensorMeta contiguous(ScalarType dtype, std::vector<int64_t> sizes) {
  graph::TensorMeta m;
  m.dtype = dtype;
  m.sizes = std::move(sizes);
  m.strides.assign(m.sizes.size(), 1);
  for (size_t d = m.sizes.size(); d-- > 1;) m.strides[d - 1] = m.strides[d] * std::max<int64_t>(m.sizes[d], 1);
  return m;
}

// One linear product to rewrite.
struct Site {
  size_t product = 0;                 // the mm / addmm node
  ValueId weight = 0;                 // the fp32 constant
  bool stored_kn = false;             // the constant is W^T [K, N] (a folded transpose)
  bool tied_form = false;             // mm(W, x^T): the output is [N, M]
  ValueId activation = 0;             // x [M, K], or x^T [K, M] in the tied form
  std::optional<ValueId> bias;        // addmm's self
};

class Rewriter {
 public:
  Rewriter(EdgeProgram& p, const PortableQuantOptions& o) : p_(p), g_(p.graph), o_(o) {
    if (p_.dynamic) dyn_ = std::make_shared<DynamicShapes>(*p_.dynamic);
  }

  PortableQuantStats run() {
    std::vector<Site> sites = find_sites();
    if (sites.empty()) return stats_;
    std::map<size_t, std::vector<Node>> before;  // new nodes to insert before a product
    std::set<size_t> replaced;                   // products whose node the new ones replace
    for (const Site& s : sites) {
      current_ = s.product;
      before[s.product] = rewrite(s);
      replaced.insert(s.product);
      ++stats_.quantized;
    }
    // the new node order: old index -> new index for the nodes that stay
    std::vector<Node> nodes;
    std::map<int32_t, int32_t> moved;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (auto it = before.find(i); it != before.end())
        for (auto& n : it->second) nodes.push_back(std::move(n));
      if (replaced.contains(i)) continue;
      moved[static_cast<int32_t>(i)] = static_cast<int32_t>(nodes.size());
      nodes.push_back(std::move(g_.nodes[i]));
    }
    g_.nodes = std::move(nodes);
    remove_dead_transposes(moved);
    relink();
    if (dyn_) {
      std::map<std::pair<int32_t, std::string>, std::vector<graph::SymExpr>> args;
      for (auto& [key, v] : dyn_->int_args) {
        auto it = moved.find(key.first);
        check(it != moved.end(), "internal: a dynamic argument of a rewritten linear product");
        args[{it->second, key.second}] = v;
      }
      dyn_->int_args = std::move(args);
      p_.dynamic = dyn_;
    }
    // fp32 weights nothing reads any more
    for (ValueId w : weights_done_)
      if (!is_read(w)) p_.constants.erase(w);
    return stats_;
  }

 private:
  bool is_weight(ValueId v) const {
    const auto& m = g_.value(v).meta;
    return p_.is_constant(v) && m.dtype == ScalarType::Float && m.sizes.size() == 2;
  }

  std::vector<Site> find_sites() {
    std::vector<Site> sites;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      const bool addmm = n.target == "aten.addmm.default";
      if (n.target != "aten.mm.default" && !addmm) continue;
      if (addmm && (!is_one(n, "beta") || !is_one(n, "alpha"))) continue;
      auto mat2 = tensor_input(n, "mat2");
      auto first = tensor_input(n, addmm ? "mat1" : "self");
      if (!mat2 || !first) continue;
      if (g_.value(*first).meta.dtype != ScalarType::Float) continue;
      Site s;
      s.product = i;
      if (addmm) s.bias = tensor_input(n, "self");
      if (!addmm && is_weight(*first) && !is_weight(*mat2)) {  // mm(W, x^T): a tied head
        s.weight = *first;
        s.tied_form = true;
        s.activation = *mat2;
      } else if (is_weight(*mat2) && !is_weight(*first)) {  // mm(x, W^T) with W^T folded into a constant
        s.weight = *mat2;
        s.stored_kn = true;
        s.activation = *first;
      } else if (const int32_t t = g_.value(*mat2).producer; t >= 0 && !is_weight(*first)) {
        const Node& tn = g_.nodes[static_cast<size_t>(t)];
        auto w = tensor_input(tn, "self");
        if (!is_transpose(tn) || !w || !is_weight(*w)) continue;
        s.weight = *w;
        s.activation = *first;
      } else {
        continue;
      }
      if (s.bias && g_.value(*s.bias).meta.dtype != ScalarType::Float) continue;
      if (o_.keep_fp32 && o_.keep_fp32(n, s.weight)) {
        ++stats_.kept_fp32;
        continue;
      }
      sites.push_back(s);
    }
    return sites;
  }

  // A dynamic program's size expressions of `v` (constants for a static value).
  std::vector<graph::SymExpr> sizes_of(ValueId v) const {
    if (dyn_)
      if (auto it = dyn_->sizes.find(v); it != dyn_->sizes.end()) return it->second;
    std::vector<graph::SymExpr> out;
    for (int64_t s : g_.value(v).meta.sizes) out.push_back(graph::SymExpr{s, {}});
    return out;
  }

  ValueId new_value(const std::string& base, ScalarType dtype, const std::vector<graph::SymExpr>& sizes,
                    const std::vector<int64_t>& at_bound) {
    std::string name = base;
    for (int k = 1; g_.find_value(name); ++k) name = fmt::format("{}_{}", base, k);
    const ValueId v = g_.add_value(name, contiguous(dtype, at_bound));
    bool dynamic = false;
    for (const auto& e : sizes) dynamic = dynamic || !e.is_constant();
    if (dyn_ && dynamic) dyn_->sizes[v] = sizes;
    return v;
  }

  Node make(const std::string& base, std::string target, std::vector<graph::NamedArgument> inputs,
            std::vector<ValueId> outs) {
    const Node& product = g_.nodes[current_];
    Node n;
    n.name = g_.value(outs.at(0)).name;
    (void)base;
    n.target = std::move(target);
    n.inputs = std::move(inputs);
    for (ValueId v : outs) n.outputs.push_back(Argument::tensor(v));
    n.module_path = product.module_path;
    n.module_type = product.module_type;
    n.stack_trace = product.stack_trace;
    n.source_nodes = product.source_nodes.empty() ? std::vector<std::string>{product.name} : product.source_nodes;
    return n;
  }

  // The quantized constants of weight `w` (once per weight).
  std::pair<ValueId, ValueId> quantized(const Site& s) {
    if (auto it = done_.find(s.weight); it != done_.end()) return it->second;
    const graph::TensorMeta meta = g_.value(s.weight).meta;
    const int64_t n = s.stored_kn ? meta.sizes[1] : meta.sizes[0], k = s.stored_kn ? meta.sizes[0] : meta.sizes[1];
    const std::string& fqn = p_.constants.at(s.weight).name;
    const std::string wname = g_.value(s.weight).name;
    check(o_.group == 0 || k % o_.group == 0,
          "--quantize 8da4w:{}: linear layer '{}' ({}) has {} inputs, not a multiple of the group {}: use a group "
          "that divides it, or keep the layer fp32 with --quantize-skip",
          o_.group, g_.nodes[s.product].module_path.empty() ? g_.nodes[s.product].name : g_.nodes[s.product].module_path,
          fqn.empty() ? wname : fqn, k, o_.group);
    const std::vector<std::byte> raw = p_.constant_bytes(s.weight);
    std::vector<float> w(static_cast<size_t>(n * k));
    std::memcpy(w.data(), raw.data(), w.size() * sizeof(float));
    if (s.stored_kn) {  // [K, N] -> [N, K]
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < n; ++c)
          std::memcpy(&w[static_cast<size_t>(c * k + r)], raw.data() + static_cast<size_t>(r * n + c) * sizeof(float),
                      sizeof(float));
    }
    PortableQuantizedWeight q = o_.quantize(w.data(), n, k);
    const int64_t groups = o_.group == 0 ? 1 : k / o_.group;
    check(static_cast<int64_t>(q.q.size()) == n * k && static_cast<int64_t>(q.scales.size()) == n * groups,
          "internal: the quantizer returned {} values and {} scales for a [{}, {}] weight", q.q.size(),
          q.scales.size(), n, k);
    auto bytes = [](const auto& v) {
      std::vector<std::byte> b(v.size() * sizeof(v[0]));
      std::memcpy(b.data(), v.data(), b.size());
      return std::make_shared<const std::vector<std::byte>>(std::move(b));
    };
    const std::string scheme = o_.group == 0 ? "int8 per channel" : fmt::format("int4 in int8, groups of {}", o_.group);
    std::string qname = wname + "_q", sname = wname + "_scales";
    for (int i = 1; g_.find_value(qname); ++i) qname = fmt::format("{}_q_{}", wname, i);
    for (int i = 1; g_.find_value(sname); ++i) sname = fmt::format("{}_scales_{}", wname, i);
    const ValueId qv = g_.add_value(qname, contiguous(ScalarType::Char, {n, k}));
    p_.constants[qv] = ConstantData{nullptr, bytes(q.q), fqn + " (" + scheme + ")"};
    const ValueId sv = g_.add_value(
        sname, contiguous(ScalarType::Float, o_.group == 0 ? std::vector<int64_t>{n} : std::vector<int64_t>{n, groups}));
    p_.constants[sv] = ConstantData{nullptr, bytes(q.scales), fqn + " (scales)"};
    weights_done_.push_back(s.weight);
    ++stats_.weights;
    return done_[s.weight] = {qv, sv};
  }

  std::vector<Node> rewrite(const Site& s) {
    std::vector<Node> out;
    const Node product = g_.nodes[s.product];
    const ValueId result = product.output_ids().at(0);
    const auto [qv, sv] = quantized(s);
    const int64_t n = g_.value(qv).meta.sizes[0], k = g_.value(qv).meta.sizes[1];
    const std::string base = product.name;
    ValueId x = s.activation;
    if (s.tied_form) {  // x = (x^T)^T
      const auto st = sizes_of(s.activation);
      const std::vector<int64_t> bt = g_.value(s.activation).meta.sizes;
      const ValueId xv = new_value(base + "_input", ScalarType::Float, {st.at(1), st.at(0)}, {bt.at(1), bt.at(0)});
      Argument dims;
      dims.kind = K::Ints;
      dims.payload = std::vector<int64_t>{1, 0};
      out.push_back(make(base, "aten.permute_copy.default",
                         {{"self", Argument::tensor(s.activation), false}, {"dims", dims, false}}, {xv}));
      x = xv;
    }
    const auto xs = sizes_of(x);
    const std::vector<int64_t> xb = g_.value(x).meta.sizes;
    check(xb.size() == 2 && xb[1] == k, "internal: linear product '{}' reads a {}-D input of width {} for K = {}",
          base, xb.size(), xb.empty() ? 0 : xb.back(), k);
    const std::vector<graph::SymExpr> ps{xs[0], graph::SymExpr{1, {}}};
    const std::vector<int64_t> pb{xb[0], 1};
    const ValueId scale = new_value(base + "_act_scale", ScalarType::Double, ps, pb);
    const ValueId zp = new_value(base + "_act_zero_point", ScalarType::Long, ps, pb);
    out.push_back(make(base, "quantized_decomposed.choose_qparams_per_token_asymmetric.default",
                       {{"input", Argument::tensor(x), false}, {"dtype", scalar_type(ScalarType::Char), false}},
                       {scale, zp}));
    const ValueId xq = new_value(base + "_act_int8", ScalarType::Char, xs, xb);
    auto per_token_args = [&](ValueId in) {
      return std::vector<graph::NamedArgument>{{"input", Argument::tensor(in), false},
                                               {"scales", Argument::tensor(scale), false},
                                               {"zero_points", Argument::tensor(zp), false},
                                               {"quant_min", Argument::integer(-128), false},
                                               {"quant_max", Argument::integer(127), false},
                                               {"dtype", scalar_type(ScalarType::Char), false}};
    };
    out.push_back(make(base, "quantized_decomposed.quantize_per_token.default", per_token_args(x), {xq}));
    const ValueId xd = new_value(base + "_act_dequantized", ScalarType::Float, xs, xb);
    auto dq_args = per_token_args(xq);
    dq_args.push_back({"output_dtype", scalar_type(ScalarType::Float), false});
    out.push_back(make(base, "quantized_decomposed.dequantize_per_token.default", dq_args, {xd}));
    const std::vector<graph::SymExpr> ys{xs[0], graph::SymExpr{n, {}}};
    const std::vector<int64_t> yb{xb[0], n};
    const bool direct = !s.tied_form && !s.bias;  // mixed_linear writes the product's own value
    const ValueId y = direct ? result : new_value(base + "_quantized", ScalarType::Float, ys, yb);
    out.push_back(make(base, "quantized_decomposed.mixed_linear.default",
                       {{"input", Argument::tensor(xd), false},
                        {"weight", Argument::tensor(qv), false},
                        {"weight_scales", Argument::tensor(sv), false},
                        {"weight_zero_points", Argument::none(), false},
                        {"dtype", scalar_type(ScalarType::Float), false}},
                       {y}));
    if (s.bias) {
      out.push_back(make(base, "aten.add.Tensor",
                         {{"self", Argument::tensor(y), false}, {"other", Argument::tensor(*s.bias), false}},
                         {result}));
    } else if (s.tied_form) {
      Argument dims;
      dims.kind = K::Ints;
      dims.payload = std::vector<int64_t>{1, 0};
      out.push_back(make(base, "aten.permute_copy.default", {{"self", Argument::tensor(y), false}, {"dims", dims, false}},
                         {result}));
    }
    return out;
  }

  bool is_read(ValueId v) const {
    for (const auto& n : g_.nodes)
      for (const auto& in : n.inputs)
        for (ValueId id : in.arg.tensor_ids())
          if (id == v) return true;
    for (const auto& o : g_.outputs)
      for (ValueId id : o.tensor_ids())
        if (id == v) return true;
    for (ValueId o : p_.outputs)
      if (o == v) return true;
    return false;
  }

  // The transposes of quantized weights that nothing reads now.
  void remove_dead_transposes(std::map<int32_t, int32_t>& moved) {
    std::set<ValueId> weights(weights_done_.begin(), weights_done_.end());
    std::vector<bool> drop(g_.nodes.size(), false);
    bool any = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& t = g_.nodes[i];
      if (!is_transpose(t)) continue;
      auto w = tensor_input(t, "self");
      if (!w || !weights.contains(*w) || is_read(t.output_ids().at(0))) continue;
      drop[i] = true;
      any = true;
    }
    if (!any) return;
    std::vector<int32_t> index(g_.nodes.size(), -1);
    std::vector<Node> kept;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (drop[i]) continue;
      index[i] = static_cast<int32_t>(kept.size());
      kept.push_back(std::move(g_.nodes[i]));
    }
    g_.nodes = std::move(kept);
    std::map<int32_t, int32_t> remapped;
    for (auto [old_index, mid] : moved)
      if (index[static_cast<size_t>(mid)] >= 0) remapped[old_index] = index[static_cast<size_t>(mid)];
    moved = std::move(remapped);
  }

  void relink() {
    for (auto& v : g_.values) v.producer = -1;
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (ValueId v : g_.nodes[i].output_ids()) g_.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  }

  EdgeProgram& p_;
  graph::Graph& g_;
  const PortableQuantOptions& o_;
  std::shared_ptr<DynamicShapes> dyn_;
  PortableQuantStats stats_;
  size_t current_ = 0;
  std::map<ValueId, std::pair<ValueId, ValueId>> done_;
  std::vector<ValueId> weights_done_;
};

}  // namespace

PortableQuantStats quantize_linears_portable(EdgeProgram& program, const PortableQuantOptions& options) {
  check(static_cast<bool>(options.quantize), "internal: quantize_linears_portable without a quantizer");
  return Rewriter(program, options).run();
}

}  // namespace kiln::passes
