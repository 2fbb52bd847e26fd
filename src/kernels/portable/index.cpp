// Advanced indexing: index.Tensor (gather by a list of optional index tensors)
// and index_put (scatter into it, or accumulate).
//
// The indices are integer tensors (one dim each) or bool/uint8 masks (as many
// dims as they have, standing for their true positions), broadcast together; an
// IndexPlan describes the result's layout and walks its positions in self.
// nonzero: the coordinates of the nonzero elements (a data-dependent row count).
#include "util/register.h"
#include "util/shape_checks.h"

#include <cstring>
#include <span>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// One index tensor of an advanced index: an integer tensor indexing one dim of
// self, or a bool/uint8 mask covering `span` dims (standing for the positions of
// its true elements).
struct IndexSource {
  const Tensor* t = nullptr;
  int self_dim = 0;
  int span = 1;
  bool mask = false;
  int64_t nnz = 0;              // masks: true elements
  int64_t dim_size = 0;         // integer: size of the indexed dim
  int64_t self_stride = 0;      // elements of self per index step (masks: per flat mask position)
  int64_t bstride[kMaxDims];    // element strides over the broadcast index shape (0: broadcast)
  int64_t offset = 0;           // iteration state: element of t (integer)
  int64_t cur_j = -1, cur_f = -1;  // iteration state (mask): j-th true element is at flat position f
};

struct IndexPlan {
  int nsrc = 0;
  IndexSource src[kMaxDims];
  int brank = 0;
  int64_t bsizes[kMaxDims];
  int64_t bnumel = 1;
  int prank = 0;  // prefix dims of self kept before the index result (adjacent indices)
  int64_t psizes[kMaxDims], pstrides[kMaxDims];
  int qrank = 0;  // dims of self kept after the index result
  int64_t qsizes[kMaxDims], qstrides[kMaxDims];
  int out_rank = 0;
  int64_t out_sizes[kMaxDims];
};

// Flat position of the j-th true element of a mask; j moves forward or restarts at 0.
int64_t mask_position(IndexSource& s, int64_t j) {
  if (j == s.cur_j) return s.cur_f;
  const auto* m = s.t->data_as<const uint8_t>();
  int64_t f = 0, need = j + 1;
  if (s.cur_j >= 0 && j > s.cur_j) {
    f = s.cur_f + 1;
    need = j - s.cur_j;
  }
  for (; f < s.t->numel; ++f)
    if (m[f] != 0 && --need == 0) break;
  s.cur_j = j;
  s.cur_f = f;
  return f;
}

