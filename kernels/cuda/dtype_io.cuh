// Element access for the fused CUDA kernels whose operands each come in their own floating
// dtype (fused_add_layer_norm.cu, fused_softmax.cu): elements are read and written through a
// dtype code switched on per access, one kernel per compute type instead of one per
// combination of dtypes. Also the explicitly rounded operations those kernels use to repeat
// the CPU's arithmetic operation for operation, and the host checks they share.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "core/tensor.h"
#include "core/type_dispatch.h"
#include "kernels/cuda/device_types.cuh"

namespace ember::cuda {

template <typename T>
constexpr bool is_device_float_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                   std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The data of an optional operand as P*, or null when it is undefined.
template <typename P>
P* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<P*>(t.raw_data()) : nullptr;
}

enum class Elem : int { f32, f64, f16, bf16 };

inline Elem elem_of(const Tensor& t, const char* op, const char* what) {
  switch (t.dtype()) {
    case DType::f32: return Elem::f32;
    case DType::f64: return Elem::f64;
    case DType::f16: return Elem::f16;
    case DType::bf16: return Elem::bf16;
    default: EMBER_FAIL(op, ": ", what, " must be floating point, got ", dtype_name(t.dtype()), " of shape ", t.shape());
  }
}

template <typename A>
__device__ __forceinline__ A load_elem(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::f32: return A(static_cast<const float*>(p)[i]);
    case Elem::f64: return A(static_cast<const double*>(p)[i]);
    case Elem::f16: return A(__half2float(static_cast<const __half*>(p)[i]));
    default: return A(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

template <typename A>
__device__ __forceinline__ void store_elem(void* p, Elem t, int64_t i, A v) {
  switch (t) {
    case Elem::f32: static_cast<float*>(p)[i] = float(v); break;
    case Elem::f64: static_cast<double*>(p)[i] = double(v); break;
    case Elem::f16:
      if constexpr (std::is_same_v<A, double>) static_cast<__half*>(p)[i] = __double2half(v);
      else static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      if constexpr (std::is_same_v<A, double>) static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v);
      else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
  }
}

// Rounded operations the compiler may not fuse into an FMA.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// fn(type_tag<A>) for the compute type named by a saved tensor's dtype: f32 or f64.
template <typename F>
void visit_compute_type(DType dt, const char* op, F&& fn) {
  if (dt == DType::f32) return fn(type_tag<float>{});
  if (dt == DType::f64) return fn(type_tag<double>{});
  EMBER_FAIL(op, ": the compute dtype must be f32 or f64, got ", dtype_name(dt));
}

// A dropout keep mask, when given, is contiguous bool with `numel` elements.
inline void check_keep(const Tensor& keep, int64_t numel, const char* op) {
  if (!keep.defined()) return;
  EMBER_CHECK(keep.dtype() == DType::boolean && keep.numel() == numel && keep.is_contiguous(), op,
              ": keep mask must be contiguous bool with ", numel, " elements, got ", dtype_name(keep.dtype()),
              " of shape ", keep.shape());
}

}  // namespace ember::cuda
