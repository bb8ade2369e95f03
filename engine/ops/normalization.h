// Normalisation CPU kernels (namespace fsdp::ops::kernels): layer_norm and rms_norm over the
// trailing `normalized_shape` dimensions, and batch_norm over the channel dimension 1 of
// [N, C] or [N, C, L] inputs, each with its backward. Statistics are computed in the compute
// dtype (float32 for float16/bfloat16 inputs) and returned in it; outputs are in the input's
// dtype, weight/bias gradients in the weight's/bias's dtype.
// Thread-safety: stateless functions (BatchNorm writes the running statistics it is given).
#pragma once

#include <optional>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// ---- layer_norm ------------------------------------------------------------------------------
// mean and rstd have the input's leading shape followed by one 1 per normalised dimension, as
// torch.native_layer_norm returns them. Variance is biased; rstd = 1 / sqrt(var + eps).
// Output and saved statistics of LayerNorm (value type).
struct LayerNormResult {
  Tensor output;
  Tensor mean;
  Tensor rstd;
};
LayerNormResult LayerNorm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                          const Tensor& bias = Tensor(), double eps = 1e-5);

// Gradients of a normalisation (value type; undefined when not requested or the
// parameter is absent).
struct NormGrads {
  Tensor input;
  Tensor weight;
  Tensor bias;
};
// Gradients are in the dtype of x (input) and of weight (weight and bias; the output's dtype
// when weight is undefined).
NormGrads LayerNormBackward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                            const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                            bool need_input = true, bool need_weight = true, bool need_bias = true);

// ---- rms_norm --------------------------------------------------------------------------------
// y = x * rsqrt(mean(x², normalised dims) + eps) * weight. eps defaults to the machine epsilon
// of the op-math type (float32's for float16/bfloat16/float32 inputs, float64's for float64),
// as ATen's rms_norm does.
// Output and saved statistics of RmsNorm (value type).
struct RmsNormResult {
  Tensor output;
  Tensor rstd;  // input's leading shape followed by ones, compute dtype
};
RmsNormResult RmsNorm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                      std::optional<double> eps = std::nullopt);
NormGrads RmsNormBackward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                          const Tensor& rstd, const Tensor& weight, bool need_input = true,
                          bool need_weight = true);

// ---- batch_norm ------------------------------------------------------------------------------
// Training: normalises with the batch mean and biased variance over (N, L) per channel, and when
// running_mean/running_var are defined updates them in place:
//   running = (1 - momentum) * running + momentum * batch_stat,
// using the UNBIASED batch variance for running_var; num_batches_tracked (an int64 0-d or
// 1-element tensor), when defined, is incremented first, and momentum = nullopt means the
// cumulative average factor 1 / num_batches_tracked. Throws when a channel has a single value.
// Eval: normalises with the running statistics (which must be defined).
// save_mean / save_invstd are [C] tensors in the compute dtype holding the statistics used
// (batch or running), which is all BatchNormBackward needs.
// Output and saved statistics of BatchNorm (value type).
struct BatchNormResult {
  Tensor output;
  Tensor save_mean;
  Tensor save_invstd;
};
BatchNormResult BatchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Tensor& running_mean, const Tensor& running_var,
                          const Tensor& num_batches_tracked, bool training,
                          std::optional<double> momentum = 0.1, double eps = 1e-5);
NormGrads BatchNormBackward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                            const Tensor& save_mean, const Tensor& save_invstd, bool training,
                            bool need_input = true, bool need_weight = true, bool need_bias = true);

}  // namespace fsdp::ops::kernels
