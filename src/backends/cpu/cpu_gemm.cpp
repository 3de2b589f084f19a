// CPU backend: grouped GEMMs and bias gradient (the reference semantics of every primitive).
//
// GEMMs go through OpenBLAS's cblas_sgemm with fp32 accumulation. f16/bf16 operands are converted
// to fp32 in row blocks (the weight of a group once), products land in an fp32 block, the bias is
// added in fp32, and the block is rounded once into the output. f32 operands go straight to
// sgemm, which writes the output in place. Results are bit-reproducible for a fixed thread count.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "moekit/core/error.h"

namespace moekit::cpu {
namespace {

constexpr int64_t kRowBlock = 256;  // rows converted and multiplied at a time

std::string reject_unless_cpu(const Context& ctx) {
  return ctx.device().is_cpu() ? "" : str("the context's device is ", ctx.device().to_string());
}

// CBLAS takes every dimension and leading dimension as an int. The row counts passed are at most
// kRowBlock; K and N (dimensions and leading dimensions) must fit, or the call is refused here —
// before any work — instead of narrowed (a wrapped K computes a wrong result silently, a negative
// one makes OpenBLAS print "illegal value" and return with the output unwritten). Chunking would
// not lift the limit: the leading dimension of a row-major [rows, K] operand is K itself.
std::string reject_unless_int(std::string_view dim, int64_t value) {
  if (value <= INT_MAX) return "";
  return str(dim, " = ", value, " exceeds the CPU backend's limit of ", INT_MAX,
             " (CBLAS dimensions are int)");
}

// OpenBLAS's threads do the parallel work. The conversions around them stay on the calling
// thread: a second thread pool (OpenMP) spinning beside OpenBLAS's slowed steps down 15x here.
void set_threads(const Context& ctx) { openblas_set_num_threads(ctx.threads()); }

const char* row_ptr(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.data()) +
         row * t.strides()[0] * static_cast<int64_t>(size_of(t.dtype()));
}
char* row_ptr_mut(const Tensor& t, int64_t row) { return const_cast<char*>(row_ptr(t, row)); }

void to_f32_block(const void* src, DType t, float* dst, int64_t n) {
  to_f32(src, t, dst, static_cast<size_t>(n));
}
void from_f32_block(const float* src, void* dst, DType t, int64_t n) {
  from_f32(src, dst, t, static_cast<size_t>(n));
}

void add_bias_rows(float* y, int64_t rows, int64_t n, const float* bias) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * n;
    for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
  }
}

}  // namespace

// ---------------------------------------------------------------- group-M (fprop / dgrad)
std::string group_m_rejects(const detail::GroupMArgs& a) {
  std::string why = reject_unless_cpu(a.ctx);
  if (why.empty()) why = reject_unless_int("K (a's columns)", a.k);
  if (why.empty()) why = reject_unless_int("N (out's columns)", a.n);
  return why;
}

void group_m_run(const detail::GroupMArgs& args) {
  set_threads(args.ctx);
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t K = args.k, N = args.n;
  const DType dt = args.a.dtype();
  const bool transposed = args.op == BOp::Transposed;
  const CBLAS_TRANSPOSE tb = transposed ? CblasTrans : CblasNoTrans;
  const int ldb = static_cast<int>(transposed ? K : N);
  const size_t es = size_of(dt);

  std::vector<float> b32, a32, y32, bias32(static_cast<size_t>(N));
  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    const char* bg = row_ptr(args.b, g);  // [N, K] or [K, N] for group g
    const float* b_f32;
    if (dt == DType::F32) {
      b_f32 = reinterpret_cast<const float*>(bg);
    } else {
      b32.resize(static_cast<size_t>(N * K));
      to_f32_block(bg, dt, b32.data(), N * K);
      b_f32 = b32.data();
    }
    const float* bias_g = nullptr;
    if (args.bias.defined()) {
      to_f32(row_ptr(args.bias, g), dt, bias32.data(), static_cast<size_t>(N));
      bias_g = bias32.data();
    }
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, m - r0);
      const int64_t row = off + r0;
      const float* a_f32;
      float* y_f32;
      if (dt == DType::F32) {
        a_f32 = reinterpret_cast<const float*>(row_ptr(args.a, row));
        y_f32 = reinterpret_cast<float*>(row_ptr_mut(args.out, row));  // in place
      } else {
        a32.resize(static_cast<size_t>(rows * K));
        y32.resize(static_cast<size_t>(rows * N));
        to_f32_block(row_ptr(args.a, row), dt, a32.data(), rows * K);
        a_f32 = a32.data();
        y_f32 = y32.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, static_cast<int>(rows), static_cast<int>(N),
                  static_cast<int>(K), 1.0f, a_f32, static_cast<int>(K), b_f32, ldb, 0.0f, y_f32,
                  static_cast<int>(N));
      if (bias_g) add_bias_rows(y_f32, rows, N, bias_g);
      if (dt != DType::F32) from_f32_block(y_f32, row_ptr_mut(args.out, row), dt, rows * N);
    }
    off += m;
  }
  (void)es;
}

