#include "engine/distributed/nccl/nccl_utils.h"

#include <cstring>

namespace fsdp::distributed::nccl_internal {

namespace {
constexpr size_t kUniqueIdHexDigits = 2 * static_cast<size_t>(NCCL_UNIQUE_ID_BYTES);
}  // namespace

ncclDataType_t ToNcclDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt64: return ncclInt64;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "the NCCL backend has no data type for dtype #",
             static_cast<int>(dtype));
}

ncclRedOp_t ToNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kPremulSum:
      FSDP_THROW(ErrorCode::kInvalidArgument,
                 "ReduceOp PREMUL_SUM has no built-in NCCL op; it is created per call with "
                 "ncclRedOpCreatePreMulSum");
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown ReduceOp #", static_cast<int>(op));
}

PremulScalar EncodePremulScalar(double factor, DType dtype) {
  PremulScalar s;
  switch (dtype) {
    case DType::kFloat32: {
      const auto v = static_cast<float>(factor);
      std::memcpy(s.bytes, &v, sizeof(v));
      return s;
    }
    case DType::kFloat64:
      std::memcpy(s.bytes, &factor, sizeof(factor));
      return s;
    case DType::kFloat16: {
      const uint16_t bits = FloatToHalfBits(static_cast<float>(factor));
      std::memcpy(s.bytes, &bits, sizeof(bits));
      return s;
    }
    case DType::kBFloat16: {
      const uint16_t bits = FloatToBFloat16Bits(static_cast<float>(factor));
      std::memcpy(s.bytes, &bits, sizeof(bits));
      return s;
    }
    case DType::kInt64: break;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "ReduceOp PREMUL_SUM needs a floating-point dtype, got ",
             DTypeName(dtype));
}

const char* NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclNumResults: break;
  }
  return "ncclUnknownResult";
}

ErrorCode NcclErrorCode(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return ErrorCode::kInvalidArgument;
    case ncclUnhandledCudaError:
    case ncclSystemError:
    case ncclRemoteError: return ErrorCode::kUnavailable;
    default: return ErrorCode::kInternal;
  }
}

std::string FormatNcclError(const std::string& call, ncclResult_t result,
                            const std::string& last_error) {
  std::string msg = call + " failed: " + NcclResultName(result) + " (" +
                    ncclGetErrorString(result) + ")";
  if (!last_error.empty()) msg += "; NCCL: " + last_error;
  return msg;
}

std::string NcclLastError(ncclComm_t comm) {
  const char* s = ncclGetLastError(comm);
  return s == nullptr ? std::string() : std::string(s);
}

ErrorCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable: return ErrorCode::kUnavailable;
    default: return ErrorCode::kInternal;
  }
}

std::string FormatCudaError(const std::string& call, cudaError_t error) {
  return call + " failed: " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

void ThrowCudaError(cudaError_t error, const char* call, const std::string& context) {
  // Clears a non-sticky error so that later, unrelated calls are not blamed for it.
  cudaGetLastError();
  FSDP_THROW(CudaErrorCode(error), context, context.empty() ? "" : ": ",
             FormatCudaError(call, error));
}

void ThrowNcclError(ncclResult_t result, const char* call, const std::string& context,
                    ncclComm_t comm) {
  FSDP_THROW(NcclErrorCode(result), context, context.empty() ? "" : ": ",
             FormatNcclError(call, result, NcclLastError(comm)));
}

std::string UniqueIdStoreKey(const std::string& prefix, const std::string& group_name) {
  std::string key = prefix;
  if (!key.empty() && key.back() != '/') key += '/';
  return key + "nccl/pg" + group_name + "/unique_id";
}

std::string EncodeUniqueId(const ncclUniqueId& id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(kUniqueIdHexDigits);
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

ncclUniqueId DecodeUniqueId(const std::string& text, const std::string& key) {
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, text.size() == kUniqueIdHexDigits,
                  "NCCL unique id at store key '", key, "' has ", text.size(),
                  " characters, expected ", kUniqueIdHexDigits,
                  " hex digits (a store shared with another run, or a corrupt value?)");
  ncclUniqueId id;
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    const int hi = HexValue(text[2 * i]);
    const int lo = HexValue(text[2 * i + 1]);
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, hi >= 0 && lo >= 0, "NCCL unique id at store key '",
                    key, "' has a non-hex character at offset ", hi < 0 ? 2 * i : 2 * i + 1);
    id.internal[i] = static_cast<char>((hi << 4) | lo);
  }
  return id;
}

}  // namespace fsdp::distributed::nccl_internal
