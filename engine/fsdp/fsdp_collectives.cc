#include "engine/fsdp/fsdp_collectives.h"

#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "engine/core/allocator.h"
#include "engine/core/error.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"

namespace fsdp::fsdp2 {

void DivIfNeeded(const Tensor& t, double factor) {
  if (factor == 1.0 || t.numel() == 0) return;
  Tensor out = t;
  out.copy_(ops::kernels::DivScalar(t, factor));
}

namespace {

// dst[dst_offset, +numel) = src[src_offset, +numel) for two tensors of one dtype on one device,
// copied as bytes without making views: the all-gather copy-out runs it once per parameter and
// rank (torch.split_with_sizes_copy's job), where a view per copy costs more than the copy.
void CopyElements(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                  int64_t numel) {
  FSDP_INTERNAL_ASSERT(dst.dtype() == src.dtype() && dst.device() == src.device());
  if (numel == 0) return;
  const size_t element = dst.element_size();
  GetDeviceBackend(dst.device().type)
      .Copy(static_cast<char*>(dst.data_ptr()) + dst_offset * element, dst.device(),
            static_cast<const char*>(src.data_ptr()) + src_offset * element, src.device(),
            static_cast<size_t>(numel) * element, /*non_blocking=*/false);
}

distributed::ReduceOptions ToReduceOptions(DivideFactors::Op op, double premul) {
  switch (op) {
    case DivideFactors::Op::kAvg: return distributed::Avg();
    case DivideFactors::Op::kSum: return distributed::Sum();
    case DivideFactors::Op::kPremulSum:
      return distributed::PremulSum(premul);
  }
  return distributed::Sum();
}

std::string DTypeSetStr(const std::set<DType>& dtypes) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (DType d : dtypes) {
    os << (first ? "" : ", ") << "torch." << DTypeName(d);
    first = false;
  }
  os << "}";
  return os.str();
}

}  // namespace

std::shared_ptr<AllGatherResult> foreach_all_gather(
    const std::vector<FsdpParam*>& fsdp_params, const std::shared_ptr<distributed::ProcessGroup>& group,
    bool async_op, CommStream& all_gather_copy_in_stream, CommStream& all_gather_stream,
    Device device) {
  FSDP_CHECK(group != nullptr, "foreach_all_gather: null process group");
  const int world_size = group->size();
  const int rank = group->rank();
  auto result = std::make_shared<AllGatherResult>();
  // Copy-in on the copy-in stream: the all-gather inputs (casts, CPU offload uploads) and
  // their copy into this rank's slice of the output. It does not wait for the current stream,
  // so that it runs ahead of compute (docs/fsdp-behaviour.md, "Streams and the implicit
  // forward prefetch"); what it reads was ordered before it
  // by events: the optimizer step by the root pre-forward (or set_post_optim_event), the
  // post-forward-mesh shards by the group's reshard_after_forward_event.
  std::optional<CommStreamGuard> copy_in_guard(std::in_place, all_gather_copy_in_stream);
  std::vector<Tensor> inputs;
  std::set<DType> dtypes;
  for (FsdpParam* fsdp_param : fsdp_params) {
    std::vector<Tensor> param_inputs = fsdp_param->all_gather_inputs();
    std::vector<DType> param_dtypes;
    std::vector<int64_t> param_numels;
    for (const Tensor& t : param_inputs) {
      param_dtypes.push_back(t.dtype());
      param_numels.push_back(t.numel());
      result->all_gather_input_split_sizes.push_back(t.numel());
      dtypes.insert(t.dtype());
      inputs.push_back(t);
    }
    result->param_all_gather_input_dtypes.push_back(std::move(param_dtypes));
    result->param_all_gather_input_numels.push_back(std::move(param_numels));
  }
  FSDP_CHECK(dtypes.size() <= 1, "FSDP all-gather of parameters with different all-gather dtypes ",
             DTypeSetStr(dtypes),
             " is not supported by this engine (PyTorch all-gathers them as uint8 bytes)");
  const DType dtype = dtypes.empty() ? DType::kFloat32 : *dtypes.begin();
  int64_t per_rank_numel = 0;
  for (int64_t n : result->all_gather_input_split_sizes) per_rank_numel += n;

  // Uninitialised (torch.empty): the copy-in writes this rank's slice, the all-gather the rest.
  result->all_gather_output =
      Tensor::empty_uninitialized({per_rank_numel * world_size}, dtype, device);
  Tensor all_gather_input = result->all_gather_output.narrow(0, per_rank_numel * rank,
                                                            per_rank_numel);
  int64_t offset = 0;
  for (const Tensor& t : inputs) {
    if (t.numel() > 0) all_gather_input.narrow(0, offset, t.numel()).copy_(t.flatten());
    offset += t.numel();
  }
  TraceWork("all_gather_copy_in");
  copy_in_guard.reset();
  // The collective (on the all-gather stream, after the copy-in), in place.
  all_gather_stream.wait_stream(all_gather_copy_in_stream);
  const CommStreamGuard all_gather_guard(all_gather_stream);
  if (world_size > 1) {
    auto work = group->all_gather_into_tensor(result->all_gather_output, all_gather_input,
                                              async_op);
    if (async_op) result->all_gather_work = std::move(work);
  }
  TraceWork("all_gather");
  result->all_gather_event.record(all_gather_stream);
  return result;
}

