#include "engine/autograd/engine.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <exception>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/autograd/grad_kernels.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"

namespace fsdp::autograd {
namespace {

// The gradients arriving at one node during one graph task, one slot per node input.
// Undefined contributions are ignored, the first defined one is stored as is, later ones are
// summed in arrival order (in place only when nothing else references the stored tensor).
class InputBuffer {
 public:
  explicit InputBuffer(size_t size) : buffer_(size) {}

  void add(size_t pos, Tensor&& var) {
    FSDP_INTERNAL_ASSERT(pos < buffer_.size(), "input buffer slot ", pos, " of ", buffer_.size());
    if (!var.defined()) return;
    Tensor& old = buffer_[pos];
    if (!old.defined()) {
      old = std::move(var);
    } else if (!GradMode::is_enabled() && old.impl_ptr().use_count() == 1 &&
               old.storage().use_count() == 1 && old.impl()->autograd_meta == nullptr &&
               old.dtype() == var.dtype() && old.device() == var.device()) {
      kernels::AddInPlace(old, var);
    } else {
      old = kernels::Add(old, var);
    }
  }
  TensorList take() && { return std::move(buffer_); }

 private:
  TensorList buffer_;
};

struct GraphTask;

// One ready node of a graph task with its gathered gradients (a shutdown task has no node).
struct NodeTask {
  std::weak_ptr<GraphTask> base;
  std::shared_ptr<Node> fn;
  InputBuffer inputs{0};
  bool is_shutdown_task = false;

  int reentrant_depth() const;
};

// GraphTask: the state of one execute() call (torch::autograd::GraphTask).
struct GraphTask {
  struct Capture {
    size_t input_idx;
    size_t output_idx;
  };
  struct ExecInfo {
    bool needed = false;
    std::unique_ptr<std::vector<Capture>> captures;
    bool should_execute() const { return needed || captures != nullptr; }
  };

  GraphTask(bool keep_graph_in, bool grad_mode_in, int depth)
      : keep_graph(keep_graph_in), grad_mode(grad_mode_in), reentrant_depth(depth) {}

  void init_to_execute(Node& graph_root, const EdgeList& outputs, bool accumulate_grad,
                       uint64_t min_topo_nr);
  void set_error(std::exception_ptr error) {
    if (!has_error) {
      has_error = true;
      exception = std::move(error);
    }
    completed = true;
  }

  const bool keep_graph;
  const bool grad_mode;
  const int reentrant_depth;
  const int64_t id = NextId();

  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> nodes_in_graph;
  std::unordered_map<Node*, InputBuffer> not_ready;
  std::unordered_map<Node*, ExecInfo> exec_info;
  TensorList captured_vars;
  std::vector<std::function<void()>> final_callbacks;
  int64_t outstanding_tasks = 0;
  bool has_error = false;
  bool completed = false;
  std::exception_ptr exception;

 private:
  static int64_t NextId() {
    static std::atomic<int64_t> next{0};
    return next.fetch_add(1);
  }
};

int NodeTask::reentrant_depth() const {
  std::shared_ptr<GraphTask> graph_task = base.lock();
  return graph_task ? graph_task->reentrant_depth : INT_MAX;
}

// engine.h's CompareNodeTaskTime, verbatim in behaviour: true when t2 must come out first.
struct CompareNodeTaskTime {
  bool operator()(const NodeTask& t1, const NodeTask& t2) const {
    if (t2.is_shutdown_task) return true;
    if (!t1.fn || t1.is_shutdown_task) return false;
    if (!t2.fn) return true;
    const int d1 = t1.reentrant_depth();
    const int d2 = t2.reentrant_depth();
    if (d1 == d2) return t1.fn->sequence_nr() < t2.fn->sequence_nr();
    return d1 < d2;
  }
};

// The thread's CPU ready queue; reused by every backward on the thread.
class ReadyQueue {
 public:
  void push(NodeTask task) {
    if (std::shared_ptr<GraphTask> graph_task = task.base.lock()) ++graph_task->outstanding_tasks;
    heap_.push(std::move(task));
  }
  NodeTask pop() {
    // Moving out of top() is safe: pop_heap never compares the moved-from element.
    NodeTask task = std::move(const_cast<NodeTask&>(heap_.top()));
    heap_.pop();
    return task;
  }
  bool empty() const { return heap_.empty(); }
  void clear() { heap_ = {}; }

