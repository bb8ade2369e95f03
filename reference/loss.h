// Losses the seeds compute from model outputs, with their gradients w.r.t. those outputs:
// `out.sum()`, `out.mean()`, `(out1 * out2).sum()`, and `F.cross_entropy(out.view(-1, C),
// targets.view(-1), reduction=...)`.
//
// A LossSpec is plain data (which outputs, which formula), so scenarios can carry it. ComputeLoss
// returns one gradient slot per model output; a slot is empty (nullopt) when the loss does not
// read that output, which is how "an unused output sends no gradient" reaches the model backward.
//
// Thread-safety: pure functions. Ownership: values.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "reference/layers.h"
#include "reference/tensor.h"

namespace fsdp::reference {

enum class Reduction { kMean, kSum };

template <typename T>
struct CrossEntropyResult {
  T loss = 0;
  Matrix<T> grad_logits;  // d loss / d logits, [n, classes]
};

// Cross-entropy of logits [n, classes] against `targets` (n class indices). Rows whose target
// equals `ignore_index` contribute nothing; kMean divides by the number of other rows (NaN when
// there are none, as torch). Throws on a target outside [0, classes).
template <typename T>
CrossEntropyResult<T> CrossEntropy(const Matrix<T>& logits, const std::vector<int64_t>& targets,
                                   Reduction reduction, int64_t ignore_index = -100);

enum class LossKind {
  kSum,           // Σ over `outputs` of out.sum()
  kMean,          // Σ over `outputs` of out.mean()
  kSumOfProduct,  // (out[outputs[0]] * out[outputs[1]]).sum()
  kCrossEntropy,  // cross_entropy(out[outputs[0]].view(-1, C), targets.view(-1), reduction)
};

struct LossSpec {
  LossKind kind = LossKind::kSum;          // Default: kSum (the seeds' `model(x).sum()`).
  std::vector<int> outputs = {0};          // Default: {0}, the first model output.
  Reduction reduction = Reduction::kMean;  // Default: kMean. Cross-entropy only.
  int64_t ignore_index = -100;             // Default: -100 (torch's). Cross-entropy only.
};

LossSpec SumLoss(std::vector<int> outputs = {0});
LossSpec MeanLoss(std::vector<int> outputs = {0});
LossSpec ProductSumLoss(int first = 0, int second = 1);
LossSpec CrossEntropyLoss(Reduction reduction = Reduction::kMean, int output = 0);

template <typename T>
struct LossResult {
  T loss = 0;
  // One slot per model output: d loss / d output, or nullopt when the loss ignores that output.
  std::vector<std::optional<BasicRefTensor<T>>> output_grads;
};

// `targets` is only read by kCrossEntropy. Throws std::invalid_argument on a bad output index or
// shape mismatch.
template <typename T>
LossResult<T> ComputeLoss(const LossSpec& spec, const std::vector<BasicRefTensor<T>>& outputs,
                          const IndexTensor& targets = {});

}  // namespace fsdp::reference
