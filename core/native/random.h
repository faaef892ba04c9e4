// Random fills from the counter-based generator; element i uses counter (state.offset + i).
#pragma once
#include "core/dispatch.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace ember::native {

enum class RandomKind { Uniform, Normal, Integer };
// Uniform: [a, b); Normal: mean a, std b; Integer: [a, b).
EMBER_DECLARE_STUB(random_stub, void (*)(const Tensor& out, RandomKind kind, double a, double b,
                                         GeneratorState state));

void random_fill(const Tensor& out, RandomKind kind, double a, double b,
                 Generator& gen = default_generator());

}  // namespace ember::native
