// kiln's runtime backend for XNNPACK delegate payloads (see
// include/kiln/backends/xnnpack/runtime.h for what it does).
//
// Payload layout (ExecuTorch's XNNPACK delegate, as both kiln and ExecuTorch
// write it): a 30-byte header -- 4 bytes, the magic "XH00", u16 header length,
// u32 flatbuffer offset, u32 flatbuffer size, u32 constant-data offset, u64
// constant-data size, little-endian -- then the XNNGraph flatbuffer
// (schema/xnnpack_graph.fbs) and the inline constant bytes. A constant is
// either an (offset, size) in that region or a key of the program's named data.
// The delegate call's arguments are the graph's external inputs, then its
// external outputs, each in increasing external_id order.
//
// Runtime code: no exceptions, no RTTI; init allocates, execute does not.

#include "kiln/backends/xnnpack/runtime.h"

#include "backend_state.h"
#include "kiln/cpu/quant.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/pte_file.h"

#include <sys/mman.h>
#include <xnnpack.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::backends::xnnpack {
namespace {

using namespace detail;
namespace fbx = kiln::fb::xnnpack;
using rt::ErrorMessage;
using rt::EValue;
using rt::Status;
using NodeType = fbx::XNodeUnion;

Status fail(ErrorMessage* error, Status s, const char* what) {
  if (error) error->set("XnnpackBackend: %s", what);
  return s;
}
template <typename... A>
Status failf(ErrorMessage* error, Status s, const char* format, A... a) {
  if (error) {
    char buf[256];
    std::snprintf(buf, sizeof buf, format, a...);
    error->set("XnnpackBackend: %s", buf);
  }
  return s;
}

// Bits per element of a payload datatype; 0 for one kiln does not know.
uint32_t datatype_bits(fbx::XNNDatatype t) {
  using D = fbx::XNNDatatype;
  switch (t) {
    case D::xnn_datatype_fp32: case D::xnn_datatype_qint32: case D::xnn_datatype_qcint32: case D::xnn_datatype_int32:
    case D::xnn_datatype_pfp32:
      return 32;
    case D::xnn_datatype_fp16: case D::xnn_datatype_bf16: return 16;
    case D::xnn_datatype_qint8: case D::xnn_datatype_quint8: case D::xnn_datatype_qcint8: case D::xnn_datatype_qdint8:
    case D::xnn_datatype_qpint8:
      return 8;
    case D::xnn_datatype_qcint4: case D::xnn_datatype_qbint4: return 4;
    case D::xnn_datatype_invalid: break;
  }
  return 0;
}

uint64_t read_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// ---------------------------------------------------------------- building

const char* node_name(NodeType t) { return fbx::EnumNameXNodeUnion(t); }

// Nodes Debian's XNNPACK (2022) defines; the rest run on kiln's code.
bool library_has(NodeType t) {
  switch (t) {
    case NodeType::XNNAdd: case NodeType::XNNSubtract: case NodeType::XNNMultiply: case NodeType::XNNDiv:
    case NodeType::XNNMinimum: case NodeType::XNNMaximum: case NodeType::XNNFullyConnected:
    case NodeType::XNNSoftmax: case NodeType::XNNSigmoid: case NodeType::XNNClamp: case NodeType::XNNSquare:
    case NodeType::XNNSquareRoot: case NodeType::XNNNegate: case NodeType::XNNAbs: case NodeType::XNNFloor:
    case NodeType::XNNCeiling: case NodeType::XNNHardswish: case NodeType::XNNELU: case NodeType::XNNLeakyReLU:
    case NodeType::XNNStaticConstantPad:
    // convolutions, pooling and resizing: XNNPACK's operators for both engines
    case NodeType::XNNConv2d: case NodeType::XNNDepthwiseConv2d: case NodeType::XNNConvTranspose2d:
    case NodeType::XNNMaxPooling2d: case NodeType::XNNAvgPooling2d: case NodeType::XNNGlobalAvgPooling2d:
    case NodeType::XNNStaticResizeBilinear2D: case NodeType::XNNPReLU:
      return true;
    default:
      return false;
  }
}

// Convolution nodes: the input, filter and optional bias.
bool conv_node(NodeType t) {
  return t == NodeType::XNNConv2d || t == NodeType::XNNDepthwiseConv2d || t == NodeType::XNNConvTranspose2d;
}

struct NodeIO {
  std::array<uint32_t, 5> in{kInvalidId, kInvalidId, kInvalidId, kInvalidId, kInvalidId};
  size_t num_in = 0;
  uint32_t out = kInvalidId;
};

// The value ids a node reads and writes; false for node types this backend does not run.
bool node_io(const fbx::XNode& node, NodeIO& io) {
  auto in1 = [&](auto* n) { if (!n) return false; io.in[0] = n->input_id(); io.num_in = 1; io.out = n->output_id(); return true; };
  auto in2 = [&](auto* n) {
    if (!n) return false;
    io.in[0] = n->input1_id(); io.in[1] = n->input2_id(); io.num_in = 2; io.out = n->output_id();
    return true;
  };
  switch (node.xnode_union_type()) {
    case NodeType::XNNAdd: case NodeType::XNNSubtract: case NodeType::XNNMultiply: case NodeType::XNNDiv:
    case NodeType::XNNMinimum: case NodeType::XNNMaximum: case NodeType::XNNBatchMatrixMultiply:
    case NodeType::XNNPReLU:
      return in2(static_cast<const fbx::_XNNNode2x1*>(node.xnode_union()));
    case NodeType::XNNSoftmax: case NodeType::XNNSigmoid: case NodeType::XNNClamp: case NodeType::XNNSquare:
    case NodeType::XNNSquareRoot: case NodeType::XNNNegate: case NodeType::XNNAbs: case NodeType::XNNFloor:
    case NodeType::XNNCeiling: case NodeType::XNNHardswish: case NodeType::XNNReciprocalSquareRoot:
    case NodeType::XNNGelu: case NodeType::XNNTanh: case NodeType::XNNExp: case NodeType::XNNLog:
    case NodeType::XNNSin: case NodeType::XNNCos: case NodeType::XNNCopy: case NodeType::XNNConvert:
      return in1(static_cast<const fbx::_XNNNode1x1*>(node.xnode_union()));
    case NodeType::XNNELU: return in1(node.xnode_union_as_XNNELU());
    case NodeType::XNNLeakyReLU: return in1(node.xnode_union_as_XNNLeakyReLU());
    case NodeType::XNNStaticConstantPad: return in1(node.xnode_union_as_XNNStaticConstantPad());
    case NodeType::XNNGlobalAvgPooling2d: return in1(node.xnode_union_as_XNNGlobalAvgPooling2d());
    case NodeType::XNNMaxPooling2d: case NodeType::XNNAvgPooling2d:
      return in1(static_cast<const fbx::_XNNPooling2D*>(node.xnode_union()));
    case NodeType::XNNStaticResizeBilinear2D: return in1(node.xnode_union_as_XNNStaticResizeBilinear2D());
    case NodeType::XNNConv2d: case NodeType::XNNDepthwiseConv2d: case NodeType::XNNConvTranspose2d: {
      auto* n = static_cast<const fbx::_XNNNodeConv*>(node.xnode_union());
      if (!n) return false;
      io.in[0] = n->input1_id(); io.in[1] = n->filter_id(); io.in[2] = n->bias_id(); io.num_in = 3;
      io.out = n->output_id();
      return true;
    }
    case NodeType::XNNStaticReshape: return in1(node.xnode_union_as_XNNStaticReshape());
    case NodeType::XNNStaticTranspose: return in1(node.xnode_union_as_XNNStaticTranspose());
    case NodeType::XNNStaticSlice: return in1(node.xnode_union_as_XNNStaticSlice());
    case NodeType::XNNFullyConnected: {
      auto* n = node.xnode_union_as_XNNFullyConnected();
      if (!n) return false;
      io.in[0] = n->input1_id(); io.in[1] = n->filter_id(); io.in[2] = n->bias_id(); io.num_in = 3;
      io.out = n->output_id();
      return true;
    }
    case NodeType::XNNConcatenate2: case NodeType::XNNConcatenate3: case NodeType::XNNConcatenate4:
    case NodeType::XNNConcatenate5: {
      auto* n = static_cast<const fbx::_XNNCat*>(node.xnode_union());
      if (!n) return false;
      io.num_in = static_cast<size_t>(node.xnode_union_type()) - static_cast<size_t>(NodeType::XNNConcatenate2) + 2;
      if (node.xnode_union_type() == NodeType::XNNConcatenate5) io.num_in = 5;
      io.in = {n->input1_id(), n->input2_id(), n->input3_id(), n->input4_id(), n->input5_id()};
      io.out = n->output_id();
      return true;
    }
    default:
      return false;
  }
}

class Builder {
 public:
  // file: where named constants come from; null for payloads that carry their constants inline
  Builder(const rt::PteFile* file, ErrorMessage* error) : file_(file), error_(error) {}

  Status build(std::span<const std::byte> payload, State& st);
  // A plan of a dynamic delegate (State::dynamic): `root` is the plan at the payload's sizes, which
  // owns the weights every plan shares; `call`, if not empty, the call whose input sizes this plan
  // is for (else the payload's).
  void plan_for(State* root, std::span<EValue* const> call) {
    root_ = root;
    call_ = call;
    dynamic_ = true;
  }

 private:
  Status parse(std::span<const std::byte> payload, State& st);
  Status infer_dims(State& st);
  Status plan_storage(State& st);
  Status make_steps(State& st);
  Status subgraph_step(State& st, size_t begin, size_t end);
  Status kiln_step(State& st, size_t index);
  // The debug handles of nodes [begin, end) a step runs (not views, not chain members).
  void add_handles(Step& step, size_t begin, size_t end) const {
    for (size_t i = begin; i < end; ++i)
      if (!skip_[i] && chain_of_[i] < 0)
        step.debug_handles.push_back(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->debug_handle());
  }
  template <class ConstantAt>
  Status quant_params(const fbx::XNNQuantizedTensorValue& qv, uint32_t id, Value& val, const ConstantAt& constant_at);
  Status quantized_rows(State& st);
  Status check_value(const State& st, uint32_t id, size_t node, const char* role) const;
  // *out: `bytes` (fp32 weights of the file, streamed once per token) copied into weight_memory,
  // once per delegate (every plan reads the same copy), the file's pages released if `release`;
  // with KILN_HUGE_PAGES=0 the file's own bytes.
  Status in_weight_memory(State& st, std::span<const std::byte> bytes, bool release, const float** out) {
    return copy_to_weight_memory(root_ ? *root_ : st, file_, bytes, release, out, error_);
  }

  const rt::PteFile* file_;
  ErrorMessage* error_;
  const fbx::XNNGraph* graph_ = nullptr;
  std::vector<NodeIO> io_;
  std::vector<bool> skip_;                 // reshapes that are views
  std::vector<bool> only_packed_;          // per value: read only as fully-connected weights
  State* root_ = nullptr;                  // who owns repacked weights (State::qb4w_panels): st itself if null
  std::span<EValue* const> call_;          // dynamic: the call this plan is for
  bool dynamic_ = false;                   // the delegate's sizes change per call: one weight layout for all
  // fused row chains (Engine::Kiln)
  Status find_chains(State& st);
  bool add_row_op(const State& st, size_t node, int64_t rows, int64_t cols, Step& step,
                  std::vector<int32_t>& slot_of_group, std::vector<bool>& slot_scalar);
  struct Chain {
    size_t begin = 0, last = 0;  // first and last member node
    Step step;
  };
  std::vector<Chain> chains_;
  std::vector<int32_t> chain_of_;          // per node: its chain, or -1
  std::vector<bool> slot_only_;            // per group: lives only in a chain's row slots
};

Status Builder::check_value(const State& st, uint32_t id, size_t node, const char* role) const {
  if (id >= st.values.size() || !st.values[id].defined)
    return failf(error_, Status::InvalidProgram, "node %zu (%s): %s value %u is not defined", node,
                 node_name(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(node))->xnode_union_type()), role,
                 id);
  return Status::Ok;
}

