#include "engine/distributed/device_mesh.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

namespace fsdp::distributed {

namespace {

std::string NamesStr(const std::vector<std::string>& names) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() == 1) os << ",";
  os << ")";
  return os.str();
}

int64_t Product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Row-major strides of `shape`.
std::vector<int64_t> Strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

}  // namespace

std::shared_ptr<DeviceMesh> DeviceMesh::Init(std::shared_ptr<ProcessGroup> world,
                                             std::string device_type,
                                             const std::vector<int64_t>& mesh_shape,
                                             const std::vector<std::string>& mesh_dim_names) {
  FSDP_CHECK(world != nullptr, "init_device_mesh: no world process group");
  const int64_t n = Product(mesh_shape);
  FSDP_CHECK(n == world->size(), "init_device_mesh: mesh shape ", ShapeStr(mesh_shape), " has ", n,
             " ranks but the world size is ", world->size(), " (rank ", world->global_rank(), ")");
  std::vector<int> ranks(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  const auto world_ranks = world->global_ranks();
  for (auto& r : ranks) r = world_ranks[static_cast<size_t>(r)];
  return Create(std::move(world), std::move(device_type), mesh_shape, ranks, mesh_dim_names);
}

std::shared_ptr<DeviceMesh> DeviceMesh::Create(std::shared_ptr<ProcessGroup> world,
                                               std::string device_type,
                                               const std::vector<int64_t>& mesh_shape,
                                               const std::vector<int>& mesh_ranks,
                                               const std::vector<std::string>& mesh_dim_names) {
  FSDP_CHECK(world != nullptr, "DeviceMesh: no world process group");
  const int me = world->global_rank();
  FSDP_CHECK(!mesh_shape.empty(), "DeviceMesh: the mesh needs at least one dim (rank ", me, ")");
  for (int64_t s : mesh_shape) {
    FSDP_CHECK(s >= 1, "DeviceMesh: mesh shape ", ShapeStr(mesh_shape),
               " has a dim smaller than 1 (rank ", me, ")");
  }
  FSDP_CHECK(Product(mesh_shape) == static_cast<int64_t>(mesh_ranks.size()), "DeviceMesh: shape ",
             ShapeStr(mesh_shape), " needs ", Product(mesh_shape), " ranks, got ",
             mesh_ranks.size(), " (rank ", me, ")");
  FSDP_CHECK(mesh_dim_names.empty() || mesh_dim_names.size() == mesh_shape.size(),
             "DeviceMesh: ", mesh_dim_names.size(), " mesh_dim_names ", NamesStr(mesh_dim_names),
             " for a ", mesh_shape.size(), "-D mesh (rank ", me, ")");
  FSDP_CHECK(std::set<std::string>(mesh_dim_names.begin(), mesh_dim_names.end()).size() ==
                 mesh_dim_names.size(),
             "DeviceMesh: mesh_dim_names ", NamesStr(mesh_dim_names), " are not unique");
  const auto world_ranks = world->global_ranks();
  FSDP_CHECK(std::set<int>(mesh_ranks.begin(), mesh_ranks.end()).size() == mesh_ranks.size(),
             "DeviceMesh: a rank appears twice in the mesh (rank ", me, ")");
  for (int r : mesh_ranks) {
    FSDP_CHECK(std::find(world_ranks.begin(), world_ranks.end(), r) != world_ranks.end(),
               "DeviceMesh: mesh rank ", r, " is not in ", world->describe());
  }

  auto mesh = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  mesh->device_type_ = std::move(device_type);
  mesh->shape_ = mesh_shape;
  mesh->ranks_ = mesh_ranks;
  mesh->names_ = mesh_dim_names;
  mesh->global_rank_ = me;
  const int ndim = static_cast<int>(mesh_shape.size());
  const auto strides = Strides(mesh_shape);
  if (auto it = std::find(mesh_ranks.begin(), mesh_ranks.end(), me); it != mesh_ranks.end()) {
    int64_t flat = it - mesh_ranks.begin();
    std::vector<int64_t> coord(ndim);
    for (int d = 0; d < ndim; ++d) {
      coord[d] = flat / strides[d];
      flat %= strides[d];
    }
    mesh->coordinate_ = coord;
  }

  mesh->groups_.assign(ndim, nullptr);
  if (ndim == 1 && mesh_ranks == world_ranks) {
    mesh->groups_[0] = world;
    return mesh;
  }
  // PyTorch's order: for each dim, the rows of mesh.swapdims(-1, dim).reshape(-1, size(dim)).
  for (int dim = 0; dim < ndim; ++dim) {
    std::vector<int> perm(ndim);
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[dim], perm[ndim - 1]);
    std::vector<int64_t> swapped_shape(ndim);
    for (int k = 0; k < ndim; ++k) swapped_shape[k] = mesh_shape[perm[k]];
    const int64_t lines = Product(mesh_shape) / mesh_shape[dim];
    std::vector<int64_t> index(ndim, 0);  // index into the swapped tensor
    for (int64_t line = 0; line < lines; ++line) {
      // Decode `line` into the leading ndim-1 swapped indices (row-major).
      int64_t rest = line;
      for (int k = ndim - 2; k >= 0; --k) {
        index[k] = rest % swapped_shape[k];
        rest /= swapped_shape[k];
      }
      std::vector<int> group_ranks;
      for (int64_t t = 0; t < mesh_shape[dim]; ++t) {
        index[ndim - 1] = t;
        int64_t flat = 0;
        for (int k = 0; k < ndim; ++k) flat += index[k] * strides[perm[k]];
        group_ranks.push_back(mesh_ranks[static_cast<size_t>(flat)]);
      }
      auto group = world->new_group(group_ranks);
      if (group != nullptr) mesh->groups_[dim] = std::move(group);
    }
  }
  return mesh;
}

