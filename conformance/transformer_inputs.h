// The runner-owned inputs of the scenarios that run common_dtensor.py's Transformer with the
// seeds' ModelArgs (fully_shard_comm's count and event scenarios, fully_shard_autograd's
// optimizer-in-hook parity): its weights and one token batch per rank. Stateless; thread-safe
// (the weights are drawn from a generator seeded on the calling thread).
#pragma once

#include <cstdint>

#include "conformance/case_inputs.h"

namespace fsdp::conformance {

// Which ranks share the token batch.
enum class TokenBatches {
  kSameOnEveryRank,  // one batch from generator seed `seed`
  kPerRank,          // rank r's from seed `seed + r` (the seeds' torch.manual_seed(42 + rank))
};

// Weights: every key of Transformer(ModelArgs(n_layers, dropout_p=0)).state_dict(), the module
// initialised after manual_seed(seed), float32. Rank inputs: StepInputName(0), token ids
// [2, max_seq_len] in [0, vocab_size).
CaseInputs TransformerCaseInputs(int64_t n_layers, uint64_t seed, int world, TokenBatches batches);
// Their description (ScenarioInfo::inputs).
InputsDoc TransformerInputsDoc(TokenBatches batches);

}  // namespace fsdp::conformance
