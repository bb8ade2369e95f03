#include "engine/fsdp/mesh_info.h"

#include "engine/core/error.h"

namespace fsdp::fsdp2 {

FsdpMeshInfo FsdpMeshInfo::FromProcessGroup(std::shared_ptr<distributed::ProcessGroup> group) {
  FSDP_CHECK(group != nullptr, "fully_shard: no process group (and no default group set)");
  FsdpMeshInfo info;
  info.shard_mesh_size = group->size();
  info.shard_mesh_rank = group->rank();
  info.shard_process_group = std::move(group);
  return info;
}

FsdpMeshInfo FsdpMeshInfo::FromMesh(std::shared_ptr<distributed::DeviceMesh> mesh) {
  FSDP_CHECK(mesh != nullptr, "fully_shard: null DeviceMesh");
  FSDP_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2,
             "fully_shard expects a 1D or 2D DeviceMesh but got ", mesh->str());
  FsdpMeshInfo info;
  const int shard_dim = mesh->ndim() - 1;
  info.shard_process_group = mesh->get_group(shard_dim);
  FSDP_CHECK(info.shard_process_group != nullptr, "fully_shard: rank ", mesh->get_rank(),
             " is not in ", mesh->str());
  info.shard_mesh_size = info.shard_process_group->size();
  info.shard_mesh_rank = info.shard_process_group->rank();
  if (mesh->ndim() == 2) {
    info.replicate_process_group = mesh->get_group(0);
    info.replicate_mesh_size = info.replicate_process_group->size();
    info.replicate_mesh_rank = info.replicate_process_group->rank();
  }
  info.mesh = std::move(mesh);
  return info;
}

std::optional<FsdpMeshInfo> GetPostForwardMeshInfo(const ReshardAfterForward& reshard_after_forward,
                                                   const FsdpMeshInfo& mesh_info) {
  const int shard_size = mesh_info.shard_mesh_size;
  if (const bool* b = std::get_if<bool>(&reshard_after_forward)) {
    if (*b) return mesh_info;
    return std::nullopt;
  }
  const int k = std::get<int>(reshard_after_forward);
  FSDP_CHECK(k >= 1 && k <= shard_size && shard_size % k == 0,
             "If passing reshard_after_forward as an int, it should be a factor of ", shard_size,
             ", not ", k);
  if (k == 1) return std::nullopt;
  if (k == shard_size) return mesh_info;
  FSDP_CHECK(!mesh_info.is_hsdp(),
             "fully_shard: an int reshard_after_forward with HSDP (2-D mesh) is not supported by "
             "this engine; pass a bool");
  // The shard group's ranks viewed as [-1, k]: rows are the post-forward shard groups.
  const std::vector<int> ranks = mesh_info.shard_process_group->global_ranks();
  const std::string device_type = mesh_info.mesh ? mesh_info.mesh->device_type() : "cpu";
  auto post_forward_mesh = distributed::DeviceMesh::Create(
      mesh_info.shard_process_group, device_type, {static_cast<int64_t>(shard_size / k), k}, ranks);
  FsdpMeshInfo info;
  info.mesh = post_forward_mesh;
  info.shard_process_group = post_forward_mesh->get_group(1);
  info.shard_mesh_size = info.shard_process_group->size();
  info.shard_mesh_rank = info.shard_process_group->rank();
  info.replicate_process_group = post_forward_mesh->get_group(0);
  info.replicate_mesh_size = info.replicate_process_group->size();
  info.replicate_mesh_rank = info.replicate_process_group->rank();
  return info;
}

}  // namespace fsdp::fsdp2
