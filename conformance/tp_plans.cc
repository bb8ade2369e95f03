#include "conformance/tp_plans.h"

#include <algorithm>
#include <set>

#include "engine/core/error.h"
#include "engine/nn/models.h"
#include "reference/sharding.h"

namespace fsdp::conformance {
namespace {

using tensor_parallel::ColwiseParallel;
using tensor_parallel::ParallelStyle;
using tensor_parallel::Placement;
using tensor_parallel::RowwiseParallel;
using tensor_parallel::SequenceParallel;

// "a.b.weight" -> "a.b"; "weight" -> "".
std::string ModuleOf(const std::string& fqn) {
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? "" : fqn.substr(0, dot);
}

std::string LastName(const std::string& fqn) {
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? fqn : fqn.substr(dot + 1);
}

// The style of module `module_fqn` in zoo model `kind`'s plan (null: not planned).
std::shared_ptr<ParallelStyle> StyleFor(const std::string& kind, const std::string& module_fqn) {
  const std::string name = LastName(module_fqn);
  std::set<std::string> colwise;
  std::set<std::string> rowwise;
  if (kind == "mlp_stack" || kind == "mlp_stack_seq_parallel") {
    colwise = {"in_proj"};
    rowwise = {"out_proj"};
  } else if (kind == "transformer") {
    colwise = {"wq", "wk", "wv", "w1"};
    rowwise = {"wo", "w2"};
  } else {
    FSDP_THROW(ErrorCode::kInvalidArgument, "zoo model '", kind,
               "' has no tensor-parallel plan (planned: mlp_stack, mlp_stack_seq_parallel, "
               "transformer)");
  }
  if (kind == "mlp_stack_seq_parallel") {
    // MLPStack.parallelize(with_seq_parallel=True): the last block's output reduce-scattered
    // onto the sequence dim, where the norm runs.
    if (module_fqn == "2.out_proj") {
      tensor_parallel::ParallelStyleOptions options;
      options.output_layouts = Placement::Shard(1);
      return std::make_shared<RowwiseParallel>(options);
    }
    if (module_fqn == "3") return std::make_shared<SequenceParallel>(/*sequence_dim=*/1);
  }
  if (colwise.count(name)) return std::make_shared<ColwiseParallel>();
  if (rowwise.count(name)) return std::make_shared<RowwiseParallel>();
  return nullptr;
}

}  // namespace

tensor_parallel::ParallelizePlan ZooTpPlan(const std::string& kind,
                                           const std::vector<std::string>& parameter_names) {
  tensor_parallel::ParallelizePlan plan;
  std::set<std::string> seen;
  for (const std::string& fqn : parameter_names) {
    const std::string module = ModuleOf(fqn);
    if (!seen.insert(module).second) continue;
    if (auto style = StyleFor(kind, module)) plan.emplace_back(module, std::move(style));
  }
  return plan;
}

void ParallelizeZooModel(const std::string& kind, nn::Module& module,
                         const std::shared_ptr<distributed::DeviceMesh>& tp_mesh) {
  std::vector<std::string> names;
  for (const auto& [name, param] : module.named_parameters()) names.push_back(name);
  const int64_t tp = tp_mesh->size();
  for (const auto& [fqn, submodule] : module.named_modules()) {
    if (auto* attention = dynamic_cast<nn::Attention*>(submodule.get())) {
      FSDP_CHECK(attention->n_heads() % tp == 0, "ColwiseParallel on ", fqn,
                 ".wq/wk/wv: the TP size ", tp, " does not divide n_heads ",
                 attention->n_heads(), " (each rank's colwise output must be whole heads)");
      attention->set_n_heads(attention->n_heads() / tp);
    }
  }
  tensor_parallel::parallelize_module(module, tp_mesh, ZooTpPlan(kind, names));
}

bool ZooTpOutputIsSequenceSharded(const std::string& kind) {
  return kind == "mlp_stack_seq_parallel";
}

std::map<std::string, Placement> ZooTpPlacements(const std::string& kind,
                                                 const std::vector<std::string>& parameter_names) {
  std::map<std::string, Placement> out;
  std::map<std::string, std::shared_ptr<ParallelStyle>> styles;
  for (const auto& [fqn, style] : ZooTpPlan(kind, parameter_names)) styles[fqn] = style;
  for (const std::string& name : parameter_names) {
    auto it = styles.find(ModuleOf(name));
    if (it == styles.end()) continue;
    for (const auto& [param, placement] : it->second->parameter_placements()) {
      if (param == LastName(name)) out.emplace(name, placement);
    }
  }
  return out;
}

std::vector<std::string> PlannedModulesWithInputGrad(
    const std::vector<std::string>& parameter_names, const tensor_parallel::ParallelizePlan& plan) {
  std::vector<std::string> out;
  for (const auto& entry : plan) {
    const std::string& module_fqn = entry.first;  // a lambda may not capture a structured binding
    const auto first = std::find_if(parameter_names.begin(), parameter_names.end(),
                                    [&](const std::string& n) { return ModuleOf(n) == module_fqn; });
    if (first != parameter_names.begin()) out.push_back(module_fqn);
  }
  return out;
}

reference::RefTensor NestedShardOf(const reference::RefTensor& full,
                                   const std::optional<Placement>& tp_placement, int dp_rank,
                                   int dp, int tp_rank, int tp) {
  reference::RefTensor piece = full;
  if (tp_placement && tp_placement->is_shard()) {
    const int64_t dim = tp_placement->normalized(full.ndim()).dim();
    const reference::ChunkLayout layout = reference::MakeChunkLayout(full.shape[dim], tp);
    const int64_t begin = layout.RowOffset(tp_rank);
    const int64_t length = layout.RowsOnRank(tp_rank);
    int64_t outer = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= full.shape[d];
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < full.ndim(); ++d) inner *= full.shape[d];
    reference::Shape shape = full.shape;
    shape[dim] = length;
    std::vector<double> values;
    values.reserve(static_cast<size_t>(outer * length * inner));
    for (int64_t o = 0; o < outer; ++o) {
      const auto start = full.data.begin() + (o * full.shape[dim] + begin) * inner;
      values.insert(values.end(), start, start + length * inner);
    }
    piece = reference::RefTensor(shape, std::move(values));
  }
  return reference::ShardOf(piece, dp_rank, dp);
}

}  // namespace fsdp::conformance