Status Builder::parse(std::span<const std::byte> payload, State& st) {
  std::span<const std::byte> fb = payload, constants;
  if (payload.size() >= 8 && std::memcmp(payload.data() + 4, "XH00", 4) == 0) {
    if (payload.size() < 30) return fail(error_, Status::InvalidProgram, "payload header is truncated");
    uint64_t header_len = read_le(payload.data() + 8, 2), fb_off = read_le(payload.data() + 10, 4),
             fb_size = read_le(payload.data() + 14, 4), c_off = read_le(payload.data() + 18, 4),
             c_size = read_le(payload.data() + 22, 8);
    if (header_len < 30 || fb_off > payload.size() || fb_size > payload.size() - fb_off || c_off > payload.size() ||
        c_size > payload.size() - c_off)
      return failf(error_, Status::InvalidProgram,
                   "payload header points outside the payload (flatbuffer %llu+%llu, constants %llu+%llu, payload %zu)",
                   static_cast<unsigned long long>(fb_off), static_cast<unsigned long long>(fb_size),
                   static_cast<unsigned long long>(c_off), static_cast<unsigned long long>(c_size), payload.size());
    fb = payload.subspan(fb_off, fb_size);
    constants = payload.subspan(c_off, c_size);
  }
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(fb.data()), fb.size());
  if (!fbx::VerifyXNNGraphBuffer(verifier))
    return fail(error_, Status::InvalidProgram, "the payload's XNNGraph flatbuffer is malformed");
  graph_ = fbx::GetXNNGraph(fb.data());
  if (!graph_->xvalues() || !graph_->xnodes()) return fail(error_, Status::InvalidProgram, "graph has no values or nodes");

  // values
  auto tensor_of = [](const fbx::XValue* v) -> const fbx::XNNTensorValue* {
    if (const fbx::XNNTensorValue* t = v->xvalue_union_as_XNNTensorValue()) return t;
    if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) return q->tensor_value();
    return nullptr;
  };
  // constant data entry `ci` (named, or inside the payload)
  auto constant_at = [&](uint32_t ci, uint32_t id, std::span<const std::byte>* bytes) -> Status {
    const auto* cd = graph_->constant_data();
    if (!cd || ci >= cd->size()) return failf(error_, Status::InvalidProgram, "value %u: constant %u is out of range", id, ci);
    const fbx::ConstantDataOffset* c = cd->Get(ci);
    if (c->named_key()) {
      if (!file_)
        return failf(error_, Status::InvalidProgram, "value %u: a named constant, and no program to read it from", id);
      auto r = file_->named_data(c->named_key()->string_view(), error_);
      if (!r.ok()) return r.status();
      *bytes = r.value();
    } else {
      if (c->offset() > constants.size() || c->size() > constants.size() - c->offset())
        return failf(error_, Status::InvalidProgram, "value %u: constant bytes lie outside the payload", id);
      *bytes = constants.subspan(c->offset(), c->size());
    }
    return Status::Ok;
  };
  uint32_t max_id = 0;
  for (const fbx::XValue* v : *graph_->xvalues()) {
    const fbx::XNNTensorValue* t = tensor_of(v);
    if (!t) return fail(error_, Status::InvalidProgram, "a value has no tensor");
    max_id = std::max(max_id, t->id_out());
  }
  if (max_id >= (1u << 24)) return failf(error_, Status::InvalidProgram, "value id %u is out of range", max_id);
  st.values.assign(static_cast<size_t>(max_id) + 1, Value{});
  std::vector<std::pair<uint32_t, uint32_t>> ext_in, ext_out;  // (external_id, value id)
  for (const fbx::XValue* v : *graph_->xvalues()) {
    const fbx::XNNTensorValue* t = tensor_of(v);
    Value& val = st.values[t->id_out()];
    if (val.defined) return failf(error_, Status::InvalidProgram, "value %u is defined twice", t->id_out());
    val.elem_bits = datatype_bits(t->datatype());
    const auto* qv = v->xvalue_union_as_XNNQuantizedTensorValue();
    if (val.elem_bits == 0 || (!qv && t->datatype() != fbx::XNNDatatype::xnn_datatype_fp32))
      return failf(error_, Status::NotSupported, "value %u has datatype %s; kiln's XNNPACK backend runs fp32 (and "
                   "dynamically quantized int8 x int4/int8 fully connected) only",
                   t->id_out(), fbx::EnumNameXNNDatatype(t->datatype()));
    const auto* dims = t->dims();
    val.ndims = dims ? dims->size() : 0;
    if (val.ndims > kMaxRank) return failf(error_, Status::NotSupported, "value %u has rank %u (at most 6)", t->id_out(), val.ndims);
    val.numel = 1;
    for (uint32_t i = 0; i < val.ndims; ++i) {
      val.dims[i] = dims->Get(i);
      val.numel *= val.dims[i];
      if (val.numel > (int64_t{1} << 40)) return failf(error_, Status::InvalidProgram, "value %u is too large", t->id_out());
    }
    val.flags = t->flags();
    val.external_id = t->external_id();
    val.defined = true;
    if (val.flags & kExternalInput) ext_in.emplace_back(t->external_id(), t->id_out());
    if (val.flags & kExternalOutput) ext_out.emplace_back(t->external_id(), t->id_out());
    if (uint32_t ci = t->constant_buffer_idx(); ci != 0) {
      if (val.flags & (kExternalInput | kExternalOutput))
        return failf(error_, Status::InvalidProgram, "value %u is both constant and external", t->id_out());
      std::span<const std::byte> bytes;
      if (Status s = constant_at(ci, t->id_out(), &bytes); s != Status::Ok) return s;
      if (bytes.size() < val.bytes())
        return failf(error_, Status::InvalidProgram, "value %u: constant has %zu bytes, its shape needs %zu", t->id_out(),
                     bytes.size(), val.bytes());
      if (!qv && reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0)
        return failf(error_, Status::InvalidProgram, "value %u: constant data is misaligned", t->id_out());
      val.constant = bytes.data();
      val.constant_bytes = bytes.first(val.bytes());
    }
    if (qv)
      if (Status s = quant_params(*qv, t->id_out(), val, constant_at); s != Status::Ok) return s;
  }
  std::sort(ext_in.begin(), ext_in.end());
  std::sort(ext_out.begin(), ext_out.end());
  st.num_inputs = ext_in.size();
  for (auto& e : ext_in) st.arg_values.push_back(e.second);
  for (auto& e : ext_out) st.arg_values.push_back(e.second);
  for (uint32_t v : st.arg_values) st.arg_numel.push_back(st.values[v].numel);

  // nodes
  io_.resize(graph_->xnodes()->size());
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (!node_io(*node, io_[i]))
      return failf(error_, Status::NotSupported, "node %zu: %s is not supported by kiln's XNNPACK backend", i,
                   node_name(node->xnode_union_type()));
    for (size_t j = 0; j < io_[i].num_in; ++j) {
      if ((node->xnode_union_type() == NodeType::XNNFullyConnected || conv_node(node->xnode_union_type())) && j == 2 &&
          io_[i].in[j] == kInvalidId)
        continue;
      if (Status s = check_value(st, io_[i].in[j], i, "input"); s != Status::Ok) return s;
    }
    if (Status s = check_value(st, io_[i].out, i, "output"); s != Status::Ok) return s;
    if (st.values[io_[i].out].constant || (st.values[io_[i].out].flags & kExternalInput))
      return failf(error_, Status::InvalidProgram, "node %zu writes value %u, a constant or input", i, io_[i].out);
  }
  return quantized_rows(st);
}

// A plan for a call of a dynamic delegate whose inputs have other sizes than the payload's: every
// value's sizes from the call's inputs, node by node in the payload's order, as XNNPACK's reshape
// of a runtime derives them (a reshape's 0 entry is the one size it infers). A value keeps the
// payload's sizes when its node's inputs kept theirs; no value grows past the payload's elements
// (its upper bound).
Status Builder::infer_dims(State& st) {
  if (call_.size() < st.num_inputs)
    return fail(error_, Status::InvalidArgument, "the call passes fewer arguments than the graph has inputs");
  std::vector<int64_t> bound(st.values.size());
  std::vector<bool> changed(st.values.size(), false);
  for (size_t v = 0; v < st.values.size(); ++v) bound[v] = st.values[v].numel;
  auto set = [&](uint32_t id, std::span<const int64_t> d, size_t node) -> Status {
    Value& v = st.values[id];
    if (d.size() != v.ndims)
      return node == SIZE_MAX ? failf(error_, Status::InvalidArgument, "value %u: an input of rank %zu, the payload's is %u",
                                      id, d.size(), v.ndims)
                              : failf(error_, Status::InvalidArgument, "value %u: rank %zu for this call, the payload's "
                                      "is %u (node %zu)", id, d.size(), v.ndims, node);
    int64_t numel = 1;
    bool differs = false;
    for (size_t k = 0; k < d.size(); ++k) {
      if (d[k] < 0) return failf(error_, Status::InvalidArgument, "value %u: negative size", id);
      numel *= d[k];
      differs |= d[k] != v.dims[k];
      v.dims[k] = d[k];
    }
    if (numel > bound[id])
      return failf(error_, Status::InvalidArgument,
                   "value %u: %lld elements for this call, more than the %lld the payload plans (its upper bound)", id,
                   static_cast<long long>(numel), static_cast<long long>(bound[id]));
    v.numel = numel;
    changed[id] = changed[id] || differs;
    return Status::Ok;
  };
  for (size_t a = 0; a < st.num_inputs; ++a) {
    const EValue* e = call_[a];
    if (!e || !e->is_tensor())
      return failf(error_, Status::InvalidArgument, "argument %zu is not a tensor", a);
    const rt::Tensor& t = e->tensor();
    const int64_t one = 1;
    const bool scalar = t.dim == 0 && st.values[st.arg_values[a]].ndims == 1;  // XNNPACK's [1]
    if (Status s = set(st.arg_values[a], scalar ? std::span<const int64_t>(&one, 1) : t.shape(), SIZE_MAX); s != Status::Ok)
      return s;
  }
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    const NodeIO& io = io_[i];
    bool any = false;
    for (size_t j = 0; j < io.num_in; ++j) any |= io.in[j] != kInvalidId && changed[io.in[j]];
    if (!any) continue;  // the payload's sizes
    const Value& x = st.values[io.in[0]];
    const Value& y = st.values[io.out];
    std::array<int64_t, kMaxRank> d{};
    size_t n = y.ndims;
    auto unsupported = [&] {
      return failf(error_, Status::NotSupported, "node %zu (%s): kiln's XNNPACK backend cannot change its sizes per call",
                   i, node_name(node->xnode_union_type()));
    };
    auto bad = [&](const char* what) {
      return failf(error_, Status::InvalidArgument, "node %zu (%s): %s for this call's sizes", i,
                   node_name(node->xnode_union_type()), what);
    };
    switch (node->xnode_union_type()) {
      case NodeType::XNNAdd: case NodeType::XNNSubtract: case NodeType::XNNMultiply: case NodeType::XNNDiv:
      case NodeType::XNNMinimum: case NodeType::XNNMaximum: {  // numpy broadcasting, aligned on the last dim
        const Value& b = st.values[io.in[1]];
        if (n != std::max(x.ndims, b.ndims)) return unsupported();
        for (size_t k = 0; k < n; ++k) {
          const int64_t da = k + x.ndims >= n ? x.dims[k + x.ndims - n] : 1;
          const int64_t db = k + b.ndims >= n ? b.dims[k + b.ndims - n] : 1;
          if (da != db && da != 1 && db != 1) return bad("operand sizes do not broadcast");
          d[k] = da == 1 ? db : da;
        }
        break;
      }
      case NodeType::XNNSoftmax: case NodeType::XNNSigmoid: case NodeType::XNNClamp: case NodeType::XNNSquare:
      case NodeType::XNNSquareRoot: case NodeType::XNNNegate: case NodeType::XNNAbs: case NodeType::XNNFloor:
      case NodeType::XNNCeiling: case NodeType::XNNHardswish: case NodeType::XNNReciprocalSquareRoot:
      case NodeType::XNNGelu: case NodeType::XNNTanh: case NodeType::XNNExp: case NodeType::XNNLog:
      case NodeType::XNNSin: case NodeType::XNNCos: case NodeType::XNNCopy: case NodeType::XNNConvert:
      case NodeType::XNNELU: case NodeType::XNNLeakyReLU:
        if (n != x.ndims) return unsupported();
        std::copy_n(x.dims.begin(), n, d.begin());
        break;
      case NodeType::XNNFullyConnected: {
        const Value& w = st.values[io.in[1]];
        if (w.ndims != 2 || x.ndims < 1) return unsupported();
        const bool kn = (node->xnode_union_as_XNNFullyConnected()->flags() & 1u) != 0;
        const int64_t k = kn ? w.dims[0] : w.dims[1], nn = kn ? w.dims[1] : w.dims[0];
        if (x.dims[x.ndims - 1] != k) return bad("the input's last size is not the weights' input channels");
        if (n == x.ndims) {
          std::copy_n(x.dims.begin(), n, d.begin());
          d[n - 1] = nn;
        } else if (n == 2) {
          d[0] = x.numel / k;
          d[1] = nn;
        } else {
          return unsupported();
        }
        break;
      }
      case NodeType::XNNBatchMatrixMultiply: {
        const Value& b = st.values[io.in[1]];
        const bool tb = static_cast<const fbx::_XNNNode2x1*>(node->xnode_union())->flags() != 0;
        if (x.ndims < 2 || b.ndims < 2 || n != std::max(x.ndims, b.ndims)) return unsupported();
        const int64_t m = x.dims[x.ndims - 2], ka = x.dims[x.ndims - 1];
        const int64_t kb = tb ? b.dims[b.ndims - 1] : b.dims[b.ndims - 2], nn = tb ? b.dims[b.ndims - 2] : b.dims[b.ndims - 1];
        if (ka != kb) return bad("the operands' inner sizes differ");
        for (size_t k = 0; k + 2 < n; ++k) {
          const int64_t da = k + x.ndims >= n ? x.dims[k + x.ndims - n] : 1;
          const int64_t db = k + b.ndims >= n ? b.dims[k + b.ndims - n] : 1;
          if (da != db && da != 1 && db != 1) return bad("batch sizes do not broadcast");
          d[k] = da == 1 ? db : da;
        }
        d[n - 2] = m;
        d[n - 1] = nn;
        break;
      }
      case NodeType::XNNStaticTranspose: {
        const auto* p = node->xnode_union_as_XNNStaticTranspose();
        if (!p->perm() || p->perm()->size() != x.ndims || n != x.ndims) return unsupported();
        for (size_t k = 0; k < n; ++k) {
          const uint32_t pk = p->perm()->Get(static_cast<flatbuffers::uoffset_t>(k));
          if (pk >= x.ndims) return unsupported();
          d[k] = x.dims[pk];
        }
        break;
      }
      case NodeType::XNNStaticReshape: {
        const auto* p = node->xnode_union_as_XNNStaticReshape();
        if (!p->new_shape() || p->new_shape()->size() != n) return unsupported();
        int64_t known = 1;
        size_t inferred = SIZE_MAX;
        for (size_t k = 0; k < n; ++k) {
          d[k] = p->new_shape()->Get(static_cast<flatbuffers::uoffset_t>(k));
          if (d[k] != 0) { known *= d[k]; continue; }
          if (inferred != SIZE_MAX) return unsupported();  // XNNPACK infers one size at most
          inferred = k;
        }
        if (inferred != SIZE_MAX) {
          if (known == 0 || x.numel % known != 0) return bad("the input's elements do not fill the new shape");
          d[inferred] = x.numel / known;
        } else if (known != x.numel) {
          return unsupported();  // a fixed shape over an input whose size changed
        }
        break;
      }
      case NodeType::XNNStaticSlice: {
        const auto* p = node->xnode_union_as_XNNStaticSlice();
        if (!p->offsets() || !p->sizes() || p->offsets()->size() != x.ndims || p->sizes()->size() != x.ndims ||
            n != x.ndims)
          return unsupported();
        for (size_t k = 0; k < n; ++k) {
          const int64_t off = p->offsets()->Get(static_cast<flatbuffers::uoffset_t>(k));
          const int64_t size = p->sizes()->Get(static_cast<flatbuffers::uoffset_t>(k));
          d[k] = size == 0 ? x.dims[k] - off : size;  // 0: to the end
          if (off < 0 || d[k] < 0 || off + d[k] > x.dims[k]) return bad("the slice lies outside the input");
        }
        break;
      }
      case NodeType::XNNConcatenate2: case NodeType::XNNConcatenate3: case NodeType::XNNConcatenate4:
      case NodeType::XNNConcatenate5: {
        const uint32_t axis = static_cast<const fbx::_XNNCat*>(node->xnode_union())->axis();
        if (axis >= n || x.ndims != n) return unsupported();
        std::copy_n(x.dims.begin(), n, d.begin());
        d[axis] = 0;
        for (size_t j = 0; j < io.num_in; ++j) {
          const Value& e = st.values[io.in[j]];
          if (e.ndims != n) return unsupported();
          for (size_t k = 0; k < n; ++k)
            if (k != axis && e.dims[k] != x.dims[k]) return bad("the inputs' sizes differ off the axis");
          d[axis] += e.dims[axis];
        }
        break;
      }
      case NodeType::XNNStaticConstantPad: {
        const auto* p = node->xnode_union_as_XNNStaticConstantPad();
        if (!p->pre_paddings() || !p->post_paddings() || p->pre_paddings()->size() != x.ndims ||
            p->post_paddings()->size() != x.ndims || n != x.ndims)
          return unsupported();
        for (size_t k = 0; k < n; ++k)
          d[k] = x.dims[k] + p->pre_paddings()->Get(static_cast<flatbuffers::uoffset_t>(k)) +
                 p->post_paddings()->Get(static_cast<flatbuffers::uoffset_t>(k));
        break;
      }
      default:
        return unsupported();
    }
    if (Status s = set(io.out, std::span<const int64_t>(d.data(), n), i); s != Status::Ok) return s;
  }
  for (size_t a = 0; a < st.arg_values.size(); ++a) st.arg_numel[a] = st.values[st.arg_values[a]].numel;
  return Status::Ok;
}

