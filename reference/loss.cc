#include "reference/loss.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdp::reference {

template <typename T>
CrossEntropyResult<T> CrossEntropy(const Matrix<T>& logits, const std::vector<int64_t>& targets,
                                   Reduction reduction, int64_t ignore_index) {
  if (logits.rows() != static_cast<int64_t>(targets.size())) {
    throw std::invalid_argument("CrossEntropy: " + std::to_string(logits.rows()) +
                                " rows of logits but " + std::to_string(targets.size()) +
                                " targets");
  }
  const Matrix<T> p = SoftmaxRows<T>(logits);
  CrossEntropyResult<T> r;
  r.grad_logits = Matrix<T>::Zero(logits.rows(), logits.cols());
  T total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < logits.rows(); ++i) {
    const int64_t t = targets[static_cast<size_t>(i)];
    if (t == ignore_index) continue;
    if (t < 0 || t >= logits.cols()) {
      throw std::invalid_argument("CrossEntropy: target " + std::to_string(t) +
                                  " out of range for " + std::to_string(logits.cols()) +
                                  " classes");
    }
    // -log softmax(z)_t = logsumexp(z) - z_t, computed stably.
    const T mx = logits.row(i).maxCoeff();
    const T lse = mx + std::log((logits.row(i).array() - mx).exp().sum());
    total += lse - logits(i, t);
    // d/dz of (logsumexp(z) - z_t) = softmax(z) - onehot(t).
    r.grad_logits.row(i) = p.row(i);
    r.grad_logits(i, t) -= T(1);
    ++count;
  }
  if (reduction == Reduction::kMean) {
    r.loss = count > 0 ? total / T(count) : std::numeric_limits<T>::quiet_NaN();
    r.grad_logits /= T(count > 0 ? count : 1);
    if (count == 0) r.grad_logits.setConstant(std::numeric_limits<T>::quiet_NaN());
  } else {
    r.loss = total;
  }
  return r;
}

LossSpec SumLoss(std::vector<int> outputs) {
  LossSpec s;
  s.kind = LossKind::kSum;
  s.outputs = std::move(outputs);
  return s;
}

LossSpec MeanLoss(std::vector<int> outputs) {
  LossSpec s;
  s.kind = LossKind::kMean;
  s.outputs = std::move(outputs);
  return s;
}

LossSpec ProductSumLoss(int first, int second) {
  LossSpec s;
  s.kind = LossKind::kSumOfProduct;
  s.outputs = {first, second};
  return s;
}

LossSpec CrossEntropyLoss(Reduction reduction, int output) {
  LossSpec s;
  s.kind = LossKind::kCrossEntropy;
  s.outputs = {output};
  s.reduction = reduction;
  return s;
}

namespace {

template <typename T>
const BasicRefTensor<T>& Output(const std::vector<BasicRefTensor<T>>& outputs, int index) {
  if (index < 0 || index >= static_cast<int>(outputs.size())) {
    throw std::invalid_argument("loss reads output " + std::to_string(index) +
                                " but the model has " + std::to_string(outputs.size()) +
                                " outputs");
  }
  return outputs[static_cast<size_t>(index)];
}

// Adds g into slot `index` (an output read twice by a loss receives the sum).
template <typename T>
void AddGrad(std::vector<std::optional<BasicRefTensor<T>>>* grads, int index,
             const BasicRefTensor<T>& g) {
  auto& slot = (*grads)[static_cast<size_t>(index)];
  if (!slot) {
    slot = g;
    return;
  }
  for (int64_t i = 0; i < g.numel(); ++i) (*slot)[i] += g[i];
}

}  // namespace

template <typename T>
LossResult<T> ComputeLoss(const LossSpec& spec, const std::vector<BasicRefTensor<T>>& outputs,
                          const IndexTensor& targets) {
  LossResult<T> r;
  r.output_grads.resize(outputs.size());
  switch (spec.kind) {
    case LossKind::kSum:
    case LossKind::kMean:
      if (spec.outputs.empty()) throw std::invalid_argument("loss over no outputs");
      for (int index : spec.outputs) {
        const BasicRefTensor<T>& out = Output(outputs, index);
        const T scale = spec.kind == LossKind::kSum ? T(1) : T(1) / T(out.numel());
        T sum = 0;
        for (const T& v : out.data) sum += v;
        r.loss += sum * scale;
        AddGrad(&r.output_grads, index, Full<T>(out.shape, scale));
      }
      return r;
    case LossKind::kSumOfProduct: {
      if (spec.outputs.size() != 2) throw std::invalid_argument("kSumOfProduct needs 2 outputs");
      const BasicRefTensor<T>& a = Output(outputs, spec.outputs[0]);
      const BasicRefTensor<T>& b = Output(outputs, spec.outputs[1]);
      if (a.shape != b.shape) throw std::invalid_argument("kSumOfProduct: output shapes differ");
      for (int64_t i = 0; i < a.numel(); ++i) r.loss += a[i] * b[i];
      AddGrad(&r.output_grads, spec.outputs[0], b);  // d(Σ a b)/da = b
      AddGrad(&r.output_grads, spec.outputs[1], a);
      return r;
    }
    case LossKind::kCrossEntropy: {
      if (spec.outputs.size() != 1) throw std::invalid_argument("kCrossEntropy reads 1 output");
      const BasicRefTensor<T>& out = Output(outputs, spec.outputs[0]);
      const CrossEntropyResult<T> ce =
          CrossEntropy<T>(ToMatrix(out), targets.data, spec.reduction, spec.ignore_index);
      r.loss = ce.loss;
      AddGrad(&r.output_grads, spec.outputs[0], FromMatrix<T>(ce.grad_logits, out.shape));
      return r;
    }
  }
  throw std::invalid_argument("unknown LossKind");
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                           \
  template CrossEntropyResult<T> CrossEntropy<T>(const Matrix<T>&, const std::vector<int64_t>&, \
                                                 Reduction, int64_t);                           \
  template LossResult<T> ComputeLoss<T>(const LossSpec&, const std::vector<BasicRefTensor<T>>&, \
                                        const IndexTensor&);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