 private:
  std::priority_queue<NodeTask, std::vector<NodeTask>, CompareNodeTaskTime> heap_;
};

// Per-thread engine state: the CPU ready queue, reentrancy bookkeeping, and the graph task
// and node whose hooks/apply are running (read by queue_callback and current_graph_task_id).
struct ThreadState {
  ReadyQueue ready_queue;
  bool worker_active = false;  // inside thread_main (a backward started now is reentrant)
  int total_depth = 0;
  std::shared_ptr<GraphTask> current_graph_task;
  std::shared_ptr<Node> current_node;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

// Installs a graph task (and node) as the thread's current ones for a scope.
class GraphTaskGuard {
 public:
  explicit GraphTaskGuard(std::shared_ptr<GraphTask> graph_task)
      : previous_(std::exchange(State().current_graph_task, std::move(graph_task))) {}
  ~GraphTaskGuard() { State().current_graph_task = std::move(previous_); }
  GraphTaskGuard(const GraphTaskGuard&) = delete;
  GraphTaskGuard& operator=(const GraphTaskGuard&) = delete;

 private:
  std::shared_ptr<GraphTask> previous_;
};

// Installs a node as the thread's current one for a scope.
class NodeGuard {
 public:
  explicit NodeGuard(std::shared_ptr<Node> node)
      : previous_(std::exchange(State().current_node, std::move(node))) {}
  ~NodeGuard() { State().current_node = std::move(previous_); }
  NodeGuard(const NodeGuard&) = delete;
  NodeGuard& operator=(const NodeGuard&) = delete;

 private:
  std::shared_ptr<Node> previous_;
};

// The root of a multi-root backward: returns the root gradients, one per root edge.
class GraphRoot : public Node {
 public:
  GraphRoot(EdgeList functions, TensorList inputs)
      : Node(std::move(functions)), outputs_(std::move(inputs)) {
    for (const Tensor& t : outputs_) add_input_metadata(t);
  }
  std::string name() const override { return "GraphRoot"; }

 protected:
  TensorList apply(TensorList&& /*inputs*/) override { return outputs_; }

 private:
  TensorList outputs_;
};

// Stand-in output node for an input that is not in any graph (never reached).
class Identity : public Node {
 public:
  std::string name() const override { return "Identity"; }

