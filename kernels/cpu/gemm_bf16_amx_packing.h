// Packing for the bf16 AMX GEMM (gemm_bf16_amx.h): operands rearranged into ready-to-load
// tiles, 1 KiB each (16 rows of 64 bytes, loaded with a 64-byte stride), zero-padded at every
// edge so the micro-kernel only ever runs full tiles.
//
//   packed A   16-row panels of op(A); a panel holds one tile per 32 values of k, in k order;
//              tile row r is op(A)[i][k0 .. k0 + 32) for the panel's row i = 16 p + r.
//   packed B   16-column panels of op(B) in the VNNI pairs layout tdpbf16ps reads: tile row q
//              holds, for each of the 16 columns j, the k-pair (op(B)[k0 + 2q][j],
//              op(B)[k0 + 2q + 1][j]) as one 32-bit word.
//
// Plain AVX2 code (the library's baseline), so the emulated backend tests it on any machine.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu::amx {

// Tiles per panel for an inner dimension k: k rounded up to a multiple of 32, over 32.
inline int64_t k_blocks(int64_t k) { return (k + 31) / 32; }

// Rows [i0, i0 + rows) of op(A) (A stored m x k, or k x m when trans_a), all of k, into
// ceil(rows / 16) panels of k_blocks(k) tiles at `out`.
void pack_a(bool trans_a, const BFloat16* a, int64_t lda, int64_t i0, int64_t rows, int64_t k, BFloat16* out);

// Columns [j0, j0 + cols) of op(B) (B stored k x n, or n x k when trans_b), all of k, into
// ceil(cols / 16) panels of k_blocks(k) tiles at `out`.
void pack_b(bool trans_b, const BFloat16* b, int64_t ldb, int64_t j0, int64_t cols, int64_t k, BFloat16* out);

}  // namespace ember::cpu::amx
