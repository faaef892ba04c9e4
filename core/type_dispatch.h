// Runtime dtype -> compile-time type. `fn` is a generic lambda taking a type tag:
//   visit_floating(t.dtype(), "relu", [&](auto tag) { using T = typename decltype(tag)::type; ... });
// Half types compute in float: use `acc_t<T>` for arithmetic.
#pragma once
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace ember {

template <typename T> struct type_tag { using type = T; };

template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<Half> { using type = float; };
template <> struct acc_type<BFloat16> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

template <typename F>
decltype(auto) visit_floating(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::f64: return fn(type_tag<double>{});
    case DType::f16: return fn(type_tag<Half>{});
    case DType::bf16: return fn(type_tag<BFloat16>{});
    default: EMBER_FAIL(op, ": expected a floating-point tensor, got ", dtype_name(t));
  }
}

template <typename F>
decltype(auto) visit_all(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::f64: return fn(type_tag<double>{});
    case DType::f16: return fn(type_tag<Half>{});
    case DType::bf16: return fn(type_tag<BFloat16>{});
    case DType::i32: return fn(type_tag<int32_t>{});
    case DType::i64: return fn(type_tag<int64_t>{});
    case DType::boolean: return fn(type_tag<bool>{});
  }
  EMBER_FAIL(op, ": unknown dtype");
}

template <typename F>
decltype(auto) visit_index(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::i32: return fn(type_tag<int32_t>{});
    case DType::i64: return fn(type_tag<int64_t>{});
    default: EMBER_FAIL(op, ": expected an integer (int32 or int64) index tensor, got ", dtype_name(t));
  }
}

}  // namespace ember