 protected:
  TensorList apply(TensorList&& inputs) override { return std::move(inputs); }
};

void GraphTask::init_to_execute(Node& graph_root, const EdgeList& outputs, bool accumulate_grad,
                                uint64_t min_topo_nr) {
  exec_info[&graph_root].needed = true;
  size_t output_idx = 0;
  for (const Edge& output_edge : outputs) {
    ExecInfo& info = exec_info[output_edge.function.get()];
    if (accumulate_grad) {
      info.needed = true;
    } else {
      if (!info.captures) info.captures = std::make_unique<std::vector<Capture>>();
      info.captures->push_back(Capture{output_edge.input_nr, output_idx++});
    }
  }
  captured_vars.resize(output_idx);

  // Iterative DFS marking every node with a path to an output as needed.
  struct Frame {
    Node* fn;
    size_t next_next_fn = 0;
    Node* get_next_fn() {
      const EdgeList& edges = fn->next_edges();
      while (next_next_fn < edges.size()) {
        Node* next = edges[next_next_fn++].function.get();
        if (next) return next;
      }
      return nullptr;
    }
  };
  auto node_should_execute = [this](Node* fn) {
    auto it = exec_info.find(fn);
    return it != exec_info.end() && it->second.should_execute();
  };
  std::vector<Frame> stack;
  std::unordered_set<Node*> seen;
  stack.push_back(Frame{&graph_root});
  exec_info.emplace(&graph_root, ExecInfo());
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Node* fn = frame.fn;
    Node* child_fn = nullptr;
    while ((child_fn = frame.get_next_fn()) && !seen.emplace(child_fn).second) {
      if (node_should_execute(child_fn)) exec_info[fn].needed = true;
    }
    if (child_fn) {
      if (child_fn->topological_nr() < min_topo_nr) continue;
      stack.push_back(Frame{child_fn});
    } else {
      stack.pop_back();
      if (node_should_execute(fn) && !stack.empty()) exec_info[stack.back().fn].needed = true;
    }
  }
}

void ComputeDependencies(Node* root, GraphTask& task, uint64_t min_topo_nr) {
  std::vector<Node*> queue{root};
  while (!queue.empty()) {
    Node* fn = queue.back();
    queue.pop_back();
    if (fn->topological_nr() < min_topo_nr) continue;
    for (const Edge& edge : fn->next_edges()) {
      if (Node* next = edge.function.get()) {
        task.dependencies[next] += 1;
        if (task.nodes_in_graph.insert(next).second) queue.push_back(next);
      }
    }
  }
}

uint64_t ComputeMinTopologicalNr(const EdgeList& outputs) {
  if (outputs.empty()) return 0;
  uint64_t min_topo_nr = UINT64_MAX;
  for (const Edge& edge : outputs) {
    min_topo_nr = std::min(min_topo_nr, edge.function->topological_nr());
  }
  return min_topo_nr;
}

// validate_outputs: count, shape (broadcast gradients are summed down), dtype (cast),
// device. `prefix` prefixes the messages ("Function XBackward0 returned an ").
void ValidateOutputs(const EdgeList& edges, TensorList& grads, const std::string& prefix) {
  FSDP_CHECK(grads.size() == edges.size(), prefix, "invalid number of gradients - expected ",
             edges.size(), ", but got ", grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Edge& edge = edges[i];
    if (!edge.is_valid()) continue;
    Tensor& grad = grads[i];
    if (!grad.defined()) continue;
    const InputMetadata& metadata = edge.function->input_metadata(edge.input_nr);
    if (!metadata.defined) continue;
    if (!metadata.is_same_shape(grad)) {
      FSDP_CHECK(metadata.is_expandable_to_shape(grad), prefix, "invalid gradient at index ", i,
                 " - got ", ShapeStr(grad.sizes()), " but expected shape compatible with ",
                 ShapeStr(metadata.shape));
      grad = kernels::SumTo(grad, metadata.shape);
    }
    if (grad.dtype() != metadata.dtype) grad = grad.to(metadata.dtype);
    if (grad.device() != metadata.device) {
      FSDP_CHECK(grad.dim() == 0, prefix, "invalid gradient at index ", i,
                 " - expected device ", metadata.device.str(), " but got ", grad.device().str());
      grad = grad.to(metadata.device);
    }
  }
}

TensorList CallTensorPreHooks(Node& fn, TensorList inputs) {
  for (const GradientsHook& hook : fn.tensor_pre_hooks()) inputs = hook(std::move(inputs));
  for (const GradientsHook& hook : fn.retains_grad_hooks()) inputs = hook(std::move(inputs));
  return inputs;
}

TensorList CallPreHooks(Node& fn, TensorList inputs) {
  for (const NodePreHook& hook : fn.pre_hooks()) {
    std::optional<TensorList> result = hook(inputs);
    if (!result) continue;
    FSDP_CHECK(result->size() == inputs.size(), "pre-hook of ", fn.name(), " returned ",
               result->size(), " gradients, expected ", inputs.size());
    inputs = std::move(*result);
  }
  return inputs;
}

TensorList CallPostHooks(Node& fn, TensorList outputs, const TensorList& inputs) {
  for (const NodePostHook& hook : fn.post_hooks()) {
    std::optional<TensorList> result = hook(outputs, inputs);
    if (!result) continue;
    FSDP_CHECK(result->size() == outputs.size(), "hook of ", fn.name(), " returned ",
               result->size(), " gradients, expected ", outputs.size());
    outputs = std::move(*result);
  }
  return outputs;
}

TensorList CallFunction(const GraphTask& graph_task, Node& fn, TensorList inputs_in) {
  TensorList inputs = CallTensorPreHooks(fn, std::move(inputs_in));
  inputs = CallPreHooks(fn, std::move(inputs));
  if (!graph_task.keep_graph) fn.will_release_variables();
  const bool has_post_hooks = fn.has_post_hooks();
  TensorList outputs;
  if (has_post_hooks) {
    // Keeping `inputs` for the post hooks adds one reference (AccumulateGrad accounts for it).
    TensorList inputs_copy = inputs;
    outputs = fn(std::move(inputs_copy));
  } else {
    outputs = fn(std::move(inputs));
  }
  ValidateOutputs(fn.next_edges(), outputs, "Function " + fn.name() + " returned an ");
  if (has_post_hooks) return CallPostHooks(fn, std::move(outputs), inputs);
  return outputs;
}

void EvaluateFunction(const std::shared_ptr<GraphTask>& graph_task,
                      const std::shared_ptr<Node>& func, InputBuffer&& input_buffer) {
  Node& fn = *func;
  TensorList inputs = std::move(input_buffer).take();
  if (!graph_task->exec_info.empty()) {
    auto it = graph_task->exec_info.find(&fn);
    FSDP_INTERNAL_ASSERT(it != graph_task->exec_info.end(), "no exec_info for ", fn.name());
    const GraphTask::ExecInfo& fn_info = it->second;
    {
      TensorList new_inputs = inputs;
      // Tensor pre-hooks always run, once: here when the node itself will not run.
      if (!fn_info.needed) new_inputs = CallTensorPreHooks(fn, std::move(new_inputs));
      if (fn_info.captures) {
        for (const GraphTask::Capture& capture : *fn_info.captures) {
          graph_task->captured_vars[capture.output_idx] = new_inputs[capture.input_idx];
        }
      }
    }
    if (!fn_info.needed) return;
  }

  TensorList outputs = CallFunction(*graph_task, fn, std::move(inputs));
  if (!graph_task->keep_graph) fn.release_variables();
  if (outputs.empty()) return;

  ReadyQueue& queue = State().ready_queue;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Edge& next = fn.next_edge(i);
    if (!next.is_valid()) continue;
    Node* next_fn = next.function.get();
    bool is_ready = false;
    auto dep = graph_task->dependencies.find(next_fn);
    if (dep == graph_task->dependencies.end()) {
      FSDP_THROW(ErrorCode::kInternal, "dependency not found for ", next_fn->name());
    } else if (--dep->second == 0) {
      graph_task->dependencies.erase(dep);
      is_ready = true;
    }
    auto not_ready_it = graph_task->not_ready.find(next_fn);
    if (not_ready_it == graph_task->not_ready.end()) {
      if (!graph_task->exec_info.empty()) {
        auto info = graph_task->exec_info.find(next_fn);
        if (info == graph_task->exec_info.end() || !info->second.should_execute()) continue;
      }
      InputBuffer buffer(next_fn->num_inputs());
      buffer.add(next.input_nr, std::move(outputs[i]));
      if (is_ready) {
        queue.push(NodeTask{graph_task, next.function, std::move(buffer)});
      } else {
        graph_task->not_ready.emplace(next_fn, std::move(buffer));
      }
    } else {
      not_ready_it->second.add(next.input_nr, std::move(outputs[i]));
      if (is_ready) {
        queue.push(NodeTask{graph_task, next.function, std::move(not_ready_it->second)});
        graph_task->not_ready.erase(not_ready_it);
      }
    }
  }
}

void ExecPostProcessing(const std::shared_ptr<GraphTask>& graph_task) {
  FSDP_CHECK_CODE(ErrorCode::kInternal, graph_task->not_ready.empty(),
                  "could not compute gradients for some functions");
  GraphTaskGuard guard(graph_task);
  // By index: a callback may queue more, which run in this same pass.
  for (size_t i = 0; i < graph_task->final_callbacks.size(); ++i) {
    std::function<void()> callback = graph_task->final_callbacks[i];
    callback();
  }
}

void MarkAsCompletedAndRunPostProcessing(const std::shared_ptr<GraphTask>& graph_task) {
  if (graph_task->completed) return;
  try {
    ExecPostProcessing(graph_task);
    graph_task->completed = true;
  } catch (...) {
    graph_task->set_error(std::current_exception());
  }
}

// thread_main(graph_task): runs tasks from the thread's queue until `graph_task` completes.
void ThreadMain(const std::shared_ptr<GraphTask>& graph_task) {
  ThreadState& state = State();
  while (!graph_task->completed) {
    FSDP_CHECK_CODE(ErrorCode::kInternal, !state.ready_queue.empty(),
                    "autograd engine: the ready queue is empty but graph task ", graph_task->id,
                    " has ", graph_task->outstanding_tasks, " outstanding tasks");
    NodeTask task = state.ready_queue.pop();
    std::shared_ptr<GraphTask> local_graph_task = task.base.lock();
    if (!local_graph_task) continue;  // its graph task is gone: drop the task
    if (task.fn && !local_graph_task->has_error) {
      AutoGradMode grad_mode(local_graph_task->grad_mode);
      GraphTaskGuard guard(local_graph_task);
      NodeGuard node_guard(task.fn);
      try {
        EvaluateFunction(local_graph_task, task.fn, std::move(task.inputs));
      } catch (...) {
        local_graph_task->set_error(std::current_exception());
      }
    }
    task = NodeTask{};
    --local_graph_task->outstanding_tasks;
    if (local_graph_task->outstanding_tasks == 0) {
      MarkAsCompletedAndRunPostProcessing(local_graph_task);
    }
  }
}

void ExecuteWithGraphTask(const std::shared_ptr<GraphTask>& graph_task,
                          std::shared_ptr<Node> graph_root, InputBuffer&& input_buffer) {
  ThreadState& state = State();
  state.ready_queue.push(NodeTask{graph_task, std::move(graph_root), std::move(input_buffer)});
  if (!state.worker_active) {
    state.worker_active = true;
    ThreadMain(graph_task);
    state.worker_active = false;
    // Tasks of a failed graph task may remain; nothing else can be queued at depth 0.
    if (graph_task->has_error) state.ready_queue.clear();
  } else {
    ++state.total_depth;
    ThreadMain(graph_task);
    --state.total_depth;
  }
}

TensorList MakeGrads(const TensorList& outputs, const TensorList& grads) {
  FSDP_CHECK(grads.empty() || grads.size() == outputs.size(), "got ", grads.size(),
             " gradients for ", outputs.size(), " tensors");
  TensorList result;
  result.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    FSDP_CHECK(out.defined(), "element ", i, " of tensors is an undefined tensor");
    const Tensor grad = grads.empty() ? Tensor() : grads[i];
    if (grad.defined()) {
      FSDP_CHECK(grad.sizes() == out.sizes(), "Mismatch in shape: grad_output[", i,
                 "] has a shape of torch.Size(", ShapeStr(grad.sizes()), ") and output[", i,
                 "] has a shape of torch.Size(", ShapeStr(out.sizes()), ").");
      result.push_back(grad);
    } else if (out.requires_grad()) {
      FSDP_CHECK(out.numel() == 1, "grad can be implicitly created only for scalar outputs");
      result.push_back(kernels::OnesLike(out));
    } else {
      result.push_back(Tensor());
    }
  }
  return result;
}

