// torch.optim's SGD, Adam and AdamW (the documented single-tensor, non-foreach algorithms,
// with maximize) and lr_scheduler.StepLR, over FQN-keyed tensor maps.
//
// Param groups: every parameter belongs to the default group (lr()) unless AddParamGroup put its
// FQN in a group of its own learning rate (torch's optimizer.add_param_group({"params": ...,
// "lr": ...})); each parameter steps with its group's lr. StepLr scales every group's lr.
//
// Per step, as torch: a parameter whose gradient is absent from the gradient map (grad None) is
// skipped entirely (no state created, Adam's step count not advanced). Hyper-parameters are
// doubles (Python floats); with T = float the tensor arithmetic is done in float as torch does.
//
// maximize: g = -grad below, in both.
// SGD:   g = grad + wd·p; if momentum: buf = g on the first step, else buf = momentum·buf +
//        (1 - dampening)·g; g = nesterov ? g + momentum·buf : buf. p = p - lr·g.
// Adam:  t += 1; g = grad + wd·p; m = lerp(m, g, 1 - β1); v = β2·v + (1 - β2)·g²;
//        step_size = lr / (1 - β1^t); denom = sqrt(v) / sqrt(1 - β2^t) + eps;
//        p = p - step_size · m / denom. amsgrad: vmax = max(vmax, v) (state, from 0), used
//        instead of v in denom.
// (lr above: the parameter's group's.)
// AdamW: p = p·(1 - lr·wd), then the Adam update without weight decay in g.
//
// Thread-safety: an optimizer is mutable state; use one per thread. Ownership: the optimizer
// owns its state (momentum buffers, moments); parameters and gradients are borrowed per call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/tensor.h"

namespace fsdp::reference {

// The interface the data-parallel runner and StepLR use. Implementations own their state and are
// not thread-safe.
template <typename T>
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates every parameter of `params` that has an entry in `grads`.
  virtual void Step(TensorMap<T>* params, const TensorMap<T>& grads) = 0;
  // The default group's learning rate (the one the optimizer was built with).
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;

  // A param group of its own learning rate `lr` holding `fqns` (none of them in another group
  // added before). Throws std::invalid_argument on a negative lr or an FQN already grouped.
  void AddParamGroup(const std::vector<std::string>& fqns, double lr);
  // The learning rate parameter `fqn` steps with: its group's, else lr().
  double LrOf(const std::string& fqn) const;
  // Multiplies every group's learning rate, the default group's included, by `factor`.
  void ScaleLrs(double factor);

 private:
  std::map<std::string, size_t> group_of_;  // FQN -> index into group_lrs_
  std::vector<double> group_lrs_;           // the learning rates of the added groups
};

struct SgdOptions {
  double lr = 1e-3;           // Default: 1e-3 (torch >= 2.2's default).
  double momentum = 0.0;      // Default: 0.
  double dampening = 0.0;     // Default: 0.
  double weight_decay = 0.0;  // Default: 0.
  bool nesterov = false;      // Default: false (requires momentum > 0 and dampening == 0).
  bool maximize = false;      // Default: false.
};

// torch.optim.SGD (algorithm in the file comment). Owns the momentum buffers; not thread-safe.
template <typename T>
class Sgd : public Optimizer<T> {
 public:
  // Throws std::invalid_argument on an invalid option (negative lr, bad nesterov setting).
  explicit Sgd(const SgdOptions& options);
  void Step(TensorMap<T>* params, const TensorMap<T>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }
  // state["momentum_buffer"] per FQN (empty without momentum).
  const TensorMap<T>& momentum_buffers() const { return momentum_buffers_; }

 private:
  SgdOptions options_;
  TensorMap<T> momentum_buffers_;
};

struct AdamOptions {
  double lr = 1e-3;           // Default: 1e-3.
  double beta1 = 0.9;         // Default: 0.9.
  double beta2 = 0.999;       // Default: 0.999.
  double eps = 1e-8;          // Default: 1e-8.
  double weight_decay = 0.0;  // Default: 0 for Adam. (AdamW's default 1e-2: see AdamWOptions.)
  bool amsgrad = false;       // Default: false.
  bool maximize = false;      // Default: false.
};

// AdamW's defaults differ only in weight_decay.
AdamOptions AdamWOptions(double lr = 1e-3, double weight_decay = 1e-2);

// torch.optim.Adam (and AdamW with decoupled_weight_decay). Owns per-FQN step counts and moments;
// not thread-safe.
template <typename T>
class Adam : public Optimizer<T> {
 public:
  // `decoupled_weight_decay` selects AdamW. Throws std::invalid_argument on invalid options.
  explicit Adam(const AdamOptions& options, bool decoupled_weight_decay = false);
  void Step(TensorMap<T>* params, const TensorMap<T>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override { options_.lr = lr; }

  // Per-FQN state as torch's state dict names it: step, exp_avg, exp_avg_sq.
  const std::map<std::string, int64_t>& steps() const { return steps_; }
  const TensorMap<T>& exp_avg() const { return exp_avg_; }
  const TensorMap<T>& exp_avg_sq() const { return exp_avg_sq_; }

 private:
  AdamOptions options_;
  bool decoupled_;
  std::map<std::string, int64_t> steps_;
  TensorMap<T> exp_avg_;
  TensorMap<T> exp_avg_sq_;
  TensorMap<T> max_exp_avg_sq_;  // amsgrad only
};

// torch.optim.AdamW: Adam with decoupled weight decay. Same ownership/thread-safety as Adam.
template <typename T>
class AdamW : public Adam<T> {
 public:
  explicit AdamW(const AdamOptions& options = AdamWOptions()) : Adam<T>(options, true) {}
};

// lr_scheduler.StepLR(optimizer, step_size, gamma=0.1), chainable form: each Step() advances
// last_epoch; when last_epoch is a positive multiple of step_size, lr *= gamma. Construction
// records the optimizer's lr as the base (last_epoch = 0), as torch's initial step does.
// Ownership: borrows the optimizer, which must outlive the scheduler.
template <typename T>
class StepLr {
 public:
  StepLr(Optimizer<T>* optimizer, int64_t step_size, double gamma = 0.1);
  void Step();
  double last_lr() const { return optimizer_->lr(); }
  int64_t last_epoch() const { return last_epoch_; }

 private:
  Optimizer<T>* optimizer_;
  int64_t step_size_;
  double gamma_;
  int64_t last_epoch_ = 0;
};

// optimizer.zero_grad(set_to_none): with set_to_none every gradient becomes absent; otherwise the
// present gradients are zero-filled and absent ones stay absent.
template <typename T>
void ZeroGrad(TensorMap<T>* grads, bool set_to_none = true);

// `.grad` accumulation across backwards: adds each gradient of `fresh` into `grads` (a missing
// entry is created from the fresh gradient; entries `fresh` lacks are left unchanged).
template <typename T>
void AccumulateGrads(TensorMap<T>* grads, const TensorMap<T>& fresh);

}  // namespace fsdp::reference
