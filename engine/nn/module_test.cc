#include "engine/nn/module.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/rank_context.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"

namespace fsdp::nn {
namespace {

using Names = std::vector<std::string>;

template <typename Pairs>
Names NamesOf(const Pairs& pairs) {
  Names out;
  for (const auto& p : pairs) out.push_back(p.first);
  return out;
}

Names Keys(const StateDict& sd) { return sd.keys(); }

// The module of docs/modules.md, "[Note: the naming example]" (verified against PyTorch): B has
// a buffer
// `rb` and a child `lin`; the root registers a, shared = a, layers = [B, B], seq, tied (weight
// tied to seq.0.weight), a non-persistent buffer np and, last, a parameter p.
class B : public Cloneable<B> {
 public:
  B() : Cloneable<B>("B") {
    register_buffer("rb", Tensor::zeros({2}));
    register_module("lin", std::make_shared<Linear>(2, 2));
  }
  Value forward(const Value& x) override { return call_child("lin", x); }
};

class M : public Cloneable<M> {
 public:
  M() : Cloneable<M>("M") {
    auto a = register_module("a", std::make_shared<B>());
    register_module("shared", a);
    register_module("layers", std::make_shared<ModuleList>(std::vector<ModulePtr>{
                                  std::make_shared<B>(), std::make_shared<B>()}));
    auto seq =
        register_module("seq", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                   std::make_shared<Linear>(2, 2), std::make_shared<ReLU>()}));
    auto tied = register_module("tied", std::make_shared<Linear>(2, 2, /*bias=*/false));
    tied->register_parameter("weight", seq->child_as<Linear>("0")->weight());
    register_buffer("np", Tensor::zeros({1}), /*persistent=*/false);
    register_parameter("p", Tensor::zeros({3}));
  }
};

TEST(ModuleNaming, VerifiedExampleNamedModules) {
  auto m = std::make_shared<M>();
  EXPECT_EQ(NamesOf(m->named_modules()),
            (Names{"", "a", "a.lin", "layers", "layers.0", "layers.0.lin", "layers.1",
                   "layers.1.lin", "seq", "seq.0", "seq.1", "tied"}));
  EXPECT_EQ(NamesOf(m->named_modules("", /*remove_duplicate=*/false)),
            (Names{"", "a", "a.lin", "shared", "shared.lin", "layers", "layers.0", "layers.0.lin",
                   "layers.1", "layers.1.lin", "seq", "seq.0", "seq.1", "tied"}));
  EXPECT_EQ(NamesOf(m->named_children()), (Names{"a", "layers", "seq", "tied"}));
  EXPECT_EQ(NamesOf(m->named_modules("model")).at(1), "model.a");
}

TEST(ModuleNaming, VerifiedExampleParametersBuffersStateDict) {
  auto m = std::make_shared<M>();
  // Own parameters first even though p was registered last; tied.weight dropped.
  EXPECT_EQ(NamesOf(m->named_parameters()),
            (Names{"p", "a.lin.weight", "a.lin.bias", "layers.0.lin.weight", "layers.0.lin.bias",
                   "layers.1.lin.weight", "layers.1.lin.bias", "seq.0.weight", "seq.0.bias"}));
  EXPECT_EQ(NamesOf(m->named_parameters("", true, /*remove_duplicate=*/false)),
            (Names{"p", "a.lin.weight", "a.lin.bias", "shared.lin.weight", "shared.lin.bias",
                   "layers.0.lin.weight", "layers.0.lin.bias", "layers.1.lin.weight",
                   "layers.1.lin.bias", "seq.0.weight", "seq.0.bias", "tied.weight"}));
  EXPECT_EQ(NamesOf(m->named_parameters("", /*recurse=*/false)), (Names{"p"}));
  // named_buffers includes the non-persistent buffer.
  EXPECT_EQ(NamesOf(m->named_buffers()), (Names{"np", "a.rb", "layers.0.rb", "layers.1.rb"}));
  EXPECT_EQ(Keys(m->state_dict()),
            (Names{"p", "a.rb", "a.lin.weight", "a.lin.bias", "shared.rb", "shared.lin.weight",
                   "shared.lin.bias", "layers.0.rb", "layers.0.lin.weight", "layers.0.lin.bias",
                   "layers.1.rb", "layers.1.lin.weight", "layers.1.lin.bias", "seq.0.weight",
                   "seq.0.bias", "tied.weight"}));
  StateDict sd = m->state_dict();
  EXPECT_EQ(sd.metadata.keys(),
            (Names{"", "a", "a.lin", "shared", "shared.lin", "layers", "layers.0", "layers.0.lin",
                   "layers.1", "layers.1.lin", "seq", "seq.0", "seq.1", "tied"}));
  // Values are detached aliases of the parameters.
  EXPECT_FALSE(sd.at("p").requires_grad());
  EXPECT_EQ(sd.at("p").storage(), m->parameter("p").storage());
  EXPECT_TRUE(m->state_dict("", /*keep_vars=*/true).at("p").is_same(m->parameter("p")));
  EXPECT_EQ(Keys(m->state_dict("model.")).front(), "model.p");
}

