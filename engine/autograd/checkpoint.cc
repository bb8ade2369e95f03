#include "engine/autograd/checkpoint.h"

#include <any>
#include <atomic>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/rank_context.h"
#include "engine/core/rng.h"

namespace fsdp::autograd {

namespace {

thread_local int recompute_depth = 0;

// Graph-task key for an unpack outside any backward: a fresh id per unpack (PyTorch uses a
// random uuid), never equal to a real graph task id (those are >= 0).
int64_t FreshOutsideBackwardId() {
  static std::atomic<int64_t> next{-2};
  return next.fetch_sub(1);
}

// Shape, dtype and device of a saved tensor, for the determinism check (printed like
// checkpoint.py's metadata dicts).
struct TensorMetadata {
  Shape shape;
  DType dtype;
  Device device;
  bool operator==(const TensorMetadata& o) const {
    return shape == o.shape && dtype == o.dtype && device == o.device;
  }
  std::string str() const {
    std::ostringstream os;
    os << "{'shape': torch.Size(" << ShapeStr(shape) << "), 'dtype': torch." << DTypeName(dtype)
       << ", 'device': device(type='" << (device.is_cpu() ? "cpu" : "cuda") << "'"
       << (device.is_cpu() ? "" : ", index=" + std::to_string(device.index)) << ")}";
    return os.str();
  }
};

TensorMetadata MetadataOf(const Tensor& t) { return {t.sizes(), t.dtype(), t.device()}; }

// What a saved tensor becomes inside a region: per graph task, the recomputed value (set by
// the recomputation hook) or nullopt once it was unpacked.
struct Holder {
  std::map<int64_t, std::optional<Tensor>> handles;
};

// Marks the thread as recomputing for a scope (is_recomputing()).
class RecomputeDepthGuard {
 public:
  RecomputeDepthGuard() { ++recompute_depth; }
  ~RecomputeDepthGuard() { --recompute_depth; }
};

// Restores the generator state of the current rank for a scope (torch.random.fork_rng).
class ForkRng {
 public:
  ForkRng(bool enabled, const Generator& state)
      : enabled_(enabled), generator_(RankContext::Current().generator()), saved_(generator_) {
    if (enabled_) generator_ = state;
  }
  ~ForkRng() {
    if (enabled_) generator_ = saved_;
  }

 private:
  bool enabled_;
  Generator& generator_;
  Generator saved_;
};

[[noreturn]] void ThrowCheckpointError(const std::string& message) {
  FSDP_THROW(ErrorCode::kFailedPrecondition, "torch.utils.checkpoint: ", message);
}

}  // namespace

// _CheckpointFrame: the state one region shares between its forward holders, its unpack hook
// and its recomputes (per graph task: recompute counter, recomputed flag).
struct CheckpointFrame {
  CheckpointRegion::RecomputeFn recompute_fn;
  CheckpointOptions options;
  Generator forward_rng_state;
  std::shared_ptr<CustomFunctionNode> input_saver;
  std::vector<std::weak_ptr<Holder>> weak_holders;
  std::vector<TensorMetadata> x_metadatas;
  std::map<int64_t, size_t> recomp_counter;
  std::map<int64_t, bool> is_recomputed;
  bool forward_completed = false;
  bool ignore_saved_mismatch = false;

