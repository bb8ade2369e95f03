// dtype -> cuBLAS type mapping for the matrix products of linalg_cuda.cc: float32, float16
// and bfloat16 multiply with float32 compute (CUBLAS_COMPUTE_32F, float alpha/beta), float64
// with CUBLAS_COMPUTE_64F. Included only where CUDA is available (linalg_cuda.cc and the
// host unit test under #if FSDP_HAVE_CUDA). Thread-safety: pure functions.
#pragma once

#include <cublas_api.h>
#include <library_types.h>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/ops/cuda/launch_plan.h"

namespace fsdp::ops::kernels::cuda {

inline cudaDataType_t BlasDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat64: return CUDA_R_64F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "cuBLAS matrix products support float32, float64, float16 and bfloat16, got ",
             DTypeName(dtype));
}

inline cublasComputeType_t BlasComputeType(DType dtype) {
  (void)BlasDataType(dtype);  // rejects unsupported dtypes with the same message
  return dtype == DType::kFloat64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
}

inline cublasOperation_t BlasOp(BlasTranspose t) { return t == BlasTranspose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace fsdp::ops::kernels::cuda
