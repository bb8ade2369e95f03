// Building blocks shared by the oracle's model implementations: layers.h functions bound to
// parameters looked up by FQN prefix ("layers.0.attention.wq" -> "...wq.weight"), the matching
// TensorSpec lists, and input/output reshaping. Backward helpers accumulate parameter gradients
// into a TensorMap (so a module used twice sums its gradients) and return the input gradient.
//
// Thread-safety: pure functions. Ownership: values; `grads` is borrowed for the call only.
#pragma once

#include <string>
#include <vector>

#include "reference/layers.h"
#include "reference/model.h"
#include "reference/tensor.h"

namespace fsdp::reference {

// Specs of nn.Linear(in, out, bias): "<prefix>.weight" [out, in], then "<prefix>.bias" [out].
std::vector<TensorSpec> LinearSpecs(const std::string& prefix, int64_t in_features,
                                    int64_t out_features, bool bias);
// Specs of nn.LayerNorm(dim, bias=bias) / RMSNormPython(dim): weight [dim] (+ bias [dim]).
std::vector<TensorSpec> NormSpecs(const std::string& prefix, int64_t dim, bool bias);
// Appends `more` to `specs`.
void AppendSpecs(std::vector<TensorSpec>* specs, const std::vector<TensorSpec>& more);

// y = x Wᵀ (+ b) with W = params["<prefix>.weight"], b = params["<prefix>.bias"].
template <typename T>
Matrix<T> LinearAt(const TensorMap<T>& params, const std::string& prefix, bool bias,
                   const Matrix<T>& x);
// Accumulates dW (and db) into grads under the parameter FQNs; returns dx.
template <typename T>
Matrix<T> LinearAtBackward(const TensorMap<T>& params, const std::string& prefix, bool bias,
                           const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads);

// nn.LayerNorm with weight "<prefix>.weight" and, when `bias`, "<prefix>.bias".
template <typename T>
Matrix<T> LayerNormAt(const TensorMap<T>& params, const std::string& prefix, bool bias,
                      const Matrix<T>& x, double eps = 1e-5);
template <typename T>
Matrix<T> LayerNormAtBackward(const TensorMap<T>& params, const std::string& prefix, bool bias,
                              const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads,
                              double eps = 1e-5);

// RMSNormPython with weight "<prefix>.weight".
template <typename T>
Matrix<T> RmsNormAt(const TensorMap<T>& params, const std::string& prefix, const Matrix<T>& x,
                    double eps = 1e-6);
template <typename T>
Matrix<T> RmsNormAtBackward(const TensorMap<T>& params, const std::string& prefix,
                            const Matrix<T>& x, const Matrix<T>& grad_out, TensorMap<T>* grads,
                            double eps = 1e-6);

// input.features as a [rows, in_features] matrix; `leading` receives the shape without the last
// dim. Throws unless features are set and their last dim is `in_features`.
template <typename T>
Matrix<T> FeaturesAsMatrix(const ModelInput<T>& input, int64_t in_features,
                           const std::string& model_name, Shape* leading);

// FeaturesAsMatrix for a model that takes [N, in_features] input only: also throws unless the
// features have exactly two dims.
template <typename T>
Matrix<T> BatchRowsAsMatrix(const ModelInput<T>& input, int64_t in_features,
                            const std::string& model_name, Shape* leading);

// `leading` + {last}.
Shape WithLastDim(const Shape& leading, int64_t last);

// True when at least one output gradient slot is set.
template <typename T>
bool AnyGrad(const std::vector<std::optional<BasicRefTensor<T>>>& output_grads);

// output_grads[i] as a [rows, cols] matrix, or nullopt. Throws when the slot is set with a shape
// other than `expected`, or when output_grads has the wrong number of slots.
template <typename T>
std::optional<Matrix<T>> OutputGrad(const std::vector<std::optional<BasicRefTensor<T>>>& grads,
                                    size_t i, size_t num_outputs, const Shape& expected,
                                    const std::string& model_name);

}  // namespace fsdp::reference