bool build_index_plan(KernelContext& ctx, const char* op, const Tensor& self, OptionalTensorList indices,
                      IndexPlan& p) {
  std::span<Tensor* const> list = indices.items;
  if (list.empty()) {
    ctx.fail(Status::InvalidArgument, "%s: at least one index must be provided", op);
    return false;
  }
  int64_t st[kMaxDims];
  contiguous_strides(self.dim, self.sizes, st);
  bool indexed[kMaxDims] = {};
  int d = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Tensor* t = list[i];
    const int need = t == nullptr ? 1 : (t->dtype == ScalarType::Bool || t->dtype == ScalarType::Byte) ? t->dim : 1;
    if (need < 0 || d + need > self.dim) {
      ctx.fail(Status::InvalidArgument, "%s: too many indices for tensor of dimension %d", op, self.dim);
      return false;
    }
    if (t == nullptr) {
      ++d;
      continue;
    }
    IndexSource& s = p.src[p.nsrc];
    s.t = t;
    s.self_dim = d;
    if (t->dtype == ScalarType::Bool || t->dtype == ScalarType::Byte) {
      if (t->dim == 0) {
        ctx.fail(Status::NotSupported, "%s: 0-dim boolean indices are not supported", op);
        return false;
      }
      for (int c = 0; c < t->dim; ++c)
        if (t->sizes[c] != self.sizes[d + c]) {
          ctx.fail(Status::InvalidArgument, "%s: the shape of the mask %s at index %zu does not match the shape of "
                   "the indexed tensor %s", op, ShapeText(t->shape()).buf, i, ShapeText(self.shape()).buf);
          return false;
        }
      s.mask = true;
      s.span = t->dim;
      const auto* m = t->data_as<const uint8_t>();
      s.nnz = 0;
      for (int64_t k = 0; k < t->numel; ++k) s.nnz += m[k] != 0;
      s.self_stride = st[d + t->dim - 1];  // self is contiguous: flat mask position * innermost stride
    } else if (t->dtype == ScalarType::Long || t->dtype == ScalarType::Int) {
      s.mask = false;
      s.span = 1;
      s.dim_size = self.sizes[d];
      s.self_stride = st[d];
    } else {
      ctx.fail(Status::InvalidArgument, "%s: tensors used as indices must be long, int, byte or bool tensors, got %s",
               op, dtype_str(t->dtype));
      return false;
    }
    for (int c = 0; c < s.span; ++c) indexed[d + c] = true;
    d += s.span;
    ++p.nsrc;
  }
  // broadcast shape of the index tensors (a mask counts as a 1-d tensor of its true elements)
  p.brank = 0;
  for (int k = 0; k < p.nsrc; ++k) {
    const int r = p.src[k].mask ? 1 : p.src[k].t->dim;
    if (r > p.brank) p.brank = r;
  }
  for (int j = 0; j < p.brank; ++j) p.bsizes[j] = 1;
  for (int k = 0; k < p.nsrc; ++k) {
    IndexSource& s = p.src[k];
    const int r = s.mask ? 1 : s.t->dim;
    const int64_t* sizes = s.mask ? &s.nnz : s.t->sizes;
    int64_t own[kMaxDims];
    own[0] = 1;
    if (!s.mask) contiguous_strides(r, sizes, own);
    for (int j = 0; j < p.brank; ++j) s.bstride[j] = 0;
    for (int j = 0; j < r; ++j) {
      const int bj = p.brank - r + j;
      const int64_t n = sizes[j];
      if (p.bsizes[bj] == 1) {
        p.bsizes[bj] = n;
      } else if (n != 1 && n != p.bsizes[bj]) {
        ctx.fail(Status::InvalidArgument, "%s: shape mismatch: indexing tensors could not be broadcast together", op);
        return false;
      }
      s.bstride[bj] = n == 1 ? 0 : own[j];
    }
  }
  p.bnumel = 1;
  for (int j = 0; j < p.brank; ++j) p.bnumel *= p.bsizes[j];
  // result layout: [prefix dims] + broadcast shape + [rest] when the indexed dims are
  // adjacent, else broadcast shape + [all non-indexed dims]
  int first = -1, last = -1;
  for (int i = 0; i < self.dim; ++i)
    if (indexed[i]) {
      if (first < 0) first = i;
      last = i;
    }
  bool adjacent = true;
  for (int i = first; first >= 0 && i <= last; ++i) adjacent = adjacent && indexed[i];
  p.prank = p.qrank = 0;
  for (int i = 0; i < self.dim; ++i) {
    if (indexed[i]) continue;
    if (adjacent && i < first) {
      p.psizes[p.prank] = self.sizes[i];
      p.pstrides[p.prank++] = st[i];
    } else {
      p.qsizes[p.qrank] = self.sizes[i];
      p.qstrides[p.qrank++] = st[i];
    }
  }
  p.out_rank = p.prank + p.brank + p.qrank;
  if (p.out_rank > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return false;
  }
  int n = 0;
  for (int i = 0; i < p.prank; ++i) p.out_sizes[n++] = p.psizes[i];
  for (int i = 0; i < p.brank; ++i) p.out_sizes[n++] = p.bsizes[i];
  for (int i = 0; i < p.qrank; ++i) p.out_sizes[n++] = p.qsizes[i];
  return true;
}

// An out sharing memory with an index tensor (see check_no_overlap).
bool check_no_index_overlap(KernelContext& ctx, const char* op, const Tensor& out, const IndexPlan& p) {
  for (int k = 0; k < p.nsrc; ++k)
    if (!check_no_overlap(ctx, op, out, *p.src[k].t, "an index tensor")) return false;
  return true;
}

// Every integer index within [-size, size) of its dim.
bool check_index_ranges(KernelContext& ctx, const char* op, const IndexPlan& p) {
  for (int k = 0; k < p.nsrc; ++k) {
    const IndexSource& s = p.src[k];
    if (s.mask) continue;
    if (auto bad = index_outside(*s.t, -s.dim_size, s.dim_size)) {
      ctx.fail(Status::OutOfRange, "%s: index %lld is out of bounds for dimension %d with size %lld", op,
               static_cast<long long>(*bad), s.self_dim, static_cast<long long>(s.dim_size));
      return false;
    }
  }
  return true;
}

