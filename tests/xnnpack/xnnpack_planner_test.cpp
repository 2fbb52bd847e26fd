// The XNNPACK backend's step planner (src/backends/xnnpack/runtime): small
// XNNGraph payloads built here with the flatbuffers API, planned with
// detail::plan_payload (what the backend's init does), and checked against
// what the test works out on its own from the graph:
//  - every node is run by exactly one step, in order; reshapes that are views
//    run by none and join their values into one storage group;
//  - call inputs and outputs are bound to call arguments (in external_id
//    order), constants are static bytes, intermediates live in the arena (or
//    only in a fused chain's row slots);
//  - arena groups whose lifetimes (node intervals, widened to a fused chain's
//    span) overlap occupy disjoint bytes, every range is aligned and inside
//    the arena, and the arena is no larger than all intermediates laid end to
//    end (and smaller, where lifetimes are disjoint);
//  - engine "kiln" runs fully-connected nodes on kiln steps, "xnnpack" on
//    XNNPACK subgraphs; profiling detail gives one subgraph per library node;
//  - a fused row chain's ops are the graph's nodes, their operands the nodes'
//    operands (a slot of the chain or a storage group);
//  - executing the planned state gives what a double-precision reference of
//    the graph, computed here, gives.
#include "backend_state.h"
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "kiln/runtime/pte_file.h"

#include <gtest/gtest.h>
#include <xnnpack.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

namespace xd = kiln::backends::xnnpack::detail;
namespace fbx = kiln::fb::xnnpack;
namespace rt = kiln::rt;
using xd::StepKind;
using xd::Storage;

constexpr uint32_t kNone = 0xFFFFFFFFu;

}  // namespace

// gtest prints these by name
namespace kiln::backends::xnnpack::detail {
void PrintTo(StepKind k, std::ostream* os) {
  static const char* const names[] = {"Subgraph", "FullyConnected", "Rows", "Bmm", "LmHead", "Transpose",
                                      "Slice", "Concat", "Unary", "Copy", "Clamp"};
  *os << names[static_cast<size_t>(k)];
}
void PrintTo(Storage::Kind k, std::ostream* os) {
  static const char* const names[] = {"None", "Arena", "Arg", "Static"};
  *os << names[static_cast<size_t>(k)];
}
}  // namespace kiln::backends::xnnpack::detail

namespace {

// ---------------------------------------------------------------- graphs

enum class Op { Add, Sub, Mul, Max, Tanh, Sigmoid, Square, Rsqrt, Softmax, FullyConnected, Reshape };

// Nodes Debian's XNNPACK (2022) has (the rest run on kiln's code whatever the engine).
bool library_node(Op op) { return op != Op::Tanh && op != Op::Rsqrt && op != Op::Reshape; }
bool binary(Op op) { return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Max; }

struct Graph {
  enum class Kind { Input, Output, Temp, Const };
  struct Val {
    std::vector<uint32_t> dims;
    Kind kind = Kind::Temp;
    std::vector<float> data;  // Const
    int64_t numel() const {
      int64_t n = 1;
      for (uint32_t d : dims) n *= d;
      return n;
    }
  };
  struct Node {
    Op op;
    std::vector<uint32_t> in;  // fully connected: x, W, bias (kNone: no bias)
    uint32_t out;
    uint32_t flags = 0;        // fully connected: 1 = W is [K, N] (else [N, K])
  };
  std::vector<Val> vals;
  std::vector<Node> nodes;
  std::vector<uint32_t> inputs, outputs;  // call arguments: inputs, then outputs
  std::mt19937 rng{1234};

  uint32_t value(std::vector<uint32_t> dims, Kind kind) {
    vals.push_back({std::move(dims), kind, {}});
    auto id = static_cast<uint32_t>(vals.size() - 1);
    if (kind == Kind::Input) inputs.push_back(id);
    if (kind == Kind::Output) outputs.push_back(id);
    return id;
  }
  uint32_t input(std::vector<uint32_t> dims) { return value(std::move(dims), Kind::Input); }
  uint32_t output(std::vector<uint32_t> dims) { return value(std::move(dims), Kind::Output); }
  uint32_t temp(std::vector<uint32_t> dims) { return value(std::move(dims), Kind::Temp); }
  uint32_t constant(std::vector<uint32_t> dims, float lo = -0.5f, float hi = 0.5f) {
    uint32_t id = value(std::move(dims), Kind::Const);
    std::uniform_real_distribution<float> u(lo, hi);
    vals[id].data.resize(static_cast<size_t>(vals[id].numel()));
    for (float& x : vals[id].data) x = u(rng);
    return id;
  }
  uint32_t filled(std::vector<uint32_t> dims, float v) {
    uint32_t id = value(std::move(dims), Kind::Const);
    vals[id].data.assign(static_cast<size_t>(vals[id].numel()), v);
    return id;
  }
  void node(Op op, std::vector<uint32_t> in, uint32_t out, uint32_t flags = 0) {
    nodes.push_back({op, std::move(in), out, flags});
  }
  // out = x W^T + b, W [N, K] (or x W + b with W [K, N] when kn)
  void fc(uint32_t x, uint32_t w, uint32_t b, uint32_t out, bool kn = false) {
    node(Op::FullyConnected, {x, w, b}, out, kn ? 1u : 0u);
  }

