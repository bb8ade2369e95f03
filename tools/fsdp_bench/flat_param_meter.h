// FlatParamMeter: FSDP1's counterpart of ParamGradMeter (param_grad_meter.h) for fsdp-bench's
// FSDP1 rows (docs/benchmarks.md, "Table 4"): the parameter + gradient bytes one rank holds at
// every point of a FullyShardedDataParallel training step, read from the flat parameters
// (FlatParamHandle), and the closed-form bound of each row.
//
// A sample sums, over every FSDP1 instance of the tree with a flat parameter, the bytes of the
// distinct Storages (each once) of:
//   * sharded parameters: the local shard (NO_SHARD: the whole flat parameter);
//   * unsharded parameters: the padded unsharded flat parameter (sharded strategies), which
//     FSDP1 frees with Storage::Resize(0), so a freed one counts 0;
//   * gradients: the flat parameter's .grad and `_saved_grad_shard`, counted as sharded when
//     they have the shard's size (NO_SHARD: always) and as unsharded otherwise (the gradient
//     autograd accumulates before the post-backward reduces it, and the one no_sync() keeps).
// Sample points: every FSDP1 event (unshard, reshard, pre_backward, post_backward: FSDP1
// notifies the fsdp2::Observer interface; a post-backward reshard event comes before the
// reduction, while the unsharded gradient is alive) and the caller's explicit samples.
//
// Ownership: borrows the module tree (it must outlive the meter); the caller installs it as an
// observer (fsdp2::ScopedObserver). Thread-safety: one rank's meter, on that rank's thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/storage.h"
#include "engine/core/tensor.h"
#include "engine/fsdp1/api.h"
#include "engine/fsdp1/flat_param.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"
#include "tools/fsdp_bench/param_grad_meter.h"

namespace fsdp::bench {

// The flat parameters of `root`'s FSDP1 tree (GetFsdpStates order: the root first), with
// whether each belongs to the root instance.
struct MeteredFlatParam {
  const fsdp1::FlatParamHandle* handle = nullptr;
  bool is_root = false;
};

inline std::vector<MeteredFlatParam> FlatParamsOf(const nn::Module& root) {
  std::vector<MeteredFlatParam> out;
  for (const fsdp1::FullyShardedDataParallel* state : fsdp1::GetFsdpStates(root)) {
    if (state->handle != nullptr) out.push_back({state->handle.get(), state == &root});
  }
  return out;
}

// The closed-form bound of one FSDP1 row, from the flat parameters' sizes only. With e the
// element size, s_i = sharded_numel_i · e (the padded shard; NO_SHARD: the whole flat
// parameter), U_i = padded_unsharded_numel_i · e (W · s_i), r the root's flat parameter (none
// when the root manages no parameter):
//   sharded_bytes                  = 2 · Σ s_i                      (parameter + gradient shards)
//   FULL_SHARD, HYBRID_SHARD       = sharded + U_r + the two largest non-root U_i + max U_i
//     (the root keeps its parameters from forward to its post-backward; in backward the
//     current instance and the one BACKWARD_PRE/POST prefetched; one unsharded gradient at a
//     time, reduced and dropped by its post-backward)
//   SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2 = sharded + Σ U_i + max U_i
//     (every instance keeps its unsharded parameters from forward to its post-backward)
//   NO_SHARD                       = sharded
//   inside no_sync() (any strategy) = the strategy's parameter terms + Σ U_i
//     (every instance holds its unsharded accumulated gradient until the synced backward).
struct FlatParamBound {
  int64_t sharded_bytes = 0;
  int64_t bound = 0;
};

inline FlatParamBound Fsdp1ClosedFormBound(const std::vector<MeteredFlatParam>& flat_params,
                                           fsdp1::ShardingStrategy strategy, bool in_no_sync) {
  FSDP_CHECK(!flat_params.empty(), "Fsdp1ClosedFormBound: no flat parameter");
  FlatParamBound b;
  int64_t root_unsharded = 0;
  int64_t sum_unsharded = 0;
  int64_t max_unsharded = 0;
  std::vector<int64_t> non_root;
  const bool sharded = flat_params.front().handle->uses_sharded_strategy();
  for (const MeteredFlatParam& f : flat_params) {
    const auto elem = static_cast<int64_t>(f.handle->flat_param().element_size());
    const int64_t shard = f.handle->sharded_numel() * elem;
    const int64_t unsharded = sharded ? f.handle->padded_unsharded_numel() * elem : 0;
    b.sharded_bytes += 2 * shard;
    sum_unsharded += unsharded;
    max_unsharded = std::max(max_unsharded, unsharded);
    if (f.is_root) {
      root_unsharded = unsharded;
    } else {
      non_root.push_back(unsharded);
    }
  }
  std::sort(non_root.rbegin(), non_root.rend());
  int64_t params = 0;
  if (sharded && fsdp1::ReshardsAfterForward(strategy)) {
    params = root_unsharded;
    for (size_t i = 0; i < non_root.size() && i < 2; ++i) params += non_root[i];
  } else if (sharded) {
    params = sum_unsharded;
  }
  const int64_t grads = in_no_sync ? sum_unsharded : max_unsharded;
  b.bound = b.sharded_bytes + params + grads;
  return b;
}

class FlatParamMeter : public SamplingObserver {
 public:
  explicit FlatParamMeter(const nn::Module& root) : flat_params_(FlatParamsOf(root)) {
    FSDP_CHECK(!flat_params_.empty(), "FlatParamMeter: the model has no FSDP1 flat parameter");
  }

  const std::vector<MeteredFlatParam>& flat_params() const { return flat_params_; }

  // Takes one sample labelled `where` and keeps it when it is the largest total so far.
  void Sample(const std::string& where) override {
    ParamGradBytes s = Measure();
    s.where = where;
    ++num_samples_;
    if (num_samples_ == 1 || s.total() > peak_.total()) peak_ = s;
  }
  const ParamGradBytes& peak() const { return peak_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  ParamGradBytes Measure() const {
    ParamGradBytes s;
    std::unordered_set<const Storage*> seen;
    auto add = [&seen](const Tensor& t, int64_t& into) {
      if (!t.defined() || t.storage() == nullptr) return;
      if (!seen.insert(t.storage().get()).second) return;
      into += static_cast<int64_t>(t.storage()->nbytes());
    };
    for (const MeteredFlatParam& f : flat_params_) {
      const fsdp1::FlatParamHandle& h = *f.handle;
      add(h.local_shard(), s.sharded_params);
      if (h.uses_sharded_strategy()) add(h.padded_unsharded_flat_param(), s.unsharded_params);
      for (const Tensor& g : {h.flat_param().grad(), h.saved_grad_shard}) {
        if (!g.defined()) continue;
        const bool is_shard = !h.uses_sharded_strategy() || g.numel() == h.sharded_numel();
        add(g, is_shard ? s.sharded_grads : s.unsharded_grads);
      }
    }
    return s;
  }

  std::vector<MeteredFlatParam> flat_params_;
  ParamGradBytes peak_;
  int64_t num_samples_ = 0;
};

}  // namespace fsdp::bench
