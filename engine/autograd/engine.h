// The backward executor (torch::autograd::Engine) and the user-facing entry points
// torch.autograd.backward / torch.autograd.grad.
//
// Execution follows engine.cpp exactly where it decides order (see docs/autograd.md):
//  * dependencies = number of edges into each node from nodes reachable from the root;
//  * a per-thread ready queue, std::priority_queue with PyTorch's CompareNodeTaskTime:
//    deeper reentrant graph task first, then the highest sequence number (AccumulateGrad =
//    UINT64_MAX), ties left to libstdc++'s binary heap;
//  * after a node runs, its children are handed their gradient in edge order, and each one
//    whose count reaches 0 is pushed at once;
//  * around one node: tensor pre-hooks, retains-grad hooks, node pre-hooks, apply,
//    validate_outputs, node post-hooks; then release_variables unless retain_graph;
//  * when the last task finishes, final callbacks run FIFO (callbacks may queue more).
// Everything runs on the thread that called backward (the rank's thread); a backward started
// from inside a node or hook is a reentrant graph task at depth + 1 on the same queue.
//
// Ownership: a GraphTask lives for one execute() call; the ready queue and the current graph
// task are thread-local. Graph task ids come from a process-wide atomic counter.
// Thread-safety: independent per thread; one graph must not be run by two threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "engine/autograd/node.h"

namespace fsdp::autograd {

// The engine's entry points (static: all state is per thread or per graph task).
class Engine {
 public:
  // Engine::execute. `inputs` are the gradients of the roots. With `outputs` non-empty, only
  // nodes on a path to one of them run; accumulate_grad=true marks them needed (backward
  // inputs=), false captures the gradient flowing into each (autograd.grad), returned in
  // order (undefined where nothing arrived).
  static TensorList execute(const EdgeList& roots, const TensorList& inputs, bool keep_graph,
                            bool create_graph, bool accumulate_grad,
                            const EdgeList& outputs = {});

  // Engine::queue_callback: runs `callback` when the current graph task finishes, after all
  // of its nodes and hooks, in FIFO order. Throws outside a backward.
  static void queue_callback(std::function<void()> callback);
};

// torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph, inputs).
// grad_tensors may be empty or hold undefined entries for single-element tensors (ones).
// retain_graph defaults to create_graph. Several roots run under one GraphRoot node.
void backward(const TensorList& tensors, const TensorList& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
              const TensorList& inputs = {});

// torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, create_graph,
// allow_unused): the gradients of `outputs` with respect to `inputs`, without touching any
// .grad. Leaf tensor hooks still fire; AccumulateGrad nodes do not run.
TensorList grad(const TensorList& outputs, const TensorList& inputs,
                const TensorList& grad_outputs = {}, std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false, bool allow_unused = false);

// torch._C._current_graph_task_id(): the id of the graph task running on this thread, -1
// outside a backward.
int64_t current_graph_task_id();
// True while this thread runs a backward (hooks, nodes and final callbacks included).
bool is_backward_running();
// torch._C._will_engine_execute_node(node): whether the current graph task will run `node`
// (in the graph, and on a path to an input when inputs= / grad() is used). The root itself is
// not "in the graph", as in PyTorch. Throws outside a backward.
bool will_engine_execute_node(const std::shared_ptr<Node>& node);
// The node whose hooks/apply are running on this thread (null outside).
std::shared_ptr<Node> current_node();

}  // namespace fsdp::autograd
