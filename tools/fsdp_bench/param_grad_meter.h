// ParamGradMeter: the parameter + gradient bytes one rank holds at every point of an FSDP
// training step, read from the FSDP state (not from the allocator, whose totals also hold
// activations, optimizer state and communication buffers), and the closed-form bound they must
// stay under (fsdp-bench, docs/benchmarks.md "What is measured").
//
// A sample sums, over every FsdpParam of the module tree's parameter groups, the bytes of the
// distinct Storages (each storage once, so views never double count) of:
//   * sharded parameters: the padded sharded buffers (sharded_param_data);
//   * sharded gradients: the storages behind the sharded parameters' .grad (FSDP views the
//     new gradient shards out of one reduce-scatter output per group, so this is the padded
//     group shard);
//   * unsharded parameters: the per-parameter all-gather outputs (padded, W·c·rest elements),
//     which FSDP frees with Storage::Resize(0), so a resharded parameter counts 0;
//   * unsharded gradients: every storage seen as an unsharded parameter's .grad that is still
//     alive. FSDP's post_backward detaches the gradients from the unsharded parameters before
//     it reshards and hands them to foreach_reduce, which holds them until the reduce-scatter
//     copy-in is done; they are still memory, so they are tracked by weak reference from the
//     moment a hook saw them until they die.
// Communication buffers that the comm context keeps (the forward all-gather output kept for
// the implicit prefetch, the last reduce-scatter input) are reported separately
// (`comm_buffers`, not in total()); a pending prefetch all-gather output is private to its
// group and not seen at all.
//
// Sample points: every FSDP event (the meter is an fsdp2::Observer: unshard, reshard,
// pre_backward, post_backward at their documented points), every post-accumulate-grad hook of
// the unsharded parameters (after autograd accumulated each gradient) and of the sharded
// parameters (after foreach_reduce set each gradient shard), and whatever the caller samples
// explicitly (after forward, after backward, ...). Install() needs the unsharded parameters to
// exist, i.e. one unshard (one training step) must have run before.
//
// Ownership: borrows the module tree (it must outlive the meter); owns its hook handles and
// removes them in Uninstall() / the destructor. The caller installs it as an observer
// (fsdp2::ScopedObserver). Thread-safety: one rank's meter, used on that rank's thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/core/storage.h"
#include "engine/core/tensor.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fsdp_param_group.h"
#include "engine/fsdp/fsdp_state.h"
#include "engine/fsdp/training_state.h"
#include "engine/nn/module.h"
#include "tools/fsdp_bench/sampling_observer.h"

namespace fsdp::bench {

// One sample's bytes by kind, and where it was taken.
struct ParamGradBytes {
  int64_t sharded_params = 0;
  int64_t sharded_grads = 0;
  int64_t unsharded_params = 0;
  int64_t unsharded_grads = 0;
  int64_t comm_buffers = 0;  // kept communication buffers; not part of total()
  std::string where;         // e.g. "reshard layers.3 POST_BACKWARD", "after forward"

  int64_t total() const {
    return sharded_params + sharded_grads + unsharded_params + unsharded_grads;
  }
};

// The parameter groups of `root`'s module tree (modules() order: the root's group first).
inline std::vector<fsdp2::FsdpParamGroup*> FsdpGroupsOf(const nn::ModulePtr& root) {
  std::vector<fsdp2::FsdpParamGroup*> groups;
  for (const nn::ModulePtr& m : root->modules()) {
    const fsdp2::FsdpState* state = fsdp2::GetFsdpState(*m);
    if (state != nullptr && state->param_group() != nullptr) {
      groups.push_back(state->param_group().get());
    }
  }
  return groups;
}

// The closed-form bound of one rank at world W, from the groups' parameter shapes only:
//   sharded_bytes = Σ_params 2 · c · rest · elem          (padded parameter + gradient shards)
//   U_g           = Σ_{params of g} (W · c · rest + d0 · rest) · elem
//                                      (padded all-gather output + unpadded gradient)
//   bound         = sharded_bytes + the two largest U_g
// with d0 the leading dim, rest the product of the others, c = ceil(d0 / W), elem the
// parameter dtype's size (no mixed precision).
struct ParamGradBound {
  int64_t sharded_bytes = 0;
  std::vector<int64_t> group_unsharded_bytes;  // U_g, in group order
  int64_t bound = 0;
};

inline ParamGradBound ClosedFormBound(const std::vector<fsdp2::FsdpParamGroup*>& groups,
                                      int world) {
  FSDP_CHECK(world >= 1, "ClosedFormBound: world must be >= 1, got ", world);
  ParamGradBound b;
  for (const fsdp2::FsdpParamGroup* g : groups) {
    int64_t unsharded = 0;
    for (const auto& p : g->fsdp_params()) {
      const Shape& shape = p->global_shape();
      FSDP_CHECK(!shape.empty(), "ClosedFormBound: parameter ", p->fqn(), " is 0-dim");
      const int64_t d0 = shape[0];
      const int64_t rest = d0 == 0 ? 0 : Numel(shape) / d0;
      const int64_t c = (d0 + world - 1) / world;
      const auto elem = static_cast<int64_t>(p->sharded_param().element_size());
      b.sharded_bytes += 2 * c * rest * elem;
      unsharded += (world * c * rest + d0 * rest) * elem;
    }
    b.group_unsharded_bytes.push_back(unsharded);
  }
  std::vector<int64_t> sorted = b.group_unsharded_bytes;
  std::sort(sorted.rbegin(), sorted.rend());
  b.bound = b.sharded_bytes;
  for (size_t i = 0; i < sorted.size() && i < 2; ++i) b.bound += sorted[i];
  return b;
}

class ParamGradMeter : public SamplingObserver {
 public:
  explicit ParamGradMeter(const nn::ModulePtr& root) : groups_(FsdpGroupsOf(root)) {
    FSDP_CHECK(!groups_.empty(), "ParamGradMeter: fully_shard was not applied to the model");
  }
  ~ParamGradMeter() override { Uninstall(); }
  ParamGradMeter(const ParamGradMeter&) = delete;
  ParamGradMeter& operator=(const ParamGradMeter&) = delete;