void foreach_all_gather_copy_out(AllGatherResult& all_gather_result,
                                 const std::vector<FsdpParam*>& fsdp_params,
                                 const std::shared_ptr<distributed::ProcessGroup>& group) {
  const int world_size = group->size();
  if (all_gather_result.all_gather_work) {
    all_gather_result.all_gather_work->wait();
    all_gather_result.all_gather_work.reset();
  }
  // The copy-out runs on the current stream, after the all-gather (FSDP2: a sync all-gather's
  // event; an async one was waited above and recorded on the current stream anyway).
  const CommStream current = CommStream::Current(all_gather_result.all_gather_output.device());
  current.wait_event(all_gather_result.all_gather_event);
  TraceWork("all_gather_copy_out", all_gather_result.all_gather_event.id());
  FSDP_INTERNAL_ASSERT(all_gather_result.param_all_gather_input_numels.size() ==
                       fsdp_params.size());
  int64_t per_rank_numel = 0;
  for (int64_t n : all_gather_result.all_gather_input_split_sizes) per_rank_numel += n;
  const Tensor& output = all_gather_result.all_gather_output;
  int64_t column = 0;
  for (size_t i = 0; i < fsdp_params.size(); ++i) {
    FsdpParam* fsdp_param = fsdp_params[i];
    fsdp_param->init_all_gather_outputs(all_gather_result.param_all_gather_input_numels[i],
                                        all_gather_result.param_all_gather_input_dtypes[i],
                                        world_size);
    fsdp_param->alloc_all_gather_outputs();
    const auto& numels = all_gather_result.param_all_gather_input_numels[i];
    // Shard(d > 0) gathered from the sharded state: copy to a temporary, then chunk-cat along
    // d into the all-gather output (the post-forward all-gather of flat slices of the
    // unsharded parameter needs no chunk-cat).
    const bool chunk_cat = fsdp_param->shard_info().shard_dim != 0 &&
                           fsdp_param->sharded_state() == ShardedState::kSharded;
    for (size_t j = 0; j < numels.size(); ++j) {
      const int64_t n = numels[j];
      const Tensor& target = fsdp_param->all_gather_outputs()[j];
      const Tensor param_output =
          chunk_cat ? Tensor::empty_uninitialized({target.numel()}, target.dtype(), target.device())
                    : target;
      // Row k of the [W, L] view, columns [column, column + n) → rows [k*n, (k+1)*n).
      for (int k = 0; k < world_size && n > 0; ++k) {
        CopyElements(param_output, k * n, output, k * per_rank_numel + column, n);
      }
      if (chunk_cat) {
        const Tensor unsharded = fsdp_param->unshard_all_gathered(param_output, world_size);
        CopyElements(target, 0, unsharded, 0, unsharded.numel());
      }
      column += n;
    }
  }
}

