// The XNNPACK backend's first pass (builder.h): the payload's header, its values (constants,
// quantization parameters) and nodes.
//
// Payload layout (ExecuTorch's XNNPACK delegate, as both kiln and ExecuTorch
// write it): a 30-byte header -- 4 bytes, the magic "XH00", u16 header length,
// u32 flatbuffer offset, u32 flatbuffer size, u32 constant-data offset, u64
// constant-data size, little-endian -- then the XNNGraph flatbuffer
// (schema/xnnpack_graph.fbs) and the inline constant bytes. A constant is
// either an (offset, size) in that region or a key of the program's named data.
// The delegate call's arguments are the graph's external inputs, then its
// external outputs, each in increasing external_id order.

#include "builder.h"
#include "nodes/node_kind.h"
#include "kiln/cpu/quant.h"
#include "kiln/runtime/pte_file.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kiln::backends::xnnpack::detail {

namespace {

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

}  // namespace

Status Builder::check_value(const State& st, uint32_t id, size_t node, const char* role) const {
  if (id >= st.values.size() || !st.values[id].defined)
    return fail(error_, Status::InvalidProgram, "node %zu (%s): %s value %u is not defined", node,
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
      return fail(error_, Status::InvalidProgram,
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
    if (!cd || ci >= cd->size()) return fail(error_, Status::InvalidProgram, "value %u: constant %u is out of range", id, ci);
    const fbx::ConstantDataOffset* c = cd->Get(ci);
    if (c->named_key()) {
      if (!file_)
        return fail(error_, Status::InvalidProgram, "value %u: a named constant, and no program to read it from", id);
      auto r = file_->named_data(c->named_key()->string_view(), error_);
      if (!r.ok()) return r.status();
      *bytes = r.value();
    } else {
      if (c->offset() > constants.size() || c->size() > constants.size() - c->offset())
        return fail(error_, Status::InvalidProgram, "value %u: constant bytes lie outside the payload", id);
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
  if (max_id >= (1u << 24)) return fail(error_, Status::InvalidProgram, "value id %u is out of range", max_id);
  st.values.assign(static_cast<size_t>(max_id) + 1, Value{});
  std::vector<std::pair<uint32_t, uint32_t>> ext_in, ext_out;  // (external_id, value id)
  for (const fbx::XValue* v : *graph_->xvalues()) {
    const fbx::XNNTensorValue* t = tensor_of(v);
    Value& val = st.values[t->id_out()];
    if (val.defined) return fail(error_, Status::InvalidProgram, "value %u is defined twice", t->id_out());
    val.elem_bits = datatype_bits(t->datatype());
    const auto* qv = v->xvalue_union_as_XNNQuantizedTensorValue();
    val.half = !qv && t->datatype() == fbx::XNNDatatype::xnn_datatype_fp16;
    if (val.half) val.elem_bits = 32;  // computed as fp32 (Value::half)
    if (val.elem_bits == 0 || (!qv && t->datatype() != fbx::XNNDatatype::xnn_datatype_fp32 && !val.half))
      return fail(error_, Status::NotSupported, "value %u has datatype %s; kiln's XNNPACK backend runs fp32 and fp16 "
                  "(as fp32), and dynamically quantized int8 x int4/int8 fully connected, only",
                  t->id_out(), fbx::EnumNameXNNDatatype(t->datatype()));
    const auto* dims = t->dims();
    val.ndims = dims ? dims->size() : 0;
    if (val.ndims > kMaxRank) return fail(error_, Status::NotSupported, "value %u has rank %u (at most 6)", t->id_out(), val.ndims);
    val.numel = 1;
    for (uint32_t i = 0; i < val.ndims; ++i) {
      val.dims[i] = dims->Get(i);
      val.numel *= val.dims[i];
      if (val.numel > (int64_t{1} << 40)) return fail(error_, Status::InvalidProgram, "value %u is too large", t->id_out());
    }
    val.flags = t->flags();
    val.external_id = t->external_id();
    val.defined = true;
    if (val.flags & kExternalInput) ext_in.emplace_back(t->external_id(), t->id_out());
    if (val.flags & kExternalOutput) ext_out.emplace_back(t->external_id(), t->id_out());
    if (uint32_t ci = t->constant_buffer_idx(); ci != 0) {
      if (val.flags & (kExternalInput | kExternalOutput))
        return fail(error_, Status::InvalidProgram, "value %u is both constant and external", t->id_out());
      std::span<const std::byte> bytes;
      KILN_TRY(constant_at(ci, t->id_out(), &bytes));
      if (val.half) {  // widened once, into memory of the State's own
        const size_t n = static_cast<size_t>(val.numel);
        if (bytes.size() < n * 2)
          return fail(error_, Status::InvalidProgram, "value %u: constant has %zu bytes, its fp16 shape needs %zu",
                      t->id_out(), bytes.size(), n * 2);
        const size_t cap = (std::max<size_t>(n, 1) * sizeof(float) + 63) / 64 * 64;
        auto* wide = static_cast<float*>(std::aligned_alloc(64, cap));
        if (!wide) return fail(error_, Status::OutOfMemory, "value %u: out of memory widening its fp16 constant", t->id_out());
        st.owned.emplace_back(wide, &std::free);
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, bytes.data() + 2 * i, 2);
          wide[i] = half_bits_to_float_exact(h);
        }
        bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(wide), n * sizeof(float));
      }
      if (bytes.size() < val.bytes())
        return fail(error_, Status::InvalidProgram, "value %u: constant has %zu bytes, its shape needs %zu", t->id_out(),
                    bytes.size(), val.bytes());
      if (!qv && reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0)
        return fail(error_, Status::InvalidProgram, "value %u: constant data is misaligned", t->id_out());
      val.constant = bytes.data();
      val.constant_bytes = bytes.first(val.bytes());
    }
    if (qv)
      KILN_TRY(quant_params(*qv, t->id_out(), val, constant_at));
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
    const NodeKind* kind = node_kind(node->xnode_union_type());
    if (!kind || !kind->io(*node, io_[i]))
      return fail(error_, Status::NotSupported, "node %zu: %s is not supported by kiln's XNNPACK backend", i,
                  node_name(node->xnode_union_type()));
    for (size_t j = 0; j < io_[i].num_in; ++j) {
      if (kind->optional_bias && j == 2 && io_[i].in[j] == kInvalidId) continue;
      KILN_TRY(check_value(st, io_[i].in[j], i, "input"));
    }
    KILN_TRY(check_value(st, io_[i].out, i, "output"));
    if (st.values[io_[i].out].constant || (st.values[io_[i].out].flags & kExternalInput))
      return fail(error_, Status::InvalidProgram, "node %zu writes value %u, a constant or input", i, io_[i].out);
  }
  return quantized_rows(st);
}

