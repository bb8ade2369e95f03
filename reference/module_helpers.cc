#include "reference/module_helpers.h"

#include <stdexcept>

namespace fsdp::reference {

std::vector<TensorSpec> LinearSpecs(const std::string& prefix, int64_t in_features,
                                    int64_t out_features, bool bias) {
  std::vector<TensorSpec> specs = {{JoinFqn(prefix, "weight"), {out_features, in_features}}};
  if (bias) specs.push_back({JoinFqn(prefix, "bias"), {out_features}});
  return specs;
}

std::vector<TensorSpec> NormSpecs(const std::string& prefix, int64_t dim, bool bias) {
  std::vector<TensorSpec> specs = {{JoinFqn(prefix, "weight"), {dim}}};
  if (bias) specs.push_back({JoinFqn(prefix, "bias"), {dim}});
  return specs;
}

void AppendSpecs(std::vector<TensorSpec>* specs, const std::vector<TensorSpec>& more) {
  specs->insert(specs->end(), more.begin(), more.end());
}

template <typename T>
Matrix<T> LinearAt(const TensorMap<T>& params, const std::string& prefix, bool bias,
                   const Matrix<T>& x) {
  const Matrix<T> w = ToMatrix(Lookup(params, JoinFqn(prefix, "weight")));
  if (!bias) return LinearForward<T>(x, w, nullptr);
  const Vector<T> b = ToVector(Lookup(params, JoinFqn(prefix, "bias")));
  return LinearForward<T>(x, w, &b);
}

template <typename T>
Matrix<T> LinearAtBackward(const TensorMap<T>& params, const std::string& prefix, bool bias,
                           const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads) {
  const std::string wname = JoinFqn(prefix, "weight");
  const BasicRefTensor<T>& wt = Lookup(params, wname);
  const LinearGrads<T> g = LinearBackward<T>(x, ToMatrix(wt), bias, grad_out);
  AccumulateInto(grads, wname, FromMatrix<T>(g.weight, wt.shape));
  if (bias) {
    AccumulateInto(grads, JoinFqn(prefix, "bias"), FromVector<T>(g.bias, {g.bias.size()}));
  }
  return g.input;
}

template <typename T>
Matrix<T> LayerNormAt(const TensorMap<T>& params, const std::string& prefix, bool bias,
                      const Matrix<T>& x, double eps) {
  const Vector<T> w = ToVector(Lookup(params, JoinFqn(prefix, "weight")));
  if (!bias) return LayerNormForward<T>(x, &w, nullptr, eps);
  const Vector<T> b = ToVector(Lookup(params, JoinFqn(prefix, "bias")));
  return LayerNormForward<T>(x, &w, &b, eps);
}

template <typename T>
Matrix<T> LayerNormAtBackward(const TensorMap<T>& params, const std::string& prefix, bool bias,
                              const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads,
                              double eps) {
  const Vector<T> w = ToVector(Lookup(params, JoinFqn(prefix, "weight")));
  const NormGrads<T> g = LayerNormBackward<T>(x, &w, bias, grad_out, eps);
  AccumulateInto(grads, JoinFqn(prefix, "weight"), FromVector<T>(g.weight, {w.size()}));
  if (bias) AccumulateInto(grads, JoinFqn(prefix, "bias"), FromVector<T>(g.bias, {w.size()}));
  return g.input;
}

template <typename T>
Matrix<T> RmsNormAt(const TensorMap<T>& params, const std::string& prefix, const Matrix<T>& x,
                    double eps) {
  return RmsNormForward<T>(x, ToVector(Lookup(params, JoinFqn(prefix, "weight"))), eps);
}

template <typename T>
Matrix<T> RmsNormAtBackward(const TensorMap<T>& params, const std::string& prefix,
                            const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads,
                            double eps) {
  const Vector<T> w = ToVector(Lookup(params, JoinFqn(prefix, "weight")));
  const NormGrads<T> g = RmsNormBackward<T>(x, w, grad_out, eps);
  AccumulateInto(grads, JoinFqn(prefix, "weight"), FromVector<T>(g.weight, {w.size()}));
  return g.input;
}

template <typename T>
Matrix<T> FeaturesAsMatrix(const ModelInput<T>& input, int64_t in_features,
                           const std::string& model_name, Shape* leading) {
  if (!input.features) throw std::invalid_argument(model_name + ": input.features is not set");
  const BasicRefTensor<T>& x = *input.features;
  if (x.ndim() < 1 || x.shape.back() != in_features) {
    throw std::invalid_argument(model_name + ": input of shape " + ShapeToString(x.shape) +
                                " does not end in " + std::to_string(in_features) + " features");
  }
  *leading = Shape(x.shape.begin(), x.shape.end() - 1);
  return ToMatrix(x);
}

template <typename T>
Matrix<T> BatchRowsAsMatrix(const ModelInput<T>& input, int64_t in_features,
                            const std::string& model_name, Shape* leading) {
  Matrix<T> x = FeaturesAsMatrix(input, in_features, model_name, leading);
  if (leading->size() != 1) {
    throw std::invalid_argument(model_name + ": expects [N, " + std::to_string(in_features) +
                                "] input, got " + ShapeToString(input.features->shape));
  }
  return x;
}

Shape WithLastDim(const Shape& leading, int64_t last) {
  Shape s = leading;
  s.push_back(last);
  return s;
}

template <typename T>
bool AnyGrad(const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) {
  for (const auto& g : output_grads) {
    if (g) return true;
  }
  return false;
}

template <typename T>
std::optional<Matrix<T>> OutputGrad(const std::vector<std::optional<BasicRefTensor<T>>>& grads,
                                    size_t i, size_t num_outputs, const Shape& expected,
                                    const std::string& model_name) {
  if (grads.size() != num_outputs) {
    throw std::invalid_argument(model_name + ": " + std::to_string(grads.size()) +
                                " output gradients for " + std::to_string(num_outputs) +
                                " outputs");
  }
  if (!grads[i]) return std::nullopt;
  if (grads[i]->shape != expected) {
    throw std::invalid_argument(model_name + ": gradient of output " + std::to_string(i) +
                                " has shape " + ShapeToString(grads[i]->shape) + ", expected " +
                                ShapeToString(expected));
  }
  return ToMatrix(*grads[i]);
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                              \
  template Matrix<T> LinearAt<T>(const TensorMap<T>&, const std::string&, bool, const Matrix<T>&); \
  template Matrix<T> LinearAtBackward<T>(const TensorMap<T>&, const std::string&, bool,            \
                                         const Matrix<T>&, const Matrix<T>&, TensorMap<T>*);       \
  template Matrix<T> LayerNormAt<T>(const TensorMap<T>&, const std::string&, bool,                 \
                                    const Matrix<T>&, double);                                     \
  template Matrix<T> LayerNormAtBackward<T>(const TensorMap<T>&, const std::string&, bool,         \
                                            const Matrix<T>&, const Matrix<T>&, TensorMap<T>*,     \
                                            double);                                               \
  template Matrix<T> RmsNormAt<T>(const TensorMap<T>&, const std::string&, const Matrix<T>&,       \
                                  double);                                                         \
  template Matrix<T> RmsNormAtBackward<T>(const TensorMap<T>&, const std::string&,                 \
                                          const Matrix<T>&, const Matrix<T>&, TensorMap<T>*,       \
                                          double);                                                 \
  template Matrix<T> FeaturesAsMatrix<T>(const ModelInput<T>&, int64_t, const std::string&,        \
                                         Shape*);                                                  \
  template Matrix<T> BatchRowsAsMatrix<T>(const ModelInput<T>&, int64_t, const std::string&,       \
                                          Shape*);                                                 \
  template bool AnyGrad<T>(const std::vector<std::optional<BasicRefTensor<T>>>&);                  \
  template std::optional<Matrix<T>> OutputGrad<T>(                                                 \
      const std::vector<std::optional<BasicRefTensor<T>>>&, size_t, size_t, const Shape&,          \
      const std::string&);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
