// DTensor: a distributed tensor, like torch.distributed.tensor.DTensor: this rank's local
// tensor, a DeviceMesh, one Placement per mesh dim, and the global shape.
//
// The local tensor is an ordinary autograd tensor; from_local, redistribute and to_local are
// differentiable functions on it whose backward redistributes the gradient, as PyTorch's
// _FromTorchTensor, Redistribute and _ToTorchTensor do:
//   from_local(x, P)          backward: gradient -> P (is_backward: Replicate stays Replicate
//                             where P is Partial)
//   redistribute(P -> Q)      backward: gradient -> P, except that a Shard or Replicate
//                             gradient of a Partial source dim becomes Replicate
//   to_local(grad_placements) backward: declares the gradient's placements (default: this
//                             DTensor's); the next backward step redistributes from them
// Since this engine has no DTensor op dispatch, a gradient's placements travel beside the
// autograd graph: each DTensor shares a GradPlacements slot that its consumer's backward fills
// (to_local: grad_placements; redistribute: its normalized source) just before its producer's
// backward reads it. A DTensor consumed twice must get gradients of one placement.
//
// Ownership: a value; copies share the local tensor, the mesh and the slot.
// Thread-safety: like a tensor, used by its rank's thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::tensor_parallel {

class DTensor {
 public:
  // DTensor.from_local(local_tensor, device_mesh, placements, shape=None): no communication
  // (run_check=False). Without `shape`, every Shard(d) assumes even shards (global size
  // local * mesh size, as PyTorch does); pass `shape` for uneven ones (the local shape must then
  // equal ComputeLocalShape). Differentiable.
  static DTensor from_local(const Tensor& local, std::shared_ptr<distributed::DeviceMesh> mesh,
                            const Placements& placements,
                            std::optional<Shape> shape = std::nullopt);

  // DTensor.to_local(grad_placements=None): the local tensor (differentiable; see above).
  Tensor to_local(std::optional<Placements> grad_placements = std::nullopt) const;
  // DTensor.redistribute(placements=...) on the same mesh. Differentiable.
  DTensor redistribute(const Placements& placements) const;
  // DTensor.full_tensor(grad_placements=None): redistribute to Replicate() everywhere, then
  // to_local.
  Tensor full_tensor(std::optional<Placements> grad_placements = std::nullopt) const;

  // PyTorch's DTensor._local_tensor: the local tensor itself, without the to_local node (for
  // registering a sharded leaf parameter).
  const Tensor& local_tensor() const { return local_; }
  const Shape& shape() const { return shape_; }
  const Placements& placements() const { return placements_; }
  const std::shared_ptr<distributed::DeviceMesh>& device_mesh() const { return mesh_; }
  bool requires_grad() const { return local_.requires_grad(); }
  // "DTensor(local_tensor=[2, 4], device_mesh=..., placements=(Shard(dim=0),), shape=[4, 4])".
  std::string str() const;

  // The placements a gradient of this DTensor's local tensor arrives with, filled by the
  // consumer's backward (see above). Internal to this layer.
  struct GradPlacements {
    std::optional<Placements> placements;
  };

 private:
  friend DTensor distribute_tensor(const Tensor&, std::shared_ptr<distributed::DeviceMesh>,
                                   const Placements&, std::optional<int>);
  DTensor(Tensor local, std::shared_ptr<distributed::DeviceMesh> mesh, Placements placements,
          Shape shape, std::shared_ptr<GradPlacements> grad);
  // Reads (and clears) the slot: the placements of the gradient arriving now.
  Placements TakeGradPlacements() const;

  Tensor local_;
  std::shared_ptr<distributed::DeviceMesh> mesh_;
  Placements placements_;
  Shape shape_;
  std::shared_ptr<GradPlacements> grad_;
};

// distribute_tensor(tensor, device_mesh, placements, src_data_rank=0): a leaf DTensor (it
// requires grad when `tensor` does) whose local piece is this rank's chunk of `tensor`. With
// src_data_rank, every mesh dim's group first broadcasts group rank src_data_rank's tensor
// (so all ranks hold that rank's values; PyTorch scatters Shard dims instead, same values);
// without it, each rank chunks its own tensor and nothing is communicated. Partial
// placements keep the value on every rank for avg and divide by the mesh dim size for sum.
DTensor distribute_tensor(const Tensor& tensor, std::shared_ptr<distributed::DeviceMesh> mesh,
                          const Placements& placements, std::optional<int> src_data_rank = 0);

}  // namespace fsdp::tensor_parallel
