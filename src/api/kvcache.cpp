// Public entry points of attention against a KV cache: validate, plan, run.
#include "flashcpp/kvcache.hpp"

#include "api/plan.hpp"
#include "api/validate.hpp"
#include "cpu/cpu_backend.hpp"
#include "flashcpp/error.hpp"

#ifdef FLASHCPP_WITH_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace flashcpp {
namespace {

using detail::KVCacheParams;
using detail::Plan;

struct Planned {
  KVCacheParams params;
  Plan plan;
};

// `copies` holds the host lengths and block table the params point to: keep it for the run.
Planned plan_call(const KVCacheTensors& t, const AttentionOptions& options,
                  detail::HostCopies& copies) {
  const Backend family = detail::check_backend(t.q, options);
  Planned r{detail::validate_kvcache(t, options, family, copies), {}};
  if (family == Backend::cpu || family == Backend::cpu_reference) {
    // An fp8 cache runs on the reference only (validation refused an explicit `cpu`).
    const Backend cpu = r.params.fp8_inputs() ? Backend::cpu_reference : family;
    r.plan.backend = cpu;
    r.plan.kernel = cpu == Backend::cpu ? "cpu_kvcache" : "cpu_reference_f64_kvcache";
    return r;
  }
#ifdef FLASHCPP_WITH_CUDA
  r.plan = detail::cuda::plan_kvcache(r.params, family);
  return r;
#else
  throw Error("flashcpp was built without CUDA");
#endif
}

}  // namespace

KVCachePlan plan_attention_with_kvcache(const KVCacheTensors& tensors,
                                        const AttentionOptions& options) {
  detail::HostCopies copies;
  const Plan plan = plan_call(tensors, options, copies).plan;
  return {plan.backend, plan.kernel, plan.num_splits, plan.workspace_bytes};
}

RunInfo attention_with_kvcache(const KVCacheTensors& tensors, const AttentionOptions& options,
                               Stream stream, Workspace workspace) {
  detail::HostCopies copies;
  const Planned call = plan_call(tensors, options, copies);
  if (call.plan.backend == Backend::cpu || call.plan.backend == Backend::cpu_reference) {
    if (call.params.batch > 0) detail::cpu::kvcache_forward(call.params, call.plan.backend == Backend::cpu_reference);
    return call.plan.run_info();
  }
#ifdef FLASHCPP_WITH_CUDA
  return detail::cuda::run_kvcache(call.plan, call.params, stream, workspace);
#else
  (void)stream;
  (void)workspace;
  throw Error("flashcpp was built without CUDA");
#endif
}

}  // namespace flashcpp