// Calls fn(self_offset, pidx, bidx) for every (prefix, broadcast) position of
// the plan in result order; self_offset (elements) is where that position's
// block of the remaining dims starts in self. Index ranges must be checked.
template <typename Fn>
void for_each_index_position(IndexPlan& p, Fn&& fn) {
  int64_t pnumel = 1;
  for (int i = 0; i < p.prank; ++i) pnumel *= p.psizes[i];
  int64_t pidx[kMaxDims] = {};
  int64_t poff = 0;
  for (int64_t pi = 0; pi < pnumel; ++pi) {
    int64_t bidx[kMaxDims] = {};
    for (int k = 0; k < p.nsrc; ++k) {
      p.src[k].offset = 0;
      p.src[k].cur_j = -1;
    }
    for (int64_t bi = 0; bi < p.bnumel; ++bi) {
      int64_t off = poff;
      for (int k = 0; k < p.nsrc; ++k) {
        IndexSource& s = p.src[k];
        if (s.mask) {
          const int64_t j = s.nnz == 1 ? 0 : bidx[p.brank - 1];
          off += mask_position(s, j) * s.self_stride;
        } else {
          int64_t v = read_index(*s.t, s.offset);
          if (v < 0) v += s.dim_size;
          off += v * s.self_stride;
        }
      }
      fn(off, static_cast<const int64_t*>(pidx), static_cast<const int64_t*>(bidx));
      for (int j = p.brank - 1; j >= 0; --j) {  // advance the broadcast odometer
        for (int k = 0; k < p.nsrc; ++k) p.src[k].offset += p.src[k].bstride[j];
        if (++bidx[j] < p.bsizes[j]) break;
        for (int k = 0; k < p.nsrc; ++k) p.src[k].offset -= p.src[k].bstride[j] * p.bsizes[j];
        bidx[j] = 0;
      }
    }
    for (int j = p.prank - 1; j >= 0; --j) {  // advance the prefix odometer
      poff += p.pstrides[j];
      if (++pidx[j] < p.psizes[j]) break;
      poff -= p.pstrides[j] * p.psizes[j];
      pidx[j] = 0;
    }
  }
}

void index_tensor_out(KernelContext& ctx, const Tensor& self, OptionalTensorList indices, Tensor& out) {
  const char* op = "aten::index.Tensor_out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  IndexPlan p;
  if (!build_index_plan(ctx, op, self, indices, p)) return;
  if (!prepare_out(ctx, op, out, {p.out_sizes, static_cast<size_t>(p.out_rank)})) return;
  if (out.numel == 0 || !check_no_index_overlap(ctx, op, out, p) || !check_no_overlap(ctx, op, out, self, "self") ||
      !check_index_ranges(ctx, op, p))
    return;
  const int es = element_size(self.dtype);
  int64_t qdst[kMaxDims];
  contiguous_strides(p.qrank, p.qsizes, qdst);
  StridedPlan qplan;
  plan_strided(qplan, p.qrank, p.qsizes, qdst, es, p.qstrides, es);
  int64_t qcount = 1;
  for (int i = 0; i < p.qrank; ++i) qcount *= p.qsizes[i];
  const auto* base = static_cast<const char*>(self.data);
  auto* dst = static_cast<char*>(out.data);
  for_each_index_position(p, [&](int64_t off, const int64_t*, const int64_t*) {
    copy_with_plan(qplan, dst, base + off * es, es);
    dst += qcount * es;
  });
}

// dst[i] += src[i] in T's arithmetic (float for half/bfloat16, wrapping for integers, or for bool).
template <typename T>
void add_row(char* dst, const char* src, int64_t n, int64_t dst_step, int64_t src_step) {
  for (int64_t i = 0; i < n; ++i) {
    T a, b, r;
    std::memcpy(&a, dst + i * dst_step, sizeof(T));
    std::memcpy(&b, src + i * src_step, sizeof(T));
    if constexpr (std::is_same_v<T, bool>) {
      r = a || b;
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      r = convert<T>(convert<float>(a) + convert<float>(b));
    } else if constexpr (std::is_integral_v<T>) {
      r = static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    } else {
      r = a + b;
    }
    std::memcpy(dst + i * dst_step, &r, sizeof(T));
  }
}

