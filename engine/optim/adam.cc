#include "engine/optim/adam.h"

#include <cmath>

#include "engine/optim/update_kernels.h"

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
      FSDP_CHECK(grad_t.sizes() == param.sizes(), name(), ": grad of ", label, " has shape ",
                 ShapeStr(grad_t.sizes()), " but the parameter has shape ",
                 ShapeStr(param.sizes()));
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
      // step_t += 1 on the float32 step tensor, then step = step_t.item().
      Tensor step_t = state.at("step");
      step_t.fill_(static_cast<double>(static_cast<float>(step_t.item() + 1.0)));
      const double step = step_t.item();
      const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
      const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
      const double step_size = lr / bias_correction1;
      const double bias_correction2_sqrt = std::sqrt(bias_correction2);

      const Tensor& m_dev = state.at("exp_avg");
      const Tensor& v_dev = state.at("exp_avg_sq");
      const Tensor vmax_dev = o.amsgrad ? state.at("max_exp_avg_sq") : Tensor();
      Tensor p = internal::HostAs(param, param.dtype());
      Tensor g = internal::HostAs(grad_t, param.dtype());
      Tensor m = internal::HostAs(m_dev, param.dtype());
      Tensor v = internal::HostAs(v_dev, param.dtype());
      Tensor vmax = vmax_dev.defined() ? internal::HostAs(vmax_dev, param.dtype()) : Tensor();
      const bool decoupled = decoupled_weight_decay_;
      internal::DispatchFloating(param.dtype(), name().c_str(), [&](auto tag) {
        using T = decltype(tag);
        using A = internal::Acc<T>;
        T* pp = p.data<T>();
        const T* gp = g.data<T>();
        T* mp = m.data<T>();
        T* vp = v.data<T>();
        T* vmaxp = vmax.defined() ? vmax.data<T>() : nullptr;
        const A wd = static_cast<A>(o.weight_decay);
        const A decay_factor = static_cast<A>(1.0 - lr * o.weight_decay);
        const A one_minus_beta1 = static_cast<A>(1.0 - o.beta1);
        const A beta2 = static_cast<A>(o.beta2);
        const A one_minus_beta2 = static_cast<A>(1.0 - o.beta2);
        const A bc2_sqrt = static_cast<A>(bias_correction2_sqrt);
        const A eps = static_cast<A>(o.eps);
        const A neg_step_size = static_cast<A>(-step_size);
        const int64_t n = param.numel();
        for (int64_t k = 0; k < n; ++k) {
          A gk = internal::Load(gp, k);
          if (o.maximize) gk = -gk;
          A pk = internal::Load(pp, k);
          if (o.weight_decay != 0.0) {
            if (decoupled) {
              pk = internal::Round<T>(pk * decay_factor);
            } else {
              gk = internal::Round<T>(gk + wd * pk);
            }
          }
          const A mk =
              internal::Round<T>(internal::Lerp(internal::Load(mp, k), gk, one_minus_beta1));
          A vk = internal::Round<T>(internal::Load(vp, k) * beta2);
          vk = internal::Round<T>(vk + one_minus_beta2 * gk * gk);
          internal::Store(mp, k, mk);
          internal::Store(vp, k, vk);
          A v_used = vk;
          if (vmaxp != nullptr) {
            v_used = std::max(internal::Load(vmaxp, k), vk);
            internal::Store(vmaxp, k, v_used);
          }
          A denom = internal::Round<T>(std::sqrt(v_used));
          denom = internal::Round<T>(denom / bc2_sqrt);
          denom = internal::Round<T>(denom + eps);
          internal::Store(pp, k, pk + neg_step_size * mk / denom);
        }
      });
      internal::CommitHost(m_dev, m);
      internal::CommitHost(v_dev, v);
      if (vmax.defined()) internal::CommitHost(vmax_dev, vmax);
      internal::CommitHost(param, p);
    }
  }
}

}  // namespace fsdp::optim
