// Copies and fills without autograd: the building blocks of contiguous(), clone(), to().
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// dst[...] = convert(src[...]); src broadcast to dst's shape; same device.
EMBER_DECLARE_STUB(copy_stub, void (*)(const Tensor& dst, const Tensor& src));
// Copies between devices (registered by the CUDA backend); shapes equal, both contiguous.
EMBER_DECLARE_STUB(cross_device_copy_stub, void (*)(const Tensor& dst, const Tensor& src));
EMBER_DECLARE_STUB(fill_stub, void (*)(const Tensor& dst, double value));

void copy_(const Tensor& dst, const Tensor& src);  // broadcast + dtype conversion + devices
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor to_dtype(const Tensor& x, DType dtype);  // x itself when already that dtype
Tensor to_device(const Tensor& x, Device device);

}  // namespace ember::native
