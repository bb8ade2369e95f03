#include "conformance/sharded_transformer.h"

#include <utility>

#include "conformance/case_inputs.h"
#include "conformance/fsdp_params.h"
#include "engine/nn/checkpoint.h"

namespace fsdp::conformance {

std::shared_ptr<nn::Transformer> ShardedTransformer(
    const RankEnv& env, std::optional<fsdp2::ReshardAfterForward> raf,
    const std::string& checkpoint_impl, std::shared_ptr<distributed::DeviceMesh> mesh) {
  nn::ModelArgs args;
  args.n_layers = env.params.GetInt("n_layers");
  args.dropout_p = 0.0;
  args.checkpoint_activations = checkpoint_impl == "utils";
  auto model = std::make_shared<nn::Transformer>(args);
  model->load_state_dict(env.Inputs().weights());
  model->to(env.device);  // cuda:<local rank> on GPU backends
  fsdp2::FullyShardOptions options;
  options.process_group = env.pg;
  options.mesh = std::move(mesh);
  options.semantics = SemanticsOf(env.params);
  options.reshard_after_forward = raf;
  for (const nn::ModulePtr& block : model->layers()) {
    if (checkpoint_impl == "composable") nn::checkpoint(block);
    fsdp2::fully_shard(block, options);
  }
  fsdp2::fully_shard(model, options);
  return model;
}

Tensor TransformerTokens(const RankEnv& env) {
  return env.Inputs().Get(StepInputName(0)).to(env.device);
}

}  // namespace fsdp::conformance