TEST(ModuleStateDict, LoadErrorTextMatchesPyTorch) {
  auto m = std::make_shared<M>();
  StateDict sd = m->state_dict();
  sd.erase("p");
  sd.erase("layers.1.lin.bias");
  sd.insert("bogus", Tensor::zeros({1}));
  sd.insert("layers.5.x", Tensor::zeros({1}));
  sd.insert("a.lin.weight", Tensor::zeros({3, 3}));
  try {
    m->load_state_dict(sd);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(),
              "Error(s) in loading state_dict for M:\n\tMissing key(s) in state_dict: \"p\", "
              "\"layers.1.lin.bias\". \n\tUnexpected key(s) in state_dict: \"bogus\", "
              "\"layers.5.x\". \n\tsize mismatch for a.lin.weight: copying a param with shape "
              "torch.Size([3, 3]) from checkpoint, the shape in current model is "
              "torch.Size([2, 2]).");
  }
  // Size mismatches raise even when not strict.
  EXPECT_THROW(m->load_state_dict(sd, /*strict=*/false), Error);
  sd.insert("a.lin.weight", Tensor::zeros({2, 2}));
  IncompatibleKeys keys = m->load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(keys.missing_keys, (Names{"p", "layers.1.lin.bias"}));
  EXPECT_EQ(keys.unexpected_keys, (Names{"bogus", "layers.5.x"}));
}

TEST(ModuleStateDict, LoadCopiesIntoExistingTensorsAndVisitsEveryPath) {
  auto src = std::make_shared<M>();
  auto dst = std::make_shared<M>();
  Tensor dst_seq_weight = dst->get_parameter("seq.0.weight");
  StateDict sd = src->state_dict();
  // The tied weight is loaded twice (seq.0.weight, then tied.weight); the last value wins.
  sd.insert("tied.weight", Tensor::full({2, 2}, 7.0));
  IncompatibleKeys keys = dst->load_state_dict(sd);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  EXPECT_TRUE(dst->get_parameter("seq.0.weight").is_same(dst_seq_weight));
  EXPECT_EQ(dst_seq_weight.to_doubles(), (std::vector<double>(4, 7.0)));
  EXPECT_EQ(dst->get_parameter("a.lin.bias").to_doubles(),
            src->get_parameter("a.lin.bias").to_doubles());
  // A key for a None parameter (Linear without bias) is unexpected; a key naming a child is too.
  StateDict extra = src->state_dict();
  extra.insert("tied.bias", Tensor::zeros({2}));
  extra.insert("seq", Tensor::zeros({1}));
  keys = dst->load_state_dict(extra, /*strict=*/false);
  EXPECT_EQ(keys.unexpected_keys, (Names{"seq", "tied.bias"}));
  // _extra_state keys are ignored.
  extra = src->state_dict();
  extra.insert("_extra_state", Tensor::zeros({1}));
  EXPECT_TRUE(dst->load_state_dict(extra).unexpected_keys.empty());
}

