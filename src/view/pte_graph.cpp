// A .pte program as a ViewGraph: the execution plan's instructions in order
// (kernel calls named by their operator, delegate calls as regions holding the
// nodes of their XNNPACK payload), the tensors between them as edges.
//
// Which arguments an instruction writes: for a kernel call whose operator is
// in kiln's operator table, the schema's out arguments and the return value
// (the emitters' layout: schema arguments in order, then the return); for a
// delegate call, the arguments after its payload's external inputs; otherwise
// (an operator kiln does not know) every planned tensor not yet written -- in
// a valid program a planned tensor is written before it is read.
#include "view_internal.h"

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "kiln/ops/op_id.h"
#include "kiln/runtime/pte_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

namespace kiln::view {
namespace {

namespace fs = std::filesystem;
namespace fbx = kiln::fb::xnnpack;
using nlohmann::json;

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::string dtype_text(fb::ScalarType t) {
  auto name = dtype_name(static_cast<ScalarType>(t));
  if (name == "unknown") return fmt::format("dtype{}", static_cast<int>(t));
  return std::string(name);
}

// Optional JSON beside the program; nullopt if absent or not JSON (a view
// never fails because of a side file).
std::optional<json> side_json(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream in(p);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

struct PlanReader {
  const rt::PteFile& file;
  const fb::ExecutionPlan& plan;
  size_t plan_index;
  ViewGraph& g;
  std::set<int32_t> plan_inputs, plan_outputs;
  // value -> (node, output slot) of its last writer
  std::map<int64_t, std::pair<int, int>> writer;
  std::map<int64_t, int> input_node;  // plan input value -> its Input node

  const fb::EValue* value(int32_t i) const {
    if (i < 0 || static_cast<uint32_t>(i) >= plan.values()->size()) return nullptr;
    return plan.values()->Get(static_cast<uint32_t>(i));
  }

  bool is_constant(const fb::Tensor* t) const { return t->data_buffer_idx() > 0 && !t->allocation_info(); }

  TensorInfo tensor_info(int32_t index) const {
    TensorInfo ti;
    ti.value = index;
    const fb::EValue* v = value(index);
    if (!v) return ti;
    if (const fb::Tensor* t = v->val_as_Tensor()) {
      ti.dtype = dtype_text(t->scalar_type());
      if (t->sizes())
        for (int32_t s : *t->sizes()) ti.shape.push_back(s);
      if (is_constant(t)) ti.role = "constant";
      if (t->extra_tensor_info() && t->extra_tensor_info()->fully_qualified_name())
        ti.name = t->extra_tensor_info()->fully_qualified_name()->str();
    }
    if (plan_inputs.count(index)) ti.role = "input";
    if (plan_outputs.count(index)) ti.role = "output";
    return ti;
  }

  // The tensors an argument names (a tensor, or the items of a tensor list).
  std::vector<int32_t> tensors_of(int32_t index) const {
    std::vector<int32_t> out;
    const fb::EValue* v = value(index);
    if (!v) return out;
    if (v->val_as_Tensor()) out.push_back(index);
    auto add_items = [&](const flatbuffers::Vector<int32_t>* items) {
      if (!items) return;
      for (int32_t i : *items)
        if (const fb::EValue* e = value(i); e && e->val_as_Tensor()) out.push_back(i);
    };
    if (const auto* l = v->val_as_TensorList()) add_items(l->items());
    if (const auto* l = v->val_as_OptionalTensorList()) add_items(l->items());
    return out;
  }

  std::string scalar_text(int32_t index) const {
    const fb::EValue* v = value(index);
    if (!v) return "?";
    switch (v->val_type()) {
      case fb::KernelTypes::Null: return "None";
      case fb::KernelTypes::Int: return std::to_string(v->val_as_Int()->int_val());
      case fb::KernelTypes::Bool: return v->val_as_Bool()->bool_val() ? "True" : "False";
      case fb::KernelTypes::Double: return fmt::format("{}", v->val_as_Double()->double_val());
      case fb::KernelTypes::String: return str(v->val_as_String()->string_val());
      case fb::KernelTypes::IntList: {
        std::vector<int64_t> items;
        if (v->val_as_IntList()->items())
          for (int64_t i : *v->val_as_IntList()->items()) items.push_back(i);
        return fmt::format("[{}]", fmt::join(items, ", "));
      }
      case fb::KernelTypes::DoubleList: {
        std::vector<double> items;
        if (v->val_as_DoubleList()->items())
          for (double d : *v->val_as_DoubleList()->items()) items.push_back(d);
        return fmt::format("[{}]", fmt::join(items, ", "));
      }
      case fb::KernelTypes::BoolList: {
        std::vector<std::string> items;
        if (v->val_as_BoolList()->items())
          for (bool b : *v->val_as_BoolList()->items()) items.push_back(b ? "True" : "False");
        return fmt::format("[{}]", fmt::join(items, ", "));
      }
      default: return fb::EnumNameKernelTypes(v->val_type());
    }
  }

  int add_node(Node n) {
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  }

  // Edge from the writer of `value` (if any) into node `to`.
  void read(int64_t value, int to) {
    auto it = writer.find(value);
    if (it == writer.end()) return;
    g.edges.push_back({it->second.first, to, it->second.second});
  }

  void write(int64_t value, int node) {
    Node& n = g.nodes[static_cast<size_t>(node)];
    writer[value] = {node, static_cast<int>(n.outputs.size())};
    n.outputs.push_back(tensor_info(static_cast<int32_t>(value)));
  }

  // For kernels kiln does not know: a planned tensor nobody wrote yet is written here.
  bool unwritten(int32_t t) const {
    if (writer.count(t) || plan_inputs.count(t)) return false;
    const fb::Tensor* ft = value(t)->val_as_Tensor();
    return ft && !is_constant(ft);
  }

  void kernel_call(size_t index, const fb::KernelCall& k) {
    const fb::Operator* op = plan.operators()->Get(static_cast<uint32_t>(k.op_index()));
    std::string name = str(op->name()), overload = str(op->overload());
    Node n;
    n.kind = Node::Kind::Kernel;
    n.id = fmt::format("i{}", index);
    n.label = overload.empty() ? name : name + "." + overload;
    n.instruction = static_cast<int>(index);
    std::vector<int32_t> args;
    if (k.args())
      for (int32_t a : *k.args()) args.push_back(a);
    const ops::Schema* schema = nullptr;
    std::string target;
    if (auto id = ops::find_op(name, overload)) {
      const ops::Schema& s = ops::op_schema(*id);
      // schema arguments, then the return value (one entry)
      if (static_cast<int>(args.size()) == s.num_args + 1) schema = &s;
      target = std::string(ops::op_info(*id).target);
    }
    if (!target.empty()) n.attrs.push_back({"target", target});
    int node = add_node(std::move(n));
    std::vector<std::pair<int32_t, bool>> touched;  // (tensor, written)
    for (size_t a = 0; a < args.size(); ++a) {
      bool writes;
      if (schema) {
        writes = static_cast<int>(a) >= schema->num_inputs() || (schema->inplace && a == 0);
        if (static_cast<int>(a) < schema->num_args && !is_tensor_type(schema->args[a].type)) {
          g.nodes[static_cast<size_t>(node)].attrs.push_back(
              {std::string(schema->args[a].name), scalar_text(args[a])});
          continue;
        }
      } else {
        writes = false;
        if (tensors_of(args[a]).empty()) {
          g.nodes[static_cast<size_t>(node)].attrs.push_back({fmt::format("arg{}", a), scalar_text(args[a])});
          continue;
        }
      }
      for (int32_t t : tensors_of(args[a])) touched.emplace_back(t, schema ? writes : unwritten(t));
    }
    // reads first (an in-place call reads its self before writing it)
    std::set<int32_t> seen_in, seen_out;
    for (auto [t, w] : touched)
      if (!w || (schema && schema->inplace && t == (args.empty() ? -1 : args[0]))) {
        if (!seen_in.insert(t).second) continue;
        g.nodes[static_cast<size_t>(node)].inputs.push_back(tensor_info(t));
        read(t, node);
      }
    for (auto [t, w] : touched)
      if (w && seen_out.insert(t).second) write(t, node);
    g.operator_counts[g.nodes[static_cast<size_t>(node)].label]++;
    g.kernel_calls++;
  }

  static bool is_tensor_type(ops::Type t) {
    return t == ops::Type::Tensor || t == ops::Type::OptionalTensor || t == ops::Type::TensorList ||
           t == ops::Type::OptionalTensorList;
  }

  void delegate_call(size_t index, const fb::DelegateCall& d) {
    const fb::BackendDelegate* del = plan.delegates()->Get(static_cast<uint32_t>(d.delegate_index()));
    Node n;
    n.kind = Node::Kind::Delegate;
    n.id = fmt::format("d{}", g.delegate_regions);  // the region ordinal (a delegate may be called twice)
    n.instruction = static_cast<int>(index);
    n.label = fmt::format("{} #{}", str(del->id()), g.delegate_regions);
    n.attrs.push_back({"backend", str(del->id())});
    n.attrs.push_back({"delegate_index", std::to_string(d.delegate_index())});
    std::vector<int32_t> args;
    if (d.args())
      for (int32_t a : *d.args()) args.push_back(a);
    int node = add_node(std::move(n));
    g.delegate_regions++;
    auto payload = file.delegate_payload(plan_index, static_cast<size_t>(d.delegate_index()));
    bool parsed = false;
    if (str(del->id()) == "XnnpackBackend") {
      // A corrupt payload is a corrupt file: one error, not an empty region drawn as if it were fine.
      if (!payload.ok() || !xnnpack_payload(node, payload.value(), args))
        fail("{}: delegate {} (XnnpackBackend) of method '{}': its payload is not a readable XNNGraph", g.path,
             d.delegate_index(), str(plan.name()));
      parsed = true;
    }
    if (!parsed) {
      std::vector<int32_t> outs;
      for (int32_t a : args)
        for (int32_t t : tensors_of(a)) {
          if (unwritten(t)) {
            outs.push_back(t);
            continue;
          }
          g.nodes[static_cast<size_t>(node)].inputs.push_back(tensor_info(t));
          read(t, node);
        }
      for (int32_t t : outs) write(t, node);
    }
  }

  // The payload's nodes as children of region node `region`; false if it is
  // not an XNNGraph this reader can follow.
  bool xnnpack_payload(int region, std::span<const std::byte> payload, const std::vector<int32_t>& args) {
    std::span<const std::byte> fbytes = payload;
    auto le = [&](size_t off, size_t n) {
      uint64_t v = 0;
      for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(payload[off + i]) << (8 * i);
      return v;
    };
    if (payload.size() >= 30 && std::memcmp(payload.data() + 4, "XH00", 4) == 0) {
      uint64_t off = le(10, 4), size = le(14, 4);
      if (off > payload.size() || size > payload.size() - off) return false;
      fbytes = payload.subspan(off, size);
    }
    flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(fbytes.data()), fbytes.size());
    if (!fbx::VerifyXNNGraphBuffer(verifier)) return false;
    const fbx::XNNGraph* graph = fbx::GetXNNGraph(fbytes.data());
    if (!graph->xnodes() || !graph->xvalues()) return false;

    struct XValue {
      const fbx::XNNTensorValue* t = nullptr;
      std::string quant;
    };
    std::map<uint32_t, XValue> values;
    for (const fbx::XValue* v : *graph->xvalues()) {
      XValue xv;
      if (const auto* t = v->xvalue_union_as_XNNTensorValue()) xv.t = t;
      if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) {
        xv.t = q->tensor_value();
        xv.quant = fbx::EnumNameXNNQuantParams(q->quant_params_type());
      }
      if (xv.t) values[xv.t->id_out()] = xv;
    }
    auto info = [&](uint32_t id) {
      TensorInfo ti;
      ti.value = id;
      auto it = values.find(id);
      if (it == values.end()) return ti;
      const fbx::XNNTensorValue* t = it->second.t;
      ti.dtype = fbx::EnumNameXNNDatatype(t->datatype());
      if (ti.dtype.rfind("xnn_datatype_", 0) == 0) ti.dtype = ti.dtype.substr(13);
      if (!it->second.quant.empty()) ti.dtype += " (" + it->second.quant + ")";
      if (t->dims())
        for (uint32_t s : *t->dims()) ti.shape.push_back(s);
      if (t->constant_buffer_idx() > 0) ti.role = "constant";
      if (t->flags() & 1u) ti.role = "input";
      if (t->flags() & 2u) ti.role = "output";
      return ti;
    };
    // external inputs: their argument's outer writer; count them to split args
    size_t num_inputs = graph->input_ids() ? graph->input_ids()->size() : 0;
    if (num_inputs > args.size()) return false;
    std::map<uint32_t, std::pair<int, int>> inner_writer;   // xnnpack value -> (node, slot)
    std::map<uint32_t, int64_t> external_outer;              // xnnpack value -> outer .pte value
    for (const auto& [id, xv] : values) {
      uint32_t e = xv.t->external_id();
      if (e != 0xFFFFFFFFu && e < args.size()) external_outer[id] = args[e];
    }
    Node& reg = g.nodes[static_cast<size_t>(region)];
    for (size_t a = 0; a < num_inputs; ++a)
      for (int32_t t : tensors_of(args[a])) reg.inputs.push_back(tensor_info(t));
    if (graph->version()) reg.attrs.push_back({"xnngraph_version", graph->version()->str()});
    reg.attrs.push_back({"xnnpack_nodes", std::to_string(graph->xnodes()->size())});
    reg.attrs.push_back({"xnnpack_values", std::to_string(graph->xvalues()->size())});

    size_t k = 0;
    int64_t region_index = g.delegate_regions - 1;
    for (const fbx::XNode* xn : *graph->xnodes()) {
      XNodeIo io = xnode_io(*xn);
      Node n;
      n.kind = Node::Kind::BackendNode;
      n.id = fmt::format("{}/x{}", g.nodes[static_cast<size_t>(region)].id, k);
      n.label = fbx::EnumNameXNodeUnion(xn->xnode_union_type());
      n.parent = region;
      n.debug_handle = xn->debug_handle();
      n.attrs = io.attrs;
      n.attrs.push_back({"region", std::to_string(region_index)});
      if (xn->output_min_max())
        n.attrs.push_back({"output_min_max",
                           fmt::format("[{}, {}]", xn->output_min_max()->output_min(), xn->output_min_max()->output_max())});
      int node = add_node(std::move(n));
      for (uint32_t in : io.inputs) {
        if (in == 0xFFFFFFFFu) continue;
        g.nodes[static_cast<size_t>(node)].inputs.push_back(info(in));
        if (auto it = inner_writer.find(in); it != inner_writer.end()) {
          g.edges.push_back({it->second.first, node, it->second.second});
        } else if (auto ot = external_outer.find(in); ot != external_outer.end()) {
          read(ot->second, node);
        }
      }
      for (uint32_t out : io.outputs) {
        Node& me = g.nodes[static_cast<size_t>(node)];
        inner_writer[out] = {node, static_cast<int>(me.outputs.size())};
        me.outputs.push_back(info(out));
        if (auto ot = external_outer.find(out); ot != external_outer.end()) {
          writer[ot->second] = {node, static_cast<int>(me.outputs.size()) - 1};
          me.outputs.back().name = fmt::format("value {}", ot->second);
        }
      }
      g.backend_operator_counts[g.nodes[static_cast<size_t>(node)].label]++;
      g.backend_nodes++;
      ++k;
    }
    // delegate outputs the graph passes straight through (never computed by a node)
    for (size_t a = num_inputs; a < args.size(); ++a)
      for (int32_t t : tensors_of(args[a])) {
        g.nodes[static_cast<size_t>(region)].outputs.push_back(tensor_info(t));
        if (!writer.count(t) || g.nodes[static_cast<size_t>(writer[t].first)].parent != region)
          writer[t] = {region, static_cast<int>(g.nodes[static_cast<size_t>(region)].outputs.size()) - 1};
      }
    // region-level inputs that no inner node reads directly still get an edge into the block
    for (const TensorInfo& ti : g.nodes[static_cast<size_t>(region)].inputs) read(ti.value, region);
    return true;
  }

