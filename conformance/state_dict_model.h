// The model, inputs and expected pieces shared by the state-dict families
// (`fully_shard_state_dict/*`, `checkpoint/*`): MLP(dim, bias=True, with_buffer=True), i.e.
// in_proj [4*dim, dim] + [4*dim], out_proj [dim, 4*dim] + [dim] and a persistent buffer [dim],
// in float32, with in_proj fully_shard-ed on its own and then the root. The default dim 5 makes
// dim 0 uneven at every world above 1 (20 rows uneven at 3 and 8).
//
// Expected values follow rules, never the engine: every parameter's piece on rank r of W is
// torch.chunk's rows of the runner-owned weights (ChunkRows); buffers are full on every rank.
//
// Thread-safety: stateless functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/checks.h"
#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

// dim (SizeInt, default 5) and seed (SizeInt, default 0).
std::vector<ParamSpec> StateDictModelParams();
// The weights (seeded by `seed`) and per rank "step0/input", "step1/input" ([2, dim]).
CaseInputs StateDictModelInputs(const CaseParams& params, int world);
InputsDoc StateDictModelInputsDoc();

// HSDP (a scenario with the "replicate" parameter, ReplicateParam): fully_shard over
// init_device_mesh((replicate, world / replicate), ("replicate", "shard")), so rank r holds
// torch.chunk's piece r % shard of shard = world / replicate. ShardSizeOf / ShardRankOf give
// that layout (world and r without the parameter or with replicate 1).
ParamSpec ReplicateParam();
int ShardSizeOf(const CaseParams& params, int world);
int ShardRankOf(const CaseParams& params, int rank, int world);

// The MLP with the case's weights on env.device, fully_shard-ed over env.pg as above, or over
// the HSDP mesh with a replicate parameter > 1 (with the case's shard_placement_fn where the
// scenario has a shard_placement parameter, conformance/fsdp_params.h). With `zero_weights`, every
// parameter is zero instead (a model that has not loaded anything yet); with
// `reshard_after_forward` false, both fully_shard calls pass reshard_after_forward=False (the
// parameters stay unsharded after a forward).
nn::ModulePtr BuildShardedStateDictModel(RankEnv& env, bool zero_weights = false,
                                         bool reshard_after_forward = true);

// True for the entries fully_shard manages (parameters), false for buffers.
bool IsShardedKey(const std::string& key);
// torch.chunk's piece of `full` (dim >= 1) along `shard_dim` for `rank` of `world`.
Tensor ChunkRows(const Tensor& full, int rank, int world, int64_t shard_dim = 0);
// {"global_shape": [...], "offsets": [...]} of that piece.
nlohmann::json ChunkSharding(const Tensor& full, int rank, int world, int64_t shard_dim = 0);
// What a rank holds of `weights` at `world`: ChunkRows for parameters (along the dim the case's
// shard_placement gives each, conformance/fsdp_params.h), the full buffer, each as
// {prefix + key: TensorToJson}.
nlohmann::json ExpectedPieces(const NamedTensors& weights, int rank, int world,
                              const std::string& prefix, const CaseParams& params);
// The keys of `weights`, in order.
std::vector<std::string> KeysOf(const NamedTensors& weights);
// SGD(lr=0.1) step on sum(model(input)).
void SgdStepOnSum(nn::Module& model, const Tensor& input);

// Every value of `sd` on the CPU, as {prefix + key: TensorToJson}.
nlohmann::json StateDictPiecesJson(const nn::StateDict& sd, const std::string& prefix);
// Per key of `sd`: {"global_shape", "offsets"} of a sharded (DTensor) value, null for a plain
// tensor.
nlohmann::json StateDictShardingJson(const nn::StateDict& sd);
// A copy of `sd` with every value cloned (the sharding kept); negated with `negate`.
nn::StateDict ClonedStateDict(const nn::StateDict& sd, bool negate = false);

// The load-and-continue rule: after loading what a saver saved, one more step of the loader
// equals the saver's own. Rank `rank`'s "loaded/<key>" tensor must equal its "continued/<key>"
// one bit for bit, for every key of `keys` it reported as continued. Returns how many it
// compared.
int CheckLoadedContinuesLikeSaver(CheckList& checks, const std::vector<nlohmann::json>& per_rank,
                                  int rank, const std::vector<std::string>& keys);

}  // namespace fsdp::conformance
