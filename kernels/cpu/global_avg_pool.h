// The global average pool that ends a ResNet (adaptive_avg_pool2d to 1x1, or avg_pool2d with
// the whole plane as its window) over f32, forward and backward
// (kernels/cpu/global_avg_pool.cpp). kernels/cpu/pooling.cpp runs every other geometry and type.
#pragma once
#include <cstdint>

#include "core/native/pooling.h"

namespace ember::cpu {

// Whether global_avg_pool_forward / _backward take this geometry.
bool is_global_avg(const native::Pool2dGeometry& g);

// As native::avg_pool2d_stub: out [planes] = the mean of each plane of x [planes, in_h, in_w].
void global_avg_pool_forward(float* out, const float* x, const native::Pool2dGeometry& g);

// As native::avg_pool2d_backward_stub: grad_in [planes, in_h, in_w], written whole.
void global_avg_pool_backward(float* grad_in, const float* grad_out, const native::Pool2dGeometry& g);

}  // namespace ember::cpu