TensorList RunBackward(const TensorList& tensors, const TensorList& grads, bool keep_graph,
                       bool create_graph, const TensorList& inputs, bool allow_unreachable,
                       bool accumulate_grad) {
  EdgeList roots;
  roots.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    Edge edge = gradient_edge(tensors[i]);
    FSDP_CHECK(edge.is_valid(), "element ", i,
               " of tensors does not require grad and does not have a grad_fn");
    roots.push_back(std::move(edge));
  }
  EdgeList output_edges;
  for (const Tensor& input : inputs) {
    FSDP_CHECK(input.defined(), "an undefined tensor was passed as an input to differentiate");
    FSDP_CHECK(input.requires_grad(), "One of the differentiated Tensors does not require grad");
    std::shared_ptr<Node> grad_fn = input.grad_fn();
    if (!grad_fn) grad_fn = try_get_grad_accumulator(input);
    if (accumulate_grad) retain_grad(input);
    if (!grad_fn) {
      output_edges.emplace_back(std::make_shared<Identity>(), 0);
    } else {
      output_edges.emplace_back(grad_fn, input.output_nr());
    }
  }
  TensorList outputs =
      Engine::execute(roots, grads, keep_graph, create_graph, accumulate_grad, output_edges);
  if (!accumulate_grad) {
    for (const Tensor& out : outputs) {
      FSDP_CHECK(allow_unreachable || out.defined(),
                 "One of the differentiated Tensors appears to not have been used in the graph. "
                 "Set allow_unused=True if this is the desired behavior.");
    }
  }
  return outputs;
}

}  // namespace

