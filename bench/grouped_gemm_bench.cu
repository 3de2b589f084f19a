// moekit_bench — the PERFORMANCE.md grouped-GEMM shape suite through moekit's public API, every
// moekit backend side by side.
//
// How to run (GPU machine):
//   moekit_bench [--shapes a,b] [--routing uniform,skewed] [--passes fprop,dgrad,wgrad,wgrad_f32]
//                [--backends sm90,cublas] [--iters 20] [--warmup 5] [--warmup-ms 500] [--seed 1234]
//                [--json out.json] [--commit id] [--compare shapes|none] [--timing alone|turns|back-to-back]
//                [--list] [--data normal|constant]
// --list prints the shapes a run would take (one line each: name E T K N) and stops, no GPU needed.
// --data constant fills every input with 1.0 instead of normal draws: for power studies only (the
// tensor cores' operands then never toggle; the targets are judged on normal data).
// --shapes takes the suite's names and, for studies, custom_E<E>_T<T>_K<K>_N<N> (any sizes, K and N
// multiples of 8; e.g. custom_E1_T4096_K7168_N4096, one group of dsv3 fc1), which tools/gemm-profile
// passes through.
// Backends: "auto" (the headline: nothing forced, device splits — the README's graph-safe path;
// the backend it took, moekit::last_backend, is recorded as "ran") and each backend of --backends
// forced (Context::with_backend(name), host splits): group-M (fprop, dgrad) and group-K (wgrad)
// both have "sm90" and "cublas". A recipe name among --backends (fp8-current, fp8-block; mxfp8,
// nvfp4 run emulated on Hopper) adds that recipe's quantized GEMM of the pass as a column: the
// operands quantized once before its runs (TE's roles: x and W rowwise for fprop, dy rowwise and
// W columnwise for dgrad, dy and x columnwise for wgrad; not timed), the automatic choice with
// device splits ("ran": cuda-fp8 on Hopper), checked against fp64 dot products of the
// dequantized copies it read within the FP8 tensor cores' accumulation tolerance (2^-12, as the
// tests); rows per group must be multiples of the recipe's 16 (SPEC §6c), so skewed routing
// skips these columns with that reason. A backend that
// refuses a call (its rejects() reason, e.g. no sm_90 device, or a build without it) is skipped
// and its reason printed. The automatic choice is the first backend of the table that accepts,
// i.e. sm90 where it accepts; "best" names the faster backend of the row.
// For every shape × routing × pass × backend: random normal bf16 inputs (never zeros), the
// output poisoned with NaN, one run, then the correctness check of that run's output (no
// non-finite element in rows [0, S) and sampled elements against fp64 host dot products of the
// same stored bf16 inputs; tolerance: the tests' rule, eps(bf16)·|ref| + eps(f32)·L·Σ|term|).
// Then warm-up and `iters` runs per backend, timed with CUDA events on the context's stream;
// the median (and min) are reported. The warm-up is `warmup` calls and then at least `warmup_ms`
// of calls, so every configuration is timed under sustained load (the H200 then sits at its
// power cap): bench/peers.py warms up the same way, so a peer timed in another process, after a
// pause, does not start on a cool GPU. (Before, at fdd4834: the suite's first configuration,
// dsv3_fc1_E8 uniform fprop, gave torch._grouped_mm 769 and the per-expert loop 777 TFLOP/s,
// against 635-687 for the shape's other five configurations.)
// --timing alone (default): each backend is warmed up and timed on its own, one after another,
// as bench/peers.py times each peer: under the power cap the clock a kernel is allowed depends on
// the energy it spends per cycle, and a backend timed in turns with another runs at their shared
// clock (PERFORMANCE.md, "The step runs clock-limited": the dsv3 step on cuBLAS ran at 1560 MHz,
// on sm90 at 1380-1395, same cap). --timing turns: warm-up and timed calls in turns (4 rounds),
// for A/B of work per cycle at one clock. --timing back-to-back: as alone, but each timed run is
// 16 calls enqueued back to back, its time / 16 per call — what a training step's stream sees,
// the host's enqueue hidden behind the GPU's work (the small calls' A/B: tools/ab-bench AB_TIMING).
// Either way each backend's SM clock, board power and
// active clock-event reasons are read (NVML, when the driver has it) halfway through its timed
// calls, and printed and written with its numbers.
// Comparisons (--compare, default qwen3_fc2_E16,small_E64; uniform; fprop, and wgrad for the
// latency; the first backend),
// each a ratio of medians measured in turns, outputs compared bit for bit:
//   device/host splits   grouped_gemm_group_m with Splits::device(int64 counts on the GPU) vs
//                        Splits::host (PERFORMANCE.md: device splits cost nothing extra)
//   caller/internal out  GroupedLinear::forward with {.output = y} vs an internally allocated
//                        output (PERFORMANCE.md: caller buffers cost nothing)
//   alone/back-to-back   the device-split call timed alone (events around it, as every time in
//                        the suite and in bench/peers.py) vs per call of back-to-back calls:
//                        the host and launch latency a call pays alone (not a target); fprop
//                        and wgrad (group-K: its own setup and zero-fill kernels)
// Routing: uniform (T/E rows each) or skewed (Dirichlet(1) split of T, seeded; some experts get
// few or no rows). The JSON (--json) holds the splits of every configuration so bench/peers.py
// times torch on exactly the same problems, and every backend's numbers.
//
// Passes (W [E, N, K] bf16, x [T, K], dy [T, N]; FLOPs = 2·S·N·K each):
//   fprop  y  = x_g · W_gᵀ     grouped_gemm_group_m(..., BOp::Transposed, ...)
//   dgrad  dx = dy_g · W_g     grouped_gemm_group_m(..., BOp::Plain, ...)
//   wgrad  dW_g = dy_gᵀ · x_g  grouped_gemm_group_k(..., accumulate = false), bf16 out
//   wgrad_f32  main_grad_g += dy_gᵀ · x_g  grouped_gemm_group_k(..., accumulate = true) into an
//              fp32 main_grad [E, N, K] (the training path with fused weight-gradient
//              accumulation); checked against its starting values plus the fp64 sum
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "moekit/moekit.h"

#ifndef MOEKIT_GIT_COMMIT
#define MOEKIT_GIT_COMMIT "unknown"
#endif