void foreach_reduce_scatter_copy_in(const std::vector<Tensor>& grads, const Tensor& out,
                                    int world_size) {
  std::vector<Shape> shapes;
  shapes.reserve(grads.size());
  for (const Tensor& g : grads) shapes.push_back(g.sizes());
  const GroupLayout layout = ComputeGroupLayout(shapes, world_size);
  FSDP_CHECK(out.numel() == layout.total_numel(world_size), "reduce-scatter copy-in: output has ",
             out.numel(), " elements but the padded gradients need ",
             layout.total_numel(world_size));
  // Every element of `out` is written (torch._chunk_cat): each rank's chunk of a gradient, then
  // zeros for the rest of its padded shard, which the reduce-scatter reads.
  for (size_t i = 0; i < grads.size(); ++i) {
    const ShardInfo info = ComputeShardInfo(grads[i].sizes(), 0, world_size);
    const Tensor flat = grads[i].flatten();
    const int64_t d0 = grads[i].size(0);
    for (int k = 0; k < world_size; ++k) {
      const int64_t begin = std::min<int64_t>(d0, info.chunk_rows * k);
      const int64_t end = std::min<int64_t>(d0, info.chunk_rows * (k + 1));
      const int64_t n = (end - begin) * info.row_numel;
      const Tensor padded_shard = out.narrow(0, k * layout.per_rank_numel + layout.offsets[i],
                                             layout.padded_shard_numels[i]);
      if (n > 0) padded_shard.narrow(0, 0, n).copy_(flat.narrow(0, begin * info.row_numel, n));
      if (n < padded_shard.numel()) padded_shard.narrow(0, n, padded_shard.numel() - n).zero_();
    }
  }
}