  struct XNodeIo {
    std::vector<uint32_t> inputs, outputs;
    std::vector<Attr> attrs;
  };

  static std::string uints(const flatbuffers::Vector<uint32_t>* v) {
    std::vector<uint32_t> items;
    if (v)
      for (uint32_t x : *v) items.push_back(x);
    return fmt::format("[{}]", fmt::join(items, ", "));
  }

  static XNodeIo xnode_io(const fbx::XNode& xn) {
    XNodeIo io;
    using U = fbx::XNodeUnion;
    const void* p = xn.xnode_union();
    if (!p) return io;
    // the nodes that read input_id and write output_id (t, for their attributes)
    auto one_to_one = [&io](auto* t) {
      io.inputs = {t->input_id()};
      io.outputs = {t->output_id()};
      return t;
    };
    switch (xn.xnode_union_type()) {
      case U::XNNAdd: case U::XNNDiv: case U::XNNMinimum: case U::XNNMaximum: case U::XNNMultiply:
      case U::XNNSubtract: case U::XNNPReLU: case U::XNNBatchMatrixMultiply: {
        auto* t = static_cast<const fbx::_XNNNode2x1*>(p);
        io.inputs = {t->input1_id(), t->input2_id()};
        io.outputs = {t->output_id()};
        io.attrs.push_back({"flags", std::to_string(t->flags())});
        break;
      }
      case U::XNNFullyConnected: {
        auto* t = static_cast<const fbx::XNNFullyConnected*>(p);
        io.inputs = {t->input1_id(), t->filter_id(), t->bias_id()};
        io.outputs = {t->output_id()};
        io.attrs.push_back({"flags", std::to_string(t->flags())});
        break;
      }
      case U::XNNConv2d: case U::XNNDepthwiseConv2d: case U::XNNConvTranspose2d: {
        auto* t = static_cast<const fbx::_XNNNodeConv*>(p);
        io.inputs = {t->input1_id(), t->filter_id(), t->bias_id()};
        io.outputs = {t->output_id()};
        io.attrs = {{"kernel", fmt::format("{}x{}", t->kernel_height(), t->kernel_width())},
                    {"stride", fmt::format("{}x{}", t->subsampling_height(), t->subsampling_width())},
                    {"groups", std::to_string(t->groups())}};
        break;
      }
      case U::XNNAvgPooling2d: case U::XNNMaxPooling2d: {
        auto* t = one_to_one(static_cast<const fbx::_XNNPooling2D*>(p));
        io.attrs.push_back({"pooling", fmt::format("{}x{}", t->pooling_height(), t->pooling_width())});
        break;
      }
      case U::XNNArgMaxPooling2d: {
        auto* t = static_cast<const fbx::XNNArgMaxPooling2d*>(p);
        io.inputs = {t->input_id()};
        io.outputs = {t->output_value_id(), t->output_index_id()};
        break;
      }
      case U::XNNStaticTranspose: {
        auto* t = one_to_one(static_cast<const fbx::XNNStaticTranspose*>(p));
        io.attrs.push_back({"perm", uints(t->perm())});
        break;
      }
      case U::XNNStaticReshape: {
        auto* t = one_to_one(static_cast<const fbx::XNNStaticReshape*>(p));
        io.attrs.push_back({"new_shape", uints(t->new_shape())});
        break;
      }
      case U::XNNStaticSlice: {
        auto* t = one_to_one(static_cast<const fbx::XNNStaticSlice*>(p));
        io.attrs = {{"offsets", uints(t->offsets())}, {"sizes", uints(t->sizes())}};
        break;
      }
      case U::XNNStaticResizeBilinear2D: {
        one_to_one(static_cast<const fbx::XNNStaticResizeBilinear2D*>(p));
        break;
      }
      case U::XNNStaticConstantPad: {
        auto* t = one_to_one(static_cast<const fbx::XNNStaticConstantPad*>(p));
        io.attrs = {{"pre_paddings", uints(t->pre_paddings())}, {"post_paddings", uints(t->post_paddings())}};
        break;
      }
      case U::XNNConcatenate2: case U::XNNConcatenate3: case U::XNNConcatenate4: case U::XNNConcatenate5: {
        auto* t = static_cast<const fbx::_XNNCat*>(p);
        io.inputs = {t->input1_id(), t->input2_id(), t->input3_id(), t->input4_id(), t->input5_id()};
        io.outputs = {t->output_id()};
        io.attrs.push_back({"axis", std::to_string(t->axis())});
        break;
      }
      case U::XNNELU: {
        auto* t = one_to_one(static_cast<const fbx::XNNELU*>(p));
        io.attrs.push_back({"alpha", fmt::format("{}", t->alpha())});
        break;
      }
      case U::XNNLeakyReLU: {
        auto* t = one_to_one(static_cast<const fbx::XNNLeakyReLU*>(p));
        io.attrs.push_back({"negative_slope", fmt::format("{}", t->negative_slope())});
        break;
      }
      case U::XNNScaledDotProductAttention: {
        auto* t = static_cast<const fbx::XNNScaledDotProductAttention*>(p);
        io.inputs = {t->query_id(), t->key_id(), t->value_id(), t->scale_id(), t->mask_id()};
        io.outputs = {t->output_id()};
        break;
      }
      case U::NONE: break;
      default: {  // the one-input, one-output layout (softmax, tanh, convert, ...)
        one_to_one(static_cast<const fbx::_XNNNode1x1*>(p));
        break;
      }
    }
    return io;
  }

