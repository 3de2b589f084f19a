// The cuBLAS baseline of the grouped GEMM primitives (see cuda_backend.h for the contract).
//
// Row-major tensors are handed to column-major cuBLAS as their transposes, so for group g
// (m = m_g rows starting at off = off_g):
//   group-M, Transposed  out_g [m, N] = a_g [m, K] · B_gᵀ  ⇔  out_gᵀ [N, m] = B_g(ᵀ) · a_gᵀ
//            cuBLAS: C (N×m, ld N) = op_T(A = B_g, K×N ld K) · B (= a_g, K×m ld K)
//   group-M, Plain       out_g = a_g · B_g, B_g [K, N]      ⇔  op_N(A = B_g, N×K ld N)
//   group-K              dw_g [N, K] = dy_gᵀ · x_g           ⇔  dw_gᵀ [K, N] = x_gᵀ · dy_g
//            cuBLAS: C (K×N, ld K) = A (= x_g, K×m ld K) · op_T(B = dy_g, N×m ld N)
// Every call writes straight into the caller's rows of `out` / `dw`; rows [S, T) are untouched.
// Many small groups (each GEMM shorter on the GPU than its launch on the host, e.g. 64 experts
// of 64 rows) are not looped: when they form a few evenly spaced runs of one size each (uniform
// routing) each run is one cublasGemmStridedBatchedEx call; otherwise all of them are one
// cublasGemmGroupedBatchedEx call.
// CPU oracle: src/backends/cpu/cpu_gemm.cpp.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "core/env.h"
#include "backends/cuda/check.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/resources.h"
#include "moekit/core/error.h"

namespace moekit::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw_invalid("dtype", "f32, f16 or bf16", name(t));
  }
}

std::string reject_large(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (const auto& [label, value] : dims) {
    if (value > INT_MAX) {
      return str(label, " = ", value, " exceeds cuBLAS's 32-bit int arguments (", INT_MAX, ")");
    }
  }
  return "";
}

// Address of row `row` of a tensor whose dim 0 indexes rows (or groups).
const void* row_ptr(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.data()) +
         row * t.strides()[0] * static_cast<int64_t>(size_of(t.dtype()));
}
void* row_ptr_mut(const Tensor& t, int64_t row) { return const_cast<void*>(row_ptr(t, row)); }

int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// ---- cuBLASLt with the BIAS epilogue: D = op(A)·B + bias (bias added in fp32 before rounding,
// like the CPU backend). RAII holders for the descriptors.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~LtMatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct LtLayout {
  cublasLtMatrixLayout_t l = nullptr;
  LtLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    MOEKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                                   static_cast<uint64_t>(cols), ld));
  }
  ~LtLayout() { if (l) cublasLtMatrixLayoutDestroy(l); }
  LtLayout(const LtLayout&) = delete;
  LtLayout& operator=(const LtLayout&) = delete;
};
struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  ~LtPreference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

cublasLtMatmulAlgo_t lt_plan(CudaResources& res, const LtPlanKey& key, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                             cublasLtMatrixLayout_t d) {
  {
    std::lock_guard<std::mutex> lock(res.lt_mutex);
    auto it = res.lt_plans.find(key);
    if (it != res.lt_plans.end()) return it->second;
  }
  LtPreference pref;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  const uint64_t ws = res.workspace_bytes;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al[3] = {static_cast<uint32_t>(key.align_a), static_cast<uint32_t>(key.align_b),
                          static_cast<uint32_t>(key.align_d)};
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof(uint32_t)));
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof(uint32_t)));
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof(uint32_t)));
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof(uint32_t)));
  // Split-K partial sums stay in fp32 (never in the 16-bit output type).
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MOEKIT_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(res.lt, desc, a, b, d, d, pref.p, 1, &result, &found));
  if (found == 0) {
    throw_error(ErrorKind::Runtime,
                str("cublasLtMatmulAlgoGetHeuristic found no algorithm for a ", key.m, "x", key.n,
                    "x", key.k, " GEMM with bias epilogue (alignments A ", key.align_a, ", B ",
                    key.align_b, ", D ", key.align_d, ")"));
  }
  std::lock_guard<std::mutex> lock(res.lt_mutex);
  if (res.lt_plans.size() > 4096) res.lt_plans.clear();  // bounded: skewed splits vary m a lot
  res.lt_plans.emplace(key, result.algo);
  return result.algo;
}

