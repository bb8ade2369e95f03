// Element conversion between dtypes on one CUDA device, on the calling thread's current stream
// (the dtype-changing Tensor::copy_ and to(dtype) of CUDA tensors). Defined next to the cast
// kernel in engine/ops/cuda/elementwise_cuda.cu, only in CUDA builds; the same conversion as
// ConvertElements bit for bit (engine/ops/cuda/numerics.h).
// Thread-safety: stateless.
#pragma once

#include <cstdint>

#include "engine/core/device.h"
#include "engine/core/dtype.h"

namespace fsdp::internal {

void CudaConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                         Device device);

}  // namespace fsdp::internal
