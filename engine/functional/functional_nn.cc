// Differentiable activations, neural-network functions and losses (see functional.h).
#include <cmath>

#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/functional/functional_internal.h"
#include "engine/ops/activation.h"
#include "engine/ops/attention.h"
#include "engine/ops/dropout.h"
#include "engine/ops/embedding.h"
#include "engine/ops/loss.h"
#include "engine/ops/normalization.h"

namespace fsdp {

namespace k = ops::kernels;
using autograd::record_function;
using functional_internal::AsDTypeOf;
using functional_internal::RequiresGrad;
using functional_internal::SavedTensor;
using functional_internal::ShouldRecord;
using functional_internal::TensorList;

// ---- Activations ------------------------------------------------------------------------------

Tensor relu(const Tensor& x) {
  Tensor out = k::Relu(x);
  if (!ShouldRecord({&x})) return out;
  SavedTensor saved(out);
  const DType dt = x.dtype();
  return record_function("ReluBackward0", {x}, out, [saved, dt](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::ReluBackward(g[0], saved.unpack()), dt)};
  });
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  Tensor out = k::Gelu(x, approximate);
  if (!ShouldRecord({&x})) return out;
  SavedTensor saved(x);
  const DType dt = x.dtype();
  return record_function("GeluBackward0", {x}, out, [saved, dt, approximate](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::GeluBackward(g[0], saved.unpack(), approximate), dt)};
  });
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = k::Softmax(x, dim);
  if (!ShouldRecord({&x})) return out;
  SavedTensor saved(out);
  const DType dt = x.dtype();
  return record_function("SoftmaxBackward0", {x}, out, [saved, dt, dim](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::SoftmaxBackward(g[0], saved.unpack(), dim), dt)};
  });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor out = k::LogSoftmax(x, dim);
  if (!ShouldRecord({&x})) return out;
  SavedTensor saved(out);
  const DType dt = x.dtype();
  return record_function("LogSoftmaxBackward0", {x}, out, [saved, dt, dim](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::LogSoftmaxBackward(g[0], saved.unpack(), dim), dt)};
  });
}

