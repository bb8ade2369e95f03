// Collective test data: the per-rank inputs of the `collectives/*` scenarios and of the
// gradients of the `fully_shard_comm/reduce_scatter_*` data paths, and the expected results,
// derived from the same rules (never tabulated).
//
// [Note: exact collective data] Every input is a small integer derived from (layout, rank,
// index), so every result is exact in every dtype the scenarios use (float32, float64,
// float16, bfloat16, int64) at every world up to 128, whatever the order or the precision in
// which a backend accumulates; the judges compare with Tolerance{0, 0}.
//
// Gathered and broadcast values identify their source rank and position:
//   GatherValue(r, i) = (7r + 3i) mod 251 - 125, in [-125, 125].
//
// Reduced values tell every reduce op apart and expose a lost, doubled or misplaced rank. A
// reduction input is seen as chunks of `chunk_size` elements (ReduceLayout: reduce_scatter_
// tensor's input has `world` chunks, chunk q being rank q's output; all_reduce's tensor is one
// chunk). Element j of chunk q on rank r is
//
//   ReduceInput = s * (a + d_r),   PremulFactor(r) = 2 for even r, 4 for odd r
//
//   * a = 2 for worlds up to 64, else 1 (the average's magnitude; a * world <= 128);
//   * s = -1 when bit j of q is set, else +1, so that the chunks of every reduction differ
//     from each other (distinct for q < 2^chunk_size: chunk_size >= 7 at world 128);
//   * d_r in {-1, 0, 1} sums to 0 over the ranks: at the first D positions of a chunk (D
//     balanced-ternary digits are enough for world / 2), d_r is digit j of rank r's CODE, a
//     number distinct per rank: ranks 2k and 2k + 1 get +(k + 1) and -(k + 1), the last rank
//     of an odd world gets 0. At the other positions one HIGH rank has d = +1 and the next
//     rank (LOW) d = -1; they advance by one rank per such position, so that across a
//     reduce-scatter (world chunks) every rank is at least once the only maximum and once the
//     only minimum.
//
// So, per element: MIN and MAX are s(a - 1) and s(a + 1) (in the order of s), AVG = s * a
// exactly (the deviations cancel), SUM = s * a * world, PREMUL_SUM = 2 * SUM + 2 * the odd
// ranks' values: five different numbers at every world >= 2 (a = 2 keeps SUM = 4 away from
// MAX = 3 at world 2). The values of an element share one sign, |values| <= 3 and their sum is
// a * world <= 128, so every partial sum is an integer that bfloat16 holds exactly, and every
// premultiplied partial sum an even integer below 512, which bfloat16 holds exactly too. No
// factor is 1, so a factor dropped for any rank shows, and neighbouring ranks' factors
// differ. Dropping a rank changes SUM, AVG and PREMUL_SUM; duplicating
// one (its data and factor in another rank's place) changes them too, because codes differ;
// MIN and MAX change as well over a whole reduce-scatter, where each rank is at least once the
// only extreme. conformance/collective_data_test.cc proves these properties.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::conformance {

// Element `index` of rank `rank`'s input of a gather or broadcast.
double GatherValue(int rank, int64_t index);
// Elements [0, count) of rank `rank`'s gather input.
std::vector<double> GatherValues(int rank, int64_t count);

// How a reduction input is cut into chunks (see the file comment).
struct ReduceLayout {
  int world = 1;
  int64_t chunk_size = 1;  // elements per chunk; >= 1
};

// Element `index` (counted from the start of the input, across chunks) of rank `rank`'s
// reduction input.
double ReduceInput(const ReduceLayout& layout, int rank, int64_t index);
// Elements [begin, begin + count) of rank `rank`'s reduction input.
std::vector<double> ReduceInputs(const ReduceLayout& layout, int rank, int64_t begin,
                                 int64_t count);

// The suite's rule for reductions without a result: AVG and PREMUL_SUM on a dtype that is not
// floating point (int64) must fail on every rank (docs/scenarios.md, "Where the suite
// chooses").
bool ReductionIsRejected(distributed::ReduceOp op, DType dtype);

// Rank `rank`'s PREMUL_SUM factor in a world of `world` ranks: 2 for even ranks, 4 for odd
// ones. No factor is 1, so a factor dropped (treated as 1) for any rank shows, wherever an
// implementation loses it.
double PremulFactor(int rank, int world);

// The reduction of per-rank contributions `values[r]` (with `factors[r]` for PREMUL_SUM) in
// exact double arithmetic; AVG divides the sum by `divisor` (the group size).
double Reduce(distributed::ReduceOp op, const std::vector<double>& values,
              const std::vector<double>& factors, int divisor);

// Element `index` of the reduction of every rank's ReduceInput with `op`.
double ExpectedReduction(distributed::ReduceOp op, const ReduceLayout& layout, int64_t index);
// Elements [begin, begin + count) of that reduction.
std::vector<double> ExpectedReductions(distributed::ReduceOp op, const ReduceLayout& layout,
                                       int64_t begin, int64_t count);

}  // namespace fsdp::conformance
