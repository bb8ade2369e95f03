"""Tests of the driver kit's torch-free parts: the strict flag parsing (the flags the runner
writes, conformance/driver_protocol.h) and the result files. Run:
python3 -m unittest discover -s python/tests (ctest: python_driver_kit)."""

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


if __name__ == "__main__":
    unittest.main()
