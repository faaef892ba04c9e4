// Element types a tensor can hold, their sizes, names and promotion rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

namespace ember {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, boolean };

inline constexpr DType kFloat32 = DType::f32;
inline constexpr DType kFloat64 = DType::f64;
inline constexpr DType kFloat16 = DType::f16;
inline constexpr DType kBFloat16 = DType::bf16;
inline constexpr DType kInt32 = DType::i32;
inline constexpr DType kInt64 = DType::i64;
inline constexpr DType kBool = DType::boolean;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool is_floating(DType t);  // f32 f64 f16 bf16
bool is_integral(DType t);  // i32 i64 bool
// NumPy/PyTorch-style promotion: float beats integer, wider beats narrower,
// f16 with bf16 gives f32.
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace ember
