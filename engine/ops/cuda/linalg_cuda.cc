// Matrix products on cuBLAS: cublasGemmEx / cublasGemmStridedBatchedEx with float32 compute
// for float32, float16 and bfloat16 operands (float16/bfloat16 results rounded once, like the
// CPU kernels) and float64 compute for float64. TF32 is not enabled (the handle keeps
// CUBLAS_DEFAULT_MATH), matching torch.backends.cuda.matmul.allow_tf32 = False.
// Row-major problems are mapped to cuBLAS's column-major convention by PlanRowMajorGemm
// (launch_plan.h, unit-tested on the host).
#include <cublas_v2.h>

#include <map>

#include "engine/ops/cuda/blas_types.h"
#include "engine/ops/cuda/cuda_host_util.h"
#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/launch_plan.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

void BlasCheck(cublasStatus_t status, const char* what) {
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, status == CUBLAS_STATUS_SUCCESS, what, " failed: ",
                  cublasGetStatusName(status), " (", cublasGetStatusString(status), ")");
}

// One cuBLAS handle per (thread, device), created on first use and destroyed when the thread
// exits (cuBLAS handles must not be shared between threads without external locking).
class BlasHandles {
 public:
  ~BlasHandles() {
    for (auto& [device, handle] : handles_) cublasDestroy(handle);
  }
  cublasHandle_t Get(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    BlasCheck(cublasCreate(&h), "cublasCreate");
    handles_.emplace(device, h);
    return h;
  }

 private:
  std::map<int, cublasHandle_t> handles_;
};

cublasHandle_t HandleFor(Device device) {
  thread_local BlasHandles handles;
  cublasHandle_t h = handles.Get(device.index);
  BlasCheck(cublasSetStream(h, StreamOf(device)), "cublasSetStream");
  return h;
}

int BlasInt(int64_t v, const char* what) {
  FSDP_CHECK(v >= 0 && v <= INT32_MAX, "cuBLAS: ", what, " = ", v, " does not fit a 32-bit int");
  return static_cast<int>(v);
}

// out[batch] (row-major [M, N]) = beta * out + op(a) op(b) for `batch` matrices stored
// contiguously; a, b and out share `dtype`. beta is 0 or 1.
void Gemm(const Tensor& a, int64_t a_rows, int64_t a_cols, bool ta, const Tensor& b, int64_t b_rows,
          int64_t b_cols, bool tb, Tensor& out, int64_t batch, bool accumulate) {
  const GemmPlan p = PlanRowMajorGemm(a_rows, a_cols, ta, b_rows, b_cols, tb);
  if (p.m == 0 || p.n == 0 || batch == 0) return;
  if (p.k == 0) {
    if (!accumulate) out.zero_();
    return;
  }
  const DType dtype = out.dtype();
  DeviceGuard guard(out.device());
  cublasHandle_t h = HandleFor(out.device());
  const cudaDataType_t type = BlasDataType(dtype);
  const float alpha_f = 1.0f, beta_f = accumulate ? 1.0f : 0.0f;
  const double alpha_d = 1.0, beta_d = accumulate ? 1.0 : 0.0;
  const bool f64 = dtype == DType::kFloat64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha_d) : static_cast<const void*>(&alpha_f);
  const void* beta = f64 ? static_cast<const void*>(&beta_d) : static_cast<const void*>(&beta_f);
  const cublasComputeType_t compute = BlasComputeType(dtype);
  const int m = BlasInt(p.m, "m"), n = BlasInt(p.n, "n"), k = BlasInt(p.k, "k");
  const int ld1 = BlasInt(p.ld_first, "ldb"), ld2 = BlasInt(p.ld_second, "lda"), ldc = BlasInt(p.ldc, "ldc");
  if (batch == 1) {
    BlasCheck(cublasGemmEx(h, BlasOp(p.trans_first), BlasOp(p.trans_second), m, n, k, alpha, b.data_ptr(), type,
                           ld1, a.data_ptr(), type, ld2, beta, out.data_ptr(), type, ldc, compute,
                           CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
  } else {
    BlasCheck(cublasGemmStridedBatchedEx(h, BlasOp(p.trans_first), BlasOp(p.trans_second), m, n, k, alpha,
                                         b.data_ptr(), type, ld1, p.stride_b, a.data_ptr(), type, ld2, p.stride_a,
                                         beta, out.data_ptr(), type, ldc, p.stride_c, BlasInt(batch, "batch"),
                                         compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
  }
}

Shape MatShape(const Shape& batch, int64_t rows, int64_t cols) {
  Shape s = batch;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

}  // namespace

Tensor Mm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, DType dtype) {
  const Tensor ca = Cast(a, dtype), cb = Cast(b, dtype);
  const int64_t m = transpose_a ? a.size(1) : a.size(0), n = transpose_b ? b.size(0) : b.size(1);
  Tensor out = Tensor::empty({m, n}, dtype, a.device());
  Gemm(ca, a.size(0), a.size(1), transpose_a, cb, b.size(0), b.size(1), transpose_b, out, 1, false);
  return out;
}

Tensor Bmm(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, DType dtype) {
  const Tensor ca = Cast(a, dtype), cb = Cast(b, dtype);
  const Shape batch(a.sizes().begin(), a.sizes().end() - 2);
  const int64_t m = transpose_a ? a.size(-1) : a.size(-2), n = transpose_b ? b.size(-2) : b.size(-1);
  Tensor out = Tensor::empty(MatShape(batch, m, n), dtype, a.device());
  Gemm(ca, a.size(-2), a.size(-1), transpose_a, cb, b.size(-2), b.size(-1), transpose_b, out, Numel(batch), false);
  return out;
}

Tensor Addmm(const Tensor& bias, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
             DType dtype) {
  const Tensor ca = Cast(a, dtype), cb = Cast(b, dtype);
  const int64_t m = transpose_a ? a.size(1) : a.size(0), n = transpose_b ? b.size(0) : b.size(1);
  // The bias is expanded into the output, then accumulated into (beta = 1).
  Tensor out = Expand(Cast(bias, dtype), {m, n});  // always a new tensor
  Gemm(ca, a.size(0), a.size(1), transpose_a, cb, b.size(0), b.size(1), transpose_b, out, 1, true);
  return out;
}

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType dtype) {
  const int64_t in = x.size(-1), out_features = weight.size(0);
  const int64_t rows = internal::ProdRange(x.sizes(), 0, x.dim() - 1);
  Shape out_shape = x.sizes();
  out_shape.back() = out_features;
  const Tensor cx = Cast(x, dtype), cw = Cast(weight, dtype);
  Tensor out;
  if (bias.defined()) {
    out = Expand(Cast(bias, dtype), {rows, out_features});  // always a new tensor
  } else {
    out = Tensor::empty({rows, out_features}, dtype, x.device());
  }
  Gemm(cx, rows, in, false, cw, out_features, in, true, out, 1, bias.defined());
  return out.view(out_shape);
}

}  // namespace fsdp::ops::kernels::cuda
