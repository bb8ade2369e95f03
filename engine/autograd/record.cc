#include "engine/autograd/record.h"

#include <algorithm>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/saved_tensor_hooks.h"
#include "engine/autograd/variable.h"

namespace fsdp::autograd {

const char kBackwardTwiceMessage[] =
    "Trying to backward through the graph a second time (or directly access saved tensors after "
    "they have already been freed). Saved intermediate values of the graph are freed when you "
    "call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward "
    "through the graph a second time or if you need to access saved tensors after calling "
    "backward.";

// SavedTensorState: what one SavedTensor (and its copies) holds: the tensor itself (kept
// with its history, or a detached alias), or the value returned by a pack hook together with
// the hooks that packed it.
struct SavedTensorState {
  bool defined = false;
  bool keep_history = false;
  bool released = false;
  Tensor data;
  std::shared_ptr<SavedTensorHooks> hooks;
  std::any packed;
  // keep_history with hooks: the history re-attached to the unpacked value (SavedVariable
  // keeps grad_fn/output_nr of a saved non-output, requires_grad of a leaf).
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  bool requires_grad = false;
};

SavedTensor::SavedTensor(const Tensor& tensor) : SavedTensor(tensor, /*keep_history=*/false) {}

SavedTensor::SavedTensor(const Tensor& tensor, bool keep_history)
    : state_(std::make_shared<SavedTensorState>()) {
  state_->keep_history = keep_history;
  if (!tensor.defined()) return;
  state_->defined = true;
  if (std::shared_ptr<SavedTensorHooks> hooks = current_saved_tensor_hooks()) {
    // Pack first: a pack hook may throw (checkpoint's early stop) and leave nothing behind.
    // The hook gets a detached alias: an op often saves its output before record_function
    // gives it a grad_fn, and a hook that keeps its argument would otherwise close a cycle
    // (tensor -> grad_fn -> saved state -> tensor).
    state_->packed = hooks->pack(tensor.detach());
    state_->hooks = std::move(hooks);
    if (keep_history) {
      state_->grad_fn = tensor.grad_fn();
      state_->output_nr = tensor.output_nr();
      state_->requires_grad = tensor.requires_grad();
    }
    return;
  }
  // A detached alias shares the Storage object (so FSDP's free/re-allocate of unsharded
  // parameters is seen) without a reference to the tensor's grad_fn (no cycle).
  state_->data = keep_history ? tensor : tensor.detach();
}

Tensor SavedTensor::unpack() const {
  if (!state_ || !state_->defined) {
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !state_ || !state_->released,
                    kBackwardTwiceMessage);
    return Tensor();
  }
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !state_->released, kBackwardTwiceMessage);
  if (state_->hooks) {
    Tensor result = state_->hooks->unpack(state_->packed);
    if (!result.defined()) return result;
    if (!state_->keep_history) {
      return result.impl()->autograd_meta ? result.detach() : result;
    }
    if (state_->grad_fn) {
      if (result.grad_fn() == state_->grad_fn && result.output_nr() == state_->output_nr) {
        return result;
      }
      Tensor alias = result.detach();
      set_gradient_edge(alias, Edge(state_->grad_fn, state_->output_nr));
      return alias;
    }
    if (state_->requires_grad && !result.requires_grad()) {
      Tensor alias = result.detach();
      alias.set_requires_grad(true);
      return alias;
    }
    return result;
  }
  return state_->data;
}

void SavedTensor::release() {
  if (!state_) return;
  state_->released = true;
  state_->data = Tensor();
  state_->packed.reset();
  state_->hooks = nullptr;
  state_->grad_fn = nullptr;
}

namespace {

// FunctionNode: the node record_function creates (a LambdaNode): runs the op's backward
// closure. Owns the closure, which owns the op's SavedTensors; release_variables destroys it.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}

  std::string name() const override { return name_; }
  void release_variables() override {
    backward_ = nullptr;
    released_ = true;
  }

 protected:
  TensorList apply(TensorList&& grad_outputs) override {
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !released_, kBackwardTwiceMessage);
    const bool any_defined = std::any_of(grad_outputs.begin(), grad_outputs.end(),
                                         [](const Tensor& g) { return g.defined(); });
    if (!any_defined) return TensorList(num_outputs());
    for (size_t i = 0; i < grad_outputs.size(); ++i) {
      if (!grad_outputs[i].defined()) grad_outputs[i] = input_metadata(i).zeros();
    }
    return backward_(grad_outputs);
  }

 private:
  std::string name_;
  BackwardFn backward_;
  bool released_ = false;
};

}  // namespace

bool compute_requires_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const Tensor& t) { return t.defined() && t.requires_grad(); });
}

TensorList record_function(const std::string& name, const TensorList& inputs, TensorList outputs,
                           BackwardFn backward) {
  if (!compute_requires_grad(inputs)) return outputs;
  FSDP_CHECK(backward != nullptr, "record_function(", name, "): no backward function");

  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  EdgeList edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) edges.push_back(gradient_edge(input));
  node->set_next_edges(std::move(edges));

  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    if (!out.defined()) {
      node->add_input_metadata(Tensor());
      continue;
    }
    const bool is_input = std::any_of(inputs.begin(), inputs.end(),
                                      [&](const Tensor& t) { return t.is_same(out); });
    if (is_input) {
      FSDP_CHECK(!(out.is_leaf() && out.requires_grad()), name,
                 ": a leaf Variable that requires grad is being used in an in-place operation.");
    } else if (out.impl()->autograd_meta &&
               (out.grad_fn() != nullptr || out.requires_grad())) {
      out = out.detach();
    }
    const uint32_t input_nr = node->add_input_metadata(out);
    if (IsFloatingPoint(out.dtype())) set_gradient_edge(out, Edge(node, input_nr));
  }
  return outputs;
}

Tensor record_function(const std::string& name, const TensorList& inputs, Tensor output,
                       BackwardFn backward) {
  TensorList outputs = record_function(name, inputs, TensorList{std::move(output)},
                                       std::move(backward));
  return std::move(outputs[0]);
}

}  // namespace fsdp::autograd