namespace {

using moekit::BOp;
using moekit::Context;
using moekit::DType;
using moekit::Splits;
using moekit::Tensor;
using moekit_bench::dirichlet_counts;
using moekit_bench::randn_bf16;

struct Shape {
  const char* name;
  int64_t E, T, K, N;
  const char* model;
};
// PERFORMANCE.md "Shape suite".
const Shape kSuite[] = {
    {"dsv3_fc1_E8", 8, 32768, 7168, 4096, "DeepSeek-V3 gate+up, EP=32"},
    {"dsv3_fc2_E8", 8, 32768, 2048, 7168, "DeepSeek-V3 down"},
    {"dsv3_fc1_E32", 32, 32768, 7168, 4096, "DeepSeek-V3, EP=8"},
    {"qwen3_fc1_E16", 16, 16384, 4096, 3072, "Qwen3-235B-A22B gate+up"},
    {"qwen3_fc2_E16", 16, 16384, 1536, 4096, "Qwen3 down"},
    {"mixtral_fc1_E8", 8, 16384, 4096, 28672, "Mixtral 8x7B gate+up"},
    {"small_E64", 64, 4096, 2048, 1024, "many small experts (decode-like)"},
};

// A shape outside the suite, named custom_E<E>_T<T>_K<K>_N<N> (e.g. custom_E1_T4096_K7168_N4096:
// one group of dsv3 fc1, for a kernel with no group changes), for studies; nullopt if `name` is
// not of that form or its sizes are not usable (E >= 1, T >= 0, K and N positive multiples of 8).
// The names live in a deque so Shape::name stays valid.
std::optional<Shape> custom_shape(const std::string& name) {
  long long e = 0, t = 0, k = 0, n = 0;
  int used = 0;
  if (std::sscanf(name.c_str(), "custom_E%lld_T%lld_K%lld_N%lld%n", &e, &t, &k, &n, &used) != 4 ||
      used != static_cast<int>(name.size()) || e < 1 || t < 0 || k <= 0 || n <= 0 || k % 8 != 0 ||
      n % 8 != 0) {
    return std::nullopt;
  }
  static std::deque<std::string> names;
  return Shape{names.emplace_back(name).c_str(), e, t, k, n, "custom"};
}

// An empty list wants everything.
bool wanted(const std::vector<std::string>& list, const std::string& x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

// The shapes a run takes: the suite's named in --shapes (all of them without --shapes), in suite
// order, then the custom ones in the order given; each with the index its seeds derive from (a
// suite shape's own index in the suite, so its skewed splits and data do not depend on which other
// shapes run; custom ones after). (From 5ee7c7a to 2026-12-01 a run without --shapes took none:
// tools/gpu-check's suite printed no rows; ctest bench.selection checks this with --list.)
struct SelectedShape {
  Shape shape;
  size_t index;
};
std::vector<SelectedShape> selected_shapes(const std::vector<std::string>& wanted_names) {
  std::vector<SelectedShape> out;
  for (size_t i = 0; i < std::size(kSuite); ++i) {
    if (wanted(wanted_names, kSuite[i].name)) out.push_back({kSuite[i], i});
  }
  size_t next = std::size(kSuite);
  for (const std::string& name : wanted_names) {
    if (std::optional<Shape> c = custom_shape(name)) out.push_back({*c, next++});
  }
  return out;
}

// ---------------------------------------------------------------- device helpers

template <class T>
__global__ void count_nonfinite(const T* p, size_t n, unsigned long long* count) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  unsigned long long local = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (!isfinite(static_cast<float>(p[i]))) ++local;
  }
  if (local) atomicAdd(count, local);
}

// Standard normal fp32 (a main_grad's starting values): the bf16 generator's draws, widened.
__global__ void bf16_to_f32(const __nv_bfloat16* src, float* dst, size_t n) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, float value) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = __float2bfloat16_rn(value);
  }
}

// --data constant (a power study, not a benchmark): every input 1.0 instead of normal draws, so
// the tensor cores' operands never change. Set once, from the command line, before any run.
bool g_constant_data = false;

// A bf16 input: normal(0, 1) draws from `seed`, or 1.0 everywhere under --data constant.
void fill_input(const Context& ctx, const Tensor& t, uint64_t seed) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  if (g_constant_data) {
    fill_bf16<<<1024, 256, 0, stream>>>(t.data_as<__nv_bfloat16>(), static_cast<size_t>(t.numel()), 1.0f);
  } else {
    randn_bf16<<<1024, 256, 0, stream>>>(t.data_as<__nv_bfloat16>(), static_cast<size_t>(t.numel()), seed);
  }
  MOEKIT_BENCH_CHECK(cudaGetLastError());
}

// Non-finite elements among the first n of p (bf16, or f32 when `f32`).
unsigned long long nonfinite(const Context& ctx, const void* p, size_t n, bool f32 = false) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  Tensor counter = Tensor::empty({1}, DType::I64, ctx);
  MOEKIT_BENCH_CHECK(cudaMemsetAsync(counter.data(), 0, 8, stream));
  if (n && f32) {
    count_nonfinite<<<1024, 256, 0, stream>>>(static_cast<const float*>(p), n,
                                              counter.data_as<unsigned long long>());
    MOEKIT_BENCH_CHECK(cudaGetLastError());
  } else if (n) {
    count_nonfinite<<<1024, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(p), n,
                                              counter.data_as<unsigned long long>());
    MOEKIT_BENCH_CHECK(cudaGetLastError());
  }
  unsigned long long host = 0;
  MOEKIT_BENCH_CHECK(cudaMemcpyAsync(&host, counter.data(), 8, cudaMemcpyDeviceToHost, stream));
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  return host;
}

template <class T>
__global__ void gather_strided(const T* src, int64_t stride, int64_t count, T* dst) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i * stride];
  }
}

