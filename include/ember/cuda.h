// The CUDA side of Ember for user code: streams and events, record_stream, the TF32 switch.
// Device placement, memory statistics and synchronisation are in <ember/ember.h>
// (core/device_api.h); this header exists in builds with the CUDA backend only.
#pragma once
#if !defined(EMBER_WITH_CUDA)
#error "<ember/cuda.h> needs Ember built with the CUDA backend (EMBER_WITH_CUDA)"
#endif

#include "kernels/cuda/cublas_handles.h"   // cuda::set_allow_tf32 (matmul in TF32, off by default)
#include "kernels/cuda/cuda_allocator.h"   // cuda::record_stream
#include "kernels/cuda/cuda_stream.h"      // cuda::Stream, cuda::Event, cuda::StreamGuard
