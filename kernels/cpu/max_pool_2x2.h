// The common CNN max pool, 2x2 windows with stride 2 over f32, every window inside the input,
// forward and backward (kernels/cpu/max_pool_2x2.cpp). kernels/cpu/pooling.cpp runs every
// other geometry and type.
#pragma once
#include <cstdint>

#include "core/native/pooling.h"

namespace ember::cpu {

// Whether max_pool_2x2_forward / _backward take this geometry.
bool is_plain_2x2(const native::Pool2dGeometry& g);

// As native::max_pool2d_stub: out and i64 indices [planes, out_h, out_w] of x [planes, in_h, in_w].
void max_pool_2x2_forward(float* out, int64_t* indices, const float* x, const native::Pool2dGeometry& g);

// As native::max_pool2d_backward_stub: grad_in [planes, in_h, in_w], written whole.
void max_pool_2x2_backward(float* grad_in, const float* grad_out, const int64_t* indices,
                           const native::Pool2dGeometry& g);

}  // namespace ember::cpu