// ---------------------------------------------------------------- group-K (wgrad)
std::string group_k_rejects(const detail::GroupKArgs& a) {
  std::string why = reject_unless_cpu(a.ctx);
  if (why.empty()) why = reject_unless_int("K (x's columns)", a.k);
  if (why.empty()) why = reject_unless_int("N (dy's columns)", a.n);
  return why;
}

void group_k_run(const detail::GroupKArgs& args) {
  set_threads(args.ctx);
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t K = args.k, N = args.n;
  const DType dt = args.dy.dtype();
  const bool f32_out = args.dw.dtype() == DType::F32;

  std::vector<float> acc, dy32, x32;
  int64_t off = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    char* dw_g = row_ptr_mut(args.dw, g);  // [N, K]
    // The fp32 accumulator: the output itself when it is fp32, else a scratch block.
    float* c;
    if (f32_out) {
      c = reinterpret_cast<float*>(dw_g);
    } else {
      acc.resize(static_cast<size_t>(N * K));
      c = acc.data();
    }
    if (m == 0) {
      if (!args.accumulate) {
        if (f32_out) {
          std::fill_n(c, N * K, 0.0f);
        } else {
          std::memset(dw_g, 0, static_cast<size_t>(N * K) * size_of(args.dw.dtype()));
        }
      }
      continue;
    }
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, m - r0);
      const int64_t row = off + r0;
      const float *dy_f32, *x_f32;
      if (dt == DType::F32) {
        dy_f32 = reinterpret_cast<const float*>(row_ptr(args.dy, row));
        x_f32 = reinterpret_cast<const float*>(row_ptr(args.x, row));
      } else {
        dy32.resize(static_cast<size_t>(rows * N));
        x32.resize(static_cast<size_t>(rows * K));
        to_f32_block(row_ptr(args.dy, row), dt, dy32.data(), rows * N);
        to_f32_block(row_ptr(args.x, row), dt, x32.data(), rows * K);
        dy_f32 = dy32.data();
        x_f32 = x32.data();
      }
      const float beta = (r0 == 0 && !args.accumulate) ? 0.0f : 1.0f;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(N),
                  static_cast<int>(K), static_cast<int>(rows), 1.0f, dy_f32, static_cast<int>(N),
                  x_f32, static_cast<int>(K), beta, c, static_cast<int>(K));
    }
    if (!f32_out) from_f32_block(c, dw_g, args.dw.dtype(), N * K);
    off += m;
  }
}

// ---------------------------------------------------------------- bias gradient
std::string bias_grad_rejects(const detail::BiasGradArgs& a) { return reject_unless_cpu(a.ctx); }

void bias_grad_run(const detail::BiasGradArgs& args) {
  set_threads(args.ctx);
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const std::vector<int64_t> offs = offsets_of(counts);
  const int64_t N = args.n;
  const DType dt = args.dy.dtype();
  for (int64_t g = 0; g < args.groups; ++g) {
    std::vector<float> sum(static_cast<size_t>(N), 0.0f), row(static_cast<size_t>(N));
    for (int64_t r = offs[static_cast<size_t>(g)]; r < offs[static_cast<size_t>(g) + 1]; ++r) {
      to_f32(row_ptr(args.dy, r), dt, row.data(), static_cast<size_t>(N));
      for (int64_t j = 0; j < N; ++j) sum[static_cast<size_t>(j)] += row[static_cast<size_t>(j)];
    }
    char* db_g = row_ptr_mut(args.db, g);
    if (args.accumulate) {
      auto* d = reinterpret_cast<float*>(db_g);
      for (int64_t j = 0; j < N; ++j) d[j] += sum[static_cast<size_t>(j)];
    } else {
      from_f32(sum.data(), db_g, args.db.dtype(), static_cast<size_t>(N));
    }
  }
}

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::GroupMArgs> kGroupM{"cpu", group_m_rejects, group_m_run};
constexpr detail::Backend<detail::GroupKArgs> kGroupK{"cpu", group_k_rejects, group_k_run};
constexpr detail::Backend<detail::BiasGradArgs> kBiasGrad{"cpu", bias_grad_rejects, bias_grad_run};

}  // namespace moekit::cpu
