#include "engine/tensor_parallel/dtensor.h"

#include <sstream>
#include <utility>

#include "engine/autograd/function.h"
#include "engine/core/error.h"
#include "engine/distributed/functional_collectives.h"
#include "engine/tensor_parallel/redistribute.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::DeviceMesh;
using GradSlot = std::shared_ptr<DTensor::GradPlacements>;

std::string ShapeStr(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

// The placements a gradient arriving with `grad` is brought to on its way back to a source
// with `source` placements (PyTorch's Redistribute backward): a Shard or Replicate gradient
// of a Partial source becomes Replicate (a replicated gradient is not partitioned again); a
// Partial gradient of a Partial source stays Partial; everything else takes the source's
// placement.
Placements BackwardPlacements(const Placements& grad, const Placements& source) {
  Placements out = source;
  for (size_t i = 0; i < out.size(); ++i) {
    if (source[i].is_partial() && !grad[i].is_partial()) out[i] = Placement::Replicate();
  }
  return out;
}

// Fills `slot` with the placements of the gradient arriving at its DTensor now; a second
// consumer in the same backward must agree.
void FillGradSlot(const GradSlot& slot, const Placements& placements) {
  if (slot->placements && *slot->placements != placements) {
    FSDP_THROW(ErrorCode::kInvalidArgument, "DTensor gradients with different placements ",
               PlacementsStr(*slot->placements), " and ", PlacementsStr(placements),
               " reach the same DTensor; accumulating them is not supported");
  }
  slot->placements = placements;
}

}  // namespace

DTensor::DTensor(Tensor local, std::shared_ptr<DeviceMesh> mesh, Placements placements, Shape shape,
                 GradSlot grad)
    : local_(std::move(local)),
      mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      shape_(std::move(shape)),
      grad_(std::move(grad)) {}

Placements DTensor::TakeGradPlacements() const {
  Placements placements = grad_->placements.value_or(placements_);
  grad_->placements.reset();
  return placements;
}

DTensor DTensor::from_local(const Tensor& local, std::shared_ptr<DeviceMesh> mesh,
                            const Placements& placements, std::optional<Shape> shape) {
  FSDP_CHECK(mesh != nullptr, "DTensor.from_local: device_mesh is null");
  FSDP_CHECK(local.defined(), "DTensor.from_local: local_tensor is undefined");
  const Placements normalized =
      NormalizePlacements(placements, *mesh, local.dim(), "DTensor.from_local");
  Shape global = local.sizes();
  if (shape) {
    FSDP_CHECK(shape->size() == global.size(), "DTensor.from_local: shape ", ShapeStr(*shape),
               " has ", shape->size(), " dims but the local tensor ", ShapeStr(global), " has ",
               global.size());
    global = *shape;
    const Shape expected = ComputeLocalShape(global, *mesh, normalized);
    FSDP_CHECK(expected == local.sizes(), "DTensor.from_local: the local tensor ",
               ShapeStr(local.sizes()), " is not rank ", mesh->get_rank(), "'s piece ",
               ShapeStr(expected), " of shape ", ShapeStr(global), " with placements ",
               PlacementsStr(normalized), " on ", mesh->str());
  } else {
    for (int i = 0; i < mesh->ndim(); ++i) {
      const Placement& p = normalized[static_cast<size_t>(i)];
      if (p.is_shard()) global[static_cast<size_t>(p.dim())] *= mesh->size(i);
    }
  }
  auto slot = std::make_shared<GradPlacements>();
  DTensor out(Tensor(), mesh, normalized, global, slot);
  // _FromTorchTensor: identity forward; backward brings the gradient to `normalized`.
  out.local_ = autograd::ApplyFunction(
      "_FromTorchTensorBackward", {local},
      [](autograd::FunctionCtx&, const autograd::TensorList& in) { return in; },
      [slot, mesh, normalized, global](autograd::FunctionCtx&, const autograd::TensorList& grads) {
        const Placements grad_placements = slot->placements.value_or(normalized);
        slot->placements.reset();
        return autograd::TensorList{redistribute_local_tensor(
            grads[0], *mesh, grad_placements, normalized, global, /*is_backward=*/true)};
      })[0];
  return out;
}

