// The engine-side models of seed 003 (test_fsdp_tp_integration.py) that the model zoo does not
// hold, in the zoo's style (an engine module whose oracle twin lives in reference/models.h):
//
//   TpExtensionModel   the seed's `TestModel` of test_fsdp_tp_extension_grad: mlp = MLPModule,
//                      mlp_norm = RMSNormPython(10); forward mlp(mlp_norm(x)) (oracle:
//                      reference::MlpWithRmsNorm).
//   MakeSyncStateModel the seed's `TestModel` of test_fsdp_tp_sync_module_state: a parameter
//                      `param` that is a Replicate() DTensor over the TP mesh (from_local,
//                      run_check=False) and a buffer `buf` (the seed's DTensor buffer: its
//                      local tensor, which is what the seed reads back).
//
// SimpleModel is engine/nn/models.h's (oracle: reference::TpSimpleModel).
// Ownership: modules are shared like any module. Thread-safety: a module belongs to the rank
// thread that built it.
#pragma once

#include <memory>

#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

class TpExtensionModel : public nn::Module {
 public:
  TpExtensionModel();
  nn::Value forward(const nn::Value& x) override;
};

// `param` and `buf` are this rank's tensors (each rank its own values, as the seed's
// torch.manual_seed(mesh_2d.get_rank())).
nn::ModulePtr MakeSyncStateModel(const Tensor& param, const Tensor& buf,
                                 const std::shared_ptr<distributed::DeviceMesh>& tp_mesh);

}  // namespace fsdp::conformance