// Copies `count` elements (bf16, or f32 when `f32`) spaced `stride` elements apart, starting at
// element `first` of `base`, to the host as doubles (a row: stride 1; a column: stride = row
// length, gathered on the device first). Synchronous (legacy default stream); callers
// synchronise their stream first.
std::vector<double> fetch(const void* base, int64_t first, int64_t count, int64_t stride,
                          bool f32 = false) {
  static void* scratch = nullptr;  // column gathers (at most T elements); process lifetime
  static size_t scratch_bytes = 0;
  const size_t size = f32 ? 4 : 2, bytes = static_cast<size_t>(count) * size;
  const char* src = static_cast<const char*>(base) + static_cast<size_t>(first) * size;
  if (stride != 1) {
    if (scratch_bytes < bytes) {
      if (scratch) MOEKIT_BENCH_CHECK(cudaFree(scratch));
      MOEKIT_BENCH_CHECK(cudaMalloc(&scratch, bytes));
      scratch_bytes = bytes;
    }
    if (f32) {
      gather_strided<<<64, 256>>>(reinterpret_cast<const float*>(src), stride, count,
                                  static_cast<float*>(scratch));
    } else {
      gather_strided<<<64, 256>>>(reinterpret_cast<const __nv_bfloat16*>(src), stride, count,
                                  static_cast<__nv_bfloat16*>(scratch));
    }
    MOEKIT_BENCH_CHECK(cudaGetLastError());
    src = static_cast<const char*>(scratch);
  }
  std::vector<double> out(static_cast<size_t>(count));
  if (f32) {
    std::vector<float> raw(out.size());
    MOEKIT_BENCH_CHECK(cudaMemcpy(raw.data(), src, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < raw.size(); ++i) out[i] = raw[i];
  } else {
    std::vector<__nv_bfloat16> raw(out.size());
    MOEKIT_BENCH_CHECK(cudaMemcpy(raw.data(), src, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<double>(__bfloat162float(raw[i]));
  }
  return out;
}

double fetch_one(const void* base, int64_t index) { return fetch(base, index, 1, 1)[0]; }
double fetch_one_f32(const void* base, int64_t index) {
  float v = 0;
  MOEKIT_BENCH_CHECK(
      cudaMemcpy(&v, static_cast<const float*>(base) + index, 4, cudaMemcpyDeviceToHost));
  return v;
}

// ---------------------------------------------------------------- routing

std::vector<int64_t> uniform_counts(int64_t E, int64_t T) {
  std::vector<int64_t> c(static_cast<size_t>(E), T / E);
  for (int64_t g = 0; g < T % E; ++g) ++c[static_cast<size_t>(g)];
  return c;
}

// ---------------------------------------------------------------- clock samples

// The SM clock, board power and active clock-event (throttle) reasons, read through NVML when
// the driver's library loads (dlopen: no build dependency; the C API is declared here, as nvml.h
// has it). Without it, every sample is empty.
struct ClockSample {
  unsigned mhz = 0, milliwatts = 0;
  unsigned long long reasons = 0;
  bool valid = false;
};

class Nvml {
 public:
  static Nvml& instance() {
    static Nvml n;
    return n;
  }
  ClockSample sample() const {
    ClockSample c;
    if (!device_) return c;
    c.valid = clock_(device_, kClockSm, &c.mhz) == 0;
    if (power_) power_(device_, &c.milliwatts);
    if (reasons_) reasons_(device_, &c.reasons);
    return c;
  }

 private:
  using Device = void*;
  static constexpr int kClockSm = 1;  // NVML_CLOCK_SM
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, Device*)>(
        dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_ =
        reinterpret_cast<int (*)(Device, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(Device, unsigned*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    reasons_ = reinterpret_cast<int (*)(Device, unsigned long long*)>(
        dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons_) {  // drivers before the rename
      reasons_ = reinterpret_cast<int (*)(Device, unsigned long long*)>(
          dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    }
    char bus[32] = {};
    int cuda_device = 0;
    if (!init || !by_bus || !clock_ || init() != 0 || cudaGetDevice(&cuda_device) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess ||
        by_bus(bus, &device_) != 0) {
      device_ = nullptr;
    }
  }
  Device device_ = nullptr;
  int (*clock_)(Device, int, unsigned*) = nullptr;
  int (*power_)(Device, unsigned*) = nullptr;
  int (*reasons_)(Device, unsigned long long*) = nullptr;
};

// The active reasons by name (nvml.h's nvmlClocksEventReason* bits), "+"-joined; "none" if none.
std::string reason_names(unsigned long long r) {
  static const std::pair<unsigned long long, const char*> kNames[] = {
      {0x1, "idle"}, {0x2, "app_clocks"}, {0x4, "sw_power_cap"}, {0x8, "hw_slowdown"},
      {0x10, "sync_boost"}, {0x20, "sw_thermal"}, {0x40, "hw_thermal"},
      {0x80, "hw_power_brake"}, {0x100, "display_clocks"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if (!(r & bit)) continue;
    if (!out.empty()) out += '+';
    out += name;
  }
  return out.empty() ? "none" : out;
}

// ---------------------------------------------------------------- results

struct Check {
  int samples = 0;
  double worst = 0;  // max |got - ref| / tol over the samples
  unsigned long long nonfinite = 0;
  bool pass() const { return samples > 0 && worst <= 1.0 && nonfinite == 0; }
};

// One backend's numbers for one configuration.
struct BackendRun {
  std::string name;
  std::string skipped;  // why the backend refused the call ("" when it ran)
  std::string ran_on;   // "auto": the backend the automatic choice took
  std::vector<double> ms;
  double median_ms = 0, min_ms = 0, tflops = 0;
  ClockSample clock;  // halfway through its timed calls
  Check check;
  bool ran() const { return skipped.empty(); }
};

struct Result {
  Shape shape;  // a copy: the selected shapes are a temporary of the run loop
  std::string routing, pass;
  std::vector<int64_t> counts;
  std::vector<BackendRun> backends;  // in --backends order; only those with a table entry
  int best = -1;                     // index of the fastest backend that ran and passed
};

// A ratio of two paths of the same computation (PERFORMANCE.md "cost nothing" targets).
struct Comparison {
  std::string shape, routing, pass, what, a_label, b_label;
  double a_ms = 0, b_ms = 0;
  bool identical = false;  // outputs bit-identical
  std::string note;        // printed after the ratio (e.g. the host's enqueue time per call)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// ---------------------------------------------------------------- recipe columns

// A --backends name that is a recipe (SPEC §6: fp8-current, fp8-block, mxfp8, nvfp4): its column
// times the recipe's quantized GEMM of the pass on the automatic choice with device splits, its
// operands quantized once beforehand (not timed; a training step quantizes each operand once for
// all the GEMMs that read it: bench/studies/recipe_profile.py times the quantize kernels).
bool is_recipe(const std::string& name) {
  try {
    return moekit::Recipe::parse(name).enabled();  // "none" / "bf16": the plain computation
  } catch (const moekit::Error&) {
    return false;  // a backend's name
  }
}

// The FP8 tensor cores' accumulation, as the tests take it (tests/support/reference.h).
constexpr double kFp8TensorCoreEpsilon = 1.0 / 4096.0;

// The quantized operands of one pass, as a training step makes them (QuantRole per operand, the
// copy its GEMM reads): fprop a = x rowwise, b = W rowwise; dgrad a = dy rowwise, b = W
// columnwise; wgrad a = dy columnwise, b = x columnwise.
struct RecipeOperands {
  moekit::QuantizedTensor a, b;
};
RecipeOperands quantize_operands(const Context& ctx, const moekit::Recipe& r, const std::string& pass,
                                 const Shape& s, const Splits& splits, const Tensor& x,
                                 const Tensor& w, const Tensor& dy) {
  using moekit::QuantRole;
  using moekit::QuantUsage;
  if (pass == "fprop") {
    return {moekit::quantize(ctx, x, splits, r.spec(QuantRole::Input), QuantUsage::Rowwise),
            moekit::quantize_weight(ctx, w, r.spec(QuantRole::Weight), QuantUsage::Rowwise)};
  }
  if (pass == "dgrad") {
    return {moekit::quantize(ctx, dy, splits, r.spec(QuantRole::GradOutput), QuantUsage::Rowwise),
            moekit::quantize_weight(ctx, w, r.spec(QuantRole::Weight), QuantUsage::Columnwise)};
  }
  (void)s;
  return {moekit::quantize(ctx, dy, splits, r.spec(QuantRole::GradOutput), QuantUsage::Columnwise),
          moekit::quantize(ctx, x, splits, r.spec(QuantRole::Input), QuantUsage::Columnwise)};
}

// The copies a recipe column's GEMM read, dequantized to f32 in the layouts Inputs names.
struct Dequantized {
  Tensor x, w, dy;
};
Dequantized dequantize_operands(const Context& ctx, const RecipeOperands& q, const std::string& pass,
                                const Shape& s, const Splits& splits) {
  using moekit::QuantUsage;
  const Splits weight_rows = Splits::host(std::vector<int64_t>(static_cast<size_t>(s.E), s.N));
  Dequantized d;
  auto dq = [&](const moekit::QuantizedTensor& t, const Splits& sp, QuantUsage which, int64_t r, int64_t c) {
    Tensor out = Tensor::empty({r, c}, DType::F32, ctx);
    MOEKIT_BENCH_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), static_cast<cudaStream_t>(ctx.stream())));
    moekit::dequantize(ctx, t, sp, which, out);
    return out;
  };
  if (pass == "fprop") {
    d.x = dq(q.a, splits, QuantUsage::Rowwise, s.T, s.K);
    d.w = dq(q.b, weight_rows, QuantUsage::Rowwise, s.E * s.N, s.K);
    d.dy = d.x;  // not read
  } else if (pass == "dgrad") {
    d.dy = dq(q.a, splits, QuantUsage::Rowwise, s.T, s.N);
    d.w = dq(q.b, weight_rows, QuantUsage::Columnwise, s.K, s.E * s.N);
    d.x = d.dy;  // not read
  } else {
    d.dy = dq(q.a, splits, QuantUsage::Columnwise, s.N, s.T);
    d.x = dq(q.b, splits, QuantUsage::Columnwise, s.K, s.T);
    d.w = d.x;  // not read
  }
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream())));
  return d;
}

// ---------------------------------------------------------------- the runner

// The passes, in the order they run (the header comment says what each computes).
const std::vector<std::string> kPasses{"fprop", "dgrad", "wgrad", "wgrad_f32"};

// How the backends of one configuration are timed (--timing; the header says why).
enum class Timing { Alone, Turns, BackToBack };
const char* timing_name(Timing t) {
  return t == Timing::Alone ? "alone" : t == Timing::Turns ? "turns" : "back-to-back";
}
// Calls per timed run with --timing back-to-back.
constexpr int kBackToBackCalls = 16;

struct Options {
  std::vector<std::string> shapes, routings{"uniform", "skewed"}, passes = kPasses;
  std::vector<std::string> backends{"auto", "sm90", "cublas", "fp8-current", "fp8-block"};
  std::vector<std::string> compare{"qwen3_fc2_E16", "small_E64"};
  int iters = 20, warmup = 5, samples = 96;
  double warmup_ms = 500;
  uint64_t seed = 1234;
  std::string json, commit;
  Timing timing = Timing::Alone;
  bool list = false;  // --list: print the shapes the run would take and stop (no GPU needed)
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// What a pass's check multiplies: the bf16 inputs x [T, K], w [E, N, K], dy [T, N], or for a
// recipe column the dequantized (f32) copies its GEMM read: fprop x and w rowwise; dgrad dy
// rowwise and w's columnwise copy [K, E·N]; wgrad the columnwise copies x [K, T] and dy [N, T]
// (`transposed`: the columnwise ones, as dequantize() writes them); and the accumulation's
// epsilon (fp32, or the FP8 tensor cores' kFp8TensorCoreEpsilon of tests/support/reference.h).
struct Inputs {
  const Tensor& x;
  const Tensor& w;
  const Tensor& dy;
  bool transposed = false;
  double eps_acc = 1.0 / 8388608;
};

// Sampled fp64 check of one pass. Tolerance per element: eps(bf16)·|ref| + eps_acc·L·Σ|term|.
// wgrad_f32: `out` is the fp32 main_grad after one accumulating call, `init` its values before.
Check check_pass(const Context& ctx, const std::string& pass, const Shape& s,
                 const std::vector<int64_t>& counts, const Inputs& in, const Tensor& out,
                 const Tensor& init, int samples, uint64_t seed) {
  Check c;
  const Tensor &x = in.x, &w = in.w, &dy = in.dy;
  const bool f32_in = x.dtype() == DType::F32;
  const int64_t K = s.K, N = s.N;
  const std::vector<int64_t> off = moekit::offsets_of(counts);
  const int64_t S = off.back();
  const bool f32 = pass == "wgrad_f32", weight = pass == "wgrad" || f32;
  c.nonfinite = nonfinite(ctx, out.data(), static_cast<size_t>(weight ? s.E * N * K : S * (pass == "fprop" ? N : K)), f32);
  std::vector<int64_t> groups;
  for (int64_t g = 0; g < s.E; ++g) {
    if (counts[static_cast<size_t>(g)] > 0) groups.push_back(g);
  }
  std::mt19937_64 rng(seed);
  // The output's rounding (bf16, or fp32 for main_grad) and the accumulation's.
  const double eps_out = f32 ? 1.0 / 8388608 : 1.0 / 128, eps_acc = in.eps_acc;
  for (int i = 0; i < samples; ++i) {
    const int64_t g = groups[static_cast<size_t>(i) % groups.size()];
    const int64_t m = counts[static_cast<size_t>(g)];
    // The first and last row of each group come first, then random rows.
    const size_t round = static_cast<size_t>(i) / groups.size();
    const int64_t r = off[static_cast<size_t>(g)] +
                      (round == 0 ? 0 : round == 1 ? m - 1 : static_cast<int64_t>(rng() % static_cast<uint64_t>(m)));
    std::vector<double> u, v;
    double got, start = 0;
    if (pass == "fprop") {  // y[r, n] = Σ_k x[r, k] · W[g, n, k]
      const int64_t n = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
      u = fetch(x.data(), r * K, K, 1, f32_in);
      v = fetch(w.data(), (g * N + n) * K, K, 1, f32_in);
      got = fetch_one(out.data(), r * N + n);
    } else if (pass == "dgrad") {  // dx[r, k] = Σ_n dy[r, n] · W[g, n, k]
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(K));
      u = fetch(dy.data(), r * N, N, 1, f32_in);
      v = in.transposed ? fetch(w.data(), k * s.E * N + g * N, N, 1, f32_in)
                        : fetch(w.data(), g * N * K + k, N, K, f32_in);
      got = fetch_one(out.data(), r * K + k);
    } else {  // dW[g, n, k] = Σ_{r in g} dy[r, n] · x[r, k]
      const int64_t n = static_cast<int64_t>(rng() % static_cast<uint64_t>(N));
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(K));
      const int64_t first = off[static_cast<size_t>(g)];
      u = in.transposed ? fetch(dy.data(), n * s.T + first, m, 1, f32_in)
                        : fetch(dy.data(), first * N + n, m, N, f32_in);
      v = in.transposed ? fetch(x.data(), k * s.T + first, m, 1, f32_in)
                        : fetch(x.data(), first * K + k, m, K, f32_in);
      if (f32) {
        start = fetch_one_f32(init.data(), (g * N + n) * K + k);
        got = fetch_one_f32(out.data(), (g * N + n) * K + k);
      } else {
        got = fetch_one(out.data(), (g * N + n) * K + k);
      }
    }
    double ref = start, mag = std::abs(start);
    for (size_t j = 0; j < u.size(); ++j) {
      ref += u[j] * v[j];
      mag += std::abs(u[j] * v[j]);
    }
    const double tol = eps_out * std::abs(ref) + eps_acc * static_cast<double>(u.size()) * mag;
    const double err = std::abs(got - ref);
    c.worst = std::max(c.worst, std::isfinite(got) ? err / tol : INFINITY);
    ++c.samples;
  }
  return c;
}