  void Recompute(int64_t gid);
  void CheckRecomputedTensorsMatch(int64_t gid);
  Tensor Unpack(const std::shared_ptr<Holder>& holder);
};

void CheckpointFrame::CheckRecomputedTensorsMatch(int64_t gid) {
  if (ignore_saved_mismatch) return;
  if (weak_holders.size() != recomp_counter[gid]) {
    ThrowCheckpointError(
        "A different number of tensors was saved during the original forward and "
        "recomputation.\nNumber of tensors saved during forward: " +
        std::to_string(weak_holders.size()) +
        "\nNumber of tensors saved during recomputation: " + std::to_string(recomp_counter[gid]));
  }
  if (!options.determinism_check) return;
  std::string mismatched;
  for (size_t idx = 0; idx < weak_holders.size(); ++idx) {
    std::shared_ptr<Holder> holder = weak_holders[idx].lock();
    if (!holder) continue;
    auto it = holder->handles.find(gid);
    FSDP_INTERNAL_ASSERT(it != holder->handles.end() && it->second.has_value(),
                         "checkpoint holder ", idx, " was not recomputed");
    const TensorMetadata recomputed = MetadataOf(*it->second);
    if (!(recomputed == x_metadatas[idx])) {
      mismatched += "tensor at position " + std::to_string(idx) + ":\nsaved metadata: " +
                    x_metadatas[idx].str() + "\nrecomputed metadata: " + recomputed.str() + "\n";
    }
  }
  if (!mismatched.empty()) {
    ThrowCheckpointError(
        "Recomputed values for the following tensors have different metadata than during the "
        "forward pass.\n" + mismatched);
  }
}

void CheckpointFrame::Recompute(int64_t gid) {
  FSDP_INTERNAL_ASSERT(input_saver != nullptr);
  const TensorList args = input_saver->ctx()->saved_tensors();
  // The recomputation hook (_recomputation_hook): caches each save in its holder, in order.
  auto pack = [this, gid](const Tensor& tensor) -> std::any {
    const Tensor x = tensor.requires_grad() || tensor.impl()->autograd_meta ? tensor.detach() : tensor;
    const size_t recomp_idx = recomp_counter[gid]++;
    if (recomp_idx >= weak_holders.size()) {
      FSDP_INTERNAL_ASSERT(!options.early_stop);
      if (!forward_completed) {
        ignore_saved_mismatch = true;
        return x;
      }
      ThrowCheckpointError(
          "trying to save more tensors during recomputation than during the original forward "
          "pass.");
    }
    if (std::shared_ptr<Holder> holder = weak_holders[recomp_idx].lock()) {
      auto it = holder->handles.find(gid);
      FSDP_INTERNAL_ASSERT(it == holder->handles.end() || !it->second.has_value());
      holder->handles[gid] = x;
    }
    if (options.early_stop && recomp_counter[gid] == weak_holders.size()) {
      throw StopRecomputationError();
    }
    return x;
  };
  auto unpack = [](const std::any& packed) { return std::any_cast<Tensor>(packed); };
  SavedTensorHooksGuard hooks(pack, unpack);
  EnableGradGuard enable_grad;
  ForkRng fork_rng(options.preserve_rng_state, forward_rng_state);
  RecomputeDepthGuard recomputing;
  try {
    recompute_fn(args);
  } catch (const StopRecomputationError&) {
    // Early stop: every saved tensor was recomputed.
  }
}

Tensor CheckpointFrame::Unpack(const std::shared_ptr<Holder>& holder) {
  int64_t gid = current_graph_task_id();
  if (gid == -1) gid = FreshOutsideBackwardId();
  if (!is_recomputed[gid]) {
    Recompute(gid);
    is_recomputed[gid] = true;
    CheckRecomputedTensorsMatch(gid);
  }
  auto it = holder->handles.find(gid);
  FSDP_INTERNAL_ASSERT(it != holder->handles.end(), "checkpoint holder was not recomputed");
  if (!it->second.has_value()) {
    ThrowCheckpointError(
        "Unpack is being triggered for a tensor that was already unpacked once. If you are "
        "calling ctx.saved_tensors in backward, make sure to do so only once. Otherwise please "
        "open an issue with details on your use case.");
  }
  Tensor result = std::move(*it->second);
  it->second.reset();
  return result;
}

bool is_recomputing() { return recompute_depth > 0; }

CheckpointRegion::CheckpointRegion(RecomputeFn recompute_fn, const TensorList& inputs,
                                   const CheckpointOptions& options)
    : frame_(std::make_shared<CheckpointFrame>()) {
  FSDP_CHECK(recompute_fn != nullptr, "checkpoint: recompute function must be set");
  frame_->recompute_fn = std::move(recompute_fn);
  frame_->options = options;
  if (options.preserve_rng_state) frame_->forward_rng_state = RankContext::Current().generator();

  Tensor dummy = Tensor::empty({0});
  dummy.set_requires_grad(true);
  TensorList saver_inputs{dummy};
  saver_inputs.insert(saver_inputs.end(), inputs.begin(), inputs.end());
  TensorList saver_outputs = ApplyFunction(
      "_NoopSaveInputsBackward", saver_inputs,
      [](FunctionCtx& ctx, const TensorList& in) {
        ctx.save_for_backward(TensorList(in.begin() + 1, in.end()));
        return TensorList{Tensor::empty({0})};
      },
      [](FunctionCtx& /*ctx*/, const TensorList& /*grads*/) { return TensorList(); });
  frame_->input_saver = std::dynamic_pointer_cast<CustomFunctionNode>(saver_outputs[0].grad_fn());
  if (!frame_->input_saver) return;  // grad mode off: nothing to checkpoint

  std::shared_ptr<CheckpointFrame> frame = frame_;
  auto pack = [frame](const Tensor& tensor) -> std::any {
    auto holder = std::make_shared<Holder>();
    frame->weak_holders.push_back(holder);
    frame->x_metadatas.push_back(MetadataOf(tensor));
    return holder;
  };
  auto unpack = [frame](const std::any& packed) {
    return frame->Unpack(std::any_cast<std::shared_ptr<Holder>>(packed));
  };
  hooks_ = push_saved_tensor_hooks(pack, unpack);
}

CheckpointRegion::~CheckpointRegion() {
  if (exited_ || !hooks_) return;
  // Unwinding (an exception in the region's forward): remove the hooks without throwing.
  erase_saved_tensor_hooks(hooks_);
}

void CheckpointRegion::exit() {
  if (exited_) return;
  exited_ = true;
  if (!hooks_) return;
  pop_saved_tensor_hooks(hooks_);
  frame_->forward_completed = true;
}

TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn,
                      const TensorList& inputs, const CheckpointOptions& options) {
  FSDP_CHECK(fn != nullptr, "checkpoint: fn must be set");
  CheckpointRegion region([fn](const TensorList& args) { fn(args); }, inputs, options);
  TensorList outputs = fn(inputs);
  region.exit();
  return outputs;
}

}  // namespace fsdp::autograd
