// The common CNN average pool, 2x2 windows with stride 2 over f32, every window inside the
// input (avg_pool2d 2x2, and adaptive_avg_pool2d to half the size), forward and backward
// (kernels/cpu/avg_pool_2x2.cpp). kernels/cpu/pooling.cpp runs every other geometry and type.
#pragma once
#include <cstdint>

#include "core/native/pooling.h"

namespace ember::cpu {

// Whether avg_pool_2x2_forward / _backward take this geometry.
bool is_plain_avg_2x2(const native::Pool2dGeometry& g);

// As native::avg_pool2d_stub: out [planes, out_h, out_w] of x [planes, in_h, in_w].
void avg_pool_2x2_forward(float* out, const float* x, const native::Pool2dGeometry& g);

// As native::avg_pool2d_backward_stub: grad_in [planes, in_h, in_w], written whole.
void avg_pool_2x2_backward(float* grad_in, const float* grad_out, const native::Pool2dGeometry& g);

}  // namespace ember::cpu
