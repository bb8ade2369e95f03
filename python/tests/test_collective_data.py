"""Tests of the PyTorch driver's port of the suite's exact collective data (collective_data.py,
after conformance/collective_data.h): the properties the reduce_scatter_* and collectives/*
judges rely on; and of models_scenarios.sample_indices. Torch-free. Run:
python3 -m unittest discover -s python/tests (ctest: python_driver_kit)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fsdp_conform_driver.pytorch.collective_data import (  # noqa: E402
    gather_values, premul_factor, reduce_inputs)
from fsdp_conform_driver.pytorch.models_scenarios import sample_indices  # noqa: E402


class ReduceInputsTest(unittest.TestCase):
    def _all_ranks(self, world, chunk_size, count):
        return [reduce_inputs(world, chunk_size, r, count) for r in range(world)]

    def test_every_element_averages_to_its_sign_times_the_magnitude(self):
        for world in (1, 2, 3, 4, 7, 65):
            magnitude = 2 if world <= 64 else 1
            chunk_size = 11
            ranks = self._all_ranks(world, chunk_size, 5 * chunk_size)
            for j in range(5 * chunk_size):
                chunk, position = divmod(j, chunk_size)
                sign = -1 if (chunk >> position) & 1 else 1
                values = [ranks[r][j] for r in range(world)]
                self.assertEqual(sum(values), sign * magnitude * world, (world, j))
                self.assertTrue(all(v * sign >= 0 for v in values), (world, j, values))
                self.assertTrue(all(abs(v) <= magnitude + 1 for v in values))

    def test_ranks_differ(self):
        # Every rank's input differs from every other's (a rank delivered twice shows).
        for world in (2, 3, 4, 7):
            ranks = self._all_ranks(world, 9, 4 * 9)
            self.assertEqual(len({tuple(r) for r in ranks}), world)

    def test_world_one_is_the_magnitude_with_the_chunk_signs(self):
        self.assertEqual(reduce_inputs(1, 2, 0, 6), [2.0, 2.0, -2.0, 2.0, 2.0, -2.0])


class GatherValuesTest(unittest.TestCase):
    def test_values_follow_the_rule_and_stay_in_range(self):
        self.assertEqual(gather_values(0, 3), [-125.0, -122.0, -119.0])
        self.assertEqual(gather_values(2, 2), [-111.0, -108.0])
        self.assertTrue(all(-125 <= v <= 125 for r in range(128) for v in gather_values(r, 300)))

    def test_premul_factors_alternate_two_and_four(self):
        self.assertEqual([premul_factor(r) for r in range(4)], [2.0, 4.0, 2.0, 4.0])


class SampleIndicesTest(unittest.TestCase):
    """models_scenarios.sample_indices, after models_scenarios.cc's SampleIndices."""

    def test_evenly_spaced_with_first_and_last(self):
        self.assertEqual(sample_indices(10, 4), [0, 3, 6, 9])
        self.assertEqual(sample_indices(3, 6), [0, 1, 2])
        self.assertEqual(sample_indices(5, 1), [0])
        self.assertEqual(sample_indices(0, 6), [])


if __name__ == "__main__":
    unittest.main()