// A quantized value's parameters (ExecuTorch's forms for 8da4w / 8da8w).
template <class ConstantAt>
Status Builder::quant_params(const fbx::XNNQuantizedTensorValue& qv, uint32_t id, Value& val, const ConstantAt& constant_at) {
  const fbx::XNNTensorValue& t = *qv.tensor_value();
  const auto dt = t.datatype();
  using D = fbx::XNNDatatype;
  using Q = fbx::XNNQuantParams;
  auto unsupported = [&] {
    return failf(error_, Status::NotSupported, "value %u: %s with %s quantization is not supported by kiln's XNNPACK backend",
                 id, fbx::EnumNameXNNDatatype(dt), fbx::EnumNameXNNQuantParams(qv.quant_params_type()));
  };
  if (dt == D::xnn_datatype_qdint8 && qv.quant_params_type() == Q::PerTokenDynamicQuant) {
    if (val.constant || (val.flags & (kExternalInput | kExternalOutput))) return unsupported();
    if (qv.quant_params_as_PerTokenDynamicQuant()->num_nonbatch_dims() != 1 || val.ndims < 1) return unsupported();
    val.quant = Value::Quant::DynamicRows;
    return Status::Ok;
  }
  if (!val.constant || val.ndims != 2) return unsupported();  // quantized weights: constant [N, K]
  const int64_t n = val.dims[0], k = val.dims[1];
  std::span<const std::byte> sb;
  if (dt == D::xnn_datatype_qbint4 && qv.quant_params_type() == Q::PerChannelGroupQuant) {
    const auto* p = qv.quant_params_as_PerChannelGroupQuant();
    const int64_t g = p->group_size();
    if (p->channel_dim() != 0 || g <= 0 || g % 32 != 0 || k % g != 0 || k % 2 != 0)
      return failf(error_, Status::NotSupported, "value %u: int4 groups of %lld over %lld inputs (kiln needs multiples of 32 "
                   "that divide an even input count)", id, static_cast<long long>(g), static_cast<long long>(k));
    const size_t count = static_cast<size_t>(n * (k / g));
    if (p->scale_buffer_idx() != 0) {
      if (Status s = constant_at(p->scale_buffer_idx(), id, &sb); s != Status::Ok) return s;
      if (sb.size() < count * 2 || (p->num_scales() != 0 && p->num_scales() != count))
        return failf(error_, Status::InvalidProgram, "value %u: %zu bytes of bf16 scales for %zu groups", id, sb.size(), count);
      val.group_scales = reinterpret_cast<const uint16_t*>(sb.data());
    } else {  // (the deprecated inline bf16 scales: ExecuTorch 1.5 no longer writes them)
      return failf(error_, Status::NotSupported, "value %u: int4 group scales not given as bf16 data", id);
    }
    if (reinterpret_cast<uintptr_t>(val.group_scales) % alignof(uint16_t) != 0)
      return failf(error_, Status::InvalidProgram, "value %u: scales are misaligned", id);
    val.quant = Value::Quant::Int4Groups;
    val.group_size = g;
    return Status::Ok;
  }
  if (dt == D::xnn_datatype_qcint8 && qv.quant_params_type() == Q::PerChannelQuant) {
    const auto* p = qv.quant_params_as_PerChannelQuant();
    if (p->channel_dim() != 0) return unsupported();
    if (p->scale_buffer_idx() != 0) {
      if (Status s = constant_at(p->scale_buffer_idx(), id, &sb); s != Status::Ok) return s;
      if (sb.size() < static_cast<size_t>(n) * 4)
        return failf(error_, Status::InvalidProgram, "value %u: %zu bytes of scales for %lld channels", id, sb.size(),
                     static_cast<long long>(n));
      val.channel_scales = reinterpret_cast<const float*>(sb.data());
    } else if (p->scale() && p->scale()->size() == static_cast<size_t>(n)) {
      val.channel_scales = p->scale()->data();
    } else {
      return failf(error_, Status::InvalidProgram, "value %u: no per-channel scales", id);
    }
    if (reinterpret_cast<uintptr_t>(val.channel_scales) % alignof(float) != 0)
      return failf(error_, Status::InvalidProgram, "value %u: scales are misaligned", id);
    val.quant = Value::Quant::Int8Channels;
    return Status::Ok;
  }
  return unsupported();
}

// Rows quantized at run time are read by fully connected nodes with quantized
// weights only, all of one kind (the rows' layout follows the weights'); their
// bytes are a cpu::Qd8Rows block.
Status Builder::quantized_rows(State& st) {
  for (size_t i = 0; i < io_.size(); ++i) {
    const NodeType t = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type();
    for (size_t j = 0; j < io_[i].num_in; ++j) {
      if (io_[i].in[j] == kInvalidId) continue;
      Value& v = st.values[io_[i].in[j]];
      if (v.quant != Value::Quant::DynamicRows) continue;
      const Value& w = st.values[io_[i].in[1]];
      const bool fc = t == NodeType::XNNFullyConnected && j == 0 &&
                      (w.quant == Value::Quant::Int4Groups || w.quant == Value::Quant::Int8Channels);
      if (!fc)
        return failf(error_, Status::NotSupported, "node %zu (%s): reads dynamically quantized rows; kiln runs those only "
                     "in fully connected nodes with int4 or int8 weights", i, node_name(t));
      // int4 weights go to kiln's panels where the CPU's variant has a product on them (read from Signed rows)
      const cpu::Qd8Layout int4_rows = cpu::qd8_gemm_config().qb4w_panels ? cpu::Qd8Layout::Signed : cpu::Qd8Layout::Nibbles;
      const uint8_t layout = static_cast<uint8_t>(w.quant == Value::Quant::Int4Groups ? int4_rows : cpu::Qd8Layout::Plain);
      if (v.min_bytes != 0 && v.rows_layout != layout)
        return failf(error_, Status::NotSupported, "value %u: quantized rows read by int4 and int8 weights alike", io_[i].in[j]);
      const int64_t k = v.dims[v.ndims - 1];
      if (k <= 0) return failf(error_, Status::InvalidProgram, "value %u: empty rows", io_[i].in[j]);
      v.rows_layout = layout;
      v.min_bytes = cpu::qd8_rows_bytes(v.numel / k, k, static_cast<cpu::Qd8Layout>(layout));
    }
  }
  for (size_t i = 0; i < io_.size(); ++i) {  // and are written by a convert from fp32
    const Value& out = st.values[io_[i].out];
    if (out.quant != Value::Quant::DynamicRows) continue;
    const NodeType t = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type();
    if (t != NodeType::XNNConvert || st.values[io_[i].in[0]].quant != Value::Quant::None)
      return failf(error_, Status::NotSupported, "node %zu (%s) writes dynamically quantized rows; kiln expects a convert "
                   "from fp32", i, node_name(t));
    if (out.min_bytes == 0) return failf(error_, Status::NotSupported, "node %zu: quantized rows nobody reads", i);
  }
  return Status::Ok;
}

// dst [cols, rows] = src [rows, cols]ᵀ, in tiles that stay in cache (weights at load time:
// hundreds of MB, where the plain loop's strided writes take seconds).
static void transpose_blocked(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
}

// Groups (reshape views), where each group lives, and the arena plan by lifetime.
// The plan's activations (zeroed), if not made yet, and the subgraphs whose values all live in the
// arena or constants set up on it (once: those that bind the call's arguments are set up per call).
Status ensure_arena(State& st, ErrorMessage* error) {
  if (st.arena != nullptr || st.arena_bytes == 0) return Status::Ok;
  st.arena = static_cast<std::byte*>(std::aligned_alloc(kArenaAlign, st.arena_bytes));
  if (!st.arena) return failf(error, Status::OutOfMemory, "cannot allocate %zu bytes of activations", st.arena_bytes);
  std::memset(st.arena, 0, st.arena_bytes);
  return Status::Ok;
}

Status setup_subgraphs(State& st, ErrorMessage* error) {
  for (Step& step : st.steps) {
    if (step.kind != StepKind::Subgraph) continue;
    for (size_t e = 0; e < step.externals.size(); ++e) {
      const Storage& sto = st.groups[static_cast<size_t>(step.external_groups[e])].storage;
      if (sto.kind == Storage::Kind::Arena) step.externals[e].data = st.arena + sto.offset;
    }
    if (!step.binds_args &&
        xnn_setup_runtime(step.runtime, step.externals.size(), step.externals.data()) != xnn_status_success)
      return fail(error, Status::Internal, "xnn_setup_runtime failed");
  }
  return Status::Ok;
}

