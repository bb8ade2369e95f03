#include "reference/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

namespace fsdp::reference {
namespace {

void CheckWorld(int world_size) {
  if (world_size <= 0) throw std::invalid_argument("world_size must be positive");
}

// Rows of dim 0 of the set members; throws when they disagree or there are none.
template <typename T>
int64_t BatchRows(const ModelInput<T>& in) {
  std::optional<int64_t> rows;
  auto take = [&rows](const Shape& shape, const char* what) {
    if (shape.empty()) throw std::invalid_argument(std::string("RankSlice: 0-d ") + what);
    if (rows && *rows != shape[0]) {
      throw std::invalid_argument(std::string("RankSlice: ") + what + " has " +
                                  std::to_string(shape[0]) + " rows, other inputs " +
                                  std::to_string(*rows));
    }
    rows = shape[0];
  };
  if (in.features) take(in.features->shape, "features");
  if (in.tokens) take(in.tokens->shape, "tokens");
  if (in.decoder_tokens) take(in.decoder_tokens->shape, "decoder_tokens");
  if (in.targets) take(in.targets->shape, "targets");
  if (!rows) throw std::invalid_argument("RankSlice: the input has no members");
  return *rows;
}

}  // namespace

template <typename T>
ModelInput<T> RankSlice(const ModelInput<T>& global, int rank, int world_size) {
  CheckWorld(world_size);
  if (rank < 0 || rank >= world_size) throw std::invalid_argument("RankSlice: bad rank");
  const int64_t rows = BatchRows(global);
  if (rows % world_size != 0) {
    throw std::invalid_argument("RankSlice: global batch of " + std::to_string(rows) +
                                " rows does not split over " + std::to_string(world_size) +
                                " ranks");
  }
  const int64_t b = rows / world_size;
  const int64_t begin = rank * b, end = (rank + 1) * b;
  ModelInput<T> out;
  if (global.features) out.features = SliceRows(*global.features, begin, end);
  if (global.tokens) out.tokens = SliceRows(*global.tokens, begin, end);
  if (global.decoder_tokens) out.decoder_tokens = SliceRows(*global.decoder_tokens, begin, end);
  if (global.targets) out.targets = SliceRows(*global.targets, begin, end);
  return out;
}

template <typename T>
std::vector<ModelInput<T>> SplitBatch(const ModelInput<T>& global, int world_size) {
  CheckWorld(world_size);
  std::vector<ModelInput<T>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(RankSlice(global, r, world_size));
  return out;
}

template <typename T>
std::vector<ModelInput<T>> ReplicateInput(const ModelInput<T>& input, int world_size) {
  CheckWorld(world_size);
  return std::vector<ModelInput<T>>(static_cast<size_t>(world_size), input);
}

template <typename T>
TensorMap<T> AverageGradients(const std::vector<TensorMap<T>>& per_rank) {
  if (per_rank.empty()) throw std::invalid_argument("AverageGradients: no ranks");
  TensorMap<T> sum;
  for (const TensorMap<T>& g : per_rank) AccumulateGrads(&sum, g);
  const T w = T(per_rank.size());
  for (auto& [name, g] : sum) {
    for (T& v : g.data) v /= w;
  }
  return sum;
}

namespace {

// A zero tensor of `like`'s shape.
template <typename T>
BasicRefTensor<T> ZerosLike(const BasicRefTensor<T>& like) {
  BasicRefTensor<T> out = like;
  std::fill(out.data.begin(), out.data.end(), T(0));
  return out;
}

// clip_grad_norm_ over every tensor of `grads` (GradClip); returns the total norm.
template <typename T>
double ClipGradNorm(TensorMap<T>* grads, const GradClip& clip) {
  const bool inf = std::isinf(clip.norm_type);
  double acc = 0;
  for (const auto& [name, g] : *grads) {
    for (T v : g.data) {
      const double a = std::fabs(static_cast<double>(v));
      acc = inf ? std::max(acc, a) : acc + std::pow(a, clip.norm_type);
    }
  }
  const double total = inf ? acc : std::pow(acc, 1.0 / clip.norm_type);
  const double coef = std::min(clip.max_norm / (total + 1e-6), 1.0);
  for (auto& [name, g] : *grads) {
    for (T& v : g.data) v = static_cast<T>(v * coef);
  }
  return total;
}

// The state Fsdp1FlatParam describes, for one flat parameter.
template <typename T>
struct FlatParamState {
  TensorMap<T> cpu_grad;                     // `_cpu_grad`
  std::optional<TensorMap<T>> kept_unsharded;  // the unsharded values kept since a forward
  bool grad_attached = false;  // the optimizer's `.grad` of the members is the buffer
};

}  // namespace

template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(const Model<T>& model, TensorMap<T> params,
                                                   const TensorMap<T>& buffers,
                                                   const std::vector<TrainingStep<T>>& steps,
                                                   Optimizer<T>* optimizer, StepLr<T>* scheduler,
                                                   const std::vector<Fsdp1FlatParam>& flat_params) {
  std::vector<StepRecord<T>> records;
  if (steps.empty()) return records;
  const size_t world = steps[0].rank_inputs.size();
  if (world == 0) throw std::invalid_argument("RunDataParallelTraining: no ranks");
  std::vector<FlatParamState<T>> flat_states(flat_params.size());
  for (size_t g = 0; g < flat_params.size(); ++g) {
    for (const std::string& name : flat_params[g].params) {
      auto it = params.find(name);
      if (it == params.end()) {
        throw std::invalid_argument("RunDataParallelTraining: FSDP1 flat parameter " +
                                    std::to_string(g) + " names unknown parameter '" + name + "'");
      }
      flat_states[g].cpu_grad[name] = ZerosLike(it->second);
    }
  }
  // What forward (`in_summon` false) or summon_full_params sees: `params`, but kept unsharded
  // values where kept and seen.
  auto visible = [&](bool in_summon) {
    TensorMap<T> out = params;
    for (size_t g = 0; g < flat_params.size(); ++g) {
      const FlatParamState<T>& st = flat_states[g];
      if (!st.kept_unsharded || (in_summon && flat_params[g].full_precision_summon)) continue;
      for (const auto& [name, value] : *st.kept_unsharded) out[name] = value;
    }
    return out;
  };
  std::vector<TensorMap<T>> rank_buffers(world, buffers);
  TensorMap<T> grads;  // the replicated `.grad`, persistent until zero_grad
  for (size_t s = 0; s < steps.size(); ++s) {
    const TrainingStep<T>& step = steps[s];
    if (step.rank_inputs.size() != world) {
      throw std::invalid_argument("RunDataParallelTraining: step " + std::to_string(s) + " has " +
                                  std::to_string(step.rank_inputs.size()) + " ranks, step 0 has " +
                                  std::to_string(world));
    }
    if (!flat_params.empty() && !step.optimizer_step) {
      throw std::invalid_argument("RunDataParallelTraining: step " + std::to_string(s) +
                                  " does not step the optimizer; FSDP1 flat parameters "
                                  "need every step to");
    }
    StepRecord<T> rec;
    const TensorMap<T> forward_params = flat_params.empty() ? TensorMap<T>() : visible(false);
    for (size_t r = 0; r < world; ++r) {
      LossAndGrads<T> lg = ForwardBackward(model, flat_params.empty() ? params : forward_params,
                                           rank_buffers[r], step.rank_inputs[r], step.loss);
      rec.rank_losses.push_back(lg.loss);
      for (const std::string& name : step.frozen) lg.grads.erase(name);
      rec.rank_grads.push_back(std::move(lg.grads));
      rank_buffers[r] = std::move(lg.buffers);
    }
    const TensorMap<T> synced = AverageGradients(rec.rank_grads);
    AccumulateGrads(&grads, synced);
    for (size_t g = 0; g < flat_params.size(); ++g) {
      FlatParamState<T>& st = flat_states[g];
      bool got_grad = false;
      for (const std::string& name : flat_params[g].params) got_grad = got_grad || synced.count(name);
      if (got_grad) {
        for (auto& [name, buffer] : st.cpu_grad) {
          auto it = synced.find(name);
          buffer = it != synced.end() ? it->second : ZerosLike(buffer);
        }
        st.kept_unsharded.reset();  // the post-backward frees it
      } else if (flat_params[g].keeps_unsharded_after_forward && !st.kept_unsharded) {
        TensorMap<T> kept;
        for (const std::string& name : flat_params[g].params) kept[name] = forward_params.at(name);
        st.kept_unsharded = std::move(kept);
      }
      if (!flat_params[g].offload_params) continue;
      // prepare_gradient_for_optim: `.grad` is the CPU buffer (or views into it).
      if (got_grad || flat_params[g].grad_every_backward) st.grad_attached = true;
      for (const auto& [name, buffer] : st.cpu_grad) {
        if (st.grad_attached) {
          grads[name] = buffer;
        } else {
          grads.erase(name);
        }
      }
    }
    if (step.clip) {
      rec.grad_norm = ClipGradNorm(&grads, *step.clip);
      // Under CPU offload `.grad` is the CPU buffer itself: clipping scales it in place.
      for (FlatParamState<T>& st : flat_states) {
        for (auto& [name, buffer] : st.cpu_grad) {
          if (st.grad_attached && grads.count(name)) buffer = grads.at(name);
        }
      }
    }
    rec.grads = grads;
    if (step.optimizer_step) {
      if (optimizer == nullptr)
        throw std::invalid_argument("RunDataParallelTraining: no optimizer");
      rec.lr = optimizer->lr();
      optimizer->Step(&params, grads);
      if (scheduler != nullptr) scheduler->Step();
    }
    if (step.zero_grad) {
      ZeroGrad(&grads, step.set_to_none);
      // `.grad` is the CPU buffer itself: zero_() zeroes it, set_to_none leaves it.
      for (FlatParamState<T>& st : flat_states) {
        if (step.set_to_none) {
          st.grad_attached = false;
        } else if (st.grad_attached) {
          ZeroGrad(&st.cpu_grad, false);
        }
      }
    }
    rec.params = flat_params.empty() ? params : visible(true);
    rec.rank_buffers = rank_buffers;
    records.push_back(std::move(rec));
  }
  return records;
}

template <typename T>
std::vector<StepRecord<T>> RunDataParallelTraining(
    const Model<T>& model, const TensorMap<T>& params, const TensorMap<T>& buffers,
    const ModelInput<T>& global_batch, int world_size, int num_steps, const LossSpec& loss,
    Optimizer<T>* optimizer, StepLr<T>* scheduler) {
  TrainingStep<T> step;
  step.rank_inputs = SplitBatch(global_batch, world_size);
  step.loss = loss;
  return RunDataParallelTraining(model, params, buffers,
                                 std::vector<TrainingStep<T>>(static_cast<size_t>(num_steps), step),
                                 optimizer, scheduler);
}

#define FSDP_REFERENCE_INSTANTIATE(T)                                                            \
  template ModelInput<T> RankSlice<T>(const ModelInput<T>&, int, int);                           \
  template std::vector<ModelInput<T>> SplitBatch<T>(const ModelInput<T>&, int);                  \
  template std::vector<ModelInput<T>> ReplicateInput<T>(const ModelInput<T>&, int);              \
  template TensorMap<T> AverageGradients<T>(const std::vector<TensorMap<T>>&);                   \
  template std::vector<StepRecord<T>> RunDataParallelTraining<T>(                                \
      const Model<T>&, TensorMap<T>, const TensorMap<T>&, const std::vector<TrainingStep<T>>&,   \
      Optimizer<T>*, StepLr<T>*, const std::vector<Fsdp1FlatParam>&);                            \
  template std::vector<StepRecord<T>> RunDataParallelTraining<T>(                                \
      const Model<T>&, const TensorMap<T>&, const TensorMap<T>&, const ModelInput<T>&, int, int, \
      const LossSpec&, Optimizer<T>*, StepLr<T>*);

FSDP_REFERENCE_INSTANTIATE(float)
FSDP_REFERENCE_INSTANTIATE(double)
#undef FSDP_REFERENCE_INSTANTIATE

}  // namespace fsdp::reference
