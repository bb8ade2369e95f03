#include "engine/autograd/graph.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "engine/autograd/engine.h"
#include "engine/autograd/variable.h"

namespace fsdp::autograd {
namespace {

// The node the engine runs for `tensor`'s gradient: its grad_fn, or (leaf) its live
// AccumulateGrad.
struct TensorRef {
  std::weak_ptr<TensorImpl> tensor;
  std::weak_ptr<Node> grad_fn;  // set for non-leaves
  bool is_leaf = false;

  std::shared_ptr<Node> node() const {
    if (!is_leaf) return grad_fn.lock();
    std::shared_ptr<TensorImpl> impl = tensor.lock();
    return impl ? try_get_grad_accumulator(Tensor(impl)) : nullptr;
  }
};

// Shared state of one mode="all" registration: per graph task id, the calls seen and the
// gradients gathered so far.
struct AllModeState {
  std::vector<TensorRef> refs;
  MultiGradFn fn;
  std::map<int64_t, size_t> count;
  std::map<int64_t, TensorList> buffer;
  std::optional<size_t> nb_calls;
};

}  // namespace

RemovableHandle register_multi_grad_hook(const TensorList& tensors, MultiGradFn fn) {
  FSDP_CHECK(fn != nullptr, "register_multi_grad_hook: fn must be set");
  auto state = std::make_shared<AllModeState>();
  state->fn = std::move(fn);
  for (const Tensor& t : tensors) {
    FSDP_CHECK(t.defined(), "register_multi_grad_hook: undefined tensor");
    TensorRef ref;
    ref.tensor = t.impl_ptr();
    ref.is_leaf = t.is_leaf();
    if (!ref.is_leaf) ref.grad_fn = t.grad_fn();
    state->refs.push_back(std::move(ref));
  }
  std::vector<RemovableHandle> handles;
  const size_t len_tensors = tensors.size();
  for (size_t idx = 0; idx < tensors.size(); ++idx) {
    handles.push_back(register_hook(tensors[idx], [state, idx, len_tensors](const Tensor& grad) {
      const int64_t id = current_graph_task_id();
      FSDP_CHECK_CODE(ErrorCode::kInternal, id != -1,
                      "expected this hook to be called inside a backward call");
      TensorList& buffer =
          state->buffer.try_emplace(id, TensorList(len_tensors)).first->second;
      const size_t curr_count = state->count[id]++;
      if (curr_count == 0) {
        size_t calls = 0;
        for (const TensorRef& ref : state->refs) {
          std::shared_ptr<Node> node = ref.node();
          if (node && will_engine_execute_node(node)) ++calls;
        }
        state->nb_calls = calls;
      }
      buffer[idx] = grad;
      if (state->nb_calls && curr_count + 1 == *state->nb_calls) {
        TensorList grads = std::move(buffer);
        state->count.erase(id);
        state->buffer.erase(id);
        state->fn(grads);
      }
    }));
  }
  return RemovableHandle(std::move(handles));
}

RemovableHandle register_multi_grad_hook_any(const TensorList& tensors, AnyGradFn fn) {
  FSDP_CHECK(fn != nullptr, "register_multi_grad_hook: fn must be set");
  struct AnyModeState {
    AnyGradFn fn;
    std::set<int64_t> ran_hook;
  };
  auto state = std::make_shared<AnyModeState>();
  state->fn = std::move(fn);
  std::vector<RemovableHandle> handles;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !t.requires_grad()) continue;
    handles.push_back(register_hook(t, [state](const Tensor& grad) {
      const int64_t id = current_graph_task_id();
      FSDP_CHECK_CODE(ErrorCode::kInternal, id != -1,
                      "expected this hook to be called inside a backward call");
      if (!state->ran_hook.insert(id).second) return;
      state->fn(grad);
    }));
  }
  return RemovableHandle(std::move(handles));
}

RemovableHandle register_multi_grad_hook(const TensorList& tensors, MultiGradFn fn,
                                         const std::string& mode) {
  if (mode == "all") return register_multi_grad_hook(tensors, std::move(fn));
  FSDP_CHECK(mode == "any", "Expects mode to be one of ('all', 'any') but got ", mode);
  return register_multi_grad_hook_any(
      tensors, [fn = std::move(fn)](const Tensor& grad) { fn(TensorList{grad}); });
}

}  // namespace fsdp::autograd