Status Builder::plan_storage(State& st) {
  const size_t nv = st.values.size();
  std::vector<int32_t> parent(nv);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int32_t v) {
    while (parent[static_cast<size_t>(v)] != v) v = parent[static_cast<size_t>(v)] = parent[static_cast<size_t>(parent[static_cast<size_t>(v)])];
    return v;
  };
  // a root's fixed storage: an argument or a constant (at most one per group)
  auto fixed = [&](uint32_t v) { return st.values[v].constant != nullptr || (st.values[v].flags & (kExternalInput | kExternalOutput)); };
  std::vector<bool> root_fixed(nv);
  for (size_t v = 0; v < nv; ++v) root_fixed[v] = st.values[v].defined && fixed(static_cast<uint32_t>(v));
  skip_.assign(io_.size(), false);
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (node->xnode_union_type() != NodeType::XNNStaticReshape) continue;
    const Value &in = st.values[io_[i].in[0]], &out = st.values[io_[i].out];
    if (in.numel != out.numel)
      return failf(error_, Status::InvalidProgram, "node %zu: reshape from %lld to %lld elements", i,
                   static_cast<long long>(in.numel), static_cast<long long>(out.numel));
    int32_t a = find(static_cast<int32_t>(io_[i].in[0])), b = find(static_cast<int32_t>(io_[i].out));
    if (a == b) { skip_[i] = true; continue; }
    if (root_fixed[static_cast<size_t>(a)] && root_fixed[static_cast<size_t>(b)]) continue;  // two fixed homes: a copy step
    if (root_fixed[static_cast<size_t>(b)]) std::swap(a, b);
    parent[static_cast<size_t>(b)] = a;
    skip_[i] = true;
  }
  // groups
  std::vector<int32_t> group_of_root(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    if (!st.values[v].defined) continue;
    int32_t r = find(static_cast<int32_t>(v));
    if (group_of_root[static_cast<size_t>(r)] < 0) {
      group_of_root[static_cast<size_t>(r)] = static_cast<int32_t>(st.groups.size());
      st.groups.emplace_back();
    }
    st.values[v].group = group_of_root[static_cast<size_t>(r)];
    Group& grp = st.groups[static_cast<size_t>(st.values[v].group)];
    grp.bytes = std::max(grp.bytes, st.values[v].bytes());
    if (st.values[v].constant) {
      grp.storage.kind = Storage::Kind::Static;
      grp.storage.data = st.values[v].constant;
    }
  }
  for (size_t a = 0; a < st.arg_values.size(); ++a) {
    Group& grp = st.groups[static_cast<size_t>(st.values[st.arg_values[a]].group)];
    grp.storage.kind = Storage::Kind::Arg;
    grp.storage.arg = static_cast<uint32_t>(a);
  }
  if (Status s = find_chains(st); s != Status::Ok) return s;
  // A transpose of the last two dims whose one reader is a bmm with a few rows (B) is folded
  // into it by make_steps (C = A · Bᵀ): the transpose's input lives until that bmm.
  std::vector<int64_t> input_live_until(io_.size(), -1);
  std::vector<int32_t> readers(nv, 0), reader(nv, -1);
  for (size_t i = 0; i < io_.size(); ++i)
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (uint32_t v = io_[i].in[j]; v != kInvalidId) ++readers[v], reader[v] = static_cast<int32_t>(i);
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (node->xnode_union_type() != NodeType::XNNStaticTranspose || io_[i].num_in < 1) continue;
    const uint32_t v = io_[i].out;
    const auto* perm = node->xnode_union_as_XNNStaticTranspose()->perm();
    if (readers[v] != 1 || (st.values[v].flags & kExternalOutput) || !perm || perm->size() < 2) continue;
    const uint32_t r = perm->size();
    bool last_two = perm->Get(r - 1) == r - 2 && perm->Get(r - 2) == r - 1;
    for (uint32_t d = 0; d + 2 < r; ++d) last_two &= perm->Get(d) == d;
    auto j = static_cast<size_t>(reader[v]);
    uint32_t b = v;  // through reshapes that are views (the bmm's batch dims flattened)
    while (skip_[j] && readers[io_[j].out] == 1 && !(st.values[io_[j].out].flags & kExternalOutput)) {
      b = io_[j].out;
      j = static_cast<size_t>(reader[b]);
    }
    const fbx::XNode* mm = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(j));
    if (!last_two || mm->xnode_union_type() != NodeType::XNNBatchMatrixMultiply || io_[j].in[1] != b ||
        io_[j].in[0] == b || io_[j].in[0] == kInvalidId)
      continue;
    const Value& a = st.values[io_[j].in[0]];
    if (a.ndims >= 2 && a.dims[a.ndims - 2] < kGemvRows) input_live_until[i] = static_cast<int64_t>(j);
  }
  // lifetimes over node positions; a fused chain runs its nodes row by row, so
  // everything it reads or writes is live from its first node to its last
  for (size_t i = 0; i < io_.size(); ++i) {
    if (skip_[i]) continue;
    auto def = static_cast<int64_t>(i), use = def;
    if (chain_of_[i] >= 0) {
      def = static_cast<int64_t>(chains_[static_cast<size_t>(chain_of_[i])].begin);
      use = static_cast<int64_t>(chains_[static_cast<size_t>(chain_of_[i])].last);
    }
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (io_[i].in[j] != kInvalidId) {
        Group& grp = st.groups[static_cast<size_t>(st.values[io_[i].in[j]].group)];
        grp.last_use = std::max({grp.last_use, use, input_live_until[i]});
      }
    Group& grp = st.groups[static_cast<size_t>(st.values[io_[i].out].group)];
    grp.first_def = std::min(grp.first_def, def);
    grp.last_use = std::max(grp.last_use, use);
  }
  // arena: first fit by lifetime, in order of definition
  std::vector<size_t> order;
  for (size_t gi = 0; gi < st.groups.size(); ++gi)
    if (st.groups[gi].storage.kind == Storage::Kind::None && st.groups[gi].last_use >= 0 && !slot_only_[gi])
      order.push_back(gi);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return st.groups[a].first_def < st.groups[b].first_def; });
  struct Live { size_t offset, size; int64_t end; };
  std::vector<Live> live;
  size_t top = 0;
  for (size_t gi : order) {
    Group& grp = st.groups[gi];
    if (grp.first_def == INT64_MAX)
      return failf(error_, Status::InvalidProgram, "a value is read but never written (group %zu)", gi);
    std::erase_if(live, [&](const Live& l) { return l.end < grp.first_def; });
    std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.offset < b.offset; });
    size_t need = (grp.bytes + XNN_EXTRA_BYTES + kArenaAlign - 1) / kArenaAlign * kArenaAlign, at = 0;
    for (const Live& l : live) {
      if (l.offset >= at + need) break;
      at = std::max(at, l.offset + l.size);
    }
    grp.storage.kind = Storage::Kind::Arena;
    grp.storage.offset = at;
    live.push_back({at, need, grp.last_use});
    top = std::max(top, at + need);
  }
  st.arena_bytes = top;
  // A dynamic delegate's first plan is at its upper bounds, which calls may never reach: its arena
  // is made when a call first runs it (ensure_arena), not held from load.
  if (dynamic_ && call_.empty()) return Status::Ok;
  return ensure_arena(st, error_);
}


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
    }
    x.scalar = scalar;
    return true;
  };
  switch (t) {
    case NodeType::XNNAdd: op.kind = RowOpKind::Add; break;
    case NodeType::XNNSubtract: op.kind = RowOpKind::Sub; break;
    case NodeType::XNNMultiply: op.kind = RowOpKind::Mul; break;
    case NodeType::XNNDiv: op.kind = RowOpKind::Div; break;
    case NodeType::XNNMaximum: op.kind = RowOpKind::Max; break;
    case NodeType::XNNMinimum: op.kind = RowOpKind::Min; break;
    case NodeType::XNNSquare: op.kind = RowOpKind::Square; break;
    case NodeType::XNNSquareRoot: op.kind = RowOpKind::Sqrt; break;
    case NodeType::XNNReciprocalSquareRoot: op.kind = RowOpKind::Rsqrt; break;
    case NodeType::XNNNegate: op.kind = RowOpKind::Neg; break;
    case NodeType::XNNAbs: op.kind = RowOpKind::Abs; break;
    case NodeType::XNNSigmoid: op.kind = RowOpKind::Sigmoid; break;
    case NodeType::XNNTanh: op.kind = RowOpKind::Tanh; break;
    case NodeType::XNNExp: op.kind = RowOpKind::Exp; break;
    case NodeType::XNNGelu: op.kind = RowOpKind::Gelu; break;
    case NodeType::XNNCopy: case NodeType::XNNClamp: op.kind = RowOpKind::Copy; break;
    case NodeType::XNNSoftmax: op.kind = RowOpKind::Softmax; break;
    case NodeType::XNNFullyConnected: op.kind = RowOpKind::RowDot; break;
    default: return false;
  }
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
    // step layout: memory table, per-task scratch for the slots that stay in it
    Step& step = c.step;
    step.rows = rows;
    step.cols = cols;
    step.slots = static_cast<int64_t>(slot_scalar.size());
    step.tasks = st.exec.threads > 1 ? elementwise_pieces(rows, kTasksPerThread * st.exec.threads, rows * cols) : 1;
    for (int32_t grp : mem) step.in.push_back(Operand{grp});
    for (size_t k = 0; k < slot_scalar.size(); ++k) {
      step.slot_offset.push_back(step.scratch_per_task);
      step.scratch_per_task += slot_scalar[k] ? 16 : (cols + 15) / 16 * 16;
    }
    step.scratch.assign(static_cast<size_t>(step.tasks * step.scratch_per_task), 0.0f);
    step.slot_ptr.assign(static_cast<size_t>(step.tasks * step.slots) + mem.size(), nullptr);
    step.label = "kiln fused rows:";
    for (const RowOp& op : step.row_ops) {
      static const char* const names[] = {"add", "sub", "mul", "div", "max", "min", "square", "sqrt", "rsqrt", "neg",
                                          "abs", "sigmoid", "tanh", "exp", "gelu", "copy", "softmax", "dot"};
      step.label += " ";
      step.label += names[static_cast<size_t>(op.kind)];
    }
    const auto index = static_cast<int32_t>(chains_.size());
    for (size_t j = i; j <= last; ++j) chain_of_[j] = index;
    chains_.push_back(std::move(c));
    i = last;
  }
  return Status::Ok;
}