TensorList Engine::execute(const EdgeList& roots, const TensorList& inputs, bool keep_graph,
                           bool create_graph, bool accumulate_grad, const EdgeList& outputs) {
  FSDP_CHECK(!roots.empty(), "autograd: backward needs at least one root");
  TensorList root_grads = inputs;
  ValidateOutputs(roots, root_grads, "");
  ThreadState& state = State();
  auto graph_task = std::make_shared<GraphTask>(keep_graph, create_graph,
                                                state.worker_active ? state.total_depth + 1 : 0);
  const bool skip_dummy_node = roots.size() == 1;
  std::shared_ptr<Node> graph_root =
      skip_dummy_node ? roots[0].function : std::make_shared<GraphRoot>(roots, root_grads);
  const uint64_t min_topo_nr = ComputeMinTopologicalNr(outputs);
  ComputeDependencies(graph_root.get(), *graph_task, min_topo_nr);
  if (!outputs.empty()) {
    graph_task->init_to_execute(*graph_root, outputs, accumulate_grad, min_topo_nr);
  }
  if (skip_dummy_node) {
    InputBuffer input_buffer(roots[0].function->num_inputs());
    input_buffer.add(roots[0].input_nr, Tensor(root_grads[0]));
    root_grads.clear();
    ExecuteWithGraphTask(graph_task, std::move(graph_root), std::move(input_buffer));
  } else {
    root_grads.clear();
    ExecuteWithGraphTask(graph_task, std::move(graph_root), InputBuffer(0));
  }
  if (graph_task->exception) std::rethrow_exception(graph_task->exception);
  return std::move(graph_task->captured_vars);
}