// ---- Neural-network functions -----------------------------------------------------------------

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k_in, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale,
                                    Generator* generator) {
  Generator* gen = nullptr;
  if (dropout_p > 0.0) gen = generator ? generator : &RankContext::Current().generator();
  k::AttentionResult r = k::ScaledDotProductAttention(q, k_in, v, attn_mask, dropout_p, is_causal, scale, gen);
  TensorList inputs = {q, k_in, v};
  if (attn_mask.defined()) inputs.push_back(attn_mask);
  if (!ShouldRecord(inputs)) return r.output;
  const bool nq = RequiresGrad(q), nk = RequiresGrad(k_in), nv = RequiresGrad(v), nm = RequiresGrad(attn_mask);
  const Shape mask_shape = attn_mask.defined() ? attn_mask.sizes() : Shape();
  const DType mask_dtype = attn_mask.defined() ? attn_mask.dtype() : q.dtype();
  SavedTensor sq(q), sk(k_in), sv(v), sp(r.attn), sm(r.dropout_mask);
  const double used_scale = r.scale;
  const size_t n_inputs = inputs.size();
  const std::string name = functional_internal::DeviceName(q, "ScaledDotProductFlashAttentionForCpuBackward0",
                                                            "ScaledDotProductEfficientAttentionBackward0");
  return record_function(name, inputs, r.output, [=](const TensorList& g) -> TensorList {
    k::AttentionGrads ag = k::ScaledDotProductAttentionBackward(g[0], sq.unpack(), sk.unpack(), sv.unpack(),
                                                                sp.unpack(), sm.unpack(), used_scale, nq, nk, nv,
                                                                nm, mask_shape, mask_dtype);
    TensorList out = {ag.q, ag.k, ag.v};
    if (n_inputs == 4) out.push_back(ag.attn_mask);
    return out;
  });
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  Tensor out = k::Embedding(indices, weight);
  if (!ShouldRecord({&weight})) return out;
  SavedTensor saved(indices);
  const int64_t num = weight.size(0);
  const DType dt = weight.dtype();
  if (padding_idx.has_value() && *padding_idx < 0) padding_idx = *padding_idx + num;
  return record_function("EmbeddingBackward0", {weight}, out, [=](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::EmbeddingBackward(g[0], saved.unpack(), num, padding_idx), dt)};
  });
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  k::LayerNormResult r = k::LayerNorm(x, normalized_shape, weight, bias, eps);
  if (!ShouldRecord({&x, &weight, &bias})) return r.output;
  const bool nx = RequiresGrad(x), nw = RequiresGrad(weight), nb = RequiresGrad(bias);
  SavedTensor sx(x), sw(weight), sm(r.mean), sr(r.rstd);
  const DType dx = x.dtype(), dw = weight.defined() ? weight.dtype() : x.dtype(),
              db = bias.defined() ? bias.dtype() : x.dtype();
  return record_function("NativeLayerNormBackward0", {x, weight, bias}, r.output,
                         [=](const TensorList& g) -> TensorList {
                           k::NormGrads ng = k::LayerNormBackward(g[0], sx.unpack(), normalized_shape, sm.unpack(),
                                                                  sr.unpack(), sw.unpack(), nx, nw, nb);
                           return {AsDTypeOf(ng.input, dx), AsDTypeOf(ng.weight, dw), AsDTypeOf(ng.bias, db)};
                         });
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  FSDP_CHECK(x.defined(), "rms_norm: input is undefined");
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  bool ok = nd >= 1 && x.dim() >= nd;
  for (int64_t i = 0; ok && i < nd; ++i) {
    ok = x.sizes()[static_cast<size_t>(x.dim() - nd + i)] == normalized_shape[static_cast<size_t>(i)];
  }
  FSDP_CHECK(ok, "rms_norm: given normalized_shape=", ShapeStr(normalized_shape),
             ", expected input with shape [*, ", ShapeStr(normalized_shape).substr(1), ", but got input of size ",
             ShapeStr(x.sizes()));
  FSDP_CHECK(!weight.defined() || weight.sizes() == normalized_shape, "rms_norm: expected weight of shape ",
             ShapeStr(normalized_shape), ", got ", ShapeStr(weight.sizes()));
  const bool reduced = x.dtype() == DType::kFloat16 || x.dtype() == DType::kBFloat16;
  const DType opmath = reduced ? DType::kFloat32 : x.dtype();
  const double e = eps.has_value() ? *eps
                   : opmath == DType::kFloat64 ? 2.220446049250313e-16
                                               : 1.1920928955078125e-07;
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < nd; ++i) dims.push_back(x.dim() - i - 1);
  const Tensor up = to(x, opmath);
  const Tensor r = rsqrt(add(mean(pow(up, 2.0), dims, /*keepdim=*/true), e));
  Tensor result = to(mul(up, r), x.dtype());
  if (weight.defined()) result = mul(result, weight);
  return result;
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps,
                  const Tensor& num_batches_tracked) {
  k::BatchNormResult r =
      k::BatchNorm(x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum, eps);
  if (!ShouldRecord({&x, &weight, &bias})) return r.output;
  const bool nx = RequiresGrad(x), nw = RequiresGrad(weight), nb = RequiresGrad(bias);
  SavedTensor sx(x), sw(weight), sm(r.save_mean), ss(r.save_invstd);
  const DType dx = x.dtype(), dw = weight.defined() ? weight.dtype() : x.dtype(),
              db = bias.defined() ? bias.dtype() : x.dtype();
  return record_function("NativeBatchNormBackward0", {x, weight, bias}, r.output,
                         [=](const TensorList& g) -> TensorList {
                           k::NormGrads ng = k::BatchNormBackward(g[0], sx.unpack(), sw.unpack(), sm.unpack(),
                                                                  ss.unpack(), training, nx, nw, nb);
                           return {AsDTypeOf(ng.input, dx), AsDTypeOf(ng.weight, dw), AsDTypeOf(ng.bias, db)};
                         });
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  FSDP_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
  FSDP_CHECK(x.defined(), "dropout: input is undefined");
  if (p == 0.0 || !training || x.numel() == 0) return x;
  Generator& gen = generator ? *generator : RankContext::Current().generator();
  k::DropoutResult r = k::Dropout(x, p, gen);
  if (!ShouldRecord({&x})) return r.output;
  SavedTensor saved(r.mask);
  const DType dt = x.dtype();
  if (x.device().is_cuda()) {
    return record_function("NativeDropoutBackward0", {x}, r.output, [saved, dt](const TensorList& g) -> TensorList {
      return {AsDTypeOf(k::DropoutBackward(g[0], saved.unpack()), dt)};
    });
  }
  // PyTorch's CPU dropout is `input * noise`: a MulBackward0 whose second input needs no grad.
  return record_function("MulBackward0", {x, r.mask}, r.output, [saved, dt](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::DropoutBackward(g[0], saved.unpack()), dt), Tensor()};
  });
}

// ---- Losses -----------------------------------------------------------------------------------

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const std::string& reduction, int64_t ignore_index) {
  const k::Reduction red = k::ParseReduction(reduction);
  Tensor out = k::NllLoss(log_probs, target, red, ignore_index);
  if (!ShouldRecord({&log_probs})) return out;
  SavedTensor sx(log_probs), st(target);
  const DType dt = log_probs.dtype();
  return record_function("NllLossBackward0", {log_probs}, out, [=](const TensorList& g) -> TensorList {
    return {AsDTypeOf(k::NllLossBackward(g[0], sx.unpack(), st.unpack(), red, ignore_index), dt)};
  });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction, int64_t ignore_index) {
  FSDP_CHECK(logits.defined() && logits.dim() == 2, "cross_entropy: expected logits of shape [N, C], got ",
             logits.defined() ? ShapeStr(logits.sizes()) : "an undefined tensor");
  k::ParseReduction(reduction);
  return nll_loss(log_softmax(logits, 1), target, reduction, ignore_index);
}

}  // namespace fsdp