// One XNNPACK subgraph for nodes [begin, end) (library nodes and view reshapes).
Status Builder::subgraph_step(State& st, size_t begin, size_t end) {
  Step step;
  step.kind = StepKind::Subgraph;
  std::vector<int32_t> local(st.values.size(), -1);  // value id -> subgraph value id
  std::vector<std::pair<uint32_t, int32_t>> externals;  // (value, group)
  // externals first: every non-constant value the nodes touch
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i]) continue;
    for (size_t j = 0; j <= io_[i].num_in; ++j) {
      uint32_t v = j < io_[i].num_in ? io_[i].in[j] : io_[i].out;
      if (v == kInvalidId || st.values[v].constant) continue;
      if (local[v] == -1) {
        local[v] = -2;
        externals.emplace_back(v, st.values[v].group);
      }
    }
  }
  xnn_subgraph_t sg = nullptr;
  if (xnn_create_subgraph(static_cast<uint32_t>(externals.size()), 0, &sg) != xnn_status_success)
    return fail(error_, Status::Internal, "xnn_create_subgraph failed");
  std::unique_ptr<xnn_subgraph, decltype(&xnn_delete_subgraph)> owner(sg, xnn_delete_subgraph);
  auto define = [&](uint32_t v, uint32_t ext, uint32_t flags, const void* data) -> Status {
    const Value& val = st.values[v];
    std::array<size_t, kMaxRank> d{};
    for (uint32_t i = 0; i < val.ndims; ++i) d[i] = static_cast<size_t>(val.dims[i]);
    uint32_t id = 0;
    if (xnn_define_tensor_value(sg, xnn_datatype_fp32, val.ndims, d.data(), data, ext, flags, &id) != xnn_status_success)
      return failf(error_, Status::Internal, "XNNPACK rejected value %u", v);
    local[v] = static_cast<int32_t>(id);
    return Status::Ok;
  };
  for (size_t e = 0; e < externals.size(); ++e) {
    if (Status s = define(externals[e].first, static_cast<uint32_t>(e), kExternalInput | kExternalOutput, nullptr);
        s != Status::Ok)
      return s;
    step.external_groups.push_back(externals[e].second);
    step.externals.push_back({static_cast<uint32_t>(local[externals[e].first]), nullptr});
    if (st.groups[static_cast<size_t>(externals[e].second)].storage.kind == Storage::Kind::Arg) step.binds_args = true;
  }
  auto id_of = [&](uint32_t v) -> uint32_t {
    if (v == kInvalidId) return XNN_INVALID_VALUE_ID;
    if (local[v] < 0) {  // a constant, defined on first use
      if (define(v, XNN_INVALID_VALUE_ID, 0, st.values[v].constant) != Status::Ok) return XNN_INVALID_VALUE_ID - 1;
    }
    return static_cast<uint32_t>(local[v]);
  };
  size_t count = 0, fcs = 0;
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i]) continue;
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    float lo = -INFINITY, hi = INFINITY;
    if (const auto* mm = node->output_min_max()) { lo = mm->output_min(); hi = mm->output_max(); }
    const NodeIO& io = io_[i];
    uint32_t a = id_of(io.in[0]), b = io.num_in > 1 ? id_of(io.in[1]) : XNN_INVALID_VALUE_ID, o = id_of(io.out);
    xnn_status s = xnn_status_success;
    switch (node->xnode_union_type()) {
      case NodeType::XNNAdd: s = xnn_define_add2(sg, lo, hi, a, b, o, 0); break;
      case NodeType::XNNSubtract: s = xnn_define_subtract(sg, lo, hi, a, b, o, 0); break;
      case NodeType::XNNMultiply: s = xnn_define_multiply2(sg, lo, hi, a, b, o, 0); break;
      case NodeType::XNNDiv: s = xnn_define_divide(sg, lo, hi, a, b, o, 0); break;
      case NodeType::XNNMinimum: s = xnn_define_minimum2(sg, a, b, o, 0); break;
      case NodeType::XNNMaximum: s = xnn_define_maximum2(sg, a, b, o, 0); break;
      case NodeType::XNNFullyConnected: {
        uint32_t bias = io.in[2] == kInvalidId ? XNN_INVALID_VALUE_ID : id_of(io.in[2]);
        s = xnn_define_fully_connected(sg, lo, hi, a, b, bias, o, node->xnode_union_as_XNNFullyConnected()->flags());
        ++fcs;
        break;
      }
      case NodeType::XNNSoftmax: s = xnn_define_softmax(sg, a, o, 0); break;
      case NodeType::XNNSigmoid: s = xnn_define_sigmoid(sg, a, o, 0); break;
      case NodeType::XNNClamp: s = xnn_define_clamp(sg, lo, hi, a, o, 0); break;
      case NodeType::XNNSquare: s = xnn_define_square(sg, a, o, 0); break;
      case NodeType::XNNSquareRoot: s = xnn_define_square_root(sg, a, o, 0); break;
      case NodeType::XNNNegate: s = xnn_define_negate(sg, a, o, 0); break;
      case NodeType::XNNAbs: s = xnn_define_abs(sg, a, o, 0); break;
      case NodeType::XNNFloor: s = xnn_define_floor(sg, a, o, 0); break;
      case NodeType::XNNCeiling: s = xnn_define_ceiling(sg, a, o, 0); break;
      case NodeType::XNNHardswish: s = xnn_define_hardswish(sg, a, o, 0); break;
      case NodeType::XNNELU: s = xnn_define_elu(sg, node->xnode_union_as_XNNELU()->alpha(), a, o, 0); break;
      case NodeType::XNNLeakyReLU:
        s = xnn_define_leaky_relu(sg, node->xnode_union_as_XNNLeakyReLU()->negative_slope(), a, o, 0);
        break;
      case NodeType::XNNStaticConstantPad: {
        const auto* p = node->xnode_union_as_XNNStaticConstantPad();
        const Value& in = st.values[io.in[0]];
        std::array<size_t, kMaxRank> pre{}, post{};
        if (!p->pre_paddings() || !p->post_paddings() || p->pre_paddings()->size() != in.ndims ||
            p->post_paddings()->size() != in.ndims)
          return failf(error_, Status::InvalidProgram, "node %zu: padding does not match the input's rank", i);
        for (uint32_t d = 0; d < in.ndims; ++d) { pre[d] = p->pre_paddings()->Get(d); post[d] = p->post_paddings()->Get(d); }
        s = xnn_define_static_constant_pad(sg, pre.data(), post.data(), p->padding_value(), a, o, 0);
        break;
      }
      case NodeType::XNNConv2d: case NodeType::XNNDepthwiseConv2d: case NodeType::XNNConvTranspose2d: {
        const auto* c = static_cast<const fbx::_XNNNodeConv*>(node->xnode_union());
        if (!st.values[io.in[1]].constant || (io.in[2] != kInvalidId && !st.values[io.in[2]].constant))
          return failf(error_, Status::NotSupported, "node %zu: convolution with non-constant weights", i);
        uint32_t bias = io.in[2] == kInvalidId ? XNN_INVALID_VALUE_ID : id_of(io.in[2]);
        const NodeType ct = node->xnode_union_type();
        if (ct == NodeType::XNNConv2d)
          s = xnn_define_convolution_2d(sg, c->padding_top(), c->padding_right(), c->padding_bottom(), c->padding_left(),
                                        c->kernel_height(), c->kernel_width(), c->subsampling_height(),
                                        c->subsampling_width(), c->dilation_height(), c->dilation_width(), c->groups(),
                                        c->group_input_channels(), c->group_output_channels(), lo, hi, a, b, bias, o,
                                        c->flags());
        else if (ct == NodeType::XNNDepthwiseConv2d)
          s = xnn_define_depthwise_convolution_2d(
              sg, c->padding_top(), c->padding_right(), c->padding_bottom(), c->padding_left(), c->kernel_height(),
              c->kernel_width(), c->subsampling_height(), c->subsampling_width(), c->dilation_height(),
              c->dilation_width(), c->group_output_channels() / std::max<uint32_t>(1, c->group_input_channels()),
              c->groups() * c->group_input_channels(), lo, hi, a, b, bias, o, c->flags());
        else
          s = xnn_define_deconvolution_2d(sg, c->padding_top(), c->padding_right(), c->padding_bottom(),
                                          c->padding_left(), c->adjustment_height(), c->adjustment_width(),
                                          c->kernel_height(), c->kernel_width(), c->subsampling_height(),
                                          c->subsampling_width(), c->dilation_height(), c->dilation_width(), c->groups(),
                                          c->group_input_channels(), c->group_output_channels(), lo, hi, a, b, bias, o,
                                          c->flags());
        break;
      }
      case NodeType::XNNMaxPooling2d: case NodeType::XNNAvgPooling2d: {
        const auto* p = static_cast<const fbx::_XNNPooling2D*>(node->xnode_union());
        if (node->xnode_union_type() == NodeType::XNNMaxPooling2d)
          s = xnn_define_max_pooling_2d(sg, p->padding_top(), p->padding_right(), p->padding_bottom(), p->padding_left(),
                                        p->pooling_height(), p->pooling_width(), p->stride_height(), p->stride_width(),
                                        std::max<uint32_t>(1, p->dilation_height()),
                                        std::max<uint32_t>(1, p->dilation_width()), lo, hi, a, o, p->flags());
        else
          s = xnn_define_average_pooling_2d(sg, p->padding_top(), p->padding_right(), p->padding_bottom(),
                                            p->padding_left(), p->pooling_height(), p->pooling_width(),
                                            p->stride_height(), p->stride_width(), lo, hi, a, o, p->flags());
        break;
      }
      case NodeType::XNNPReLU:
        if (!st.values[io.in[1]].constant)
          return failf(error_, Status::NotSupported, "node %zu: PReLU with a non-constant slope", i);
        s = xnn_define_prelu(sg, a, b, o, 0);
        break;
      case NodeType::XNNGlobalAvgPooling2d:
        s = xnn_define_global_average_pooling_2d(sg, lo, hi, a, o,
                                                 node->xnode_union_as_XNNGlobalAvgPooling2d()->flags());
        break;
      case NodeType::XNNStaticResizeBilinear2D: {
        const auto* r = node->xnode_union_as_XNNStaticResizeBilinear2D();
        s = xnn_define_static_resize_bilinear_2d(sg, r->new_height(), r->new_width(), a, o, r->flags());
        break;
      }
      default:
        return failf(error_, Status::Internal, "node %zu: %s is not a library node", i, node_name(node->xnode_union_type()));
    }
    if (s != xnn_status_success)
      return failf(error_, Status::InvalidProgram, "node %zu: XNNPACK rejected %s (status %d)", i,
                   node_name(node->xnode_union_type()), static_cast<int>(s));
    ++count;
  }
  if (count == 0) return Status::Ok;
  // XNNPACK's runtimes run on a pthreadpool, whose workers spin for a while
  // after each run. With the kiln engine only the heavy nodes (convolutions,
  // pooling, resizing) get it: a small subgraph between kiln's steps would
  // keep a second spinning thread on the core kiln's own pool needs.
  bool heavy = st.engine == Engine::Xnnpack;
  for (size_t i = begin; i < end && !heavy; ++i) {
    switch (graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type()) {
      case NodeType::XNNConv2d: case NodeType::XNNDepthwiseConv2d: case NodeType::XNNConvTranspose2d:
      case NodeType::XNNMaxPooling2d: case NodeType::XNNAvgPooling2d: case NodeType::XNNGlobalAvgPooling2d:
      case NodeType::XNNStaticResizeBilinear2D:
        heavy = true;
        break;
      default: break;
    }
  }
  if (xnn_create_runtime_v2(sg, heavy ? st.exec.raw_pool() : nullptr, 0, &step.runtime) != xnn_status_success)
    return failf(error_, Status::Internal, "XNNPACK could not create the runtime of nodes %zu..%zu", begin, end - 1);
  // XNNPACK packed this subgraph's weights into its own memory; their file
  // pages are not read again (a weight another node reads is kept), so they
  // leave memory now and packing never holds two copies of the model.
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i] || graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type() != NodeType::XNNFullyConnected)
      continue;
    for (size_t j = 1; j < 3; ++j)
      if (uint32_t v = io_[i].in[j]; v != kInvalidId && only_packed_[v] && file_ && !dynamic_)
        file_->release_pages(st.values[v].constant_bytes);
  }
  if (count == 1) {
    for (size_t i = begin; i < end; ++i)
      if (!skip_[i]) {
        std::string_view name = node_name(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type());
        if (name.starts_with("XNN")) name.remove_prefix(3);
        step.label = "xnnpack " + std::string(name);
        if (io_[i].num_in == 3 && name == "FullyConnected") {  // weights' shape, so a profile tells the layers apart
          const Value& w = st.values[io_[i].in[1]];
          if (w.ndims == 2) step.label += " " + std::to_string(w.dims[0]) + "x" + std::to_string(w.dims[1]);
        }
      }
  } else {
    step.label = fcs ? "xnnpack subgraph (fully connected + elementwise)" : "xnnpack subgraph (elementwise, softmax)";
  }
  add_handles(step, begin, end);
  st.steps.push_back(std::move(step));
  return Status::Ok;
}

