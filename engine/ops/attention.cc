#include "engine/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Core>

#include "engine/ops/broadcast.h"
#include "engine/ops/dropout.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

using internal::HostAs;
using internal::Restore;

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct AttnDims {
  Shape batch;
  int64_t nb;  // batch count
  int64_t sq;
  int64_t sk;
  int64_t d;
  int64_t dv;
};

AttnDims CheckAttention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  internal::CheckFloating(op, "query", q);
  internal::CheckFloating(op, "key", k);
  internal::CheckFloating(op, "value", v);
  FSDP_CHECK(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(), op,
             ": expected query, key and value of equal rank >= 2, got ", ShapeStr(q.sizes()), ", ",
             ShapeStr(k.sizes()), ", ", ShapeStr(v.sizes()));
  AttnDims d;
  d.batch = Shape(q.sizes().begin(), q.sizes().end() - 2);
  FSDP_CHECK(Shape(k.sizes().begin(), k.sizes().end() - 2) == d.batch &&
                 Shape(v.sizes().begin(), v.sizes().end() - 2) == d.batch,
             op, ": batch dimensions of query ", ShapeStr(q.sizes()), ", key ", ShapeStr(k.sizes()),
             " and value ", ShapeStr(v.sizes()), " differ");
  d.nb = Numel(d.batch);
  d.sq = q.size(-2);
  d.sk = k.size(-2);
  d.d = q.size(-1);
  d.dv = v.size(-1);
  FSDP_CHECK(k.size(-1) == d.d && v.size(-2) == d.sk, op, ": query ", ShapeStr(q.sizes()), ", key ",
             ShapeStr(k.sizes()), " and value ", ShapeStr(v.sizes()), " are not compatible");
  return d;
}

Shape WithTail(const Shape& batch, int64_t a, int64_t b) {
  Shape s = batch;
  s.push_back(a);
  s.push_back(b);
  return s;
}

}  // namespace

AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& attn_mask, double dropout_p, bool is_causal,
                                          std::optional<double> scale, Generator* generator) {
  const char* op = "scaled_dot_product_attention";
  const AttnDims dims = CheckAttention(op, q, k, v);
  FSDP_CHECK(!(attn_mask.defined() && is_causal), op,
             ": explicit attn_mask should not be set when is_causal=True");
  FSDP_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  FSDP_CHECK(dropout_p == 0.0 || generator != nullptr, op, ": dropout_p > 0 needs a generator");
  const Shape score_shape = WithTail(dims.batch, dims.sq, dims.sk);
  Tensor mask;
  if (attn_mask.defined()) {
    internal::CheckFloating(op, "attn_mask", attn_mask);
    FSDP_CHECK(BroadcastShapes(attn_mask.sizes(), score_shape, op) == score_shape, op, ": attn_mask ",
               ShapeStr(attn_mask.sizes()), " cannot be broadcast to ", ShapeStr(score_shape));
  }
  if (internal::OnCuda(op, {&q, &k, &v, &attn_mask})) {
    const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
    return FSDP_CUDA_KERNEL(op, ScaledDotProductAttention(q, k, v, attn_mask, dropout_p, is_causal, s, generator));
  }
  const DType dt = PromoteTypes(PromoteTypes(q.dtype(), k.dtype()), v.dtype());
  const DType cd = internal::ComputeDType(dt);
  if (attn_mask.defined()) mask = Expand(HostAs(attn_mask, cd), score_shape);
  const Tensor hq = HostAs(q, cd), hk = HostAs(k, cd), hv = HostAs(v, cd);
  AttentionResult r;
  r.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
  if (dropout_p > 0.0) r.dropout_mask = DropoutMask(score_shape, dropout_p, cd, *generator);
  r.attn = Tensor::empty(score_shape, cd);
  Tensor out = internal::DispatchFloat(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor o = Tensor::empty(WithTail(dims.batch, dims.sq, dims.dv), cd);
    const T s = static_cast<T>(r.scale);
    const T ninf = -std::numeric_limits<T>::infinity();
    for (int64_t b = 0; b < dims.nb; ++b) {
      Eigen::Map<const RowMat<T>> mq(hq.data<T>() + b * dims.sq * dims.d, dims.sq, dims.d);
      Eigen::Map<const RowMat<T>> mk(hk.data<T>() + b * dims.sk * dims.d, dims.sk, dims.d);
      Eigen::Map<const RowMat<T>> mv(hv.data<T>() + b * dims.sk * dims.dv, dims.sk, dims.dv);
      Eigen::Map<RowMat<T>> p(r.attn.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk);
      Eigen::Map<RowMat<T>> mo(o.data<T>() + b * dims.sq * dims.dv, dims.sq, dims.dv);
      if (dims.d > 0) {
        p.noalias() = (mq * mk.transpose()) * s;
      } else {
        p.setZero();
      }
      if (mask.defined()) {
        p += Eigen::Map<const RowMat<T>>(mask.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk);
      }
      for (int64_t i = 0; i < dims.sq; ++i) {
        if (is_causal) {
          for (int64_t j = i + 1; j < dims.sk; ++j) p(i, j) = ninf;
        }
        T mx = ninf;
        for (int64_t j = 0; j < dims.sk; ++j) mx = std::max(mx, p(i, j));
        if (mx == ninf) {  // fully masked row
          p.row(i).setZero();
          continue;
        }
        T sum = T(0);
        for (int64_t j = 0; j < dims.sk; ++j) {
          p(i, j) = std::exp(p(i, j) - mx);
          sum += p(i, j);
        }
        p.row(i) *= T(1) / sum;
      }
      if (dims.sk == 0) {
        mo.setZero();
      } else if (r.dropout_mask.defined()) {
        Eigen::Map<const RowMat<T>> dm(r.dropout_mask.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk);
        mo.noalias() = p.cwiseProduct(dm) * mv;
      } else {
        mo.noalias() = p * mv;
      }
    }
    return o;
  });
  r.output = Restore(out, dt, q.device());
  return r;
}

