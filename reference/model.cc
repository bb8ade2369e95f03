#include "reference/model.h"

#include <stdexcept>

namespace fsdp::reference {

template <typename T>
LossAndGrads<T> ForwardBackward(const Model<T>& model, const TensorMap<T>& params,
                                const TensorMap<T>& buffers, const ModelInput<T>& input,
                                const LossSpec& loss) {
  LossAndGrads<T> r;
  ForwardResult<T> fwd = model.Forward(params, buffers, input);
  const LossResult<T> l =
      ComputeLoss<T>(loss, fwd.outputs, input.targets ? *input.targets : IndexTensor());
  BackwardResult<T> bwd = model.Backward(params, buffers, input, l.output_grads);
  r.loss = l.loss;
  r.outputs = std::move(fwd.outputs);
  r.buffers = std::move(fwd.buffers);
  r.grads = std::move(bwd.grads);
  r.input_grad = std::move(bwd.input_grad);
  return r;
}

template <typename T>
T EvaluateLoss(const Model<T>& model, const TensorMap<T>& params, const TensorMap<T>& buffers,
               const ModelInput<T>& input, const LossSpec& loss) {
  const ForwardResult<T> fwd = model.Forward(params, buffers, input);
  return ComputeLoss<T>(loss, fwd.outputs, input.targets ? *input.targets : IndexTensor()).loss;
}

template <typename T>
void CheckTensorMap(const std::vector<TensorSpec>& specs, const TensorMap<T>& tensors,
                    const std::string& model_name, const std::string& what) {
  for (const TensorSpec& s : specs) {
    auto it = tensors.find(s.name);
    if (it == tensors.end()) {
      throw std::invalid_argument(model_name + ": missing " + what + " '" + s.name + "' " +
                                  ShapeToString(s.shape));
    }
    if (it->second.shape != s.shape) {
      throw std::invalid_argument(model_name + ": " + what + " '" + s.name + "' has shape " +
                                  ShapeToString(it->second.shape) + ", expected " +
                                  ShapeToString(s.shape));
    }
  }
  if (tensors.size() != specs.size()) {
    for (const auto& [name, t] : tensors) {
      bool known = false;
      for (const TensorSpec& s : specs) known = known || s.name == name;
      if (!known) {
        throw std::invalid_argument(model_name + ": unexpected " + what + " '" + name + "'");
      }
    }
  }
}

template <typename T>
const BasicRefTensor<T>& Lookup(const TensorMap<T>& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) throw std::invalid_argument("no tensor named '" + name + "'");
  return it->second;
}

template <typename T>
void AccumulateInto(TensorMap<T>* grads, const std::string& name, const BasicRefTensor<T>& g) {
  auto it = grads->find(name);
  if (it == grads->end()) {
    grads->emplace(name, g);
    return;
  }
  if (it->second.shape != g.shape) {
    throw std::invalid_argument("AccumulateInto '" + name + "': shape " + ShapeToString(g.shape) +
                                " vs " + ShapeToString(it->second.shape));
  }
  for (int64_t i = 0; i < g.numel(); ++i) it->second[i] += g[i];
}

std::string JoinFqn(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                    \
  template LossAndGrads<T> ForwardBackward<T>(const Model<T>&, const TensorMap<T>&,      \
                                              const TensorMap<T>&, const ModelInput<T>&, \
                                              const LossSpec&);                          \
  template T EvaluateLoss<T>(const Model<T>&, const TensorMap<T>&, const TensorMap<T>&,  \
                             const ModelInput<T>&, const LossSpec&);                     \
  template void CheckTensorMap<T>(const std::vector<TensorSpec>&, const TensorMap<T>&,   \
                                  const std::string&, const std::string&);               \
  template const BasicRefTensor<T>& Lookup<T>(const TensorMap<T>&, const std::string&);  \
  template void AccumulateInto<T>(TensorMap<T>*, const std::string&, const BasicRefTensor<T>&);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