// Whether the leading dimensions and every non-empty group's A, B and output pointers are
// 16-byte aligned. How cuBLAS adds a bias (or any C) depends on it — measured on the H200 with
// cuBLAS 13.0 and bf16/f16 outputs, by CudaGroupedGemm.BiasIsAddedBeforeTheOneRounding:
//   aligned:    the cuBLASLt BIAS epilogue adds in fp32 before the one rounding, but a
//               cublasGemmEx with beta = 1 rounds the product to 16 bits first (two roundings);
//   misaligned: the reverse — the epilogue rounds twice, beta = 1 onto C rounds once.
// So aligned operands take the epilogue and misaligned ones the broadcast + beta = 1 GEMM.
bool operands_aligned(const detail::GroupMArgs& args, const std::vector<int64_t>& counts) {
  const int64_t es = static_cast<int64_t>(size_of(args.a.dtype()));
  for (int64_t ld : {args.b.strides()[1], args.a.strides()[0], args.out.strides()[0]}) {
    if ((ld * es) % 16 != 0) return false;
  }
  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    for (const void* p : {row_ptr(args.b, g), row_ptr(args.a, off), row_ptr(args.out, off)}) {
      if (alignment(p) < 16) return false;
    }
    off += m;
  }
  return true;
}

// bias: [G, N] with every row 16-byte aligned (the caller's, or an aligned copy of it).
void group_m_with_bias(CudaResources& res, const detail::GroupMArgs& args, const Tensor& bias,
                       const std::vector<int64_t>& counts) {
  const int64_t K = args.k, N = args.n;
  const cudaDataType_t t = cuda_type(args.a.dtype());
  const bool transposed = args.op == BOp::Transposed;
  const int64_t lda = args.b.strides()[1];  // K (Transposed) or N (Plain)
  const int64_t ldb = args.a.strides()[0], ldd = args.out.strides()[0];

  LtMatmulDesc desc;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = transposed ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  const int sms = gemm_sm_target(args.ctx);  // Context::with_sm_margin
  if (sms > 0) {
    MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                       &sms, sizeof(sms)));
  }
  // A = B_g: stored K×N (ld K) and transposed, or stored N×K (ld N).
  LtLayout a_layout(t, transposed ? K : N, transposed ? N : K, lda);
  const float alpha = 1.0f, beta = 0.0f;

  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    const void* A = row_ptr(args.b, g);
    const void* B = row_ptr(args.a, off);
    void* D = row_ptr_mut(args.out, off);
    const void* bias_g = row_ptr(bias, g);
    MOEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_g, sizeof(bias_g)));
    LtLayout b_layout(t, K, m, ldb);
    LtLayout d_layout(t, N, m, ldd);
    const LtPlanKey key{static_cast<int>(t),
                        static_cast<int>(op_a),
                        static_cast<int>(epilogue),
                        N,
                        m,
                        K,
                        lda,
                        ldb,
                        ldd,
                        alignment(A),
                        alignment(B),
                        alignment(D),
                        alignment(bias_g),
                        sms};
    const cublasLtMatmulAlgo_t algo = lt_plan(res, key, desc.d, a_layout.l, b_layout.l, d_layout.l);
    MOEKIT_CUBLAS_CHECK(cublasLtMatmul(res.lt, desc.d, &alpha, A, a_layout.l, B, b_layout.l, &beta,
                                       D, d_layout.l, D, d_layout.l, &algo, res.workspace,
                                       res.workspace_bytes, res.stream));
    off += m;
  }
}

// The cuBLAS handle's SM-count target for this call's context (Context::with_sm_margin; 0: every
// SM). The handle is shared by the copies of a context, which may differ in margin, so every call
// sets it (a host-side setting; calls on one context come from one host thread).
void target_sms(CudaResources& res, const Context& ctx) {
  MOEKIT_CUBLAS_CHECK(cublasSetSmCountTarget(res.blas, gemm_sm_target(ctx)));
}

// ---- per-group GEMMs: one cublasGemmEx each, or one cublasGemmGroupedBatchedEx for all of them.
// Every problem shares the transposes, leading dimensions, types and scalars; only the pointers
// and sizes differ (col-major: C (m×n) = alpha·op(A)·op(B) + beta·C).
struct GemmBatch {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, c_type = CUDA_R_32F;
  int lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
  struct Problem {
    const void* a;
    const void* b;
    void* c;
    int m, n, k;
  };
  std::vector<Problem> problems;
};

