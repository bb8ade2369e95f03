// Optimizer: the base of the engine's optimizers (torch.optim.Optimizer, single-tensor
// "for-loop" implementations, foreach=False).
//
// An optimizer holds parameter groups (each a list of parameter Tensors plus its learning
// rate) and per-parameter state keyed by parameter identity. step() updates every parameter
// whose grad is defined, in place, without recording autograd history (the raw loops never go
// through the differentiable ops) and bumps the parameter's version counter like an in-place
// op under no_grad. Arithmetic follows PyTorch's op sequence, each intermediate rounded to the
// parameter's dtype (float32/float64; float16/bfloat16 compute in float32 and round per op),
// with the per-element formulas of update_math.h. A parameter on a CUDA device is updated by a
// CUDA kernel on that device, on the thread's current stream (optim_cuda.h), bit-identical to
// the CPU loop (a NaN's sign/payload aside); its grad and state must live on the same device.
// The Adam "step" counter stays a float32 CPU scalar (PyTorch's default without
// capturable/fused).
//
// An optimizer over a single parameter is valid (per-parameter optimizers run from
// post-accumulate-grad hooks).
// Ownership: the optimizer holds Tensor handles to its parameters (the same tensors as the
// module's slots at construction) and owns its state tensors.
// Thread-safety: none; an optimizer belongs to one rank's thread.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/nn/ordered_dict.h"

namespace fsdp::optim {

// One parameter group (`optimizer.param_groups[i]`).
struct ParamGroup {
  std::vector<Tensor> params;
  std::vector<std::string> names;  // parallel to params; empty when built from plain params
  double lr = 0.0;
  // Set by an LR scheduler on first use (group.setdefault("initial_lr", group["lr"])).
  std::optional<double> initial_lr;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Optimizer.zero_grad: grads become None (set_to_none) or are zeroed in place.
  void zero_grad(bool set_to_none = true);
  // One update of every parameter that has a grad.
  virtual void step() = 0;

  // Appends a group; `lr` defaults to the optimizer's lr. A parameter may belong to only one
  // group.
  void add_param_group(std::vector<Tensor> params, std::optional<double> lr = std::nullopt,
                       std::vector<std::string> names = {});
  std::vector<ParamGroup>& param_groups() { return param_groups_; }
  const std::vector<ParamGroup>& param_groups() const { return param_groups_; }

  // Per-parameter state ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
  // "momentum_buffer"), created at the parameter's first update.
  bool has_state(const Tensor& param) const;
  const nn::OrderedDict<Tensor>& state(const Tensor& param) const;
  // Replaces the state of `param` (a parameter of one of the groups), as
  // Optimizer.load_state_dict does for each parameter: the next step continues from it.
  // InvalidArgument when `param` is not in a group.
  void set_state(const Tensor& param, nn::OrderedDict<Tensor> state);
  const std::string& name() const { return name_; }

 protected:
  Optimizer(std::string name, double default_lr, std::vector<Tensor> params);
  Optimizer(std::string name, double default_lr,
            std::vector<std::pair<std::string, Tensor>> named_params);

  nn::OrderedDict<Tensor>& mutable_state(const Tensor& param);
  double default_lr() const { return default_lr_; }

 private:
  std::string name_;
  double default_lr_;
  std::vector<ParamGroup> param_groups_;
  std::unordered_map<const TensorImpl*, nn::OrderedDict<Tensor>> state_;
};

namespace internal {

// The gradient of `param` as an optimizer step consumes it, after checking it (`who` is the
// optimizer's name, `label` the parameter's name or description): same shape and device as
// the parameter (InvalidArgument naming both otherwise), a floating-point parameter, and
// converted to the parameter's dtype on its device (kernels::Cast, like grad.to(p.dtype())).
Tensor CheckedGrad(const std::string& who, const std::string& label, const Tensor& param,
                   const Tensor& grad);
// Checks that the state tensor `state_name` of `param` lives on the parameter's device.
void CheckStateDevice(const std::string& who, const std::string& label, const Tensor& param,
                      const char* state_name, const Tensor& state);

}  // namespace internal

}  // namespace fsdp::optim