  // The delegate payload: XNNHeader, the XNNGraph flatbuffer, the constants inline.
  // named: constants name program data (key "c<id>") instead
  std::span<const std::byte> payload(bool named = false) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<std::byte> constants;
    std::vector<flatbuffers::Offset<fbx::ConstantDataOffset>> cdata{fbx::CreateConstantDataOffset(fbb, 0, 0)};
    std::vector<flatbuffers::Offset<fbx::XValue>> xvalues;
    for (uint32_t id = 0; id < vals.size(); ++id) {
      const Val& v = vals[id];
      uint32_t ext = kNone, flags = 0, cidx = 0;
      if (auto it = std::find(inputs.begin(), inputs.end(), id); it != inputs.end()) {
        ext = static_cast<uint32_t>(it - inputs.begin());
        flags = xd::kExternalInput;
      }
      if (auto it = std::find(outputs.begin(), outputs.end(), id); it != outputs.end()) {
        ext = static_cast<uint32_t>(inputs.size() + static_cast<size_t>(it - outputs.begin()));
        flags = xd::kExternalOutput;
      }
      if (v.kind == Kind::Const) {
        constants.resize((constants.size() + 63) / 64 * 64);
        size_t at = constants.size(), n = v.data.size() * sizeof(float);
        constants.resize(at + n);
        std::memcpy(constants.data() + at, v.data.data(), n);
        cidx = static_cast<uint32_t>(cdata.size());
        cdata.push_back(named ? fbx::CreateConstantDataOffset(fbb, ~uint64_t{0}, n, fbb.CreateString("c" + std::to_string(id)))
                              : fbx::CreateConstantDataOffset(fbb, at, n));
      }
      auto t = fbx::CreateXNNTensorValueDirect(fbb, fbx::XNNDatatype::xnn_datatype_fp32,
                                               static_cast<uint32_t>(v.dims.size()), &v.dims, cidx, ext, flags, id);
      xvalues.push_back(fbx::CreateXValue(fbb, fbx::XValueUnion::XNNTensorValue, t.Union()));
    }
    std::vector<flatbuffers::Offset<fbx::XNode>> xnodes;
    for (const Node& n : nodes) {
      using U = fbx::XNodeUnion;
      flatbuffers::Offset<void> u;
      U type = U::NONE;
      auto one = [&](U t) { type = t; u = fbx::Create_XNNNode1x1(fbb, n.in[0], n.out, 0).Union(); };
      auto two = [&](U t) { type = t; u = fbx::Create_XNNNode2x1(fbb, n.in[0], n.in[1], n.out, 0).Union(); };
      switch (n.op) {
        case Op::Add: two(U::XNNAdd); break;
        case Op::Sub: two(U::XNNSubtract); break;
        case Op::Mul: two(U::XNNMultiply); break;
        case Op::Max: two(U::XNNMaximum); break;
        case Op::Tanh: one(U::XNNTanh); break;
        case Op::Sigmoid: one(U::XNNSigmoid); break;
        case Op::Square: one(U::XNNSquare); break;
        case Op::Rsqrt: one(U::XNNReciprocalSquareRoot); break;
        case Op::Softmax: one(U::XNNSoftmax); break;
        case Op::FullyConnected:
          type = U::XNNFullyConnected;
          u = fbx::CreateXNNFullyConnected(fbb, n.in[0], n.in[1], n.in[2], n.out, n.flags).Union();
          break;
        case Op::Reshape: {
          type = U::XNNStaticReshape;
          const auto& d = vals[n.out].dims;
          u = fbx::CreateXNNStaticReshapeDirect(fbb, static_cast<uint32_t>(d.size()), &d, n.in[0], n.out, 0).Union();
          break;
        }
      }
      xnodes.push_back(fbx::CreateXNode(fbb, type, u, 0));
    }
    auto root = fbx::CreateXNNGraphDirect(fbb, "0", &xnodes, &xvalues,
                                          static_cast<uint32_t>(inputs.size() + outputs.size()), &inputs, &outputs,
                                          &cdata);
    fbx::FinishXNNGraphBuffer(fbb, root);
    // header (30 bytes, padded to 32), flatbuffer, padding to 64, constants
    const size_t fb_off = 32, fb_size = fbb.GetSize(), c_off = (fb_off + fb_size + 63) / 64 * 64;
    const size_t total = c_off + constants.size();
    storage_.assign((total + 63) / 64 + 1, {});
    auto* p = reinterpret_cast<std::byte*>(storage_.data());
    auto put = [&](size_t at, uint64_t v, int n) {
      for (int i = 0; i < n; ++i) p[at + static_cast<size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
    };
    std::memcpy(p + 4, "XH00", 4);
    put(8, 30, 2);
    put(10, fb_off, 4);
    put(14, fb_size, 4);
    put(18, c_off, 4);
    put(22, constants.size(), 8);
    std::memcpy(p + fb_off, fbb.GetBufferPointer(), fb_size);
    if (!constants.empty()) std::memcpy(p + c_off, constants.data(), constants.size());
    return {p, total};
  }

