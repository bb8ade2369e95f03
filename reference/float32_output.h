// Float32Output<T>: another oracle model whose outputs are rounded to float32, as a PyTorch
// forward that ends with `.float()` (the seeds' Transformer) returns them whatever its
// parameters' dtype. Backward passes the output gradients through unchanged: the backward of
// the cast is the cast back, which is exact. So a float64 run of such a model, whose loss reads
// float32 outputs (`(out * out).sum()` has the gradient 2 * float(out)), is reproduced to
// float64 precision in everything but the loss value itself.
//
// Ownership: shares the wrapped model. Thread-safety: immutable, like every Model.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reference/model.h"

namespace fsdp::reference {

template <typename T>
class Float32Output final : public Model<T> {
 public:
  explicit Float32Output(std::shared_ptr<const Model<T>> model) : model_(std::move(model)) {}

  std::string Name() const override { return model_->Name(); }
  std::vector<TensorSpec> ParameterSpecs() const override { return model_->ParameterSpecs(); }
  std::vector<TensorSpec> BufferSpecs() const override { return model_->BufferSpecs(); }
  TensorMap<T> DefaultBuffers() const override { return model_->DefaultBuffers(); }
  int NumOutputs() const override { return model_->NumOutputs(); }

  ForwardResult<T> Forward(const TensorMap<T>& params, const TensorMap<T>& buffers,
                           const ModelInput<T>& input) const override {
    ForwardResult<T> result = model_->Forward(params, buffers, input);
    for (BasicRefTensor<T>& out : result.outputs) {
      for (T& v : out.data) v = static_cast<T>(static_cast<float>(v));
    }
    return result;
  }

  BackwardResult<T> Backward(
      const TensorMap<T>& params, const TensorMap<T>& buffers, const ModelInput<T>& input,
      const std::vector<std::optional<BasicRefTensor<T>>>& output_grads) const override {
    return model_->Backward(params, buffers, input, output_grads);
  }

 private:
  std::shared_ptr<const Model<T>> model_;
};

}  // namespace fsdp::reference
