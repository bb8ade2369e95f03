// TpSharding: how fully_shard shards a tensor-parallel parameter (FSDP2 × TP on a 2-D mesh;
// PyTorch's FSDPParam._init_sharded_param with a DTensor parameter: `_tp_spec`, `_spmd_mesh`,
// `_sharding_spec`; docs/tensor_parallel.md, "FSDP2 over a tensor-parallel model").
//
// A parameter that a parallel style sharded over the 1-D TP mesh (mesh_2d["tp"]) is a DTensor
// whose local tensor (the TP-local tensor) is what its module's slot holds. fully_shard over
// the dp submesh (mesh_2d["dp"]) shards that TP-local tensor on dim 0 over dp with the usual
// torch.chunk rule, so the sharded parameter is a DTensor over the (dp, tp) mesh with
// placements (dp placement, TP placement) (under HSDP, (Replicate(), dp placement, TP
// placement) over (replicate, shard, tp)):
//
//   TP placement Shard(0)       dp placement _StridedShard(dim=0, sf=tp): dim 0 is cut over tp
//                               first, then each TP-local tensor over dp (nested torch.chunk;
//                               PyTorch's _StridedShard with split_factor = tp)
//   TP placement Shard(d > 0)   dp placement Shard(0)
//   TP placement Replicate()    dp placement Shard(0)
//
// Representation: this engine keeps that 2-D spec here rather than as a Placement kind (the
// DTensor layer rejects one tensor dim sharded over two mesh dims); `split_factor` > 1 is what
// marks the strided dp placement. The element offsets of a sharded parameter in the global
// tensor are the TP chunk's offsets plus the dp chunk's row offset (a nested torch.chunk of a
// contiguous block is contiguous). full_tensor() all-gathers over dp (back to the TP-local
// tensor) and then over tp (DTensor.full_tensor, a functional all-gather for a Shard TP
// placement).
//
// Ownership: a value; shares the meshes. Thread-safety: immutable; used by its rank's thread.
#pragma once

#include <memory>
#include <string>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/tensor_parallel/dtensor.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::fsdp2 {

struct TpSharding {
  // `_tp_spec`: the TP mesh (1-D), the parameter's TP placement and its global shape.
  std::shared_ptr<distributed::DeviceMesh> tp_mesh;
  tensor_parallel::Placement tp_placement = tensor_parallel::Placement::Replicate();
  Shape global_shape;
  // The shape of this rank's TP-local tensor (what FSDP shards over dp).
  Shape tp_local_shape;
  // The FSDP (dp) mesh; null when fully_shard got a process group (then named "dp" in text).
  // Under HSDP it is 2-D (replicate, shard): the parameter is sharded over the shard dim and
  // replicated over the replicate dim.
  std::shared_ptr<distributed::DeviceMesh> dp_mesh;
  bool hsdp = false;
  // The number of TP shards of dim 0: the TP mesh size for a Shard(0) TP placement
  // (_StridedShard(0, split_factor)), else 1.
  int64_t split_factor = 1;

  // "(_StridedShard(dim=0, sf=2), Shard(dim=0))", "(Shard(dim=0), Shard(dim=1))"; under HSDP
  // "(Replicate(), Shard(dim=0), Shard(dim=1))".
  std::string placements_str() const;
  // The global offsets of a dp shard that starts at row `dp_row_begin` of the TP-local tensor.
  Shape global_offsets(int64_t dp_row_begin) const;
  // DTensor.full_tensor() of the TP-local tensor `tp_local` (a collective over tp; no
  // autograd).
  Tensor full_tensor(const Tensor& tp_local) const;
};

// The 2-D sharding of `param` (a tensor-parallel parameter named `fqn`) under fully_shard with
// `mesh_info`. Errors (InvalidArgument), as PyTorch checks them and more: a TP DTensor on a
// mesh of more than one dim ("FSDP only supports 1D TP"); an FSDP mesh that contains the TP
// mesh's dims (fully_shard given the 2-D mesh instead of mesh_2d["dp"]); an FSDP group that
// is not orthogonal to the TP group (not two dims of one parent mesh). HSDP × TP (a 3-D mesh
// (replicate, shard, tp), fully_shard over mesh_3d[("dp_replicate", "dp_shard")]) shards over
// the shard dim as above and all-reduces the gradient over the replicate dim.
TpSharding MakeTpSharding(const tensor_parallel::DTensor& param, const FsdpMeshInfo& mesh_info,
                          const std::string& fqn);

}  // namespace fsdp::fsdp2