 private:
  struct alignas(64) Block { std::byte b[64]; };
  std::vector<Block> storage_;  // the payload, 64-byte aligned (constants are read in place)
};

// ---------------------------------------------------------------- the reference

// Every value of `g` in double precision, from the inputs.
std::vector<std::vector<double>> reference(const Graph& g, const std::vector<std::vector<float>>& inputs) {
  std::vector<std::vector<double>> v(g.vals.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) v[g.inputs[i]].assign(inputs[i].begin(), inputs[i].end());
  for (size_t id = 0; id < g.vals.size(); ++id)
    if (g.vals[id].kind == Graph::Kind::Const) v[id].assign(g.vals[id].data.begin(), g.vals[id].data.end());
  for (const Graph::Node& n : g.nodes) {
    const auto& od = g.vals[n.out].dims;
    const size_t numel = static_cast<size_t>(g.vals[n.out].numel());
    std::vector<double> out(numel);
    const std::vector<double>& a = v[n.in[0]];
    if (binary(n.op)) {
      // numpy broadcasting of two operands to the output's shape
      auto index = [&](uint32_t operand, size_t flat) {
        const auto& d = g.vals[operand].dims;
        size_t idx = 0, stride = 1, rem = flat;
        for (size_t k = od.size(); k-- > 0;) {
          size_t coord = rem % od[k];
          rem /= od[k];
          if (k + d.size() >= od.size()) {  // the operand's axis aligned to the right
            const size_t ek = k + d.size() - od.size();
            if (d[ek] != 1) idx += coord * stride;
            stride *= d[ek];
          }
        }
        return idx;
      };
      const std::vector<double>& b = v[n.in[1]];
      for (size_t i = 0; i < numel; ++i) {
        double x = a[index(n.in[0], i)], y = b[index(n.in[1], i)];
        out[i] = n.op == Op::Add ? x + y : n.op == Op::Sub ? x - y : n.op == Op::Mul ? x * y : std::max(x, y);
      }
    } else if (n.op == Op::FullyConnected) {
      const auto& wd = g.vals[n.in[1]].dims;
      const size_t K = n.flags ? wd[0] : wd[1], N = n.flags ? wd[1] : wd[0], M = numel / N;
      const std::vector<double>& w = v[n.in[1]];
      for (size_t m = 0; m < M; ++m)
        for (size_t j = 0; j < N; ++j) {
          double s = n.in[2] == kNone ? 0.0 : v[n.in[2]][j];
          for (size_t k = 0; k < K; ++k) s += a[m * K + k] * (n.flags ? w[k * N + j] : w[j * K + k]);
          out[m * N + j] = s;
        }
    } else if (n.op == Op::Softmax) {
      const size_t C = od.back();
      for (size_t r = 0; r < numel / C; ++r) {
        double mx = -INFINITY, sum = 0;
        for (size_t c = 0; c < C; ++c) mx = std::max(mx, a[r * C + c]);
        for (size_t c = 0; c < C; ++c) sum += std::exp(a[r * C + c] - mx);
        for (size_t c = 0; c < C; ++c) out[r * C + c] = std::exp(a[r * C + c] - mx) / sum;
      }
    } else {
      for (size_t i = 0; i < numel; ++i) {
        const double x = a[i];
        switch (n.op) {
          case Op::Tanh: out[i] = std::tanh(x); break;
          case Op::Sigmoid: out[i] = 1.0 / (1.0 + std::exp(-x)); break;
          case Op::Square: out[i] = x * x; break;
          case Op::Rsqrt: out[i] = 1.0 / std::sqrt(x); break;
          case Op::Reshape: out[i] = x; break;
          default: ADD_FAILURE() << "reference: unhandled op"; break;
        }
      }
    }
    v[n.out] = std::move(out);
  }
  return v;
}

// ---------------------------------------------------------------- planning

struct Options {
  const char* engine = "kiln";
  bool per_node = false;
  size_t threads = 1;
};

std::unique_ptr<xd::State> plan(Graph& g, Options o, rt::Status* status = nullptr, std::string* error = nullptr,
                                bool named = false) {
  EXPECT_TRUE(kiln::backends::xnnpack::register_runtime_backend());
  rt::BackendOptions bo;
  bo.engine = o.engine;
  bo.profiling_detail = o.per_node;
  bo.threads = o.threads;
  auto st = std::make_unique<xd::State>();
  rt::ErrorMessage msg;
  rt::Status s = xd::plan_payload(nullptr, g.payload(named), bo, *st, &msg);
  if (status) *status = s;
  if (error) *error = msg.c_str();
  if (!status) { EXPECT_EQ(s, rt::Status::Ok) << msg.c_str(); }
  return s == rt::Status::Ok ? std::move(st) : nullptr;
}

int32_t group(const xd::State& st, uint32_t v) { return st.values[v].group; }
const Storage& storage(const xd::State& st, uint32_t v) {
  return st.groups[static_cast<size_t>(group(st, v))].storage;
}

// Which step runs each node (-1: a reshape that is a view), and the span of
// nodes each step runs; checks that every other node is run by exactly one
// step, in order, and that each step reads and writes what its nodes do.
struct Coverage {
  std::vector<int> step_of_node;
  std::vector<std::pair<size_t, size_t>> span;  // per step: first and last node
};

// The fused-chain op of a node.
xd::RowOpKind row_kind(Op op) {
  switch (op) {
    case Op::Add: return xd::RowOpKind::Add;
    case Op::Sub: return xd::RowOpKind::Sub;
    case Op::Mul: return xd::RowOpKind::Mul;
    case Op::Max: return xd::RowOpKind::Max;
    case Op::Tanh: return xd::RowOpKind::Tanh;
    case Op::Sigmoid: return xd::RowOpKind::Sigmoid;
    case Op::Square: return xd::RowOpKind::Square;
    case Op::Rsqrt: return xd::RowOpKind::Rsqrt;
    case Op::Softmax: return xd::RowOpKind::Softmax;
    case Op::FullyConnected: return xd::RowOpKind::RowDot;
    case Op::Reshape: break;
  }
  return xd::RowOpKind::Copy;
}

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

Coverage cover(const Graph& g, const xd::State& st) {
  Coverage c;
  c.step_of_node.assign(g.nodes.size(), -1);
  c.span.assign(st.steps.size(), {0, 0});
  std::vector<size_t> run;  // nodes some step must run
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Graph::Node& n = g.nodes[i];
    if (n.op == Op::Reshape && group(st, n.in[0]) == group(st, n.out)) continue;  // a view
    run.push_back(i);
  }
  size_t next = 0;
  for (size_t s = 0; s < st.steps.size(); ++s) {
    const xd::Step& step = st.steps[s];
    if (next >= run.size()) {
      ADD_FAILURE() << "step " << s << " (" << step.label << ") runs no node";
      return c;
    }
    size_t count = 0;
    switch (step.kind) {
      case StepKind::Subgraph:
        // the run of nodes whose results this subgraph writes
        while (next + count < run.size() && contains(step.external_groups, group(st, g.nodes[run[next + count]].out)))
          ++count;
        EXPECT_GE(count, 1u) << "subgraph step " << s << " writes nothing of node " << run[next];
        for (size_t k = 0; k < count; ++k) {
          const Graph::Node& n = g.nodes[run[next + k]];
          EXPECT_TRUE(library_node(n.op)) << "node " << run[next + k] << " is not an XNNPACK node";
          for (uint32_t x : n.in)
            if (x != kNone && g.vals[x].kind != Graph::Kind::Const) {
              EXPECT_TRUE(contains(step.external_groups, group(st, x)))
                  << "subgraph step " << s << " does not see node " << run[next + k] << "'s input " << x;
            }
        }
        break;
      case StepKind::Rows: {
        count = step.row_ops.size();
        EXPECT_LE(next + count, run.size());
        count = std::min(count, run.size() - next);
        for (size_t k = 0; k < count; ++k) {
          const size_t i = run[next + k];
          const Graph::Node& n = g.nodes[i];
          const xd::RowOp& op = step.row_ops[k];
          EXPECT_EQ(static_cast<int>(op.kind), static_cast<int>(row_kind(n.op))) << "fused op " << k << " is not node " << i;
          EXPECT_EQ(op.out_slot, static_cast<int32_t>(k));
          if (op.write_group >= 0) {
            EXPECT_EQ(step.in[static_cast<size_t>(op.write_group)].group, group(st, n.out))
                << "fused op " << k << " writes another group than node " << i << "'s output";
          } else {
            EXPECT_EQ(storage(st, n.out).kind, Storage::Kind::None) << "node " << i << "'s result is dropped";
          }
          // operands: an earlier op of this chain whose node wrote them, or their storage
          auto check = [&](const xd::RowOperand& x, uint32_t v, const char* which) {
            if (x.src == xd::RowOperand::Src::Slot) {
              ASSERT_GE(x.index, 0);
              ASSERT_LT(static_cast<size_t>(x.index), k);
              EXPECT_EQ(g.nodes[run[next + static_cast<size_t>(x.index)]].out, v)
                  << "fused op " << k << "'s " << which << " is not node " << i << "'s";
            } else {
              ASSERT_EQ(x.src, xd::RowOperand::Src::Memory);
              EXPECT_EQ(step.in[static_cast<size_t>(x.index)].group, group(st, v))
                  << "fused op " << k << "'s " << which << " reads another group than node " << i << "'s";
            }
          };
          check(op.a, n.in[0], "a");
          if (binary(n.op)) check(op.b, n.in[1], "b");
          if (n.op == Op::FullyConnected) { EXPECT_EQ(op.w, st.values[n.in[1]].constant) << "fused op " << k << "'s weights"; }
        }
        break;
      }
      case StepKind::FullyConnected: case StepKind::Unary: case StepKind::Copy:
        count = 1;
        EXPECT_EQ(step.out.group, group(st, g.nodes[run[next]].out)) << "step " << s << " does not write node " << run[next];
        if (step.in.empty()) {
          ADD_FAILURE() << "step " << s << " reads nothing";
          return c;
        }
        EXPECT_EQ(step.in[0].group, group(st, g.nodes[run[next]].in[0])) << "step " << s << " does not read node " << run[next];
        if (step.kind == StepKind::FullyConnected) { EXPECT_EQ(g.nodes[run[next]].op, Op::FullyConnected); }
        break;
      default:
        ADD_FAILURE() << "unexpected step kind " << static_cast<int>(step.kind) << " (" << step.label << ")";
        return c;
    }
    if (count == 0) return c;
    c.span[s] = {run[next], run[next + count - 1]};
    for (size_t k = 0; k < count; ++k) c.step_of_node[run[next + k]] = static_cast<int>(s);
    next += count;
  }
  EXPECT_EQ(next, run.size()) << "nodes from " << (next < run.size() ? run[next] : 0) << " on are run by no step";
  return c;
}

