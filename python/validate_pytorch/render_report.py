"""Renders `fsdp-conform run --json` of the PyTorch driver as the validation report:
Markdown (docs/pytorch-<version>.md) and JSON (per case: scenario, params, world, status,
why). Failures are explained by the first failing checks and rank errors, and attributed to a
known PyTorch defect when KNOWN_DEFECTS lists one for the scenario and the release.

usage: render_report.py --run RUN.json --version V --torch-version T --markdown OUT.md
                        --json OUT.json [--command "the fsdp-conform command line"]
(V: the VERSION asked of `make validate-pytorch`; T: the installed torch.__version__)

Ownership: reads RUN.json, writes the two outputs. Thread-safety: a script.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json

def _uneven_mlp_stack_tp(params: dict) -> bool:
    """MLPStack's hidden features (4 x mlp_dim), sharded by ColwiseParallel and RowwiseParallel,
    do not divide by tp."""
    try:
        return (4 * int(params.get("mlp_dim", "0"))) % int(params.get("tp", "1")) != 0
    except ValueError:
        return False


# Gloo's reduce-scatter summing whatever op FSDP2 asks for: (what is wrong, where it is tracked).
_GLOO_REDUCE_SCATTER_AVG = (
    "Gloo's reduce_scatter_tensor ignores the reduce op (it always sums), so FSDP2's "
    "ReduceOp.AVG gradient reduce-scatter (float32 and bfloat16) on CPU returns the sum: "
    "gradients come out the shard group's size (`world`; dp under tensor parallelism) times too "
    "large",
    "pytorch/pytorch Gloo ProcessGroupGloo::_reduce_scatter_base")


# Gloo refusing the AVG all-reduce of FSDP2's HSDP: (what is wrong, where it is tracked).
_GLOO_HSDP_ALL_REDUCE_AVG = (
    "FSDP2's HSDP all-reduces the gradients over the replicate group with ReduceOp.AVG, which "
    "Gloo's allreduce refuses (\"Cannot use ReduceOp.AVG with Gloo\"): HSDP cannot train on "
    "a CPU", "pytorch/pytorch torch/distributed/_composable/fsdp/_fsdp_collectives.py "
    "foreach_reduce")

def _int_reshard_after_forward_off_dim0(params: dict) -> bool:
    """An int reshard_after_forward (not True/False) with shard_placement_fn sharding a
    parameter on a later dim (largest_dim)."""
    return (params.get("shard_placement") == "largest_dim"
            and params.get("reshard_after_forward") not in (None, "True", "False"))


# PyTorch defects a case can fail by: (scenario globs, the case parameters they need
# ({name: value or predicate of the value}, {} for any case, or a predicate of all the case's
# parameters), releases it affects (prefix of torch.__version__), what is wrong, where it is
# tracked). The first entry that matches wins.
KNOWN_DEFECTS = [
    (("parity/fsdp/*", "fully_shard_*"), _int_reshard_after_forward_off_dim0, ("2.",),
     "an int reshard_after_forward with a parameter sharded on a dim other than 0 "
     "(shard_placement_fn): _to_sharded_post_forward keeps a flat 1-D slice of the all-gather "
     "output, and the next all-gather over the post-forward group reassembles it with "
     "_reassemble_all_gather_outputs, which indexes that 1-D size by the shard dim "
     "(\"IndexError: list index out of range\")",
     "pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py "
     "_reassemble_all_gather_outputs"),
    (("parity/tp/mlp_stack",), _uneven_mlp_stack_tp, ("2.",),
     "parallelize_module with an uneven tensor-parallel shard: ColwiseParallel returns its local "
     "output (use_local_output=True) and RowwiseParallel re-wraps it with DTensor.from_local "
     "without the global shape, which assumes even shards, so the next matmul fails \"a and b "
     "must have same reduction dim\" (32 features over tp 3 read as 33)",
     "pytorch/pytorch#150336, open"),
    (("parity/tp/*",), {"replicate": lambda v: v not in (None, "1")}, ("2.4", "2.5"),
     *_GLOO_HSDP_ALL_REDUCE_AVG),
    # float64 reduces with SUM and pre/post divides: only float32 HSDP runs are affected.
    (("fully_shard_training/train_parity_hsdp",), {"dtype": "float32"}, ("2.4", "2.5"),
     *_GLOO_HSDP_ALL_REDUCE_AVG),
    (("fully_shard_comm/backward_misprefetch",), {}, ("2.4", "2.5"),
     "a mistargeted backward prefetch is never cleared: in_proj's explicit backward prefetch "
     "all-gathers out_proj after its backward, nothing waits on that all-gather, "
     "FSDPParamGroup.finalize_backward leaves the pending result, and the next forward's "
     "unshard() reuses it: out_proj computes with the parameters of before the optimizer step "
     "(the losses and gradients from step 1 on differ from the oracle's)",
     "pytorch/pytorch#137348, merged in October 2024 after the 2.5 branch; 2.15.0 has the fix"),
    (("fully_shard_comm/set_reduce_scatter_divide_factor",), {}, ("2.4", "2.5"),
     "Gloo's reduce_scatter_tensor ignores the reduce op (it always sums), and these releases' "
     "set_reduce_scatter_divide_factor(factor) is only that op (a PREMUL_SUM(1 / factor) made "
     "by _make_nccl_premul_sum): the float64 gradients come out divided by the world size "
     "(foreach_reduce's own pre/post divide) instead of by the factor",
     "pytorch/pytorch Gloo ProcessGroupGloo::_reduce_scatter_base; torch/distributed/"
     "_composable/fsdp/fully_shard.py set_reduce_scatter_divide_factor"),
    (("parity/fsdp/*", "parity/tp/*", "fully_shard_state_dict/optimizer_state_dict",
      "fully_shard_comm/reduce_scatter_fp32", "fully_shard_comm/reduce_scatter_bf16",
      "fully_shard_mixed_precision/reduce_dtype",
      "fully_shard_mixed_precision/grad_acc_with_reduce_dtype",
      "fully_shard_mixed_precision/output_dtype",
      "fully_shard_mixed_precision/float16_on_one_submodule",
      "fully_shard_mixed_precision/low_precision_blocks_kwargs"), {}, ("2.4", "2.5"),
     *_GLOO_REDUCE_SCATTER_AVG),
    # compute_dtype with param_dtype float16 reduces with SUM (and pre/post divides): unaffected.
    (("fully_shard_mixed_precision/compute_dtype",), {"param_dtype": "bfloat16"}, ("2.4", "2.5"),
     *_GLOO_REDUCE_SCATTER_AVG),
    (("fully_shard_frozen/train_mixed_requires_grad_across_groups",),
     {"reshard_after_forward": "True"}, ("2.4", "2.5"),
     "a mistargeted backward prefetch is never cleared: block 1's implicit prefetch "
     "all-gathers the frozen block 0, whose pre-backward never runs (its outputs require no "
     "gradient), so nothing waits on that all-gather; FSDPParamGroup.finalize_backward leaves "
     "the pending result and the next forward's unshard() reuses it instead of all-gathering "
     "(one all-gather fewer in the next step's forward; had the parameters changed in between, "
     "the forward would run on the stale ones)",
     "pytorch/pytorch#137348, merged in October 2024 after the 2.5 branch; 2.15.0 has the fix"),
    (("collectives/reduce_scatter_tensor",), {"op": lambda v: v != "sum"}, ("2.4", "2.5"),
     "Gloo's reduce_scatter_tensor ignores the reduce op: ProcessGroupGloo::"
     "reduce_scatter_tensor_coalesced builds AllreduceOptions with opts.reduceOp but calls "
     "allreduce(inp) without them, so every op sums (AVG, MIN and MAX return the SUM; "
     "PREMUL_SUM neither applies its factors nor raises, and on int64 AVG / PREMUL_SUM are not "
     "rejected)",
     "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp "
     "reduce_scatter_tensor_coalesced; 2.15.0 honours the op"),
    (("fsdp_state_dict/*",), {"state_dict_type": "state_dict",
                              "state_dict_rank0_and_offload": "True"}, ("2.5",),
     "FULL_STATE_DICT with offload_to_cpu=True on a CPU-resident FSDP1 model: "
     "FlatParamHandle.to_cpu() moves the unsharded flat parameter to the CPU (a no-op there) and "
     "then frees the unsharded storage the flat parameter still shares, so state_dict() fails "
     "\"setStorage: ... out of bounds for storage of size 0\" in _use_unsharded_views",
     "pytorch/pytorch torch/distributed/fsdp/_flat_param.py FlatParamHandle.to_cpu"),
]


def _defect(case: dict, version: str):
    params = case.get("params", {})
    for patterns, needs, releases, what, where in KNOWN_DEFECTS:
        if (any(fnmatch.fnmatchcase(case["name"], p) for p in patterns)
                and (needs(params) if callable(needs) else
                     all(v(params.get(k)) if callable(v) else params.get(k) == v
                         for k, v in needs.items()))
                and version.startswith(releases)):
            return f"{what} ({where})"
    return None


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _why(case: dict, version: str) -> str:
    if case["status"] == "skipped":
        return case.get("skip_reason", "")
    if case["status"] == "passed":
        return ""
    parts = [e.splitlines()[0] for e in case.get("errors", [])[:2]]
    failed = [c for c in case.get("checks", []) if not c.get("passed")]
    parts += [f"{c['name']}: expected {_short(c.get('expected'))}, actual "
              f"{_short(c.get('actual'))}" + (f" ({c['detail']})" if c.get("detail") else "")
              for c in failed[:2]]
    if len(failed) > 2:
        parts.append(f"{len(failed) - 2} more failed check(s)")
    defect = _defect(case, version)
    if defect:
        parts.insert(0, f"PyTorch defect: {defect}")
    return "; ".join(parts)


def _labels(cases) -> list:
    """Per case, the parameters that tell it apart from the other cases of its scenario."""
    values = collections.defaultdict(lambda: collections.defaultdict(set))
    for c in cases:
        for k, v in c.get("params", {}).items():
            values[c["name"]][k].add(v)
    return [",".join(f"{k}={v}" for k, v in sorted(c.get("params", {}).items())
                     if len(values[c["name"]][k]) > 1) or "-" for c in cases]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--torch-version", required=True)
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    with open(args.run, encoding="utf-8") as f:
        run = json.load(f)
    version = args.torch_version
    cases = [{"name": c["name"], "params": c.get("params", {}), "world": c.get("world"),
              "backend": c.get("backend"), "status": c["status"],
              "seconds": c.get("seconds"), "why": _why(c, version)}
             for c in run.get("cases", [])]
    summary = run.get("summary", {})
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"torch": version, "semantics": run.get("semantics"), "summary": summary,
                   "command": args.command, "cases": cases}, f, indent=1)
        f.write("\n")

    families = collections.OrderedDict()
    for c in cases:
        fam = families.setdefault(c["name"].rsplit("/", 1)[0],
                                  {"passed": 0, "failed": 0, "skipped": 0})
        fam[c["status"]] += 1
    seconds = sum(c["seconds"] or 0 for c in cases)
    lines = [f"# PyTorch {args.version} judged by the suite",
             "",
             f"Produced by `make validate-pytorch VERSION={args.version}` (docs/pytorch.md): "
             f"PyTorch {version} (`torch.__version__`) from PyPI on a CPU machine, FSDP2 "
             f"(`fully_shard`) and FSDP1 (`FullyShardedDataParallel`) run by the driver "
             f"`python/fsdp-conform-pytorch` over Gloo (in driver sessions: one process per "
             f"rank serving every case, docs/drivers.md), judged under semantics "
             f"`{run.get('semantics')}`.",
             ""]
    if args.command:
        lines += ["```", args.command, "```", ""]
    lines += [f"**{summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
              f"{summary.get('skipped', 0)} skipped** ({seconds:.0f} s of cases).", "",
              "| family | passed | failed | skipped |", "|---|---|---|---|"]
    for fam, n in families.items():
        lines.append(f"| `{fam}/*` | {n['passed']} | {n['failed']} | {n['skipped']} |")
    labels = dict(zip(map(id, cases), _labels(cases)))
    for status, title in (("failed", "Failures"), ("passed", "Passes")):
        rows = [c for c in cases if c["status"] == status]
        if not rows:
            continue
        lines += ["", f"## {title}", "", "| scenario | case | world | why |", "|---|---|---|---|"]
        for c in rows:
            why = c["why"].replace("|", "\\|") if c["why"] else ""
            lines.append(f"| `{c['name']}` | {labels[id(c)]} | {c['world']} | {why} |")
    skipped = collections.Counter(c["name"].rsplit("/", 1)[0] for c in cases
                                  if c["status"] == "skipped")
    if skipped:
        lines += ["", "## Skipped", "",
                  "Scenarios the driver does not implement yet report `skipped` through the "
                  "protocol:", ""]
        lines += [f"* `{fam}/*`: {n} case(s)" for fam, n in sorted(skipped.items())]
    with open(args.markdown, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