  const std::vector<fsdp2::FsdpParamGroup*>& groups() const { return groups_; }

  // Registers the post-accumulate-grad hooks (unsharded and sharded parameters). Throws
  // FailedPrecondition when a parameter has no unsharded parameter yet (run a step first).
  void Install() {
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, handles_.empty(),
                    "ParamGradMeter::Install: already installed");
    for (fsdp2::FsdpParamGroup* g : groups_) {
      for (const auto& p : g->fsdp_params()) {
        FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, p->has_unsharded_param(),
                        "ParamGradMeter::Install: ", p->fqn(),
                        " has no unsharded parameter yet; run one training step first");
        const std::string fqn = p->fqn();
        if (p->unsharded_param().requires_grad()) {
          handles_.push_back(autograd::register_post_accumulate_grad_hook(
              p->unsharded_param(), [this, fqn](const Tensor& leaf) {
                const Tensor grad = leaf.grad();
                if (grad.defined()) seen_unsharded_grads_.push_back(grad.storage());
                Sample("grad accumulated " + fqn);
              }));
        }
        if (p->sharded_param().requires_grad()) {
          handles_.push_back(autograd::register_post_accumulate_grad_hook(
              p->sharded_param(),
              [this, fqn](const Tensor&) { Sample("sharded grad set " + fqn); }));
        }
      }
    }
  }

  void Uninstall() {
    for (autograd::RemovableHandle& h : handles_) h.remove();
    handles_.clear();
  }

  // Takes one sample labelled `where` and keeps it when it is the largest total so far.
  void Sample(const std::string& where) override {
    ParamGradBytes s = Measure();
    s.where = where;
    ++num_samples_;
    if (num_samples_ == 1 || s.total() > peak_.total()) peak_ = s;
    if (s.comm_buffers > peak_comm_buffers_) peak_comm_buffers_ = s.comm_buffers;
  }

  // The sample with the largest total() (where = "" before the first sample).
  const ParamGradBytes& peak() const { return peak_; }
  // The largest comm_buffers of any sample.
  int64_t peak_comm_buffers() const { return peak_comm_buffers_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  ParamGradBytes Measure() {
    ParamGradBytes s;
    std::unordered_set<const Storage*> counted;
    // Adds the storage behind `t` once; returns its bytes (0 when already counted/undefined).
    auto take = [&](const Tensor& t) -> int64_t {
      if (!t.defined()) return 0;
      const Storage* storage = t.storage().get();
      if (storage == nullptr || !counted.insert(storage).second) return 0;
      return static_cast<int64_t>(storage->nbytes());
    };
    for (fsdp2::FsdpParamGroup* g : groups_) {
      for (const auto& p : g->fsdp_params()) {
        s.sharded_params += take(p->sharded_param_data());
        for (const Tensor& out : p->all_gather_outputs()) s.unsharded_params += take(out);
      }
    }
    for (fsdp2::FsdpParamGroup* g : groups_) {
      for (const auto& p : g->fsdp_params()) {
        s.sharded_grads += take(p->sharded_param().grad());
        s.unsharded_grads += take(p->unsharded_grad());
        s.unsharded_grads += take(p->unsharded_accumulated_grad());
      }
    }
    // Detached unsharded gradients that are still alive; forget the dead ones.
    std::vector<std::weak_ptr<Storage>> alive;
    for (const std::weak_ptr<Storage>& weak : seen_unsharded_grads_) {
      std::shared_ptr<Storage> storage = weak.lock();
      if (storage == nullptr) continue;
      alive.push_back(weak);
      if (counted.insert(storage.get()).second) {
        s.unsharded_grads += static_cast<int64_t>(storage->nbytes());
      }
    }
    seen_unsharded_grads_ = std::move(alive);
    const std::shared_ptr<fsdp2::CommContext>& comm = groups_.front()->comm_ctx();
    if (comm != nullptr) {
      if (comm->all_gather_state && comm->all_gather_state->all_gather_result) {
        s.comm_buffers += take(comm->all_gather_state->all_gather_result->all_gather_output);
      }
      if (comm->reduce_scatter_state) {
        s.comm_buffers += take(comm->reduce_scatter_state->reduce_scatter_input);
      }
    }
    return s;
  }

  std::vector<fsdp2::FsdpParamGroup*> groups_;
  std::vector<autograd::RemovableHandle> handles_;
  std::vector<std::weak_ptr<Storage>> seen_unsharded_grads_;
  ParamGradBytes peak_;
  int64_t peak_comm_buffers_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace fsdp::bench
