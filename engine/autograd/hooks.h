// Hook plumbing shared by tensors and nodes: an ordered, removable list of callables
// (the OrderedDict of torch.utils.hooks) and the RemovableHandle returned by every
// register_* function.
//
// Ownership: a HookList is owned through a shared_ptr by whatever carries the hooks (a Node,
// a tensor's AutogradMeta); handles keep only a weak reference, so removing a hook after its
// owner died is a no-op.
// Thread-safety: none; hooks of a rank's graph are registered and run on the rank's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace fsdp::autograd {

// Removes the hook(s) it was returned for. Copies share one state: remove() through any copy
// removes once; further calls do nothing. A default-constructed handle removes nothing.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  explicit RemovableHandle(std::function<void()> remover);
  // A handle that removes every handle in `handles` (the tuple handle of
  // register_multi_grad_hook).
  explicit RemovableHandle(std::vector<RemovableHandle> handles);

  void remove();
  // False once remove() ran (or for a default-constructed handle).
  bool active() const;

 private:
  struct State {
    std::function<void()> remover;
    bool removed = false;
  };
  std::shared_ptr<State> state_;
};

// Callables in registration order, each with a stable id for removal. prepend=true puts a
// hook first (nn.Module's prepend argument).
template <typename Fn>
class HookList {
 public:
  uint64_t add(Fn fn, bool prepend = false) {
    const uint64_t id = next_id_++;
    if (prepend) {
      hooks_.insert(hooks_.begin(), {id, std::move(fn)});
    } else {
      hooks_.emplace_back(id, std::move(fn));
    }
    return id;
  }
  void remove(uint64_t id) {
    for (auto it = hooks_.begin(); it != hooks_.end(); ++it) {
      if (it->first == id) {
        hooks_.erase(it);
        return;
      }
    }
  }
  // A copy, so that hooks may add or remove hooks while the list is being run.
  std::vector<Fn> snapshot() const {
    std::vector<Fn> out;
    out.reserve(hooks_.size());
    for (const auto& entry : hooks_) out.push_back(entry.second);
    return out;
  }
  bool empty() const { return hooks_.empty(); }
  size_t size() const { return hooks_.size(); }

 private:
  std::vector<std::pair<uint64_t, Fn>> hooks_;
  uint64_t next_id_ = 0;
};

// Adds `fn` to `*list` and returns a handle that removes it while the list is alive.
template <typename Fn>
RemovableHandle AddRemovableHook(const std::shared_ptr<HookList<Fn>>& list, Fn fn,
                                 bool prepend = false) {
  const uint64_t id = list->add(std::move(fn), prepend);
  std::weak_ptr<HookList<Fn>> weak = list;
  return RemovableHandle([weak, id] {
    if (auto locked = weak.lock()) locked->remove(id);
  });
}

}  // namespace fsdp::autograd
