// Tensor members that need no autograd: metadata, element access, in-place updates, printing.
// The differentiable members (views, math) are defined in autograd/functions/.
#include "core/tensor.h"

#include <cmath>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/sparse_grad.h"
#include "core/type_dispatch.h"

namespace ember {

TensorImpl* Tensor::checked() const {
  EMBER_CHECK(impl_ != nullptr, "Tensor: operation on an undefined tensor");
  return impl_.get();
}

void Tensor::check_dtype(DType want, const char* what) const {
  EMBER_CHECK(dtype() == want, what, ": tensor has dtype ", dtype_name(dtype()), " but ",
              dtype_name(want), " was requested");
}

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const auto& sh = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] == 1) continue;
    if (sh[i] == 0) return true;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

double Tensor::item_double() const {
  EMBER_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape());
  Tensor c = native::to_device(*this, Device::cpu());
  return visit_all(c.dtype(), "item", [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    return double(static_cast<acc_t<T>>(*static_cast<const T*>(c.raw_data())));
  });
}

Tensor& Tensor::requires_grad_(bool on) {
  EMBER_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating-point tensors can require "
              "gradients, got ", dtype_name(dtype()));
  EMBER_CHECK(is_leaf() || on, "requires_grad_: cannot turn off requires_grad on a non-leaf tensor; "
              "use detach()");
  checked()->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  TensorImpl* impl = checked();
  if (impl->sparse_grad) {
    // Whoever reads the whole gradient gets the pending rows added in (one dense table).
    const std::shared_ptr<RowSparseGrad> rows = std::move(impl->sparse_grad);
    if (impl->grad) {
      add_rows_into(Tensor(impl->grad), *rows);
    } else {
      impl->grad = to_dense(*rows).impl_ptr();
    }
  }
  return impl->grad ? Tensor(impl->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined()) {
    EMBER_CHECK(g.shape() == shape(), "set_grad: gradient of shape ", g.shape(),
                " does not match tensor of shape ", shape());
  }
  checked()->grad = g.impl_ptr();
  impl_->sparse_grad.reset();
}

namespace {
RemovableHandle register_accumulate_hook(const std::shared_ptr<TensorImpl>& impl,
                                         std::function<void(const Tensor&)> hook, bool sparse) {
  const uint64_t id = impl->next_hook_id++;
  impl->post_accumulate_hooks.push_back(
      {id, std::make_shared<const std::function<void(const Tensor&)>>(std::move(hook)), sparse});
  // Weak: a handle kept after the tensor is gone must not keep it alive.
  std::weak_ptr<TensorImpl> weak = impl;
  return RemovableHandle([weak, id] {
    if (auto alive = weak.lock()) {
      std::erase_if(alive->post_accumulate_hooks, [id](const PostAccumulateHook& h) { return h.id == id; });
    }
  });
}
}  // namespace

RemovableHandle Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
  EMBER_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: only leaf tensors "
              "that require grad accumulate gradients");
  EMBER_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: empty hook");
  checked();
  return register_accumulate_hook(impl_, std::move(hook), false);
}

RemovableHandle Tensor::register_post_accumulate_sparse_grad_hook(std::function<void(const Tensor&)> hook) {
  EMBER_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_sparse_grad_hook: only leaf tensors "
              "that require grad accumulate gradients");
  EMBER_CHECK(hook != nullptr, "register_post_accumulate_sparse_grad_hook: empty hook");
  checked();
  return register_accumulate_hook(impl_, std::move(hook), true);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = checked()->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->dtype = impl_->dtype;
  return Tensor(impl);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

namespace {
void check_inplace(const Tensor& t, const char* op) {
  EMBER_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op,
              ": in-place update of a tensor that requires grad while grad mode is on; wrap it in "
              "NoGradGuard (as optimizers do) or use the out-of-place op");
}
}  // namespace

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  native::fill_(*this, value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  native::copy_(*this, src);
  return *this;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  Tensor c = native::to_device(*this, Device::cpu());
  c = native::contiguous(native::to_dtype(c, is_floating(dtype()) ? DType::f64 : DType::i64));
  const int64_t n = c.numel();
  const bool fl = is_floating(dtype());
  constexpr int64_t kEdge = 3;  // summarise long dims as PyTorch does
  std::function<void(int64_t, int64_t, int)> rec = [&](int64_t d, int64_t base, int indent) {
    if (d == c.dim()) {
      if (fl) {
        os << std::setprecision(4) << c.data_ptr<double>()[base];
      } else if (dtype() == DType::boolean) {
        os << (c.data_ptr<int64_t>()[base] ? "True" : "False");
      } else {
        os << c.data_ptr<int64_t>()[base];
      }
      return;
    }
    const int64_t len = c.shape()[d], st = c.strides()[d];
    os << '[';
    for (int64_t i = 0; i < len; ++i) {
      if (len > 2 * kEdge && i == kEdge) {
        os << (d + 1 == c.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
        i = len - kEdge;
      }
      rec(d + 1, base + i * st, indent + 1);
      if (i + 1 < len) os << (d + 1 == c.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
    }
    os << ']';
  };
  os << "tensor(";
  if (n == 0 && c.dim() > 0) {
    os << "[]";
  } else {
    rec(0, 0, 7);
  }
  os << ", shape=" << shape() << ", dtype=" << dtype_name(dtype());
  if (!is_cpu()) os << ", device=" << device();
  if (grad_fn()) os << ", grad_fn=<node>";
  else if (requires_grad()) os << ", requires_grad=True";
  os << ')';
  return os.str();
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device) {
  // "empty": the factories check under their own names first; other ops' outputs land here.
  const size_t nbytes = nbytes_of(shape, dtype_size(dtype), "empty");
  Shape strides = contiguous_strides(shape, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(nbytes, device);
  impl->shape = shape;
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  // Every view op ends here, so no view can reach outside its storage, whatever sizes,
  // strides or offsets it was asked for.
  const int64_t extent = storage_extent(shape, strides, offset, "view");
  const int64_t item = int64_t(dtype_size(base.dtype()));
  const int64_t capacity = int64_t(base.impl()->storage->nbytes()) / item;
  EMBER_CHECK(extent <= capacity, "view: a view of shape ", shape, " with strides ", strides, " at offset ",
              offset, " needs ", extent, " elements but its storage holds ", capacity);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype();
  return Tensor(impl);
}

}  // namespace ember
