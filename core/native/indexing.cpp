#include "core/native/indexing.h"

#include <algorithm>

#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(cat_stub);
EMBER_DEFINE_STUB(index_select_stub);
EMBER_DEFINE_STUB(index_add_stub);
EMBER_DEFINE_STUB(gather_stub);
EMBER_DEFINE_STUB(scatter_add_stub);
EMBER_DEFINE_STUB(one_hot_stub);

namespace {

void check_index_dtype(const Tensor& index, const char* op, const char* what = "index") {
  EMBER_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, op, ": ", what,
              " must be an integer tensor (int64 or int32), got ", dtype_name(index.dtype()));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  EMBER_CHECK(a.device() == b.device(), op, ": ", what, " is on ", b.device(), " but the input is on ",
              a.device());
}

// PyTorch's legacy rule: 1-D empty tensors are ignored by cat whatever the other shapes.
bool is_legacy_empty(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  EMBER_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  size_t ref = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    EMBER_CHECK(tensors[i].defined(), "cat: tensor ", i, " is undefined");
    if (!is_legacy_empty(tensors[i]) && is_legacy_empty(tensors[ref])) ref = i;
  }
  const Tensor& first = tensors[ref];
  EMBER_CHECK(first.dim() > 0, "cat: zero-dimensional tensor (at position ", ref,
              ") cannot be concatenated; use stack or unsqueeze it first");
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  DType dtype = first.dtype();
  Shape out_shape = first.shape();
  out_shape[size_t(d)] = 0;
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    dtype = promote_types(dtype, t.dtype());
    EMBER_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(), " but tensor ", ref,
                " is on ", first.device());
    if (is_legacy_empty(t) && first.dim() != 1) continue;
    EMBER_CHECK(t.dim() == first.dim(), "cat: tensors must have the same number of dims, but tensor ", ref,
                " has shape ", first.shape(), " and tensor ", i, " has shape ", t.shape());
    for (int64_t k = 0; k < t.dim(); ++k) {
      EMBER_CHECK(k == d || t.size(k) == first.size(k), "cat: sizes must match except in dim ", d,
                  ", but tensor ", ref, " has shape ", first.shape(), " and tensor ", i, " has shape ",
                  t.shape(), " (dim ", k, ": ", first.size(k), " != ", t.size(k), ")");
    }
    out_shape[size_t(d)] += t.size(d);
    parts.push_back(t);
  }
  Tensor out = make_tensor(out_shape, dtype, first.device());
  std::vector<Tensor> inputs;
  for (const Tensor& t : parts)
    if (t.numel() > 0) inputs.push_back(to_dtype(t, dtype));
  if (out.numel() > 0) cat_stub.call(out.device(), "cat")(out, inputs, d);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  EMBER_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    EMBER_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    EMBER_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: all tensors must have the same shape, but tensor 0 has shape ",
                tensors[0].shape(), " and tensor ", i, " has shape ", tensors[i].shape());
  }
  const int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, d));
  return cat(expanded, d);
}

std::vector<int64_t> split_sizes(int64_t dim_size, int64_t split_size, const char* op) {
  EMBER_CHECK(split_size > 0 || (split_size == 0 && dim_size == 0), op,
              ": split_size must be positive (0 only for an empty dim), got ", split_size,
              " for a dim of size ", dim_size);
  if (split_size == 0) return {0};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < dim_size; start += split_size)
    sizes.push_back(std::min(split_size, dim_size - start));
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t chunks) {
  EMBER_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  if (dim_size == 0) return std::vector<int64_t>(size_t(chunks), 0);
  return split_sizes(dim_size, (dim_size + chunks - 1) / chunks, "chunk");
}

