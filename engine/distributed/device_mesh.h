// DeviceMesh: an N-dimensional arrangement of global ranks with one process group per mesh
// dimension, like torch.distributed.device_mesh.DeviceMesh / init_device_mesh.
//
// Init(world, device_type, shape, names) is init_device_mesh: ranks 0..prod(shape)-1 laid out
// row-major, so for (dp, tp) rank r has coordinate (r / tp, r % tp); the tp group of r is the
// consecutive ranks of its row and the dp group the strided ranks of its column. Construction
// is collective over `world` (every rank of `world` must construct the same mesh): for each
// dim, every rank calls world->new_group for every line of the mesh along that dim, in
// PyTorch's order (mesh.swapdims(-1, dim).reshape(-1, size(dim))). A 1-D mesh over all of
// `world`'s ranks reuses `world` itself.
//
// mesh["tp"] (or slice({"dp", "tp"})) is the sub-mesh through this rank along the named dims;
// it reuses the parent's groups and issues no collective.
//
// Ownership: shared (std::shared_ptr); holds its groups.
// Thread-safety: immutable after construction; used by its rank's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"

namespace fsdp::distributed {

class DeviceMesh {
 public:
  // init_device_mesh(device_type, mesh_shape, mesh_dim_names=names). prod(shape) must equal
  // world->size(); names may be empty (then dims are addressed by index) or one unique name
  // per dim.
  static std::shared_ptr<DeviceMesh> Init(std::shared_ptr<ProcessGroup> world,
                                          std::string device_type,
                                          const std::vector<int64_t>& mesh_shape,
                                          const std::vector<std::string>& mesh_dim_names = {});
  // DeviceMesh(device_type, mesh): `mesh_ranks` are global ranks of `world` in row-major order
  // of `mesh_shape` (any arrangement, each rank at most once). Collective over `world`.
  static std::shared_ptr<DeviceMesh> Create(std::shared_ptr<ProcessGroup> world,
                                            std::string device_type,
                                            const std::vector<int64_t>& mesh_shape,
                                            const std::vector<int>& mesh_ranks,
                                            const std::vector<std::string>& mesh_dim_names = {});

  const std::string& device_type() const { return device_type_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t size() const;  // number of ranks in the mesh
  int64_t size(int dim) const;
  const std::vector<std::string>& mesh_dim_names() const { return names_; }
  // The global ranks, row-major.
  const std::vector<int>& mesh() const { return ranks_; }
  // The mesh as an int64 tensor of shape shape() (torch's DeviceMesh.mesh).
  Tensor mesh_tensor() const;

  // The group along `dim` that contains this rank (nullptr when this rank is not in the
  // mesh). Negative dims count from the end.
  std::shared_ptr<ProcessGroup> get_group(int dim) const;
  std::shared_ptr<ProcessGroup> get_group(const std::string& mesh_dim_name) const;
  // Only for 1-D meshes, like torch's get_group() without arguments.
  std::shared_ptr<ProcessGroup> get_group() const;
  std::vector<std::shared_ptr<ProcessGroup>> get_all_groups() const { return groups_; }

  // This rank's global rank.
  int get_rank() const { return global_rank_; }
  // This rank's coordinate in the mesh; nullopt when it is not in the mesh.
  std::optional<std::vector<int64_t>> get_coordinate() const;
  // This rank's index along `dim` (its rank within get_group(dim)).
  int64_t get_local_rank(int dim) const;
  int64_t get_local_rank(const std::string& mesh_dim_name) const;

  // The 1-D sub-mesh through this rank along `mesh_dim_name` (mesh_2d["tp"]).
  std::shared_ptr<DeviceMesh> operator[](const std::string& mesh_dim_name) const;
  // The sub-mesh through this rank over the named dims, in the given order.
  std::shared_ptr<DeviceMesh> slice(const std::vector<std::string>& mesh_dim_names) const;

  // "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))".
  std::string str() const;

 private:
  DeviceMesh() = default;
  int DimIndex(const std::string& name) const;
  int NormalizeDim(int dim) const;

  std::string device_type_;
  std::vector<int64_t> shape_;
  std::vector<int> ranks_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // per dim; nullptr on non-members
  std::optional<std::vector<int64_t>> coordinate_;
  int global_rank_ = 0;
};

}  // namespace fsdp::distributed
