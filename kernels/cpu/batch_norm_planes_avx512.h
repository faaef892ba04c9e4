// Batch norm's plane walk over f32 planes on AVX-512: the plane sums of
// batch_norm_channels::plane_pair_sums and the per-channel maps of batch_norm_planes::map_planes,
// bit for bit. The sums keep the 8-lane code's double lanes (lane k of a plane adds its elements
// k, k + 8, k + 16, ... in that order; the halves are added as it adds them), now one zmm
// register wide; the maps compute each element with the same float operations as the 8-lane
// code's forms. Half the instructions of the AVX2 loops, whose conversions to double bound the
// sums. Call only when cpu_capability() is CpuCapability::Avx512 (avx512f, bw, vl, dq).
#pragma once
#include <cstdint>

#include "kernels/cpu/normalization_lanes.h"

namespace ember::cpu::batch_norm_planes {

// out[p] = {sum v, sum v * w} over plane p of the `planes` planes of s elements from v and w
// (w may equal v). ahead != 0: the elements `ahead` past those read are fetched meanwhile, a line
// at a time between the sums' steps (the next sample's planes, which no hardware prefetcher
// follows to).
void plane_pair_sums_avx512(norm_lanes::Sums2* out, const float* v, const float* w, int64_t planes, int64_t s,
                            int64_t ahead);

// out = p a + q b + d over planes [pb, pe) of s >= 16 elements, plane i taking the coefficients
// of channel i % channels; q null: out = p a + d (b unused). As map_planes<true> / <false>.
// ahead != 0: the lines of out `ahead` elements past those written are claimed for writing
// meanwhile.
void map_planes_avx512(float* out, const float* p, const float* q, int64_t pb, int64_t pe, int64_t s,
                       int64_t channels, const float* a, const float* b, const float* d, int64_t ahead);

}  // namespace ember::cpu::batch_norm_planes
