// Check data for `pg-bench -c 1`: inputs whose collective results are exact by construction
// in every dtype, and the verification that counts wrong output elements.
//
// [Note: exact check data]
// Rank r's input element j (j indexes the full array, see bus_bandwidth.h) holds
//     V(r, j) = ((j + r) mod P) - M,   P = 2M + 1,
// a small integer in [-M, M]. Each collective's descriptor (tools/bench/collectives/) says
// which j its input holds and what its output must hold: a copy of some rank's V
// (CountWrongCopies) or the reduction of every rank's V (CountWrongReduction). M is the
// largest value (at most 8) for which any sum over the world stays exactly representable:
// world * M <= 2^p, p = the dtype's significand bits
// (float 24, double 53, half 11, bfloat16 8; int64 is always exact). Backends accumulate
// half/bfloat16 in float, so partial sums are exact too, and sum/min/max results must match
// bit for bit. Only AVG rounds (sum / world): its result may differ from the double-precision
// expectation by one unit in the last place of the dtype. Because V depends on j only through
// (j + r) mod P, the reduced value of element j depends only on j mod P, so expectations are
// tabulated once per check and verification is O(numel) per rank even at 128 ranks.
// At very large worlds (bfloat16 beyond 256 ranks) M is 0 and the check degenerates to zeros.
//
// Thread-safety: stateless functions; distinct ranks may fill and verify concurrently.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/core/tensor.h"
#include "engine/distributed/reduce_op.h"

namespace fsdp::bench {

// M of the note for `dtype` at `world_size` ranks.
int64_t CheckValueBound(DType dtype, int world_size);
// V(rank, index) of the note for bound `m`.
int64_t CheckValue(int rank, int64_t index, int64_t m);

// Fills `input` with V(rank, first + i) for its elements i (M for its dtype at world_size):
// `first` is the full-array index of the input's element 0.
void FillCheckValues(const Tensor& input, int rank, int64_t first, int world_size);

// Counts the elements i of `output` that differ from V(source_rank(j), j), j = first + i: a
// collective that copies, element j coming from rank source_rank(j). Exact comparison.
int64_t CountWrongCopies(const Tensor& output, int64_t first, int world_size,
                         const std::function<int(int64_t j)>& source_rank);

// Counts the elements i of `output` that differ from the `redop` reduction over every rank of
// V(r, j), j = first + i. Exact comparison except AVG (one ulp of the dtype).
int64_t CountWrongReduction(const Tensor& output, int64_t first, distributed::ReduceOp redop,
                            int world_size);

}  // namespace fsdp::bench