void check_split_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  EMBER_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EMBER_CHECK(sizes[i] >= 0, "split: sizes must be non-negative, got ", sizes[i], " at position ", i,
                " in ", Shape(sizes));
    total += sizes[i];
  }
  EMBER_CHECK(total == x.size(d), "split: sizes ", Shape(sizes), " sum to ", total, " but dim ", d,
              " of shape ", x.shape(), " has size ", x.size(d));
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype(index, "index_select");
  check_same_device(x, index, "index_select", "index");
  EMBER_CHECK(index.dim() <= 1, "index_select: index must be 0-D or 1-D, got shape ", index.shape());
  EMBER_CHECK(x.dim() > 0, "index_select: cannot index a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  Shape out_shape = x.shape();
  out_shape[size_t(d)] = index.numel();
  Tensor out = make_tensor(out_shape, x.dtype(), x.device());
  index_select_stub.call(x.device(), "index_select")(out, contiguous(x), d, contiguous(reshape(index, {-1})));
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_index_dtype(index, "index_add");
  check_same_device(x, index, "index_add", "index");
  check_same_device(x, src, "index_add", "source");
  EMBER_CHECK(index.dim() <= 1, "index_add: index must be 0-D or 1-D, got shape ", index.shape());
  EMBER_CHECK(x.dim() > 0, "index_add: cannot index a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "index_add");
  Shape want = x.shape();
  want[size_t(d)] = index.numel();
  EMBER_CHECK(src.shape() == want, "index_add: source of shape ", src.shape(), " does not fit input of shape ",
              x.shape(), " with ", index.numel(), " indices along dim ", d, " (expected ", want, ")");
  Tensor out = clone(x);
  index_add_stub.call(x.device(), "index_add")(out, d, contiguous(reshape(index, {-1})),
                                               contiguous(to_dtype(src, x.dtype())));
  return out;
}

namespace {
// Shape rules shared by gather and scatter_add: same rank, index no larger than `x` outside `dim`.
void check_gather_shapes(const char* op, const Tensor& x, const Tensor& index, int64_t d) {
  EMBER_CHECK(index.dim() == x.dim(), op, ": index must have the same number of dims as the input, got index shape ",
              index.shape(), " and input shape ", x.shape());
  for (int64_t k = 0; k < x.dim(); ++k) {
    EMBER_CHECK(k == d || index.size(k) <= x.size(k), op, ": index shape ", index.shape(),
                " is larger than input shape ", x.shape(), " at dim ", k, " (only dim ", d, " may be larger)");
  }
}
}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype(index, "gather");
  check_same_device(x, index, "gather", "index");
  if (x.dim() == 0) {
    EMBER_CHECK(index.dim() == 0, "gather: index must have the same number of dims as the input, got index shape ",
                index.shape(), " and input shape ", x.shape());
    return reshape(gather(reshape(x, {1}), dim, reshape(index, {1})), {});
  }
  const int64_t d = normalize_dim(dim, x.dim(), "gather");
  check_gather_shapes("gather", x, index, d);
  Tensor out = make_tensor(index.shape(), x.dtype(), x.device());
  gather_stub.call(x.device(), "gather")(out, contiguous(x), d, contiguous(index));
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_index_dtype(index, "scatter_add");
  check_same_device(x, index, "scatter_add", "index");
  check_same_device(x, src, "scatter_add", "source");
  EMBER_CHECK(src.dtype() == x.dtype(), "scatter_add: source dtype ", dtype_name(src.dtype()),
              " differs from input dtype ", dtype_name(x.dtype()));
  if (x.dim() == 0) {
    EMBER_CHECK(index.dim() == 0 && src.dim() == 0, "scatter_add: input, index and source must have the same number of dims, got input shape ",
                x.shape(), ", index shape ", index.shape(), " and source shape ", src.shape());
    return reshape(scatter_add(reshape(x, {1}), dim, reshape(index, {1}), reshape(src, {1})), {});
  }
  const int64_t d = normalize_dim(dim, x.dim(), "scatter_add");
  check_gather_shapes("scatter_add", x, index, d);
  EMBER_CHECK(src.dim() == index.dim(), "scatter_add: source must have the same number of dims as the index, got source shape ",
              src.shape(), " and index shape ", index.shape());
  Tensor src_part = src;
  for (int64_t k = 0; k < src.dim(); ++k) {
    EMBER_CHECK(index.size(k) <= src.size(k), "scatter_add: index shape ", index.shape(),
                " is larger than source shape ", src.shape(), " at dim ", k);
    if (src.size(k) != index.size(k)) src_part = slice(src_part, k, 0, index.size(k), 1);
  }
  Tensor out = clone(x);
  if (index.numel() > 0)
    scatter_add_stub.call(x.device(), "scatter_add")(out, d, contiguous(index), contiguous(src_part));
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  check_index_dtype(indices, "one_hot", "indices");
  EMBER_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (infer) or non-negative, got ", num_classes);
  if (num_classes == -1) {
    EMBER_CHECK(indices.numel() > 0, "one_hot: cannot infer the number of classes from an empty tensor of shape ",
                indices.shape(), "; pass num_classes");
    const Tensor host = contiguous(to_dtype(to_device(indices, Device::cpu()), DType::i64));
    const int64_t* p = host.data_ptr<int64_t>();
    int64_t max = p[0];
    for (int64_t i = 1; i < host.numel(); ++i) max = std::max(max, p[i]);
    num_classes = max + 1;
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(num_classes);
  Tensor out = make_tensor(out_shape, DType::i64, indices.device());
  one_hot_stub.call(indices.device(), "one_hot")(out, contiguous(indices), num_classes);
  return out;
}

}  // namespace ember::native
