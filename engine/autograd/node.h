// Node: a backward function in the autograd graph (torch::autograd::Node), plus Edge, the
// per-input metadata used to materialise zero gradients, and the thread-local sequence
// counter that orders nodes in the engine's ready queue.
//
// A node's inputs are the gradients of its forward op's outputs (one slot per output, in
// output order); its outputs are the gradients of the forward op's inputs, one per next
// edge, in the op's argument order. Hooks around one node run in PyTorch 2.x order (see
// docs/autograd.md): tensor pre-hooks, retains-grad hooks, node pre-hooks, apply, node
// post-hooks.
//
// Ownership: nodes are always held by std::shared_ptr (tensors own their grad_fn, nodes own
// the nodes their edges point to). A node must not hold a strong reference to a tensor it
// produced (that would be a cycle); saved outputs are stored detached (SavedTensor).
// Thread-safety: a graph is built and run by one thread (its rank's); nodes are not
// synchronised.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/core/tensor.h"

namespace fsdp::autograd {

using TensorList = std::vector<Tensor>;

class Node;

// (function, input_nr): which input slot of which node a gradient flows into. An edge with
// no function is invalid: the corresponding forward input needs no gradient, but the slot is
// kept so that output i of a node always lines up with next_edge(i).
struct Edge {
  Edge() = default;
  Edge(std::shared_ptr<Node> function_in, uint32_t input_nr_in)
      : function(std::move(function_in)), input_nr(input_nr_in) {}
  bool is_valid() const { return function != nullptr; }

  std::shared_ptr<Node> function;
  uint32_t input_nr = 0;
};
using EdgeList = std::vector<Edge>;

// Shape, dtype and device of one forward output (one node input), used to validate
// gradients and to materialise an undefined gradient as zeros. A default-constructed
// metadata describes an undefined output.
struct InputMetadata {
  InputMetadata() = default;
  explicit InputMetadata(const Tensor& tensor);

  Tensor zeros() const;  // undefined Tensor when !defined
  bool is_same_shape(const Tensor& grad) const { return grad.sizes() == shape; }
  // The gradient has a shape this input broadcasts to (validate_outputs reduces it).
  bool is_expandable_to_shape(const Tensor& grad) const;

  bool defined = false;
  Shape shape;
  DType dtype = DType::kFloat32;
  Device device;
};

// The calling thread's node counter (at::sequence_number): a plain uint64 per thread,
// starting at 0, post-incremented by every node constructed with the default constructor.
namespace sequence_number {
uint64_t peek();
uint64_t get_and_increment();
}  // namespace sequence_number

// A hook on the gradients entering a node (tensor pre-hooks and retains-grad hooks): takes
// the node's input gradients and returns them, possibly replaced.
using GradientsHook = std::function<TensorList(TensorList grads)>;
// Node.register_prehook: (grad_outputs) -> replacement or nullopt.
using NodePreHook = std::function<std::optional<TensorList>(const TensorList& grad_outputs)>;
// Node.register_hook: (grad_inputs, grad_outputs) -> replacement grad_inputs or nullopt.
using NodePostHook = std::function<std::optional<TensorList>(const TensorList& grad_inputs,
                                                             const TensorList& grad_outputs)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  // Takes the next number of the calling thread's sequence counter.
  explicit Node(EdgeList next_edges = {});
  // Uses `sequence_nr` and leaves the counter alone (AccumulateGrad passes UINT64_MAX).
  Node(uint64_t sequence_nr, EdgeList next_edges);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Runs the node (no hooks: the engine calls those around it).
  TensorList operator()(TensorList&& inputs) { return apply(std::move(inputs)); }

  // E.g. "AddmmBackward0", "AccumulateGrad", "GraphRoot".
  virtual std::string name() const { return "Node"; }

  uint64_t sequence_nr() const { return sequence_nr_; }
  void set_sequence_nr(uint64_t sequence_nr) { sequence_nr_ = sequence_nr; }
  // 0 for AccumulateGrad (and nodes without edges), else 1 + max over the children. Used
  // only to prune the search for `inputs=`; never affects the order.
  uint64_t topological_nr() const { return topological_nr_; }

  // ---- Edges (node outputs) ----
  const Edge& next_edge(size_t index) const { return next_edges_.at(index); }
  const EdgeList& next_edges() const { return next_edges_; }
  size_t num_outputs() const { return next_edges_.size(); }
  void add_next_edge(Edge edge);
  void set_next_edges(EdgeList edges);

