#include "core/strided_loop.h"

namespace ember {

StridedLoop::StridedLoop(const Shape& shape, const std::vector<Tensor>& operands) {
  EMBER_CHECK(operands.size() >= 1 && operands.size() <= size_t(kMaxOperands),
              "StridedLoop: expected 1 to ", kMaxOperands, " operands, got ", operands.size());
  n_ = int(operands.size());
  numel_ = numel_of(shape);
  const size_t nd = shape.size();
  std::array<Shape, kMaxOperands> st;
  for (int k = 0; k < n_; ++k) {
    const Tensor& t = operands[k];
    EMBER_CHECK(t.dim() <= int64_t(nd), "StridedLoop: operand ", k, " of shape ", t.shape(),
                " has more dims than the loop shape ", shape);
    st[k] = broadcast_strides(t.shape(), t.strides(), shape);
    for (auto& v : st[k]) v *= int64_t(t.element_size());
    base_[k] = static_cast<char*>(t.raw_data());
  }
  // Drop size-1 dims, then merge dim i into i+1 when every operand is contiguous across them.
  Shape sh;
  std::array<Shape, kMaxOperands> cs;
  for (size_t d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    sh.push_back(shape[d]);
    for (int k = 0; k < n_; ++k) cs[k].push_back(st[k][d]);
  }
  Shape msh;
  std::array<Shape, kMaxOperands> ms;
  for (size_t d = 0; d < sh.size(); ++d) {
    bool merge = !msh.empty();
    for (int k = 0; k < n_ && merge; ++k) merge = ms[k].back() == cs[k][d] * sh[d];
    if (merge) {
      msh.back() *= sh[d];
      for (int k = 0; k < n_; ++k) ms[k].back() = cs[k][d];
    } else {
      msh.push_back(sh[d]);
      for (int k = 0; k < n_; ++k) ms[k].push_back(cs[k][d]);
    }
  }
  shape_ = msh;
  for (int k = 0; k < n_; ++k) strides_[k] = ms[k];
}

bool StridedLoop::is_flat_contiguous() const { return shape_.size() <= 1; }

void StridedLoop::row_pointers(int64_t row, char** out) const {
  for (int k = 0; k < n_; ++k) out[k] = base_[k];
  // decompose row index over all dims but the innermost
  for (int64_t d = int64_t(shape_.size()) - 2; d >= 0; --d) {
    const int64_t idx = row % shape_[d];
    row /= shape_[d];
    for (int k = 0; k < n_; ++k) out[k] += idx * strides_[k][d];
  }
}

}  // namespace ember
