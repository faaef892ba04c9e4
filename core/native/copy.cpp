#include "core/native/copy.h"

#include "core/device_api.h"
#include "core/tensor_impl.h"

namespace ember::native {

EMBER_DEFINE_STUB(copy_stub);
EMBER_DEFINE_STUB(cross_device_copy_stub);
EMBER_DEFINE_STUB(fill_stub);

void copy_(const Tensor& dst, const Tensor& src, bool non_blocking) {
  broadcast_shapes(src.shape(), dst.shape(), "copy_");
  const Shape target = broadcast_shapes(src.shape(), dst.shape(), "copy_");
  EMBER_CHECK(target == dst.shape(), "copy_: source of shape ", src.shape(),
              " cannot be broadcast to destination of shape ", dst.shape());
  if (dst.numel() == 0) return;
  if (dst.device() == src.device()) {
    copy_stub.call(dst.device(), "copy_")(dst, src);
    dst.bump_version();
    return;
  }
  // Across devices: make src contiguous in dst's shape and dtype on its own device, then move.
  Tensor staged = src;
  if (staged.shape() != dst.shape() || staged.dtype() != dst.dtype() || !staged.is_contiguous()) {
    Tensor tmp = make_tensor(dst.shape(), dst.dtype(), src.device());
    copy_stub.call(src.device(), "copy_")(tmp, src);
    staged = tmp;
  }
  if (dst.is_contiguous()) {
    const Device d = dst.is_cuda() ? dst.device() : src.device();
    cross_device_copy_stub.call(d, "copy_ (between devices)")(dst, staged, non_blocking);
  } else {
    Tensor tmp = make_tensor(dst.shape(), dst.dtype(), dst.device());
    const Device d = dst.is_cuda() ? dst.device() : src.device();
    // tmp is read right below, so this copy must have finished.
    cross_device_copy_stub.call(d, "copy_ (between devices)")(tmp, staged, false);
    copy_stub.call(dst.device(), "copy_")(dst, tmp);
  }
  dst.bump_version();
}

void fill_(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  fill_stub.call(dst.device(), "fill_")(dst, value);
  dst.bump_version();
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  Tensor out = make_tensor(x.shape(), x.dtype(), x.device());
  copy_(out, x);
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = make_tensor(x.shape(), dtype, x.device());
  copy_(out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device device, bool non_blocking) {
  if (x.device() == device) return x;
  Tensor out = make_tensor(x.shape(), x.dtype(), device);
  copy_(out, x, non_blocking);
  return out;
}

bool is_pinned(const Tensor& x) {
  return x.defined() && x.is_cpu() && pinned_allocator() != nullptr &&
         x.impl()->storage->allocator() == pinned_allocator();
}

Tensor pin_memory(const Tensor& x) {
  EMBER_CHECK(x.is_cpu(), "pin_memory: only CPU tensors can be pinned, got one on ", x.device());
  if (is_pinned(x)) return x;
  EMBER_CHECK(pinned_allocator() != nullptr && cuda_is_available(),
              "pin_memory: page-locked memory needs the CUDA backend and a CUDA device",
              pinned_allocator() == nullptr ? " (Ember was built without CUDA)" : " (none is available)");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(x.numel()) * dtype_size(x.dtype()), Device::cpu(),
                                            *pinned_allocator());
  impl->shape = x.shape();
  impl->strides = contiguous_strides(x.shape());
  impl->dtype = x.dtype();
  Tensor out(impl);
  copy_(out, x);
  return out;
}

}  // namespace ember::native
