// to-edge rewrites of data movement: diagonals, as_strided, index_fill/index_add
// (index_put), circular padding (slices and cat), nonzero (refused: a data-dependent size).
//
// Every target is an out-variant op ExecuTorch's portable kernel library has too, so
// both runtimes run what these produce.
#include "lowerer.h"

namespace kiln::passes::detail {

namespace {

std::vector<int64_t> with_dim(std::vector<int64_t> sizes, int64_t dim, int64_t size) {
  sizes[static_cast<size_t>(dim)] = size;
  return sizes;
}

}  // namespace

bool Lowerer::lower_data(const Node& n) {
  const std::string& t = n.target;
  // x[start:end] along dim (x itself when that is all of it)
  auto slice = [&](ValueId x, int64_t dim, int64_t start, int64_t end, std::string_view hint) {
    const TensorMeta xm = meta_of(x);
    if (start == 0 && end == xm.sizes.at(static_cast<size_t>(dim))) return x;
    return emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)), NA("start", int_arg(start)),
                                           NA("end", int_arg(end)), NA("step", int_arg(1))},
                contiguous(xm.dtype, with_dim(xm.sizes, dim, end - start)), hint);
  };

  if (t == "aten.diagonal.default" || t == "aten.linalg_diagonal.default" || t == "aten.diagonal_copy.default") {
    // a view in the default IR; diagonal_copy in the edge dialect (linalg.diagonal: dims -2, -1 by default)
    const bool linalg = t == "aten.linalg_diagonal.default";
    const ValueId x = tensor_in(n, linalg ? "A" : "self");
    const size_t rank = meta_of(x).sizes.size();
    const int64_t d1 = wrap_dim(int_in(n, "dim1", linalg ? -2 : 0), rank);
    const int64_t d2 = wrap_dim(int_in(n, "dim2", linalg ? -1 : 1), rank);
    bind(n, emit("aten.diagonal_copy.default", {NA("self", tensor_arg(x)), NA("offset", int_arg(int_in(n, "offset", 0))),
                                                NA("dim1", int_arg(d1)), NA("dim2", int_arg(d2))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.as_strided.default") {  // a view of self's storage; a copy in the edge dialect
    std::vector<NamedArgument> args{NA("self", tensor_arg(tensor_in(n, "self"))), NA("size", ints_arg(ints_in(n, "size"))),
                                    NA("stride", ints_arg(ints_in(n, "stride")))};
    if (const Argument* o = opt(n, "storage_offset"); o && o->kind != Argument::Kind::None)
      args.push_back(NA("storage_offset", int_arg(int_in(n, "storage_offset"))));
    bind(n, emit("aten.as_strided_copy.default", std::move(args), out_meta(n)));
    return true;
  }
  if (t == "aten.index_fill.int_Scalar" || t == "aten.index_fill.int_Tensor" || t == "aten.index_add.default") {
    // index_put along dim: index_fill assigns the value (expanded to the indexed rows), index_add
    // accumulates source * alpha (repeated indices add up). A 0-d self is indexed as [1].
    const bool add = t == "aten.index_add.default";
    ValueId self = tensor_in(n, "self");
    const TensorMeta om = out_meta(n);
    const bool scalar = meta_of(self).sizes.empty();
    if (scalar) self = view(self, {1});
    const std::vector<int64_t> sizes = meta_of(self).sizes;
    const int64_t dim = wrap_dim(int_in(n, "dim"), sizes.size());
    if (dim < 0 || dim >= static_cast<int64_t>(sizes.size())) unsupported(n, "dim out of range");
    ValueId index = tensor_in(n, "index");
    const int64_t count = meta_of(index).numel();
    index = view(index, {count});
    const std::vector<int64_t> rows = with_dim(sizes, dim, count);  // the indexing result's shape
    ValueId values;
    if (add) {
      values = view(tensor_in(n, "source"), rows);
      const Argument* alpha = opt(n, "alpha");
      const bool one = !alpha || alpha->kind == Argument::Kind::None ||
                       (alpha->kind == Argument::Kind::Int && std::get<int64_t>(alpha->payload) == 1) ||
                       (alpha->kind == Argument::Kind::Float && std::get<double>(alpha->payload) == 1.0) ||
                       (alpha->kind == Argument::Kind::Bool && std::get<bool>(alpha->payload));
      if (!one)
        values = emit("aten.mul.Scalar", {NA("self", tensor_arg(values)), NA("other", *alpha)},
                      contiguous(om.dtype, rows), "scaled");
    } else {
      const Argument& v = arg(n, "value");
      values = v.kind == Argument::Kind::Tensor ? convert(mapped(std::get<ValueId>(v.payload)), om.dtype)
                                                : scalar_tensor(v, om.dtype);
      if (!meta_of(values).sizes.empty()) values = view(values, {});
      values = expand(values, rows);
    }
    std::vector<std::optional<ValueId>> idx(static_cast<size_t>(dim), std::nullopt);
    idx.emplace_back(index);
    ValueId y = emit("aten.index_put.default",
                     {NA("self", tensor_arg(self)), NA("indices", {Argument::Kind::OptionalTensors, std::move(idx)}),
                      NA("values", tensor_arg(values)), NA("accumulate", bool_arg(add))},
                     contiguous(om.dtype, sizes), scalar ? "index_put" : "");
    bind(n, scalar ? view(y, {}) : y);
    return true;
  }
  if (t == "aten.pad.default") {
    const Argument* mode = opt(n, "mode");
    if (!mode || mode->kind != Argument::Kind::String || std::get<std::string>(mode->payload) != "circular") return false;
    // torch's circular padding: crop the negative pads, then per padded dim (pad[2i], pad[2i+1] for dim
    // rank-1-i) wrap: the last `left` elements before, the first `right` after (corners follow).
    ValueId x = tensor_in(n, "self");
    const std::vector<int64_t> pad = ints_in(n, "pad");
    const size_t rank = meta_of(x).sizes.size();
    if (pad.size() % 2 != 0 || pad.size() / 2 > rank) unsupported(n, "circular padding needs a pair per padded dim");
    const size_t k = pad.size() / 2;
    if (meta_of(x).numel() == 0) {  // nothing to wrap: an empty tensor of the padded shape (ExecuTorch's cat
      // sizes its out from the non-empty inputs only)
      const TensorMeta m = out_meta(n);
      bind(n, emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", int_arg(0))}, m));
      return true;
    }
    for (size_t i = 0; i < k; ++i) {
      const int64_t dim = static_cast<int64_t>(rank - 1 - i), size = meta_of(x).sizes[rank - 1 - i];
      x = slice(x, dim, std::max<int64_t>(-pad[2 * i], 0), size - std::max<int64_t>(-pad[2 * i + 1], 0), "crop");
    }
    for (size_t i = 0; i < k; ++i) {
      const int64_t dim = static_cast<int64_t>(rank - 1 - i), c = meta_of(x).sizes[rank - 1 - i];
      const int64_t left = std::max<int64_t>(pad[2 * i], 0), right = std::max<int64_t>(pad[2 * i + 1], 0);
      if (left > c || right > c)
        unsupported(n, fmt::format("circular padding ({}, {}) wraps more than once around a dim of size {}", left, right, c));
      if (left == 0 && right == 0) continue;
      std::vector<ValueId> parts;
      if (left > 0) parts.push_back(slice(x, dim, c - left, c, "wrap_left"));
      parts.push_back(x);
      if (right > 0) parts.push_back(slice(x, dim, 0, right, "wrap_right"));
      const TensorMeta xm = meta_of(x);
      x = emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))},
               contiguous(xm.dtype, with_dim(xm.sizes, dim, c + left + right)), "circular");
    }
    bind(n, x);
    return true;
  }
  if (t == "aten.nonzero.default")
    unsupported(n, "nonzero's output size depends on the data; kiln plans every size ahead of time (ExecuTorch's "
                   "own program of it runs in kiln's runtime)");
  return false;
}

}  // namespace kiln::passes::detail
