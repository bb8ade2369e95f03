#include "engine/optim/optimizer.h"

#include <unordered_set>

#include "engine/autograd/variable.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::optim {

namespace internal {

Tensor CheckedGrad(const std::string& who, const std::string& label, const Tensor& param,
                   const Tensor& grad) {
  FSDP_CHECK(grad.sizes() == param.sizes(), who, ": grad of ", label, " has shape ",
             ShapeStr(grad.sizes()), " but the parameter has shape ", ShapeStr(param.sizes()));
  FSDP_CHECK(grad.device() == param.device(), who, ": grad of ", label, " is on ",
             grad.device().str(), " but the parameter is on ", param.device().str(),
             "; the grad and the optimizer state must be on the parameter's device");
  FSDP_CHECK(IsFloatingPoint(param.dtype()), who, ": parameters must be floating point, got ",
             DTypeName(param.dtype()), " (", label, ")");
  return ops::kernels::Cast(grad, param.dtype());
}

void CheckStateDevice(const std::string& who, const std::string& label, const Tensor& param,
                      const char* state_name, const Tensor& state) {
  FSDP_CHECK(state.device() == param.device(), who, ": state \"", state_name, "\" of ", label,
             " is on ", state.device().str(), " but the parameter is on ", param.device().str(),
             "; the grad and the optimizer state must be on the parameter's device");
}

}  // namespace internal

Optimizer::Optimizer(std::string name, double default_lr, std::vector<Tensor> params)
    : name_(std::move(name)), default_lr_(default_lr) {
  FSDP_CHECK(default_lr >= 0.0, name_, ": Invalid learning rate: ", default_lr);
  FSDP_CHECK(!params.empty(), name_, ": optimizer got an empty parameter list");
  add_param_group(std::move(params));
}

Optimizer::Optimizer(std::string name, double default_lr,
                     std::vector<std::pair<std::string, Tensor>> named_params)
    : name_(std::move(name)), default_lr_(default_lr) {
  FSDP_CHECK(default_lr >= 0.0, name_, ": Invalid learning rate: ", default_lr);
  FSDP_CHECK(!named_params.empty(), name_, ": optimizer got an empty parameter list");
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [n, p] : named_params) {
    names.push_back(n);
    params.push_back(p);
  }
  add_param_group(std::move(params), std::nullopt, std::move(names));
}

void Optimizer::add_param_group(std::vector<Tensor> params, std::optional<double> lr,
                                std::vector<std::string> names) {
  FSDP_CHECK(names.empty() || names.size() == params.size(), name_, ": ", names.size(),
             " parameter names for ", params.size(), " parameters");
  std::unordered_set<const TensorImpl*> existing;
  for (const auto& g : param_groups_) {
    for (const auto& p : g.params) existing.insert(p.impl());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::string label = names.empty() ? "#" + std::to_string(i) : names[i];
    FSDP_CHECK(p.defined(), name_, ": parameter ", label, " is undefined (None)");
    FSDP_CHECK(p.is_leaf(), name_, ": can't optimize a non-leaf Tensor (parameter ", label, ", ",
               p.str(), ")");
    FSDP_CHECK(existing.count(p.impl()) == 0, name_,
               ": some parameters appear in more than one parameter group (", label, ")");
  }
  ParamGroup group;
  group.params = std::move(params);
  group.names = std::move(names);
  group.lr = lr.value_or(default_lr_);
  param_groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& group : param_groups_) {
    for (auto& p : group.params) autograd::zero_grad(p, set_to_none);
  }
}

bool Optimizer::has_state(const Tensor& param) const {
  return param.defined() && state_.count(param.impl()) != 0;
}

const nn::OrderedDict<Tensor>& Optimizer::state(const Tensor& param) const {
  auto it = param.defined() ? state_.find(param.impl()) : state_.end();
  FSDP_CHECK_CODE(ErrorCode::kNotFound, it != state_.end(), name_,
                  ": no optimizer state for parameter ", param.defined() ? param.str() : "None",
                  " (it has not been updated yet)");
  return it->second;
}

void Optimizer::set_state(const Tensor& param, nn::OrderedDict<Tensor> state) {
  bool found = false;
  for (const ParamGroup& group : param_groups_) {
    for (const Tensor& p : group.params) found |= p.is_same(param);
  }
  FSDP_CHECK(found, name_, ": set_state for a tensor that is not a parameter of the optimizer");
  state_[param.impl()] = std::move(state);
}

nn::OrderedDict<Tensor>& Optimizer::mutable_state(const Tensor& param) {
  return state_[param.impl()];
}

}  // namespace fsdp::optim