// One launch per GEMM costs the host ~8 µs (measured on the H200: 64 small experts ran at
// 8.8 µs per group); a GEMM under ~2.4 GFLOP (8 µs at 300 TFLOP/s) is shorter than that on the
// GPU, so the loop would leave the GPU idle. Then one grouped-batched call does all groups.
constexpr double kSmallGemmFlops = 2.4e9;
constexpr size_t kMinBatchedGemms = 8;

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// cublasGemmGroupedBatchedEx (cuBLAS 13.0, H200) wrote to the wrong address for a 2-byte-aligned
// output (CudaGroupedGemm.GroupKWgradMatchesReferenceInsideGuardBands caught it in a guard band):
// it is only used when every pointer and leading dimension is 16-byte aligned.
bool batch_aligned(const GemmBatch& batch) {
  if ((batch.lda * type_bytes(batch.a_type)) % 16 != 0 ||
      (batch.ldb * type_bytes(batch.b_type)) % 16 != 0 ||
      (batch.ldc * type_bytes(batch.c_type)) % 16 != 0) {
    return false;
  }
  for (const auto& p : batch.problems) {
    if (alignment(p.a) < 16 || alignment(p.b) < 16 || alignment(p.c) < 16) return false;
  }
  return true;
}

bool prefer_batched(const GemmBatch& batch) {
  const size_t n = batch.problems.size();
  if (n < kMinBatchedGemms || n > kMaxBatchedGemms || !batch_aligned(batch)) return false;
  // Never with a 16-bit C and beta != 0: like cublasGemmEx on aligned operands, it may round the
  // product before adding C (see operands_aligned).
  if (batch.beta != 0.0f && batch.c_type != CUDA_R_32F) return false;
  double flops = 0;
  for (const auto& p : batch.problems) flops += 2.0 * p.m * p.n * static_cast<double>(p.k);
  return flops / static_cast<double>(n) < kSmallGemmFlops;
}

// false when cuBLAS does not support this type combination grouped (then the caller loops).
bool run_batched(CudaResources& res, const GemmBatch& batch) {
  const size_t n = batch.problems.size();
  GemmPointers ptrs{};
  ptrs.count = static_cast<int>(n);
  std::vector<int> m(n), nn(n), k(n), lda(n, batch.lda), ldb(n, batch.ldb), ldc(n, batch.ldc),
      sizes(n, 1);
  std::vector<cublasOperation_t> op_a(n, batch.op_a), op_b(n, batch.op_b);
  std::vector<float> alpha(n, 1.0f), beta(n, batch.beta);
  for (size_t i = 0; i < n; ++i) {
    const auto& p = batch.problems[i];
    ptrs.a[i] = p.a;
    ptrs.b[i] = p.b;
    ptrs.c[i] = p.c;
    m[i] = p.m;
    nn[i] = p.n;
    k[i] = p.k;
  }
  // Device arrays of device pointers, written by a kernel from its parameters (stream-ordered,
  // no host synchronisation, no copy from pageable memory).
  void** dev = res.gemm_pointers;
  launch_write_gemm_pointers(ptrs, dev, res.stream);
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      res.blas, op_a.data(), op_b.data(), m.data(), nn.data(), k.data(), alpha.data(),
      const_cast<const void* const*>(dev), batch.a_type, lda.data(),
      const_cast<const void* const*>(dev + n), batch.b_type, ldb.data(), beta.data(), dev + 2 * n,
      batch.c_type, ldc.data(), static_cast<int>(n), sizes.data(), CUBLAS_COMPUTE_32F);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check_cublas(st, "cublasGemmGroupedBatchedEx", __FILE__, __LINE__);
  return true;
}

// ---- the same small GEMMs as strided-batched calls, one per distinct (m, n, k).
// The grouped call's kernels (cuBLAS 12.5+) use warp-level MMA; the strided-batched GEMMs have
// the Hopper (wgmma/TMA) kernels. Uniform routing gives one or two sizes, each a run of evenly
// spaced problems — e.g. small_E64 wgrad, 64 × (2048×1024, k = 64 rows), dw_g N·K apart — so a
// strided-batched call per size replaces the grouped call. (Uneven spacing, e.g. an empty group
// in the middle, or more than kMaxShapeBatches sizes: the grouped call, as before.)
constexpr size_t kMaxShapeBatches = 4;

struct StridedBatch {
  size_t first = 0;                  // index of its first problem in GemmBatch::problems
  int count = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
};

// Element stride from pointer p to q (> 0 and a whole number of elements), else -1.
long long element_stride(const void* p, const void* q, size_t elem_bytes) {
  const intptr_t step = reinterpret_cast<intptr_t>(q) - reinterpret_cast<intptr_t>(p);
  if (step <= 0 || step % static_cast<intptr_t>(elem_bytes) != 0) return -1;
  return static_cast<long long>(step / static_cast<intptr_t>(elem_bytes));
}

