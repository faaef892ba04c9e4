#include "core/native/views.h"

#include <algorithm>
#include <optional>

#include "core/native/copy.h"

namespace ember::native {

std::optional<Shape> view_strides(const Tensor& x, const Shape& shape) {
  const Shape& old_shape = x.shape();
  const Shape& old_strides = x.strides();
  if (x.numel() == 0 || x.is_contiguous()) return contiguous_strides(shape);
  // Walk chunks of old dims that are contiguous among themselves, matching new dims against
  // each chunk (the same rule as PyTorch's computeStride).
  Shape new_strides(shape.size());
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

Tensor view(const Tensor& x, const Shape& shape_in) {
  const Shape shape = infer_shape(shape_in, x.numel(), "view");
  auto st = view_strides(x, shape);
  EMBER_CHECK(st.has_value(), "view: cannot view a tensor of shape ", x.shape(), " and strides ",
              x.strides(), " as ", shape, " without a copy; use reshape()");
  return make_view(x, shape, *st, x.storage_offset());
}

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  const Shape shape = infer_shape(shape_in, x.numel(), "reshape");
  if (auto st = view_strides(x, shape)) return make_view(x, shape, *st, x.storage_offset());
  Tensor c = clone(x);
  return make_view(c, shape, contiguous_strides(shape), 0);
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  const int64_t nd = x.dim();
  d0 = normalize_dim(d0, nd, "transpose");
  d1 = normalize_dim(d1, nd, "transpose");
  if (nd == 0) return make_view(x, x.shape(), x.strides(), x.storage_offset());
  Shape sh = x.shape(), st = x.strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(x, sh, st, x.storage_offset());
}

Tensor permute(const Tensor& x, const Shape& dims) {
  const int64_t nd = x.dim();
  EMBER_CHECK(int64_t(dims.size()) == nd, "permute: got ", dims.size(), " dims ", dims,
              " for a tensor of shape ", x.shape());
  Shape sh(nd), st(nd);
  std::vector<bool> seen(nd, false);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = normalize_dim(dims[i], nd, "permute");
    EMBER_CHECK(!seen[d], "permute: dim ", d, " repeats in ", dims);
    seen[d] = true;
    sh[i] = x.shape()[d];
    st[i] = x.strides()[d];
  }
  return make_view(x, sh, st, x.storage_offset());
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  EMBER_CHECK(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  dim = normalize_dim(dim, x.dim(), "slice");
  EMBER_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = x.shape()[dim];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = x.shape(), st = x.strides();
  sh[dim] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for a huge step
  // A dim of at most one element never advances, so its stride stays as it was: a huge step
  // would give a stride that kernels overflow when they turn it into bytes.
  if (sh[dim] > 1) {
    int64_t stepped = 0;
    EMBER_CHECK(!__builtin_mul_overflow(st[dim], step, &stepped), "slice: step ", step, " overflows stride ",
                st[dim], " of dim ", dim, " (shape ", x.shape(), ")");
    st[dim] = stepped;
  }
  return make_view(x, sh, st, x.storage_offset() + start * x.strides()[dim]);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  EMBER_CHECK(x.dim() > 0, "select: cannot select from a 0-d tensor");
  dim = normalize_dim(dim, x.dim(), "select");
  const int64_t n = x.shape()[dim];
  EMBER_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", dim,
              " of size ", n, " (shape ", x.shape(), ")");
  if (index < 0) index += n;
  Shape sh = x.shape(), st = x.strides();
  const int64_t off = x.storage_offset() + index * st[dim];
  sh.erase(sh.begin() + dim);
  st.erase(st.begin() + dim);
  return make_view(x, sh, st, off);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  const int64_t nd = int64_t(shape.size());
  EMBER_CHECK(nd >= x.dim(), "expand: cannot expand shape ", x.shape(), " to ", shape,
              " (fewer dimensions)");
  Shape sh(nd), st(nd);
  const int64_t off = nd - x.dim();
  for (int64_t i = 0; i < nd; ++i) {
    if (i < off) {
      EMBER_CHECK(shape[i] >= 0, "expand: invalid size ", shape[i], " in ", shape);
      sh[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = x.shape()[i - off];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    EMBER_CHECK(want >= 0, "expand: invalid size ", shape[i], " in ", shape);
    EMBER_CHECK(have == want || have == 1, "expand: cannot expand shape ", x.shape(), " to ", shape,
                " (dim ", i, ": ", have, " vs ", want, ")");
    sh[i] = want;
    st[i] = (have == want) ? x.strides()[i - off] : 0;
  }
  numel_of(sh, "expand");  // refuses a result whose element count does not fit
  return make_view(x, sh, st, x.storage_offset());
}

Tensor squeeze(const Tensor& x, std::optional<int64_t> dim) {
  Shape sh, st;
  const int64_t d = dim ? normalize_dim(*dim, x.dim(), "squeeze") : -1;
  for (int64_t i = 0; i < x.dim(); ++i) {
    const bool drop = x.shape()[i] == 1 && (!dim || i == d);
    if (drop) continue;
    sh.push_back(x.shape()[i]);
    st.push_back(x.strides()[i]);
  }
  return make_view(x, sh, st, x.storage_offset());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = normalize_dim(dim, x.dim() + 1, "unsqueeze");
  Shape sh = x.shape(), st = x.strides();
  const int64_t s = dim < x.dim() ? st[dim] * sh[dim] : 1;
  sh.insert(sh.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  return make_view(x, sh, st, x.storage_offset());
}

}  // namespace ember::native
