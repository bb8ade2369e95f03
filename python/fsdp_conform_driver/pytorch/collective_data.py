"""The suite's exact collective data (conformance/collective_data.{h,cc}, [Note: exact
collective data]) in Python: the per-rank inputs of collectives/* and of the
fully_shard_comm/reduce_scatter_* gradients. Torch-free; the expected results are the judge's.

  gather_value(r, i)   (7r + 3i) mod 251 - 125: element i of rank r's gather/broadcast input
  reduce_inputs(...)   ReduceInput: element j of chunk q on rank r is s * (a + d_r)
  premul_factor(r)     PREMUL_SUM's per-rank factor: 2 for even ranks, 4 for odd ones

Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import List


def gather_value(rank: int, index: int) -> float:
    """GatherValue: element `index` of rank `rank`'s gather or broadcast input."""
    return float((7 * rank + 3 * index) % 251 - 125)


def gather_values(rank: int, count: int) -> List[float]:
    """GatherValues: elements [0, count) of rank `rank`'s gather input."""
    return [gather_value(rank, i) for i in range(count)]


def premul_factor(rank: int) -> float:
    """PremulFactor: rank `rank`'s PREMUL_SUM factor, 2 for even ranks, 4 for odd ones."""
    return 2.0 if rank % 2 == 0 else 4.0



def _balanced_ternary_digit(value: int, digit: int) -> int:
    for _ in range(digit):
        d = ((value % 3) + 4) % 3 - 1
        value = (value - d) // 3
    return ((value % 3) + 4) % 3 - 1


def _rank_code(rank: int, world: int) -> int:
    if rank >= world - world % 2:
        return 0
    k = rank // 2 + 1
    return k if rank % 2 == 0 else -k


def _code_digits(world: int) -> int:
    digits, largest = 0, 0
    while largest < world // 2:
        largest = 3 * largest + 1
        digits += 1
    return digits


def reduce_inputs(world: int, chunk_size: int, rank: int, count: int) -> List[float]:
    """Elements [0, count) of rank `rank`'s reduction input of layout {world, chunk_size}
    (collective_data.h, ReduceInputs with begin 0): element j of chunk q is
    s * (a + d_r), a = 2 up to world 64 (else 1), s = -1 where bit j of q is set, d_r the
    rank's balanced-ternary code digit at the first D positions of a chunk, then +1 for one
    HIGH rank and -1 for the next (advancing one rank per position)."""
    magnitude = 2 if world <= 64 else 1
    digits = 0 if world < 2 else _code_digits(world)
    code = [_balanced_ternary_digit(_rank_code(rank, world), k) for k in range(digits)]
    out, chunk, position, high = [], 0, 0, 0
    for _ in range(count):
        deviation = 0
        if position < digits:
            deviation = code[position]
        elif digits > 0:
            low = 0 if high + 1 == world else high + 1
            deviation = 1 if rank == high else -1 if rank == low else 0
            high = low
        sign = -1 if position < 63 and (chunk >> position) & 1 else 1
        out.append(float(sign * (magnitude + deviation)))
        position += 1
        if position == chunk_size:
            position, chunk = 0, chunk + 1
    return out
