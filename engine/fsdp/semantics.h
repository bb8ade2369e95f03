// Semantics: the PyTorch release whose FSDP2 rules fully_shard follows where releases differ
// observably (docs/fsdp-behaviour.md, "Semantics profiles"). Three profiles:
//
//   torch-2.4  (default) reshard_after_forward is a bool or an int, default True, and lazy init
//              clears the root's post-forward mesh whatever was passed: the root never reshards
//              after forward (PyTorch 2.4 through 2.7).
//   torch-2.8  reshard_after_forward may also be None, the default: True for non-root modules,
//              False for the root. Lazy init clears the root's post-forward mesh only when the
//              root's value was left None (neither fully_shard nor set_reshard_after_forward
//              set it), so an explicit True or int reshards the root too (PyTorch 2.8 and
//              later). The end-of-backward callback runs post_backward() on every group not
//              yet in POST_BACKWARD (unused and prefetch-only groups included), where torch-2.4
//              sweeps only groups still UNSHARDED (PyTorch 2.5.1's
//              _root_post_backward_final_callback tests `is_unsharded`; from pull request
//              144781, i.e. 2.7 on, `_training_state != TrainingState.POST_BACKWARD`, so 2.7
//              has the torch-2.4 root rule and the torch-2.8 sweep). Lazy init's uniform
//              dtype checks skip frozen parameters, which torch-2.4 checks too
//              (DtypeChecksCoverFrozenParams).
//   torch-2.15 torch-2.8's rules, and with MixedPrecisionPolicy(param_dtype=X,
//              reduce_dtype=None) the gradients are accumulated and reduced in the parameters'
//              own dtype, where the earlier profiles reduce them in X, the dtype autograd
//              computes them in (PyTorch 2.15 and later: MixedPrecisionPolicy's docstring,
//              "versionchanged:: 2.15"; FSDPParam.unsharded_grad_dtype is reduce_dtype, else
//              the original dtype, and FSDPParamGroup._get_reduce_dtype promotes over it);
//              a gradient accumulated without sync stays in the unsharded parameter's .grad,
//              in the reduce dtype, instead of a separate accumulator
//              (KeepsUnshardedGradInReduceDtype).
//
// The profile is a fully_shard option (FullyShardOptions::semantics), kept by each FsdpState
// and each FsdpParamGroup. Everything else the engine does is the same under every profile.
//
// Value types and stateless functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fsdp::fsdp2 {

enum class Semantics {
  kTorch2_4,   // "torch-2.4"
  kTorch2_8,   // "torch-2.8"
  kTorch2_15,  // "torch-2.15"
};

inline constexpr Semantics kDefaultSemantics = Semantics::kTorch2_4;

// "torch-2.4", "torch-2.8", "torch-2.15".
const char* SemanticsName(Semantics semantics);
// Every profile's name, oldest first.
std::vector<std::string> SemanticsNames();
// The profile named `name`; nullopt for an unknown name.
std::optional<Semantics> FindSemantics(const std::string& name);
// The profile named `name`; InvalidArgument naming the value and the known profiles otherwise.
Semantics ParseSemantics(const std::string& name);

// Whether fully_shard accepts reshard_after_forward=None (torch-2.8 and later).
bool HasReshardAfterForwardNone(Semantics semantics);

// Whether the root's lazy init clears its post-forward mesh, so that the root keeps its
// parameters unsharded after forward. `auto_reshard_after_forward` is PyTorch's
// `_auto_reshard_after_forward`: true when the root's reshard_after_forward was left None and
// set_reshard_after_forward was not called. torch-2.4: always; torch-2.8: only when
// `auto_reshard_after_forward`.
bool LazyInitKeepsRootUnsharded(Semantics semantics, bool auto_reshard_after_forward);

// Whether the end-of-backward callback gives post_backward() to every group not yet in
// POST_BACKWARD (torch-2.8) rather than only to the groups still UNSHARDED (torch-2.4; either
// profile also sweeps a group left in PRE_BACKWARD, docs/fsdp.md "[Note: end-of-backward
// sweep]").
bool EndOfBackwardSweepsEveryGroup(Semantics semantics);

// Whether a group whose MixedPrecisionPolicy sets param_dtype but leaves reduce_dtype None
// reduces its gradients in param_dtype, the dtype autograd computes them in (torch-2.4,
// torch-2.8: PyTorch 2.14 and earlier, foreach_reduce's `reduce_dtype or grad_dtype`), rather
// than accumulating them across backwards without sync and reducing them in the parameters'
// original dtype, as an explicit reduce_dtype equal to it would (torch-2.15). Either way the
// reduced gradient is cast to the original dtype.
bool ReducesInParamDtypeWhenReduceDtypeUnset(Semantics semantics);

// Whether a backward without reduction leaves the unsharded parameter's gradient in its .grad,
// in the reduce dtype (PyTorch 2.15's `_unsharded_param.grad_dtype = unsharded_grad_dtype`:
// autograd itself accumulates every backward's gradient in that dtype), rather than moving it
// into a hidden accumulator in the reduce dtype, the .grad left None (torch-2.4, torch-2.8:
// FSDPParam.to_accumulated_grad_if_needed's `unsharded_accumulated_grad`). The same sums
// either way; only what the registered unsharded parameter shows differs.
bool KeepsUnshardedGradInReduceDtype(Semantics semantics);

// Whether lazy init's checks that a group's parameters share one original dtype and one
// reduce dtype cover its frozen parameters too (torch-2.4: PyTorch 2.7 and earlier check every
// FSDPParam, so a frozen parameter of another dtype raises) rather than only those that
// require grad (torch-2.8 and later: pull request 154103).
bool DtypeChecksCoverFrozenParams(Semantics semantics);

}  // namespace fsdp::fsdp2
