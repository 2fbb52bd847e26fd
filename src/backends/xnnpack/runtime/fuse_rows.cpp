// The XNNPACK backend's fused row chains (builder.h).
#include "builder.h"
#include "nodes/node_kind.h"

#include <utility>

namespace kiln::backends::xnnpack::detail {

// Fused row chains (Engine::Kiln): maximal runs of consecutive elementwise
// nodes, softmaxes and row means (fully connected with one output column) over
// the same R rows of C floats run as one step that takes each row through every
// node while it is in cache. What the chain computes and nothing after it
// reads stays in per-task scratch; the rest is written where it lives.
bool Builder::add_row_op(const State& st, size_t i, int64_t rows, int64_t cols, Step& step,
                         std::vector<int32_t>& slot_of_group, std::vector<bool>& slot_scalar) {
  const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
  const NodeIO& io = io_[i];
  const Value& out = st.values[io.out];
  for (size_t j = 0; j < io.num_in; ++j)  // quantized nodes run as their own steps
    if (io.in[j] != kInvalidId && st.values[io.in[j]].quant != Value::Quant::None) return false;
  if (out.quant != Value::Quant::None) return false;
  RowOp op;
  if (const auto* mm = node->output_min_max()) { op.lo = mm->output_min(); op.hi = mm->output_max(); }
  const NodeType t = node->xnode_union_type();
  // the output: full rows or one value per row, of this chain's geometry
  if (out.ndims == 0) return false;
  const int64_t oc = out.dims[out.ndims - 1];
  if (oc == cols && cols > 1 && out.numel == rows * cols) op.out_scalar = false;
  else if (oc == 1 && out.numel == rows) op.out_scalar = true;
  else return false;
  auto operand = [&](uint32_t v, RowOperand& x, bool full_rows_only) -> bool {
    const Value& val = st.values[v];
    int64_t period = 0;
    bool scalar = false;
    if (full_rows_only) {  // a row mean's input: exactly the chain's rows
      if (val.ndims == 0 || val.dims[val.ndims - 1] != cols || val.numel != rows * cols) return false;
      period = rows;
    } else if (!row_mode(val, out, &period, &scalar)) {
      return false;
    }
    const int32_t grp = val.group;
    if (slot_of_group[static_cast<size_t>(grp)] >= 0) {  // computed earlier in this chain
      if (period != rows || scalar != slot_scalar[static_cast<size_t>(slot_of_group[static_cast<size_t>(grp)])]) return false;
      x.src = RowOperand::Src::Slot;
      x.index = slot_of_group[static_cast<size_t>(grp)];
    } else {
      x.src = RowOperand::Src::Memory;
      x.index = grp;  // a group for now; made an index into the step's memory table below
      x.period = period;
      if (val.constant != nullptr && val.numel == 1) {
        x.constant = true;
        x.value = *static_cast<const float*>(val.constant);
      }
    }
    x.scalar = scalar;
    return true;
  };
  op.kind = node_kind(t)->row_op;
  if (op.kind == RowOpKind::None) return false;
  switch (op.kind) {
    case RowOpKind::Add: case RowOpKind::Sub: case RowOpKind::Mul: case RowOpKind::Div: case RowOpKind::Max:
    case RowOpKind::Min:
      if (!operand(io.in[0], op.a, false) || !operand(io.in[1], op.b, false)) return false;
      if (op.out_scalar && (!op.a.scalar || !op.b.scalar)) return false;
      break;
    case RowOpKind::Softmax:
      if (op.out_scalar || !operand(io.in[0], op.a, false) || op.a.scalar || st.values[io.in[0]].numel != out.numel)
        return false;
      break;
    case RowOpKind::RowDot: {
      const Value& w = st.values[io.in[1]];
      if (!op.out_scalar || !w.constant || w.numel != cols || w.ndims != 2 || !operand(io.in[0], op.a, true)) return false;
      if (io.in[2] != kInvalidId) {
        const Value& b = st.values[io.in[2]];
        if (!b.constant || b.numel != 1) return false;
        op.bias = *static_cast<const float*>(b.constant);
      }
      op.w = static_cast<const float*>(w.constant);
      break;
    }
    default:  // unary, elementwise
      if (!operand(io.in[0], op.a, false) || st.values[io.in[0]].numel != out.numel || op.a.scalar != op.out_scalar)
        return false;
      break;
  }
  // the output's slot
  const int32_t og = out.group;
  if (slot_of_group[static_cast<size_t>(og)] >= 0) return false;  // written twice: not SSA
  op.out_slot = static_cast<int32_t>(slot_scalar.size());
  slot_scalar.push_back(op.out_scalar);
  slot_of_group[static_cast<size_t>(og)] = op.out_slot;
  op.write_group = og;  // decided in find_chains
  step.row_ops.push_back(op);
  return true;
}

namespace {

bool same_operand(const RowOperand& x, const RowOperand& y) {
  return x.src == y.src && x.index == y.index && x.period == y.period && x.scalar == y.scalar;
}

// The tanh GELU as transformers' models write it, (x * 0.5) * (1 + tanh((x + x^3 * 0.044715) * sqrt(2 / pi))),
// x^3 as square(x) * x, found in a chain's operations (either operand order of each add and mul) and run as
// one operation: nine passes over every row chunk become one (GPT-2 small: 7.5 of its 270 ms per forward, one
// thread, a Xeon). Only where every intermediate is the chain's own (not written, read by nothing else) and
// the constants are these floats exactly; the result differs from the nine operations' by rounding only
// (f32-vunary's gelu_tanh).
class GeluTanhMatcher {
 public:
  explicit GeluTanhMatcher(std::vector<RowOp>& ops) : ops_(ops), producer_(ops.size() + 1, -1), uses_(ops.size() + 1, 0) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].out_slot >= 0 && static_cast<size_t>(ops[i].out_slot) < producer_.size())
        producer_[static_cast<size_t>(ops[i].out_slot)] = static_cast<int32_t>(i);
      for (const RowOperand* x : {&ops[i].a, &ops[i].b})
        if (x->src == RowOperand::Src::Slot && static_cast<size_t>(x->index) < uses_.size()) ++uses_[static_cast<size_t>(x->index)];
    }
  }

  // Rewrites every match in place; the matched intermediates' operations are dropped.
  void run() {
    std::vector<bool> drop(ops_.size(), false);
    for (size_t i = 0; i < ops_.size(); ++i) {
      matched_.clear();
      RowOperand x;
      if (drop[i] || !gelu(static_cast<int32_t>(i), &x)) continue;
      RowOp& op = ops_[i];
      op.kind = RowOpKind::GeluTanh;
      op.a = x;
      op.b = RowOperand{};
      for (int32_t j : matched_) drop[static_cast<size_t>(j)] = true;
    }
    std::vector<RowOp> kept;
    for (size_t i = 0; i < ops_.size(); ++i)
      if (!drop[i]) kept.push_back(ops_[i]);
    ops_ = std::move(kept);
  }

 private:
  static bool is_const(const RowOperand& o, float v) { return o.src == RowOperand::Src::Memory && o.constant && o.value == v; }

  // The operation producing operand `o` when it is an intermediate of the chain used once, not written, unclamped.
  const RowOp* inner(const RowOperand& o, RowOpKind kind) {
    if (o.src != RowOperand::Src::Slot || static_cast<size_t>(o.index) >= producer_.size()) return nullptr;
    const int32_t p = producer_[static_cast<size_t>(o.index)];
    if (p < 0 || uses_[static_cast<size_t>(o.index)] != 1) return nullptr;
    const RowOp& op = ops_[static_cast<size_t>(p)];
    if (op.kind != kind || op.write_group >= 0 || op.out_scalar || op.lo != -INFINITY || op.hi != INFINITY) return nullptr;
    matched_.push_back(p);
    return &op;
  }

  bool gelu(int32_t i, RowOperand* x) {
    const RowOp& top = ops_[static_cast<size_t>(i)];
    if (top.kind != RowOpKind::Mul || top.out_scalar) return false;
    // op = f(a, b) in either operand order, the match state (x, the matched operations) restored between the two
    auto either = [&](const RowOp& op, auto first, auto second) {
      const RowOperand x0 = *x;
      const size_t m0 = matched_.size();
      if (first(op.a) && second(op.b)) return true;
      *x = x0;
      matched_.resize(m0);
      if (first(op.b) && second(op.a)) return true;
      *x = x0;
      matched_.resize(m0);
      return false;
    };
    auto bind = [&](const RowOperand& o) {  // every use of x is the same operand, a full row of the chain
      if (o.src == RowOperand::Src::None || o.scalar) return false;
      if (x->src == RowOperand::Src::None) { *x = o; return true; }
      return same_operand(*x, o);
    };
    auto constant = [](float v) { return [v](const RowOperand& c) { return is_const(c, v); }; };
    auto cube = [&](const RowOperand& o) {  // square(x) * x
      const RowOp* m = inner(o, RowOpKind::Mul);
      return m && either(*m, [&](const RowOperand& s) {
        const RowOp* sq = inner(s, RowOpKind::Square);
        return sq && bind(sq->a);
      }, bind);
    };
    auto cubic = [&](const RowOperand& o) {  // x + x^3 * 0.044715
      const RowOp* add = inner(o, RowOpKind::Add);
      return add && either(*add, bind, [&](const RowOperand& t) {
        const RowOp* m = inner(t, RowOpKind::Mul);
        return m && either(*m, cube, constant(0.044715f));
      });
    };
    auto one_plus_tanh = [&](const RowOperand& o) {  // 1 + tanh(cubic * sqrt(2 / pi))
      const RowOp* add = inner(o, RowOpKind::Add);
      return add && either(*add, [&](const RowOperand& t) {
        const RowOp* th = inner(t, RowOpKind::Tanh);
        if (th == nullptr) return false;
        const RowOp* m = inner(th->a, RowOpKind::Mul);
        return m && either(*m, cubic, constant(0.7978845608028654f));
      }, constant(1.0f));
    };
    auto half_x = [&](const RowOperand& o) {  // x * 0.5
      const RowOp* m = inner(o, RowOpKind::Mul);
      return m && either(*m, bind, constant(0.5f));
    };
    auto x_times = [&](const RowOperand& o) {  // x * (1 + tanh(...))
      const RowOp* m = inner(o, RowOpKind::Mul);
      return m && either(*m, bind, one_plus_tanh);
    };
    *x = RowOperand{};
    matched_.clear();
    // transformers' (x * 0.5) * (1 + tanh(...)), or kiln's own lowering of aten.gelu(approximate='tanh'),
    // (x * (1 + tanh(...))) * 0.5 (multiplying by 0.5 is exact: the same value)
    return either(top, half_x, one_plus_tanh) || either(top, x_times, constant(0.5f));
  }

  std::vector<RowOp>& ops_;
  std::vector<int32_t> producer_;  // by slot: the operation writing it
  std::vector<int32_t> uses_;      // by slot: operands reading it
  std::vector<int32_t> matched_;   // the current match's intermediate operations
};

