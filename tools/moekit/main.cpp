// moekit — the command-line program: runs an expert-layer training step on a preset model shape.
//
//   moekit run [--preset tiny|qwen3|dsv3] [--experts E] [--tokens T] [--routing uniform|skewed]
//              [--device cpu|cuda] [--dtype bf16|f16|f32] [--steps N] [--seed S] [--json]
//              [--recipe none|fp8-current|fp8-block|mxfp8|nvfp4]
//              [--no-check] [--no-fuse] [--glu L] [--host-splits] [--internal-buffers]
//   moekit run --ep N [--topk K] [--device cpu|cuda] ...   the MoE layer (router → dispatch → MLP
//              → combine) on N CPU ranks (the default) or N GPUs
//
// The step is forward + backward of the expert layer, writing its output and its input gradient
// into caller-owned buffers (as an expert-parallel combine/dispatch would own them), then checked
// against an fp64 reference on sampled rows and weight-gradient entries.
//
// Arguments are parsed by CLI11 (help text, choices, ranges); exit status 2 is a usage error
// (nothing ran), 1 a run that failed its check or could not run (a message says why), 0 success.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "ep_step.h"
#include "expert_step.h"
#include "moekit/moekit.h"

namespace {

using namespace moekit;

constexpr const char* kAbout =
    "moekit — Mixture-of-Experts expert layers (grouped linear / grouped MLP)";

constexpr const char* kRunAbout = "run expert-layer training steps and check them against fp64";

constexpr const char* kRunDetails =
    R"(`moekit run` builds the expert MLP of a preset model (fc1 -> SwiGLU scaled by the routing
probability -> fc2, as a Sequential that fuses into GroupedMLP) for the experts of one rank,
routes --tokens rows to them (uniform or skewed), and runs forward + backward --steps times. The
layer's output goes into a caller-owned buffer (like the expert-parallel combine's input buffer)
and its input gradient into another (like dispatch-backward's); the table reports whether the
returned tensors alias those buffers. Results are checked against an fp64 reference computed from
the same rounded inputs, on sampled rows and weight-gradient entries.)";

constexpr const char* kExitStatus =
    "Exit status: 0 when the check passes, 1 when it fails or the run cannot proceed (a message\n"
    "says why), 2 on a usage error.";

struct Options {
  std::string preset = "tiny";
  std::optional<int64_t> experts, tokens;
  int64_t tail = 64;
  std::string routing = "uniform";
  std::optional<std::string> device;
  std::string dtype = "bf16";
  std::string recipe = "none";
  int64_t steps = 3;
  int64_t warmup_ms = 0;
  uint64_t seed = 1;
  bool json = false;
  bool no_check = false;
  bool no_fuse = false;
  std::string glu = "interleaved32";
  bool host_splits = false, internal_buffers = false;
  std::optional<int64_t> ep;  // --ep N: the MoE layer on N CPU ranks (or N GPUs: --device cuda)
  int64_t topk = 2;
  std::optional<std::string> ep_engine;  // --ep-engine cuda-ranks|nccl (with --ep and --device cuda)
};

// An integer option's check: plain base-10 digits (a leading '-' for signed types) whose value
// lies in [lo, hi]. CLI11 2.1's own conversion (strtoll, base 0) saturates values beyond the
// type instead of refusing them and reads "010" as octal, so the text is checked here and
// rewritten as the plain decimal of its value before CLI11 converts it (a transform(): CLI11
// discards what a check() rewrites).
template <class T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T value{};
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        const bool integer = !text.empty() && ptr == end &&
                             (ec == std::errc() || ec == std::errc::result_out_of_range);
        if (!integer) return str("expects an integer in [", lo, ", ", hi, "], got '", text, "'");
        if (ec == std::errc::result_out_of_range || value < lo || value > hi) {
          return str("expects an integer in [", lo, ", ", hi, "], got ", text);
        }
        text = std::to_string(value);
        return "";
      },
      "");
}

struct Preset {
  int64_t hidden, ffn, experts, tokens_gpu, tokens_cpu;
};
const std::map<std::string, Preset> kPresets = {
    {"tiny", {256, 512, 8, 8192, 2048}},
    {"qwen3", {4096, 1536, 16, 16384, 1024}},
    {"dsv3", {7168, 2048, 8, 32768, 512}},
};