ForeachReduceResult foreach_reduce(const std::vector<FsdpParam*>& fsdp_params,
                                   std::vector<Tensor> unsharded_grads,
                                   const std::shared_ptr<distributed::ProcessGroup>& reduce_scatter_group,
                                   const ForeachReduceOptions& options) {
  FSDP_CHECK(fsdp_params.size() == unsharded_grads.size(), "foreach_reduce: ",
             fsdp_params.size(), " parameters but ", unsharded_grads.size(), " gradients");
  FSDP_CHECK(!unsharded_grads.empty(), "foreach_reduce: no gradients to reduce");
  std::set<DType> grad_dtypes;
  for (const Tensor& g : unsharded_grads) grad_dtypes.insert(g.dtype());
  FSDP_CHECK(grad_dtypes.size() == 1, "FSDP reduce-scatter expects uniform gradient dtype but got ",
             DTypeSetStr(grad_dtypes));
  for (size_t i = 0; i < fsdp_params.size(); ++i) {
    FSDP_CHECK(unsharded_grads[i].sizes() == fsdp_params[i]->global_shape(), "foreach_reduce: ",
               "gradient of ", fsdp_params[i]->fqn(), " has shape ",
               ShapeStr(unsharded_grads[i].sizes()), " but the parameter has shape ",
               ShapeStr(fsdp_params[i]->global_shape()));
  }
  // Shard(d > 0): torch.cat(torch.chunk(grad, W, dim=d), dim=0), so that the dim-0 copy-in
  // hands each rank its chunk along d.
  for (size_t i = 0; i < fsdp_params.size() && reduce_scatter_group->size() > 1; ++i) {
    const int64_t shard_dim = fsdp_params[i]->shard_info().shard_dim;
    if (shard_dim == 0) continue;
    const Tensor& grad = unsharded_grads[i];
    const int world = reduce_scatter_group->size();
    FSDP_INTERNAL_ASSERT(grad.size(shard_dim) % world == 0, "Shard(", shard_dim,
                         ") requires even sharding: ", ShapeStr(grad.sizes()), " world size ",
                         world);
    const int64_t c = grad.size(shard_dim) / world;
    std::vector<Tensor> chunks;
    chunks.reserve(world);
    for (int k = 0; k < world; ++k) chunks.push_back(ops::kernels::Narrow(grad, shard_dim, k * c, c));
    unsharded_grads[i] = ops::kernels::Cat(chunks, 0);
  }
  const DType grad_dtype = unsharded_grads[0].dtype();
  const DType reduce_dtype = options.reduce_dtype.value_or(grad_dtype);
  const int world_size = reduce_scatter_group->size();
  const int replicate_size = options.all_reduce_group ? options.all_reduce_group->size() : 1;
  ForeachReduceResult result;
  result.divide_factors =
      ComputeDivideFactors(reduce_dtype, world_size, replicate_size, options.gradient_divide_factor,
                           options.force_sum_reduction_for_comms);
  const DivideFactors& factors = result.divide_factors;

  std::vector<Shape> shapes;
  shapes.reserve(unsharded_grads.size());
  for (const Tensor& g : unsharded_grads) shapes.push_back(g.sizes());
  const GroupLayout layout = ComputeGroupLayout(shapes, world_size);
  // Uninitialised (torch.empty): the copy-in writes every element, padding included.
  result.reduce_scatter_input =
      Tensor::empty_uninitialized({layout.total_numel(world_size)}, reduce_dtype, options.device);
  foreach_reduce_scatter_copy_in(unsharded_grads, result.reduce_scatter_input, world_size);
  TraceWork("reduce_scatter_copy_in");
  unsharded_grads.clear();  // only after the copy-in may the unsharded grads be freed

  // The reduce-scatter stream waits for the gradient-producing (current) stream, which also
  // ran the copy-in; everything below runs on the reduce-scatter (then all-reduce) stream.
  const CommStream current = CommStream::Current(options.device);
  const CommStream& reduce_scatter_stream =
      options.reduce_scatter_stream ? *options.reduce_scatter_stream : current;
  reduce_scatter_stream.wait_stream(current);
  std::optional<CommStreamGuard> stream_guard(std::in_place, reduce_scatter_stream);
  Tensor reduce_output =
      Tensor::empty_uninitialized({layout.per_rank_numel}, reduce_dtype, options.device);
  DivIfNeeded(result.reduce_scatter_input, factors.pre_divide);
  reduce_scatter_group->reduce_scatter_tensor(reduce_output, result.reduce_scatter_input,
                                              ToReduceOptions(factors.op, factors.premul));
  TraceWork("reduce_scatter");
  // The reduce-scatter input may be freed only after this event (ReduceScatterState).
  result.reduce_scatter_event.record(reduce_scatter_stream);
  const CommStream* post_reduce_stream = &reduce_scatter_stream;
  if (options.all_reduce_group) {
    if (!options.all_reduce_grads) {
      // Deferred all-reduce: keep the partial sums; no gradient is assigned this time.
      if (options.partial_reduce_output.defined()) {
        result.partial_reduce_output = options.partial_reduce_output;
        result.partial_reduce_output.copy_(
            ops::kernels::Add(options.partial_reduce_output, reduce_output));
      } else {
        result.partial_reduce_output = reduce_output;
      }
      TraceWork("post_reduce");
      result.post_reduce_event.record(reduce_scatter_stream);
      return result;
    }
    if (options.partial_reduce_output.defined()) {
      reduce_output.copy_(ops::kernels::Add(reduce_output, options.partial_reduce_output));
    }
    if (options.all_reduce_stream != nullptr) {
      post_reduce_stream = options.all_reduce_stream;
      post_reduce_stream->wait_stream(reduce_scatter_stream);
      stream_guard.reset();
      stream_guard.emplace(*post_reduce_stream);
    }
    // HSDP (docs/fsdp-behaviour.md, "Gradient divide factors").
    options.all_reduce_group->all_reduce(reduce_output,
                                         ToReduceOptions(factors.all_reduce_op, 1.0));
    TraceWork("all_reduce");
  }
  DivIfNeeded(reduce_output, factors.post_divide);
  if (reduce_output.dtype() != options.orig_dtype) reduce_output = reduce_output.to(options.orig_dtype);
  result.reduce_output = reduce_output;

  // View-out at padded offsets, accumulate, post-accumulate-grad hooks.
  for (size_t i = 0; i < fsdp_params.size(); ++i) {
    FsdpParam* fsdp_param = fsdp_params[i];
    const ShardInfo& info = fsdp_param->shard_info();
    Tensor new_sharded_grad =
        reduce_output.narrow(0, layout.offsets[i], info.sharded_numel()).view(info.sharded_shape);
    fsdp_param->accumulate_sharded_grad(new_sharded_grad);
  }
  TraceWork("post_reduce");
  // The current stream waits on this before the optimizer step (end of backward).
  result.post_reduce_event.record(*post_reduce_stream);
  return result;
}

}  // namespace fsdp::fsdp2
