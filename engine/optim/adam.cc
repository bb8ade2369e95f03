#include "engine/optim/adam.h"

#include <cmath>
#include <string>

#include "engine/optim/optim_cuda.h"
#include "engine/optim/update_kernels.h"
#include "engine/optim/update_math.h"

namespace fsdp::optim {

namespace {

AdamOptions FromAdamW(const AdamWOptions& o) {
  AdamOptions out;
  out.lr = o.lr;
  out.beta1 = o.beta1;
  out.beta2 = o.beta2;
  out.eps = o.eps;
  out.weight_decay = o.weight_decay;
  out.amsgrad = o.amsgrad;
  out.maximize = o.maximize;
  return out;
}

// The CPU loop: math::AdamUpdate per element, in the parameter's storage type.
void AdamStepCpu(const std::string& who, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const Tensor& vmax, const math::AdamStepSpec& spec) {
  internal::DispatchFloating(param.dtype(), who.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using A = OpMath<T>;
    const math::AdamScalars<A> s = math::MakeAdamScalars<A>(spec);
    const auto round = internal::RoundingFor<T>();
    T* pp = param.data<T>();
    const T* gp = grad.data<T>();
    T* mp = m.data<T>();
    T* vp = v.data<T>();
    T* vmaxp = vmax.defined() ? vmax.data<T>() : nullptr;
    const int64_t n = param.numel();
    for (int64_t k = 0; k < n; ++k) {
      const A vmax_k = vmaxp != nullptr ? internal::Load(vmaxp, k) : A(0);
      const math::AdamElement<A> e =
          math::AdamUpdate(s, internal::Load(pp, k), internal::Load(gp, k), internal::Load(mp, k),
                           internal::Load(vp, k), vmax_k, round);
      internal::Store(mp, k, e.exp_avg);
      internal::Store(vp, k, e.exp_avg_sq);
      if (vmaxp != nullptr) internal::Store(vmaxp, k, e.max_exp_avg_sq);
      internal::Store(pp, k, e.param);
    }
  });
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam("Adam", std::move(params), options, /*decoupled=*/false) {}

Adam::Adam(std::vector<std::pair<std::string, Tensor>> named_params, AdamOptions options)
    : Adam("Adam", std::move(named_params), options, /*decoupled=*/false) {}

Adam::Adam(std::string name, std::vector<Tensor> params, AdamOptions options, bool decoupled)
    : Optimizer(std::move(name), options.lr, std::move(params)),
      options_(options),
      decoupled_weight_decay_(decoupled) {
  validate();
}

Adam::Adam(std::string name, std::vector<std::pair<std::string, Tensor>> named_params,
           AdamOptions options, bool decoupled)
    : Optimizer(std::move(name), options.lr, std::move(named_params)),
      options_(options),
      decoupled_weight_decay_(decoupled) {
  validate();
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Adam("AdamW", std::move(params), FromAdamW(options), /*decoupled=*/true) {}

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params, AdamWOptions options)
    : Adam("AdamW", std::move(named_params), FromAdamW(options), /*decoupled=*/true) {}

void Adam::validate() const {
  FSDP_CHECK(options_.eps >= 0.0, name(), ": Invalid epsilon value: ", options_.eps);
  FSDP_CHECK(options_.beta1 >= 0.0 && options_.beta1 < 1.0, name(),
             ": Invalid beta parameter at index 0: ", options_.beta1);
  FSDP_CHECK(options_.beta2 >= 0.0 && options_.beta2 < 1.0, name(),
             ": Invalid beta parameter at index 1: ", options_.beta2);
  FSDP_CHECK(options_.weight_decay >= 0.0, name(),
             ": Invalid weight_decay value: ", options_.weight_decay);
}

void Adam::step() {
  const AdamOptions& o = options_;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& param = group.params[i];
      const Tensor grad_t = param.grad();
      if (!grad_t.defined()) continue;
      const std::string label = group.names.empty() ? param.str() : group.names[i];
      const Tensor grad = internal::CheckedGrad(name(), label, param, grad_t);
      nn::OrderedDict<Tensor>& state = mutable_state(param);
      if (!state.contains("step")) {
        state.insert("step", Tensor::zeros({}, DType::kFloat32));
        state.insert("exp_avg", Tensor::zeros(param.sizes(), param.dtype(), param.device()));
        state.insert("exp_avg_sq", Tensor::zeros(param.sizes(), param.dtype(), param.device()));
        if (o.amsgrad) {
          state.insert("max_exp_avg_sq",
                       Tensor::zeros(param.sizes(), param.dtype(), param.device()));
        }
      }
      const Tensor m = state.at("exp_avg");
      const Tensor v = state.at("exp_avg_sq");
      const Tensor vmax = o.amsgrad ? state.at("max_exp_avg_sq") : Tensor();
      internal::CheckStateDevice(name(), label, param, "exp_avg", m);
      internal::CheckStateDevice(name(), label, param, "exp_avg_sq", v);
      if (vmax.defined()) internal::CheckStateDevice(name(), label, param, "max_exp_avg_sq", vmax);

      // step_t += 1 on the float32 step tensor (a CPU scalar), then step = step_t.item().
      Tensor step_t = state.at("step");
      step_t.fill_(static_cast<double>(static_cast<float>(step_t.item() + 1.0)));
      const double step = step_t.item();
      const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
      const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
      const math::AdamStepSpec spec{.lr = lr,
                                    .beta1 = o.beta1,
                                    .beta2 = o.beta2,
                                    .eps = o.eps,
                                    .weight_decay = o.weight_decay,
                                    .step_size = lr / bias_correction1,
                                    .bias_correction2_sqrt = std::sqrt(bias_correction2),
                                    .decoupled_weight_decay = decoupled_weight_decay_,
                                    .amsgrad = o.amsgrad,
                                    .maximize = o.maximize};
      if (param.device().is_cuda()) {
        FSDP_OPTIM_CUDA(name(), label, AdamStep(param, grad, m, v, vmax, spec));
      } else {
        AdamStepCpu(name(), param, grad, m, v, vmax, spec);
      }
      // In-place writes under no_grad.
      m.bump_version();
      v.bump_version();
      if (vmax.defined()) vmax.bump_version();
      param.bump_version();
    }
  }
}

}  // namespace fsdp::optim
