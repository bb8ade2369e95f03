// Model<T>: the interface every oracle model implements, plus the glue that runs a model and a
// loss together (ForwardBackward).
//
// A model is a pure function of (parameters, buffers, input). It holds only its configuration
// (shapes), never weights: weights come in as a TensorMap keyed by the PyTorch FQNs listed by
// ParameterSpecs(), in PyTorch registration order (named_parameters() order, tied weights once).
// Backward() is hand-derived: it recomputes the forward activations it needs, then applies the
// chain rule layer by layer; there is no tape. Gradients come back keyed by FQN, and a parameter
// the output gradients never reach (an unused module, an output the loss ignores) is ABSENT from
// the map, mirroring `param.grad is None`.
//
// Thread-safety: models are immutable after construction; Forward/Backward are const and may run
// concurrently. Ownership: all results are values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "reference/layers.h"
#include "reference/loss.h"
#include "reference/tensor.h"

namespace fsdp::reference {

// The input of one forward. Each model documents which members it reads; others must be unset.
// Data-parallel splitting (data_parallel.h) slices every set member along dim 0.
template <typename T>
struct ModelInput {
  std::optional<BasicRefTensor<T>> features;  // floating input x (e.g. [batch, dim])
  std::optional<IndexTensor> tokens;          // token ids (e.g. [batch, seq])
  std::optional<IndexTensor> decoder_tokens;  // second id input (encoder-decoder models' tgt)
  std::optional<IndexTensor> targets;         // class targets for cross-entropy; models ignore it
};

template <typename T>
struct ForwardResult {
  std::vector<BasicRefTensor<T>> outputs;  // the model's outputs, in PyTorch's return order
  TensorMap<T> buffers;                    // buffers after the forward (BatchNorm stats updated)
};

template <typename T>
struct BackwardResult {
  TensorMap<T> grads;                           // FQN -> gradient; absent = not reached (None)
  std::optional<BasicRefTensor<T>> input_grad;  // d/d input.features, when the model reads it
};

// The model interface (see the file comment). Implementations hold configuration only; callers
// own every tensor. Const methods are safe to call concurrently.
template <typename T>
class Model {
 public:
  virtual ~Model() = default;

  // The PyTorch class name, e.g. "Transformer".
  virtual std::string Name() const = 0;
  // Parameters in PyTorch registration order (named_parameters(), tied weights once).
  virtual std::vector<TensorSpec> ParameterSpecs() const = 0;
  // Buffers in named_buffers() order. Default: none.
  virtual std::vector<TensorSpec> BufferSpecs() const { return {}; }
  // Buffers as PyTorch initialises them where that is deterministic (BatchNorm: zeros, ones, 0);
  // randomly initialised buffers are zeros here and must be supplied by the caller.
  virtual TensorMap<T> DefaultBuffers() const { return ZerosLike<T>(BufferSpecs()); }
  // How many outputs Forward returns. Default: 1.
  virtual int NumOutputs() const { return 1; }

  // Runs the forward. Throws std::invalid_argument on a missing/extra/mis-shaped parameter or
  // buffer, or an input the model cannot take.
  virtual ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                                   const ModelInput<T>& input) const = 0;

  // Gradients of Σ_k <output_k, output_grads[k]> w.r.t. the parameters (and input.features).
  // `output_grads` has one slot per output; a nullopt slot sends no gradient. Buffers are read
  // as Forward reads them (the pre-forward values); buffer updates are not repeated.
  virtual BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const = 0;
};

// One forward + loss + backward, as `loss = loss_fn(model(x)); loss.backward()`.
template <typename T>
struct LossAndGrads {
  T loss = 0;
  std::vector<BasicRefTensor<T>> outputs;
  TensorMap<T> buffers;  // after the forward
  TensorMap<T> grads;    // absent = None
  std::optional<BasicRefTensor<T>> input_grad;
};

// `input.targets` feeds cross-entropy losses.
template <typename T>
LossAndGrads<T> ForwardBackward(const Model<T>& model, const TensorMap<T>& params,
                                const TensorMap<T>& buffers, const ModelInput<T>& input,
                                const LossSpec& loss);

// Forward + loss only.
template <typename T>
T EvaluateLoss(const Model<T>& model, const TensorMap<T>& params, const TensorMap<T>& buffers,
               const ModelInput<T>& input, const LossSpec& loss);

// ---- Helpers for model implementations ---------------------------------------------------------

// Throws std::invalid_argument unless `tensors` holds exactly the `specs` names with their shapes.
// `what` names the map in the message ("parameter", "buffer").
template <typename T>
void CheckTensorMap(const std::vector<TensorSpec>& specs, const TensorMap<T>& tensors,
                    const std::string& model_name, const std::string& what);

// The entry `name` of `m`; throws naming the FQN when absent.
template <typename T>
const BasicRefTensor<T>& Lookup(const TensorMap<T>& m, const std::string& name);

// Adds `g` into grads[name] (creating it): how a weight used twice (tied, shared module, repeated
// call) accumulates, like autograd's AccumulateGrad.
template <typename T>
void AccumulateInto(TensorMap<T>* grads, const std::string& name, const BasicRefTensor<T>& g);

// "prefix.name", or "name" when prefix is empty.
std::string JoinFqn(const std::string& prefix, const std::string& name);

}  // namespace fsdp::reference