TEST(ModuleStateDict, AssignReplacesSlotsAndKeepsRequiresGrad) {
  auto lin = std::make_shared<Linear>(2, 3);
  Tensor old_weight = lin->weight();
  StateDict sd;
  sd.insert("weight", Tensor::full({3, 2}, 1.5));
  sd.insert("bias", Tensor::full({3}, -1.0));
  lin->load_state_dict(sd, /*strict=*/true, /*assign=*/true);
  EXPECT_FALSE(lin->weight().is_same(old_weight));
  EXPECT_TRUE(lin->weight().requires_grad());
  EXPECT_EQ(lin->weight().storage(), sd.at("weight").storage());
  EXPECT_EQ(lin->bias().to_doubles(), (std::vector<double>(3, -1.0)));
}

TEST(ModuleStateDict, NonPersistentBuffersAndStateDictSeedModel) {
  auto model = std::make_shared<StateDictModel>(/*register_buffers=*/true);
  EXPECT_EQ(NamesOf(model->named_buffers()),
            (Names{"inner.buffer", "inner.non_persistent_buffer", "outer.buffer",
                   "outer.non_persistent_buffer"}));
  EXPECT_EQ(Keys(model->state_dict()), (Names{"inner.weight", "inner.bias", "inner.buffer",
                                              "outer.weight", "outer.bias", "outer.buffer"}));
  EXPECT_EQ(model->get_buffer("inner.buffer").sizes(), (Shape{5, 5}));
  EXPECT_EQ(model->get_parameter("outer.weight").sizes(), (Shape{5, 4}));
}

TEST(ModuleStateDict, HooksRewriteKeys) {
  auto seq = std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<Linear>(2, 2)});
  std::vector<std::string> events;
  seq->register_state_dict_pre_hook([&](Module& m, const std::string& prefix, bool) {
    events.push_back("pre:" + m.type_name() + prefix);
  });
  seq->register_state_dict_post_hook([&](Module&, StateDict& sd, const std::string& prefix) {
    events.push_back("post" + prefix);
    sd.insert(prefix + "extra", Tensor::zeros({1}));
  });
  StateDict sd = seq->state_dict("root.");
  EXPECT_EQ(Keys(sd), (Names{"root.0.weight", "root.0.bias", "root.extra"}));
  EXPECT_EQ(events, (Names{"pre:Sequentialroot.", "postroot."}));

  // A load pre-hook may rename keys for the module and its children; post-hooks may edit the
  // shared lists (child hooks run before the parent's).
  auto child = seq->child("0");
  std::vector<std::string> post_order;
  child->register_load_state_dict_post_hook(
      [&](Module&, IncompatibleKeys&) { post_order.push_back("child"); });
  seq->register_load_state_dict_post_hook([&](Module&, IncompatibleKeys& keys) {
    post_order.push_back("root");
    keys.unexpected_keys.clear();
  });
  seq->register_load_state_dict_pre_hook([](Module&, StateDict& local, const std::string& prefix,
                                            LoadStateDictState&) {
    StateDict renamed;
    for (const auto& [k, v] : local) {
      renamed.insert(
          k.rfind(prefix + "old.", 0) == 0 ? prefix + "0." + k.substr(prefix.size() + 4) : k, v);
    }
    local = renamed;
  });
  StateDict old_names;
  old_names.insert("old.weight", Tensor::ones({2, 2}));
  old_names.insert("old.bias", Tensor::ones({2}));
  old_names.insert("junk", Tensor::ones({2}));
  IncompatibleKeys keys = seq->load_state_dict(old_names);
  EXPECT_TRUE(keys.unexpected_keys.empty());
  EXPECT_EQ(post_order, (Names{"child", "root"}));
  EXPECT_EQ(seq->get_parameter("0.weight").to_doubles(), (std::vector<double>(4, 1.0)));
}

