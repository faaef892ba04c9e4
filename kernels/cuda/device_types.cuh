// Element types as CUDA kernels see them: DType -> device type, and the float arithmetic of
// the 16-bit types (load as float, compute, round to nearest even on store), matching the CPU
// kernels' acc_t<T>.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/type_dispatch.h"

namespace ember::cuda {

template <typename T> struct Acc {
  using type = T;
  static __device__ __forceinline__ T load(T v) { return v; }
  static __device__ __forceinline__ T store(T v) { return v; }
};
template <> struct Acc<__half> {
  using type = float;
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct Acc<__nv_bfloat16> {
  using type = float;
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <typename T> using device_acc_t = typename Acc<T>::type;

// Runtime dtype -> device element type, as a type_tag (see core/type_dispatch.h).
template <typename F>
decltype(auto) visit_device_type(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::f64: return fn(type_tag<double>{});
    case DType::f16: return fn(type_tag<__half>{});
    case DType::bf16: return fn(type_tag<__nv_bfloat16>{});
    case DType::i32: return fn(type_tag<int32_t>{});
    case DType::i64: return fn(type_tag<int64_t>{});
    case DType::boolean: return fn(type_tag<bool>{});
  }
  EMBER_FAIL(op, ": unknown dtype");
}

// visit_device_type for the floating types only; others raise naming `op`.
template <typename F>
void visit_device_floating(DType t, const char* op, F&& fn) {
  visit_device_type(t, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      fn(tag);
    } else {
      EMBER_FAIL(op, ": expected a floating-point tensor, got ", dtype_name(t));
    }
  });
}

}  // namespace ember::cuda
