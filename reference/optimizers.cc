#include "reference/optimizers.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fsdp::reference {
namespace {

template <typename T>
BasicRefTensor<T>& ParamFor(TensorMap<T>* params, const std::string& name,
                            const BasicRefTensor<T>& grad) {
  auto it = params->find(name);
  if (it == params->end()) {
    throw std::invalid_argument("optimizer: gradient for unknown parameter '" + name + "'");
  }
  if (it->second.shape != grad.shape) {
    throw std::invalid_argument("optimizer: '" + name + "' has shape " +
                                ShapeToString(it->second.shape) + " but its gradient " +
                                ShapeToString(grad.shape));
  }
  return it->second;
}

// torch.lerp's formula: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w).
template <typename T>
T Lerp(T start, T end, T weight) {
  return weight < T(0.5) ? start + weight * (end - start) : end - (end - start) * (T(1) - weight);
}

}  // namespace

// ---- Param groups ------------------------------------------------------------------------------

template <typename T>
void Optimizer<T>::AddParamGroup(const std::vector<std::string>& fqns, double lr) {
  if (lr < 0) throw std::invalid_argument("optimizer: invalid learning rate of a param group");
  for (const std::string& fqn : fqns) {
    if (group_of_.count(fqn) != 0) {
      throw std::invalid_argument("optimizer: '" + fqn + "' is in more than one param group");
    }
    group_of_[fqn] = group_lrs_.size();
  }
  group_lrs_.push_back(lr);
}

template <typename T>
double Optimizer<T>::LrOf(const std::string& fqn) const {
  auto it = group_of_.find(fqn);
  return it == group_of_.end() ? lr() : group_lrs_[it->second];
}

template <typename T>
void Optimizer<T>::ScaleLrs(double factor) {
  set_lr(lr() * factor);
  for (double& lr : group_lrs_) lr *= factor;
}

// ---- SGD ---------------------------------------------------------------------------------------

template <typename T>
Sgd<T>::Sgd(const SgdOptions& options) : options_(options) {
  if (options_.lr < 0) throw std::invalid_argument("Sgd: invalid learning rate");
  if (options_.momentum < 0) throw std::invalid_argument("Sgd: invalid momentum");
  if (options_.weight_decay < 0) throw std::invalid_argument("Sgd: invalid weight_decay");
  if (options_.nesterov && (options_.momentum <= 0 || options_.dampening != 0)) {
    throw std::invalid_argument("Sgd: Nesterov momentum requires a momentum and zero dampening");
  }
}

template <typename T>
void Sgd<T>::Step(TensorMap<T>* params, const TensorMap<T>& grads) {
  const SgdOptions& o = options_;
  for (const auto& [name, grad] : grads) {
    BasicRefTensor<T>& p = ParamFor(params, name, grad);
    const double lr = this->LrOf(name);
    BasicRefTensor<T> g = grad;
    if (o.maximize) {
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = -g[i];
    }
    if (o.weight_decay != 0) {
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = g[i] + T(o.weight_decay) * p[i];
    }
    if (o.momentum != 0) {
      auto it = momentum_buffers_.find(name);
      if (it == momentum_buffers_.end()) {
        it = momentum_buffers_.emplace(name, g).first;  // first step: buf = clone(grad)
      } else {
        BasicRefTensor<T>& buf = it->second;
        for (int64_t i = 0; i < g.numel(); ++i) {
          buf[i] = buf[i] * T(o.momentum) + T(1 - o.dampening) * g[i];
        }
      }
      const BasicRefTensor<T>& buf = it->second;
      for (int64_t i = 0; i < g.numel(); ++i) {
        g[i] = o.nesterov ? g[i] + T(o.momentum) * buf[i] : buf[i];
      }
    }
    for (int64_t i = 0; i < p.numel(); ++i) p[i] = p[i] + T(-lr) * g[i];
  }
}

// ---- Adam / AdamW ------------------------------------------------------------------------------

AdamOptions AdamWOptions(double lr, double weight_decay) {
  AdamOptions o;
  o.lr = lr;
  o.weight_decay = weight_decay;
  return o;
}

template <typename T>
Adam<T>::Adam(const AdamOptions& options, bool decoupled_weight_decay)
    : options_(options), decoupled_(decoupled_weight_decay) {
  const AdamOptions& o = options_;
  if (o.lr < 0) throw std::invalid_argument("Adam: invalid learning rate");
  if (o.eps < 0) throw std::invalid_argument("Adam: invalid epsilon");
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1) {
    throw std::invalid_argument("Adam: invalid beta parameter");
  }
  if (o.weight_decay < 0) throw std::invalid_argument("Adam: invalid weight_decay");
}