// The storage invariants of a plan.
void check_storage(const Graph& g, const xd::State& st, const Coverage& c) {
  ASSERT_EQ(st.values.size(), g.vals.size());
  // groups: each value's bytes fit; arguments, constants, intermediates
  for (uint32_t id = 0; id < g.vals.size(); ++id) {
    const Graph::Val& v = g.vals[id];
    ASSERT_GE(group(st, id), 0);
    ASSERT_LT(static_cast<size_t>(group(st, id)), st.groups.size());
    EXPECT_GE(st.groups[static_cast<size_t>(group(st, id))].bytes, static_cast<size_t>(v.numel()) * 4);
    const Storage& s = storage(st, id);
    switch (v.kind) {
      case Graph::Kind::Input: case Graph::Kind::Output: {
        const auto& args = v.kind == Graph::Kind::Input ? g.inputs : g.outputs;
        size_t arg = static_cast<size_t>(std::find(args.begin(), args.end(), id) - args.begin());
        if (v.kind == Graph::Kind::Output) arg += g.inputs.size();
        EXPECT_EQ(s.kind, Storage::Kind::Arg) << "value " << id;
        EXPECT_EQ(s.arg, arg) << "value " << id;
        break;
      }
      case Graph::Kind::Const:
        EXPECT_EQ(s.kind, Storage::Kind::Static) << "value " << id;
        ASSERT_NE(s.data, nullptr);
        EXPECT_EQ(std::memcmp(s.data, v.data.data(), v.data.size() * 4), 0) << "value " << id << "'s bytes differ";
        break;
      case Graph::Kind::Temp: {
        // joined to an argument by reshapes, or the arena's, or only a fused chain's
        bool with_arg = false;
        for (uint32_t o = 0; o < g.vals.size(); ++o)
          with_arg |= group(st, o) == group(st, id) &&
                      (g.vals[o].kind == Graph::Kind::Input || g.vals[o].kind == Graph::Kind::Output);
        if (with_arg) {
          EXPECT_EQ(s.kind, Storage::Kind::Arg) << "value " << id;
        } else {
          EXPECT_TRUE(s.kind == Storage::Kind::Arena || s.kind == Storage::Kind::None) << "value " << id;
        }
        break;
      }
    }
  }
  // groups only a fused chain's slots hold are read by no step from memory
  for (size_t s = 0; s < st.steps.size(); ++s) {
    const xd::Step& step = st.steps[s];
    std::vector<int32_t> touched = step.external_groups;
    for (const xd::Operand& o : step.in) touched.push_back(o.group);
    if (step.out.group >= 0) touched.push_back(step.out.group);
    for (int32_t gi : touched) {
      if (gi < 0) continue;  // no bias
      EXPECT_NE(st.groups[static_cast<size_t>(gi)].storage.kind, Storage::Kind::None)
          << "step " << s << " (" << step.label << ") touches group " << gi << ", which has no memory";
    }
  }
  // lifetimes, from the graph: nodes that write and read each group; a fused
  // chain runs its nodes row by row, so what it touches is live over its span
  std::vector<int64_t> def(st.groups.size(), INT64_MAX), use(st.groups.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Graph::Node& n = g.nodes[i];
    if (c.step_of_node[i] < 0) continue;  // a view: its values are one group
    auto first = static_cast<int64_t>(i), last = first;
    if (c.step_of_node[i] >= 0 && st.steps[static_cast<size_t>(c.step_of_node[i])].kind == StepKind::Rows) {
      first = static_cast<int64_t>(c.span[static_cast<size_t>(c.step_of_node[i])].first);
      last = static_cast<int64_t>(c.span[static_cast<size_t>(c.step_of_node[i])].second);
    }
    for (uint32_t x : n.in)
      if (x != kNone) use[static_cast<size_t>(group(st, x))] = std::max(use[static_cast<size_t>(group(st, x))], last);
    const auto go = static_cast<size_t>(group(st, n.out));
    def[go] = std::min(def[go], first);
    use[go] = std::max(use[go], last);
  }
  std::vector<size_t> arena;
  size_t intermediates = 0;
  for (const Graph::Val& v : g.vals)
    if (v.kind == Graph::Kind::Temp)
      intermediates += (static_cast<size_t>(v.numel()) * 4 + XNN_EXTRA_BYTES + xd::kArenaAlign - 1) / xd::kArenaAlign *
                       xd::kArenaAlign;
  for (size_t gi = 0; gi < st.groups.size(); ++gi) {
    const xd::Group& grp = st.groups[gi];
    if (grp.storage.kind != Storage::Kind::Arena) continue;
    arena.push_back(gi);
    EXPECT_EQ(grp.storage.offset % xd::kArenaAlign, 0u) << "group " << gi;
    // XNNPACK may read XNN_EXTRA_BYTES past a tensor: that too is inside the arena
    EXPECT_LE(grp.storage.offset + grp.bytes + XNN_EXTRA_BYTES, st.arena_bytes) << "group " << gi;
    EXPECT_LE(def[gi], use[gi]) << "arena group " << gi << " is never written";
  }
  EXPECT_LE(st.arena_bytes, intermediates);
  EXPECT_EQ(st.arena == nullptr, st.arena_bytes == 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(st.arena) % xd::kArenaAlign, 0u);
  for (size_t a = 0; a < arena.size(); ++a)
    for (size_t b = a + 1; b < arena.size(); ++b) {
      const size_t ga = arena[a], gb = arena[b];
      const bool live_together = def[ga] <= use[gb] && def[gb] <= use[ga];
      if (!live_together) continue;
      const xd::Group &x = st.groups[ga], &y = st.groups[gb];
      const bool disjoint = x.storage.offset + x.bytes <= y.storage.offset || y.storage.offset + y.bytes <= x.storage.offset;
      EXPECT_TRUE(disjoint) << "groups " << ga << " [" << def[ga] << ", " << use[ga] << "] and " << gb << " [" << def[gb]
                            << ", " << use[gb] << "] are live together and share bytes: " << x.storage.offset << "+"
                            << x.bytes << " and " << y.storage.offset << "+" << y.bytes;
    }
}