// index_put.out: out <- self, then out[indices] <- values (broadcast to the
// indexing result), or += with accumulate.
void index_put_out(KernelContext& ctx, const Tensor& self, OptionalTensorList indices, const Tensor& values,
                   bool accumulate, Tensor& out) {
  const char* op = "aten::index_put.out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  if (values.dtype != self.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: index put requires the source and destination dtypes match, got %s for "
             "the destination and %s for the source", op, dtype_str(self.dtype), dtype_str(values.dtype));
    return;
  }
  ConvertRowFn add = nullptr;
  if (accumulate) {
    dispatch(self.dtype, [&](auto tag) { add = &add_row<typename decltype(tag)::type>; });
    if (add == nullptr) {
      ctx.fail(Status::NotSupported, "%s: accumulate is not supported for %s", op, dtype_str(self.dtype));
      return;
    }
  }
  IndexPlan p;
  if (!build_index_plan(ctx, op, self, indices, p)) return;
  // values broadcast to the indexing result
  int64_t vst[kMaxDims];
  if (!broadcast_strides(values.dim, values.sizes, p.out_rank, p.out_sizes, vst)) {
    ctx.fail(Status::InvalidArgument, "%s: shape mismatch: value tensor of shape %s cannot be broadcast to indexing "
             "result of shape %s", op, ShapeText(values.shape()).buf,
             ShapeText({p.out_sizes, static_cast<size_t>(p.out_rank)}).buf);
    return;
  }
  if (!prepare_out(ctx, op, out, self.shape()) || !check_no_index_overlap(ctx, op, out, p) ||
      !check_no_overlap(ctx, op, out, values, "values"))
    return;
  copy_bytes(self, out);
  int64_t result_numel = 1;
  for (int i = 0; i < p.out_rank; ++i) result_numel *= p.out_sizes[i];
  if (result_numel == 0 || !check_index_ranges(ctx, op, p)) return;
  const int es = element_size(self.dtype);
  StridedPlan qplan;
  plan_strided(qplan, p.qrank, p.qsizes, p.qstrides, es, vst + p.prank + p.brank, es);
  auto* dst = static_cast<char*>(out.data);
  const auto* src = static_cast<const char*>(values.data);
  for_each_index_position(p, [&](int64_t off, const int64_t* pidx, const int64_t* bidx) {
    int64_t voff = 0;
    for (int i = 0; i < p.prank; ++i) voff += pidx[i] * vst[i];
    for (int j = 0; j < p.brank; ++j) voff += bidx[j] * vst[p.prank + j];
    if (add != nullptr) convert_with_plan(qplan, dst + off * es, src + voff * es, add);
    else copy_with_plan(qplan, dst + off * es, src + voff * es, es);
  });
}

// nonzero.out: the coordinates of self's nonzero elements (NaN counts), one row each, in
// element order: out is [count, self.dim] int64, resized within its capacity (the count
// depends on the data; a program plans out at its upper bound, self.numel rows).
void nonzero_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  const char* op = "aten::nonzero.out";
  if (!check_out_dtype(ctx, out, ScalarType::Long, op)) return;
  int64_t count = 0;
  auto for_each_nonzero = [&](auto&& f) {
    return dispatch(self.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = self.data_as<const T>();
      for (int64_t i = 0; i < self.numel; ++i) {
        if (convert<bool>(x[i])) f(i);
      }
    });
  };
  if (!for_each_nonzero([&](int64_t) { ++count; })) {
    ctx.fail(Status::NotSupported, "%s: dtype %s is not supported", op, dtype_str(self.dtype));
    return;
  }
  const int64_t shape[2] = {count, self.dim};
  if (!prepare_out(ctx, op, out, {shape, 2}) || !check_no_overlap(ctx, op, out, self, "self")) return;
  int64_t* o = out.data_as<int64_t>();
  int64_t row = 0;
  for_each_nonzero([&](int64_t flat) {
    for (int d = self.dim - 1; d >= 0; --d) {
      o[row * self.dim + d] = self.sizes[d] == 0 ? 0 : flat % self.sizes[d];
      if (self.sizes[d] != 0) flat /= self.sizes[d];
    }
    ++row;
  });
}

// nonzero's entry: ExecuTorch's programs declare its out in eager's layout (dim order [1, 0],
// column-major); its rows are written row-major, as ExecuTorch's kernel writes them, so out is
// given the identity dim order first (the layout kiln's outputs are read in).
void nonzero_entry(KernelContext& ctx, std::span<EValue*> args) {
  if (args.size() == 2 && args[1] != nullptr && args[1]->tag == EValue::Tag::Tensor && args[1]->scalar.t != nullptr) {
    Tensor& out = *args[1]->scalar.t;
    if (out.dim == 2 && out.dim_order[0] == 1 && out.dim_order[1] == 0) {
      out.dim_order[0] = 0;
      out.dim_order[1] = 1;
      const int64_t shape[2] = {out.sizes[0], out.sizes[1]};
      if (resize_tensor(out, {shape, 2}) != Status::Ok) {
        ctx.fail(Status::InvalidArgument, "aten::nonzero.out: out cannot take a row-major layout");
        return;
      }
    }
  }
  boxing::boxed<::kiln::ops::OpId::nonzero_out, &nonzero_out>(ctx, args);
}

}  // namespace

KILN_KERNEL(index_Tensor_out, index_tensor_out);
KILN_KERNEL(index_put_out, index_put_out);
extern const ::kiln::rt::KernelEntry kiln_kernel_nonzero_out;
const ::kiln::rt::KernelEntry kiln_kernel_nonzero_out{
    static_cast<uint16_t>(::kiln::ops::OpId::nonzero_out), &nonzero_entry,
    boxing::Signature<decltype(&nonzero_out)>::codes, boxing::Signature<decltype(&nonzero_out)>::count};

}  // namespace kiln::rt::kernels
