// Wrapping submodules in FSDP instances (PyTorch's _wrap_utils._auto_wrap and wrap.py's
// _recursive_wrap, _post_order_apply, enable_wrap and wrap; docs/fsdp1.md, "Wrapping"):
//
//  * AutoWrap: what FullyShardedDataParallel's constructor runs for `auto_wrap_policy`. It
//    refuses a tree that already holds FSDP instances ("FSDP auto wrapping requires modules to
//    not already have FSDP applied but found {name} in ..."), then wraps, children before
//    parents, every module the policy chooses (never the root, never an ignored module),
//    replacing it in its parent with an instance built from the root's options.
//  * EnableWrap / wrap: `with enable_wrap(wrapper_cls=FSDP, **kwargs): wrap(module)` — inside
//    the scope, wrap() returns an FSDP instance built from the scope's options (optionally
//    edited per call); outside, the module itself. Scopes do not nest (PyTorch's
//    NotImplementedError "You are already within an autowrap context and we currently do not
//    supported nested autowrap.").
//
// The scope is per rank (a RankContext slot). Thread-safety: the rank's thread.
#pragma once

#include <functional>
#include <set>

#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

void AutoWrap(const nn::ModulePtr& root_module, const AutoWrapPolicy& policy,
              const std::set<const nn::Module*>& ignored_modules,
              const std::set<const TensorImpl*>& ignored_params,
              const FullyShardedDataParallelOptions& root_options);

class EnableWrap {
 public:
  explicit EnableWrap(FullyShardedDataParallelOptions options);
  ~EnableWrap();
  EnableWrap(const EnableWrap&) = delete;
  EnableWrap& operator=(const EnableWrap&) = delete;
};

// `wrap(module, **wrap_overrides)`: `overrides` edits a copy of the scope's options.
nn::ModulePtr wrap(const nn::ModulePtr& module,
                   const std::function<void(FullyShardedDataParallelOptions&)>& overrides = {});

}  // namespace fsdp::fsdp1