  // The node of the plan's input (or output) number k.
  int plan_node(Node::Kind kind, size_t k) {
    const bool input = kind == Node::Kind::Input;
    Node n;
    n.kind = kind;
    n.id = fmt::format("{}{}", input ? "in" : "out", k);
    n.label = fmt::format("{} {}", input ? "input" : "output", k);
    return add_node(std::move(n));
  }

  void run() {
    for (int32_t i : *plan.inputs()) plan_inputs.insert(i);
    for (int32_t i : *plan.outputs()) plan_outputs.insert(i);
    size_t k = 0;
    for (int32_t i : *plan.inputs()) write(i, plan_node(Node::Kind::Input, k++));
    size_t index = 0;
    if (plan.chains())
      for (const fb::Chain* chain : *plan.chains()) {
        if (!chain->instructions()) continue;
        for (size_t c = 0; c < chain->instructions()->size(); ++c, ++index) {
          const fb::Instruction* ins = chain->instructions()->Get(static_cast<uint32_t>(c));
          size_t before = g.nodes.size();
          if (const auto* kc = ins->instr_args_as_KernelCall()) {
            kernel_call(index, *kc);
          } else if (const auto* dc = ins->instr_args_as_DelegateCall()) {
            delegate_call(index, *dc);
          } else {
            Node n;
            n.kind = Node::Kind::Other;
            n.id = fmt::format("i{}", index);
            n.instruction = static_cast<int>(index);
            n.label = fb::EnumNameInstructionArguments(ins->instr_args_type());
            int node = add_node(std::move(n));
            if (const auto* mv = ins->instr_args_as_MoveCall()) {
              g.nodes[static_cast<size_t>(node)].inputs.push_back(tensor_info(mv->move_from()));
              read(mv->move_from(), node);
              write(mv->move_to(), node);
            }
          }
          // the source location the emitter recorded, if any
          if (chain->stacktrace() && c < chain->stacktrace()->size() && before < g.nodes.size()) {
            const fb::FrameList* fl = chain->stacktrace()->Get(static_cast<uint32_t>(c));
            if (fl && fl->items() && fl->items()->size() > 0) {
              std::string trace;
              for (const fb::Frame* f : *fl->items())
                trace += fmt::format("File \"{}\", line {}, in {}\n", str(f->filename()), f->lineno(), str(f->name()));
              const fb::Frame* last = fl->items()->Get(fl->items()->size() - 1);
              g.nodes[before].source = fmt::format("{}:{}", str(last->filename()), last->lineno());
              g.nodes[before].stack_trace = trace;
            }
          }
        }
      }
    k = 0;
    for (int32_t o : *plan.outputs()) {
      const int node = plan_node(Node::Kind::Output, k++);
      g.nodes[static_cast<size_t>(node)].inputs.push_back(tensor_info(o));
      read(o, node);
    }
    for (Node& n : g.nodes)
      if (n.kind == Node::Kind::Input) n.outputs[0].role = "input";
  }
};

// Fallback reasons from kiln lower's metadata JSON (delegation.fallback_reasons: target -> reasons).
void apply_report(ViewGraph& g, const json& meta, const std::string& report_path) {
  const json* d = meta.contains("delegation") ? &meta["delegation"] : nullptr;
  if (!d || !d->is_object()) return;
  g.notes.push_back(fmt::format("lowering report: {}", report_path));
  if (!d->contains("fallback_reasons") || !(*d)["fallback_reasons"].is_object()) return;
  const json& reasons = (*d)["fallback_reasons"];
  for (Node& n : g.nodes) {
    if (!n.fallback) continue;
    std::string target;
    for (const Attr& a : n.attrs)
      if (a.key == "target") target = a.value;
    auto it = reasons.find(target);
    if (it == reasons.end() || !it->is_array() || it->empty()) continue;
    std::vector<std::string> rs;
    for (const json& r : *it)
      if (r.is_string()) rs.push_back(r.get<std::string>());
    n.reason = rs.size() == 1 ? rs[0] : fmt::format("one of: {}", fmt::join(rs, "; "));
  }
}

}  // namespace