void Engine::queue_callback(std::function<void()> callback) {
  const std::shared_ptr<GraphTask>& graph_task = State().current_graph_task;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, graph_task != nullptr,
                  "Final callbacks can only be installed during backward pass.");
  graph_task->final_callbacks.push_back(std::move(callback));
}

void backward(const TensorList& tensors, const TensorList& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph, const TensorList& inputs) {
  FSDP_CHECK(!tensors.empty(), "backward: no tensors to differentiate");
  TensorList grads = MakeGrads(tensors, grad_tensors);
  RunBackward(tensors, grads, retain_graph.value_or(create_graph), create_graph, inputs,
              /*allow_unreachable=*/true, /*accumulate_grad=*/true);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                std::optional<bool> retain_graph, bool create_graph, bool allow_unused) {
  FSDP_CHECK(!outputs.empty(), "grad requires at least one output");
  FSDP_CHECK(!inputs.empty(), "grad requires at least one input");
  TensorList grads = MakeGrads(outputs, grad_outputs);
  return RunBackward(outputs, grads, retain_graph.value_or(create_graph), create_graph, inputs,
                     allow_unused, /*accumulate_grad=*/false);
}

int64_t current_graph_task_id() {
  const std::shared_ptr<GraphTask>& graph_task = State().current_graph_task;
  return graph_task ? graph_task->id : -1;
}

bool is_backward_running() { return State().current_graph_task != nullptr; }

bool will_engine_execute_node(const std::shared_ptr<Node>& node) {
  const std::shared_ptr<GraphTask>& graph_task = State().current_graph_task;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, graph_task != nullptr,
                  "_will_engine_execute_node should only be called during the backward pass");
  FSDP_CHECK(node != nullptr, "_will_engine_execute_node expects a grad_fn");
  Node* raw = node.get();
  bool ret = graph_task->nodes_in_graph.count(raw) > 0;
  if (ret && !graph_task->exec_info.empty()) {
    auto it = graph_task->exec_info.find(raw);
    if (it == graph_task->exec_info.end() || !it->second.should_execute()) {
      ret = false;
    } else {
      FSDP_CHECK(!(raw->topological_nr() == 0 && it->second.captures),
                 "A leaf node was passed to _will_engine_execute_node but we are currently "
                 "running autograd.grad(). This is currently not supported.");
    }
  }
  return ret;
}

std::shared_ptr<Node> current_node() { return State().current_node; }

}  // namespace fsdp::autograd