std::string rows_label(const std::vector<RowOp>& ops) {
  static const char* const names[] = {"add", "sub", "mul", "div", "max", "min", "square", "sqrt", "rsqrt", "neg",
                                      "abs", "sigmoid", "tanh", "exp", "gelu", "copy", "softmax", "dot", "gelu_tanh",
                                      "scaled_softmax"};
  static_assert(std::size(names) == static_cast<size_t>(RowOpKind::None));
  std::string label = "kiln fused rows:";
  for (const RowOp& op : ops) {
    label += " ";
    label += names[static_cast<size_t>(op.kind)];
  }
  return label;
}

}  // namespace

// softmax(x * c + m) (c a one-element constant, m a full row or absent) where the product and the sum are the
// chain's own, read once: one operation of three passes over the row (f32-rows' softmax_scaled) for five.
void fuse_scaled_softmax(State& st) {
  for (Step& step : st.steps) {
    if (step.kind != StepKind::Rows) continue;
    std::vector<RowOp>& ops = step.row_ops;
    std::vector<int32_t> producer(static_cast<size_t>(step.slots), -1), uses(static_cast<size_t>(step.slots), 0);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].out_slot >= 0 && ops[i].out_slot < step.slots) producer[static_cast<size_t>(ops[i].out_slot)] = static_cast<int32_t>(i);
      for (const RowOperand* x : {&ops[i].a, &ops[i].b})
        if (x->src == RowOperand::Src::Slot && x->index >= 0 && x->index < step.slots) ++uses[static_cast<size_t>(x->index)];
    }
    // the operation making slot operand `o`, if it is of `kind`, used once, kept in the chain and unclamped
    auto inner = [&](const RowOperand& o, RowOpKind kind) -> int32_t {
      if (o.src != RowOperand::Src::Slot || o.index < 0 || o.index >= step.slots) return -1;
      const int32_t p = producer[static_cast<size_t>(o.index)];
      if (p < 0 || uses[static_cast<size_t>(o.index)] != 1) return -1;
      const RowOp& op = ops[static_cast<size_t>(p)];
      return op.kind == kind && op.write_group < 0 && !op.out_scalar && op.lo == -INFINITY && op.hi == INFINITY ? p : -1;
    };
    auto scale_of = [](const RowOp& mul, RowOperand* x, float* c) {  // mul = x * c, either order
      for (const auto& [v, k] : {std::pair{&mul.a, &mul.b}, std::pair{&mul.b, &mul.a}})
        if (k->src == RowOperand::Src::Memory && k->constant && k->scalar && !v->scalar && v->src != RowOperand::Src::None) {
          *x = *v;
          *c = k->value;
          return true;
        }
      return false;
    };
    std::vector<bool> drop(ops.size(), false);
    bool changed = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      RowOp& sm = ops[i];
      if (sm.kind != RowOpKind::Softmax || sm.out_scalar) continue;
      RowOperand x, mask;
      float c = 1.0f;
      int32_t add = inner(sm.a, RowOpKind::Add), mul = -1;
      if (add >= 0) {  // (x * c) + m, either order
        const RowOp& a = ops[static_cast<size_t>(add)];
        for (const auto& [p, q] : {std::pair{&a.a, &a.b}, std::pair{&a.b, &a.a}}) {
          const int32_t m = inner(*p, RowOpKind::Mul);
          if (m >= 0 && !q->scalar && q->src != RowOperand::Src::None && scale_of(ops[static_cast<size_t>(m)], &x, &c)) {
            mul = m;
            mask = *q;
            break;
          }
        }
        if (mul < 0) continue;
      } else {
        mul = inner(sm.a, RowOpKind::Mul);
        if (mul < 0 || !scale_of(ops[static_cast<size_t>(mul)], &x, &c)) continue;
      }
      sm.kind = RowOpKind::ScaledSoftmax;
      sm.a = x;
      sm.b = mask;  // Src::None: no mask
      sm.bias = c;
      drop[static_cast<size_t>(mul)] = true;
      if (add >= 0) drop[static_cast<size_t>(add)] = true;
      changed = true;
    }
    if (!changed) continue;
    std::vector<RowOp> kept;
    for (size_t i = 0; i < ops.size(); ++i)
      if (!drop[i]) kept.push_back(ops[i]);
    ops = std::move(kept);
    step.label = rows_label(ops);
  }
}

