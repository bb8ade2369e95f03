// CUDA scaled-dot-product attention in the math form of the CPU kernel: S = q kᵀ (cuBLAS) times
// scale, plus the additive mask, a row softmax that applies the causal mask and turns fully
// masked rows into zeros (one warp per row), the Philox dropout mask, and O = (P ∘ M) v.
// The backward composes cuBLAS products, the softmax backward and sum_to_size.
#include <cuda_runtime.h>

#include "engine/ops/broadcast.h"
#include "engine/ops/cuda/cuda_kernels.h"
#include "engine/ops/cuda/cuda_util.cuh"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels::cuda {

namespace {

// In place on p ([rows = batch * sq, sk], compute dtype T).
template <typename T>
__global__ void AttentionSoftmaxKernel(T* p, int64_t rows, int64_t sq, int64_t sk, bool causal) {
  for (int64_t r = GlobalWarp(); r < rows; r += WarpCount()) {
    T* row = p + r * sk;
    const int64_t i = r % sq;
    const int64_t limit = causal ? (i + 1 < sk ? i + 1 : sk) : sk;  // keys [0, limit) are visible
    T mx = -Infinity<T>();
    for (int64_t j = Lane(); j < limit; j += kWarpSize) mx = row[j] > mx ? row[j] : mx;
    mx = WarpMax(mx);
    if (mx == -Infinity<T>()) {  // fully masked row
      for (int64_t j = Lane(); j < sk; j += kWarpSize) row[j] = T(0);
      continue;
    }
    T sum = T(0);
    for (int64_t j = Lane(); j < sk; j += kWarpSize) {
      const T e = j < limit ? Exp(row[j] - mx) : T(0);
      row[j] = e;
      sum += e;
    }
    sum = WarpSum(sum);
    const T inv = T(1) / sum;
    for (int64_t j = Lane(); j < sk; j += kWarpSize) row[j] *= inv;
  }
}

}  // namespace

AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                          double dropout_p, bool is_causal, double scale, Generator* generator) {
  const DType dt = PromoteTypes(PromoteTypes(q.dtype(), k.dtype()), v.dtype());
  const DType cd = internal::ComputeDType(dt);
  const Tensor hq = Cast(q, cd), hk = Cast(k, cd), hv = Cast(v, cd);
  AttentionResult r;
  r.scale = scale;
  Tensor s = Bmm(hq, hk, false, true, cd);
  const Shape score_shape = s.sizes();
  if (dropout_p > 0.0) r.dropout_mask = DropoutMask(score_shape, dropout_p, cd, q.device(), *generator);
  s = Unary("scaled_dot_product_attention", UnaryOp::kMulScalar, scale, s, cd);
  if (attn_mask.defined()) {
    s = Binary("scaled_dot_product_attention", BinaryOp::kAdd, 1.0, s, Cast(attn_mask, cd), cd);
  }
  const int64_t sq = q.size(-2), sk = k.size(-2);
  const int64_t rows = s.numel() / (sk > 0 ? sk : 1);
  if (s.numel() > 0) {
    DeviceGuard guard(q.device());
    const LaunchConfig c = WarpPerRow(rows);
    DispatchFloatCompute(cd, "scaled_dot_product_attention", [&](auto tag) {
      using T = decltype(tag);
      AttentionSoftmaxKernel<T><<<c.blocks, c.threads, 0, StreamOf(q.device())>>>(s.data<T>(), rows, sq, sk, is_causal);
    });
    CheckLaunch("attention softmax kernel");
  }
  r.attn = s;
  const Tensor pd = r.dropout_mask.defined() ? Binary("scaled_dot_product_attention", BinaryOp::kMul, 1.0, s,
                                                      r.dropout_mask, cd)
                                             : s;
  r.output = Cast(Bmm(pd, hv, false, false, cd), dt);
  return r;
}

AttentionGrads ScaledDotProductAttentionBackward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& attn, const Tensor& dropout_mask, double scale,
                                                 bool need_q, bool need_k, bool need_v, bool need_mask,
                                                 const Shape& mask_shape, DType mask_dtype) {
  const char* op = "scaled_dot_product_attention_backward";
  const DType dt = PromoteTypes(PromoteTypes(q.dtype(), k.dtype()), v.dtype());
  const DType cd = internal::ComputeDType(dt);
  const Tensor hg = Cast(grad, cd), hq = Cast(q, cd), hk = Cast(k, cd), hv = Cast(v, cd);
  const Tensor p = Cast(attn, cd);
  const Tensor hm = dropout_mask.defined() ? Cast(dropout_mask, cd) : Tensor();
  const Tensor pd = hm.defined() ? Binary(op, BinaryOp::kMul, 1.0, p, hm, cd) : p;
  AttentionGrads g;
  if (need_v) g.v = Cast(Bmm(pd, hg, true, false, cd), v.dtype());
  if (!(need_q || need_k || need_mask)) return g;
  Tensor dp = Bmm(hg, hv, false, true, cd);
  if (hm.defined()) dp = Binary(op, BinaryOp::kMul, 1.0, dp, hm, cd);
  // ds = p * (dp - rowsum(dp * p)): the softmax backward over the last dimension.
  const Tensor ds = SoftmaxBackward(dp, p, p.dim() - 1, false);
  if (need_q) g.q = Cast(Unary(op, UnaryOp::kMulScalar, scale, Bmm(ds, hk, false, false, cd), cd), q.dtype());
  if (need_k) g.k = Cast(Unary(op, UnaryOp::kMulScalar, scale, Bmm(ds, hq, true, false, cd), cd), k.dtype());
  if (need_mask) g.attn_mask = Cast(SumToShape(ds, mask_shape), mask_dtype);
  return g;
}

}  // namespace fsdp::ops::kernels::cuda