TEST(ModuleNaming, TestDummyModelSharedModuleAndParameter) {
  auto model = std::make_shared<TestDummyModel>();
  EXPECT_EQ(NamesOf(model->named_modules()),
            (Names{"", "net1", "net1.0", "net1.1", "net2", "net2.0", "net2.1"}));
  EXPECT_EQ(
      NamesOf(model->named_parameters()),
      (Names{"random_parameter", "net1.0.weight", "net1.0.bias", "net2.0.weight", "net2.0.bias"}));
  EXPECT_EQ(NamesOf(model->named_parameters("", true, false)),
            (Names{"random_parameter", "shared_parameter", "net1.0.weight", "net1.0.bias",
                   "net2.0.weight", "net2.0.bias", "net3.0.weight", "net3.0.bias"}));
  EXPECT_EQ(Keys(model->state_dict()),
            (Names{"random_parameter", "shared_parameter", "net1.0.weight", "net1.0.bias",
                   "net2.0.weight", "net2.0.bias", "net3.0.weight", "net3.0.bias"}));
  EXPECT_EQ(model->parameters().size(), 5u);
  EXPECT_TRUE(model->child("net3") == model->child("net2"));
  EXPECT_TRUE(model->parameter("shared_parameter").is_same(model->parameter("random_parameter")));
  EXPECT_EQ(NamesOf(model->named_children()), (Names{"net1", "net2"}));
}

TEST(ModuleRegistration, NamesAndKinds) {
  auto m = std::make_shared<Module>("Custom");
  EXPECT_THROW(m->register_parameter("a.b", Tensor::zeros({1})), Error);
  EXPECT_THROW(m->register_parameter("", Tensor::zeros({1})), Error);
  m->register_buffer("buf", Tensor::zeros({1}));
  EXPECT_THROW(m->register_parameter("buf", Tensor::zeros({1})), Error);
  EXPECT_THROW(m->register_module("buf", std::make_shared<ReLU>()), Error);
  m->register_parameter("w", Tensor::zeros({2}));
  EXPECT_TRUE(m->parameter("w").requires_grad());
  EXPECT_THROW(m->parameter("nope"), Error);
  EXPECT_THROW(m->forward(Value()), Error);
  EXPECT_THROW((*m)(Value()), Error);
  // Re-registering keeps the position.
  m->register_parameter("v", Tensor::zeros({1}));
  m->register_parameter("w", Tensor::ones({2}));
  EXPECT_EQ(NamesOf(m->named_parameters()), (Names{"w", "v"}));
  EXPECT_EQ(m->parameter("w").to_doubles(), (std::vector<double>{1, 1}));
  m->remove_parameter("w");
  EXPECT_EQ(NamesOf(m->named_parameters()), (Names{"v"}));
  // Buffers: persistence can be changed by re-registering.
  m->register_buffer("buf", Tensor::zeros({1}), /*persistent=*/false);
  EXPECT_FALSE(m->is_persistent_buffer("buf"));
  EXPECT_EQ(Keys(m->state_dict()), (Names{"v"}));
  // None entries are registered but never yielded.
  m->register_parameter("none", Tensor());
  m->register_module("none_child", nullptr);
  EXPECT_EQ(NamesOf(m->named_parameters()), (Names{"v"}));
  EXPECT_EQ(m->named_modules().size(), 1u);
  EXPECT_EQ(m->repr(), "Custom(\n  (none_child): None\n)");
}

TEST(ModuleRegistration, ParameterSlotSwapLikeFsdp) {
  auto lin = std::make_shared<Linear>(3, 2);
  Tensor sharded = lin->weight();
  Tensor unsharded = Tensor::full({2, 3}, 0.5).set_requires_grad(true);
  lin->set_parameter("weight", unsharded);
  EXPECT_TRUE(lin->weight().is_same(unsharded));
  EXPECT_TRUE(lin->named_parameters().front().second.is_same(unsharded));
  EXPECT_EQ(NamesOf(lin->named_parameters()), (Names{"weight", "bias"}));
  lin->set_parameter("weight", sharded);
  EXPECT_TRUE(lin->weight().is_same(sharded));
  EXPECT_THROW(lin->set_parameter("nope", sharded), Error);
  // get_submodule / get_parameter by FQN.
  auto model = std::make_shared<MLPStack>(4);
  EXPECT_EQ(model->get_submodule("1.in_proj")->type_name(), "Linear");
  EXPECT_EQ(model->get_parameter("2.out_proj.weight").sizes(), (Shape{4, 12}));
  EXPECT_THROW(model->get_submodule("1.nope"), Error);
  EXPECT_THROW(model->get_parameter("1.in_proj.nope"), Error);
}

