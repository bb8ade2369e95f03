// Loss CPU kernels (namespace fsdp::ops::kernels): nll_loss on log-probabilities and the fused
// cross_entropy on logits (log_softmax + nll_loss; PyTorch's functional cross_entropy records
// the two separately, see functional.h), for [N, C] inputs and int64 targets [N].
// Reductions: "mean" (over targets that are not ignore_index), "sum", "none". A "mean" with every
// target ignored is 0/0 = NaN, as in PyTorch. float16/bfloat16 compute in float32.
// Thread-safety: stateless functions.
#pragma once

#include <string>

#include "engine/core/tensor.h"

namespace fsdp::ops::kernels {

enum class Reduction { kNone, kMean, kSum };
// Parses "none", "mean", "sum".
Reduction ParseReduction(const std::string& reduction);

// -log_probs[i, target[i]] reduced; a 0-d tensor for mean/sum, [N] for none.
Tensor NllLoss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::kMean,
               int64_t ignore_index = -100);
// The [N, C] gradient with respect to log_probs.
Tensor NllLossBackward(const Tensor& grad, const Tensor& log_probs, const Tensor& target,
                       Reduction reduction = Reduction::kMean, int64_t ignore_index = -100);

// NllLoss(LogSoftmax(logits, 1), target).
Tensor CrossEntropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::kMean,
                    int64_t ignore_index = -100);
// (softmax(logits) - onehot(target)) * upstream, rows of ignored targets zero.
Tensor CrossEntropyBackward(const Tensor& grad, const Tensor& logits, const Tensor& target,
                            Reduction reduction = Reduction::kMean, int64_t ignore_index = -100);

}  // namespace fsdp::ops::kernels
