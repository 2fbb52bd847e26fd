// The XNNPACK payload: build_payload (the builder, payload_builder.h and its
// files), sizes inferred per call (make_sizes_inferred: a payload built at
// the bounds compared with one built elsewhere), delegates into a program.
#include "kiln/backends/xnnpack/payload.h"

#include "kiln/core/error.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "payload_builder.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

namespace kiln::backends::xnnpack {

using detail::PayloadBuilder;
using detail::XType;
namespace fbx = kiln::fb::xnnpack;

Payload build_payload(const graph::Graph& graph, const Region& region, const PayloadOptions& options, Shapes what) {
  return PayloadBuilder(graph, region, options, what == Shapes::Only).build();
}

namespace {

const fbx::XNNGraph* payload_graph(const Payload& p) {
  uint32_t fb_off = 0;
  check(p.bytes.size() >= 30, "internal: payload too short");
  std::memcpy(&fb_off, p.bytes.data() + 10, 4);  // little-endian hosts only (as the writer)
  return fbx::GetXNNGraph(p.bytes.data() + fb_off);
}

// The dims of value `id` in a payload's graph (nullopt if the graph has no such value).
std::optional<std::vector<int64_t>> value_dims(const fbx::XNNGraph* g, uint32_t id) {
  if (!g->xvalues()) return std::nullopt;
  for (const fbx::XValue* v : *g->xvalues()) {
    const fbx::XNNTensorValue* t = v->xvalue_union_as_XNNTensorValue();
    if (!t)
      if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) t = q->tensor_value();
    if (!t || t->id_out() != id) continue;
    std::vector<int64_t> d;
    if (t->dims()) d.assign(t->dims()->begin(), t->dims()->end());
    return d;
  }
  return std::nullopt;
}

template <class V>
bool same_vector(const V* a, const V* b) {
  if (!a || !b) return a == b;
  return a->size() == b->size() && std::equal(a->begin(), a->end(), b->begin());
}

}  // namespace

