#include "engine/autograd/node.h"

#include "engine/autograd/grad_kernels.h"

namespace fsdp::autograd {

namespace sequence_number {
namespace {
thread_local uint64_t counter = 0;
}  // namespace
uint64_t peek() { return counter; }
uint64_t get_and_increment() { return counter++; }
}  // namespace sequence_number

InputMetadata::InputMetadata(const Tensor& tensor) {
  if (!tensor.defined()) return;
  defined = true;
  shape = tensor.sizes();
  dtype = tensor.dtype();
  device = tensor.device();
}

Tensor InputMetadata::zeros() const {
  if (!defined) return Tensor();
  return kernels::ZerosLike(shape, dtype, device);
}

bool InputMetadata::is_expandable_to_shape(const Tensor& grad) const {
  return kernels::IsExpandableTo(shape, grad.sizes());
}

Node::Node(EdgeList next_edges) : Node(sequence_number::get_and_increment(), std::move(next_edges)) {}

Node::Node(uint64_t sequence_nr, EdgeList next_edges) : sequence_nr_(sequence_nr) {
  set_next_edges(std::move(next_edges));
}

void Node::update_topological_nr(const Edge& edge) {
  if (!edge.function) return;
  const uint64_t child = edge.function->topological_nr();
  if (topological_nr_ <= child) topological_nr_ = child + 1;
}

void Node::add_next_edge(Edge edge) {
  update_topological_nr(edge);
  next_edges_.push_back(std::move(edge));
}

void Node::set_next_edges(EdgeList edges) {
  next_edges_ = std::move(edges);
  topological_nr_ = 0;
  for (const Edge& edge : next_edges_) update_topological_nr(edge);
}

uint32_t Node::add_input_metadata(const Tensor& tensor) {
  return add_input_metadata(InputMetadata(tensor));
}

uint32_t Node::add_input_metadata(const InputMetadata& metadata) {
  input_metadata_.push_back(metadata);
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

RemovableHandle Node::add_pre_hook(NodePreHook hook, bool prepend) {
  return AddRemovableHook(pre_hooks_, std::move(hook), prepend);
}

RemovableHandle Node::add_post_hook(NodePostHook hook, bool prepend) {
  return AddRemovableHook(post_hooks_, std::move(hook), prepend);
}

void Node::add_retains_grad_hook(GradientsHook hook, uint32_t output_nr) {
  retains_grad_hooks_[output_nr] = std::move(hook);
}

GradientsHook Node::pop_retains_grad_hook(uint32_t output_nr) {
  auto it = retains_grad_hooks_.find(output_nr);
  if (it == retains_grad_hooks_.end()) return nullptr;
  GradientsHook hook = std::move(it->second);
  retains_grad_hooks_.erase(it);
  return hook;
}

std::vector<GradientsHook> Node::retains_grad_hooks() const {
  std::vector<GradientsHook> out;
  for (const auto& entry : retains_grad_hooks_) out.push_back(entry.second);
  return out;
}

}  // namespace fsdp::autograd
