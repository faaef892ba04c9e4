// RMS norm's f32 row loops (kernels/cpu/normalization_rms_norm.cpp) on 16 float
// lanes (AVX-512), for rows whose length is a multiple of 16. Bit for bit the
// 8-lane loops: the row sums keep their double lanes (each 16-lane step adds
// its low eight elements, then its high eight, into one zmm register that is
// the 8-lane code's two ymm sums side by side), and every element takes the
// same float operations. The backward step also runs up to four rows at once,
// loading and storing each chunk's double dweight partial sums once for the
// group rather than once a row (the rows still add into them in order). Call
// only when cpu_capability() is CpuCapability::Avx512 (avx512f, bw, vl, dq).
#pragma once
#include <cstdint>

namespace ember::cpu::rms_norm_rows {

// The largest group of rows the functions below take at once.
constexpr int kMaxRows = 4;

// out[r] = sum of x^2 over row r of `rows` (1..kMaxRows) adjacent rows of n, in
// double.
void sum_squares_avx512(double *out, const float *x, int64_t n, int rows);

// y = x * rstd * w (w null: y = x * rstd), products rounded in that order.
void scale_row_avx512(float *y, const float *x, int64_t n, float rstd, const float *w);

// out[r] = sum of (dy w) x over row r of `rows` (1..kMaxRows) adjacent rows of
// dy and x (w null: ones), dy w rounded to float, the sum in double.
void weighted_dots_avx512(double *out, const float *dy, const float *x, const float *w, int64_t n, int rows);

// For each row r of `rows` (1..kMaxRows) adjacent rows: dx = fma(dy w, a[r], x
// b[r]) and dw_part[j] += double((dy x) a[r]), rows in order. dx or dw_part may
// be null (not written).
void backward_rows_avx512(float *dx, double *dw_part, const float *dy, const float *x, const float *w, int64_t n,
                          int rows, const float *a, const float *b);

}  // namespace ember::cpu::rms_norm_rows