Tensor DTensor::to_local(std::optional<Placements> grad_placements) const {
  const Placements declared =
      grad_placements
          ? NormalizePlacements(*grad_placements, *mesh_, static_cast<int64_t>(shape_.size()),
                                "DTensor.to_local(grad_placements)")
          : placements_;
  GradSlot slot = grad_;
  // _ToTorchTensor: identity; backward declares the gradient's placements.
  return autograd::ApplyFunction(
      "_ToTorchTensorBackward", {local_},
      [](autograd::FunctionCtx&, const autograd::TensorList& in) { return in; },
      [slot, declared](autograd::FunctionCtx&, const autograd::TensorList& grads) {
        FillGradSlot(slot, declared);
        return grads;
      })[0];
}

DTensor DTensor::redistribute(const Placements& placements) const {
  const Placements target = NormalizePlacements(
      placements, *mesh_, static_cast<int64_t>(shape_.size()), "DTensor.redistribute");
  if (target == placements_) return *this;  // as PyTorch: no node, no communication
  const Placements source = placements_;
  auto out_slot = std::make_shared<GradPlacements>();
  GradSlot in_slot = grad_;
  std::shared_ptr<DeviceMesh> mesh = mesh_;
  const Shape shape = shape_;
  Tensor local = autograd::ApplyFunction(
      "RedistributeBackward", {local_},
      [&](autograd::FunctionCtx&, const autograd::TensorList& in) {
        return autograd::TensorList{
            redistribute_local_tensor(in[0], *mesh, source, target, shape, false)};
      },
      [out_slot, in_slot, mesh, source, target, shape](autograd::FunctionCtx&,
                                                       const autograd::TensorList& grads) {
        const Placements grad_placements = out_slot->placements.value_or(target);
        out_slot->placements.reset();
        const Placements grad_target = BackwardPlacements(grad_placements, source);
        Tensor grad = redistribute_local_tensor(grads[0], *mesh, grad_placements, grad_target,
                                                shape, /*is_backward=*/true);
        FillGradSlot(in_slot, grad_target);
        return autograd::TensorList{grad};
      })[0];
  return DTensor(local, mesh_, target, shape_, out_slot);
}

Tensor DTensor::full_tensor(std::optional<Placements> grad_placements) const {
  return redistribute(Placements(static_cast<size_t>(mesh_->ndim()), Placement::Replicate()))
      .to_local(std::move(grad_placements));
}

std::string DTensor::str() const {
  std::ostringstream out;
  out << "DTensor(local_tensor=" << ShapeStr(local_.sizes()) << ", device_mesh=" << mesh_->str()
      << ", placements=" << PlacementsStr(placements_) << ", shape=" << ShapeStr(shape_) << ")";
  return out.str();
}

DTensor distribute_tensor(const Tensor& tensor, std::shared_ptr<DeviceMesh> mesh,
                          const Placements& placements, std::optional<int> src_data_rank) {
  FSDP_CHECK(mesh != nullptr, "distribute_tensor: device_mesh is null");
  FSDP_CHECK(tensor.defined(), "distribute_tensor: tensor is undefined");
  const Placements normalized =
      NormalizePlacements(placements, *mesh, tensor.dim(), "distribute_tensor");
  Tensor full = tensor.detach();
  if (src_data_rank) {
    for (int i = 0; i < mesh->ndim(); ++i) {
      FSDP_CHECK(*src_data_rank >= 0 && *src_data_rank < mesh->size(i),
                 "distribute_tensor: src_data_rank ", *src_data_rank, " is not a rank of mesh dim ",
                 i, " (size ", mesh->size(i), ")");
      full = distributed::funcol::broadcast(full, *src_data_rank, *mesh->get_group(i));
    }
  }
  Tensor local = redistribute_local_tensor(
      full, *mesh, Placements(static_cast<size_t>(mesh->ndim()), Placement::Replicate()),
      normalized, full.sizes());
  if (local.is_same(tensor) || local.storage() == tensor.storage()) local = local.clone();
  local.set_requires_grad(tensor.requires_grad());
  return DTensor(local, mesh, normalized, tensor.sizes(),
                 std::make_shared<DTensor::GradPlacements>());
}

}  // namespace fsdp::tensor_parallel