TEST(ModuleRegistration, TrainEvalApplyAndRepr) {
  auto model = std::make_shared<DoubleLinear>(3);
  EXPECT_TRUE(model->is_training());
  model->eval();
  for (auto& m : model->modules()) EXPECT_FALSE(m->is_training());
  model->train();
  for (auto& m : model->modules()) EXPECT_TRUE(m->is_training());
  std::vector<std::string> visited;
  model->apply([&](Module& m) { visited.push_back(m.type_name()); });
  EXPECT_EQ(visited, (Names{"Linear", "Linear", "ReLU", "DoubleLinear"}));
  EXPECT_EQ(model->repr(),
            "DoubleLinear(\n  (lin1): Linear(in_features=3, out_features=3, bias=True)\n"
            "  (lin2): Linear(in_features=3, out_features=3, bias=True)\n  (relu): ReLU()\n)");
  auto seq = std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<ReLU>()})});
  EXPECT_EQ(seq->repr(), "Sequential(\n  (0): Sequential(\n    (0): ReLU()\n  )\n)");
}

TEST(ModuleRegistration, ToDtypeKeepsIdentityAndTying) {
  ModelArgs args;
  auto model = std::make_shared<Transformer>(args);
  Tensor tok = model->get_parameter("tok_embeddings.weight");
  model->to(DType::kFloat64);
  EXPECT_TRUE(model->get_parameter("tok_embeddings.weight").is_same(tok));
  EXPECT_EQ(tok.dtype(), DType::kFloat64);
  EXPECT_TRUE(model->get_submodule("output")->parameter("weight").is_same(tok));
  for (auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), DType::kFloat64) << name;
  EXPECT_THROW(model->to(DType::kInt64), Error);
}

TEST(ModuleRegistration, DeepCopyPreservesSharingAndTying) {
  auto model = std::make_shared<TestDummyModel>();
  model->get_parameter("random_parameter").fill_(3.0);
  ModulePtr copy = model->deep_copy();
  EXPECT_EQ(NamesOf(copy->named_parameters()), NamesOf(model->named_parameters()));
  EXPECT_EQ(Keys(copy->state_dict()), Keys(model->state_dict()));
  EXPECT_TRUE(copy->child("net3") == copy->child("net2"));
  EXPECT_FALSE(copy->child("net2") == model->child("net2"));
  EXPECT_TRUE(copy->parameter("shared_parameter").is_same(copy->parameter("random_parameter")));
  EXPECT_FALSE(copy->parameter("random_parameter").is_same(model->parameter("random_parameter")));
  EXPECT_EQ(copy->parameter("random_parameter").to_doubles(), std::vector<double>(10, 3.0));
  EXPECT_TRUE(copy->parameter("random_parameter").requires_grad());
  copy->parameter("random_parameter").fill_(1.0);
  EXPECT_EQ(model->parameter("random_parameter").to_doubles(), std::vector<double>(10, 3.0));

  auto transformer = std::make_shared<Transformer>(ModelArgs{});
  ModulePtr tcopy = transformer->deep_copy();
  EXPECT_TRUE(
      tcopy->get_parameter("output.weight").is_same(tcopy->get_parameter("tok_embeddings.weight")));
  EXPECT_EQ(tcopy->get_parameter("layers.1.feed_forward.w1.weight").to_doubles(),
            transformer->get_parameter("layers.1.feed_forward.w1.weight").to_doubles());
  EXPECT_THROW(std::make_shared<Module>("Plain")->deep_copy(), Error);
}

// ---- Forward hooks -----------------------------------------------------------------------------

class AddOne : public Cloneable<AddOne> {
 public:
  AddOne() : Cloneable<AddOne>("AddOne") {}
  std::vector<std::string>* log = nullptr;
  bool throw_in_forward = false;
  Value forward(const Value& x) override {
    if (log) log->push_back("forward");
    FSDP_CHECK(!throw_in_forward, "forward failed");
    return Value::Int(x.to_int() + 1);
  }
  Value forward_with_kwargs(const Value& args, const Value& kwargs) override {
    if (kwargs.is_dict() && kwargs.contains("extra")) {
      return Value::Int(forward(args).to_int() + kwargs.at("extra").to_int());
    }
    return Module::forward_with_kwargs(args, kwargs);
  }
};

