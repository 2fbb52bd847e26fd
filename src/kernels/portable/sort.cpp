// Ordering along one dim: sort.values (stable; NaN sorts above every number, as
// torch) and topk.values (the k largest or smallest, in order).
//
// Each line along `dim` is ordered through the int64 indices out itself (a
// strided view of it), so nothing is allocated; the values are then gathered.
#include "util/register.h"
#include "util/shape_checks.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace kiln::rt::kernels {
namespace {

// A random-access iterator over every `stride`-th int64.
struct StridedIt {
  using iterator_category = std::random_access_iterator_tag;
  using value_type = int64_t;
  using difference_type = std::ptrdiff_t;
  using pointer = int64_t*;
  using reference = int64_t&;
  int64_t* p = nullptr;
  int64_t s = 1;
  reference operator*() const { return *p; }
  reference operator[](difference_type i) const { return p[i * s]; }
  StridedIt& operator++() { p += s; return *this; }
  StridedIt operator++(int) { StridedIt t = *this; p += s; return t; }
  StridedIt& operator--() { p -= s; return *this; }
  StridedIt operator--(int) { StridedIt t = *this; p -= s; return t; }
  StridedIt& operator+=(difference_type i) { p += i * s; return *this; }
  StridedIt& operator-=(difference_type i) { p -= i * s; return *this; }
  friend StridedIt operator+(StridedIt a, difference_type i) { return a += i; }
  friend StridedIt operator+(difference_type i, StridedIt a) { return a += i; }
  friend StridedIt operator-(StridedIt a, difference_type i) { return a -= i; }
  friend difference_type operator-(const StridedIt& a, const StridedIt& b) { return (a.p - b.p) / a.s; }
  friend bool operator==(const StridedIt& a, const StridedIt& b) { return a.p == b.p; }
  friend bool operator!=(const StridedIt& a, const StridedIt& b) { return a.p != b.p; }
  friend bool operator<(const StridedIt& a, const StridedIt& b) { return a.p < b.p; }
  friend bool operator>(const StridedIt& a, const StridedIt& b) { return a.p > b.p; }
  friend bool operator<=(const StridedIt& a, const StridedIt& b) { return a.p <= b.p; }
  friend bool operator>=(const StridedIt& a, const StridedIt& b) { return a.p >= b.p; }
};

// x before y in ascending order (NaN last); ties by index keep the sort stable.
template <typename C>
inline bool before(C x, C y, bool descending) {
  if constexpr (std::is_floating_point_v<C>) {
    const bool nx = x != x, ny = y != y;
    if (nx || ny) return descending ? (nx && !ny) : (!nx && ny);
  }
  return descending ? x > y : x < y;
}

struct LineGeometry {
  int64_t outer = 1, n = 1, inner = 1;
};

LineGeometry lines_of(const Tensor& t, int64_t dim) {
  LineGeometry g;
  if (t.dim == 0) return g;
  for (int64_t i = 0; i < dim; ++i) g.outer *= t.sizes[i];
  g.n = t.sizes[dim];
  for (int64_t i = dim + 1; i < t.dim; ++i) g.inner *= t.sizes[i];
  return g;
}

// Orders each line of `self` along dim into (values, indices), keeping the first k.
void order_lines(KernelContext& ctx, const char* name, const Tensor& self, int64_t dim, int64_t k, bool descending,
                 Tensor& values, Tensor& indices) {
  const LineGeometry g = lines_of(self, dim);
  dispatch<kRealTypes | kBoolTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x = self.data_as<const T>();
    T* v = values.data_as<T>();
    int64_t* ix = indices.data_as<int64_t>();
    for (int64_t o = 0; o < g.outer; ++o)
      for (int64_t i = 0; i < g.inner; ++i) {
        const T* line = x + o * g.n * g.inner + i;
        auto cmp = [&](int64_t a, int64_t b) {
          const C ca = convert<C>(line[a * g.inner]), cb = convert<C>(line[b * g.inner]);
          if (before(ca, cb, descending)) return true;
          if (before(cb, ca, descending)) return false;
          return a < b;
        };
        StridedIt first{ix + o * k * g.inner + i, g.inner};
        if (k == g.n) {
          for (int64_t j = 0; j < g.n; ++j) first[j] = j;
          std::sort(first, first + g.n, cmp);
        } else {  // insertion into the k best so far
          int64_t have = 0;
          for (int64_t j = 0; j < g.n; ++j) {
            if (have == k && !cmp(j, first[k - 1])) continue;
            int64_t pos = have < k ? have++ : k - 1;
            while (pos > 0 && cmp(j, first[pos - 1])) {
              first[pos] = first[pos - 1];
              --pos;
            }
            first[pos] = j;
          }
        }
        T* vline = v + o * k * g.inner + i;
        for (int64_t j = 0; j < k; ++j) vline[j * g.inner] = line[first[j] * g.inner];
      }
  });
  (void)ctx;
  (void)name;
}

bool check_outs(KernelContext& ctx, const char* name, const Tensor& self, Tensor& values, Tensor& indices) {
  if (!check_out_dtype(ctx, values, self.dtype, name) || !check_out_dtype(ctx, indices, ScalarType::Long, name))
    return false;
  return check_no_overlap(ctx, name, values, self, "self") && check_no_overlap(ctx, name, indices, self, "self");
}

void sort_values(KernelContext& ctx, const Tensor& self, int64_t dim, bool descending, Tensor& values,
                 Tensor& indices) {
  const char* name = "aten::sort.values";
  if (!normalize_dim(ctx, name, dim, self.dim, &dim) || !check_outs(ctx, name, self, values, indices)) return;
  if (!resize_out(ctx, values, self.shape(), name) || !resize_out(ctx, indices, self.shape(), name)) return;
  if (self.numel == 0) return;
  order_lines(ctx, name, self, dim, self.dim == 0 ? 1 : self.sizes[dim], descending, values, indices);
}

void topk_values(KernelContext& ctx, const Tensor& self, int64_t k, int64_t dim, bool largest, bool /*sorted*/,
                 Tensor& values, Tensor& indices) {
  const char* name = "aten::topk.values";
  if (!normalize_dim(ctx, name, dim, self.dim, &dim) || !check_outs(ctx, name, self, values, indices)) return;
  const int64_t n = self.dim == 0 ? 1 : self.sizes[dim];
  if (k < 0 || k > n) {
    ctx.fail(Status::InvalidArgument, "%s: selected index k (%lld) out of range for a dimension of size %lld", name,
             static_cast<long long>(k), static_cast<long long>(n));
    return;
  }
  int64_t shape[kMaxDims];
  for (int i = 0; i < self.dim; ++i) shape[i] = i == dim ? k : self.sizes[i];
  const std::span<const int64_t> s{shape, static_cast<size_t>(self.dim)};
  if (!resize_out(ctx, values, s, name) || !resize_out(ctx, indices, s, name)) return;
  if (values.numel == 0) return;
  order_lines(ctx, name, self, dim, k, largest, values, indices);
}

}  // namespace

KILN_KERNEL(sort_values, sort_values);
KILN_KERNEL(topk_values, topk_values);

}  // namespace kiln::rt::kernels
