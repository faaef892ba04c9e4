// Copies and fills without autograd: the building blocks of contiguous(), clone(), to().
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// dst[...] = convert(src[...]); src broadcast to dst's shape; same device.
EMBER_DECLARE_STUB(copy_stub, void (*)(const Tensor& dst, const Tensor& src));
// Copies between devices (registered by the CUDA backend); shapes equal, both contiguous.
// Unless non_blocking, the host may read or reuse its side as soon as the call returns; with
// non_blocking the copy is only queued on the current stream (a pinned source block is kept
// from reuse until it finished; a pinned destination must not be read before a synchronize).
EMBER_DECLARE_STUB(cross_device_copy_stub, void (*)(const Tensor& dst, const Tensor& src, bool non_blocking));
EMBER_DECLARE_STUB(fill_stub, void (*)(const Tensor& dst, double value));

// broadcast + dtype conversion + devices; non_blocking as for cross_device_copy_stub
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor to_dtype(const Tensor& x, DType dtype);  // x itself when already that dtype
Tensor to_device(const Tensor& x, Device device, bool non_blocking = false);
// A copy of CPU tensor x in page-locked memory (x itself when it already is); needs the CUDA
// backend and a device. Copies from pinned memory to a GPU can overlap with compute.
Tensor pin_memory(const Tensor& x);
bool is_pinned(const Tensor& x);

}  // namespace ember::native