  // ---- Input metadata (node inputs = forward outputs) ----
  // Appends a slot for `tensor` (undefined allowed) and returns its input_nr.
  uint32_t add_input_metadata(const Tensor& tensor);
  uint32_t add_input_metadata(const InputMetadata& metadata);
  size_t num_inputs() const { return input_metadata_.size(); }
  const InputMetadata& input_metadata(size_t index) const { return input_metadata_.at(index); }

  // ---- Hooks ----
  // Node.register_prehook(fn): fn(grad_outputs) returning void, TensorList or
  // std::optional<TensorList> (a value replaces the gradients). Runs only if the node runs,
  // after tensor hooks and retains-grad hooks.
  template <typename F>
  RemovableHandle register_prehook(F&& fn);
  // Node.register_hook(fn): fn(grad_inputs, grad_outputs) returning void, TensorList or
  // std::optional<TensorList> (a value replaces grad_inputs, the node's outputs).
  template <typename F>
  RemovableHandle register_hook(F&& fn);
  RemovableHandle add_pre_hook(NodePreHook hook, bool prepend = false);
  RemovableHandle add_post_hook(NodePostHook hook, bool prepend = false);

  // Tensor pre-hooks: one entry per tensor with hooks (added on that tensor's first
  // register_hook). AccumulateGrad overrides tensor_pre_hooks() to read its leaf's hooks.
  void add_tensor_pre_hook(GradientsHook hook) { tensor_pre_hooks_.push_back(std::move(hook)); }
  virtual std::vector<GradientsHook> tensor_pre_hooks() const { return tensor_pre_hooks_; }
  // Retains-grad hooks, keyed by output index (run after every tensor pre-hook).
  void add_retains_grad_hook(GradientsHook hook, uint32_t output_nr);
  GradientsHook pop_retains_grad_hook(uint32_t output_nr);
  std::vector<GradientsHook> retains_grad_hooks() const;
  std::vector<NodePreHook> pre_hooks() const { return pre_hooks_->snapshot(); }
  std::vector<NodePostHook> post_hooks() const { return post_hooks_->snapshot(); }
  bool has_post_hooks() const { return !post_hooks_->empty(); }

  // ---- Saved state ----
  // Called before apply when the graph is not retained.
  virtual void will_release_variables() {}
  // Frees saved state after apply when the graph is not retained; a later apply that needs
  // it throws the "backward through the graph a second time" error.
  virtual void release_variables() {}

 protected:
  virtual TensorList apply(TensorList&& inputs) = 0;

 private:
  void update_topological_nr(const Edge& edge);

  uint64_t sequence_nr_;
  uint64_t topological_nr_ = 0;
  EdgeList next_edges_;
  std::vector<InputMetadata> input_metadata_;
  std::vector<GradientsHook> tensor_pre_hooks_;
  std::map<uint32_t, GradientsHook> retains_grad_hooks_;
  std::shared_ptr<HookList<NodePreHook>> pre_hooks_ = std::make_shared<HookList<NodePreHook>>();
  std::shared_ptr<HookList<NodePostHook>> post_hooks_ =
      std::make_shared<HookList<NodePostHook>>();
};

template <typename F>
RemovableHandle Node::register_prehook(F&& fn) {
  using R = std::invoke_result_t<F&, const TensorList&>;
  if constexpr (std::is_void_v<R>) {
    return add_pre_hook([fn = std::forward<F>(fn)](const TensorList& grads) mutable
                        -> std::optional<TensorList> {
      fn(grads);
      return std::nullopt;
    });
  } else {
    return add_pre_hook([fn = std::forward<F>(fn)](const TensorList& grads) mutable
                        -> std::optional<TensorList> { return fn(grads); });
  }
}

template <typename F>
RemovableHandle Node::register_hook(F&& fn) {
  using R = std::invoke_result_t<F&, const TensorList&, const TensorList&>;
  if constexpr (std::is_void_v<R>) {
    return add_post_hook([fn = std::forward<F>(fn)](const TensorList& in, const TensorList& out)
                             mutable -> std::optional<TensorList> {
      fn(in, out);
      return std::nullopt;
    });
  } else {
    return add_post_hook([fn = std::forward<F>(fn)](const TensorList& in, const TensorList& out)
                             mutable -> std::optional<TensorList> { return fn(in, out); });
  }
}

}  // namespace fsdp::autograd
