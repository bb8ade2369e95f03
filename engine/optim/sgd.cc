#include "engine/optim/sgd.h"

#include "engine/optim/optim_cuda.h"
#include "engine/optim/update_kernels.h"
#include "engine/optim/update_math.h"

namespace fsdp::optim {

namespace {

// The CPU loop: math::SgdUpdate per element, in the parameter's storage type.
void SgdStepCpu(const Tensor& param, const Tensor& grad, const Tensor& buf,
                const math::SgdStepSpec& spec) {
  internal::DispatchFloating(param.dtype(), "SGD", [&](auto tag) {
    using T = decltype(tag);
    using A = OpMath<T>;
    const math::SgdScalars<A> s = math::MakeSgdScalars<A>(spec);
    const auto round = internal::RoundingFor<T>();
    T* pp = param.data<T>();
    const T* gp = grad.data<T>();
    T* bp = buf.defined() ? buf.data<T>() : nullptr;
    const bool load_buf = bp != nullptr && !spec.first_step;
    const int64_t n = param.numel();
    for (int64_t k = 0; k < n; ++k) {
      const A b = load_buf ? internal::Load(bp, k) : A(0);
      const math::SgdElement<A> e =
          math::SgdUpdate(s, internal::Load(pp, k), internal::Load(gp, k), b, round);
      if (bp != nullptr) internal::Store(bp, k, e.momentum_buffer);
      internal::Store(pp, k, e.param);
    }
  });
}

}  // namespace

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
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& param = group.params[i];
      const Tensor grad_t = param.grad();
      if (!grad_t.defined()) continue;
      const std::string label = group.names.empty() ? param.str() : group.names[i];
      const Tensor grad = internal::CheckedGrad("SGD", label, param, grad_t);
      nn::OrderedDict<Tensor>& state = mutable_state(param);
      const bool first = !state.contains("momentum_buffer");
      if (o.momentum != 0.0 && first) {
        state.insert("momentum_buffer",
                     Tensor::zeros(param.sizes(), param.dtype(), param.device()));
      }
      const Tensor buf = o.momentum != 0.0 ? state.at("momentum_buffer") : Tensor();
      if (buf.defined()) internal::CheckStateDevice("SGD", label, param, "momentum_buffer", buf);
      const math::SgdStepSpec spec{.lr = group.lr,
                                   .momentum = o.momentum,
                                   .dampening = o.dampening,
                                   .weight_decay = o.weight_decay,
                                   .nesterov = o.nesterov,
                                   .maximize = o.maximize,
                                   .first_step = first};
      if (param.device().is_cuda()) {
        FSDP_OPTIM_CUDA("SGD", label, SgdStep(param, grad, buf, spec));
      } else {
        SgdStepCpu(param, grad, buf, spec);
      }
      // In-place writes under no_grad.
      if (buf.defined()) buf.bump_version();
      param.bump_version();
    }
  }
}

}  // namespace fsdp::optim
