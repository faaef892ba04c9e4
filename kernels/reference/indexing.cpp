#include "kernels/reference/indexing.h"

namespace ember::reference {
namespace {
size_t wrap(int64_t dim, int64_t ndim) { return size_t(dim < 0 ? dim + ndim : dim); }
}  // namespace

RefTensor cat(const std::vector<RefTensor>& xs, int64_t dim) {
  const size_t d = wrap(dim, xs[0].dim());
  Shape shape = xs[0].shape;
  shape[d] = 0;
  for (const RefTensor& x : xs) shape[d] += x.shape[d];
  RefTensor out(shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape idx = unravel(i, shape);
    size_t k = 0;
    while (idx[d] >= xs[k].shape[d]) idx[d] -= xs[k++].shape[d];
    out.data[size_t(i)] = xs[k].at(idx);
  }
  return out;
}

RefTensor stack(const std::vector<RefTensor>& xs, int64_t dim) {
  const size_t d = wrap(dim, xs[0].dim() + 1);
  Shape shape = xs[0].shape;
  shape.insert(shape.begin() + int64_t(d), int64_t(xs.size()));
  RefTensor out(shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape idx = unravel(i, shape);
    const int64_t which = idx[d];
    idx.erase(idx.begin() + int64_t(d));
    out.data[size_t(i)] = xs[size_t(which)].at(idx);
  }
  return out;
}

std::vector<RefTensor> split(const RefTensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const size_t d = wrap(dim, x.dim());
  std::vector<RefTensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    Shape shape = x.shape;
    shape[d] = s;
    RefTensor piece(shape);
    for (int64_t i = 0; i < piece.numel(); ++i) {
      Shape idx = unravel(i, shape);
      idx[d] += start;
      piece.data[size_t(i)] = x.at(idx);
    }
    pieces.push_back(piece);
    start += s;
  }
  return pieces;
}

RefTensor index_select(const RefTensor& x, int64_t dim, const RefTensor& index) {
  const size_t d = wrap(dim, x.dim());
  Shape shape = x.shape;
  shape[d] = index.numel();
  RefTensor out(shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape idx = unravel(i, shape);
    idx[d] = int64_t(index.data[size_t(idx[d])]);
    out.data[size_t(i)] = x.at(idx);
  }
  return out;
}

RefTensor index_add(const RefTensor& x, int64_t dim, const RefTensor& index, const RefTensor& src) {
  const size_t d = wrap(dim, x.dim());
  RefTensor out = x;
  for (int64_t i = 0; i < src.numel(); ++i) {
    Shape idx = unravel(i, src.shape);
    idx[d] = int64_t(index.data[size_t(idx[d])]);
    out.at(idx) += src.data[size_t(i)];
  }
  return out;
}

RefTensor gather(const RefTensor& x, int64_t dim, const RefTensor& index) {
  const size_t d = wrap(dim, x.dim());
  RefTensor out(index.shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Shape idx = unravel(i, index.shape);
    if (!idx.empty()) idx[d] = int64_t(index.data[size_t(i)]);
    out.data[size_t(i)] = x.at(idx);
  }
  return out;
}

RefTensor scatter_add(const RefTensor& x, int64_t dim, const RefTensor& index, const RefTensor& src) {
  const size_t d = wrap(dim, x.dim());
  RefTensor out = x;
  for (int64_t i = 0; i < index.numel(); ++i) {
    const Shape idx = unravel(i, index.shape);
    Shape target = idx;
    if (!target.empty()) target[d] = int64_t(index.data[size_t(i)]);
    out.at(target) += src.at(idx);
  }
  return out;
}

RefTensor one_hot(const RefTensor& indices, int64_t num_classes) {
  Shape shape = indices.shape;
  shape.push_back(num_classes);
  RefTensor out(shape);
  for (int64_t i = 0; i < indices.numel(); ++i)
    out.data[size_t(i * num_classes + int64_t(indices.data[size_t(i)]))] = 1.0;
  return out;
}

}  // namespace ember::reference
