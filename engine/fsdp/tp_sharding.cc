#include "engine/fsdp/tp_sharding.h"

#include <algorithm>
#include <sstream>

#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"

namespace fsdp::fsdp2 {
namespace {

using tensor_parallel::Placement;

std::string NamesStr(const std::vector<std::string>& names) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  os << (names.size() == 1 ? ",)" : ")");
  return os.str();
}

std::string MeshStr(const FsdpMeshInfo& mesh_info) {
  return mesh_info.mesh ? mesh_info.mesh->str()
                        : "process group of " + std::to_string(mesh_info.shard_mesh_size) + " ranks";
}

}  // namespace

std::string TpSharding::placements_str() const {
  const std::string dp = split_factor > 1
                             ? "_StridedShard(dim=0, sf=" + std::to_string(split_factor) + ")"
                             : Placement::Shard(0).str();
  return "(" + std::string(hsdp ? "Replicate(), " : "") + dp + ", " + tp_placement.str() + ")";
}

Shape TpSharding::global_offsets(int64_t dp_row_begin) const {
  Shape offsets(global_shape.size(), 0);
  if (tp_placement.is_shard()) {
    const int64_t dim = tp_placement.dim();
    offsets[static_cast<size_t>(dim)] =
        tensor_parallel::ComputeChunkRange(global_shape[static_cast<size_t>(dim)], tp_mesh->size(0),
                                           tp_mesh->get_local_rank(0))
            .offset;
  }
  offsets[0] += dp_row_begin;
  return offsets;
}

Tensor TpSharding::full_tensor(const Tensor& tp_local) const {
  autograd::NoGradGuard no_grad;
  return tensor_parallel::DTensor::from_local(tp_local, tp_mesh, {tp_placement}, global_shape)
      .full_tensor();
}

TpSharding MakeTpSharding(const tensor_parallel::DTensor& param, const FsdpMeshInfo& mesh_info,
                          const std::string& fqn) {
  const auto& tp_mesh = param.device_mesh();
  FSDP_CHECK(tp_mesh->ndim() == 1 && param.placements().size() == 1,
             "FSDP only supports 1D TP, not ", tensor_parallel::PlacementsStr(param.placements()),
             " (parameter ", fqn, ": ", param.str(), ")");
  if (mesh_info.mesh) {
    // fully_shard given the 2-D mesh (or the TP submesh) instead of mesh_2d["dp"].
    const auto& names = mesh_info.mesh->mesh_dim_names();
    for (const std::string& n : tp_mesh->mesh_dim_names()) {
      FSDP_CHECK(std::find(names.begin(), names.end(), n) == names.end(), "fully_shard: parameter ",
                 fqn, " is a DTensor on the TP mesh dim ", NamesStr(tp_mesh->mesh_dim_names()),
                 " (", param.str(), "), and the mesh given to fully_shard, ", MeshStr(mesh_info),
                 ", contains that dim: pass the data-parallel submesh (mesh_2d[\"dp\"]) instead");
    }
  }
  // FSDP requires the DP and TP mesh to have the same parent mesh: the dp group and the tp
  // group of this rank meet in this rank only (under HSDP, the shard group and the replicate
  // group each).
  const std::vector<int> tp_ranks = tp_mesh->get_group(0)->global_ranks();
  for (const auto* group :
       {mesh_info.shard_process_group.get(), mesh_info.replicate_process_group.get()}) {
    if (group == nullptr) continue;
    const std::vector<int> dp_ranks = group->global_ranks();
    int64_t common = 0;
    for (int r : dp_ranks) common += std::count(tp_ranks.begin(), tp_ranks.end(), r);
    FSDP_CHECK(common == 1,
               "FSDP requires the DP and TP mesh to have the same parent mesh but got: ",
               MeshStr(mesh_info), " and ", tp_mesh->str(), " (parameter ", fqn,
               "): their groups share ", common, " ranks, not only this one");
  }

  TpSharding s;
  s.tp_mesh = tp_mesh;
  s.tp_placement = param.placements()[0].normalized(static_cast<int64_t>(param.shape().size()));
  s.global_shape = param.shape();
  s.tp_local_shape = param.local_tensor().sizes();
  s.dp_mesh = mesh_info.mesh;
  s.hsdp = mesh_info.is_hsdp();
  s.split_factor = s.tp_placement.is_shard(0) ? tp_mesh->size(0) : 1;
  return s;
}

}  // namespace fsdp::fsdp2