Status Builder::find_chains(State& st) {
  chain_of_.assign(io_.size(), -1);
  slot_only_.assign(st.groups.size(), false);
  if (st.engine != Engine::Kiln) return Status::Ok;
  // readers of each group, by node
  std::vector<std::vector<uint32_t>> readers(st.groups.size());
  for (size_t i = 0; i < io_.size(); ++i) {
    if (skip_[i]) continue;
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (io_[i].in[j] != kInvalidId) readers[static_cast<size_t>(st.values[io_[i].in[j]].group)].push_back(static_cast<uint32_t>(i));
  }
  std::vector<int32_t> slot_of_group(st.groups.size(), -1);
  for (size_t i = 0; i < io_.size(); ++i) {
    if (skip_[i]) continue;
    // the chain's geometry comes from its first node: full rows out, or a row mean's input
    const NodeIO& io = io_[i];
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    const Value& out = st.values[io.out];
    const Value& in = st.values[io.in[0]];
    int64_t rows = 0, cols = 0;
    if (node->xnode_union_type() == NodeType::XNNFullyConnected) {
      if (in.ndims > 0) { cols = in.dims[in.ndims - 1]; rows = cols ? in.numel / cols : 0; }
    } else if (out.ndims > 0) {
      cols = out.dims[out.ndims - 1];
      rows = cols ? out.numel / cols : 0;
    }
    if (cols < 2 || rows < 1) continue;
    Chain c;
    c.step.kind = StepKind::Rows;
    std::vector<bool> slot_scalar;
    std::vector<int32_t> touched;
    size_t last = i;
    bool any = false;
    for (size_t j = i; j < io_.size(); ++j) {
      if (skip_[j]) continue;
      if (!add_row_op(st, j, rows, cols, c.step, slot_of_group, slot_scalar)) break;
      touched.push_back(st.values[io_[j].out].group);
      last = j;
      any = true;
    }
    if (!any) continue;
    c.begin = i;
    c.last = last;
    // which results are written: read after the chain, or a call output
    std::vector<int32_t> mem;  // the step's memory table: groups
    auto mem_index = [&](int32_t grp) {
      for (size_t m = 0; m < mem.size(); ++m)
        if (mem[m] == grp) return static_cast<int32_t>(m);
      mem.push_back(grp);
      return static_cast<int32_t>(mem.size() - 1);
    };
    for (RowOp& op : c.step.row_ops) {
      const int32_t grp = op.write_group;
      bool outside = st.groups[static_cast<size_t>(grp)].storage.kind == Storage::Kind::Arg;
      for (uint32_t r : readers[static_cast<size_t>(grp)]) outside |= r < i || r > last;
      if (outside) {
        op.write_group = mem_index(grp);
      } else {
        op.write_group = -1;
        slot_only_[static_cast<size_t>(grp)] = true;
      }
      for (RowOperand* x : {&op.a, &op.b})
        if (x->src == RowOperand::Src::Memory) x->index = mem_index(x->index);
    }
    for (int32_t grp : touched) slot_of_group[static_cast<size_t>(grp)] = -1;
    GeluTanhMatcher(c.step.row_ops).run();
    // step layout: memory table, per-task scratch for the slots that stay in it
    Step& step = c.step;
    step.rows = rows;
    step.cols = cols;
    step.slots = static_cast<int64_t>(slot_scalar.size());
    // the tasks split the rows, or an elementwise chain's column chunks of them (rows_chunk)
    const int64_t chunk = rows_chunk(step.row_ops, cols), units = rows * std::max<int64_t>(1, (cols + chunk - 1) / chunk);
    step.tasks = st.exec.threads > 1 ? elementwise_pieces(units, kTasksPerThread * st.exec.threads, rows * cols) : 1;
    for (int32_t grp : mem) step.in.push_back(Operand{grp});
    for (size_t k = 0; k < slot_scalar.size(); ++k) {
      step.slot_offset.push_back(step.scratch_per_task);
      step.scratch_per_task += slot_scalar[k] ? 16 : (cols + 15) / 16 * 16;
    }
    step.scratch.assign(static_cast<size_t>(step.tasks * step.scratch_per_task), 0.0f);
    step.slot_ptr.assign(static_cast<size_t>(step.tasks * step.slots) + mem.size(), nullptr);
    step.label = rows_label(step.row_ops);
    const auto index = static_cast<int32_t>(chains_.size());
    for (size_t j = i; j <= last; ++j) chain_of_[j] = index;
    chains_.push_back(std::move(c));
    i = last;
  }
  return Status::Ok;
}

}  // namespace kiln::backends::xnnpack::detail
