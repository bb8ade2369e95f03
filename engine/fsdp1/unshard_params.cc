#include "engine/fsdp1/unshard_params.h"

#include "engine/core/error.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"

namespace fsdp::fsdp1 {
namespace {

// `_validate_unshard_params_args`.
void ValidateUnshardParamsArgs(const FullyShardedDataParallel& state,
                               const SummonFullParamsOptions& options) {
  FSDP_CHECK(!options.with_grads || (!options.offload_to_cpu && state.use_orig_params),
             "with_grads=", options.with_grads ? "True" : "False",
             ", use_orig_params=", state.use_orig_params ? "True" : "False",
             ", offload_to_cpu=", options.offload_to_cpu ? "True" : "False",
             " is not supported yet");
  FSDP_CHECK(!options.offload_to_cpu || !state.handle || state.handle->uses_sharded_strategy(),
             "offload_to_cpu=True and NO_SHARD is not supported yet");
  FSDP_CHECK(!(options.writeback && options.rank0_only),
             "writeback=True and rank0_only=True is not supported yet");
}

// `_writeback_to_local_shard`: this rank's unpadded part of the unsharded flat parameter (and
// gradient) back into its shard.
void WritebackToLocalShard(FlatParamHandle& handle, bool writeback_grad) {
  auto get_shard = [&handle](const Tensor& flat) {
    if (!handle.uses_sharded_strategy()) return flat;  // NO_SHARD: the whole tensor
    const FlatParamShard shard =
        ComputeFlatParamShard(flat.numel(), handle.rank(), handle.world_size());
    return flat.narrow(0, shard.begin, shard.numel);
  };
  const Tensor param_shard = get_shard(handle.flat_param().detach());
  handle.local_shard().narrow(0, 0, param_shard.numel()).copy_(param_shard.to(handle.local_shard().dtype()));
  if (!writeback_grad) return;
  Tensor existing_grad = handle.sharded_grad();
  if (!existing_grad.defined()) return;
  const Tensor grad_shard = get_shard(handle.flat_param().grad());
  existing_grad.narrow(0, 0, grad_shard.numel()).copy_(grad_shard);
}

}  // namespace

// One instance's unshard scope (`_unshard_params_for_summon` + `_unshard_fsdp_state_params`).
struct SummonFullParams::Entry {
  FullyShardedDataParallel* state = nullptr;
  FlatParamHandle* handle = nullptr;  // null: nothing to unshard for this instance
  SummonFullParamsOptions options;
  bool free_unsharded_flat_param = false;
  bool resharded_early = false;  // rank0_only on a non-zero rank
  bool to_cpu = false;
  bool unflattened = false;

  Entry(FullyShardedDataParallel& fsdp, const SummonFullParamsOptions& opts)
      : state(&fsdp), options(opts) {
    ValidateUnshardParamsArgs(fsdp, options);
    LazyInit(fsdp);
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                    fsdp.training_state != TrainingState::kForwardBackward,
                    "Cannot manually unshard parameters during forward/backward (",
                    DescribeInstance(fsdp), ")");
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                    fsdp.training_state != TrainingState::kSummonFullParams,
                    "Cannot manually unshard parameters when already unsharding parameters (",
                    DescribeInstance(fsdp), ")");
    FlatParamHandle* h = fsdp.handle.get();
    if (h != nullptr && h->training_state != HandleTrainingState::kSummonFullParams) {
      FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, h->training_state == HandleTrainingState::kIdle,
                      "Expects the handle training to be IDLE but got ",
                      HandleTrainingStateName(h->training_state), " (", DescribeInstance(fsdp), ")");
      handle = h;
      enter_handle();
    }
    fsdp.training_state = TrainingState::kSummonFullParams;
  }

  void enter_handle() {
    handle->training_state = HandleTrainingState::kSummonFullParams;
    handle->reset_flat_param_grad_info_if_needed();
    free_unsharded_flat_param = handle->needs_unshard();
    Unshard(*handle);
    if (options.with_grads) handle->unshard_grad();
    if (options.rank0_only && state->rank != 0) {
      // Only rank 0 (of the instance's group) keeps the full parameters.
      Reshard(*handle, free_unsharded_flat_param);
      if (options.with_grads) handle->reshard_grad();
      resharded_early = true;
      return;
    }
    if (options.offload_to_cpu && handle->uses_sharded_strategy()) {
      handle->to_cpu();
      to_cpu = true;
    }
    if (!state->use_orig_params) {
      // `_unflatten_as_params`: hide the flat parameter, expose the originals as parameters.
      state->module()->remove_parameter(kFlatParam);
      handle->use_unsharded_views(/*as_params=*/true);
      unflattened = true;
    }
  }

  ~Entry() {
    state->training_state = TrainingState::kIdle;
    if (handle == nullptr) return;
    if (!resharded_early) {
      if (unflattened) {
        handle->use_unsharded_views(/*as_params=*/false);
        state->module()->register_parameter(kFlatParam, handle->flat_param(),
                                            handle->flat_param().requires_grad());
      }
      if (to_cpu) handle->from_cpu();
      if (options.writeback) WritebackToLocalShard(*handle, options.with_grads);
      Reshard(*handle, free_unsharded_flat_param);
      if (options.with_grads) handle->reshard_grad();
    }
    handle->training_state = HandleTrainingState::kIdle;
  }
};

SummonFullParams::SummonFullParams(const nn::ModulePtr& module, SummonFullParamsOptions options) {
  FSDP_CHECK(module != nullptr, "summon_full_params: null module");
  std::vector<FullyShardedDataParallel*> states;
  if (!options.recurse) {
    if (FullyShardedDataParallel* state = AsFsdp(*module)) states.push_back(state);
  } else {
    states = GetFsdpStates(*module);
  }
  for (FullyShardedDataParallel* state : states) {
    entries_.push_back(std::make_unique<Entry>(*state, options));
  }
}

SummonFullParams::~SummonFullParams() {
  while (!entries_.empty()) entries_.pop_back();  // reverse order of entering
}

}  // namespace fsdp::fsdp1