std::vector<int32_t> make_sizes_inferred(Payload& at_bounds, const Payload& elsewhere) {
  const fbx::XNNGraph* a = payload_graph(at_bounds);
  const fbx::XNNGraph* b = payload_graph(elsewhere);
  std::set<int32_t> bad;
  const auto* an = a->xnodes();
  const auto* bn = b->xnodes();
  const size_t na = an ? an->size() : 0, nb = bn ? bn->size() : 0;
  // Constants must not depend on the sizes. When one does (a constant the builder sized from a
  // symbolic dim), which node reads it is not traced here: the region's nodes all stay portable.
  std::map<uint32_t, std::vector<int64_t>> const_dims_a, const_dims_b;
  auto collect = [](const fbx::XNNGraph* g, std::map<uint32_t, std::vector<int64_t>>& out) {
    if (!g->xvalues()) return;
    for (const fbx::XValue* v : *g->xvalues()) {
      const fbx::XNNTensorValue* t = v->xvalue_union_as_XNNTensorValue();
      if (!t)
        if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) t = q->tensor_value();
      if (!t || t->constant_buffer_idx() == 0) continue;
      std::vector<int64_t> d;
      if (t->dims()) d.assign(t->dims()->begin(), t->dims()->end());
      out[t->id_out()] = std::move(d);
    }
  };
  collect(a, const_dims_a);
  collect(b, const_dims_b);
  const bool constants_differ = const_dims_a != const_dims_b;
  for (size_t i = 0; i < std::min(na, nb); ++i) {
    const fbx::XNode* x = an->Get(static_cast<flatbuffers::uoffset_t>(i));
    const fbx::XNode* y = bn->Get(static_cast<flatbuffers::uoffset_t>(i));
    const auto handle = static_cast<int32_t>(x->debug_handle());
    if (x->xnode_union_type() != y->xnode_union_type() || x->debug_handle() != y->debug_handle()) {
      bad.insert(handle);
      break;  // the two payloads no longer line up
    }
    if (constants_differ) bad.insert(handle);
    switch (x->xnode_union_type()) {
      case XType::XNNStaticReshape: {
        const auto* p = x->xnode_union_as_XNNStaticReshape();
        const auto* q = y->xnode_union_as_XNNStaticReshape();
        if (!p->new_shape() || !q->new_shape() || p->new_shape()->size() != q->new_shape()->size()) {
          bad.insert(handle);
          break;
        }
        std::vector<uint32_t> differ;
        for (uint32_t k = 0; k < p->new_shape()->size(); ++k)
          if (p->new_shape()->Get(k) != q->new_shape()->Get(k)) differ.push_back(k);
        if (differ.size() > 1) {
          bad.insert(handle);
        } else if (differ.size() == 1) {  // the one size XNNPACK infers per call
          const auto* at = p->new_shape()->Data() + differ[0] * sizeof(uint32_t);
          const auto offset = static_cast<size_t>(at - reinterpret_cast<const uint8_t*>(at_bounds.bytes.data()));
          std::memset(at_bounds.bytes.data() + offset, 0, sizeof(uint32_t));
        }
        break;
      }
      case XType::XNNStaticSlice: {
        // A size that differs is allowed where the slice takes all of a dim that changes: it becomes
        // 0, "to the end" (XNNPACK's reshape of a slice, kiln's runtime).
        const auto *p = x->xnode_union_as_XNNStaticSlice(), *q = y->xnode_union_as_XNNStaticSlice();
        if (!same_vector(p->offsets(), q->offsets()) || !p->sizes() || !q->sizes() ||
            p->sizes()->size() != q->sizes()->size()) {
          bad.insert(handle);
          break;
        }
        const std::optional<std::vector<int64_t>> in_a = value_dims(a, p->input_id()), in_b = value_dims(b, q->input_id());
        for (uint32_t k = 0; k < p->sizes()->size(); ++k) {
          if (p->sizes()->Get(k) == q->sizes()->Get(k)) continue;
          const bool whole = in_a && in_b && k < in_a->size() && k < in_b->size() && p->offsets()->Get(k) == 0 &&
                             static_cast<int64_t>(p->sizes()->Get(k)) == (*in_a)[k] &&
                             static_cast<int64_t>(q->sizes()->Get(k)) == (*in_b)[k];
          if (!whole) {
            bad.insert(handle);
            break;
          }
          const auto* at = p->sizes()->Data() + k * sizeof(uint32_t);
          std::memset(at_bounds.bytes.data() + (at - reinterpret_cast<const uint8_t*>(at_bounds.bytes.data())), 0,
                      sizeof(uint32_t));
        }
        break;
      }
      case XType::XNNStaticTranspose:
        if (!same_vector(x->xnode_union_as_XNNStaticTranspose()->perm(), y->xnode_union_as_XNNStaticTranspose()->perm()))
          bad.insert(handle);
        break;
      case XType::XNNStaticConstantPad: {
        const auto *p = x->xnode_union_as_XNNStaticConstantPad(), *q = y->xnode_union_as_XNNStaticConstantPad();
        if (!same_vector(p->pre_paddings(), q->pre_paddings()) || !same_vector(p->post_paddings(), q->post_paddings()))
          bad.insert(handle);
        break;
      }
      case XType::XNNConcatenate2: case XType::XNNConcatenate3: case XType::XNNConcatenate4:
      case XType::XNNConcatenate5:
        if (static_cast<const fbx::_XNNCat*>(x->xnode_union())->axis() != static_cast<const fbx::_XNNCat*>(y->xnode_union())->axis())
          bad.insert(handle);
        break;
      case XType::XNNFullyConnected: case XType::XNNBatchMatrixMultiply: case XType::XNNAdd: case XType::XNNSubtract:
      case XType::XNNMultiply: case XType::XNNDiv: case XType::XNNMinimum: case XType::XNNMaximum:
      case XType::XNNSoftmax: case XType::XNNSigmoid: case XType::XNNClamp: case XType::XNNSquare:
      case XType::XNNSquareRoot: case XType::XNNNegate: case XType::XNNAbs: case XType::XNNFloor:
      case XType::XNNCeiling: case XType::XNNHardswish: case XType::XNNReciprocalSquareRoot: case XType::XNNGelu:
      case XType::XNNTanh: case XType::XNNExp: case XType::XNNLog: case XType::XNNSin: case XType::XNNCos:
      case XType::XNNCopy: case XType::XNNConvert: case XType::XNNELU: case XType::XNNLeakyReLU:
        break;  // sizes follow their inputs' (XNNPACK's reshape, kiln's runtime)
      default:
        bad.insert(handle);  // convolutions, pooling, resizing: static sizes only
        break;
    }
  }
  if (na != nb && na > 0) bad.insert(static_cast<int32_t>(an->Get(static_cast<flatbuffers::uoffset_t>(std::min(na, nb) == na ? na - 1 : std::min(na, nb)))->debug_handle()));
  return {bad.begin(), bad.end()};
}

size_t add_named_data(pte::Program& program, const std::vector<pte::NamedBlob>& blobs) {
  size_t added = 0;
  for (const auto& blob : blobs) {
    auto it = std::find_if(program.named_data.begin(), program.named_data.end(),
                           [&](const pte::NamedBlob& n) { return n.key == blob.key; });
    if (it != program.named_data.end()) {
      check(it->data.size == blob.data.size, "named data key '{}' holds {} bytes; another payload gives {}", blob.key,
            it->data.size, blob.data.size);
      continue;
    }
    program.named_data.push_back(blob);
    ++added;
  }
  return added;
}

int32_t add_delegate(pte::Program& program, size_t plan, Payload payload) {
  check(plan < program.plans.size(), "program has no plan {}", plan);
  add_named_data(program, payload.named_data);
  auto payload_index = static_cast<uint32_t>(program.delegate_payloads.size());
  program.delegate_payloads.push_back(pte::DataBlob::from_bytes(std::move(payload.bytes)));
  auto& delegates = program.plans[plan].delegates;
  delegates.push_back({std::string(kBackendId), payload_index, {}});
  return static_cast<int32_t>(delegates.size() - 1);
}

}  // namespace kiln::backends::xnnpack
