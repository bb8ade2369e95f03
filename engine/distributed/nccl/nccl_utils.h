// Host-side helpers of the NCCL backend, internal to engine/distributed/nccl (it includes nccl.h and
// the CUDA runtime header, so it is only compiled when the build found NCCL):
//
//   * dtype and reduce-op mapping to ncclDataType_t / ncclRedOp_t (PREMUL_SUM has no built-in
//     op: it needs ncclRedOpCreatePreMulSum with the factor encoded in the payload dtype,
//     PremulScalar);
//   * error formatting and checks for CUDA and NCCL return codes, naming the call, the
//     result's name and cudaGetErrorString / ncclGetErrorString (plus ncclGetLastError);
//   * the rendezvous encoding of an ncclUniqueId: store key "<prefix>/nccl/pg<group>/unique_id"
//     and a lowercase hex value (the FileStore and TCP store carry it as text).
//
// Everything here runs without a GPU and is unit-tested on the CPU (nccl_utils_test.cc).
// Thread-safety: stateless functions.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <string>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::distributed::nccl_internal {

// f32 -> ncclFloat32, f64 -> ncclFloat64, f16 -> ncclFloat16, bf16 -> ncclBfloat16,
// i64 -> ncclInt64.
ncclDataType_t ToNcclDataType(DType dtype);
// SUM -> ncclSum, AVG -> ncclAvg, MIN -> ncclMin, MAX -> ncclMax. PREMUL_SUM throws
// InvalidArgument: it is created per call with ncclRedOpCreatePreMulSum.
ncclRedOp_t ToNcclRedOp(ReduceOp op);

// The PREMUL_SUM factor as one element of the payload dtype (the scalar that
// ncclRedOpCreatePreMulSum reads with ncclScalarHostImmediate), converted the way
// ProcessGroupNCCL does (static_cast<T>(double_factor); half and bfloat16 round to nearest
// even). Only floating-point dtypes are valid (InvalidArgument otherwise).
struct PremulScalar {
  alignas(8) unsigned char bytes[8] = {};
  void* data() { return bytes; }
};
PremulScalar EncodePremulScalar(double factor, DType dtype);

// "ncclSuccess", "ncclUnhandledCudaError", ..., "ncclInProgress"; "ncclUnknownResult" otherwise.
const char* NcclResultName(ncclResult_t result);
// The ErrorCode an NCCL failure maps to: invalid argument/usage -> kInvalidArgument; remote,
// system and CUDA errors -> kUnavailable (a peer or a device is gone); internal -> kInternal.
ErrorCode NcclErrorCode(ncclResult_t result);
// "<call> failed: <name> (<ncclGetErrorString>)" plus "; NCCL: <last_error>" when
// `last_error` is non-empty.
std::string FormatNcclError(const std::string& call, ncclResult_t result,
                            const std::string& last_error);
// ncclGetLastError(comm) as a string ("" when NCCL has nothing to say). `comm` may be null.
std::string NcclLastError(ncclComm_t comm);

// Device-missing errors (no device, no/old driver, invalid device) -> kUnavailable, everything
// else -> kInternal.
ErrorCode CudaErrorCode(cudaError_t error);
// "<call> failed: <cudaGetErrorName> (<cudaGetErrorString>)".
std::string FormatCudaError(const std::string& call, cudaError_t error);
[[noreturn]] void ThrowCudaError(cudaError_t error, const char* call, const std::string& context);
[[noreturn]] void ThrowNcclError(ncclResult_t result, const char* call, const std::string& context,
                                 ncclComm_t comm);

// Store key of a group's unique id: "<prefix>/nccl/pg<group_name>/unique_id" (no leading
// slash when the prefix is empty).
std::string UniqueIdStoreKey(const std::string& prefix, const std::string& group_name);
// 2 * NCCL_UNIQUE_ID_BYTES lowercase hex digits.
std::string EncodeUniqueId(const ncclUniqueId& id);
// Inverse of EncodeUniqueId; throws DataLoss naming `key` when the text has the wrong length
// or a non-hex digit.
ncclUniqueId DecodeUniqueId(const std::string& text, const std::string& key);

}  // namespace fsdp::distributed::nccl_internal

// Checks a CUDA runtime call; on failure throws fsdp::Error naming the call (its source text),
// the error's name and cudaGetErrorString, prefixed by `context` (a string expression that is
// only evaluated on failure).
#define FSDP_CUDA_CHECK(call, context)                                                  \
  do {                                                                                  \
    const cudaError_t fsdp_cuda_err_ = (call);                                          \
    if (fsdp_cuda_err_ != cudaSuccess)                                                  \
      ::fsdp::distributed::nccl_internal::ThrowCudaError(fsdp_cuda_err_, #call, (context));    \
  } while (0)
