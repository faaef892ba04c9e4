// Differentiable joining, splitting and indexing. Forward work is in core/native/indexing.h;
// each backward routes the gradient back to where the forward read it from. cat's and stack's
// are views of the gradient, so they can be differentiated again (create_graph).
#include "autograd/node.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {
// Gradient in the input's dtype (the forward may have promoted), or none for integer inputs.
Tensor grad_as(const Tensor& g, DType dtype) {
  return is_floating(dtype) ? g.to(dtype) : Tensor();
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
  autograd::record("IndexSelectBackward", {x}, {out}, [shape, dtype, dim, saved_index](const Tensors& g) -> Tensors {
    return {native::index_add(zeros(shape, {dtype, g[0].device()}), dim, saved_index.unpack(), g[0])};
  });
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = native::gather(x, dim, index);
  if (!autograd::needs_grad({x})) return out;
  const Shape shape = x.shape();
  const DType dtype = x.dtype();
  const autograd::SavedTensor saved_index = autograd::save(index);
  autograd::record("GatherBackward", {x}, {out}, [shape, dtype, dim, saved_index](const Tensors& g) -> Tensors {
    return {native::scatter_add(zeros(shape, {dtype, g[0].device()}), dim, saved_index.unpack(),
                                native::to_dtype(g[0], dtype))};
  });
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = native::scatter_add(x, dim, index, src);
  if (!autograd::needs_grad({x, src})) return out;
  const Shape src_shape = src.shape();
  const autograd::SavedTensor saved_index = autograd::save(index);
  autograd::record("ScatterAddBackward", {x, src}, {out}, [src_shape, dim, saved_index](const Tensors& g) -> Tensors {
    const Tensor& index_saved = saved_index.unpack();
    Tensor grad_src = native::gather(g[0], dim, index_saved);
    if (grad_src.shape() != src_shape) {
      // src may be larger than the index: the part the index never reads gets no gradient.
      Tensor full = zeros(src_shape, {grad_src.dtype(), grad_src.device()});
      Tensor window = full;
      for (int64_t k = 0; k < full.dim(); ++k) window = native::slice(window, k, 0, index_saved.size(k), 1);
      native::copy_(window, grad_src);
      grad_src = full;
    }
    return {g[0], grad_src};
  });
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) { return native::one_hot(indices, num_classes); }

}  // namespace ember
