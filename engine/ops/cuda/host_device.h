// FSDP_HOST_DEVICE marks functions that are compiled for both the host and the device, so the
// exact code a CUDA kernel runs (index math, dtype conversions, Philox) is also unit-tested on
// the host by g++. Outside nvcc it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define FSDP_HOST_DEVICE __host__ __device__
#else
#define FSDP_HOST_DEVICE
#endif
