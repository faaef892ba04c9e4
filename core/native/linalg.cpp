#include "core/native/linalg.h"

#include <algorithm>

#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(matmul_stub);

std::optional<BlasMatrix> blas_matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // An empty matrix is never read; a dim of size 1 never steps, so its stride is irrelevant
  // and either layout may claim it.
  if (rows == 0 || cols == 0) return BlasMatrix{false, std::max<int64_t>(cols, 1)};
  if (cols == 1 || col_stride == 1) {
    const int64_t ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return BlasMatrix{false, ld};
  }
  if (rows == 1 || row_stride == 1) {
    const int64_t ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return BlasMatrix{true, ld};
  }
  return std::nullopt;
}

BlasMatrix operand_matrix(const Tensor& x, const char* kernel) {
  const int64_t nd = x.dim();
  auto layout = blas_matrix(x.shape()[nd - 2], x.shape()[nd - 1], x.strides()[nd - 2], x.strides()[nd - 1]);
  EMBER_CHECK(layout.has_value(), "matmul: operand of shape ", x.shape(), " and strides ", x.strides(),
              " reached the ", kernel, " without a BLAS layout");
  return *layout;
}

bool shared_across_batch(const Tensor& x) {
  for (int64_t d = 0; d + 2 < x.dim(); ++d)
    if (x.shape()[d] != 1 && x.strides()[d] != 0) return false;
  return true;
}

std::optional<BlasMatrix> folded_rows_matrix(const Tensor& x) {
  const int64_t nd = x.dim();
  if (nd < 2) return std::nullopt;
  // Merge dims [0, nd-1) into one row dim: each outer dim must step over exactly the rows inside it.
  int64_t rows = 1, row_stride = 0;
  bool have_inner = false;
  for (int64_t d = nd - 2; d >= 0; --d) {
    const int64_t size = x.shape()[d], stride = x.strides()[d];
    if (size == 1) continue;
    if (!have_inner) {
      row_stride = stride;
      have_inner = true;
    } else if (stride != rows * row_stride) {
      return std::nullopt;
    }
    rows *= size;
  }
  return blas_matrix(rows, x.shape()[nd - 1], row_stride, x.strides()[nd - 1]);
}

namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.defined() && b.defined(), op, ": got an undefined tensor");
  EMBER_CHECK(a.dtype() == b.dtype(), op, ": operands must have the same dtype, got ", a.dtype(), " and ",
              b.dtype(), " (shapes ", a.shape(), " and ", b.shape(), "); convert one with .to(dtype)");
  EMBER_CHECK(is_floating(a.dtype()), op, ": expected floating-point operands, got ", a.dtype());
  EMBER_CHECK(a.device() == b.device(), op, ": operands are on different devices (", a.device(), " and ",
              b.device(), ")");
}

// x itself when its last two dims are a BLAS matrix; otherwise a contiguous copy.
Tensor blas_ready(const Tensor& x) {
  const int64_t nd = x.dim();
  if (blas_matrix(x.shape()[nd - 2], x.shape()[nd - 1], x.strides()[nd - 2], x.strides()[nd - 1])) return x;
  return contiguous(x);
}

Shape batch_dims(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 2); }

// a2 [.., n, k] @ b2 [.., k, m] over `batch` (which both broadcast to) -> [batch..., n, m].
Tensor batched_product(const Tensor& a2, const Tensor& b2, const Shape& batch, const Tensor& bias) {
  const int64_t n = a2.shape()[a2.dim() - 2], k = a2.shape()[a2.dim() - 1];
  const int64_t m = b2.shape()[b2.dim() - 1];
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {n, k});
  b_shape.insert(b_shape.end(), {k, m});
  out_shape.insert(out_shape.end(), {n, m});
  Tensor out = make_tensor(out_shape, a2.dtype(), a2.device());
  if (out.numel() == 0) return out;
  const Tensor a = expand(blas_ready(a2), a_shape);
  const Tensor b = expand(blas_ready(b2), b_shape);
  matmul_stub.call(out.device(), "matmul")(out, a, b, bias);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.defined() && b.defined(), "matmul: got an undefined tensor");
  EMBER_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
              a.shape(), " and ", b.shape());
  const int64_t ka = a.shape().back();
  const int64_t kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  EMBER_CHECK(ka == kb, "matmul: shapes ", a.shape(), " and ", b.shape(), " cannot be multiplied (", ka,
              " != ", kb, ")");
  check_operands("matmul", a, b);

  // Promote vectors to matrices; the added dims are dropped from the result below.
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
  const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  const Shape ba = batch_dims(a2), bb = batch_dims(b2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    const int64_t db = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1, "matmul: batch dimensions ", ba, " and ", bb, " of shapes ",
                a.shape(), " and ", b.shape(), " cannot be broadcast together");
    batch[i] = da == 1 ? db : da;
  }

  Tensor out = batched_product(a2, b2, batch, Tensor());
  Shape result = batch;
  if (a.dim() > 1) result.push_back(a2.shape()[a2.dim() - 2]);
  if (b.dim() > 1) result.push_back(b2.shape()[b2.dim() - 1]);
  return view(out, result);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  EMBER_CHECK(a.defined() && b.defined(), "bmm: got an undefined tensor");
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected two 3-D tensors [B, n, k] and [B, k, m], got shapes ",
              a.shape(), " and ", b.shape());
  EMBER_CHECK(a.shape()[0] == b.shape()[0], "bmm: batch sizes of shapes ", a.shape(), " and ", b.shape(),
              " differ (", a.shape()[0], " != ", b.shape()[0], ")");
  EMBER_CHECK(a.shape()[2] == b.shape()[1], "bmm: shapes ", a.shape(), " and ", b.shape(),
              " cannot be multiplied (", a.shape()[2], " != ", b.shape()[1], ")");
  check_operands("bmm", a, b);
  return batched_product(a, b, {a.shape()[0]}, Tensor());
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  EMBER_CHECK(x.defined() && weight.defined(), "linear: got an undefined tensor");
  EMBER_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out_features, in_features], got shape ",
              weight.shape());
  EMBER_CHECK(x.dim() >= 1, "linear: input must have at least 1 dimension, got shape ", x.shape());
  const int64_t in = weight.shape()[1], out_features = weight.shape()[0];
  EMBER_CHECK(x.shape().back() == in, "linear: input of shape ", x.shape(), " and weight of shape ",
              weight.shape(), " cannot be multiplied (in_features ", x.shape().back(), " != ", in, ")");
  check_operands("linear", x, weight);
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.shape()[0] == out_features, "linear: bias of shape ", bias.shape(),
                " does not match weight of shape ", weight.shape(), " (expected [", out_features, "])");
    check_operands("linear", x, bias);
  }

  // Leading dims of x stay batch dims: the kernel folds them into the GEMM's rows when x's
  // layout allows, and W^T is read in place as a column-major matrix.
  const Tensor x2 = x.dim() == 1 ? unsqueeze(x, 0) : x;
  const Tensor bias_c = bias.defined() ? contiguous(bias) : Tensor();
  Tensor out = batched_product(x2, transpose(weight, 0, 1), batch_dims(x2), bias_c);
  Shape result(x.shape().begin(), x.shape().end() - 1);
  result.push_back(out_features);
  return view(out, result);
}

}  // namespace ember::native