// Backends with an entry in the table of the pass's primitive (backend_table.h): every pass has
// "sm90" and "cublas" (kept as a hook for a backend that serves only some primitives).
bool has_entry(const std::string& pass, const std::string& backend) {
  (void)pass;
  (void)backend;
  return true;
}

struct Timed {
  std::vector<double> ms;  // per call
  ClockSample clock;       // read halfway through the timed calls
};

// Times every function `iters` times, each call with CUDA events on `stream`, after `warmup`
// calls and at least `warmup_ms` of sustained calls (a sync after each). Alone: one function
// after another, each with its own warm-up; turns: warm-up and timed calls in turns (4 rounds of
// iters/4 calls per function), so clock and temperature drift hit all alike.
std::vector<Timed> time_calls(const std::vector<std::function<void()>>& fns, Timing timing,
                              int iters, int warmup, double warmup_ms, cudaStream_t stream,
                              cudaEvent_t start, cudaEvent_t stop) {
  auto warm = [&](const std::vector<const std::function<void()>*>& group) {
    for (const auto* f : group) {
      for (int i = 0; i < warmup; ++i) (*f)();
    }
    MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() <
           warmup_ms) {
      for (const auto* f : group) (*f)();
      MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
    }
  };
  std::vector<Timed> out(fns.size());
  const int calls = timing == Timing::BackToBack ? kBackToBackCalls : 1;
  auto timed = [&](size_t f, int n, bool sample_midway) {
    for (int i = 0; i < n; ++i) {
      MOEKIT_BENCH_CHECK(cudaEventRecord(start, stream));
      for (int c = 0; c < calls; ++c) fns[f]();
      MOEKIT_BENCH_CHECK(cudaEventRecord(stop, stream));
      MOEKIT_BENCH_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
      out[f].ms.push_back(t / calls);
      if (sample_midway && i == n / 2) out[f].clock = Nvml::instance().sample();
    }
  };
  if (timing != Timing::Turns) {
    for (size_t f = 0; f < fns.size(); ++f) {
      warm({&fns[f]});
      timed(f, iters, true);
    }
    return out;
  }
  std::vector<const std::function<void()>*> all;
  for (const auto& f : fns) all.push_back(&f);
  warm(all);
  const int rounds = std::min(4, iters);
  for (int r = 0; r < rounds; ++r) {
    const int n = iters / rounds + (r < iters % rounds ? 1 : 0);
    for (size_t f = 0; f < fns.size(); ++f) timed(f, n, r == rounds / 2);
  }
  return out;
}