// The problems as at most kMaxShapeBatches strided batches, each a run of consecutive problems
// of one size with constant strides, no two runs of the same size; empty when that fails.
std::vector<StridedBatch> strided_batches(const GemmBatch& batch) {
  std::vector<StridedBatch> out;
  const auto& P = batch.problems;
  const size_t ea = type_bytes(batch.a_type), eb = type_bytes(batch.b_type), ec = type_bytes(batch.c_type);
  for (size_t i = 0; i < P.size(); ++i) {
    const auto same_size = [&](size_t j) { return P[j].m == P[i].m && P[j].n == P[i].n && P[j].k == P[i].k; };
    if (!out.empty()) {
      StridedBatch& b = out.back();
      const size_t last = b.first + static_cast<size_t>(b.count) - 1;
      if (same_size(b.first)) {
        const long long sa = element_stride(P[last].a, P[i].a, ea);
        const long long sb = element_stride(P[last].b, P[i].b, eb);
        const long long sc = element_stride(P[last].c, P[i].c, ec);
        if (b.count == 1 && sa > 0 && sb > 0 && sc > 0) {
          b.stride_a = sa, b.stride_b = sb, b.stride_c = sc, b.count = 2;
          continue;
        }
        if (b.count > 1 && sa == b.stride_a && sb == b.stride_b && sc == b.stride_c) {
          ++b.count;
          continue;
        }
        return {};  // same size, uneven spacing
      }
      for (const StridedBatch& earlier : out) {
        if (same_size(earlier.first)) return {};  // a size that comes back after another
      }
    }
    if (out.size() == kMaxShapeBatches) return {};
    out.push_back({i, 1, 0, 0, 0});
  }
  return out;
}

