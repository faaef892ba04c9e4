// Rows two at a time, for row kernels whose rows are chains of dependent steps (sums, maxima)
// that a pair of rows overlaps. Such kernels keep each row's arithmetic the same whatever the
// group size, so results do not depend on where a thread's share of rows starts.
#pragma once
#include <cstdint>
#include <type_traits>

namespace ember::cpu {

// fn(r, std::integral_constant<int, R>{}) for rows r .. r + R - 1 of [r0, r1): two at a time,
// then the odd one out.
template <typename Fn>
void for_row_pairs(int64_t r0, int64_t r1, const Fn& fn) {
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) fn(r, std::integral_constant<int, 2>{});
  for (; r < r1; ++r) fn(r, std::integral_constant<int, 1>{});
}

// fn(r, std::integral_constant<int, R>{}) for rows r .. r + R - 1 of [r0, r1): four at a time,
// then the rest one at a time. For chains short enough per element (one add or FMA) that a pair
// of rows still waits on them.
template <typename Fn>
void for_row_quads(int64_t r0, int64_t r1, const Fn& fn) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) fn(r, std::integral_constant<int, 4>{});
  for (; r < r1; ++r) fn(r, std::integral_constant<int, 1>{});
}

}  // namespace ember::cpu