// The comparisons' timing: in turns, per-call times only.
std::vector<std::vector<double>> time_in_turns(const std::vector<std::function<void()>>& fns,
                                               int iters, int warmup, double warmup_ms,
                                               cudaStream_t stream, cudaEvent_t start,
                                               cudaEvent_t stop) {
  std::vector<std::vector<double>> ms;
  for (Timed& t : time_calls(fns, Timing::Turns, iters, warmup, warmup_ms, stream, start, stop)) {
    ms.push_back(std::move(t.ms));
  }
  return ms;
}

__global__ void count_diff_u16(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* count) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  unsigned long long local = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (a[i] != b[i]) ++local;
  }
  if (local) atomicAdd(count, local);
}

bool identical_bf16(const Context& ctx, const void* a, const void* b, size_t n) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  Tensor counter = Tensor::empty({1}, DType::I64, ctx);
  MOEKIT_BENCH_CHECK(cudaMemsetAsync(counter.data(), 0, 8, stream));
  if (n) {
    count_diff_u16<<<1024, 256, 0, stream>>>(static_cast<const uint16_t*>(a),
                                             static_cast<const uint16_t*>(b), n,
                                             counter.data_as<unsigned long long>());
    MOEKIT_BENCH_CHECK(cudaGetLastError());
  }
  unsigned long long host = 0;
  MOEKIT_BENCH_CHECK(cudaMemcpyAsync(&host, counter.data(), 8, cudaMemcpyDeviceToHost, stream));
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  return host == 0;
}

// One call alone (as every timing in the suite: events around the call, host enqueue included) vs
// per call of back-to-back calls (the host runs ahead: what a training step's stream sees); the
// difference is the per-call host and launch latency. `out` is what `call` writes (its first
// `valid` bf16 values): the first call's copy (in `copy`) against the last call's (repeated calls
// must be bit-identical).
template <class Call>
Comparison alone_vs_back_to_back(const Context& ctx, const Options& o, const Shape& s, const char* pass,
                                 Call call, const Tensor& out, const Tensor& copy, size_t valid,
                                 cudaEvent_t start, cudaEvent_t stop) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  call();
  MOEKIT_BENCH_CHECK(
      cudaMemcpyAsync(copy.data(), out.data(), valid * 2, cudaMemcpyDeviceToDevice, stream));
  const auto alone = time_in_turns({call}, o.iters, o.warmup, o.warmup_ms, stream, start, stop);
  const int calls = std::max(8, o.iters);
  std::vector<double> per_call, enqueue_us;
  for (int r = 0; r < 5; ++r) {
    MOEKIT_BENCH_CHECK(cudaEventRecord(start, stream));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    enqueue_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
    MOEKIT_BENCH_CHECK(cudaEventRecord(stop, stream));
    MOEKIT_BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    MOEKIT_BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    per_call.push_back(t / calls);
  }
  // The host's enqueue time per call (the loop above, which returns before the GPU finishes)
  // says how much of the difference is host work between the start event and the launches.
  Comparison c{s.name, "uniform", pass, "alone/back-to-back", "one call alone", "back-to-back calls"};
  char note[64];
  std::snprintf(note, sizeof note, "host enqueue %.1f us/call", median(enqueue_us));
  c.note = note;
  c.identical = identical_bf16(ctx, out.data(), copy.data(), valid);
  c.a_ms = median(alone[0]);
  c.b_ms = median(per_call);
  return c;
}

// PERFORMANCE.md's two "cost nothing" targets on one shape — device vs host splits, and a caller
// output buffer vs an internally allocated one — and the per-call latency (uniform routing,
// fprop, the first backend of --backends, forced: the automatic choice may differ between host
// and device splits, e.g. cuBLAS batches for small uniform host splits).
std::vector<Comparison> compare_paths(const Context& ctx, const Options& o, const Shape& s,
                                      cudaEvent_t start, cudaEvent_t stop, uint64_t seed) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  const std::vector<int64_t> counts = uniform_counts(s.E, s.T);
  int64_t S = 0;
  for (int64_t c : counts) S += c;
  Tensor x = Tensor::empty({s.T, s.K}, DType::BF16, ctx);
  Tensor w = Tensor::empty({s.E, s.N, s.K}, DType::BF16, ctx);
  Tensor y = Tensor::empty({s.T, s.N}, DType::BF16, ctx);
  Tensor y2 = Tensor::empty({s.T, s.N}, DType::BF16, ctx);
  fill_input(ctx, x, seed + 1);
  fill_input(ctx, w, seed + 2);
  Tensor counts_dev = Tensor::empty({s.E}, DType::I64, ctx);
  MOEKIT_BENCH_CHECK(cudaMemcpyAsync(counts_dev.data(), counts.data(), counts.size() * 8,
                                     cudaMemcpyHostToDevice, stream));
  const Splits host = Splits::host(counts), device = Splits::device(counts_dev);
  std::vector<Comparison> out;
  const size_t valid = static_cast<size_t>(S * s.N);

  {  // device vs host splits (the primitive; same caller output buffer)
    auto on_device = [&] { moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, device, y); };
    auto on_host = [&] { moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, host, y2); };
    on_device();
    on_host();
    Comparison c{s.name, "uniform", "fprop", "device/host splits", "device splits", "host splits"};
    c.identical = identical_bf16(ctx, y.data(), y2.data(), valid);
    const auto ms =
        time_in_turns({on_device, on_host}, o.iters, o.warmup, o.warmup_ms, stream, start, stop);
    c.a_ms = median(ms[0]);
    c.b_ms = median(ms[1]);
    out.push_back(c);
  }
  {  // one call alone vs back-to-back calls (alone_vs_back_to_back), fprop and wgrad: the
     // group-K call has its own setup and zero-fill kernels
    auto call = [&] { moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, device, y); };
    out.push_back(alone_vs_back_to_back(ctx, o, s, "fprop", call, y, y2, valid, start, stop));
    Tensor dy = Tensor::empty({s.T, s.N}, DType::BF16, ctx);
    Tensor dw = Tensor::empty({s.E, s.N, s.K}, DType::BF16, ctx);
    Tensor dw2 = Tensor::empty({s.E, s.N, s.K}, DType::BF16, ctx);
    fill_input(ctx, dy, seed + 3);
    auto wgrad = [&] { moekit::grouped_gemm_group_k(ctx, dy, x, device, dw, false); };
    out.push_back(alone_vs_back_to_back(ctx, o, s, "wgrad", wgrad, dw, dw2,
                                        static_cast<size_t>(s.E * s.N * s.K), start, stop));
  }
  {  // caller buffer vs internal allocation (GroupedLinear::forward, inference)
    moekit::GroupedLinear fc({.groups = s.E, .in = s.K, .out = s.N, .dtype = DType::BF16}, ctx);
    fc.set_weight(w);
    Tensor internal;
    auto caller = [&] { fc.forward(x, host, {.output = y}); };
    auto alloc = [&] { internal = fc.forward(x, host); };
    caller();
    alloc();
    Comparison c{s.name, "uniform", "fprop", "caller/internal output", "output = caller buffer",
                 "internal allocation"};
    c.identical = identical_bf16(ctx, y.data(), internal.data(), valid);
    const auto ms =
        time_in_turns({caller, alloc}, o.iters, o.warmup, o.warmup_ms, stream, start, stop);
    c.a_ms = median(ms[0]);
    c.b_ms = median(ms[1]);
    out.push_back(c);
  }
  MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
  return out;
}