template <typename T>
void Adam<T>::Step(TensorMap<T>* params, const TensorMap<T>& grads) {
  const AdamOptions& o = options_;
  for (const auto& [name, grad] : grads) {
    BasicRefTensor<T>& p = ParamFor(params, name, grad);
    const double lr = this->LrOf(name);
    auto m_it = exp_avg_.find(name);
    if (m_it == exp_avg_.end()) {  // lazy state init: step 0, zero moments
      steps_[name] = 0;
      m_it = exp_avg_.emplace(name, BasicRefTensor<T>(p.shape)).first;
      exp_avg_sq_.emplace(name, BasicRefTensor<T>(p.shape));
      if (o.amsgrad) max_exp_avg_sq_.emplace(name, BasicRefTensor<T>(p.shape));
    }
    BasicRefTensor<T>& m = m_it->second;
    BasicRefTensor<T>& v = exp_avg_sq_.at(name);
    const int64_t t = ++steps_[name];

    BasicRefTensor<T> g = grad;
    if (o.maximize) {
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = -g[i];
    }
    if (o.weight_decay != 0) {
      if (decoupled_) {
        for (int64_t i = 0; i < p.numel(); ++i) p[i] = p[i] * T(1 - lr * o.weight_decay);
      } else {
        for (int64_t i = 0; i < g.numel(); ++i) g[i] = g[i] + T(o.weight_decay) * p[i];
      }
    }
    for (int64_t i = 0; i < g.numel(); ++i) {
      m[i] = Lerp(m[i], g[i], T(1 - o.beta1));
      v[i] = v[i] * T(o.beta2) + T(1 - o.beta2) * g[i] * g[i];
    }
    const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    BasicRefTensor<T>* vmax = o.amsgrad ? &max_exp_avg_sq_.at(name) : nullptr;
    for (int64_t i = 0; i < p.numel(); ++i) {
      if (vmax != nullptr) (*vmax)[i] = std::max((*vmax)[i], v[i]);
      const T v_used = vmax != nullptr ? (*vmax)[i] : v[i];
      const T denom = std::sqrt(v_used) / T(bias_correction2_sqrt) + T(o.eps);
      p[i] = p[i] + T(-step_size) * m[i] / denom;
    }
  }
}

// ---- StepLR ------------------------------------------------------------------------------------

template <typename T>
StepLr<T>::StepLr(Optimizer<T>* optimizer, int64_t step_size, double gamma)
    : optimizer_(optimizer), step_size_(step_size), gamma_(gamma) {
  if (optimizer_ == nullptr) throw std::invalid_argument("StepLr: null optimizer");
  if (step_size_ <= 0) throw std::invalid_argument("StepLr: step_size must be positive");
}

template <typename T>
void StepLr<T>::Step() {
  ++last_epoch_;
  if (last_epoch_ % step_size_ == 0) optimizer_->ScaleLrs(gamma_);
}

// ---- Gradient bookkeeping ----------------------------------------------------------------------

template <typename T>
void ZeroGrad(TensorMap<T>* grads, bool set_to_none) {
  if (set_to_none) {
    grads->clear();
    return;
  }
  for (auto& [name, g] : *grads) std::fill(g.data.begin(), g.data.end(), T(0));
}

template <typename T>
void AccumulateGrads(TensorMap<T>* grads, const TensorMap<T>& fresh) {
  for (const auto& [name, g] : fresh) {
    auto it = grads->find(name);
    if (it == grads->end()) {
      grads->emplace(name, g);
      continue;
    }
    if (it->second.shape != g.shape) {
      throw std::invalid_argument("AccumulateGrads: '" + name + "' shape " +
                                  ShapeToString(g.shape) + " vs " +
                                  ShapeToString(it->second.shape));
    }
    for (int64_t i = 0; i < g.numel(); ++i) it->second[i] += g[i];
  }
}

template class Sgd<float>;
template class Sgd<double>;
template class Optimizer<float>;
template class Optimizer<double>;
template class Adam<float>;
template class Adam<double>;
template class StepLr<float>;
template class StepLr<double>;
template void ZeroGrad<float>(TensorMap<float>*, bool);
template void ZeroGrad<double>(TensorMap<double>*, bool);
template void AccumulateGrads<float>(TensorMap<float>*, const TensorMap<float>&);
template void AccumulateGrads<double>(TensorMap<double>*, const TensorMap<double>&);

}  // namespace fsdp::reference
