#include "conformance/transformer_inputs.h"

#include "engine/core/rng.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"

namespace fsdp::conformance {

CaseInputs TransformerCaseInputs(int64_t n_layers, uint64_t seed, int world, TokenBatches batches) {
  nn::ModelArgs args;
  args.n_layers = n_layers;
  args.dropout_p = 0.0;
  nn::ManualSeed(seed);
  nn::Transformer model(args);
  CaseInputs inputs;
  inputs.weights = WeightsOf(model);
  inputs.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const uint64_t batch_seed =
        batches == TokenBatches::kPerRank ? seed + static_cast<uint64_t>(r) : seed;
    Generator generator(batch_seed);
    inputs.ranks[static_cast<size_t>(r)].emplace_back(
        StepInputName(0), Tensor::randint(0, args.vocab_size, {2, args.max_seq_len}, &generator));
  }
  return inputs;
}

InputsDoc TransformerInputsDoc(TokenBatches batches) {
  InputsDoc doc;
  doc.weights =
      "every key of Transformer(ModelArgs(n_layers=n_layers, dropout_p=0.0)).state_dict() "
      "(common_dtensor.py's Transformer: vocab_size 8, max_seq_len 16, dim 16, n_heads 4, "
      "weight tying, so output.weight equals tok_embeddings.weight), float32";
  doc.rank_tensors.push_back(
      {"step0/input", "int64", "[2, 16]",
       batches == TokenBatches::kPerRank
           ? "the rank's own token batch (the seed's torch.manual_seed(42 + rank))"
           : "the token batch (the same on every rank)"});
  return doc;
}

}  // namespace fsdp::conformance
