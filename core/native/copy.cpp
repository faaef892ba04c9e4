#include "core/native/copy.h"

namespace ember::native {

EMBER_DEFINE_STUB(copy_stub);
EMBER_DEFINE_STUB(cross_device_copy_stub);
EMBER_DEFINE_STUB(fill_stub);

void copy_(const Tensor& dst, const Tensor& src) {
  broadcast_shapes(src.shape(), dst.shape(), "copy_");
  const Shape target = broadcast_shapes(src.shape(), dst.shape(), "copy_");
  EMBER_CHECK(target == dst.shape(), "copy_: source of shape ", src.shape(),
              " cannot be broadcast to destination of shape ", dst.shape());
  if (dst.numel() == 0) return;
  if (dst.device() == src.device()) {
    copy_stub.call(dst.device(), "copy_")(dst, src);
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
    cross_device_copy_stub.call(d, "copy_ (between devices)")(dst, staged);
  } else {
    Tensor tmp = make_tensor(dst.shape(), dst.dtype(), dst.device());
    const Device d = dst.is_cuda() ? dst.device() : src.device();
    cross_device_copy_stub.call(d, "copy_ (between devices)")(tmp, staged);
    copy_stub.call(dst.device(), "copy_")(dst, tmp);
  }
}

void fill_(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  fill_stub.call(dst.device(), "fill_")(dst, value);
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

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor out = make_tensor(x.shape(), x.dtype(), device);
  copy_(out, x);
  return out;
}

}  // namespace ember::native