// The options of `moekit run`, bound to o.
void add_run_options(CLI::App& run, Options& o) {
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  run.add_option("--preset", o.preset,
                 "tiny (default; seconds on a laptop CPU), qwen3 (Qwen3-235B-A22B experts,\n"
                 "H=4096, F=1536), dsv3 (DeepSeek-V3 experts, H=7168, F=2048)")
      ->type_name("NAME")
      ->check(CLI::IsMember({"tiny", "qwen3", "dsv3"}));
  run.add_option("--experts", o.experts, "experts on this rank (default: preset's)")
      ->type_name("E")
      ->transform(integer_in<int64_t>(1, kMax64));
  run.add_option("--tokens", o.tokens,
                 "routed rows on this rank (default: preset's, smaller on the CPU)")
      ->type_name("T")
      ->transform(integer_in<int64_t>(0, kMax64));
  run.add_option("--tail", o.tail, "capacity rows past the routed ones, never written (default 64)")
      ->type_name("R")
      ->transform(integer_in<int64_t>(0, kMax64));
  run.add_option("--routing", o.routing,
                 "uniform (default) or skewed (Dirichlet(1) split of T: some experts get\n"
                 "many rows, some none)")
      ->type_name("KIND")
      ->check(CLI::IsMember({"uniform", "skewed"}));
  run.add_option("--device", o.device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)")
      ->type_name("DEV")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  run.add_option("--dtype", o.dtype, "bf16 (default), f16 or f32")
      ->type_name("D")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  run.add_option("--recipe", o.recipe,
                 "quantized recipe of fc1 and fc2 (SPEC §6): none (default), fp8-current,\n"
                 "fp8-block, mxfp8 or nvfp4 (the GPU path of each: SPEC §6d; rows padded per\n"
                 "expert)")
      ->type_name("R")
      ->check(CLI::IsMember({"none", "fp8-current", "fp8-block", "mxfp8", "nvfp4"}));
  run.add_option("--steps", o.steps, "timed steps after one warm-up step (default 3)")
      ->type_name("N")
      ->transform(integer_in<int64_t>(1, INT_MAX));
  run.add_option("--warmup-ms", o.warmup_ms,
                 "then more untimed steps until MS milliseconds have passed (default 0):\n"
                 "times the steps under sustained load, as a long training run sees them")
      ->type_name("MS")
      ->transform(integer_in<int64_t>(0, kMax64));
  run.add_option("--seed", o.seed, "random seed (default 1)")
      ->type_name("S")
      ->transform(integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
  run.add_flag("--json", o.json, "print one JSON object instead of the table");
  run.add_flag("--no-check", o.no_check, "skip the fp64 check");
  run.add_flag("--no-fuse", o.no_fuse,
               "run fc1, ScaledSwiGLU and fc2 as separate ops (default: fused GroupedMLP)");
  run.add_option("--glu", o.glu,
                 "gate/linear layout of fc1's output: interleaved32 (default; on sm90 the\n"
                 "fused MLP computes SwiGLU in fc1's GEMM epilogue) or halves")
      ->type_name("L")
      ->check(CLI::IsMember({"interleaved32", "halves"}));
  run.add_flag("--host-splits", o.host_splits,
               "give the counts as a host vector (default: a device tensor, no host sync)");
  run.add_flag("--internal-buffers", o.internal_buffers,
               "let the ops allocate y and dx (default: caller buffers, written in place)");
  run.add_option("--ep", o.ep,
                 "run the whole MoE layer (router -> dispatch -> grouped MLP -> combine) on N\n"
                 "CPU ranks (threads over shared memory; the default for --ep) or, with\n"
                 "--device cuda, on N GPUs (one rank per GPU; needs N visible GPUs):\n"
                 "--experts in all, --tokens per rank; per-phase times, bytes moved, check\n"
                 "against one dense rank")
      ->type_name("N")
      ->transform(integer_in<int64_t>(1, 64));
  run.add_option("--topk", o.topk, "with --ep: experts per token (default 2)")
      ->type_name("K")
      ->transform(integer_in<int64_t>(1, 1024));
  run.add_option("--ep-engine", o.ep_engine,
                 "with --ep N --device cuda: the GPU engine — nccl (NCCL symmetric memory,\n"
                 "NcclRanks; the default when moekit is built with NCCL) or cuda-ranks\n"
                 "(CudaRanks: peer access, event barriers)")
      ->type_name("E")
      ->check(CLI::IsMember({"nccl", "cuda-ranks"}));
}


void progress(int64_t done, int64_t total) {
  if (total <= 1 || !isatty(STDERR_FILENO)) return;
  constexpr int64_t kWidth = 30;
  const int64_t filled = done * kWidth / total;
  std::fprintf(stderr, "\r  step %lld/%lld [%s%s]", static_cast<long long>(done),
               static_cast<long long>(total), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str());
  if (done == total) std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

// A run-time failure of the program's own (the library's are moekit::Error): exit status 1.
struct RunFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The context --device asks for. "no CUDA device" when there is none to give, in either build.
Context make_context(const std::optional<std::string>& device) {
  if (!device) return Context::best_available();
  if (*device == "cpu") return Context::cpu();
  if (!Context::built_with_cuda()) {
    throw RunFailure(
        "--device cuda: no CUDA device: this moekit was built without CUDA "
        "(MOEKIT_WITH_CUDA=OFF or nvcc not found)");
  }
  if (Context::cuda_device_count() == 0) {
    throw RunFailure(
        "--device cuda: no CUDA device (no driver, or no GPU visible: see nvidia-smi and "
        "CUDA_VISIBLE_DEVICES)");
  }
  return Context::cuda(0);
}

// `moekit run --ep N`: the MoE layer on N CPU ranks, or with --device cuda on N GPUs (one rank
// per GPU; --ep-engine: nccl-symmetric by default where built with NCCL, else cuda-ranks)
// (tools/moekit/ep_step.cpp).
int run_ep(const Options& o) {
  const Preset& p = kPresets.at(o.preset);
  const bool cuda = o.device && *o.device == "cuda";
  const int ranks = static_cast<int>(*o.ep);
  if (cuda) {  // before any work: N ranks need N GPUs
    const int gpus = Context::built_with_cuda() ? Context::cuda_device_count() : 0;
    if (gpus < ranks) {
      throw RunFailure(str("--ep ", ranks, " with --device cuda: expects ", ranks,
                           " GPU(s) (one rank per GPU), found ", gpus,
                           Context::built_with_cuda()
                               ? " (see nvidia-smi and CUDA_VISIBLE_DEVICES)"
                               : " (this moekit was built without CUDA)"));
    }
  }
  if (o.ep_engine && !cuda) {
    std::fprintf(stderr, "moekit: --ep-engine %s: only with --ep N --device cuda (CPU ranks have one "
                         "engine)\n(see moekit run --help)\n", o.ep_engine->c_str());
    return 2;
  }
  tools::EpStepConfig cfg;
  cfg.ranks = ranks;
  cfg.cuda = cuda;
  cfg.engine = "cpu-ranks";
  if (cuda) {
    const bool nccl = o.ep_engine ? *o.ep_engine == "nccl" : NcclRanks::built();
    if (nccl && !NcclRanks::built()) {
      throw RunFailure("--ep-engine nccl: this moekit was built without NCCL (MOEKIT_WITH_NCCL; "
                       "--ep-engine cuda-ranks runs without it)");
    }
    cfg.engine = nccl ? "nccl-symmetric" : "cuda-ranks";
  }
  cfg.hidden = p.hidden;
  cfg.ffn = p.ffn;
  cfg.experts = o.experts.value_or(p.experts);
  cfg.tokens =
      o.tokens.value_or(std::max<int64_t>(1, (cuda ? p.tokens_gpu : p.tokens_cpu) / cfg.ranks));
  cfg.topk = o.topk;
  cfg.dtype = parse_dtype(o.dtype);
  cfg.recipe = Recipe::parse(o.recipe);
  cfg.seed = o.seed;
  cfg.steps = o.steps;
  cfg.check = !o.no_check;
  if (cfg.experts % cfg.ranks != 0 || cfg.topk > cfg.experts || cfg.tokens < 1) {
    std::fprintf(stderr,
                 "moekit: --ep %d needs --experts a multiple of it (got %lld), --topk at most "
                 "--experts (got %lld) and --tokens >= 1 (got %lld)\n(see moekit run --help)\n",
                 cfg.ranks, static_cast<long long>(cfg.experts), static_cast<long long>(cfg.topk),
                 static_cast<long long>(cfg.tokens));
    return 2;
  }
  std::fprintf(stderr,
               "moekit run --ep %d: preset %s (%lld experts, top-%lld, %lld tokens per rank, %s) on "
               "%s ranks: 1 warm-up + %lld timed steps%s ...\n",
               cfg.ranks, o.preset.c_str(), static_cast<long long>(cfg.experts),
               static_cast<long long>(cfg.topk), static_cast<long long>(cfg.tokens),
               o.dtype.c_str(), cuda ? "CUDA" : "CPU", static_cast<long long>(cfg.steps),
               cfg.check ? ", the dense one-rank check" : "");
  std::fflush(stderr);
  const tools::EpStepReport r = tools::run_ep_step(cfg, o.preset);
  std::fputs(o.json ? r.json().c_str() : r.table().c_str(), stdout);
  return (!r.checked || r.passed) ? 0 : 1;
}

int run(const Options& o) {
  if (o.ep_engine && !o.ep) {
    std::fprintf(stderr, "moekit: --ep-engine: only with --ep N --device cuda\n(see moekit run --help)\n");
    return 2;
  }
  if (o.ep) return run_ep(o);
  const Preset& p = kPresets.at(o.preset);
  Context ctx = make_context(o.device);
  tools::StepConfig cfg;
  cfg.hidden = p.hidden;
  cfg.ffn = p.ffn;
  cfg.experts = o.experts.value_or(p.experts);
  cfg.tokens = o.tokens.value_or(ctx.device().is_cpu() ? p.tokens_cpu : p.tokens_gpu);
  cfg.tail = o.tail;
  cfg.skewed = o.routing == "skewed";
  cfg.dtype = parse_dtype(o.dtype);
  cfg.recipe = Recipe::parse(o.recipe);
  cfg.seed = o.seed;
  cfg.fuse = !o.no_fuse;
  cfg.glu = o.glu == "halves" ? GluLayout::Halves : GluLayout::Interleaved32;
  cfg.host_splits = o.host_splits;
  cfg.caller_buffers = !o.internal_buffers;
  if (cfg.tokens > std::numeric_limits<int64_t>::max() - cfg.tail) {  // the arguments' fault
    std::fprintf(stderr,
                 "moekit: --tokens + --tail must be at most 2^63 - 1 rows, got %lld + %lld\n"
                 "(see moekit run --help)\n",
                 static_cast<long long>(cfg.tokens), static_cast<long long>(cfg.tail));
    return 2;
  }

  // What is about to run, before the set-up (seconds to minutes on the CPU for qwen3 / dsv3).
  std::fprintf(stderr,
               "moekit run: preset %s (%lld experts, %lld tokens, %s routing, %s) on %s: "
               "set-up, 1 warm-up + %lld timed steps%s ...\n",
               o.preset.c_str(), static_cast<long long>(cfg.experts),
               static_cast<long long>(cfg.tokens), o.routing.c_str(), o.dtype.c_str(),
               ctx.device().to_string().c_str(), static_cast<long long>(o.steps),
               o.no_check ? "" : ", the fp64 check");
  std::fflush(stderr);

  // The samples' room first: a --steps too large for memory fails here, before any work.
  std::vector<double> ms, enqueue_ms;
  ms.reserve(static_cast<size_t>(o.steps));
  enqueue_ms.reserve(static_cast<size_t>(o.steps));

  tools::ExpertStep step(cfg, ctx);
  auto since = [](auto t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  step.run_once();  // warm-up (allocator pools, library handles)
  ctx.synchronize();
  // Sustained load (--warmup-ms): a GPU idle during set-up starts cool and at higher clocks
  // than it keeps under load; a few timed steps alone would see that.
  const auto warmup_ms = static_cast<double>(o.warmup_ms);
  for (const auto t0 = std::chrono::steady_clock::now(); since(t0) < warmup_ms;) {
    step.run_once();
    ctx.synchronize();
  }
  // Per step: the wall time to the end of the device work, and the host time to enqueue it
  // (run_once returns when every kernel is queued). Enqueue close to the step time means the
  // step is bound by host work between launches, not by the GPU.
  for (int64_t s = 0; s < o.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step.run_once();
    enqueue_ms.push_back(since(t0));
    ctx.synchronize();
    ms.push_back(since(t0));
    if (!o.json) progress(s + 1, o.steps);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];  // --steps >= 1: never empty
  };
  const bool checked = !o.no_check;
  const tools::CheckResult check = checked ? step.check() : tools::CheckResult{};
  tools::StepReport r = step.report(median(ms), o.preset, o.routing, check, checked);
  r.enqueue_ms = median(enqueue_ms);
  std::fputs(o.json ? r.json().c_str() : r.table().c_str(), stdout);
  return (!checked || check.passed) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kAbout, "moekit"};
  app.footer(str("Run `moekit run --help` for the options of a run.\n", kExitStatus));
  app.require_subcommand(1);
  CLI::App* run_cmd = app.add_subcommand("run", kRunAbout);
  run_cmd->footer(str(kRunDetails, "\n\n", kExitStatus));
  run_cmd->get_formatter()->column_width(24);
  app.get_formatter()->column_width(24);
  Options o;
  add_run_options(*run_cmd, o);

  if (argc < 2) {  // no command: the help, as a usage error
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "help")) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (argv[1][0] != '-' && std::strcmp(argv[1], "run") != 0) {
    std::fprintf(stderr, "moekit: unknown command '%s'\n(see moekit --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // --help: the help on stdout, status 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string where = app.got_subcommand(run_cmd) ? "moekit run --help" : "moekit --help";
    std::fprintf(stderr, "moekit: %s\n(see %s)\n", e.what(), where.c_str());
    return 2;
  }
  // From here on every failure is a run-time one: a message and status 1, never an uncaught
  // exception (or a usage status for something the arguments were not wrong about).
  std::string message;
  try {
    return run(o);
  } catch (const Error& e) {
    message = e.what();  // "moekit: <kind>: ..."
  } catch (const RunFailure& e) {
    message = str("moekit: ", e.what());
  } catch (const std::bad_alloc&) {
    message =
        "moekit: out of host memory setting up or running the step (fewer --tokens or --experts?)";
  } catch (const std::exception& e) {
    message = str("moekit: the run failed: ", e.what());
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}
