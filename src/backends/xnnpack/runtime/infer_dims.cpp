// The XNNPACK backend's sizes for one call of a dynamic delegate (builder.h).
#include "builder.h"
#include "nodes/node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

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
      return node == SIZE_MAX ? fail(error_, Status::InvalidArgument, "value %u: an input of rank %zu, the payload's is %u",
                                     id, d.size(), v.ndims)
                              : fail(error_, Status::InvalidArgument, "value %u: rank %zu for this call, the payload's "
                                     "is %u (node %zu)", id, d.size(), v.ndims, node);
    int64_t numel = 1;
    bool differs = false;
    for (size_t k = 0; k < d.size(); ++k) {
      if (d[k] < 0) return fail(error_, Status::InvalidArgument, "value %u: negative size", id);
      numel *= d[k];
      differs |= d[k] != v.dims[k];
      v.dims[k] = d[k];
    }
    if (numel > bound[id])
      return fail(error_, Status::InvalidArgument,
                  "value %u: %lld elements for this call, more than the %lld the payload plans (its upper bound)", id,
                  static_cast<long long>(numel), static_cast<long long>(bound[id]));
    v.numel = numel;
    changed[id] = changed[id] || differs;
    return Status::Ok;
  };
  for (size_t a = 0; a < st.num_inputs; ++a) {
    const EValue* e = call_[a];
    if (!e || !e->is_tensor())
      return fail(error_, Status::InvalidArgument, "argument %zu is not a tensor", a);
    const rt::Tensor& t = e->tensor();
    const int64_t one = 1;
    const bool scalar = t.dim == 0 && st.values[st.arg_values[a]].ndims == 1;  // XNNPACK's [1]
    KILN_TRY(set(st.arg_values[a], scalar ? std::span<const int64_t>(&one, 1) : t.shape(), SIZE_MAX));
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
      return fail(error_, Status::NotSupported, "node %zu (%s): kiln's XNNPACK backend cannot change its sizes per call",
                  i, node_name(node->xnode_union_type()));
    };
    auto bad = [&](const char* what) {
      return fail(error_, Status::InvalidArgument, "node %zu (%s): %s for this call's sizes", i,
                  node_name(node->xnode_union_type()), what);
    };
    const NodeKind* kind = node_kind(node->xnode_union_type());
    if (!kind || !kind->infer) return unsupported();
    const ShapeResult r = kind->infer(ShapeContext{st, *node, io, x, n}, d);
    if (r.kind == ShapeResult::Kind::Unsupported) return unsupported();
    if (r.kind == ShapeResult::Kind::Bad) return bad(r.what);
    KILN_TRY(set(io.out, std::span<const int64_t>(d.data(), n), i));
  }
  for (size_t a = 0; a < st.arg_values.size(); ++a) st.arg_numel[a] = st.values[st.arg_values[a]].numel;
  return Status::Ok;
}

}  // namespace kiln::backends::xnnpack::detail