void run_strided_batches(CudaResources& res, const GemmBatch& batch,
                         const std::vector<StridedBatch>& batches) {
  const float alpha = 1.0f;
  for (const StridedBatch& b : batches) {
    const auto& p = batch.problems[b.first];
    MOEKIT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        res.blas, batch.op_a, batch.op_b, p.m, p.n, p.k, &alpha, p.a, batch.a_type, batch.lda,
        b.stride_a, p.b, batch.b_type, batch.ldb, b.stride_b, &batch.beta, p.c, batch.c_type,
        batch.ldc, b.stride_c, b.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// MOEKIT_CUBLAS_BATCHING (benchmarks and bisection; read once): "auto" (default: strided-batched
// calls when the small GEMMs allow them, else the one grouped call), "grouped" (always the one
// cublasGemmGroupedBatchedEx call: the behaviour before the strided batches), "loop" (never batch).
// Any other value is an error.
enum class Batching { Auto, Grouped, Loop };  // the env values' order
Batching batching_mode() {
  static const int mode = detail::env_choice("MOEKIT_CUBLAS_BATCHING", {"auto", "grouped", "loop"});
  return mode < 0 ? Batching::Auto : static_cast<Batching>(mode);
}

void run_gemms(CudaResources& res, const GemmBatch& batch) {
  if (batch.problems.empty()) return;
  const Batching mode = batching_mode();
  if (mode != Batching::Loop && prefer_batched(batch)) {
    if (mode == Batching::Auto) {
      const std::vector<StridedBatch> strided = strided_batches(batch);
      if (!strided.empty()) return run_strided_batches(res, batch, strided);
    }
    if (run_batched(res, batch)) return;
  }
  const float alpha = 1.0f;
  for (const auto& p : batch.problems) {
    MOEKIT_CUBLAS_CHECK(cublasGemmEx(res.blas, batch.op_a, batch.op_b, p.m, p.n, p.k, &alpha, p.a,
                                     batch.a_type, batch.lda, p.b, batch.b_type, batch.ldb,
                                     &batch.beta, p.c, batch.c_type, batch.ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

// ---------------------------------------------------------------- group-M (fprop / dgrad)
std::string group_m_rejects(const detail::GroupMArgs& args) {
  std::string reason = reject_unless_cuda(args.ctx);
  if (reason.empty()) reason = reject_large({{"T", args.rows}, {"K", args.k}, {"N", args.n}});
  return reason;
}

void group_m_run(const detail::GroupMArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  target_sms(res, args.ctx);
  const std::vector<int64_t> counts = checked_host_counts(args.ctx, args.splits, args.rows);
  const int64_t K = args.k, N = args.n;
  if (N == 0) return;
  if (K == 0) {  // empty products: out = 0 (+ bias) on the valid rows
    const std::vector<int64_t> offs = offsets_of(counts);
    const int64_t S = offs.back();
    if (args.bias.defined()) {
      launch_grouped_bias_broadcast(args.bias, offs, args.out, res.stream);
    } else if (S > 0) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(args.out.data(), 0, args.out.rows(0, S).nbytes(), res.stream));
    }
    return;
  }
  const bool with_bias = args.bias.defined();
  if (with_bias && operands_aligned(args, counts)) {
    if (alignment(args.bias.data()) >= 16) return group_m_with_bias(res, args, args.bias, counts);
    // A bias at an odd address: an aligned copy ([G, N], small next to the output).
    const Tensor aligned_bias = to_device(args.ctx, args.bias);
    return group_m_with_bias(res, args, aligned_bias, counts);
  }
  // Misaligned operands (see operands_aligned): the bias enters as C — each group's valid rows of
  // `out` get bias_g broadcast (rows [S, T) untouched), then the GEMM adds onto them, beta = 1.
  if (with_bias) launch_grouped_bias_broadcast(args.bias, offsets_of(counts), args.out, res.stream);

  GemmBatch batch;
  batch.op_a = args.op == BOp::Transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  batch.a_type = batch.b_type = batch.c_type = cuda_type(args.a.dtype());
  batch.lda = static_cast<int>(args.b.strides()[1]);  // K (Transposed) or N (Plain)
  batch.ldb = static_cast<int>(args.a.strides()[0]);
  batch.ldc = static_cast<int>(args.out.strides()[0]);
  batch.beta = with_bias ? 1.0f : 0.0f;
  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    batch.problems.push_back({row_ptr(args.b, g), row_ptr(args.a, off), row_ptr_mut(args.out, off),
                              static_cast<int>(N), static_cast<int>(m), static_cast<int>(K)});
    off += m;
  }
  run_gemms(res, batch);
}

// ---------------------------------------------------------------- group-K (wgrad)
std::string group_k_rejects(const detail::GroupKArgs& args) {
  std::string reason = reject_unless_cuda(args.ctx);
  if (reason.empty()) reason = reject_large({{"T", args.rows}, {"K", args.k}, {"N", args.n}});
  return reason;
}

void group_k_run(const detail::GroupKArgs& args) {
  CudaResources& res = resources(args.ctx);
  DeviceGuard guard(res.device);
  target_sms(res, args.ctx);
  const std::vector<int64_t> counts = checked_host_counts(args.ctx, args.splits, args.rows);
  const int64_t K = args.k, N = args.n;
  if (K == 0 || N == 0) return;
  const size_t group_bytes = static_cast<size_t>(N * K) * size_of(args.dw.dtype());
  GemmBatch batch;
  batch.op_b = CUBLAS_OP_T;
  batch.a_type = batch.b_type = cuda_type(args.dy.dtype());
  batch.c_type = cuda_type(args.dw.dtype());
  batch.lda = static_cast<int>(args.x.strides()[0]);
  batch.ldb = static_cast<int>(args.dy.strides()[0]);
  batch.ldc = static_cast<int>(K);
  batch.beta = args.accumulate ? 1.0f : 0.0f;

  // Zero the weight grads of empty groups (exact zeros), one memset per run of adjacent ones.
  auto zero_groups = [&](int64_t g_begin, int64_t g_end) {
    if (args.accumulate || g_begin == g_end) return;
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(row_ptr_mut(args.dw, g_begin), 0,
                                      group_bytes * static_cast<size_t>(g_end - g_begin),
                                      res.stream));
  };
  int64_t off = 0, empty_begin = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    zero_groups(empty_begin, g);
    empty_begin = g + 1;
    batch.problems.push_back({row_ptr(args.x, off), row_ptr(args.dy, off), row_ptr_mut(args.dw, g),
                              static_cast<int>(K), static_cast<int>(N), static_cast<int>(m)});
    off += m;
  }
  zero_groups(empty_begin, args.groups);
  run_gemms(res, batch);
}

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::GroupMArgs> kCublasGroupM{
    "cublas", group_m_rejects, group_m_run, nullptr, detail::reads_device_counts_on_host<detail::GroupMArgs>};
constexpr detail::Backend<detail::GroupKArgs> kCublasGroupK{
    "cublas", group_k_rejects, group_k_run, nullptr, detail::reads_device_counts_on_host<detail::GroupKArgs>};

}  // namespace moekit::cuda