Status Builder::kiln_step(State& st, size_t i) {
  const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
  const NodeIO& io = io_[i];
  const Value& out = st.values[io.out];
  const Value& in = st.values[io.in[0]];
  Step step;
  step.out.group = out.group;
  for (size_t j = 0; j < io.num_in; ++j)
    step.in.push_back(Operand{io.in[j] == kInvalidId ? -1 : st.values[io.in[j]].group});
  if (const auto* mm = node->output_min_max()) { step.lo = mm->output_min(); step.hi = mm->output_max(); }
  const NodeType t = node->xnode_union_type();
  auto bad = [&](const char* what) {
    return failf(error_, Status::InvalidProgram, "node %zu (%s): %s", i, node_name(t), what);
  };
  auto unary = [&](UnaryOp op, const char* label) {
    if (in.numel != out.numel) return bad("input and output sizes differ");
    step.kind = StepKind::Unary;
    step.unary = op;
    step.count = out.numel;
    step.label = label;
    return Status::Ok;
  };
  Status s = Status::Ok;
  switch (t) {
    case NodeType::XNNTanh: s = unary(UnaryOp::Tanh, "kiln tanh"); break;
    case NodeType::XNNReciprocalSquareRoot: s = unary(UnaryOp::Rsqrt, "kiln rsqrt"); break;
    case NodeType::XNNGelu: s = unary(UnaryOp::Gelu, "kiln gelu"); break;
    case NodeType::XNNExp: s = unary(UnaryOp::Exp, "kiln exp"); break;
    case NodeType::XNNLog: s = unary(UnaryOp::Log, "kiln log"); break;
    case NodeType::XNNSin: s = unary(UnaryOp::Sin, "kiln sin"); break;
    case NodeType::XNNCos: s = unary(UnaryOp::Cos, "kiln cos"); break;
    case NodeType::XNNCopy: case NodeType::XNNStaticReshape: s = unary(UnaryOp::Copy, "kiln copy"); break;
    case NodeType::XNNConvert: {  // fp32 -> int8 rows quantized per row at run time
      if (out.quant != Value::Quant::DynamicRows || in.quant != Value::Quant::None || in.numel != out.numel)
        return bad("kiln converts fp32 to dynamically quantized int8 rows only");
      step.kind = StepKind::QuantizeRows;
      step.label = "kiln quantize rows (int8, per row)";
      step.k = out.dims[out.ndims - 1];
      step.m = out.numel / step.k;
      step.rows_layout = out.rows_layout;
      break;
    }
    case NodeType::XNNFullyConnected: {
      const auto* p = node->xnode_union_as_XNNFullyConnected();
      const Value& w = st.values[io.in[1]];
      if (in.quant == Value::Quant::DynamicRows) {  // 8da4w / 8da8w
        if (w.ndims != 2 || (p->flags() & 1u) != 0 || out.ndims < 1) return bad("quantized weights must be [N, K]");
        step.kind = StepKind::QFullyConnected;
        step.n = w.dims[0];
        step.k = w.dims[1];
        if (in.dims[in.ndims - 1] != step.k || out.dims[out.ndims - 1] != step.n || in.numel / step.k != out.numel / step.n)
          return bad("input, weights and output shapes do not agree");
        step.m = in.numel / step.k;
        step.rows_layout = in.rows_layout;
        step.qweights = w.constant;
        // per weight, once for every node and plan that reads it (a dynamic delegate's plans share them)
        State& owner = root_ ? *root_ : st;
        const float*& shared_sums = owner.weight_sums[io.in[1]];
        float* sums = nullptr;
        if (!shared_sums) {
          sums = static_cast<float*>(std::aligned_alloc(kArenaAlign, (static_cast<size_t>(step.n) * 4 + kArenaAlign - 1) / kArenaAlign * kArenaAlign));
          if (!sums) return fail(error_, Status::OutOfMemory, "out of memory for weight sums");
          owner.owned.emplace_back(sums, &std::free);
        }
        if (w.quant == Value::Quant::Int4Groups) {
          step.group = w.group_size;
          step.group_scales = w.group_scales;
          if (sums) cpu::qb4w_weight_sums(static_cast<const uint8_t*>(w.constant), w.group_scales, step.n, step.k, step.group, sums);
          step.label = "kiln fully connected, int8 x int4";
          if (step.rows_layout == static_cast<uint8_t>(cpu::Qd8Layout::Signed)) {
            // repacked once into kiln's panels (one copy per weight, however many nodes read it);
            // the file's pages then leave memory, so the model is held once
            const uint8_t*& panels = owner.qb4w_panels[io.in[1]];
            if (!panels) {
              const size_t bytes = cpu::qb4w_panels_bytes(step.n, step.k, step.group);
              uint8_t* buf = nullptr;
              std::shared_ptr<void> chunk = weight_memory(bytes, &buf);
              if (!buf) return fail(error_, Status::OutOfMemory, "out of memory repacking int4 weights");
              owner.weight_chunks.push_back(std::move(chunk));
              cpu::qb4w_pack_panels(static_cast<const uint8_t*>(w.constant), w.group_scales, step.n, step.k, step.group, buf);
              panels = buf;
              if (only_packed_[io.in[1]] && file_) file_->release_pages(w.constant_bytes);
            }
            step.qweights = panels;
            step.qb4w_panels = true;
          }
        } else {
          step.channel_scales = w.channel_scales;
          if (sums) cpu::qc8w_weight_sums(static_cast<const int8_t*>(w.constant), w.channel_scales, step.n, step.k, sums);
          step.label = "kiln fully connected, int8 x int8";
        }
        if (st.per_node) step.label += " " + std::to_string(step.n) + "x" + std::to_string(step.k);
        if (sums) shared_sums = sums;
        step.weight_sums = shared_sums;
        step.in.resize(1);
        if (io.in[2] != kInvalidId) {
          const Value& b = st.values[io.in[2]];
          if (b.numel != step.n || b.quant != Value::Quant::None) return bad("bias must be fp32 with one value per output");
          step.bias = static_cast<const float*>(b.constant);
        }
        break;
      }
      if (w.quant != Value::Quant::None) return bad("quantized weights need dynamically quantized int8 inputs");
      if (w.ndims != 2 || in.ndims < 1 || out.ndims < 1) return bad("weights must be 2-D");
      const bool kn = (p->flags() & 1u) != 0;  // XNN_FLAG_TRANSPOSE_WEIGHTS: W is [K, N]
      step.kind = StepKind::FullyConnected;
      step.label = "kiln fully connected";
      if (st.per_node) step.label += " " + std::to_string(w.dims[0]) + "x" + std::to_string(w.dims[1]);
      step.k = kn ? w.dims[0] : w.dims[1];
      step.n = kn ? w.dims[1] : w.dims[0];
      if (in.dims[in.ndims - 1] != step.k || out.dims[out.ndims - 1] != step.n || step.k == 0 || step.n == 0 ||
          in.numel / step.k != out.numel / step.n)
        return bad("input, weights and output shapes do not agree");
      step.m = in.numel / step.k;
      step.in.resize(1);  // x; the weights and bias are constants
      // W's layout for the product: a few rows (one token) are dot products over W's rows, [N, K], so
      // that each task streams one contiguous block of W; many rows run the GEMM over [K, N]. A file
      // with the other layout is transposed once, into kiln's memory, and its copy leaves memory.
      // A dynamic delegate keeps W as the file has it for every size (run_fully_connected has a
      // GEMM over [N, K] for many rows), so that no plan holds a second copy of the weights.
      step.weights_nk = dynamic_ ? !kn : step.m < kGemvRows;
      if (step.weights_nk != kn) {
        // The file's layout. Streamed once per token (a few rows, or a dynamic delegate, whose plans
        // share one copy): copied into huge-page weight memory, the file's pages released (see
        // weight_memory). Many rows (a GEMM, which packs its panels): read in place.
        const float* copy = static_cast<const float*>(w.constant);
        if (dynamic_ || step.m < kGemvRows)
          if (Status e = in_weight_memory(st, w.constant_bytes, only_packed_[io.in[1]], &copy); e != Status::Ok) return e;
        step.weights = copy;
      } else {
        auto* wt = static_cast<float*>(std::aligned_alloc(kArenaAlign, (w.bytes() + kArenaAlign - 1) / kArenaAlign * kArenaAlign));
        if (!wt) return fail(error_, Status::OutOfMemory, "out of memory transposing weights");
        st.owned.emplace_back(wt, &std::free);
        const int64_t rows = kn ? step.k : step.n, cols = kn ? step.n : step.k;  // the file's [rows, cols]
        transpose_blocked(static_cast<const float*>(w.constant), rows, cols, wt);
        step.weights = wt;
        if (only_packed_[io.in[1]] && file_) file_->release_pages(w.constant_bytes);
      }
      if (io.in[2] != kInvalidId) {
        if (st.values[io.in[2]].numel != step.n) return bad("bias size is not the output channels");
        step.bias = static_cast<const float*>(st.values[io.in[2]].constant);
      }
      break;
    }
    case NodeType::XNNBatchMatrixMultiply: {
      const Value& b = st.values[io.in[1]];
      if (static_cast<const fbx::_XNNNode2x1*>(node->xnode_union())->flags() != 0)
        return failf(error_, Status::NotSupported, "node %zu: batch matmul with a transposed operand", i);
      if (in.ndims < 2 || b.ndims < 2 || out.ndims < 2) return bad("operands need rank >= 2");
      step.kind = StepKind::Bmm;
      step.label = "kiln batch matmul";
      step.m = in.dims[in.ndims - 2];
      step.k = in.dims[in.ndims - 1];
      step.n = b.dims[b.ndims - 1];
      if (b.dims[b.ndims - 2] != step.k || out.dims[out.ndims - 2] != step.m || out.dims[out.ndims - 1] != step.n)
        return bad("operand shapes do not agree");
      step.batch = out.numel / std::max<int64_t>(1, step.m * step.n);
      int64_t ab = in.numel / std::max<int64_t>(1, step.m * step.k), bb = b.numel / std::max<int64_t>(1, step.k * step.n);
      if ((ab != step.batch && ab != 1) || (bb != step.batch && bb != 1))
        return bad("batch dims broadcast in a way kiln does not run");
      step.a_batch_stride = ab == 1 ? 0 : step.m * step.k;
      step.b_batch_stride = bb == 1 ? 0 : step.k * step.n;
      break;
    }
    case NodeType::XNNStaticTranspose: {
      const auto* p = node->xnode_union_as_XNNStaticTranspose();
      if (!p->perm() || p->perm()->size() != in.ndims || out.ndims != in.ndims) return bad("perm does not match the rank");
      step.kind = StepKind::Transpose;
      step.label = "kiln transpose";
      step.rank = in.ndims;
      uint32_t seen = 0;
      for (uint32_t d = 0; d < in.ndims; ++d) {
        uint32_t pd = p->perm()->Get(d);
        if (pd >= in.ndims || (seen & (1u << pd))) return bad("perm is not a permutation");
        seen |= 1u << pd;
        step.perm[d] = pd;
        step.in_dims[d] = in.dims[d];
        step.out_dims[d] = out.dims[d];
        if (in.dims[pd] != out.dims[d]) return bad("output shape is not the permuted input shape");
      }
      if (in.ndims == 0) { step.kind = StepKind::Unary; step.unary = UnaryOp::Copy; step.count = out.numel; }
      break;
    }
    case NodeType::XNNStaticSlice: {
      const auto* p = node->xnode_union_as_XNNStaticSlice();
      if (!p->offsets() || !p->sizes() || p->offsets()->size() != in.ndims || p->sizes()->size() != in.ndims ||
          out.ndims != in.ndims || in.ndims == 0)
        return bad("offsets and sizes do not match the rank");
      step.kind = StepKind::Slice;
      step.label = "kiln slice";
      step.rank = in.ndims;
      for (uint32_t d = 0; d < in.ndims; ++d) {
        int64_t off = p->offsets()->Get(d), size = p->sizes()->Get(d);
        if (size == 0) size = in.dims[d] - off;  // XNNPACK: 0 means "to the end"
        if (off < 0 || size != out.dims[d] || off + size > in.dims[d]) return bad("slice lies outside the input");
        step.offsets[d] = off;
        step.in_dims[d] = in.dims[d];
        step.out_dims[d] = out.dims[d];
      }
      break;
    }
    case NodeType::XNNConcatenate2: case NodeType::XNNConcatenate3: case NodeType::XNNConcatenate4:
    case NodeType::XNNConcatenate5: {
      uint32_t axis = static_cast<const fbx::_XNNCat*>(node->xnode_union())->axis();
      if (axis >= out.ndims) return bad("axis is out of range");
      step.kind = StepKind::Concat;
      step.label = "kiln concatenate";
      step.outer = 1;
      for (uint32_t d = 0; d < axis; ++d) step.outer *= out.dims[d];
      int64_t total = 0;
      for (size_t j = 0; j < io.num_in; ++j) {
        const Value& x = st.values[io.in[j]];
        if (x.ndims != out.ndims) return bad("inputs and output differ in rank");
        step.widths[j] = x.numel / std::max<int64_t>(1, step.outer);
        total += step.widths[j];
      }
      if (total * step.outer != out.numel) return bad("input sizes do not add up to the output");
      break;
    }
    default:
      return failf(error_, Status::NotSupported, "node %zu: %s is not supported by kiln's XNNPACK backend", i,
                   node_name(t));
  }
  if (s != Status::Ok) return s;
  if (step.kind != StepKind::Unary && step.kind != StepKind::FullyConnected && step.kind != StepKind::QFullyConnected &&
      (step.lo != -INFINITY || step.hi != INFINITY))
    return failf(error_, Status::NotSupported, "node %zu: output clamp on %s", i, node_name(t));
  add_handles(step, i, i + 1);
  st.steps.push_back(std::move(step));
  return Status::Ok;
}

// Whether a step other than `reader` reads `group` (as an operand, or as a subgraph's external value,
// which `writer`'s own externals are not counted as: it writes the group). The fusions below rewrite
// what an intermediate holds, or drop it: only when its one reader is the step they fuse.
bool read_elsewhere(const State& st, int32_t group, size_t reader, size_t writer = SIZE_MAX) {
  for (size_t o = 0; o < st.steps.size(); ++o) {
    if (o == reader) continue;
    for (const Operand& op : st.steps[o].in)
      if (op.group == group) return true;
    if (o != writer)
      for (int32_t eg : st.steps[o].external_groups)
        if (eg == group) return true;
  }
  return false;
}

void find_live_attention(State& st);