int run(const Options& o) {
  if (Context::cuda_device_count() == 0) {
    std::fprintf(stderr, "moekit_bench: no CUDA device\n");
    return 2;
  }
  const Context base = Context::cuda(0);
  auto stream = static_cast<cudaStream_t>(base.stream());
  cudaDeviceProp prop{};
  MOEKIT_BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::string smi_query =
      "nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,"
      "driver_version --format=csv,noheader 2>/dev/null | head -1";
  const std::string clocks_before = shell_line(smi_query.c_str());

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string commit = o.commit;
  if (commit.empty() && std::getenv("MOEKIT_COMMIT")) commit = std::getenv("MOEKIT_COMMIT");
  if (commit.empty()) commit = MOEKIT_GIT_COMMIT;
  std::string backend_list;
  for (const auto& b : o.backends) backend_list += (backend_list.empty() ? "" : ",") + b;
  const char* env_batching = std::getenv("MOEKIT_CUBLAS_BATCHING");

  std::printf("moekit_bench  %s  commit %s  backends %s%s%s  GPU %s (%d SMs)  clocks [sm, mem, "
              "max sm, power, temp, driver]: %s\n",
              date, commit.c_str(), backend_list.c_str(),
              env_batching ? "  MOEKIT_CUBLAS_BATCHING=" : "", env_batching ? env_batching : "",
              prop.name, prop.multiProcessorCount, clocks_before.c_str());
  std::printf("warm-up %d calls and >= %.0f ms, median of %d runs per backend (CUDA events, "
              "%s), bf16 in (%s), bf16 out (wgrad_f32: an fp32 main_grad, accumulated), fp32 "
              "accumulation; MHz: the SM clock halfway through a backend's timed runs%s\n\n",
              o.warmup, o.warmup_ms, o.iters,
              o.timing == Timing::Alone  ? "each backend alone"
              : o.timing == Timing::Turns ? "backends in turns"
                                          : "each backend alone, per call of 16 back to back",
              g_constant_data ? "every input 1.0: --data constant, a power study" : "normal draws",
              Nvml::instance().sample().valid ? "" : " (NVML not available: -)");
  std::printf("%-15s %-8s %-9s %4s %6s %6s %6s", "shape", "routing", "pass", "E", "T", "K", "N");
  for (const auto& b : o.backends) {
    std::printf(" | %-6s %8s %7s %-4s %5s", b.c_str(), "ms", "TFLOP/s", "chk", "MHz");
  }
  std::printf(" | best\n");

  std::vector<Result> results;
  cudaEvent_t start, stop;
  MOEKIT_BENCH_CHECK(cudaEventCreate(&start));
  MOEKIT_BENCH_CHECK(cudaEventCreate(&stop));
  bool all_pass = true;
  uint64_t data_seed = o.seed;
  for (const auto& [s, si] : selected_shapes(o.shapes)) {
    Tensor x = Tensor::empty({s.T, s.K}, DType::BF16, base);
    Tensor w = Tensor::empty({s.E, s.N, s.K}, DType::BF16, base);
    Tensor dy = Tensor::empty({s.T, s.N}, DType::BF16, base);
    Tensor y = Tensor::empty({s.T, s.N}, DType::BF16, base);
    Tensor dx = Tensor::empty({s.T, s.K}, DType::BF16, base);
    Tensor dw = Tensor::empty({s.E, s.N, s.K}, DType::BF16, base);
    fill_input(base, x, ++data_seed);
    fill_input(base, w, ++data_seed);
    fill_input(base, dy, ++data_seed);
    // wgrad_f32: main_grad and its starting values (standard normal), only when that pass runs.
    Tensor main_grad, main_grad_init;
    if (wanted(o.passes, "wgrad_f32")) {
      main_grad = Tensor::empty({s.E, s.N, s.K}, DType::F32, base);
      main_grad_init = Tensor::empty({s.E, s.N, s.K}, DType::F32, base);
      fill_input(base, dw, ++data_seed);
      bf16_to_f32<<<1024, 256, 0, stream>>>(dw.data_as<__nv_bfloat16>(), main_grad_init.data_as<float>(),
                                            static_cast<size_t>(dw.numel()));
      MOEKIT_BENCH_CHECK(cudaGetLastError());
    }
    for (const std::string routing : {"uniform", "skewed"}) {
      if (!wanted(o.routings, routing)) continue;
      const std::vector<int64_t> counts =
          routing == "uniform" ? uniform_counts(s.E, s.T)
                               : dirichlet_counts(s.E, s.T, o.seed * 1000003 + si);
      const Splits splits = Splits::host(counts);
      // "auto": what a user of the README's path gets — nothing forced, counts on the device.
      const Splits device_splits =
          Splits::device(moekit::to_device(base, moekit::Tensor::wrap(
                                                     const_cast<int64_t*>(counts.data()),
                                                     {static_cast<int64_t>(counts.size())},
                                                     DType::I64, moekit::Device::cpu())));
      int64_t S = 0;
      for (int64_t c : counts) S += c;
      const double flops = 2.0 * static_cast<double>(S) * static_cast<double>(s.N) * static_cast<double>(s.K);
      for (const std::string& pass : kPasses) {
        if (!wanted(o.passes, pass)) continue;
        const bool accumulate = pass == "wgrad_f32";
        const Tensor& out = pass == "fprop" ? y : pass == "dgrad" ? dx : accumulate ? main_grad : dw;
        auto step = [&](const Context& ctx) {
          const Splits& sp = ctx.forced_backend().empty() ? device_splits : splits;
          if (pass == "fprop") {
            moekit::grouped_gemm_group_m(ctx, x, w, BOp::Transposed, sp, y);
          } else if (pass == "dgrad") {
            moekit::grouped_gemm_group_m(ctx, dy, w, BOp::Plain, sp, dx);
          } else {
            moekit::grouped_gemm_group_k(ctx, dy, x, sp, accumulate ? main_grad : dw, accumulate);
          }
        };
        Result r{s, routing, pass, counts, {}, -1};
        std::vector<std::function<void()>> fns;
        std::vector<size_t> ran;  // indices into r.backends
        std::deque<RecipeOperands> quantized;  // the recipe columns' operands (stable addresses)
        for (const std::string& name : o.backends) {
          if (!has_entry(pass, name)) continue;
          BackendRun b;
          b.name = name;
          const bool recipe = is_recipe(name);
          const Context ctx = name == "auto" || recipe ? base : base.with_backend(name);
          std::function<void()> call = [&step, ctx] { step(ctx); };
          if (recipe) {  // SPEC §6c's rows rule, which device counts are checked against on the GPU
            const int64_t multiple = moekit::Recipe::parse(name).group_rows_multiple();
            if (std::any_of(counts.begin(), counts.end(), [&](int64_t c) { return c % multiple != 0; })) {
              b.skipped = "rows per group must be multiples of " + std::to_string(multiple) +
                          " (SPEC §6c; a training step pads them, as Fp8Padding)";
              std::printf("  (%s %s %s: %s skipped: %s)\n", s.name, routing.c_str(), pass.c_str(),
                          name.c_str(), b.skipped.c_str());
              r.backends.push_back(std::move(b));
              continue;
            }
          }
          // Poison (main_grad: its starting values), one run, check that run's output: each
          // backend is checked on its own.
          if (accumulate) {
            MOEKIT_BENCH_CHECK(cudaMemcpyAsync(out.data(), main_grad_init.data(), out.nbytes(),
                                               cudaMemcpyDeviceToDevice, stream));
          } else {
            MOEKIT_BENCH_CHECK(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), stream));
          }
          try {
            if (recipe) {
              RecipeOperands& q = quantized.emplace_back(
                  quantize_operands(base, moekit::Recipe::parse(name), pass, s, device_splits, x, w, dy));
              call = [&q, &out, &device_splits, &base, pass, accumulate] {
                if (pass == "fprop" || pass == "dgrad") {
                  moekit::grouped_gemm_group_m_quantized(base, q.a, q.b, pass == "fprop" ? BOp::Transposed : BOp::Plain,
                                                         device_splits, out);
                } else {
                  moekit::grouped_gemm_group_k_quantized(base, q.a, q.b, device_splits, out, accumulate);
                }
              };
            }
            call();
          } catch (const moekit::Error& e) {
            if (e.kind() != moekit::ErrorKind::Unsupported &&
                e.kind() != moekit::ErrorKind::InvalidArgument) {
              throw;
            }
            b.skipped = e.what();
            std::printf("  (%s %s %s: backend %s skipped: %s)\n", s.name, routing.c_str(),
                        pass.c_str(), name.c_str(), e.what());
          }
          if (b.ran()) {
            const bool group_m = pass == "fprop" || pass == "dgrad";
            if (name == "auto" || recipe) {
              b.ran_on = moekit::last_backend(
                  ctx, std::string(group_m ? "grouped_gemm_group_m" : "grouped_gemm_group_k") +
                           (recipe ? "_quantized" : ""));
            }
            MOEKIT_BENCH_CHECK(cudaStreamSynchronize(stream));
            const uint64_t check_seed = o.seed + si * 7 + pass.size();
            if (recipe) {  // against the dequantized copies the GEMM read
              const RecipeOperands& q = quantized.back();
              const Dequantized d = dequantize_operands(base, q, pass, s, device_splits);
              b.check = check_pass(base, pass, s, counts,
                                   {d.x, d.w, d.dy, pass != "fprop", kFp8TensorCoreEpsilon}, out,
                                   main_grad_init, o.samples, check_seed);
            } else {
              b.check = check_pass(base, pass, s, counts, {x, w, dy}, out, main_grad_init,
                                   o.samples, check_seed);
            }
            all_pass = all_pass && b.check.pass();
            ran.push_back(r.backends.size());
            fns.push_back(call);
          }
          r.backends.push_back(std::move(b));
        }
        const auto timed =
            time_calls(fns, o.timing, o.iters, o.warmup, o.warmup_ms, stream, start, stop);
        for (size_t i = 0; i < ran.size(); ++i) {
          BackendRun& b = r.backends[ran[i]];
          b.ms = timed[i].ms;
          b.clock = timed[i].clock;
          b.median_ms = median(b.ms);
          b.min_ms = *std::min_element(b.ms.begin(), b.ms.end());
          b.tflops = flops / (b.median_ms * 1e-3) / 1e12;
          if (b.check.pass() && !is_recipe(b.name) &&  // best: of the bf16 computation's backends
              (r.best < 0 || b.median_ms < r.backends[static_cast<size_t>(r.best)].median_ms)) {
            r.best = static_cast<int>(ran[i]);
          }
        }
        std::printf("%-15s %-8s %-9s %4lld %6lld %6lld %6lld", s.name, routing.c_str(),
                    pass.c_str(), static_cast<long long>(s.E), static_cast<long long>(s.T),
                    static_cast<long long>(s.K), static_cast<long long>(s.N));
        for (const std::string& name : o.backends) {
          auto it = std::find_if(r.backends.begin(), r.backends.end(),
                                 [&](const BackendRun& b) { return b.name == name; });
          if (it == r.backends.end()) {
            std::printf(" | %-6s %8s %7s %-4s %5s", name.c_str(), "-", "-", "", "");
          } else if (!it->ran()) {
            std::printf(" | %-6s %8s %7s %-4s %5s", name.c_str(), "skip", "-", "", "");
          } else {
            std::printf(" | %-6s %8.4f %7.1f %-4s %5s", name.c_str(), it->median_ms, it->tflops,
                        it->check.pass() ? "PASS" : "FAIL",
                        it->clock.valid ? std::to_string(it->clock.mhz).c_str() : "-");
          }
        }
        std::printf(" | %s\n", r.best >= 0 ? r.backends[static_cast<size_t>(r.best)].name.c_str() : "none");
        for (const BackendRun& b : r.backends) {
          if (b.ran() && !b.check.pass()) {
            std::printf("  FAIL %s: worst err/tol %.3f over %d samples, %llu non-finite\n",
                        b.name.c_str(), b.check.worst, b.check.samples, b.check.nonfinite);
          }
        }
        std::fflush(stdout);
        results.push_back(std::move(r));
      }
    }
  }

  std::vector<Comparison> comparisons;
  for (const std::string& name : o.compare) {
    for (size_t si = 0; si < std::size(kSuite); ++si) {
      if (name != kSuite[si].name) continue;
      std::vector<Comparison> found;
      try {
        found = compare_paths(base.with_backend(o.backends.front()), o, kSuite[si], start, stop,
                              o.seed + 77 * si);
      } catch (const moekit::Error& e) {  // that backend cannot run it here: say so, skip
        std::printf("comparison on %s skipped: %s\n", kSuite[si].name, e.what());
      }
      for (Comparison& c : found) comparisons.push_back(std::move(c));
    }
  }
  if (!comparisons.empty()) {
    std::printf("\ncomparisons (backend %s, medians of %d, in turns; ratio = first / second):\n",
                o.backends.front().c_str(), o.iters);
    for (const Comparison& c : comparisons) {
      std::printf("%-15s %-8s %-6s %-24s %9.4f ms / %9.4f ms = %6.3f  outputs %s%s%s\n",
                  c.shape.c_str(), c.routing.c_str(), c.pass.c_str(), c.what.c_str(), c.a_ms, c.b_ms,
                  c.a_ms / c.b_ms, c.identical ? "bit-identical" : "DIFFER",
                  c.note.empty() ? "" : "  ", c.note.c_str());
      all_pass = all_pass && c.identical;
    }
  }

  const std::string clocks_after = shell_line(smi_query.c_str());
  std::printf("\nclocks after: %s\n%s\n", clocks_after.c_str(),
              all_pass ? "all correctness checks PASS" : "SOME CORRECTNESS CHECKS FAILED");

  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\n  \"tool\": \"moekit_bench\",\n  \"date\": \"" << date << "\",\n  \"commit\": \""
      << json_escape(commit) << "\",\n  \"backends\": [";
    for (size_t i = 0; i < o.backends.size(); ++i) f << (i ? ", " : "") << "\"" << json_escape(o.backends[i]) << "\"";
    f << "],\n  \"cublas_batching\": \"" << json_escape(env_batching ? env_batching : "auto")
      << "\",\n  \"gpu\": \"" << json_escape(prop.name)
      << "\",\n  \"sm_count\": " << prop.multiProcessorCount << ",\n  \"clocks_before\": \""
      << json_escape(clocks_before) << "\",\n  \"clocks_after\": \"" << json_escape(clocks_after)
      << "\",\n  \"dtype\": \"bf16\",\n  \"iters\": " << o.iters << ",\n  \"warmup\": " << o.warmup
      << ",\n  \"warmup_ms\": " << o.warmup_ms
      << ",\n  \"data\": \"" << (g_constant_data ? "constant" : "normal") << "\",\n  \"timing\": \""
      << timing_name(o.timing)
      << "\",\n  \"seed\": " << o.seed << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const BackendRun* best = r.best >= 0 ? &r.backends[static_cast<size_t>(r.best)] : nullptr;
      bool pass = true;
      for (const BackendRun& b : r.backends) pass = pass && (!b.ran() || b.check.pass());
      // Top-level median_ms / tflops / check: the best backend's (what an older merge reads).
      f << "    {\"shape\": \"" << r.shape.name << "\", \"E\": " << r.shape.E << ", \"T\": "
        << r.shape.T << ", \"K\": " << r.shape.K << ", \"N\": " << r.shape.N
        << ", \"routing\": \"" << r.routing << "\", \"pass\": \"" << r.pass
        << "\", \"best_backend\": \"" << (best ? best->name : "") << "\", \"median_ms\": "
        << (best ? best->median_ms : 0) << ", \"min_ms\": " << (best ? best->min_ms : 0)
        << ", \"tflops\": " << (best ? best->tflops : 0) << ", \"check\": {\"pass\": "
        << (pass && best ? "true" : "false") << "}, \"backends\": {";
      for (size_t j = 0; j < r.backends.size(); ++j) {
        const BackendRun& b = r.backends[j];
        f << (j ? ", " : "") << "\"" << json_escape(b.name) << "\": {";
        if (!b.ran()) {
          f << "\"skipped\": \"" << json_escape(b.skipped) << "\"}";
          continue;
        }
        f << "\"median_ms\": " << b.median_ms << ", \"min_ms\": " << b.min_ms
          << ", \"tflops\": " << b.tflops;
        if (!b.ran_on.empty()) f << ", \"ran\": \"" << json_escape(b.ran_on) << "\"";
        if (b.clock.valid) {
          f << ", \"sm_mhz\": " << b.clock.mhz << ", \"power_w\": " << b.clock.milliwatts / 1000.0
            << ", \"clock_reasons\": \"" << reason_names(b.clock.reasons) << "\"";
        }
        f << ", \"check\": {\"pass\": "
          << (b.check.pass() ? "true" : "false") << ", \"samples\": " << b.check.samples
          << ", \"worst_err_over_tol\": " << b.check.worst << ", \"nonfinite\": "
          << b.check.nonfinite << "}}";
      }
      f << "}, \"counts\": [";
      for (size_t g = 0; g < r.counts.size(); ++g) f << (g ? ", " : "") << r.counts[g];
      f << "]}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"comparisons\": [\n";
    for (size_t i = 0; i < comparisons.size(); ++i) {
      const Comparison& c = comparisons[i];
      f << "    {\"shape\": \"" << c.shape << "\", \"routing\": \"" << c.routing
        << "\", \"pass\": \"" << c.pass << "\", \"what\": \"" << json_escape(c.what)
        << "\", \"a\": \"" << json_escape(c.a_label) << "\", \"b\": \"" << json_escape(c.b_label)
        << "\", \"a_ms\": " << c.a_ms << ", \"b_ms\": " << c.b_ms << ", \"ratio\": "
        << c.a_ms / c.b_ms << ", \"identical\": " << (c.identical ? "true" : "false")
        << ", \"note\": \"" << json_escape(c.note) << "\"}"
        << (i + 1 < comparisons.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  MOEKIT_BENCH_CHECK(cudaEventDestroy(start));
  MOEKIT_BENCH_CHECK(cudaEventDestroy(stop));
  return all_pass ? 0 : 1;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: moekit_bench [--shapes a,b] [--routing uniform,skewed] "
               "[--passes fprop,dgrad,wgrad,wgrad_f32] [--backends auto,sm90,cublas,fp8-current,fp8-block] [--iters N] [--warmup N] [--warmup-ms MS] "
               "[--samples N] [--seed S] [--json FILE] [--commit ID] [--compare a,b|none] "
               "[--timing alone|turns|back-to-back] [--list] [--data normal|constant]\nshapes:",
               msg);
  for (const Shape& s : kSuite) std::fprintf(stderr, " %s", s.name);
  std::fprintf(stderr, ", or custom_E<E>_T<T>_K<K>_N<N> (K, N multiples of 8)\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--shapes") o.shapes = split_list(value());
    else if (a == "--routing") o.routings = split_list(value());
    else if (a == "--passes") o.passes = split_list(value());
    else if (a == "--iters") o.iters = std::max(1, std::atoi(value().c_str()));
    else if (a == "--warmup") o.warmup = std::max(0, std::atoi(value().c_str()));
    else if (a == "--warmup-ms") o.warmup_ms = std::max(0.0, std::atof(value().c_str()));
    else if (a == "--samples") o.samples = std::max(1, std::atoi(value().c_str()));
    else if (a == "--seed") o.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--json") o.json = value();
    else if (a == "--commit") o.commit = value();
    else if (a == "--backends" || a == "--backend") o.backends = split_list(value());
    else if (a == "--timing") {
      const std::string v = value();
      if (v != "alone" && v != "turns" && v != "back-to-back") {
        usage(("--timing alone, turns or back-to-back, got " + v).c_str());
      }
      o.timing = v == "alone" ? Timing::Alone : v == "turns" ? Timing::Turns : Timing::BackToBack;
    }
    else if (a == "--compare") {
      const std::string v = value();
      o.compare = v == "none" ? std::vector<std::string>{} : split_list(v);
    }
    else if (a == "--list") o.list = true;
    else if (a == "--data") {
      const std::string v = value();
      if (v != "normal" && v != "constant") usage(("--data normal or constant, got " + v).c_str());
      g_constant_data = v == "constant";
    }
    else if (a == "-h" || a == "--help") usage("moekit_bench: the PERFORMANCE.md grouped-GEMM suite");
    else usage(("unknown argument " + a).c_str());
  }
  for (const std::string& s : o.compare) {
    if (std::none_of(std::begin(kSuite), std::end(kSuite), [&](const Shape& k) { return s == k.name; })) {
      usage(("unknown --compare shape " + s).c_str());
    }
  }
  if (o.backends.empty()) usage("--backends needs at least one name");
  for (const std::string& s : o.shapes) {
    if (std::none_of(std::begin(kSuite), std::end(kSuite), [&](const Shape& k) { return s == k.name; }) &&
        !custom_shape(s)) {
      usage(("unknown shape " + s).c_str());
    }
  }
  for (const std::string& p : o.passes) {
    if (!wanted(kPasses, p)) usage(("unknown pass " + p).c_str());
  }
  if (o.list) {
    for (const auto& [s, si] : selected_shapes(o.shapes)) {
      std::printf("%s E=%lld T=%lld K=%lld N=%lld\n", s.name, static_cast<long long>(s.E),
                  static_cast<long long>(s.T), static_cast<long long>(s.K), static_cast<long long>(s.N));
    }
    return 0;
  }
  try {
    return run(o);
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit_bench: %s\n", e.what());
    return 2;
  }
}