// A quantized value's parameters (ExecuTorch's forms for 8da4w / 8da8w).
template <class ConstantAt>
Status Builder::quant_params(const fbx::XNNQuantizedTensorValue& qv, uint32_t id, Value& val, const ConstantAt& constant_at) {
  const fbx::XNNTensorValue& t = *qv.tensor_value();
  const auto dt = t.datatype();
  using D = fbx::XNNDatatype;
  using Q = fbx::XNNQuantParams;
  auto unsupported = [&] {
    return fail(error_, Status::NotSupported, "value %u: %s with %s quantization is not supported by kiln's XNNPACK backend",
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
      return fail(error_, Status::NotSupported, "value %u: int4 groups of %lld over %lld inputs (kiln needs multiples of 32 "
                  "that divide an even input count)", id, static_cast<long long>(g), static_cast<long long>(k));
    const size_t count = static_cast<size_t>(n * (k / g));
    if (p->scale_buffer_idx() != 0) {
      KILN_TRY(constant_at(p->scale_buffer_idx(), id, &sb));
      if (sb.size() < count * 2 || (p->num_scales() != 0 && p->num_scales() != count))
        return fail(error_, Status::InvalidProgram, "value %u: %zu bytes of bf16 scales for %zu groups", id, sb.size(), count);
      val.group_scales = reinterpret_cast<const uint16_t*>(sb.data());
    } else {  // (the deprecated inline bf16 scales: ExecuTorch 1.5 no longer writes them)
      return fail(error_, Status::NotSupported, "value %u: int4 group scales not given as bf16 data", id);
    }
    if (reinterpret_cast<uintptr_t>(val.group_scales) % alignof(uint16_t) != 0)
      return fail(error_, Status::InvalidProgram, "value %u: scales are misaligned", id);
    val.quant = Value::Quant::Int4Groups;
    val.group_size = g;
    return Status::Ok;
  }
  if (dt == D::xnn_datatype_qcint8 && qv.quant_params_type() == Q::PerChannelQuant) {
    const auto* p = qv.quant_params_as_PerChannelQuant();
    if (p->channel_dim() != 0) return unsupported();
    if (p->scale_buffer_idx() != 0) {
      KILN_TRY(constant_at(p->scale_buffer_idx(), id, &sb));
      if (sb.size() < static_cast<size_t>(n) * 4)
        return fail(error_, Status::InvalidProgram, "value %u: %zu bytes of scales for %lld channels", id, sb.size(),
                    static_cast<long long>(n));
      val.channel_scales = reinterpret_cast<const float*>(sb.data());
    } else if (p->scale() && p->scale()->size() == static_cast<size_t>(n)) {
      val.channel_scales = p->scale()->data();
    } else {
      return fail(error_, Status::InvalidProgram, "value %u: no per-channel scales", id);
    }
    if (reinterpret_cast<uintptr_t>(val.channel_scales) % alignof(float) != 0)
      return fail(error_, Status::InvalidProgram, "value %u: scales are misaligned", id);
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
        return fail(error_, Status::NotSupported, "node %zu (%s): reads dynamically quantized rows; kiln runs those only "
                    "in fully connected nodes with int4 or int8 weights", i, node_name(t));
      // int4 weights go to kiln's panels where the CPU's variant has a product on them (read from Signed rows)
      const cpu::Qd8Layout int4_rows = cpu::qd8_gemm_config().qb4w_panels ? cpu::Qd8Layout::Signed : cpu::Qd8Layout::Nibbles;
      const uint8_t layout = static_cast<uint8_t>(w.quant == Value::Quant::Int4Groups ? int4_rows : cpu::Qd8Layout::Plain);
      if (v.min_bytes != 0 && v.rows_layout != layout)
        return fail(error_, Status::NotSupported, "value %u: quantized rows read by int4 and int8 weights alike", io_[i].in[j]);
      const int64_t k = v.dims[v.ndims - 1];
      if (k <= 0) return fail(error_, Status::InvalidProgram, "value %u: empty rows", io_[i].in[j]);
      v.rows_layout = layout;
      v.min_bytes = cpu::qd8_rows_bytes(v.numel / k, k, static_cast<cpu::Qd8Layout>(layout));
    }
  }
  for (size_t i = 0; i < io_.size(); ++i) {  // and are written by a convert from fp32
    const Value& out = st.values[io_[i].out];
    if (out.quant != Value::Quant::DynamicRows) continue;
    const NodeType t = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type();
    if (t != NodeType::XNNConvert || st.values[io_[i].in[0]].quant != Value::Quant::None)
      return fail(error_, Status::NotSupported, "node %zu (%s) writes dynamically quantized rows; kiln expects a convert "
                  "from fp32", i, node_name(t));
    if (out.min_bytes == 0) return fail(error_, Status::NotSupported, "node %zu: quantized rows nobody reads", i);
  }
  return Status::Ok;
}

}  // namespace kiln::backends::xnnpack::detail