// Plans `g` and checks the plan's invariants.
std::unique_ptr<xd::State> plan_checked(Graph& g, Options o, Coverage* out = nullptr) {
  auto st = plan(g, o);
  if (!st) return st;
  Coverage c = cover(g, *st);
  check_storage(g, *st, c);
  if (out) *out = std::move(c);
  return st;
}

// Runs the planned state on random inputs and compares every output with the reference.
void check_numerics(const Graph& g, xd::State& st, uint32_t seed, int calls = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int call = 0; call < calls; ++call) {  // twice: arena bytes left from a call must not matter
    std::vector<std::vector<float>> in(g.inputs.size()), out(g.outputs.size());
    std::vector<rt::Tensor> tensors(g.inputs.size() + g.outputs.size());
    std::vector<rt::EValue> evalues(tensors.size());
    std::vector<rt::EValue*> args(tensors.size());
    for (size_t a = 0; a < tensors.size(); ++a) {
      const bool is_in = a < g.inputs.size();
      const Graph::Val& v = g.vals[is_in ? g.inputs[a] : g.outputs[a - g.inputs.size()]];
      std::vector<float>& buf = is_in ? in[a] : out[a - g.inputs.size()];
      buf.reserve(static_cast<size_t>(v.numel()) + XNN_EXTRA_BYTES / 4);  // XNNPACK may read past the end
      buf.resize(static_cast<size_t>(v.numel()));
      for (float& x : buf) x = is_in ? u(rng) : NAN;
      std::vector<int64_t> shape(v.dims.begin(), v.dims.end());
      ASSERT_EQ(rt::make_contiguous_tensor(tensors[a], kiln::ScalarType::Float, shape, buf.data(), buf.size() * 4),
                rt::Status::Ok);
      evalues[a] = rt::EValue::from_tensor(&tensors[a]);
      args[a] = &evalues[a];
    }
    const auto ref = reference(g, in);  // before the call, which must not write its inputs
    rt::ErrorMessage msg;
    ASSERT_EQ(xd::execute_state(st, args, &msg), rt::Status::Ok) << msg.c_str();
    for (size_t i = 0; i < g.inputs.size(); ++i)
      for (size_t k = 0; k < in[i].size(); ++k)
        ASSERT_EQ(static_cast<double>(in[i][k]), ref[g.inputs[i]][k]) << "the call wrote input " << i;
    for (size_t o = 0; o < g.outputs.size(); ++o) {
      const auto& r = ref[g.outputs[o]];
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        // |out - ref| <= 1e-4 (1 + |ref|), false for NaN
        const bool close = std::abs(static_cast<double>(out[o][i]) - r[i]) <= 1e-4 * (1.0 + std::abs(r[i]));
        if (!close && bad++ == 0) first = i;
      }
      EXPECT_EQ(bad, 0u) << "output " << o << ": " << bad << " of " << r.size() << " elements differ, first " << first
                         << ": " << out[o][first] << ", reference " << r[first];
    }
  }
}

