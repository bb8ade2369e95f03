#include "engine/fsdp1/state_dict_utils.h"

#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/nn/checkpoint.h"

namespace fsdp::fsdp1 {
namespace {

FullyShardedDataParallel& StateOf(nn::Module& module) {
  FullyShardedDataParallel* state = AsFsdp(module);
  FSDP_INTERNAL_ASSERT(state != nullptr, "FSDP1 state-dict hook on a ", module.type_name(),
                       " that is not a FullyShardedDataParallel");
  return *state;
}

// The type and config the hooks use: NO_SHARD (`_replace_with_full_state_dict_type`) always
// uses FULL_STATE_DICT with the default config.
StateDictSettings EffectiveSettings(const FullyShardedDataParallel& state) {
  if (state.sharding_strategy == ShardingStrategy::kNoShard) return StateDictSettings{};
  return StateDictSettings{state.state_dict_type, state.state_dict_config};
}

// `_set_use_dtensor`: an instance built with a device mesh saves and loads SHARDED pieces as
// DTensors (ShardedStateDictConfig::use_dtensor) and refuses LOCAL_STATE_DICT.
void SetUseDtensor(FullyShardedDataParallel& state) {
  if (!state.device_mesh || state.sharding_strategy == ShardingStrategy::kNoShard) return;
  FSDP_CHECK(state.state_dict_type != StateDictType::kLocalStateDict,
             "Found state_dict_type LOCAL_STATE_DICT. DeviceMesh is not compatible with "
             "LOCAL_STATE_DICT. Please set state_dict_type to SHARDED_STATE_DICT to get DTensor "
             "state_dict. (", DescribeInstance(state), ")");
  if (auto* config = std::get_if<ShardedStateDictConfig>(&state.state_dict_config)) {
    config->use_dtensor = true;
  }
}

// State dicts of a module whose flat parameter holds tensor-parallel pieces
// (dtensor_extensions.h) are not implemented: FULL would save TP-local pieces under the full
// parameters' names, SHARDED would need 2-D (dp, tp) pieces.
void CheckNoTensorParallelParams(const FullyShardedDataParallel& state) {
  if (!state.handle) return;
  const FlatParamHandle& handle = *state.handle;
  for (size_t i = 0; i < handle.param_extensions().size(); ++i) {
    const auto& extension = handle.param_extensions()[i];
    FSDP_CHECK(!extension, "state_dict / load_state_dict of FSDP over a tensor-parallel module is "
               "not implemented: parameter '", handle.fqns()[i], "' is ", extension->str(), " (",
               DescribeInstance(state), ")");
  }
}

// The clean FQNs (relative to the instance) of the parameters its handle manages: each
// flattened parameter, then each shared registration.
std::vector<std::string> ManagedParamNames(const FlatParamHandle& handle) {
  std::vector<std::string> names;
  for (const std::string& fqn : handle.fqns()) names.push_back(CleanTensorName(fqn));
  for (const SharedParamInfo& info : handle.shared_param_infos()) {
    names.push_back(CleanTensorName(
        info.module_name.empty() ? info.param_name : info.module_name + "." + info.param_name));
  }
  return names;
}

Tensor ToCpu(const Tensor& tensor) {
  return tensor.device().is_cpu() ? tensor : tensor.to(Device::CPU());
}

// `_enter_unshard_params_ctx` / `_exit_unshard_params_ctx`.
void EnterUnshardParamsCtx(nn::Module& module, FullyShardedDataParallel& state,
                           SummonFullParamsOptions options) {
  options.recurse = false;
  state.unshard_params_ctx = std::make_shared<SummonFullParams>(module.shared(), options);
}
void ExitUnshardParamsCtx(FullyShardedDataParallel& state) { state.unshard_params_ctx.reset(); }

// `_common_pre_state_dict_hook` + `_common_unshard_pre_state_dict_hook`.
void PreStateDictHook(nn::Module& module, const std::string& /*prefix*/, bool /*keep_vars*/) {
  autograd::NoGradGuard no_grad;
  FullyShardedDataParallel& state = StateOf(module);
  SetUseDtensor(state);
  CheckNoTensorParallelParams(state);
  LazyInit(state);
  const StateDictSettings settings = EffectiveSettings(state);
  switch (settings.state_dict_type) {
    case StateDictType::kLocalStateDict:
      FSDP_CHECK(!state.use_orig_params || !state.handle,
                 "LOCAL_STATE_DICT is not supported with use_orig_params=True (",
                 DescribeInstance(state), ")");
      return;
    case StateDictType::kFullStateDict: {
      if (!state.handle) return;
      const auto& config = std::get<FullStateDictConfig>(settings.state_dict_config);
      EnterUnshardParamsCtx(module, state,
                            {.writeback = false,
                             .rank0_only = config.rank0_only,
                             .offload_to_cpu = config.offload_to_cpu});
      return;
    }
    case StateDictType::kShardedStateDict:
      // offload_to_cpu applies to the pieces, after chunking.
      if (state.handle) EnterUnshardParamsCtx(module, state, {.writeback = false});
      return;
  }
}

// `_create_chunk_sharded_tensor`: this rank's torch.chunk dim-0 piece of `full` (cloned).
void PutChunk(nn::StateDict& sd, const std::string& key, const Tensor full,
              const FullyShardedDataParallel& state, bool offload_to_cpu) {
  const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(full.sizes(), state.rank, state.world_size);
  Tensor piece = full.narrow(0, info.row_begin, info.rows).clone();
  if (offload_to_cpu) piece = ToCpu(piece);
  sd.insert(key, piece);
  nn::ShardedEntry entry{full.sizes(), std::vector<int64_t>(full.dim(), 0)};
  entry.offsets[0] = info.row_begin;
  sd.sharded.insert(key, std::move(entry));
}

// `_common_unshard_post_state_dict_hook` with FULL's or SHARDED's param_hook.
void UnshardPostStateDictHook(FullyShardedDataParallel& state, nn::StateDict& sd,
                              const std::string& prefix, const StateDictSettings& settings) {
  if (!state.handle) return;
  const bool sharded = settings.state_dict_type == StateDictType::kShardedStateDict;
  bool offload_to_cpu = false;
  bool rank0_only = false;
  if (sharded) {
    offload_to_cpu = std::get<ShardedStateDictConfig>(settings.state_dict_config).offload_to_cpu;
  } else {
    const auto& config = std::get<FullStateDictConfig>(settings.state_dict_config);
    offload_to_cpu = config.offload_to_cpu;
    rank0_only = config.rank0_only;
  }
  // Ranks other than 0 with rank0_only took part in the all-gather only.
  const bool no_fsdp_return = rank0_only && state.rank != 0;
  if (no_fsdp_return && !state.use_orig_params) {
    for (const auto& [clean_key, dtype] : state.buffer_name_to_orig_dtype) sd.erase(prefix + clean_key);
    sd.erase(prefix + kFlatParam);
    ExitUnshardParamsCtx(state);
    return;
  }
  for (const std::string& name : ManagedParamNames(*state.handle)) {
    const std::string fqn = prefix + name;
    if (no_fsdp_return) {
      sd.erase(fqn);
      continue;
    }
    const Tensor* value = sd.find(fqn);
    FSDP_INTERNAL_ASSERT(value != nullptr, "FSDP assumes ", fqn,
                         " is in the state_dict but the state_dict only has ",
                         sd.size(), " keys (", DescribeInstance(state), ")");
    if (sharded) {
      PutChunk(sd, fqn, *value, state, offload_to_cpu);
    } else {
      sd.insert(fqn, value->clone());  // survives the reshard below
    }
  }
  ExitUnshardParamsCtx(state);

  const bool buffer_mixed_precision = state.mixed_precision.buffer_dtype.has_value();
  for (const auto& [clean_key, orig_dtype] : state.buffer_name_to_orig_dtype) {
    const std::string fqn = prefix + clean_key;
    const Tensor* buffer = sd.find(fqn);
    if (buffer == nullptr) continue;  // non-persistent
    if (no_fsdp_return) {
      sd.erase(fqn);
      continue;
    }
    Tensor value = offload_to_cpu ? ToCpu(*buffer) : *buffer;
    // Buffers are saved in their original dtype (ignored buffers were never cast).
    if (buffer_mixed_precision && !state.ignored_buffer_names.count(clean_key)) {
      value = value.to(orig_dtype).clone();
    }
    sd.insert(fqn, value);
  }
}

// `_local_post_state_dict_hook`: the unpadded local flat shard as a piece of the unpadded
// flat parameter.
void LocalPostStateDictHook(FullyShardedDataParallel& state, nn::StateDict& sd,
                            const std::string& prefix, const LocalStateDictConfig& config) {
  if (!state.handle) return;
  const FlatParamHandle& handle = *state.handle;
  const int64_t valid = handle.sharded_numel() - handle.shard_numel_padded();
  Tensor local = handle.local_shard().detach().narrow(0, 0, valid);
  if (config.offload_to_cpu) local = ToCpu(local);
  const std::string key = prefix + kFlatParam;
  sd.insert(key, local);
  sd.sharded.insert(key, nn::ShardedEntry{{handle.unpadded_unsharded_numel()},
                                          {handle.sharded_numel() * state.rank}});
}

void PostStateDictHook(nn::Module& module, nn::StateDict& sd, const std::string& prefix) {
  autograd::NoGradGuard no_grad;
  FullyShardedDataParallel& state = StateOf(module);
  nn::ReplaceByPrefix(sd, prefix + kFsdpPrefix, prefix);
  const StateDictSettings settings = EffectiveSettings(state);
  if (settings.state_dict_type == StateDictType::kLocalStateDict) {
    LocalPostStateDictHook(state, sd, prefix,
                           std::get<LocalStateDictConfig>(settings.state_dict_config));
  } else {
    UnshardPostStateDictHook(state, sd, prefix, settings);
  }
}

// `_sharded_pre_load_state_dict_hook`: every managed parameter's piece is all-gathered over
// the instance's group into the full parameter (c10d all_gather_into_tensor of the pieces
// zero-padded to the chunk), which replaces the piece.
void GatherShardedParams(FullyShardedDataParallel& state, nn::StateDict& sd,
                         const std::string& prefix) {
  const FlatParamHandle& handle = *state.handle;
  const std::vector<std::string> names = ManagedParamNames(handle);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string fqn = prefix + kFsdpPrefix + names[i];
    const Tensor* piece = sd.find(fqn);
    if (piece == nullptr) continue;  // reported as missing by the normal loading
    const nn::ShardedEntry* entry = sd.sharding(fqn);
    const std::string clean = CleanTensorName(fqn);
    FSDP_CHECK(entry != nullptr, "SHARDED_STATE_DICT load expects a sharded tensor for '",
               clean, "' but got a full tensor of shape ", ShapeStr(piece->sizes()), " (",
               DescribeInstance(state), ")");
    const Shape& global = entry->global_shape;
    FSDP_CHECK(!global.empty(), "SHARDED_STATE_DICT load: '", clean, "' has a scalar global shape");
    const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(global, state.rank, state.world_size);
    FSDP_CHECK(piece->sizes() == info.sharded_shape,
               "SHARDED_STATE_DICT load: the piece of '", clean, "' on rank ", state.rank,
               " has shape ", ShapeStr(piece->sizes()), " but a world of ",
               state.world_size, " expects ", ShapeStr(info.sharded_shape),
               " for the global shape ", ShapeStr(global));
    const int64_t chunk = info.padded_shard_numel();
    Tensor local = Tensor::zeros({chunk}, piece->dtype(), state.compute_device);
    if (info.sharded_numel() > 0) {
      local.narrow(0, 0, info.sharded_numel()).copy_(piece->flatten().to(state.compute_device));
    }
    Tensor gathered = Tensor::empty({chunk * state.world_size}, piece->dtype(), state.compute_device);
    state.process_group->all_gather_into_tensor(gathered, local)->wait();
    int64_t numel = 1;
    for (int64_t d : global) numel *= d;
    sd.insert(fqn, gathered.narrow(0, 0, numel).reshape(global));
    sd.sharded.erase(fqn);
  }
}

// `_local_pre_load_state_dict_hook`: the piece zero-padded back to the local shard.
void PadLocalFlatParam(FullyShardedDataParallel& state, nn::StateDict& sd,
                       const std::string& prefix) {
  const FlatParamHandle& handle = *state.handle;
  const std::string fqn = prefix + kFsdpPrefix + kFlatParam;
  const Tensor* piece = sd.find(fqn);
  if (piece == nullptr) return;  // reported as missing by the normal loading
  const std::string clean = CleanTensorName(fqn);
  if (const nn::ShardedEntry* entry = sd.sharding(fqn)) {
    FSDP_CHECK(entry->global_shape == Shape{handle.unpadded_unsharded_numel()},
               "LOCAL_STATE_DICT load: '", clean, "' is a piece of a flat parameter of shape ",
               ShapeStr(entry->global_shape), " but ", DescribeInstance(state),
               " has ", handle.unpadded_unsharded_numel(), " elements");
  }
  const int64_t valid = handle.sharded_numel() - handle.shard_numel_padded();
  FSDP_CHECK(piece->dim() == 1 && piece->numel() == valid, "LOCAL_STATE_DICT load: '", clean,
             "' on rank ", state.rank, " has shape ", ShapeStr(piece->sizes()),
             " but the local shard holds ", valid, " elements (", handle.sharded_numel(),
             " with ", handle.shard_numel_padded(), " padding) at a world size of ",
             state.world_size);
  Tensor padded = Tensor::zeros({handle.sharded_numel()}, piece->dtype(), piece->device());
  if (valid > 0) padded.narrow(0, 0, valid).copy_(*piece);
  sd.insert(fqn, padded);
  sd.sharded.erase(fqn);
}

void PreLoadStateDictHook(nn::Module& module, nn::StateDict& sd, const std::string& prefix,
                          nn::LoadStateDictState& /*load_state*/) {
  autograd::NoGradGuard no_grad;
  FullyShardedDataParallel& state = StateOf(module);
  SetUseDtensor(state);
  CheckNoTensorParallelParams(state);
  LazyInit(state);
  nn::ReplaceByPrefix(sd, prefix, prefix + kFsdpPrefix);
  if (!state.handle) return;
  switch (EffectiveSettings(state).state_dict_type) {
    case StateDictType::kLocalStateDict:
      FSDP_CHECK(!state.use_orig_params,
                 "LOCAL_STATE_DICT is not supported with use_orig_params=True (",
                 DescribeInstance(state), ")");
      PadLocalFlatParam(state, sd, prefix);
      return;
    case StateDictType::kShardedStateDict:
      GatherShardedParams(state, sd, prefix);
      [[fallthrough]];
    case StateDictType::kFullStateDict:
      EnterUnshardParamsCtx(module, state, {.writeback = true});
      return;
  }
}

void PostLoadStateDictHook(nn::Module& module, nn::IncompatibleKeys& keys) {
  FullyShardedDataParallel& state = StateOf(module);
  {
    autograd::NoGradGuard no_grad;
    ExitUnshardParamsCtx(state);  // writes this rank's part back into the shard
  }
  for (std::string& key : keys.missing_keys) key = CleanTensorName(key);
  for (std::string& key : keys.unexpected_keys) key = CleanTensorName(key);
}

}  // namespace

void RegisterAllStateDictHooks(FullyShardedDataParallel& state) {
  state.register_state_dict_pre_hook(PreStateDictHook);
  state.register_state_dict_post_hook(PostStateDictHook);
  state.register_load_state_dict_pre_hook(PreLoadStateDictHook);
  state.register_load_state_dict_post_hook(PostLoadStateDictHook);
}

}  // namespace fsdp::fsdp1
