#include "engine/ops/loss.h"

#include <vector>

#include "engine/ops/activation.h"
#include "engine/ops/cuda/dispatch.h"
#include "engine/ops/kernel_util.h"

namespace fsdp::ops::kernels {

namespace {

struct LossDims {
  int64_t n;
  int64_t c;
};

LossDims CheckLoss(const char* op, const Tensor& input, const Tensor& target, int64_t ignore_index,
                   std::vector<int64_t>* targets) {
  internal::CheckFloating(op, "input", input);
  internal::CheckDefined(op, "target", target);
  FSDP_CHECK(input.dim() == 2, op, ": expected input of shape [N, C], got ", ShapeStr(input.sizes()));
  FSDP_CHECK(target.dtype() == DType::kInt64, op, ": expected int64 targets, got ", target.str());
  FSDP_CHECK(target.dim() == 1 && target.size(0) == input.size(0), op, ": expected target of shape [",
             input.size(0), "], got ", ShapeStr(target.sizes()), " (input ", ShapeStr(input.sizes()), ")");
  LossDims d{input.size(0), input.size(1)};
  *targets = target.to_int64s();
  for (int64_t t : *targets) {
    FSDP_CHECK(t == ignore_index || (t >= 0 && t < d.c), op, ": target ", t, " is out of bounds for ",
               d.c, " classes");
  }
  return d;
}

int64_t CountValid(const std::vector<int64_t>& targets, int64_t ignore_index) {
  int64_t n = 0;
  for (int64_t t : targets) n += t != ignore_index;
  return n;
}

}  // namespace

Reduction ParseReduction(const std::string& reduction) {
  if (reduction == "mean") return Reduction::kMean;
  if (reduction == "sum") return Reduction::kSum;
  if (reduction == "none") return Reduction::kNone;
  FSDP_THROW(ErrorCode::kInvalidArgument, "'", reduction, "' is not a valid value for reduction (expected 'none', 'mean' or 'sum')");
}

Tensor NllLoss(const Tensor& log_probs, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  std::vector<int64_t> targets;
  const LossDims d = CheckLoss("nll_loss", log_probs, target, ignore_index, &targets);
  if (internal::OnCuda("nll_loss", {&log_probs, &target})) {
    return FSDP_CUDA_KERNEL("nll_loss", NllLoss(log_probs, target, reduction, ignore_index,
                                                CountValid(targets, ignore_index)));
  }
  const DType cd = internal::ComputeDType(log_probs.dtype());
  const Tensor hx = internal::HostAs(log_probs, cd);
  Tensor out = internal::DispatchFloat(cd, "nll_loss", [&](auto tag) {
    using T = decltype(tag);
    const T* px = hx.data<T>();
    if (reduction == Reduction::kNone) {
      Tensor r = Tensor::zeros({d.n}, cd);
      for (int64_t i = 0; i < d.n; ++i) {
        const int64_t t = targets[static_cast<size_t>(i)];
        if (t != ignore_index) r.data<T>()[i] = -px[i * d.c + t];
      }
      return r;
    }
    T sum = T(0);
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t t = targets[static_cast<size_t>(i)];
      if (t != ignore_index) sum -= px[i * d.c + t];
    }
    if (reduction == Reduction::kMean) sum /= static_cast<T>(CountValid(targets, ignore_index));
    Tensor r = Tensor::empty({}, cd);
    r.data<T>()[0] = sum;
    return r;
  });
  return internal::Restore(out, log_probs.dtype(), log_probs.device());
}

Tensor NllLossBackward(const Tensor& grad, const Tensor& log_probs, const Tensor& target, Reduction reduction,
                       int64_t ignore_index) {
  std::vector<int64_t> targets;
  const LossDims d = CheckLoss("nll_loss_backward", log_probs, target, ignore_index, &targets);
  FSDP_CHECK(reduction == Reduction::kNone ? grad.numel() == d.n : grad.numel() == 1,
             "nll_loss_backward: gradient ", grad.str(), " does not match the reduction");
  if (internal::OnCuda("nll_loss_backward", {&grad, &log_probs, &target}, /*allow_cpu_scalars=*/true)) {
    return FSDP_CUDA_KERNEL("nll_loss_backward", NllLossBackward(grad, log_probs, target, reduction, ignore_index,
                                                                 CountValid(targets, ignore_index)));
  }
  const DType cd = internal::ComputeDType(log_probs.dtype());
  const std::vector<double> g = grad.to_doubles();
  const double denom = reduction == Reduction::kMean ? static_cast<double>(CountValid(targets, ignore_index)) : 1.0;
  Tensor out = internal::DispatchFloat(cd, "nll_loss_backward", [&](auto tag) {
    using T = decltype(tag);
    Tensor r = Tensor::zeros({d.n, d.c}, cd);
    T* pr = r.data<T>();
    for (int64_t i = 0; i < d.n; ++i) {
      const int64_t t = targets[static_cast<size_t>(i)];
      if (t == ignore_index) continue;
      const T gi = static_cast<T>(reduction == Reduction::kNone ? g[static_cast<size_t>(i)] : g[0]);
      pr[i * d.c + t] = reduction == Reduction::kMean ? -gi / static_cast<T>(denom) : -gi;
    }
    return r;
  });
  return internal::Restore(out, log_probs.dtype(), log_probs.device());
}

Tensor CrossEntropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  internal::CheckFloating("cross_entropy", "input", logits);
  return NllLoss(LogSoftmax(logits, 1), target, reduction, ignore_index);
}

Tensor CrossEntropyBackward(const Tensor& grad, const Tensor& logits, const Tensor& target,
                            Reduction reduction, int64_t ignore_index) {
  internal::CheckFloating("cross_entropy_backward", "input", logits);
  const Tensor log_probs = LogSoftmax(logits, 1);
  return LogSoftmaxBackward(NllLossBackward(grad, log_probs, target, reduction, ignore_index), log_probs, 1);
}

}  // namespace fsdp::ops::kernels