size_t count(const xd::State& st, StepKind k) {
  return static_cast<size_t>(std::count_if(st.steps.begin(), st.steps.end(), [&](const xd::Step& s) { return s.kind == k; }));
}

// ---------------------------------------------------------------- graphs of the tests

// x -> FC(W0 [N,K]) -> +b -> tanh -> FC(W1 [K,N], bias) -> out
Graph mlp() {
  Graph g;
  uint32_t x = g.input({6, 24});
  uint32_t w0 = g.constant({32, 24}), b = g.constant({32}), w1 = g.constant({32, 16}), b1 = g.constant({16});
  uint32_t h = g.temp({6, 32}), hb = g.temp({6, 32}), t = g.temp({6, 32});
  uint32_t out = g.output({6, 16});
  g.fc(x, w0, kNone, h);
  g.node(Op::Add, {h, b}, hb);
  g.node(Op::Tanh, {hb}, t);
  g.fc(t, w1, b1, out, /*kn=*/true);
  return g;
}

// reshapes between nodes (views), of an input (joins the argument) and from
// an input to an output (two fixed homes: a copy); sizes not a multiple of 64 bytes
Graph reshapes() {
  Graph g;
  uint32_t x = g.input({3, 10});
  uint32_t out2 = g.output({5, 6});
  uint32_t xr = g.temp({5, 6});
  uint32_t w0 = g.constant({12, 30}), w1 = g.constant({7, 12});
  uint32_t xf = g.temp({1, 30}), h = g.temp({1, 12}), hr = g.temp({3, 4}), t = g.temp({3, 4}), tr = g.temp({1, 12});
  uint32_t out = g.output({1, 7});
  g.node(Op::Reshape, {x}, xf);    // input view
  g.fc(xf, w0, kNone, h);
  g.node(Op::Reshape, {h}, hr);    // intermediate view
  g.node(Op::Tanh, {hr}, t);
  g.node(Op::Reshape, {t}, tr);    // intermediate view
  g.fc(tr, w1, kNone, out);
  g.node(Op::Reshape, {x}, xr);    // input view, read by nothing but the next reshape
  g.node(Op::Reshape, {xr}, out2); // ... to an output: a copy
  return g;
}

// values with disjoint and overlapping lifetimes: a stack of layers with two skip connections
Graph lifetimes() {
  Graph g;
  uint32_t x = g.input({8, 32});
  std::vector<uint32_t> w, h;
  for (int i = 0; i < 4; ++i) w.push_back(g.constant({32, 32}, -0.3f, 0.3f));
  for (int i = 0; i < 8; ++i) h.push_back(g.temp({8, 32}));
  uint32_t y = g.output({8, 32});
  g.fc(x, w[0], kNone, h[0]);
  g.node(Op::Tanh, {h[0]}, h[1]);
  g.fc(h[1], w[1], kNone, h[2]);
  g.node(Op::Sigmoid, {h[2]}, h[3]);
  g.fc(h[3], w[2], kNone, h[4]);
  g.node(Op::Add, {h[4], h[1]}, h[5]);  // h[1] lives over h[2..4]
  g.node(Op::Tanh, {h[5]}, h[6]);
  g.fc(h[6], w[3], kNone, h[7]);
  g.node(Op::Add, {h[7], h[0]}, y);     // h[0] lives over everything
  return g;
}

