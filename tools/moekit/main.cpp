// moekit — the command-line program: runs an expert-layer training step on a preset model shape.
//
//   moekit run [--preset tiny|qwen3|dsv3] [--experts E] [--tokens T] [--routing uniform|skewed]
//              [--device cpu|cuda] [--dtype bf16|f16|f32] [--steps N] [--seed S] [--json]
//              [--no-check] [--no-fuse] [--glu L] [--host-splits] [--internal-buffers]
//
// The step is forward + backward of the expert layer, writing its output and its input gradient
// into caller-owned buffers (as an expert-parallel combine/dispatch would own them), then checked
// against an fp64 reference on sampled rows and weight-gradient entries.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "expert_step.h"
#include "moekit/moekit.h"

namespace {

using namespace moekit;

constexpr const char* kHelp = R"(moekit — Mixture-of-Experts expert layers (grouped linear / grouped MLP)

Usage:
  moekit run [options]     run expert-layer training steps and check them against fp64
  moekit --help            this text

`moekit run` builds the expert MLP of a preset model (fc1 -> SwiGLU scaled by the routing
probability -> fc2, as a Sequential that fuses into GroupedMLP) for the experts of one rank,
routes --tokens rows to them (uniform or skewed), and runs forward + backward --steps times. The layer's
output goes into a caller-owned buffer (like the expert-parallel combine's input buffer) and its
input gradient into another (like dispatch-backward's); the table reports whether the returned
tensors alias those buffers. Results are checked against an fp64 reference computed from the same
rounded inputs, on sampled rows and weight-gradient entries.

Options:
  --preset NAME      tiny (default; seconds on a laptop CPU), qwen3 (Qwen3-235B-A22B experts,
                     H=4096, F=1536), dsv3 (DeepSeek-V3 experts, H=7168, F=2048)
  --experts E        experts on this rank (default: preset's)
  --tokens T         routed rows on this rank (default: preset's, smaller on the CPU)
  --tail R           capacity rows past the routed ones, never written (default 64)
  --routing KIND     uniform (default) or skewed (Dirichlet(1) split of T: some experts get
                     many rows, some none)
  --device DEV       cpu or cuda (default: cuda when a GPU is usable, else cpu)
  --dtype D          bf16 (default), f16 or f32
  --steps N          timed steps after one warm-up step (default 3)
  --warmup-ms MS     then more untimed steps until MS milliseconds have passed (default 0):
                     times the steps under sustained load, as a long training run sees them
  --seed S           random seed (default 1)
  --json             print one JSON object instead of the table
  --no-check         skip the fp64 check
  --no-fuse          run fc1, ScaledSwiGLU and fc2 as separate ops (default: fused GroupedMLP)
  --glu L            gate/linear layout of fc1's output: interleaved32 (default; on sm90 the
                     fused MLP computes SwiGLU in fc1's GEMM epilogue) or halves
  --host-splits      give the counts as a host vector (default: a device tensor, no host sync)
  --internal-buffers let the ops allocate y and dx (default: caller buffers, written in place)

Exit status: 0 when the check passes, 1 when it fails, 2 on a usage error.
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "moekit: %s\n(see moekit --help)\n", msg.c_str());
  std::exit(2);
}

struct Options {
  std::string preset = "tiny";
  std::optional<int64_t> experts, tokens;
  int64_t tail = 64;
  std::string routing = "uniform";
  std::optional<std::string> device;
  DType dtype = DType::BF16;
  int steps = 3;
  double warmup_ms = 0;
  uint64_t seed = 1;
  bool json = false;
  bool check = true;
  bool fuse = true;
  GluLayout glu = GluLayout::Interleaved32;
  bool host_splits = false, caller_buffers = true;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos != v.size() || x < min) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    usage_error(str(flag, " expects an integer >= ", min, ", got '", v, "'"));
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--preset") o.preset = value();
    else if (a == "--experts") o.experts = parse_int(a, value(), 1);
    else if (a == "--tokens") o.tokens = parse_int(a, value(), 0);
    else if (a == "--tail") o.tail = parse_int(a, value(), 0);
    else if (a == "--routing") o.routing = value();
    else if (a == "--device") o.device = value();
    else if (a == "--dtype") {
      const std::string d = value();
      if (d != "bf16" && d != "f16" && d != "f32") usage_error("--dtype expects bf16, f16 or f32, got '" + d + "'");
      o.dtype = parse_dtype(d);
    } else if (a == "--steps") o.steps = static_cast<int>(parse_int(a, value(), 1));
    else if (a == "--warmup-ms") o.warmup_ms = static_cast<double>(parse_int(a, value(), 0));
    else if (a == "--seed") o.seed = static_cast<uint64_t>(parse_int(a, value(), 0));
    else if (a == "--json") o.json = true;
    else if (a == "--no-check") o.check = false;
    else if (a == "--no-fuse") o.fuse = false;
    else if (a == "--glu") {
      const std::string l = value();
      if (l != "interleaved32" && l != "halves") usage_error("--glu expects interleaved32 or halves, got '" + l + "'");
      o.glu = l == "halves" ? GluLayout::Halves : GluLayout::Interleaved32;
    }
    else if (a == "--host-splits") o.host_splits = true;
    else if (a == "--internal-buffers") o.caller_buffers = false;
    else if (a == "--help" || a == "-h") { std::fputs(kHelp, stdout); std::exit(0); }
    else usage_error("unknown option '" + a + "'");
  }
  if (o.routing != "uniform" && o.routing != "skewed") {
    usage_error("--routing expects uniform or skewed, got '" + o.routing + "'");
  }
  return o;
}

struct Preset {
  int64_t hidden, ffn, experts, tokens_gpu, tokens_cpu;
};
const std::map<std::string, Preset> kPresets = {
    {"tiny", {256, 512, 8, 8192, 2048}},
    {"qwen3", {4096, 1536, 16, 16384, 1024}},
    {"dsv3", {7168, 2048, 8, 32768, 512}},
};

void progress(int done, int total) {
  if (total <= 1 || !isatty(STDERR_FILENO)) return;
  constexpr int kWidth = 30;
  const int filled = done * kWidth / total;
  std::fprintf(stderr, "\r  step %d/%d [%s%s]", done, total, std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '.').c_str());
  if (done == total) std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    std::fputs(kHelp, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "run") != 0) usage_error(str("unknown command '", argv[1], "'"));
  const Options o = parse(argc, argv);
  auto it = kPresets.find(o.preset);
  if (it == kPresets.end()) usage_error("--preset expects tiny, qwen3 or dsv3, got '" + o.preset + "'");

  try {
    Context ctx = Context::cpu();
    if (o.device) {
      if (*o.device == "cuda") ctx = Context::cuda(0);
      else if (*o.device != "cpu") usage_error("--device expects cpu or cuda, got '" + *o.device + "'");
    } else {
      ctx = Context::best_available();
    }
    const Preset& p = it->second;
    tools::StepConfig cfg;
    cfg.hidden = p.hidden;
    cfg.ffn = p.ffn;
    cfg.experts = o.experts.value_or(p.experts);
    cfg.tokens = o.tokens.value_or(ctx.device().is_cpu() ? p.tokens_cpu : p.tokens_gpu);
    cfg.tail = o.tail;
    cfg.skewed = o.routing == "skewed";
    cfg.dtype = o.dtype;
    cfg.seed = o.seed;
    cfg.fuse = o.fuse;
    cfg.glu = o.glu;
    cfg.host_splits = o.host_splits;
    cfg.caller_buffers = o.caller_buffers;

    tools::ExpertStep step(cfg, ctx);
    auto since = [](auto t0) {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    step.run_once();  // warm-up (allocator pools, library handles)
    ctx.synchronize();
    // Sustained load (--warmup-ms): a GPU idle during set-up starts cool and at higher clocks
    // than it keeps under load; a few timed steps alone would see that.
    for (const auto t0 = std::chrono::steady_clock::now(); since(t0) < o.warmup_ms;) {
      step.run_once();
      ctx.synchronize();
    }
    // Per step: the wall time to the end of the device work, and the host time to enqueue it
    // (run_once returns when every kernel is queued). Enqueue close to the step time means the
    // step is bound by host work between launches, not by the GPU.
    std::vector<double> ms, enqueue_ms;
    for (int s = 0; s < o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      step.run_once();
      enqueue_ms.push_back(since(t0));
      ctx.synchronize();
      ms.push_back(since(t0));
      if (!o.json) progress(s + 1, o.steps);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const tools::CheckResult check = o.check ? step.check() : tools::CheckResult{};
    tools::StepReport r = step.report(median(ms), o.preset, o.routing, check, o.check);
    r.enqueue_ms = median(enqueue_ms);
    if (o.json) {
      std::fputs(r.json().c_str(), stdout);
    } else {
      std::fputs(r.table().c_str(), stdout);
    }
    return (!o.check || check.passed) ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
