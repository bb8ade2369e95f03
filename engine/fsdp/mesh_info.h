// FsdpMeshInfo: the process groups an FSDP parameter group communicates over (PyTorch's
// FSDPMeshInfo / HSDPMeshInfo): the shard group (all-gather, reduce-scatter) and, for HSDP,
// the replicate group (gradient all-reduce); plus the construction of the post-forward mesh
// for an int reshard_after_forward (docs/fsdp-behaviour.md, "Int reshard_after_forward";
// `_get_post_forward_mesh_info`).
//
// Ownership: shares the process groups and the DeviceMesh (std::shared_ptr).
// Thread-safety: immutable after construction; used by its rank's thread.
#pragma once

#include <memory>
#include <optional>
#include <variant>

#include "engine/distributed/device_mesh.h"
#include "engine/distributed/process_group.h"

namespace fsdp::fsdp2 {

struct FsdpMeshInfo {
  // The mesh (1-D: FSDP; 2-D (replicate, shard): HSDP). May be null when built from a
  // process group.
  std::shared_ptr<distributed::DeviceMesh> mesh;
  std::shared_ptr<distributed::ProcessGroup> shard_process_group;
  int shard_mesh_size = 1;
  int shard_mesh_rank = 0;
  // HSDP only (null otherwise).
  std::shared_ptr<distributed::ProcessGroup> replicate_process_group;
  int replicate_mesh_size = 1;
  int replicate_mesh_rank = 0;

  bool is_hsdp() const { return replicate_process_group != nullptr; }
  // Data-parallel size N = shard size * replicate size (docs/fsdp-behaviour.md, "Gradient
  // divide factors").
  int data_parallel_size() const { return shard_mesh_size * replicate_mesh_size; }

  // 1-D FSDP over `group`.
  static FsdpMeshInfo FromProcessGroup(std::shared_ptr<distributed::ProcessGroup> group);
  // 1-D mesh → FSDP over dim 0; 2-D mesh → HSDP with dim 0 = replicate, dim 1 = shard.
  // Other ndims are rejected.
  static FsdpMeshInfo FromMesh(std::shared_ptr<distributed::DeviceMesh> mesh);
};

// reshard_after_forward: a bool, or an int k (the post-forward shard group size).
using ReshardAfterForward = std::variant<bool, int>;

// `_get_post_forward_mesh_info`: nullopt for False (and for an int 1), `mesh_info` itself for
// True (and for an int equal to the shard size), otherwise a new mesh whose rows are groups of
// k consecutive ranks of the flattened mesh (shard dim 1, replicate dim 0). Validates the int:
// ValueError "If passing reshard_after_forward as an int, it should be a factor of {W}, not
// {k}". Creating the post-forward mesh is collective over the shard group (every rank of it
// must call this with the same arguments).
std::optional<FsdpMeshInfo> GetPostForwardMeshInfo(const ReshardAfterForward& reshard_after_forward,
                                                   const FsdpMeshInfo& mesh_info);

}  // namespace fsdp::fsdp2
