"""Tests of the driver kit's torch-free parts: the strict flag parsing (the flags the runner
writes, conformance/driver_protocol.h), the result files and driver sessions (--capabilities,
--serve; conformance/driver_session.h); the PyTorch driver's table, which must load without
torch; and the validation report's attribution of failures to known PyTorch defects
(python/validate_pytorch/render_report.py). Run:
python3 -m unittest discover -s python/tests (ctest: python_driver_kit)."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fsdp_conform_driver import Driver, ScenarioError, ScenarioSkipped  # noqa: E402
from fsdp_conform_driver.protocol import UsageError, parse_args  # noqa: E402


def _args(tmp, **overrides):
    flags = {"--protocol": "2", "--scenario": "family/case", "--rank": "1", "--world": "3",
             "--backend": "gloo", "--store-dir": tmp, "--output": os.path.join(tmp, "r.json"),
             "--request": os.path.join(tmp, "q.json"), "--timeout-s": "30",
             "--tensors-output": os.path.join(tmp, "t.safetensors")}
    flags.update(overrides)
    out = []
    for k, v in flags.items():
        if v is not None:
            out += [k, v]
    return out + ["--input", "weights=/w.safetensors", "--param", "dim=8", "--param", "a=b=c"]


class ParseArgsTest(unittest.TestCase):
    def test_reads_every_flag(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = parse_args(_args(tmp))
        self.assertEqual((r.scenario, r.rank, r.world, r.backend), ("family/case", 1, 3, "gloo"))
        self.assertEqual(r.timeout_s, 30.0)
        self.assertEqual(r.inputs, {"weights": "/w.safetensors"})
        self.assertEqual(r.params, {"dim": "8", "a": "b=c"})
        self.assertEqual(r.int_param("dim"), 8)
        self.assertEqual(r.family, "family")

    def test_refuses_missing_unknown_repeated_and_other_protocols(self):
        with tempfile.TemporaryDirectory() as tmp:
            for bad, word in ((_args(tmp, **{"--world": None}), "--world"),
                              (_args(tmp) + ["--bogus", "1"], "--bogus"),
                              (_args(tmp) + ["--rank", "2"], "twice"),
                              (_args(tmp) + ["--param", "dim=9"], "twice"),
                              (_args(tmp, **{"--protocol": "1"}), "protocol"),
                              (_args(tmp) + ["--param"], "pairs")):
                with self.assertRaises(UsageError) as ctx:
                    parse_args(bad)
                self.assertIn(word, str(ctx.exception))

    def test_missing_parameter_names_the_known_ones(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = parse_args(_args(tmp))
        with self.assertRaises(UsageError) as ctx:
            r.param("steps")
        self.assertIn("steps", str(ctx.exception))
        self.assertIn("dim", str(ctx.exception))


class DriverTest(unittest.TestCase):
    def _run(self, table, scenario="family/case"):
        with tempfile.TemporaryDirectory() as tmp:
            code = Driver("test driver", table).main(_args(tmp, **{"--scenario": scenario}))
            with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
                return code, json.load(f)

    def test_ok_skipped_and_errors(self):
        def ok(request):
            return {"value": request.rank * 10}, None

        def skip(request):
            raise ScenarioSkipped("not on this backend")

        def fail(request):
            raise ScenarioError("InvalidArgument", "shape [4, 3] does not divide by world 3")

        def crash(request):
            raise KeyError("x")

        self.assertEqual(self._run({"family/case": ok}),
                         (0, {"status": "ok", "protocol": 2, "observations": {"value": 10}}))
        code, result = self._run({"family/case": skip})
        self.assertEqual((code, result["status"]), (0, "skipped"))
        self.assertIn("not on this backend", result["reason"])
        code, result = self._run({}, scenario="family/other")
        self.assertEqual((code, result["status"]), (0, "skipped"))
        self.assertIn("does not implement family/other", result["reason"])
        self.assertEqual(self._run({"family/case": fail}),
                         (1, {"status": "error", "error": {
                             "code": "InvalidArgument",
                             "message": "shape [4, 3] does not divide by world 3"}}))
        code, result = self._run({"family/case": crash})
        self.assertEqual((code, result["error"]["code"]), (1, "Internal"))
        self.assertIn("KeyError", result["error"]["message"])

    def test_unusable_flags_exit_2_without_a_result(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(Driver("t", {}).main(["--protocol", "2"]), 2)
            self.assertEqual(os.listdir(tmp), [])


class SessionTest(unittest.TestCase):
    def test_capabilities_declare_protocol_2_sessions(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(Driver("t", {}).main(["--capabilities"]), 0)
        self.assertEqual(json.loads(out.getvalue()), {"protocol": 2, "session": True})

    def test_serve_runs_every_line_with_setup_and_teardown_around_each_case(self):
        calls = []

        def case(request):
            calls.append(("case", request.rank, request.params["dim"]))
            return {"dim": request.int_param("dim")}, None

        driver = Driver("t", {"family/case": case},
                        setup=lambda request: calls.append(("setup", request.store_dir)),
                        teardown=lambda: calls.append(("teardown",)))
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            lines = io.StringIO(json.dumps(_args(a)) + "\n\n" +
                                json.dumps([x if x != "dim=8" else "dim=9" for x in _args(b)]) + "\n")
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(driver.serve(lines), 0)
            for tmp, dim in ((a, 8), (b, 9)):
                with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
                    self.assertEqual(json.load(f)["observations"], {"dim": dim})
        self.assertEqual(calls, [("setup", a), ("case", 1, "8"), ("teardown",),
                                 ("setup", b), ("case", 1, "9"), ("teardown",)])

    def test_serve_goes_on_after_a_failed_case_and_teardown_runs_anyway(self):
        torn = []

        def crash(request):
            raise RuntimeError("boom")

        driver = Driver("t", {"family/case": crash}, teardown=lambda: torn.append(1))
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            lines = io.StringIO(json.dumps(_args(a)) + "\n" + json.dumps(_args(b)) + "\n")
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(driver.serve(lines), 0)
            for tmp in (a, b):
                with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
                    self.assertEqual(json.load(f)["error"]["code"], "Internal")
        self.assertEqual(torn, [1, 1])

    def test_serve_exits_2_on_a_line_that_is_not_a_request(self):
        for line in ("not json", json.dumps({"args": []}), json.dumps(["--protocol", "2"])):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(Driver("t", {}).serve(io.StringIO(line + "\n")), 2)
            self.assertIn("--serve", err.getvalue())

    def test_a_hanging_teardown_dumps_its_stacks_to_the_log(self):
        import time

        def slow_teardown():
            time.sleep(1.0)

        driver = Driver("t", {"family/case": lambda request: ({}, None)}, teardown=slow_teardown)
        driver.teardown_dump_s = 0.2
        saved = os.dup(2)
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile("w+") as log:
            os.dup2(log.fileno(), 2)
            try:
                code = driver.main(_args(tmp))
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            dump = log.read()
            with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
                self.assertEqual(json.load(f)["status"], "ok")
        self.assertEqual(code, 0)
        self.assertIn("slow_teardown", dump)
        self.assertIn("Timeout", dump)


    def test_in_a_session_a_good_result_is_written_after_teardown_and_a_failed_one_before(self):
        seen = []

        def teardown_seeing(tmp):
            return lambda: seen.append(os.path.exists(os.path.join(tmp, "r.json")))

        for fn, written_before in ((lambda request: ({}, None), False),
                                   (lambda request: (_ for _ in ()).throw(RuntimeError("x")), True)):
            with tempfile.TemporaryDirectory() as tmp:
                driver = Driver("t", {"family/case": fn}, teardown=teardown_seeing(tmp))
                with contextlib.redirect_stdout(io.StringIO()), \
                        contextlib.redirect_stderr(io.StringIO()):
                    driver.serve(io.StringIO(json.dumps(_args(tmp)) + "\n"))
                self.assertTrue(os.path.exists(os.path.join(tmp, "r.json")))
            self.assertEqual(seen[-1], written_before)

    def test_from_max_cases_per_process_on_each_result_asks_to_end_the_session(self):
        driver = Driver("t", {"family/case": lambda request: ({}, None)})
        driver.max_cases_per_process = 2
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
                tempfile.TemporaryDirectory() as c:
            lines = io.StringIO("".join(json.dumps(_args(t)) + "\n" for t in (a, b, c)))
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(driver.serve(lines), 0)
            results = []
            for t in (a, b, c):
                with open(os.path.join(t, "r.json"), encoding="utf-8") as f:
                    results.append(json.load(f))
        self.assertNotIn("end_session", results[0])
        self.assertEqual(results[1]["status"], "ok")
        self.assertIn("served 2 cases", results[1]["end_session"])
        self.assertIn("served 3 cases", results[2]["end_session"])

    def test_a_teardown_past_its_limit_ends_the_rank_with_an_end_session_result(self):
        import subprocess
        import time

        kit = os.path.join(os.path.dirname(__file__), "..")
        with tempfile.TemporaryDirectory() as tmp:
            script = (
                "import io, json, sys, time\n"
                f"sys.path.insert(0, {kit!r})\n"
                "from fsdp_conform_driver import Driver\n"
                "d = Driver('t', {'family/case': lambda r: ({'x': 1}, None)},\n"
                "           teardown=lambda: time.sleep(60))\n"
                "d.teardown_limit_s = 0.3\n"
                "d.teardown_exit_margin_s = 0.5\n"
                f"sys.exit(d.serve(io.StringIO(json.dumps({_args(tmp)!r}) + '\\n')))\n")
            started = time.monotonic()
            # The rank writes its result at the limit and is then ended by faulthandler (the
            # teardown's exit margin, shortened here) unless the runner stops it first.
            done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                  timeout=30)
            seconds = time.monotonic() - started
            with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
                result = json.load(f)
        self.assertEqual(done.returncode, 1, done.stderr)  # faulthandler's exit
        self.assertLess(seconds, 20)
        self.assertEqual(result["status"], "ok")
        self.assertEqual(result["observations"], {"x": 1})
        self.assertIn("did not finish within 0.3 s", result["end_session"])
        self.assertIn("<lambda>", done.stderr)  # the stuck teardown's stack


class PyTorchDriverTableTest(unittest.TestCase):
    def test_the_table_loads_without_torch_and_checkpoint_skips_with_its_reason(self):
        import subprocess

        code = ("import sys; from fsdp_conform_driver.pytorch.scenarios import SCENARIOS; "
                "print(len(SCENARIOS), 'torch' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
        count, torch_loaded = out.stdout.split()
        self.assertGreater(int(count), 0)
        self.assertEqual(torch_loaded, "False")
        from fsdp_conform_driver.pytorch.scenarios import SCENARIOS

        for name in ("checkpoint/round_trip", "checkpoint/faults"):
            with self.assertRaisesRegex(ScenarioSkipped, "torch.distributed.checkpoint"):
                SCENARIOS[name](None)


class KnownDefectsTest(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "validate_pytorch"))
        import render_report

        self.defect = render_report._defect

    def test_a_defect_needs_its_scenario_parameters_and_release(self):
        case = {"name": "fsdp_state_dict/basic_save_and_load_state_dict",
                "params": {"state_dict_type": "state_dict", "state_dict_rank0_and_offload": "True",
                           "use_orig_params": "False"}}
        self.assertIn("FlatParamHandle.to_cpu", self.defect(case, "2.5.1+cu124"))
        self.assertIsNone(self.defect(case, "2.15.0"))
        other = dict(case, params=dict(case["params"], state_dict_rank0_and_offload="False"))
        self.assertIsNone(self.defect(other, "2.5.1"))
        self.assertIsNone(self.defect(dict(case, name="checkpoint/faults"), "2.5.1"))
        for name in ("parity/fsdp/mlp", "parity/tp/transformer"):
            self.assertIn("reduce_scatter_tensor", self.defect(
                {"name": name, "params": {"replicate": "1"}}, "2.4.1"))
        self.assertIn("Cannot use ReduceOp.AVG with Gloo", self.defect(
            {"name": "parity/tp/mlp_stack", "params": {"replicate": "2"}}, "2.5.1"))
        uneven = {"name": "parity/tp/mlp_stack",
                  "params": {"replicate": "1", "tp": "3", "mlp_dim": "8"}}
        for version in ("2.5.1", "2.15.0"):
            self.assertIn("pytorch/pytorch#150336", self.defect(uneven, version))
        even = dict(uneven, params=dict(uneven["params"], tp="2"))
        self.assertIsNone(self.defect(even, "2.15.0"))
        frozen = {"name": "fully_shard_frozen/train_mixed_requires_grad_across_groups",
                  "params": {"reshard_after_forward": "True", "unfreeze_params": "False"}}
        self.assertIn("pytorch/pytorch#137348", self.defect(frozen, "2.5.1"))
        self.assertIsNone(self.defect(frozen, "2.15.0"))
        self.assertIsNone(self.defect(
            dict(frozen, params={"reshard_after_forward": "False"}), "2.5.1"))
        misprefetch = {"name": "fully_shard_comm/backward_misprefetch", "params": {}}
        self.assertIn("pytorch/pytorch#137348", self.defect(misprefetch, "2.5.1"))
        self.assertIsNone(self.defect(misprefetch, "2.15.0"))
        hsdp = {"name": "fully_shard_training/train_parity_hsdp", "params": {"dtype": "float32"}}
        self.assertIn("Cannot use ReduceOp.AVG with Gloo", self.defect(hsdp, "2.5.1"))
        self.assertIsNone(self.defect(dict(hsdp, params={"dtype": "float64"}), "2.5.1"))

    def test_mixed_precision_blames_gloo_only_where_fsdp2_reduces_with_avg(self):
        def case(name, **params):
            return {"name": "fully_shard_mixed_precision/" + name, "params": params}
        for c in (case("compute_dtype", param_dtype="bfloat16"),
                  case("float16_on_one_submodule", param_dtype="float16"),
                  case("reduce_dtype", param_dtype="float32", reduce_dtype="bfloat16")):
            self.assertIn("reduce_scatter_tensor", self.defect(c, "2.5.1"))
            self.assertIsNone(self.defect(c, "2.15.0"))
        # float16 everywhere reduces with SUM and pre/post divides
        self.assertIsNone(self.defect(case("compute_dtype", param_dtype="float16"), "2.5.1"))
        self.assertIn("set_reduce_scatter_divide_factor", self.defect(
            {"name": "fully_shard_comm/set_reduce_scatter_divide_factor", "params": {}}, "2.5.1"))

    def test_int_reshard_after_forward_blames_reassembly_only_off_dim0(self):
        def case(**params):
            return {"name": "parity/fsdp/mlp", "params": dict(optim="sgd", **params)}
        self.assertIn("_reassemble_all_gather_outputs", self.defect(
            case(reshard_after_forward="2", shard_placement="largest_dim"), "2.15.0"))
        self.assertIsNone(self.defect(
            case(reshard_after_forward="2", shard_placement="dim0"), "2.15.0"))
        self.assertIsNone(self.defect(
            case(reshard_after_forward="True", shard_placement="largest_dim"), "2.15.0"))

    def test_collectives_blame_gloo_reduce_scatter_only_for_ops_other_than_sum(self):
        def case(op):
            return {"name": "collectives/reduce_scatter_tensor",
                    "params": {"op": op, "dtype": "int64", "in_place": "False"}}
        for op in ("avg", "min", "max", "premul_sum"):
            self.assertIn("reduce_scatter_tensor_coalesced", self.defect(case(op), "2.5.1"))
            self.assertIsNone(self.defect(case(op), "2.15.0"))
        self.assertIsNone(self.defect(case("sum"), "2.5.1"))
        self.assertIsNone(self.defect(
            {"name": "collectives/all_reduce", "params": {"op": "min"}}, "2.5.1"))


if __name__ == "__main__":
    unittest.main()
