#include "conformance/fsdp_state_dict_models.h"

#include <set>

#include "engine/core/error.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"

namespace fsdp::conformance {
namespace {

// TestDummyModel: net1 = Sequential(Linear(8, 16), ReLU()), net2 = Sequential(Linear(16, 16),
// ReLU()), net3 = net2, random_parameter [10] registered again as shared_parameter.
class DummyModel : public nn::Cloneable<DummyModel> {
 public:
  DummyModel() : nn::Cloneable<DummyModel>("TestDummyModel") {
    register_module("net1", std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
                                std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>()}));
    auto net2 = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>()});
    register_module("net2", net2);
    register_module("net3", net2);
    Tensor p = register_parameter("random_parameter", Tensor::randn({10}));
    register_parameter("shared_parameter", p);
  }
};

// Model(wrap_fsdp, register_buffers=True): inner Linear(4, 4), outer Linear(4, 5), each with a
// persistent "buffer" [5, 5] and a non-persistent one.
class SeedModel : public nn::Cloneable<SeedModel> {
 public:
  SeedModel() : nn::Cloneable<SeedModel>("Model") {
    for (const auto& [name, out] : {std::pair<const char*, int64_t>{"inner", 4}, {"outer", 5}}) {
      auto lin = register_module(name, std::make_shared<nn::Linear>(4, out));
      lin->register_buffer("buffer", Tensor::randn({5, 5}));
      lin->register_buffer("non_persistent_buffer", Tensor::randn({5, 5}), /*persistent=*/false);
    }
  }
  // i = inner(x); j = inner(x); outer(i + j).
  nn::Value forward(const nn::Value& x) override {
    const Tensor i = call_child("inner", x).tensor();
    const Tensor j = call_child("inner", x).tensor();
    return call_child("outer", nn::Value(fsdp::add(i, j)));
  }
};

// FSDPContainer: non_fsdp_lin, then fsdp_1 and fsdp_2 (simple nested models) in forward.
class ContainerModel : public nn::Cloneable<ContainerModel> {
 public:
  ContainerModel() : nn::Cloneable<ContainerModel>("FSDPContainer") {
    register_module("non_fsdp_lin", std::make_shared<nn::Linear>(10, 10, false));
    for (const char* name : {"fsdp_1", "fsdp_2"}) {
      register_module(name, std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
                                std::make_shared<nn::Linear>(10, 10, false),
                                std::make_shared<nn::Linear>(10, 10, false)}));
    }
  }
  nn::Value forward(const nn::Value& x) override {
    return call_child("fsdp_2", call_child("fsdp_1", call_child("non_fsdp_lin", x)));
  }
};

// A module whose only parameter is my_parameter = [3.1415926].
class OneElementModel : public nn::Cloneable<OneElementModel> {
 public:
  OneElementModel() : nn::Cloneable<OneElementModel>("Model") {
    register_parameter("my_parameter", Tensor::full({1}, 3.1415926));
  }
};

fsdp1::FullyShardedDataParallelOptions BaseOptions(
    const std::shared_ptr<distributed::ProcessGroup>& pg, const StateDictModelOptions& o) {
  fsdp1::FullyShardedDataParallelOptions options;
  options.process_group = pg;
  options.use_orig_params = o.use_orig_params;
  options.cpu_offload.offload_params = o.cpu_offload;
  options.sync_module_states = o.sync_module_states;
  if (o.mixed_precision) {
    options.mixed_precision.param_dtype = DType::kFloat16;
    options.mixed_precision.reduce_dtype = DType::kFloat16;
    options.mixed_precision.buffer_dtype = DType::kFloat16;
  }
  return options;
}

nn::ModulePtr MaybeCheckpoint(const nn::ModulePtr& module, const StateDictModelOptions& o) {
  return o.checkpoint == "wrap" ? nn::checkpoint_wrapper(module) : module;
}

}  // namespace

const std::vector<std::string>& StateDictModelNames() {
  static const std::vector<std::string> names = {"simple", "simple_nested", "multibuffer_nested",
                                                 "model", "transformer", "dummy", "one_element",
                                                 "transformer_manual", "container"};
  return names;
}

nn::ModulePtr BuildPlainStateDictModel(const std::string& name) {
  if (name == "simple") return std::make_shared<nn::Linear>(10, 10, false);
  if (name == "simple_nested" || name == "multibuffer_nested") {
    std::vector<nn::ModulePtr> layers = {std::make_shared<nn::Linear>(10, 10, false)};
    if (name == "multibuffer_nested") layers.push_back(std::make_shared<nn::BatchNorm1d>(10));
    layers.push_back(std::make_shared<nn::Linear>(10, 10, false));
    return std::make_shared<nn::Sequential>(layers);
  }
  if (name == "model") return std::make_shared<SeedModel>();
  if (name == "transformer" || name == "transformer_manual") {
    return std::make_shared<nn::TransformerWithSharedParams>(0, /*add_bn=*/false, true);
  }
  if (name == "dummy") return std::make_shared<DummyModel>();
  if (name == "one_element") return std::make_shared<OneElementModel>();
  if (name == "container") return std::make_shared<ContainerModel>();
  FSDP_THROW(ErrorCode::kInvalidArgument, "fsdp_state_dict: unknown model '", name, "'");
}

