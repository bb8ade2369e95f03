#include "engine/autograd/function.h"

#include <algorithm>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"

namespace fsdp::autograd {

void FunctionCtx::save_for_backward(TensorList tensors) {
  to_save_ = std::move(tensors);
  has_to_save_ = true;
}

TensorList FunctionCtx::saved_tensors() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !released_, kBackwardTwiceMessage);
  TensorList out;
  out.reserve(saved_.size());
  for (const SavedTensor& saved : saved_) out.push_back(saved.unpack());
  return out;
}

void FunctionCtx::mark_non_differentiable(const TensorList& outputs) {
  for (const Tensor& t : outputs) {
    if (t.defined()) non_differentiable_.push_back(t.impl_ptr());
  }
}

CustomFunctionNode::CustomFunctionNode(std::string name, std::shared_ptr<FunctionCtx> ctx,
                                       CustomBackwardFn backward)
    : name_(std::move(name)), ctx_(std::move(ctx)), backward_(std::move(backward)) {}

void CustomFunctionNode::release_variables() {
  for (SavedTensor& saved : ctx_->saved_) saved.release();
  ctx_->saved_.clear();
  ctx_->released_ = true;
}

TensorList CustomFunctionNode::apply(TensorList&& grad_outputs) {
  if (ctx_->materialize_grads_) {
    for (size_t i = 0; i < grad_outputs.size(); ++i) {
      if (!grad_outputs[i].defined()) grad_outputs[i] = input_metadata(i).zeros();
    }
  }
  TensorList grads = backward_(*ctx_, grad_outputs);
  const size_t expected = num_outputs();
  if (grads.size() > expected) {
    const bool extra_undefined = std::all_of(grads.begin() + static_cast<std::ptrdiff_t>(expected),
                                             grads.end(),
                                             [](const Tensor& g) { return !g.defined(); });
    if (extra_undefined) grads.resize(expected);
  }
  FSDP_CHECK(grads.size() == expected, "function ", name_,
             " returned an incorrect number of gradients (expected ", expected, ", got ",
             grads.size(), ")");
  return grads;
}

TensorList ApplyFunction(const std::string& name, const TensorList& inputs,
                         const CustomForwardFn& forward, CustomBackwardFn backward) {
  FSDP_CHECK(forward && backward, "custom Function ", name, ": forward and backward must be set");
  auto ctx = std::make_shared<FunctionCtx>();
  // Created before forward runs, so it takes its sequence number now.
  auto node = std::make_shared<CustomFunctionNode>(name, ctx, std::move(backward));
  bool any_requires_grad = false;
  ctx->needs_input_grad_.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    const bool input_requires_grad = input.defined() && input.requires_grad();
    ctx->needs_input_grad_.push_back(input_requires_grad);
    any_requires_grad = any_requires_grad || input_requires_grad;
  }
  const bool is_executable = GradMode::is_enabled() && any_requires_grad;
  if (is_executable) {
    EdgeList edges;
    edges.reserve(inputs.size());
    for (const Tensor& input : inputs) edges.push_back(gradient_edge(input));
    node->set_next_edges(std::move(edges));
  }

  TensorList raw_outputs;
  {
    NoGradGuard no_grad;
    raw_outputs = forward(*ctx, inputs);
  }
  if (!is_executable) {
    ctx->to_save_.clear();
    return raw_outputs;
  }

  TensorList outputs = raw_outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    if (!out.defined()) {
      node->add_input_metadata(Tensor());
      continue;
    }
    const bool non_differentiable =
        !IsFloatingPoint(out.dtype()) ||
        std::find(ctx->non_differentiable_.begin(), ctx->non_differentiable_.end(),
                  out.impl_ptr()) != ctx->non_differentiable_.end();
    const bool is_input = std::any_of(inputs.begin(), inputs.end(),
                                      [&](const Tensor& t) { return t.is_same(out); });
    // An input returned as is (or a tensor with history) becomes a fresh alias
    // (PyTorch: view_as), so the input keeps its own history.
    if (is_input || (out.impl()->autograd_meta && (out.grad_fn() || out.requires_grad()))) {
      out = out.detach();
    }
    const uint32_t input_nr = node->add_input_metadata(out);
    if (!non_differentiable) set_gradient_edge(out, Edge(node, input_nr));
  }

  if (ctx->has_to_save_) {
    ctx->saved_.reserve(ctx->to_save_.size());
    for (const Tensor& t : ctx->to_save_) {
      // Outputs are saved detached (no cycle through their grad_fn); anything else keeps its
      // history.
      size_t output_index = outputs.size();
      for (size_t j = 0; j < outputs.size() && t.defined(); ++j) {
        if (t.is_same(raw_outputs[j]) || t.is_same(outputs[j])) {
          output_index = j;
          break;
        }
      }
      if (output_index < outputs.size()) {
        ctx->saved_.emplace_back(outputs[output_index], /*keep_history=*/false);
      } else {
        ctx->saved_.emplace_back(t, /*keep_history=*/true);
      }
    }
    ctx->to_save_.clear();
  }
  return outputs;
}

}  // namespace fsdp::autograd
