#include "conformance/fsdp1_params.h"

#include <utility>

#include "engine/core/error.h"

namespace fsdp::conformance {

ParamSpec ShardingStrategyAxis() {
  return ParamSpec::Axis("sharding_strategy", "FullyShardedDataParallel sharding_strategy",
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"});
}

ParamSpec AllShardingStrategiesAxis() {
  return ParamSpec::Axis("sharding_strategy",
                         "FullyShardedDataParallel sharding_strategy (hybrid ones on the "
                         "(replicate, shard) mesh of HybridMeshShapeFor(world))",
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                          "_HYBRID_SHARD_ZERO2"});
}

ParamSpec BackwardPrefetchAxis() {
  return ParamSpec::Axis("backward_prefetch", "BackwardPrefetch (None: no prefetch)",
                         {"BACKWARD_PRE", "BACKWARD_POST", "None"});
}

ParamSpec UseOrigParamsAxis() {
  return ParamSpec::Axis("use_orig_params", "FullyShardedDataParallel use_orig_params",
                         {"False", "True"});
}

ParamSpec MixedPrecisionAxis() {
  ParamSpec p = ParamSpec::Axis("mixed_precision",
                                "MixedPrecision: None, param/reduce/buffer dtypes all bfloat16 or "
                                "all float16, reduce_dtype=bfloat16 only, or (accepted when fixed) "
                                "param_bfloat16: param_dtype=bfloat16 only (the reduce dtype "
                                "follows it), bfloat16_keep_low: all bfloat16 with "
                                "keep_low_precision_grads=True",
                                {"None", "bfloat16", "float16", "reduce_bfloat16"});
  p.domain = ParamDomain{
      "None, bfloat16, float16, reduce_bfloat16, param_bfloat16 or "
      "bfloat16_keep_low",
      [](const std::string& v) -> std::optional<std::string> {
        for (const char* known : {"None", "bfloat16", "float16", "reduce_bfloat16",
                                  "param_bfloat16", "bfloat16_keep_low"}) {
          if (v == known) return v;
        }
        return std::nullopt;
      }};
  return p;
}

fsdp1::MixedPrecision ParseMixedPrecision(const std::string& name) {
  fsdp1::MixedPrecision mp;
  if (name == "None") return mp;
  if (name == "reduce_bfloat16") {
    mp.reduce_dtype = DType::kBFloat16;
    return mp;
  }
  if (name == "param_bfloat16") {
    mp.param_dtype = DType::kBFloat16;
    return mp;
  }
  if (name == "bfloat16_keep_low") {
    mp.param_dtype = mp.reduce_dtype = mp.buffer_dtype = DType::kBFloat16;
    mp.keep_low_precision_grads = true;
    return mp;
  }
  FSDP_CHECK(name == "bfloat16" || name == "float16", "unknown mixed_precision '", name,
             "' (None, bfloat16, float16, reduce_bfloat16, param_bfloat16 or bfloat16_keep_low)");
  const DType low = name == "bfloat16" ? DType::kBFloat16 : DType::kFloat16;
  mp.param_dtype = mp.reduce_dtype = mp.buffer_dtype = low;
  return mp;
}

// FSDP1's reduce dtype (_FlatParamHandle._init_param_reduce_dtypes): reduce_dtype, else
// param_dtype (a low-precision param_dtype alone reduces in it too), else the parameters' own.
DType Fsdp1ReduceDType(const fsdp1::MixedPrecision& mp, DType param_dtype) {
  if (mp.reduce_dtype) return *mp.reduce_dtype;
  return mp.param_dtype.value_or(param_dtype);
}

std::optional<HybridMeshShape> HybridMeshShapeFor(int world) {
  for (int p = 2; p * 2 <= world; ++p) {
    if (world % p == 0) return HybridMeshShape{p, world / p};
  }
  return std::nullopt;
}

fsdp1::ShardingStrategy ParseShardingStrategy(const std::string& name) {
  for (auto s : {fsdp1::ShardingStrategy::kFullShard, fsdp1::ShardingStrategy::kShardGradOp,
                 fsdp1::ShardingStrategy::kNoShard, fsdp1::ShardingStrategy::kHybridShard,
                 fsdp1::ShardingStrategy::kHybridShardZero2}) {
    if (name == fsdp1::ShardingStrategyName(s)) return s;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown sharding_strategy '", name, "'");
}

std::optional<fsdp1::BackwardPrefetch> ParseBackwardPrefetch(const std::string& name) {
  if (name == "BACKWARD_PRE") return fsdp1::BackwardPrefetch::kBackwardPre;
  if (name == "BACKWARD_POST") return fsdp1::BackwardPrefetch::kBackwardPost;
  FSDP_CHECK(name == "None", "unknown backward_prefetch '", name,
             "' (BACKWARD_PRE, BACKWARD_POST or None)");
  return std::nullopt;
}

fsdp1::FullyShardedDataParallelOptions Fsdp1CaseOptions(
    const CaseParams& params, std::shared_ptr<distributed::ProcessGroup> pg) {
  fsdp1::FullyShardedDataParallelOptions options;
  options.process_group = std::move(pg);
  options.sharding_strategy = ParseShardingStrategy(params.GetString("sharding_strategy"));
  options.backward_prefetch = ParseBackwardPrefetch(params.GetString("backward_prefetch"));
  options.use_orig_params = params.GetBool("use_orig_params");
  if (params.has("forward_prefetch")) options.forward_prefetch = params.GetBool("forward_prefetch");
  return options;
}

bool Fsdp1HybridRule(fsdp1::ShardingStrategy strategy) {
  return strategy == fsdp1::ShardingStrategy::kHybridShard ||
         strategy == fsdp1::ShardingStrategy::kHybridShardZero2;
}

bool Fsdp1ReshardsAfterForwardRule(fsdp1::ShardingStrategy strategy) {
  return strategy == fsdp1::ShardingStrategy::kFullShard ||
         strategy == fsdp1::ShardingStrategy::kHybridShard;
}

nlohmann::json MergeFlatParamAllGathers(nlohmann::json phase) {
  if (!phase.is_object()) return phase;
  int64_t n = 0;
  for (const char* key : {kFlatParamAllGather, kFlatParamAllGatherList}) {
    if (phase.contains(key) && phase[key].is_number_integer()) {
      n += phase[key].get<int64_t>();
      phase.erase(key);
    }
  }
  if (n > 0) phase[kFlatParamAllGather] = n;
  return phase;
}

}  // namespace fsdp::conformance