AttentionGrads ScaledDotProductAttentionBackward(const Tensor& grad, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& attn,
                                                 const Tensor& dropout_mask, double scale, bool need_q,
                                                 bool need_k, bool need_v, bool need_mask,
                                                 const Shape& mask_shape, DType mask_dtype) {
  const char* op = "scaled_dot_product_attention_backward";
  const AttnDims dims = CheckAttention(op, q, k, v);
  const Shape score_shape = WithTail(dims.batch, dims.sq, dims.sk);
  FSDP_CHECK(grad.sizes() == WithTail(dims.batch, dims.sq, dims.dv) && attn.sizes() == score_shape, op,
             ": gradient ", ShapeStr(grad.sizes()), " or attention ", ShapeStr(attn.sizes()),
             " does not match query ", ShapeStr(q.sizes()), " / value ", ShapeStr(v.sizes()));
  if (internal::OnCuda(op, {&grad, &q, &k, &v, &attn, &dropout_mask})) {
    return FSDP_CUDA_KERNEL(op, ScaledDotProductAttentionBackward(grad, q, k, v, attn, dropout_mask, scale, need_q,
                                                                  need_k, need_v, need_mask, mask_shape, mask_dtype));
  }
  const DType dt = PromoteTypes(PromoteTypes(q.dtype(), k.dtype()), v.dtype());
  const DType cd = internal::ComputeDType(dt);
  const Tensor hg = HostAs(grad, cd), hq = HostAs(q, cd), hk = HostAs(k, cd), hv = HostAs(v, cd);
  const Tensor hp = HostAs(attn, cd), hm = HostAs(dropout_mask, cd);
  AttentionGrads g;
  internal::DispatchFloat(cd, op, [&](auto tag) {
    using T = decltype(tag);
    Tensor dq = Tensor::zeros(q.sizes(), cd), dk = Tensor::zeros(k.sizes(), cd);
    Tensor dv = Tensor::zeros(v.sizes(), cd);
    Tensor ds_all = need_mask ? Tensor::empty(score_shape, cd) : Tensor();
    const T s = static_cast<T>(scale);
    RowMat<T> pd, dp, ds;
    for (int64_t b = 0; b < dims.nb; ++b) {
      Eigen::Map<const RowMat<T>> mg(hg.data<T>() + b * dims.sq * dims.dv, dims.sq, dims.dv);
      Eigen::Map<const RowMat<T>> mq(hq.data<T>() + b * dims.sq * dims.d, dims.sq, dims.d);
      Eigen::Map<const RowMat<T>> mk(hk.data<T>() + b * dims.sk * dims.d, dims.sk, dims.d);
      Eigen::Map<const RowMat<T>> mv(hv.data<T>() + b * dims.sk * dims.dv, dims.sk, dims.dv);
      Eigen::Map<const RowMat<T>> p(hp.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk);
      if (hm.defined()) {
        Eigen::Map<const RowMat<T>> dm(hm.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk);
        pd = p.cwiseProduct(dm);
      } else {
        pd = p;
      }
      if (need_v && dims.sq > 0) {
        Eigen::Map<RowMat<T>>(dv.data<T>() + b * dims.sk * dims.dv, dims.sk, dims.dv).noalias() =
            pd.transpose() * mg;
      }
      if (!(need_q || need_k || need_mask)) continue;
      if (dims.dv > 0) {
        dp.noalias() = mg * mv.transpose();
      } else {
        dp.setZero(dims.sq, dims.sk);
      }
      if (hm.defined()) {
        dp = dp.cwiseProduct(Eigen::Map<const RowMat<T>>(hm.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk));
      }
      ds.resize(dims.sq, dims.sk);
      for (int64_t i = 0; i < dims.sq; ++i) {
        T dot = T(0);
        for (int64_t j = 0; j < dims.sk; ++j) dot += dp(i, j) * p(i, j);
        for (int64_t j = 0; j < dims.sk; ++j) ds(i, j) = p(i, j) * (dp(i, j) - dot);
      }
      if (need_mask) {
        Eigen::Map<RowMat<T>>(ds_all.data<T>() + b * dims.sq * dims.sk, dims.sq, dims.sk) = ds;
      }
      if (need_q && dims.sk > 0) {
        Eigen::Map<RowMat<T>>(dq.data<T>() + b * dims.sq * dims.d, dims.sq, dims.d).noalias() = (ds * mk) * s;
      }
      if (need_k && dims.sq > 0) {
        Eigen::Map<RowMat<T>>(dk.data<T>() + b * dims.sk * dims.d, dims.sk, dims.d).noalias() =
            (ds.transpose() * mq) * s;
      }
    }
    if (need_q) g.q = Restore(dq, q.dtype(), q.device());
    if (need_k) g.k = Restore(dk, k.dtype(), k.device());
    if (need_v) g.v = Restore(dv, v.dtype(), v.device());
    if (need_mask) g.attn_mask = Restore(SumToShape(ds_all, mask_shape), mask_dtype, q.device());
  });
  return g;
}

}  // namespace fsdp::ops::kernels