// layer norm then softmax over rows: one fused chain with row means (FC with one output column)
Graph layer_norm_softmax(uint32_t B = 2, uint32_t R = 3, uint32_t C = 16) {
  Graph g;
  uint32_t x = g.input({B, R, C});
  uint32_t mean_w = g.filled({1, C}, 1.0f / C), eps = g.filled({1}, 1e-5f);
  uint32_t gamma = g.constant({C}, 0.5f, 1.5f), beta = g.constant({C});
  uint32_t mean = g.temp({B, R, 1}), d = g.temp({B, R, C}), sq = g.temp({B, R, C}), var = g.temp({B, R, 1});
  uint32_t ve = g.temp({B, R, 1}), rs = g.temp({B, R, 1}), y = g.temp({B, R, C}), z = g.temp({B, R, C});
  uint32_t zb = g.temp({B, R, C});
  uint32_t p = g.output({B, R, C}), normed = g.output({B, R, C});
  g.fc(x, mean_w, kNone, mean);
  g.node(Op::Sub, {x, mean}, d);
  g.node(Op::Square, {d}, sq);
  g.fc(sq, mean_w, kNone, var);
  g.node(Op::Add, {var, eps}, ve);
  g.node(Op::Rsqrt, {ve}, rs);
  g.node(Op::Mul, {d, rs}, y);
  g.node(Op::Mul, {y, gamma}, z);
  g.node(Op::Add, {z, beta}, zb);
  g.node(Op::Softmax, {zb}, p);
  g.node(Op::Max, {y, zb}, normed);  // a second output, reading two values of the chain
  return g;
}

// ---------------------------------------------------------------- tests

TEST(XnnpackPlanner, KilnEngineRunsFullyConnectedOnKilnSteps) {
  Graph g = mlp();
  Coverage c;
  auto st = plan_checked(g, {"kiln"}, &c);
  ASSERT_TRUE(st);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op == Op::FullyConnected) {
      EXPECT_EQ(st->steps[static_cast<size_t>(c.step_of_node[i])].kind, StepKind::FullyConnected) << "node " << i;
    }
  EXPECT_EQ(count(*st, StepKind::Subgraph), 0u);
  // add and tanh: one fused chain
  EXPECT_EQ(c.step_of_node[1], c.step_of_node[2]);
  EXPECT_EQ(st->steps[static_cast<size_t>(c.step_of_node[1])].kind, StepKind::Rows);
  check_numerics(g, *st, 1);
}

TEST(XnnpackPlanner, XnnpackEngineRunsFullyConnectedInSubgraphs) {
  Graph g = mlp();
  Coverage c;
  auto st = plan_checked(g, {"xnnpack"}, &c);
  ASSERT_TRUE(st);
  EXPECT_EQ(count(*st, StepKind::FullyConnected), 0u);
  EXPECT_EQ(count(*st, StepKind::Rows), 0u);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const StepKind k = st->steps[static_cast<size_t>(c.step_of_node[i])].kind;
    EXPECT_EQ(k, library_node(g.nodes[i].op) ? StepKind::Subgraph : StepKind::Unary) << "node " << i;
  }
  // FC and add in one subgraph, tanh on kiln's code, the second FC in another
  EXPECT_EQ(c.step_of_node[0], c.step_of_node[1]);
  EXPECT_EQ(st->steps.size(), 3u);
  check_numerics(g, *st, 2);
}

TEST(XnnpackPlanner, ProfilingDetailGivesOneSubgraphPerLibraryNode) {
  for (const char* engine : {"xnnpack", "kiln"}) {
    SCOPED_TRACE(engine);
    Graph g = mlp();
    Coverage c;
    auto st = plan_checked(g, {engine, /*per_node=*/true}, &c);
    ASSERT_TRUE(st);
    for (size_t s = 0; s < st->steps.size(); ++s)
      if (st->steps[s].kind == StepKind::Subgraph) { EXPECT_EQ(c.span[s].first, c.span[s].second) << "step " << s; }
    size_t library = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      library += st->steps[static_cast<size_t>(c.step_of_node[i])].kind == StepKind::Subgraph;
    if (std::string(engine) == "xnnpack") {
      EXPECT_EQ(library, 3u);  // FC, add, FC
      EXPECT_EQ(count(*st, StepKind::Subgraph), 3u);
      EXPECT_EQ(st->steps[0].label, "xnnpack FullyConnected 32x24");
    } else {
      EXPECT_EQ(library, 0u);  // kiln runs all of them
    }
    check_numerics(g, *st, 3);
  }
}

TEST(XnnpackPlanner, ReshapesAreViewsSharingAGroup) {
  for (const char* engine : {"kiln", "xnnpack"}) {
    SCOPED_TRACE(engine);
    Graph g = reshapes();
    Coverage c;
    auto st = plan_checked(g, {engine}, &c);
    ASSERT_TRUE(st);
    // views: no step, one group
    for (size_t i : {0u, 2u, 4u, 6u}) {
      EXPECT_EQ(c.step_of_node[i], -1) << "reshape node " << i << " has a step";
      EXPECT_EQ(group(*st, g.nodes[i].in[0]), group(*st, g.nodes[i].out)) << "reshape node " << i;
    }
    // the input's views are the argument
    EXPECT_EQ(storage(*st, g.nodes[0].out).kind, Storage::Kind::Arg);
    EXPECT_EQ(storage(*st, g.nodes[0].out).arg, 0u);
    // input to output: a copy between the two arguments
    const int cs = c.step_of_node[7];
    ASSERT_GE(cs, 0);
    EXPECT_NE(group(*st, g.nodes[7].in[0]), group(*st, g.nodes[7].out));
    EXPECT_EQ(storage(*st, g.nodes[7].out).kind, Storage::Kind::Arg);
    EXPECT_EQ(storage(*st, g.nodes[7].out).arg, 1u);
    // distinct groups: x (+ its views), out2, w0, w1, h (+hr), t (+tr), out
    std::vector<int32_t> groups;
    for (const xd::Value& v : st->values) groups.push_back(v.group);
    std::sort(groups.begin(), groups.end());
    EXPECT_EQ(std::unique(groups.begin(), groups.end()) - groups.begin(), 7);
    check_numerics(g, *st, 4);
  }
}

