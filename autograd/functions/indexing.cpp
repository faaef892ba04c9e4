// Differentiable joining, splitting and indexing. Forward work is in core/native/indexing.h;
// each backward routes the gradient back to where the forward read it from. cat's and stack's
// are views of the gradient; index_select's and gather's add the gradient into a zero tensor at
// the indices, an op whose own gradient is index_select or gather again. All are linear, so they
// can be differentiated any number of times (create_graph).
#include "autograd/functions/composed_gradient.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {
// Gradient in the input's dtype (the forward may have promoted), or none for integer inputs.
Tensor grad_as(const Tensor& g, DType dtype) {
  return is_floating(dtype) ? g.to(dtype) : Tensor();
}

// index_select's gradient: g added into zeros of `shape` at index along dim.
Tensor index_select_grad(const Tensor& g, const Shape& shape, DType dtype, int64_t dim,
                         const autograd::SavedTensor& index) {
  return autograd::linear_gradient(
      "IndexSelectGradBackward", g, native::index_add(zeros(shape, {dtype, g.device()}), dim, index.unpack(), g),
      [dim, index](const Tensor& h) { return index_select(h, dim, index.unpack()); });
}

// gather's gradient: g added into zeros of `shape` at index along dim.
Tensor gather_grad(const Tensor& g, const Shape& shape, DType dtype, int64_t dim, const autograd::SavedTensor& index) {
  return autograd::linear_gradient(
      "GatherGradBackward", g,
      native::scatter_add(zeros(shape, {dtype, g.device()}), dim, index.unpack(), native::to_dtype(g, dtype)),
      [dim, index](const Tensor& h) { return gather(h, dim, index.unpack()); });
}

// t with zeros after its end in each dim, up to `shape` (no larger in any dim than shape).
Tensor zero_padded(Tensor t, const Shape& shape) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == shape[size_t(d)]) continue;
    Shape rest = t.shape();
    rest[size_t(d)] = shape[size_t(d)] - t.size(d);
    t = cat({t, zeros(rest, {t.dtype(), t.device()})}, d);
  }
  return t;
}
}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = native::cat(tensors, dim);
  if (!autograd::needs_grad(tensors)) return out;
  const int64_t d = normalize_dim(dim, out.dim(), "cat");
  struct Piece {
    int64_t size;
    DType dtype;
    bool skipped;  // a 1-D empty tensor that cat ignores
  };
  std::vector<Piece> pieces;
  for (const Tensor& t : tensors) {
    const bool skipped = out.dim() != 1 && t.dim() == 1 && t.size(0) == 0;
    pieces.push_back({skipped ? 0 : t.size(d), t.dtype(), skipped});
  }
  autograd::record("CatBackward", tensors, {out}, [pieces, d](const Tensors& g) -> Tensors {
    Tensors grads;
    int64_t offset = 0;
    for (const Piece& p : pieces) {
      if (p.skipped) {
        grads.push_back(is_floating(p.dtype) ? zeros({0}, {p.dtype, g[0].device()}) : Tensor());
        continue;
      }
      grads.push_back(grad_as(g[0].slice(d, offset, offset + p.size, 1), p.dtype));
      offset += p.size;
    }
    return grads;
  }, autograd::Backward::differentiable);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = native::stack(tensors, dim);
  if (!autograd::needs_grad(tensors)) return out;
  const int64_t d = normalize_dim(dim, out.dim(), "stack");
  std::vector<DType> dtypes;
  for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
  autograd::record("StackBackward", tensors, {out}, [dtypes, d](const Tensors& g) -> Tensors {
    Tensors grads;
    for (size_t i = 0; i < dtypes.size(); ++i) grads.push_back(grad_as(g[0].select(d, int64_t(i)), dtypes[i]));
    return grads;
  }, autograd::Backward::differentiable);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  native::check_split_sizes(x, sizes, dim);
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  // Views: their gradients flow back through narrow's own backward.
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(x.narrow(d, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  EMBER_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  return split(x, native::split_sizes(x.size(d), split_size), d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  EMBER_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "chunk");
  return split(x, native::chunk_sizes(x.size(d), chunks), d);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = native::index_select(x, dim, index);
  if (!autograd::needs_grad({x})) return out;
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const autograd::SavedTensor saved_index = autograd::save(index);
  autograd::record(
      "IndexSelectBackward", {x}, {out},
      [shape, dtype, dim, saved_index](const Tensors& g) -> Tensors {
        return {index_select_grad(g[0], shape, dtype, dim, saved_index)};
      },
      autograd::Backward::differentiable);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = native::gather(x, dim, index);
  if (!autograd::needs_grad({x})) return out;
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const autograd::SavedTensor saved_index = autograd::save(index);
  autograd::record(
      "GatherBackward", {x}, {out},
      [shape, dtype, dim, saved_index](const Tensors& g) -> Tensors {
        return {gather_grad(g[0], shape, dtype, dim, saved_index)};
      },
      autograd::Backward::differentiable);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = native::scatter_add(x, dim, index, src);
  if (!autograd::needs_grad({x, src})) return out;
  const Shape src_shape = src.shape();
  const autograd::SavedTensor saved_index = autograd::save(index);
  autograd::record(
      "ScatterAddBackward", {x, src}, {out},
      [src_shape, dim, saved_index](const Tensors& g) -> Tensors {
        // src may be larger than the index: the part the index never reads gets no gradient.
        return {g[0], zero_padded(gather(g[0], dim, saved_index.unpack()), src_shape)};
      },
      autograd::Backward::differentiable);
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) { return native::one_hot(indices, num_classes); }

}  // namespace ember
