// Tensor: a cheap, reference-counted handle. Copying a Tensor shares the same data and
// autograd state, exactly like torch::Tensor. Views (view, transpose, narrow, ...) share
// storage; clone()/contiguous() copy.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/removable_handle.h"
#include "core/tensor_impl.h"

namespace ember {

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };

enum class Reduction { None, Mean, Sum };

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata
  int64_t dim() const { return int64_t(checked()->shape.size()); }
  const Shape& shape() const { return checked()->shape; }
  const Shape& sizes() const { return shape(); }
  int64_t size(int64_t d) const;
  const Shape& strides() const { return checked()->strides; }
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(shape()); }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->device(); }
  int64_t storage_offset() const { return checked()->offset; }
  size_t element_size() const { return dtype_size(dtype()); }
  bool is_contiguous() const;
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return is_floating(dtype()); }

  // Raw pointer to the first element (offset applied). Checks the element type.
  template <typename T> T* data_ptr() const {
    check_dtype(dtype_of<T>::value, "data_ptr");
    return static_cast<T*>(checked()->data());
  }
  void* raw_data() const { return checked()->data(); }
  // The value of a one-element tensor, converted to T.
  template <typename T> T item() const { return static_cast<T>(item_double()); }
  double item_double() const;
  // Copies the elements (in logical order) into a vector of T.
  template <typename T> std::vector<T> to_vector() const {
    Tensor c = to(dtype_of<T>::value).to(Device::cpu()).contiguous();
    const T* p = c.data_ptr<T>();
    return std::vector<T>(p, p + c.numel());
  }

  // ---- autograd
  bool requires_grad() const { return checked()->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  // The whole gradient: a pending row-sparse part (core/sparse_grad.h) is added into the
  // dense tensor first. set_grad replaces the whole gradient, row-sparse part included.
  Tensor grad() const;
  void set_grad(const Tensor& g);
  // Row-sparse gradients (core/sparse_grad.h). With the flag on, embedding lookups of this
  // leaf leave their gradient as rows in sparse_grad() instead of adding a dense table.
  Tensor& set_row_sparse_grad(bool on = true);
  bool row_sparse_grad() const;
  bool has_sparse_grad() const;
  RowSparseGrad sparse_grad() const;          // the pending rows (undefined when none)
  void set_sparse_grad(const RowSparseGrad& g);  // replaces them (undefined: clears), no hooks
  // Merges `part` into the pending rows, then runs the sparse post-accumulate hooks.
  void accumulate_sparse_grad(const RowSparseGrad& part);
  Tensor dense_grad_part() const;  // .grad without the pending rows (undefined when none)
  bool is_leaf() const { return checked()->grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return checked()->grad_fn; }
  // Backpropagates from this tensor. `grad` may be omitted for a one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, no history
  // Runs after a gradient has been accumulated into this leaf's .grad (DDP hangs its
  // bucketed all-reduce here). Hooks run in registration order; the handle's remove()
  // unregisters this one (a hook removed by an earlier hook of the same pass does not run).
  RemovableHandle register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
  // The same after rows were accumulated into the row-sparse part (accumulate_sparse_grad).
  RemovableHandle register_post_accumulate_sparse_grad_hook(std::function<void(const Tensor&)> hook);
  // How many hooks are registered on this tensor and not removed.
  size_t hook_count() const { return checked()->post_accumulate_hooks.size(); }
  // The version counter of this tensor's storage, shared with all its views: every in-place
  // write bumps it, and a backward that reads a saved tensor whose version moved is an error.
  uint64_t version() const { return checked()->storage->version(); }
  // For code that writes through data_ptr(): marks the storage as changed in place.
  void bump_version() const { checked()->storage->bump_version(); }

  // ---- views (no copy) and copies
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const Shape& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  // non_blocking: only queue a host<->GPU copy (see native::to_device); from pinned memory
  // it overlaps with the GPU's work.
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor pin_memory() const;  // a page-locked copy (CUDA builds with a device)
  bool is_pinned() const;
  Tensor to(Device device, DType dtype) const { return to(device).to(dtype); }

  // ---- in-place (never recorded by autograd; refused on tensors that need grad while
  // grad mode is on, except where noted). Each bumps version().
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double value);

  // ---- math, as methods (see core/ops.h for the free functions)
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor gelu(bool tanh_approx = false) const;
  Tensor abs() const;
  Tensor pow(double exponent) const;
  Tensor clamp(double min, double max) const;
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor var(const Shape& dims, int64_t correction = 1, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor matmul(const Tensor& other) const;
  Tensor masked_fill(const Tensor& mask, double value) const;

  std::string str() const;  // printable form, like PyTorch's repr

 private:
  TensorImpl* checked() const;
  void check_dtype(DType want, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Makes a tensor of a fresh contiguous storage. `requires_grad` sets the leaf flag.
Tensor make_tensor(const Shape& shape, DType dtype, Device device);
// A view of `base`'s storage with new geometry (no autograd bookkeeping).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

}  // namespace ember