TEST(XnnpackPlanner, ArenaReusesBytesOfDeadValues) {
  for (const char* engine : {"kiln", "xnnpack"}) {
    for (bool per_node : {false, true}) {
      SCOPED_TRACE(std::string(engine) + (per_node ? " per node" : ""));
      Graph g = lifetimes();
      auto st = plan_checked(g, {engine, per_node});
      ASSERT_TRUE(st);
      // all eight intermediates have the same size; at most four are live at once
      // (h0 and h1 over most nodes, and a layer's input and output), so bytes are reused
      const size_t slot = (8 * 32 * 4 + XNN_EXTRA_BYTES + xd::kArenaAlign - 1) / xd::kArenaAlign * xd::kArenaAlign;
      EXPECT_LT(st->arena_bytes, 8 * slot);
      EXPECT_GE(st->arena_bytes, 2 * slot);  // h0 and h1 overlap whatever is fused
      check_numerics(g, *st, 5);
    }
  }
}

TEST(XnnpackPlanner, LayerNormSoftmaxIsOneFusedChain) {
  Graph g = layer_norm_softmax();
  Coverage c;
  auto st = plan_checked(g, {"kiln"}, &c);
  ASSERT_TRUE(st);
  ASSERT_EQ(st->steps.size(), 1u);
  const xd::Step& rows = st->steps[0];
  EXPECT_EQ(rows.kind, StepKind::Rows);
  EXPECT_EQ(rows.rows, 6);
  EXPECT_EQ(rows.cols, 16);
  EXPECT_EQ(rows.row_ops.size(), g.nodes.size());
  // what only the chain reads stays in its slots; nothing is left for the arena
  for (uint32_t id = 0; id < g.vals.size(); ++id)
    if (g.vals[id].kind == Graph::Kind::Temp) { EXPECT_EQ(storage(*st, id).kind, Storage::Kind::None) << "value " << id; }
  EXPECT_EQ(st->arena_bytes, 0u);
  check_numerics(g, *st, 6);
}

TEST(XnnpackPlanner, LayerNormSoftmaxOnXnnpack) {
  Graph g = layer_norm_softmax();
  Coverage c;
  auto st = plan_checked(g, {"xnnpack"}, &c);
  ASSERT_TRUE(st);
  // FC .. add in one subgraph, rsqrt on kiln's code, mul .. max in another
  ASSERT_EQ(st->steps.size(), 3u);
  EXPECT_EQ(st->steps[0].kind, StepKind::Subgraph);
  EXPECT_EQ(c.span[0], std::make_pair(size_t{0}, size_t{4}));
  EXPECT_EQ(st->steps[1].kind, StepKind::Unary);
  EXPECT_EQ(st->steps[2].kind, StepKind::Subgraph);
  check_numerics(g, *st, 7);
}

TEST(XnnpackPlanner, ThreadsDoNotChangeResults) {
  Graph g = lifetimes();
  auto st = plan_checked(g, {"kiln", false, 2});
  ASSERT_TRUE(st);
  check_numerics(g, *st, 8);
  // a chain of 96 rows x 256: split finer than one piece per thread (pieces are handed out one at a
  // time), never past one row or under kMinTaskElements elements each
  Graph h = layer_norm_softmax(2, 48, 256);
  auto sh = plan_checked(h, {"kiln", false, 2});
  ASSERT_TRUE(sh);
  const xd::Step& chain = sh->steps[0];
  EXPECT_EQ(chain.tasks, std::min<int64_t>({chain.rows, xd::kTasksPerThread * sh->exec.threads,
                                            chain.rows * chain.cols / xd::kMinTaskElements}));
  EXPECT_GT(chain.tasks, sh->exec.threads);
  check_numerics(h, *sh, 9);
  // 6 rows x 16 (a one-token step's size): one task, on the caller
  Graph t = layer_norm_softmax();
  auto st2 = plan_checked(t, {"kiln", false, 2});
  ASSERT_TRUE(st2);
  EXPECT_EQ(st2->steps[0].tasks, 1);
  check_numerics(t, *st2, 10);
}

TEST(XnnpackPlanner, RejectsBadGraphsWithAMessage) {
  {
    Graph g = mlp();
    g.nodes[2].in[0] = 99;  // tanh reads a value the graph does not have
    rt::Status s;
    std::string error;
    auto st = plan(g, {"kiln"}, &s, &error);
    EXPECT_FALSE(st);
    EXPECT_EQ(s, rt::Status::InvalidProgram);
    EXPECT_NE(error.find("value 99 is not defined"), std::string::npos) << error;
  }
  {
    Graph g = reshapes();
    g.vals[g.nodes[2].out].dims = {3, 5};  // hr: a reshape that changes the element count
    rt::Status s;
    std::string error;
    auto st = plan(g, {"kiln"}, &s, &error);
    EXPECT_EQ(s, rt::Status::InvalidProgram);
    EXPECT_NE(error.find("reshape"), std::string::npos) << error;
  }
  {
    Graph g = mlp();
    rt::Status s;
    std::string error;
    auto st = plan(g, {"fast"}, &s, &error);
    EXPECT_EQ(s, rt::Status::InvalidArgument);
    EXPECT_NE(error.find("unknown engine"), std::string::npos) << error;
  }
  {
    Graph g = mlp();
    rt::Status s;
    std::string error;
    auto st = plan(g, {"kiln"}, &s, &error, /*named=*/true);  // named constants, and no program
    EXPECT_EQ(s, rt::Status::InvalidProgram);
    EXPECT_NE(error.find("named constant"), std::string::npos) << error;
  }
}

}  // namespace
