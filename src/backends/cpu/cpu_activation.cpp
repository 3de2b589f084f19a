// CPU backend: SwiGLU forward/backward and the grouped (prob-scaled) bias — the reference
// semantics of these primitives.
//
// Row by row on the calling thread (the work is memory-bound and small next to the GEMMs around
// it; a second thread pool beside OpenBLAS's costs more than it gains). Each row is converted to
// fp32, computed in fp32 and rounded once into the output dtype. Sums run in a fixed order, so
// results are bit-reproducible.
#include "backends/cpu/cpu_activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "moekit/core/error.h"

namespace moekit::cpu {
namespace {

std::string reject_unless_cpu(const Context& ctx) {
  return ctx.device().is_cpu() ? "" : str("the context's device is ", ctx.device().to_string());
}

const char* row_ptr(const Tensor& t, int64_t row) {
  return static_cast<const char*>(t.data()) +
         row * t.strides()[0] * static_cast<int64_t>(size_of(t.dtype()));
}
char* row_ptr_mut(const Tensor& t, int64_t row) {
  return const_cast<char*>(row_ptr(t, row));
}

int64_t valid_rows(const Context& ctx, const Splits& splits) {
  int64_t s = 0;
  for (int64_t m : read_counts(ctx, splits)) s += m;
  return s;
}

float sigmoid(float a) {
  return 1.0f / (1.0f + std::exp(-a));
}

// Column indices of a_j and b_j in h for every j (the layout, resolved once per call).
void glu_columns(int64_t F, GluLayout layout, std::vector<int64_t>& gate,
                 std::vector<int64_t>& lin) {
  gate.resize(static_cast<size_t>(F));
  lin.resize(static_cast<size_t>(F));
  for (int64_t j = 0; j < F; ++j) {
    gate[static_cast<size_t>(j)] = glu_gate_column(j, F, layout);
    lin[static_cast<size_t>(j)] = glu_linear_column(j, F, layout);
  }
}

}  // namespace

// ---------------------------------------------------------------- SwiGLU forward
std::string swiglu_forward_rejects(const detail::SwigluForwardArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void swiglu_forward_run(const detail::SwigluForwardArgs& args) {
  const int64_t S = valid_rows(args.ctx, args.splits), F = args.f;
  const DType dt = args.h.dtype();
  const float* probs = args.probs.defined() ? args.probs.data_as<const float>() : nullptr;
  std::vector<int64_t> gate, lin;
  glu_columns(F, args.layout, gate, lin);
  std::vector<float> h(static_cast<size_t>(2 * F)), z(static_cast<size_t>(F));
  for (int64_t t = 0; t < S; ++t) {
    to_f32(row_ptr(args.h, t), dt, h.data(), h.size());
    const float p = probs ? probs[t] : 1.0f;
    for (size_t j = 0; j < z.size(); ++j) {
      const float a = h[static_cast<size_t>(gate[j])], b = h[static_cast<size_t>(lin[j])];
      const float act = a * sigmoid(a) * b;  // silu(a) · b
      z[j] = p * act;
    }
    from_f32(z.data(), row_ptr_mut(args.z, t), dt, z.size());
  }
}

// ---------------------------------------------------------------- SwiGLU backward
std::string swiglu_backward_rejects(const detail::SwigluBackwardArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void swiglu_backward_run(const detail::SwigluBackwardArgs& args) {
  const int64_t S = valid_rows(args.ctx, args.splits), F = args.f;
  const DType dt = args.h.dtype();
  const float* probs = args.probs.defined() ? args.probs.data_as<const float>() : nullptr;
  float* dprobs = args.dprobs.defined() ? args.dprobs.data_as<float>() : nullptr;
  std::vector<int64_t> gate, lin;
  glu_columns(F, args.layout, gate, lin);
  std::vector<float> h(static_cast<size_t>(2 * F)), dz(static_cast<size_t>(F)),
      dh(static_cast<size_t>(2 * F));
  for (int64_t t = 0; t < S; ++t) {
    to_f32(row_ptr(args.h, t), dt, h.data(), h.size());
    to_f32(row_ptr(args.dz, t), dt, dz.data(), dz.size());
    const float p = probs ? probs[t] : 1.0f;
    float dp = 0.0f;
    for (size_t j = 0; j < dz.size(); ++j) {
      const auto ia = static_cast<size_t>(gate[j]), ib = static_cast<size_t>(lin[j]);
      const float a = h[ia], b = h[ib];
      const float sig = sigmoid(a);
      const float silu = a * sig;
      const float dsilu = sig * (1.0f + a * (1.0f - sig));
      const float pdz = p * dz[j];
      dh[ia] = pdz * b * dsilu;
      dh[ib] = pdz * silu;
      dp += dz[j] * (silu * b);
    }
    from_f32(dh.data(), row_ptr_mut(args.dh, t), dt, dh.size());
    if (dprobs) dprobs[t] = args.accumulate_dprobs ? dprobs[t] + dp : dp;
  }
}

// ---------------------------------------------------------------- grouped bias add
std::string bias_add_rejects(const detail::BiasAddArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void bias_add_run(const detail::BiasAddArgs& args) {
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t N = args.n;
  const DType dt = args.x.dtype();
  const float* probs = args.probs.defined() ? args.probs.data_as<const float>() : nullptr;
  std::vector<float> bias(static_cast<size_t>(N)), row(static_cast<size_t>(N));
  int64_t t = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    if (m == 0) continue;
    to_f32(row_ptr(args.bias, g), dt, bias.data(), bias.size());
    for (const int64_t end = t + m; t < end; ++t) {
      to_f32(row_ptr(args.x, t), dt, row.data(), row.size());
      if (probs) {
        const float p = probs[t];
        for (size_t n = 0; n < row.size(); ++n) row[n] += p * bias[n];
      } else {
        for (size_t n = 0; n < row.size(); ++n) row[n] += bias[n];
      }
      from_f32(row.data(), row_ptr_mut(args.out, t), dt, row.size());
    }
  }
}

// ---------------------------------------------------------------- scaled bias gradient
std::string scaled_bias_grad_rejects(const detail::ScaledBiasGradArgs& a) {
  return reject_unless_cpu(a.ctx);
}

void scaled_bias_grad_run(const detail::ScaledBiasGradArgs& args) {
  const std::vector<int64_t> counts = read_counts(args.ctx, args.splits);
  const int64_t N = args.n;
  const DType dt = args.dy.dtype();
  const float* probs = args.probs.data_as<const float>();
  float* dprobs = args.dprobs.defined() ? args.dprobs.data_as<float>() : nullptr;
  std::vector<float> bias(static_cast<size_t>(N)), row(static_cast<size_t>(N)),
      sum(static_cast<size_t>(N));
  int64_t t = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t m = counts[static_cast<size_t>(g)];
    std::fill(sum.begin(), sum.end(), 0.0f);
    if (dprobs && m > 0) to_f32(row_ptr(args.bias, g), dt, bias.data(), bias.size());
    for (const int64_t end = t + m; t < end; ++t) {
      to_f32(row_ptr(args.dy, t), dt, row.data(), row.size());
      const float p = probs[t];
      for (size_t n = 0; n < row.size(); ++n) sum[n] += p * row[n];
      if (dprobs) {
        float dp = 0.0f;
        for (size_t n = 0; n < row.size(); ++n) dp += row[n] * bias[n];
        dprobs[t] = args.accumulate_dprobs ? dprobs[t] + dp : dp;
      }
    }
    if (args.db.defined())
      from_f32(sum.data(), row_ptr_mut(args.db, g), args.db.dtype(), sum.size());
  }
}

// This backend's entries in the primitives' tables (declared in its header).
constexpr detail::Backend<detail::SwigluForwardArgs> kSwigluForward{
    "cpu", swiglu_forward_rejects, swiglu_forward_run};
constexpr detail::Backend<detail::SwigluBackwardArgs> kSwigluBackward{
    "cpu", swiglu_backward_rejects, swiglu_backward_run};
constexpr detail::Backend<detail::BiasAddArgs> kBiasAdd{"cpu", bias_add_rejects, bias_add_run};
constexpr detail::Backend<detail::ScaledBiasGradArgs> kScaledBiasGrad{
    "cpu", scaled_bias_grad_rejects, scaled_bias_grad_run};

}  // namespace moekit::cpu