int64_t DeviceMesh::size() const { return static_cast<int64_t>(ranks_.size()); }

int DeviceMesh::NormalizeDim(int dim) const {
  const int d = dim < 0 ? dim + ndim() : dim;
  FSDP_CHECK(d >= 0 && d < ndim(), "DeviceMesh: dim ", dim, " out of range for ", str());
  return d;
}

int64_t DeviceMesh::size(int dim) const { return shape_[NormalizeDim(dim)]; }

int DeviceMesh::DimIndex(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, it != names_.end(), "DeviceMesh: no mesh dim named '", name,
                  "' in ", str());
  return static_cast<int>(it - names_.begin());
}

Tensor DeviceMesh::mesh_tensor() const {
  return Tensor::from_int64s(std::vector<int64_t>(ranks_.begin(), ranks_.end()), shape_);
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(int dim) const {
  return groups_[NormalizeDim(dim)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(const std::string& mesh_dim_name) const {
  return groups_[DimIndex(mesh_dim_name)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group() const {
  FSDP_CHECK(ndim() == 1, "DeviceMesh::get_group() without a dim needs a 1-D mesh, got ", str());
  return groups_[0];
}

std::optional<std::vector<int64_t>> DeviceMesh::get_coordinate() const { return coordinate_; }

int64_t DeviceMesh::get_local_rank(int dim) const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, coordinate_.has_value(), "DeviceMesh: rank ",
                  global_rank_, " is not in ", str());
  return (*coordinate_)[NormalizeDim(dim)];
}

int64_t DeviceMesh::get_local_rank(const std::string& mesh_dim_name) const {
  return get_local_rank(DimIndex(mesh_dim_name));
}

std::shared_ptr<DeviceMesh> DeviceMesh::operator[](const std::string& mesh_dim_name) const {
  return slice({mesh_dim_name});
}

std::shared_ptr<DeviceMesh> DeviceMesh::slice(const std::vector<std::string>& names) const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, coordinate_.has_value(), "DeviceMesh: rank ",
                  global_rank_, " is not in ", str(), "; it has no sub-mesh");
  FSDP_CHECK(!names.empty(), "DeviceMesh::slice: no dim names given for ", str());
  std::vector<int> dims;
  for (const auto& name : names) dims.push_back(DimIndex(name));
  FSDP_CHECK(std::set<int>(dims.begin(), dims.end()).size() == dims.size(),
             "DeviceMesh::slice: repeated dim names ", NamesStr(names));
  auto sub = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  sub->device_type_ = device_type_;
  sub->names_ = names;
  sub->global_rank_ = global_rank_;
  const auto strides = Strides(shape_);
  std::vector<int64_t> coord(dims.size(), 0);
  std::vector<int64_t> sub_shape;
  for (int d : dims) {
    sub_shape.push_back(shape_[d]);
    sub->groups_.push_back(groups_[d]);
  }
  sub->shape_ = sub_shape;
  const int64_t n = Product(sub_shape);
  for (int64_t flat_sub = 0; flat_sub < n; ++flat_sub) {
    // The mesh coordinate: this rank's, with the selected dims replaced.
    std::vector<int64_t> full = *coordinate_;
    int64_t rest = flat_sub;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
      full[dims[k]] = rest % sub_shape[k];
      rest /= sub_shape[k];
    }
    int64_t flat = 0;
    for (int d = 0; d < ndim(); ++d) flat += full[d] * strides[d];
    sub->ranks_.push_back(ranks_[static_cast<size_t>(flat)]);
  }
  std::vector<int64_t> sub_coord;
  for (int d : dims) sub_coord.push_back((*coordinate_)[d]);
  sub->coordinate_ = sub_coord;
  return sub;
}

std::string DeviceMesh::str() const {
  std::ostringstream os;
  os << "DeviceMesh('" << device_type_ << "', ";
  // Nested lists, row-major.
  const auto strides = Strides(shape_);
  std::function<void(int, int64_t)> emit = [&](int d, int64_t base) {
    os << "[";
    for (int64_t i = 0; i < shape_[d]; ++i) {
      if (i) os << ", ";
      if (d + 1 == ndim()) {
        os << ranks_[static_cast<size_t>(base + i)];
      } else {
        emit(d + 1, base + i * strides[d]);
      }
    }
    os << "]";
  };
  if (!shape_.empty()) emit(0, 0);
  if (!names_.empty()) os << ", mesh_dim_names=" << NamesStr(names_);
  os << ")";
  return os.str();
}

}  // namespace fsdp::distributed