Status Builder::make_steps(State& st) {
  size_t begin = 0;
  bool open = false;
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    NodeType t = node->xnode_union_type();
    bool lib = library_has(t);
    if (t == NodeType::XNNFullyConnected) {
      // both implementations need constant weights
      bool static_w = st.values[io_[i].in[1]].constant && (io_[i].in[2] == kInvalidId || st.values[io_[i].in[2]].constant);
      if (!static_w) return failf(error_, Status::NotSupported, "node %zu: fully connected with non-constant weights", i);
      // Debian's XNNPACK has no int8 x int4 product: quantized ones always run on kiln's code
      lib = st.engine == Engine::Xnnpack && st.values[io_[i].in[1]].quant == Value::Quant::None;
    }
    if (skip_[i]) continue;  // a view: no step, inside or between subgraphs
    if (chain_of_[i] >= 0) {  // a fused chain: one step at its first node
      Chain& c = chains_[static_cast<size_t>(chain_of_[i])];
      if (i == c.begin) {
        if (open) {
          if (Status s = subgraph_step(st, begin, i); s != Status::Ok) return s;
          open = false;
        }
        for (size_t j = c.begin; j <= c.last; ++j)
          if (chain_of_[j] == chain_of_[i])
            c.step.debug_handles.push_back(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(j))->debug_handle());
        st.steps.push_back(std::move(c.step));
      }
      continue;
    }
    if (lib) {
      if (!open) { begin = i; open = true; }
      if (st.per_node) {  // profiling: one subgraph per node
        if (Status s = subgraph_step(st, begin, i + 1); s != Status::Ok) return s;
        open = false;
      }
      continue;
    }
    if (open) {
      if (Status s = subgraph_step(st, begin, i); s != Status::Ok) return s;
      open = false;
    }
    if (Status s = kiln_step(st, i); s != Status::Ok) return s;
  }
  if (open)
    if (Status s = subgraph_step(st, begin, io_.size()); s != Status::Ok) return s;

  // The tied LM head: transpose(bmm(W, transpose(x))) -> one fused step.
  for (size_t s = 0; s + 2 < st.steps.size(); ++s) {
    Step &t1 = st.steps[s], &mm = st.steps[s + 1], &t2 = st.steps[s + 2];
    if (t1.kind != StepKind::Transpose || mm.kind != StepKind::Bmm || t2.kind != StepKind::Transpose) continue;
    if (t1.rank != 2 || t2.rank != 2 || mm.batch != 1 || mm.in[1].group != t1.out.group || t2.in[0].group != mm.out.group)
      continue;
    if (mm.n > 256 * 64) continue;
    // the intermediate must not be read elsewhere
    const int32_t mid = mm.out.group;
    const bool elsewhere = st.groups[static_cast<size_t>(mid)].storage.kind != Storage::Kind::Arena ||
                           read_elsewhere(st, mid, s + 2, s + 1);
    // the fused step writes the output while it reads x: the output must not share x's arena bytes
    if (elsewhere || st.groups[static_cast<size_t>(t2.out.group)].storage.kind == Storage::Kind::Arena) continue;
    Step fused;
    fused.kind = StepKind::LmHead;
    fused.label = "kiln LM head (x · Wᵀ, tiled)";
    fused.in = {mm.in[0], t1.out};  // W [N, K], xt [K, M]
    fused.out = t2.out;
    for (const Step* part : {&t1, &mm, &t2})
      fused.debug_handles.insert(fused.debug_handles.end(), part->debug_handles.begin(), part->debug_handles.end());
    fused.m = mm.n;   // sequence rows
    fused.n = mm.m;   // vocabulary
    fused.k = mm.k;
    if (fused.m > 256 || fused.k > 1024) continue;
    mm = std::move(fused);
    st.steps.erase(st.steps.begin() + static_cast<std::ptrdiff_t>(s + 2));
    // the table, streamed once per token (the tied embedding's lookup reads its rows from the file)
    Storage& table = st.groups[static_cast<size_t>(mm.in[0].group)].storage;
    if (table.kind == Storage::Kind::Static && (dynamic_ || mm.m < kGemvRows)) {
      const float* copy = nullptr;
      const std::span<const std::byte> bytes(static_cast<const std::byte*>(table.data),
                                             static_cast<size_t>(mm.n * mm.k) * sizeof(float));
      if (Status e = in_weight_memory(st, bytes, true, &copy); e != Status::Ok) return e;
      table.data = copy;
    }
  }
  // transpose(B)'s last two dims -> bmm(A, ·), a few rows of A: one step, C = A · Bᵀ with dot
  // products over B's rows as they are, so the transposed copy (for an LLM, of the whole K
  // cache, every token) is never made.
  for (size_t s = 0; s + 1 < st.steps.size(); ++s) {
    Step &t = st.steps[s], &mm = st.steps[s + 1];
    if (t.kind != StepKind::Transpose || mm.kind != StepKind::Bmm || mm.trans_b || t.rank < 2 ||
        mm.in[1].group != t.out.group || mm.in[0].group == t.out.group || mm.m >= kGemvRows)
      continue;
    bool last_two = t.perm[t.rank - 1] == t.rank - 2 && t.perm[t.rank - 2] == t.rank - 1;
    for (uint32_t d = 0; d + 2 < t.rank; ++d) last_two &= t.perm[d] == d;
    if (!last_two) continue;
    const int32_t mid = t.out.group, src = t.in[0].group;
    if (st.groups[static_cast<size_t>(mid)].storage.kind != Storage::Kind::Arena || read_elsewhere(st, mid, s + 1))
      continue;
    // the bmm then writes its output while it reads the transpose's input: their arena bytes
    // must not overlap (the plan made the transpose's input dead after the transpose)
    const Group &gi = st.groups[static_cast<size_t>(src)], &go = st.groups[static_cast<size_t>(mm.out.group)];
    if (gi.storage.kind == Storage::Kind::Arena && go.storage.kind == Storage::Kind::Arena &&
        gi.storage.offset < go.storage.offset + go.bytes && go.storage.offset < gi.storage.offset + gi.bytes)
      continue;
    if (gi.storage.kind == Storage::Kind::None) continue;
    mm.in[1] = t.in[0];
    mm.trans_b = true;
    mm.debug_handles.insert(mm.debug_handles.begin(), t.debug_handles.begin(), t.debug_handles.end());
    mm.label = "kiln batch matmul (A · Bᵀ)";
    st.steps.erase(st.steps.begin() + static_cast<std::ptrdiff_t>(s));
  }
  find_live_attention(st);
  return Status::Ok;
}

// Attention over the live positions of a static KV cache: scores = q · Kᵀ (a few rows), then a
// rows step that only scales them by finite constants, adds an additive mask and takes the
// softmax, then P · V. Positions the mask hides in every row (-inf, or transformers' finfo.min:
// kMaskedBelow) get probability exactly 0 whatever their score, so the scores product skips them
// and P · V reads no V row for them: per token, attention reads the cache up to the current
// position instead of all of it. (Exact for finite K and V, which a cache written by the program
// holds; a non-finite value at a masked position would have made the eager result NaN. A row
// that hides every position runs over all of them, as eager.)
void find_live_attention(State& st) {
  for (size_t s = 0; s + 2 < st.steps.size(); ++s) {
    Step &qk = st.steps[s], &rows = st.steps[s + 1], &pv = st.steps[s + 2];
    if (qk.kind != StepKind::Bmm || !qk.trans_b || rows.kind != StepKind::Rows || pv.kind != StepKind::Bmm ||
        pv.trans_b || rows.cols != qk.n || rows.rows != qk.batch * qk.m || pv.k != qk.n || pv.batch != qk.batch ||
        pv.m != qk.m || rows.row_ops.size() < 2)
      continue;
    const int32_t scores = qk.out.group;
    if (st.groups[static_cast<size_t>(scores)].storage.kind != Storage::Kind::Arena) continue;
    if (read_elsewhere(st, scores, s + 1)) continue;  // the skipped scores are 0, not q · k: nothing else may read them
    auto mem_group = [&](const RowOperand& x) {
      return x.src == RowOperand::Src::Memory ? rows.in[static_cast<size_t>(x.index)].group : -1;
    };
    int32_t cur_slot = -1;  // the running value: the scores (memory) before the first op, then a slot
    auto is_cur = [&](const RowOperand& x) {
      return cur_slot < 0 ? mem_group(x) == scores && !x.scalar && x.period == rows.rows
                          : x.src == RowOperand::Src::Slot && x.index == cur_slot;
    };
    bool ok = true, masked = false;
    RowOperand mask;
    for (size_t i = 0; i + 1 < rows.row_ops.size() && ok; ++i) {
      const RowOp& op = rows.row_ops[i];
      const RowOperand* other = is_cur(op.a) ? &op.b : is_cur(op.b) ? &op.a : nullptr;
      ok = other != nullptr && op.write_group < 0 && !op.out_scalar && op.lo == -INFINITY && op.hi == INFINITY;
      if (!ok) break;
      if (op.kind == RowOpKind::Mul) {  // by finite constants: 0 stays finite
        const int32_t g = mem_group(*other);
        ok = g >= 0 && st.groups[static_cast<size_t>(g)].storage.kind == Storage::Kind::Static;
        if (ok) {
          const auto* c = static_cast<const float*>(st.groups[static_cast<size_t>(g)].storage.data);
          const int64_t count = other->period * (other->scalar ? 1 : rows.cols);
          for (int64_t j = 0; j < count && ok; ++j) ok = std::isfinite(c[j]);
        }
      } else if (op.kind == RowOpKind::Add && !masked) {
        ok = mem_group(*other) >= 0 && mem_group(*other) != scores && !other->scalar && other->period >= 1;
        mask = *other;
        masked = true;
      } else {
        ok = false;
      }
      cur_slot = op.out_slot;
    }
    const RowOp& sm = rows.row_ops.back();
    if (!ok || !masked || sm.kind != RowOpKind::Softmax || !is_cur(sm.a) || sm.write_group < 0 ||
        rows.in[static_cast<size_t>(sm.write_group)].group != pv.in[0].group)
      continue;
    qk.live_mask.group = mem_group(mask);
    qk.live_mask_period = mask.period;
    pv.live_k = true;
    qk.label = "kiln batch matmul (A · Bᵀ, live positions)";
    pv.label = "kiln batch matmul (live positions)";
  }
}

Status Builder::build(std::span<const std::byte> payload, State& st) {
  if (Status s = parse(payload, st); s != Status::Ok) return s;
  if (!call_.empty())
    if (Status s = infer_dims(st); s != Status::Ok) return s;
  if (Status s = plan_storage(st); s != Status::Ok) return s;
  // Which constants only fully-connected nodes read (as weights, which XNNPACK packs)
  only_packed_.assign(st.values.size(), true);
  for (size_t i = 0; i < io_.size(); ++i) {
    const bool fc = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type() == NodeType::XNNFullyConnected;
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (io_[i].in[j] != kInvalidId && !(fc && j >= 1)) only_packed_[io_[i].in[j]] = false;
  }
  if (Status s = make_steps(st); s != Status::Ok) return s;
  st.bound_args.assign(st.arg_values.size(), nullptr);
  if (st.arena == nullptr && st.arena_bytes > 0) return Status::Ok;  // set up with the arena, at the first call
  return setup_subgraphs(st, error_);
}

// ---------------------------------------------------------------- the Backend

bool xnn_ready = false;  // xnn_initialize succeeded (register_runtime_backend)

Status init(const rt::BackendInitContext& ctx, void** state, ErrorMessage* error) {
  auto st = std::unique_ptr<State>(new (std::nothrow) State);
  if (!st) return fail(error, Status::OutOfMemory, "out of memory");
  st->dynamic = ctx.dynamic_shapes;
  if (Status s = plan_payload(&ctx.file, ctx.payload, ctx.options, *st, error); s != Status::Ok) return s;
  *state = st.release();
  return Status::Ok;
}

Status run_plan(State& st, std::span<EValue*> args, ErrorMessage* error);

// Whether a call's tensor has a value's sizes (a 0-d tensor is a payload's [1]: XNNPACK has no 0-d values).
bool same_sizes(const rt::Tensor& t, const Value& v) {
  if (t.dim == 0) return v.numel == 1;
  return static_cast<uint32_t>(t.dim) == v.ndims && std::equal(v.dims.begin(), v.dims.begin() + v.ndims, t.sizes);
}

// Whether the call's inputs have the sizes `st` is planned for.
bool inputs_match(const State& st, std::span<EValue*> args) {
  for (size_t a = 0; a < st.num_inputs && a < args.size(); ++a) {
    if (!args[a] || !args[a]->is_tensor()) return true;  // reported by run_plan
    if (!same_sizes(args[a]->tensor(), st.values[st.arg_values[a]])) return false;
  }
  return true;
}

// Runs the call on the plan for its input sizes (detail::execute_state): `st` itself, or for a dynamic
// delegate the plan made for these sizes, made now if no recent call had them.
Status run(State& st, std::span<EValue*> args, ErrorMessage* error) {
  if (args.size() != st.arg_values.size())
    return failf(error, Status::InvalidArgument, "the call passes %zu arguments, the graph has %zu inputs and outputs",
                 args.size(), st.arg_values.size());
  if (!st.dynamic || inputs_match(st, args)) {
    st.last = nullptr;
    return run_plan(st, args, error);
  }
  size_t found = st.plans.size();
  for (size_t p = 0; p < st.plans.size() && found == st.plans.size(); ++p)
    if (inputs_match(*st.plans[p], args)) found = p;
  if (found == st.plans.size()) {  // a plan for these sizes (allocates: once per new set of sizes)
    auto plan = std::unique_ptr<State>(new (std::nothrow) State);
    if (!plan) return fail(error, Status::OutOfMemory, "out of memory");
    plan->engine = st.engine;
    plan->per_node = st.per_node;
    plan->pool = st.pool;
    plan->exec = st.exec;
    plan->profiling = st.profiling;
    plan->resizes_outputs = true;
    plan->owner = &st;
    Builder b(st.file, error);
    b.plan_for(&st, args);
    if (Status s = b.build(st.payload, *plan); s != Status::Ok) return s;
    if (st.plans.size() == State::kMaxPlans) st.plans.pop_back();
    st.plans.insert(st.plans.begin(), std::move(plan));
    found = 0;
  } else if (found != 0) {
    std::rotate(st.plans.begin(), st.plans.begin() + static_cast<std::ptrdiff_t>(found),
                st.plans.begin() + static_cast<std::ptrdiff_t>(found + 1));
    found = 0;
  }
  st.last = st.plans[found].get();
  return run_plan(*st.last, args, error);
}

// The LM head's table when the call passes it (the tied embedding: a constant of the program, which
// the embedding lookup outside the delegate reads too): the first call copies it into weight_memory
// (see Builder::in_weight_memory), if it lies in the program's file, and later calls with the same
// table read the copy; any other tensor (one that could change between calls) is read as passed.
Status table_in_weight_memory(State& st, const Step& step, const float** w, ErrorMessage* error) {
  State& owner = st.owner ? *st.owner : st;
  if (!owner.file || (step.m >= kGemvRows && !owner.dynamic)) return Status::Ok;  // a GEMM: in place
  const std::span<const std::byte> file = owner.file->bytes();
  const auto* p = reinterpret_cast<const std::byte*>(*w);
  const size_t bytes = static_cast<size_t>(step.n * step.k) * sizeof(float);
  if (p < file.data() || p + bytes > file.data() + file.size()) return Status::Ok;
  return copy_to_weight_memory(owner, owner.file, std::span<const std::byte>(p, bytes), true, w, error);
}