TEST(ModuleHooks, OrderReplacementAndRemoval) {
  auto m = std::make_shared<AddOne>();
  std::vector<std::string> log;
  m->log = &log;
  auto h1 = m->register_forward_pre_hook([&](Module&, const Value& args) -> std::optional<Value> {
    log.push_back("pre1 " + args.str());
    return Value::Int(args.to_int() * 10);
  });
  m->register_forward_pre_hook(
      [&](Module&, const Value& args) -> std::optional<Value> {
        log.push_back("pre0 " + args.str());
        return std::nullopt;
      },
      {.prepend = true});
  m->register_forward_pre_hook_with_kwargs(
      [&](Module&, const Value& args,
          const Value& kwargs) -> std::optional<std::pair<Value, Value>> {
        log.push_back("prekw " + args.str() + " " + kwargs.str());
        return std::make_pair(args, Value::Dict({{"extra", Value::Int(100)}}));
      });
  auto global =
      RegisterModuleForwardPreHook([&](Module& mod, const Value&) -> std::optional<Value> {
        log.push_back("global_pre " + mod.type_name());
        return std::nullopt;
      });
  m->register_forward_hook(
      [&](Module&, const Value& args, const Value& out) -> std::optional<Value> {
        log.push_back("post1 " + args.str() + " " + out.str());
        return Value::Int(out.to_int() * 2);
      });
  m->register_forward_hook_with_kwargs(
      [&](Module&, const Value&, const Value& kwargs, const Value& out) -> std::optional<Value> {
        log.push_back("postkw " + kwargs.str() + " " + out.str());
        return std::nullopt;
      });
  m->register_forward_hook(
      [&](Module&, const Value&, const Value& out) -> std::optional<Value> {
        log.push_back("post0 " + out.str());
        return std::nullopt;
      },
      {.prepend = true});
  Value out = (*m)(Value::Int(1));
  EXPECT_EQ(out.to_int(), 222);  // (1 * 10 + 1 + 100) * 2
  EXPECT_EQ(log, (Names{"global_pre AddOne", "pre0 1", "pre1 1", "prekw 10 {}", "forward",
                        "post0 111", "post1 10 111", "postkw {'extra': 100} 222"}));
  global.remove();
  h1.remove();
  h1.remove();  // idempotent
  log.clear();
  EXPECT_EQ((*m)(Value::Int(1)).to_int(), 204);
  EXPECT_EQ(log.front(), "pre0 1");
  EXPECT_EQ(m->num_forward_pre_hooks(), 2u);
  EXPECT_EQ(m->num_forward_hooks(), 3u);
}

TEST(ModuleHooks, AlwaysCallHooksRunOnException) {
  auto m = std::make_shared<AddOne>();
  std::vector<std::string> log;
  m->log = &log;
  m->throw_in_forward = true;
  m->register_forward_hook([&](Module&, const Value&, const Value&) -> std::optional<Value> {
    log.push_back("ordinary");
    return std::nullopt;
  });
  m->register_forward_hook(
      [&](Module&, const Value& args, const Value& out) -> std::optional<Value> {
        log.push_back("always " + args.str() + " " + out.str());
        throw std::runtime_error("silenced");
      },
      {.always_call = true});
  m->register_forward_hook_with_kwargs(
      [&](Module&, const Value&, const Value& kwargs, const Value& out) -> std::optional<Value> {
        log.push_back("always_kw " + kwargs.str() + " " + out.str());
        return std::nullopt;
      },
      {.always_call = true});
  auto global = RegisterModuleForwardHook(
      [&](Module&, const Value&, const Value&) -> std::optional<Value> {
        log.push_back("global_always");
        return std::nullopt;
      },
      /*always_call=*/true);
  m->register_forward_pre_hook(
      [](Module&, const Value&) -> std::optional<Value> { return Value::Int(5); });
  EXPECT_THROW((*m)(Value::Int(1)), Error);
  EXPECT_EQ(log, (Names{"forward", "global_always", "always 5 None", "always_kw {} None"}));
  global.remove();

  // An exception in an ordinary hook: always-call hooks that already ran are not re-run.
  log.clear();
  m->throw_in_forward = false;
  auto thrower = std::make_shared<AddOne>();
  thrower->register_forward_hook(
      [&](Module&, const Value&, const Value& out) -> std::optional<Value> {
        log.push_back("first_always " + out.str());
        return std::nullopt;
      },
      {.always_call = true});
  thrower->register_forward_hook([&](Module&, const Value&, const Value&) -> std::optional<Value> {
    throw std::runtime_error("hook failed");
  });
  EXPECT_THROW((*thrower)(Value::Int(1)), std::runtime_error);
  EXPECT_EQ(log, (Names{"first_always 2"}));
}

