// Embedding lookup CPU kernels (namespace fsdp::ops::kernels): gather rows of a [V, D] weight
// by int64 indices of any shape, and the backward scatter-add (rows at padding_idx get no
// gradient). float16/bfloat16 gradients accumulate in float32 and are rounded once.
// Thread-safety: stateless functions.
#pragma once

#include <optional>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

// indices [...] (int64) and weight [V, D] -> [..., D]. Throws when an index is outside [0, V).
Tensor Embedding(const Tensor& indices, const Tensor& weight);

// The [num_weights, D] gradient of the weight: grad [..., D] rows added at their indices.
Tensor EmbeddingBackward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                         std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace fsdp::ops::kernels
