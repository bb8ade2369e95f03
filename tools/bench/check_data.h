// Check data for `pg-bench -c 1`: inputs whose collective results are exact by construction
// in every dtype, and the verification that counts wrong output elements.
//
// [Note: exact check data]
// Rank r's input element j (j indexes the full array, see bus_bandwidth.h) holds
//     V(r, j) = ((j + r) mod P) - M,   P = 2M + 1,
// a small integer in [-M, M]. M is the largest value (at most 8) for which any sum over the
// world stays exactly representable: world * M <= 2^p, p = the dtype's significand bits
// (float 24, double 53, half 11, bfloat16 8; int64 is always exact). Backends accumulate
// half/bfloat16 in float, so partial sums are exact too, and sum/min/max results must match
// bit for bit. Only AVG rounds (sum / world): its result may differ from the double-precision
// expectation by one unit in the last place of the dtype. Because V depends on j only through
// (j + r) mod P, the reduced value of element j depends only on j mod P, so expectations are
// tabulated once per collective and verification is O(numel) per rank even at 128 ranks.
// At very large worlds (bfloat16 beyond 256 ranks) M is 0 and the check degenerates to zeros.
//
// Thread-safety: stateless functions; distinct ranks may fill and verify concurrently.
#pragma once

#include <cstdint>

#include "engine/core/tensor.h"
#include "engine/dist/reduce_op.h"
#include "tools/bench/bus_bandwidth.h"

namespace fsdp::bench {

// M of the note for `dtype` at `world_size` ranks.
int64_t CheckValueBound(DType dtype, int world_size);
// V(rank, index) of the note for bound `m`.
int64_t CheckValue(int rank, int64_t index, int64_t m);

// Fills this rank's input of `op` (its numel per `counts`) with V(rank, j): all_gather inputs
// hold their slice j = rank * per_rank + i of the gathered array; every other input holds the
// full array j = i.
void FillCheckInput(BenchCollective op, const Tensor& input, const CollectiveCounts& counts,
                    int rank, int world_size);

// Counts the elements of this rank's output of `op` that differ from the expected result
// (broadcast from rank 0; `redop` for reductions). Exact comparison except AVG (one ulp).
int64_t CountWrongElements(BenchCollective op, dist::ReduceOp redop, const Tensor& output,
                           const CollectiveCounts& counts, int rank, int world_size);

}  // namespace fsdp::bench
