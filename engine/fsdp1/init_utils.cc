#include "engine/fsdp1/init_utils.h"

#include <algorithm>
#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/tensor_data.h"

namespace fsdp::fsdp1 {
namespace {

// The buffers already broadcast by sync_module_states on this rank (PyTorch marks them with
// the FSDP_SYNCED attribute), so that nested wrapping broadcasts each buffer once.
struct SyncedBuffers {
  std::map<const TensorImpl*, std::weak_ptr<TensorImpl>> tensors;
  bool contains(const Tensor& t) const {
    auto it = tensors.find(t.impl());
    return it != tensors.end() && !it->second.expired() && it->second.lock() == t.impl_ptr();
  }
  void add(const Tensor& t) { tensors[t.impl()] = t.impl_ptr(); }
};

// `tensor.data = tensor.to(device)`, identity preserved.
void MoveDataToDevice(const Tensor& tensor, Device device) {
  if (tensor.defined() && tensor.device() != device) SetData(tensor, tensor.to(device));
}

}  // namespace

std::string DescribeWrappedModule(const nn::Module& module) {
  return "FullyShardedDataParallel(" + module.type_name() + ")";
}

void InitIgnoredModuleStates(FsdpState& state, const nn::Module& module,
                             const std::vector<nn::ModulePtr>& ignored_modules) {
  std::set<const nn::Module*> ignored;
  for (const nn::ModulePtr& root : ignored_modules) {
    FSDP_CHECK(root != nullptr, "`ignored_modules` should be an iterable of `torch.nn.Module`s");
    FSDP_CHECK(AsFsdp(*root) == nullptr,
               "`ignored_modules` should not include FSDP modules (got ", root->type_name(),
               " when wrapping ", DescribeWrappedModule(module), ")");
    for (const nn::ModulePtr& child : root->modules()) {
      if (AsFsdp(*child) == nullptr) ignored.insert(child.get());
    }
  }
  std::set<const TensorImpl*> ignored_params;
  std::set<const TensorImpl*> ignored_buffers;
  for (const nn::Module* m : ignored) {
    for (const Tensor& p : m->parameters()) ignored_params.insert(p.impl());
    for (const Tensor& b : m->buffers()) ignored_buffers.insert(b.impl());
  }
  std::set<std::string> ignored_buffer_names;
  for (const auto& [name, buffer] : module.named_buffers()) {
    if (ignored_buffers.count(buffer.impl())) ignored_buffer_names.insert(CleanTensorName(name));
  }
  // Nested instances' ignored states are this instance's too.
  for (const nn::ModulePtr& submodule : module.modules()) {
    if (const FullyShardedDataParallel* nested = AsFsdp(*submodule)) {
      ignored.insert(nested->ignored_modules.begin(), nested->ignored_modules.end());
      ignored_params.insert(nested->ignored_params.begin(), nested->ignored_params.end());
      ignored_buffer_names.insert(nested->ignored_buffer_names.begin(),
                                  nested->ignored_buffer_names.end());
    }
  }
  state.ignored_modules = std::move(ignored);
  state.ignored_params = std::move(ignored_params);
  state.ignored_buffer_names = std::move(ignored_buffer_names);
}

void InitProcessGroupState(FsdpState& state, const FullyShardedDataParallelOptions& options,
                           bool has_auto_wrap_policy, const std::string& who) {
  const ShardingStrategy strategy = options.sharding_strategy;
  const std::string strategy_name = std::string("ShardingStrategy.") + ShardingStrategyName(strategy);
  FSDP_CHECK(!(options.process_group && options.device_mesh),
             "Cannot pass both process_group and device_mesh at the same time. Please just pass "
             "only one of them. (", who, ")");
  if (IsHybridStrategy(strategy)) {
    if (options.device_mesh) {
      FSDP_CHECK(options.device_mesh->ndim() == 2, "Expected device_mesh to have ndim=2 but got ",
                 options.device_mesh->ndim(), " (", who, " with ", strategy_name, ")");
      state.device_mesh = options.device_mesh;
      // The replicate group is the outer dimension, the shard group the inner one.
      state.inter_node_process_group = options.device_mesh->get_group(0);
      state.process_group = options.device_mesh->get_group(1);
    } else if (options.process_group && options.inter_node_process_group) {
      state.process_group = options.process_group;
      state.inter_node_process_group = options.inter_node_process_group;
    } else if (options.process_group) {
      FSDP_THROW(ErrorCode::kInvalidArgument,
                 "Expected process_group to be passed in as either None or "
                 "Tuple[dist.ProcessGroup, dist.ProcessGroup] but got a single ProcessGroup (",
                 who, " with ", strategy_name, ": set inter_node_process_group too)");
    } else if (!has_auto_wrap_policy) {
      FSDP_THROW(ErrorCode::kInvalidArgument, "Manual wrapping with ", strategy_name,
                 " requires explicit specification of process group or device_mesh. (", who,
                 ")");
    } else {
      FSDP_THROW(ErrorCode::kInvalidArgument, who, " with ", strategy_name,
                 " needs the (intra-node, inter-node) process groups or a 2-D device_mesh: "
                 "node boundaries are not inferred from the device count");
    }
    FSDP_CHECK(state.process_group && state.inter_node_process_group, who,
               ": this rank is not in the device_mesh ", options.device_mesh->str());
    FSDP_CHECK(state.process_group->size() > 1, who, " with ", strategy_name,
               " shards over a group of 1 rank, which cannot serve a hybrid strategy (FSDP would "
               "fall back to NO_SHARD within the shard group and never reduce across the ",
               state.inter_node_process_group->size(), " replicas); use NO_SHARD over the "
               "replicate group instead");
  } else {
    FSDP_CHECK(options.inter_node_process_group == nullptr, who, ": inter_node_process_group is "
               "only used by HYBRID_SHARD and _HYBRID_SHARD_ZERO2, not by ", strategy_name);
    if (options.device_mesh) {
      FSDP_CHECK(options.device_mesh->ndim() == 1, who, " with ", strategy_name,
                 " shards over a 1-D device_mesh but got ndim=", options.device_mesh->ndim(),
                 " (", options.device_mesh->str(), "); a 2-D mesh needs HYBRID_SHARD or "
                 "_HYBRID_SHARD_ZERO2");
      state.device_mesh = options.device_mesh;
      state.process_group = options.device_mesh->get_group(0);
      FSDP_CHECK(state.process_group != nullptr, who, ": this rank is not in the device_mesh ",
                 options.device_mesh->str());
    } else {
      state.process_group =
          options.process_group ? options.process_group : distributed::GetDefaultProcessGroup();
    }
  }
  state.rank = state.process_group->rank();
  state.world_size = state.process_group->size();
  int data_parallel_world_size = state.world_size;
  if (IsHybridStrategy(strategy)) data_parallel_world_size *= state.inter_node_process_group->size();
  fsdp2::PrePostSplit(data_parallel_world_size, &state.gradient_predivide_factor,
                      &state.gradient_postdivide_factor);
}

void InitCoreState(FsdpState& state, const FullyShardedDataParallelOptions& options) {
  // A group of one rank has nothing to shard (PyTorch warns "FSDP is switching to use
  // `NO_SHARD` instead of ... since the world size is 1.").
  state.sharding_strategy =
      state.world_size == 1 ? ShardingStrategy::kNoShard : options.sharding_strategy;
  state.mixed_precision = options.mixed_precision;
  state.cpu_offload = options.cpu_offload;
  state.limit_all_gathers = options.limit_all_gathers;
  state.use_orig_params = options.use_orig_params;
  state.backward_prefetch = options.backward_prefetch;
  state.forward_prefetch = options.forward_prefetch;
  state.compute_device = options.device_mesh && options.device_mesh->device_type() == "cpu"
                             ? Device::CPU()
                             : RankContext::Current().device();
}

void InitBufferState(FsdpState& state, const nn::Module& module) {
  state.buffer_name_to_orig_dtype.clear();
  for (const auto& [name, buffer] : module.named_buffers()) {
    state.buffer_name_to_orig_dtype[CleanTensorName(name)] = buffer.dtype();
  }
}

std::vector<Tensor> GetOrigParams(const nn::Module& module,
                                  const std::set<const TensorImpl*>& ignored_params) {
  std::set<const TensorImpl*> flattened;
  for (const nn::ModulePtr& submodule : module.modules()) {
    const FullyShardedDataParallel* nested = AsFsdp(*submodule);
    if (nested == nullptr || nested->handle == nullptr) continue;
    flattened.insert(nested->handle->flat_param().impl());
    for (const Tensor& p : nested->handle->orig_params()) flattened.insert(p.impl());
  }
  std::vector<Tensor> out;
  for (const Tensor& p : module.parameters()) {
    if (!ignored_params.count(p.impl()) && !flattened.count(p.impl())) out.push_back(p);
  }
  return out;
}

void SyncModuleParamsAndBuffers(const nn::Module& module, const std::vector<Tensor>& params,
                                const std::shared_ptr<distributed::ProcessGroup>& process_group) {
  SyncedBuffers& synced = RankContext::Current().slot<SyncedBuffers>();
  std::vector<Tensor> module_states;
  for (const Tensor& buffer : module.buffers()) {
    if (synced.contains(buffer)) continue;  // synced by a nested instance
    synced.add(buffer);
    module_states.push_back(buffer.detach());
  }
  for (const Tensor& p : params) module_states.push_back(p.detach());
  // `_broadcast_coalesced`: one flat buffer per dtype (and device), broadcast from rank 0.
  std::vector<std::pair<std::pair<DType, Device>, std::vector<Tensor>>> buckets;
  for (const Tensor& t : module_states) {
    if (t.numel() == 0) continue;
    auto key = std::make_pair(t.dtype(), t.device());
    auto it = std::find_if(buckets.begin(), buckets.end(),
                           [&key](const auto& b) { return b.first == key; });
    if (it == buckets.end()) {
      buckets.push_back({key, {t}});
    } else {
      it->second.push_back(t);
    }
  }
  for (auto& [key, tensors] : buckets) {
    int64_t numel = 0;
    for (const Tensor& t : tensors) numel += t.numel();
    Tensor flat = Tensor::empty({numel}, key.first, key.second);
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      flat.narrow(0, offset, t.numel()).copy_(t.flatten());
      offset += t.numel();
    }
    process_group->broadcast(flat, /*root=*/0);
    offset = 0;
    for (const Tensor& t : tensors) {
      Tensor dst = t;
      dst.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void InitParamHandleFromModule(FsdpState& state, nn::Module& module, bool sync_module_states,
                               const std::string& who) {
  std::vector<Tensor> managed_params = GetOrigParams(module, state.ignored_params);
  if (!state.cpu_offload.offload_params) {
    // `_move_module_to_device`: managed parameters and non-ignored buffers.
    for (const Tensor& p : managed_params) MoveDataToDevice(p, state.compute_device);
    for (const auto& [name, buffer] : module.named_buffers()) {
      if (!state.ignored_buffer_names.count(CleanTensorName(name))) {
        MoveDataToDevice(buffer, state.compute_device);
      }
    }
  }
  // `_verify_managed_params`.
  for (const auto& [name, p] : module.named_parameters()) {
    bool managed = false;
    for (const Tensor& m : managed_params) managed = managed || m.is_same(p);
    FSDP_CHECK(!managed || p.dim() > 0, "FSDP doesn't support scalar parameters. Change ",
               CleanTensorName(name), " to a 1D tensor with numel equal to 1. (", who, ")");
  }
  if (sync_module_states) {
    SyncModuleParamsAndBuffers(module, managed_params, state.process_group);
    if (IsHybridStrategy(state.sharding_strategy)) {
      SyncModuleParamsAndBuffers(module, managed_params, state.inter_node_process_group);
    }
  }
  if (managed_params.empty()) return;
  FlatParamHandle::Options handle_options;
  handle_options.device = state.compute_device;
  handle_options.sharding_strategy = state.sharding_strategy;
  handle_options.offload_params = state.cpu_offload.offload_params;
  handle_options.mp_param_dtype = state.mixed_precision.param_dtype;
  handle_options.mp_reduce_dtype = state.mixed_precision.reduce_dtype;
  handle_options.keep_low_precision_grads = state.mixed_precision.keep_low_precision_grads;
  handle_options.process_group = state.process_group;
  handle_options.use_orig_params = state.use_orig_params;
  auto handle = std::make_shared<FlatParamHandle>(managed_params, &module, handle_options);
  handle->shard();
  if (state.cpu_offload.offload_params && !handle->flat_param().device().is_cpu()) {
    handle->flat_param_to(Device::CPU());
  }
  state.handle = std::move(handle);
}

}  // namespace fsdp::fsdp1