ViewGraph read_pte(const std::string& path) {
  rt::ErrorMessage error;
  rt::Result<rt::PteFile> loaded = rt::PteFile::open(path.c_str(), &error);
  if (!loaded.ok()) fail("{}: {}", path, error.empty() ? rt::status_name(loaded.status()) : error.c_str());
  const rt::PteFile& file = loaded.value();
  const fb::Program& program = file.program();
  if (!program.execution_plan() || program.execution_plan()->size() == 0) fail("{}: the program has no execution plan", path);
  // "forward", else the plan with the most instructions (constant methods have none)
  size_t best = 0, best_count = 0;
  for (size_t p = 0; p < program.execution_plan()->size(); ++p) {
    const fb::ExecutionPlan* plan = program.execution_plan()->Get(static_cast<uint32_t>(p));
    size_t count = 0;
    if (plan->chains())
      for (const fb::Chain* c : *plan->chains()) count += c->instructions() ? c->instructions()->size() : 0;
    if (str(plan->name()) == "forward") {
      best = p;
      break;
    }
    if (count > best_count) best = p, best_count = count;
  }
  ViewGraph g;
  g.path = path;
  g.format = "pte";
  g.title = fs::path(path).filename().string();
  const fb::ExecutionPlan& plan = *program.execution_plan()->Get(static_cast<uint32_t>(best));
  PlanReader reader{file, plan, best, g, {}, {}, {}, {}};
  reader.run();
  if (program.execution_plan()->size() > 1)
    g.notes.push_back(fmt::format("method '{}' of {}", str(plan.name()), program.execution_plan()->size()));
  if (g.delegate_regions > 0)
    for (Node& n : g.nodes)
      if (n.kind == Node::Kind::Kernel) {
        n.fallback = true;
        g.fallback_ops++;
      }
  fs::path p(path);
  fs::path report = p.parent_path() / (p.stem().string() + ".json");
  if (auto meta = side_json(report)) apply_report(g, *meta, report.string());
  fs::path debug = p.parent_path() / (p.stem().string() + ".debug.json");
  if (auto dbg = side_json(debug)) apply_debug_map(g, *dbg, debug.string());
  return g;
}

}  // namespace kiln::view
