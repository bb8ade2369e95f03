// The auto-wrap policies of FullyShardedDataParallel (PyTorch's torch/distributed/fsdp/wrap.py;
// docs/fsdp1.md, "Wrapping"). A policy decides which submodules of the module given to FSDP
// become FSDP instances of their own (children before parents):
//
//  * ModuleWrapPolicy({class names}): every module (not ignored, not the root) whose class is
//    listed (`_run_policy`, applied in post-order). Classes are compared by nn::Module's
//    type_name() ("TransformerEncoderLayer"); PyTorch's isinstance also matches subclasses.
//  * SizeBasedAutoWrapPolicy(min_num_params, force_leaf_modules, exclude_wrap_modules):
//    `size_based_auto_wrap_policy` through `_recursive_wrap`: descend into a module with at
//    least min_num_params not-yet-wrapped parameters unless its class is a forced leaf
//    (MultiheadAttention), wrap it when the parameters left after wrapping its children still
//    reach min_num_params, unless its class is excluded (ModuleList, ModuleDict).
//  * LambdaAutoWrapPolicy(fn): `lambda_auto_wrap_policy`: always descend, wrap when fn(module).
//
// Value-like, immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp1 {

class AutoWrapPolicy {
 public:
  virtual ~AutoWrapPolicy() = default;
  // The callable protocol `policy(module, recurse, nonwrapped_numel)`: with recurse, whether to
  // descend into `module`'s children; without, whether to wrap `module` (which has
  // `nonwrapped_numel` parameters left unwrapped).
  virtual bool operator()(const nn::Module& module, bool recurse,
                          int64_t nonwrapped_numel) const = 0;
  // `_Policy._run_policy`: the modules to wrap (pre-order of `root`, ignored modules and the
  // root excluded), for policies that choose modules directly; nullopt for callable policies,
  // which run through `_recursive_wrap`.
  virtual std::optional<std::vector<nn::Module*>> run_policy(
      nn::Module& root, const std::set<const nn::Module*>& ignored_modules) const {
    return std::nullopt;
  }
};

class ModuleWrapPolicy : public AutoWrapPolicy {
 public:
  explicit ModuleWrapPolicy(std::set<std::string> module_classes)
      : module_classes_(std::move(module_classes)) {}
  bool operator()(const nn::Module& module, bool recurse, int64_t nonwrapped_numel) const override;
  std::optional<std::vector<nn::Module*>> run_policy(
      nn::Module& root, const std::set<const nn::Module*>& ignored_modules) const override;
  const std::set<std::string>& module_classes() const { return module_classes_; }

 private:
  std::set<std::string> module_classes_;
};

class SizeBasedAutoWrapPolicy : public AutoWrapPolicy {
 public:
  // PyTorch's defaults: min_num_params 1e8, FORCE_LEAF_MODULES {MultiheadAttention},
  // EXCLUDE_WRAP_MODULES {ModuleList, ModuleDict}.
  explicit SizeBasedAutoWrapPolicy(int64_t min_num_params = 100000000,
                                   std::set<std::string> force_leaf_modules = {"MultiheadAttention"},
                                   std::set<std::string> exclude_wrap_modules = {"ModuleList",
                                                                                 "ModuleDict"})
      : min_num_params_(min_num_params),
        force_leaf_modules_(std::move(force_leaf_modules)),
        exclude_wrap_modules_(std::move(exclude_wrap_modules)) {}
  bool operator()(const nn::Module& module, bool recurse, int64_t nonwrapped_numel) const override;

 private:
  int64_t min_num_params_;
  std::set<std::string> force_leaf_modules_;
  std::set<std::string> exclude_wrap_modules_;
};

class LambdaAutoWrapPolicy : public AutoWrapPolicy {
 public:
  explicit LambdaAutoWrapPolicy(std::function<bool(const nn::Module&)> lambda_fn)
      : lambda_fn_(std::move(lambda_fn)) {}
  bool operator()(const nn::Module& module, bool recurse, int64_t nonwrapped_numel) const override;

 private:
  std::function<bool(const nn::Module&)> lambda_fn_;
};

}  // namespace fsdp::fsdp1