std::vector<std::string> StateDictModelInstances(const std::string& name) {
  if (name == "simple_nested") return {"", "0"};
  if (name == "multibuffer_nested") return {"", "0", "1"};
  if (name == "model") return {"", "inner"};
  if (name == "transformer") {
    return {"", "transformer.encoder.layers.0", "transformer.encoder.layers.1",
            "transformer.decoder.layers.0", "transformer.decoder.layers.1"};
  }
  if (name == "container") return {"fsdp_1", "fsdp_1.0", "fsdp_2", "fsdp_2.0"};
  if (name == "transformer_manual") {
    return {"transformer", "transformer.encoder.layers.0", "transformer.encoder.layers.1",
            "transformer.decoder.layers.0", "transformer.decoder.layers.1"};
  }
  BuildPlainStateDictModel(name);  // throws for an unknown name
  return {""};
}

bool ManagedByFsdp(const std::string& name, const std::string& key) {
  for (const std::string& p : StateDictModelInstances(name)) {
    if (p.empty() || key.rfind(p + ".", 0) == 0) return true;
  }
  return false;
}

nn::ModulePtr WrapStateDictModel(const std::string& name, const nn::ModulePtr& plain,
                                 const std::shared_ptr<distributed::ProcessGroup>& pg,
                                 const StateDictModelOptions& o) {
  fsdp1::FullyShardedDataParallelOptions options = BaseOptions(pg, o);
  nn::ModulePtr root;
  if (name == "container") {
    for (const char* child : {"fsdp_1", "fsdp_2"}) {
      plain->register_module(child, WrapStateDictModel("simple_nested", plain->child(child), pg, o));
    }
    return plain;
  }
  if (name == "transformer_manual") {
    for (const char* stack : {"transformer.encoder.layers", "transformer.decoder.layers"}) {
      nn::ModulePtr layers = plain->get_submodule(stack);
      for (const auto& [index, layer] : layers->named_children()) {
        layers->register_module(index, std::make_shared<fsdp1::FullyShardedDataParallel>(
                                           MaybeCheckpoint(layer, o), options));
      }
    }
    plain->register_module("transformer", std::make_shared<fsdp1::FullyShardedDataParallel>(
                                              plain->child("transformer"), options));
    return plain;
  }
  if (name == "simple_nested" || name == "multibuffer_nested") {
    auto seq = std::static_pointer_cast<nn::Sequential>(plain);
    const auto wrap_child = [&](const std::string& child, fsdp1::FullyShardedDataParallelOptions opts) {
      seq->register_module(child, std::make_shared<fsdp1::FullyShardedDataParallel>(
                                      MaybeCheckpoint(seq->child(child), o), opts));
    };
    wrap_child("0", options);
    if (name == "multibuffer_nested") {
      fsdp1::FullyShardedDataParallelOptions bn = options;
      if (o.mixed_precision) {
        bn.mixed_precision.param_dtype = DType::kFloat32;
        bn.mixed_precision.reduce_dtype = DType::kFloat32;
        bn.mixed_precision.buffer_dtype = DType::kFloat32;
      }
      wrap_child("1", bn);
    }
    const std::string last = name == "multibuffer_nested" ? "2" : "1";
    seq->register_module(last, MaybeCheckpoint(seq->child(last), o));
    root = std::make_shared<fsdp1::FullyShardedDataParallel>(MaybeCheckpoint(seq, o), options);
  } else if (name == "model") {
    plain->register_module("inner", std::make_shared<fsdp1::FullyShardedDataParallel>(
                                        plain->child("inner"), options));
    root = std::make_shared<fsdp1::FullyShardedDataParallel>(plain, options);
  } else if (name == "transformer") {
    options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
        std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
    root = std::make_shared<fsdp1::FullyShardedDataParallel>(plain, options);
  } else {
    root = std::make_shared<fsdp1::FullyShardedDataParallel>(MaybeCheckpoint(plain, o), options);
  }
  if (o.checkpoint == "after_wrap") {
    nn::apply_activation_checkpointing(
        root, [](nn::Module& m) { return m.type_name() == "Linear"; });
  }
  return root;
}

}  // namespace fsdp::conformance
