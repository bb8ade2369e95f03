#include "engine/optim/sgd.h"

#include "engine/optim/update_kernels.h"

namespace fsdp::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer("SGD", options.lr, std::move(params)), options_(options) {
  validate();
}

SGD::SGD(std::vector<std::pair<std::string, Tensor>> named_params, SGDOptions options)
    : Optimizer("SGD", options.lr, std::move(named_params)), options_(options) {
  validate();
}

void SGD::validate() const {
  FSDP_CHECK(options_.momentum >= 0.0, "SGD: Invalid momentum value: ", options_.momentum);
  FSDP_CHECK(options_.weight_decay >= 0.0,
             "SGD: Invalid weight_decay value: ", options_.weight_decay);
  FSDP_CHECK(!options_.nesterov || (options_.momentum > 0.0 && options_.dampening == 0.0),
             "SGD: Nesterov momentum requires a momentum and zero dampening");
}

void SGD::step() {
  const SGDOptions& o = options_;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& param = group.params[i];
      const Tensor grad_t = param.grad();
      if (!grad_t.defined()) continue;
      const std::string label = group.names.empty() ? param.str() : group.names[i];
      FSDP_CHECK(grad_t.sizes() == param.sizes(), "SGD: grad of ", label, " has shape ",
                 ShapeStr(grad_t.sizes()), " but the parameter has shape ",
                 ShapeStr(param.sizes()));
      nn::OrderedDict<Tensor>& state = mutable_state(param);
      const bool first = !state.contains("momentum_buffer");
      if (o.momentum != 0.0 && first) {
        state.insert("momentum_buffer",
                     Tensor::zeros(param.sizes(), param.dtype(), param.device()));
      }
      Tensor p = internal::HostAs(param, param.dtype());
      Tensor g = internal::HostAs(grad_t, param.dtype());
      Tensor buf_dev = o.momentum != 0.0 ? state.at("momentum_buffer") : Tensor();
      Tensor buf = buf_dev.defined() ? internal::HostAs(buf_dev, param.dtype()) : Tensor();
      internal::DispatchFloating(param.dtype(), "SGD", [&](auto tag) {
        using T = decltype(tag);
        using A = internal::Acc<T>;
        T* pp = p.data<T>();
        const T* gp = g.data<T>();
        T* bp = buf.defined() ? buf.data<T>() : nullptr;
        const A wd = static_cast<A>(o.weight_decay);
        const A mom = static_cast<A>(o.momentum);
        const A one_minus_damp = static_cast<A>(1.0 - o.dampening);
        const A neg_lr = static_cast<A>(-lr);
        const int64_t n = param.numel();
        for (int64_t k = 0; k < n; ++k) {
          A gk = internal::Load(gp, k);
          if (o.maximize) gk = -gk;
          const A pk = internal::Load(pp, k);
          if (o.weight_decay != 0.0) gk = internal::Round<T>(gk + wd * pk);
          if (o.momentum != 0.0) {
            A b;
            if (first) {
              b = gk;
            } else {
              b = internal::Round<T>(internal::Load(bp, k) * mom);
              b = internal::Round<T>(b + one_minus_damp * gk);
            }
            internal::Store(bp, k, b);
            gk = o.nesterov ? internal::Round<T>(gk + mom * b) : b;
          }
          internal::Store(pp, k, pk + neg_lr * gk);
        }
      });
      if (buf.defined()) internal::CommitHost(buf_dev, buf);
      internal::CommitHost(param, p);
    }
  }
}

}  // namespace fsdp::optim
