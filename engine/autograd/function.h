// Custom autograd functions (torch.autograd.Function / torch::autograd::Function<T>): a
// forward that runs under no-grad and a user backward, joined by one node.
//
//   struct Scale : Function<Scale> {
//     static constexpr const char* kName = "ScaleBackward";
//     static TensorList forward(FunctionCtx* ctx, const TensorList& in, double factor) {
//       ctx->saved_data["factor"] = factor;
//       ctx->save_for_backward({in[0]});
//       return {times(in[0], factor)};
//     }
//     static TensorList backward(FunctionCtx* ctx, const TensorList& grad_outputs) {...}
//   };
//   TensorList out = Scale::apply({x}, 2.0);
//
// Order (PyTorch's THPFunction_apply): the node is created, taking the thread's next sequence
// number, BEFORE forward runs; forward runs under no-grad (it records nothing); then, when
// grad mode is on and an input requires grad, the node gets one edge per input and becomes
// grad_fn of each differentiable output (output_nr = position), and the tensors passed to
// save_for_backward are packed (saved-tensor hooks active at that moment apply).
// Backward receives one gradient per output (undefined ones materialised as zeros unless
// set_materialize_grads(false)) and returns one per input; extra trailing undefined entries
// are allowed. It is called even when every incoming gradient is undefined.
//
// Ownership: the node owns the ctx; the ctx owns the saved tensors (released after a backward
// without retain_graph) and saved_data.
// Thread-safety: like any op, used by the rank's own thread.
#pragma once

#include <any>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/autograd/node.h"
#include "engine/autograd/record.h"

namespace fsdp::autograd {

// The ctx of a custom function: saved tensors and data for backward, and the flags set by
// forward. Owned by the function's node.
class FunctionCtx {
 public:
  // Tensors for backward: inputs keep their autograd history, outputs are saved detached.
  void save_for_backward(TensorList tensors);
  // The saved tensors; throws the "backward through the graph a second time" error after the
  // graph was released.
  TensorList saved_tensors() const;
  void mark_non_differentiable(const TensorList& outputs);
  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  bool materialize_grads() const { return materialize_grads_; }
  // Whether input i requires grad (ctx.needs_input_grad).
  bool needs_input_grad(size_t index) const { return needs_input_grad_.at(index); }

  // Non-tensor state for backward (ctx.saved_data of the C++ API).
  std::unordered_map<std::string, std::any> saved_data;

 private:
  friend class CustomFunctionNode;
  friend TensorList ApplyFunction(
      const std::string& name, const TensorList& inputs,
      const std::function<TensorList(FunctionCtx&, const TensorList&)>& forward,
      std::function<TensorList(FunctionCtx&, const TensorList&)> backward);

  TensorList to_save_;
  bool has_to_save_ = false;
  std::vector<SavedTensor> saved_;
  bool released_ = false;
  bool materialize_grads_ = true;
  std::vector<bool> needs_input_grad_;
  std::vector<std::shared_ptr<TensorImpl>> non_differentiable_;
};

using CustomForwardFn = std::function<TensorList(FunctionCtx& ctx, const TensorList& inputs)>;
using CustomBackwardFn =
    std::function<TensorList(FunctionCtx& ctx, const TensorList& grad_outputs)>;

// The node of a custom function (PyNode): materialises undefined gradients (unless disabled),
// calls the user backward and checks the number of gradients it returns.
class CustomFunctionNode : public Node {
 public:
  CustomFunctionNode(std::string name, std::shared_ptr<FunctionCtx> ctx, CustomBackwardFn backward);
  std::string name() const override { return name_; }
  void release_variables() override;
  const std::shared_ptr<FunctionCtx>& ctx() const { return ctx_; }

 protected:
  TensorList apply(TensorList&& grad_outputs) override;

 private:
  std::string name_;
  std::shared_ptr<FunctionCtx> ctx_;
  CustomBackwardFn backward_;
};

// The untyped core of Function<T>::apply; `name` is the node's name.
TensorList ApplyFunction(const std::string& name, const TensorList& inputs,
                         const CustomForwardFn& forward, CustomBackwardFn backward);

// CRTP base: T provides static forward(FunctionCtx*, const TensorList&, extra args...) and
// static backward(FunctionCtx*, const TensorList&), and optionally `kName`.
template <typename T>
struct Function {
  template <typename... Args>
  static TensorList apply(const TensorList& inputs, Args&&... args) {
    return ApplyFunction(
        NodeName(), inputs,
        [&](FunctionCtx& ctx, const TensorList& in) {
          return T::forward(&ctx, in, std::forward<Args>(args)...);
        },
        [](FunctionCtx& ctx, const TensorList& grads) { return T::backward(&ctx, grads); });
  }

 private:
  static std::string NodeName() {
    if constexpr (requires { T::kName; }) {
      return std::string(T::kName);
    } else {
      return "CustomFunctionBackward";
    }
  }
};

}  // namespace fsdp::autograd