TEST(ModuleHooks, HooksSeeChildCallsInOrder) {
  auto model = std::make_shared<DoubleLinear>(2, /*use_second_linear=*/false);
  std::vector<std::string> log;
  for (auto& [name, m] : model->named_modules()) {
    const std::string n = name.empty() ? "root" : name;
    m->register_forward_pre_hook([&log, n](Module&, const Value&) -> std::optional<Value> {
      log.push_back("pre " + n);
      return std::nullopt;
    });
    m->register_forward_hook(
        [&log, n](Module&, const Value&, const Value&) -> std::optional<Value> {
          log.push_back("post " + n);
          return std::nullopt;
        });
  }
  EXPECT_THROW((*model)(Value::Int(1)), Error);  // not a tensor: lin1 rejects it
  EXPECT_EQ(log, (Names{"pre root", "pre lin1"}));
}

TEST(ModuleTensorAttributes, HiddenFromParametersAndStateDictButReadByForward) {
  // `del lin.weight; lin.weight = w * 2` (what FSDP1 does with its views): forward reads the
  // attribute, named_parameters() and state_dict() no longer list it, registering a parameter
  // of that name removes it again.
  auto lin = std::make_shared<Linear>(2, 2);
  const Tensor weight = lin->weight().detach().clone();
  lin->remove_parameter("weight");
  const Tensor doubled = weight * 2.0;
  lin->set_tensor_attribute("weight", doubled);
  EXPECT_TRUE(lin->has_tensor_attribute("weight"));
  EXPECT_TRUE(lin->parameter("weight").is_same(doubled));
  EXPECT_EQ(NamesOf(lin->named_parameters()), Names{"bias"});
  EXPECT_EQ(Keys(lin->state_dict()), Names{"bias"});
  const Tensor x = Tensor::ones({1, 2});
  EXPECT_EQ((*lin)(x).tensor().to_doubles(), linear(x, doubled, lin->bias()).to_doubles());
  EXPECT_THROW(lin->set_tensor_attribute("bias", doubled), Error);
  lin->register_parameter("weight", weight);
  EXPECT_FALSE(lin->has_tensor_attribute("weight"));
  EXPECT_EQ(NamesOf(lin->named_parameters()), (Names{"bias", "weight"}));
}

TEST(StateDictTest, RenameMovesTheEntryAndItsShardingToTheEnd) {
  StateDict sd;
  sd.insert("a", Tensor::zeros({2}));
  sd.insert("b", Tensor::zeros({4}));
  sd.sharded.insert("a", ShardedEntry{{4}, {2}});
  sd.rename("a", "c");
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"b", "c"}));
  ASSERT_NE(sd.sharding("c"), nullptr);
  EXPECT_EQ(sd.sharding("c")->global_shape, (Shape{4}));
  EXPECT_EQ(sd.sharding("c")->offsets, (std::vector<int64_t>{2}));
  EXPECT_EQ(sd.sharding("a"), nullptr);
  EXPECT_EQ(sd.sharding("b"), nullptr);
  sd.rename("missing", "x");
  EXPECT_EQ(sd.size(), 2u);
}

}  // namespace
}  // namespace fsdp::nn