// Binds the call's tensors and runs the steps of one plan.
// Each token, the steps' descriptions (the Step structs, their operand and row-op arrays, the
// storage groups they name) are cold: the weights streamed since have evicted them, and reading
// each where its step starts costs a few misses to memory per step (perf: the first loads of
// run_plan, ~5% of a SmolLM2 8da4w decode step of 1175 steps). So each step fetches what the
// next ones will read, in stages: step i + 3's struct, step i + 2's arrays, step i + 1's groups.
inline void prefetch_lines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o);
}

void prefetch_ahead(const State& st, size_t si) {
  const size_t n = st.steps.size();
  if (si + 3 < n) prefetch_lines(&st.steps[si + 3], sizeof(Step));
  if (si + 2 < n) {
    const Step& s = st.steps[si + 2];
    prefetch_lines(s.in.data(), s.in.size() * sizeof(Operand));
    prefetch_lines(s.row_ops.data(), s.row_ops.size() * sizeof(RowOp));
  }
  if (si + 1 < n) {
    const Step& s = st.steps[si + 1];
    auto group = [&](int32_t g) {
      if (g >= 0 && static_cast<size_t>(g) < st.groups.size()) __builtin_prefetch(&st.groups[static_cast<size_t>(g)]);
    };
    group(s.out.group);
    for (const Operand& o : s.in) group(o.group);
    for (const RowOp& op : s.row_ops) {
      if (op.a.src == RowOperand::Src::Memory) group(op.a.index);
      if (op.b.src == RowOperand::Src::Memory) group(op.b.index);
      if (op.write_group >= 0) group(op.write_group);
    }
  }
}

Status run_plan(State& st, std::span<EValue*> args, ErrorMessage* error) {
  if (st.arena == nullptr && st.arena_bytes > 0) {  // a dynamic delegate's plan at its upper bounds, first run
    if (Status s = ensure_arena(st, error); s != Status::Ok) return s;
    if (Status s = setup_subgraphs(st, error); s != Status::Ok) return s;
  }
  if (st.resizes_outputs || st.dynamic)  // the outputs get this call's sizes (dynamic-bound tensors)
    for (size_t a = st.num_inputs; a < args.size(); ++a) {
      if (!args[a] || !args[a]->is_tensor()) continue;  // reported below
      const Value& v = st.values[st.arg_values[a]];
      rt::Tensor& t = args[a]->tensor();
      if (same_sizes(t, v)) continue;
      if (rt::resize_tensor(t, std::span<const int64_t>(v.dims.data(), v.ndims)) != Status::Ok)
        return failf(error, Status::InvalidArgument, "output %zu cannot hold %lld elements", a - st.num_inputs,
                     static_cast<long long>(v.numel));
    }
  bool rebind = false;
  for (size_t a = 0; a < args.size(); ++a) {
    if (!args[a] || !args[a]->is_tensor() || args[a]->tensor().dtype != ScalarType::Float ||
        args[a]->tensor().numel != st.arg_numel[a] || !args[a]->tensor().data)
      return failf(error, Status::InvalidArgument, "argument %zu is not a float tensor of %lld elements", a,
                   static_cast<long long>(st.arg_numel[a]));
    if (!args[a]->tensor().is_contiguous())  // the steps read and write every tensor in its sizes' row-major order
      return failf(error, Status::NotSupported,
                   "argument %zu is not contiguous (only identity dim order is supported, as in the portable kernels)", a);
    if (st.bound_args[a] != args[a]->tensor().data) rebind = true;
  }
  if (rebind) {
    for (Step& step : st.steps) {
      if (step.kind != StepKind::Subgraph || !step.binds_args) continue;
      for (size_t e = 0; e < step.externals.size(); ++e) {
        const Storage& sto = st.groups[static_cast<size_t>(step.external_groups[e])].storage;
        if (sto.kind == Storage::Kind::Arg) step.externals[e].data = args[sto.arg]->tensor().data;
      }
      if (xnn_setup_runtime(step.runtime, step.externals.size(), step.externals.data()) != xnn_status_success)
        return fail(error, Status::Internal, "xnn_setup_runtime failed");
    }
    for (size_t a = 0; a < args.size(); ++a) st.bound_args[a] = args[a]->tensor().data;
  }
  using Clock = std::chrono::steady_clock;
  const size_t nsteps = st.steps.size();
  for (size_t si = 0; si < nsteps; ++si) {
    Step& step = st.steps[si];
    prefetch_ahead(st, si);
    Clock::time_point t0;
    if (st.profiling) t0 = Clock::now();
    auto in = [&](size_t j) { return step.in[j].data(st.groups, st.arena, args); };
    auto* out = const_cast<float*>(step.out.group >= 0 ? step.out.data(st.groups, st.arena, args) : nullptr);
    switch (step.kind) {
      case StepKind::Subgraph:
        if (xnn_invoke_runtime(step.runtime) != xnn_status_success)
          return fail(error, Status::Internal, "xnn_invoke_runtime failed");
        break;
      case StepKind::FullyConnected: run_fully_connected(st.exec, step, in(0), out); break;
      case StepKind::QuantizeRows: run_quantize_rows(st.exec, step, in(0), out); break;
      case StepKind::QFullyConnected: run_qfully_connected(st.exec, step, in(0), out); break;
      case StepKind::Rows: run_rows(st.exec, step, st.groups, st.arena, args); break;
      case StepKind::Bmm: {
        int64_t live = 0;
        if (step.live_mask.group >= 0) {
          live = live_positions(step.live_mask.data(st.groups, st.arena, args), step.live_mask_period, step.n);
          st.live_positions = live;
        } else if (step.live_k) {
          live = st.live_positions;
        }
        run_bmm(st.exec, step, in(0), in(1), out, live);
        break;
      }
      case StepKind::LmHead: {
        const float* w = in(0);
        if (step.in[0].group >= 0 &&
            st.groups[static_cast<size_t>(step.in[0].group)].storage.kind == Storage::Kind::Arg)
          if (Status s = table_in_weight_memory(st, step, &w, error); s != Status::Ok) return s;
        run_lm_head(st.exec, step, w, in(1), out);
        break;
      }
      case StepKind::Transpose: run_transpose(st.exec, step, in(0), out); break;
      case StepKind::Slice: run_slice(step, in(0), out); break;
      case StepKind::Unary: case StepKind::Copy: case StepKind::Clamp: run_unary(st.exec, step, in(0), out); break;
      case StepKind::Concat: {
        std::array<const float*, 5> ins{};
        for (size_t j = 0; j < step.in.size(); ++j) ins[j] = in(j);
        run_concat(step, std::span<const float* const>(ins.data(), step.in.size()), out);
        break;
      }
    }
    if (st.profiling) {
      const Clock::time_point t1 = Clock::now();
      step.calls++;
      step.total_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      step.last_start_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count());
      step.last_end_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count());
    }
  }
  return Status::Ok;
}

Status execute(void* opaque, std::span<EValue*> args, ErrorMessage* error) {
  return run(*static_cast<State*>(opaque), args, error);
}

void destroy(void* opaque) { delete static_cast<State*>(opaque); }

void enable_profiling(void* opaque, bool on) {
  auto& st = *static_cast<State*>(opaque);
  st.profiling = on;
  for (Step& s : st.steps) s.calls = s.total_ns = s.last_start_ns = s.last_end_ns = 0;
  for (auto& p : st.plans) enable_profiling(p.get(), on);
}

// One entry per step label (summed), in order of first appearance.
size_t profile(const void* opaque, std::span<rt::BackendProfileEntry> out) {
  const auto& root = *static_cast<const State*>(opaque);
  const State& st = root.last ? *root.last : root;  // the plan of the last call's sizes
  std::vector<const std::string*> labels;
  std::vector<rt::BackendProfileEntry> sums;
  for (const Step& s : st.steps) {
    size_t k = 0;
    while (k < labels.size() && *labels[k] != s.label) ++k;
    if (k == labels.size()) {
      labels.push_back(&s.label);
      sums.push_back({s.label.c_str(), 0, 0});
    }
    sums[k].calls += s.calls;
    sums[k].total_ns += s.total_ns;
  }
  for (size_t k = 0; k < sums.size() && k < out.size(); ++k) out[k] = sums[k];
  return sums.size();
}

// Every step, in execution order (rt::BackendStepProfile).
size_t step_profile(const void* opaque, std::span<rt::BackendStepProfile> out) {
  const auto& root = *static_cast<const State*>(opaque);
  const State& st = root.last ? *root.last : root;  // the plan of the last call's sizes
  for (size_t k = 0; k < st.steps.size() && k < out.size(); ++k) {
    const Step& s = st.steps[k];
    out[k] = {s.label.c_str(), s.debug_handles.data(), s.debug_handles.size(), s.calls, s.total_ns,
              s.last_start_ns, s.last_end_ns};
  }
  return st.steps.size();
}

const rt::Backend kBackend{"XnnpackBackend", init, execute, destroy, enable_profiling, profile, step_profile};

}  // namespace

Status detail::plan_payload(const rt::PteFile* file, std::span<const std::byte> payload, const rt::BackendOptions& o,
                            State& st, ErrorMessage* error) {
  if (!xnn_ready) return fail(error, Status::NotSupported, "XNNPACK is not initialized on this CPU");
  Engine engine = Engine::Kiln;
  if (o.engine != nullptr && std::string_view(o.engine) == "xnnpack") {
    engine = Engine::Xnnpack;
  } else if (o.engine != nullptr && *o.engine != '\0' && std::string_view(o.engine) != "kiln") {
    return failf(error, Status::InvalidArgument, "unknown engine '%s' (kiln or xnnpack)", o.engine);
  }
  st.engine = engine;
  st.per_node = o.profiling_detail;
  st.pool = shared_pool(std::max<size_t>(1, o.threads));
  st.exec.pool = st.pool.get();
  st.exec.threads = st.pool ? static_cast<int64_t>(st.pool->threads()) : 1;
  st.file = file;
  st.payload = payload;
  Builder b(file, error);
  if (st.dynamic) b.plan_for(nullptr, {});  // one layout of the weights for every size
  return b.build(payload, st);
}

Status detail::execute_state(State& st, std::span<EValue*> args, ErrorMessage* error) { return run(st, args, error); }

std::shared_ptr<cpu::ThreadPool> detail::shared_pool(size_t threads) {
  if (threads <= 1) return nullptr;
  static std::mutex mu;
  static std::vector<std::pair<size_t, std::weak_ptr<cpu::ThreadPool>>> pools;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [n, weak] : pools)
    if (n == threads)
      if (auto p = weak.lock()) return p;
  auto p = std::make_shared<cpu::ThreadPool>(threads);
  if (p->threads() <= 1) return nullptr;  // no pool could be made: the calling thread
  std::erase_if(pools, [](const auto& e) { return e.second.expired(); });
  pools.emplace_back(threads, p);
  return p;
}

// ---------------------------------------------------------------- weight memory

namespace {
struct WeightChunk {
  uint8_t* base = nullptr;
  size_t size = 0, used = 0;
  ~WeightChunk() { std::free(base); }
};
}  // namespace

Status detail::copy_to_weight_memory(State& owner, const rt::PteFile* file, std::span<const std::byte> bytes,
                                     bool release, const float** out, ErrorMessage* error) {
  *out = reinterpret_cast<const float*>(bytes.data());
  if (!rt::huge_pages_enabled()) return Status::Ok;
  const uint8_t*& copy = owner.weight_copies[bytes.data()];
  if (!copy) {
    uint8_t* buf = nullptr;
    std::shared_ptr<void> chunk = weight_memory(bytes.size(), &buf);
    if (!buf) return fail(error, Status::OutOfMemory, "out of memory copying weights into huge-page memory");
    owner.weight_chunks.push_back(std::move(chunk));
    std::memcpy(buf, bytes.data(), bytes.size());
    copy = buf;
    if (release && file) file->release_pages(bytes);
  }
  *out = reinterpret_cast<const float*>(copy);
  return Status::Ok;
}

std::shared_ptr<void> detail::weight_memory(size_t bytes, uint8_t** out) {
  constexpr size_t kHuge = size_t{2} << 20, kChunk = size_t{16} << 20;
  static std::mutex mu;
  static std::weak_ptr<WeightChunk> current;  // the chunk being carved (null: none with room)
  *out = nullptr;
  bytes = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<WeightChunk> c = current.lock();
  if (!c || c->size - c->used < bytes) {
    auto fresh = std::make_shared<WeightChunk>();
    fresh->size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
    fresh->base = static_cast<uint8_t*>(std::aligned_alloc(kHuge, fresh->size));
    if (!fresh->base) return nullptr;
    // advice only: where THP is off ("never") the pages stay 4 KiB and nothing else changes
    if (rt::huge_pages_enabled()) ::madvise(fresh->base, fresh->size, MADV_HUGEPAGE);
    if (!c || fresh->size - bytes > c->size - c->used) current = fresh;  // carve on from the one with more room
    c = std::move(fresh);
  }
  *out = c->base + c->used;
  c->used += bytes;
  return c;
}

bool register_runtime_backend() {
  if (!xnn_ready) {
    if (xnn_initialize(nullptr) != xnn_status_success) return false;
    xnn_ready = true;
  }
  if (rt::find_backend(kBackend.id) == &kBackend) return true;
  return rt::register_backend(&kBackend);
}

}  // namespace kiln::backends::xnnpack
