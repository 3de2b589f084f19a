// ExpertParallel: dispatch / combine over a Communicator's symmetric memory (SPEC §7).
//
// Every call runs the same protocol: (1) validate locally (host metadata; on CPU ranks the index
// values too) and agree — an all_gather of every rank's verdict, which also orders this call after
// every rank finished the previous one, so staging memory is free to reuse (GPU engines whose
// all_gather would synchronise agree in band instead: each rank's verdict in its status block, read
// by the call's kernels after its first barrier; begin_call); (2) stores into peers' staging (once
// per (token, destination rank)); barrier; (3) local expansion / reduction from the own staging.
// The loops below are the CPU engine's "kernels": on GPUs each phase becomes a kernel storing
// into the same layout through peer pointers (design/ARCHITECTURE.md, "Expert parallelism").
//
// Symmetric layout on every rank (W ranks, Tm = max_tokens, k = topk, L experts per rank):
//   stage_x  [W src][Tm][H] dtype   rows a source sent here (dispatch: tokens; combine_backward:
//   dy) meta     [W src][Tm][k] i32 ×2 + f32: local expert (-1: none), topk column j, weight counts
//   [W src][L + 1] i64     rows per local expert from each source, + slots sent ret      [W
//   dst][Tm][H] f32     partial sums a destination returned for this rank's tokens ret_flag [W
//   dst][Tm] i32        what that entry holds: nothing, one row in the dtype, an fp32 sum ret_w [W
//   dst][Tm][k] f32     d(topk_weights) per column j, written by j's owner combine_input,
//   dispatch_backward_input [R][H] dtype (zero-copy buffers, read only locally)
#include "moekit/ep/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>

#include "core/checks.h"
#include "ep/ep_device.h"
#include "moekit/core/error.h"

namespace moekit {

// A dispatch's routing, kept by its handle for combine and both backward passes.
struct EpRouting {
  const ExpertParallel::State* owner = nullptr;
  int64_t T = 0;
  std::vector<int64_t> topk_idx;  // [T, k] global expert ids (source side)
  std::vector<int64_t> pos;       // [T, W] slot of token t at rank d, -1 when not sent there
  std::vector<int64_t> sent;      // [W] slots sent to each rank
  // Destination side: what each source's slots hold, entries in ascending local expert.
  struct Entry {
    int32_t expert;  // local expert
    int32_t column;  // topk column j at the source
    int64_t row;     // row of recv, -1 when dropped
  };
  std::vector<std::vector<int64_t>> slot_begin;  // [W src][slots + 1] into entries[src]
  std::vector<std::vector<Entry>> entries;       // [W src]
  std::vector<int64_t> padded;                   // [L] padded counts
  int64_t rows = 0;                              // S
  std::vector<int64_t> pad_rows;                 // padding rows of recv (zero-filled)
  // GPU engines: the same routing, on the device (src/ep/ep_device.h); the host vectors above
  // stay empty (only T is known on the host).
  detail::EpDeviceRouting dev;
  int64_t generation = 0;  // GPU engines: which dispatch of its ExpertParallel this is
};

struct ExpertParallel::State {
  Communicator* comm = nullptr;
  ExpertParallelConfig c;
  int W = 1, r = 0;
  SymmetricMemory stage_x, meta_e, meta_j, meta_w, counts, ret, ret_flag, ret_w;
  SymmetricMemory combine_mem, dbw_mem;
  bool gpu = false;                 // a CUDA engine: the device kernels (src/ep/ep_device.h)
  SymmetricMemory meta_q, status;   // GPU engines only (ep_device.h's layout)
  // GPU engines: the device routing and the splits, allocated once at construction (so that a
  // captured layer step allocates nothing); each dispatch overwrites them, so only the latest
  // dispatch's handle is valid there (one layer step in flight, as for the zero-copy buffers).
  detail::EpDeviceRouting dev_rt;
  Tensor dev_splits, dev_tokens_per_expert;  // [L] i64 each
  int64_t dispatches = 0;
  // In-band agreement (Communicator::Agreement::InBand, GPU engines only): the calls so far (the
  // same on every rank: every call is collective) and the current call's verdict word.
  bool in_band = false;
  int64_t calls = 0;
  int verdict = -1;
  Tensor combine_input, dbw_input;  // [R, H] views of combine_mem / dbw_mem
  EpTraffic traffic;

  size_t es() const { return size_of(c.dtype); }
  size_t row_bytes() const { return static_cast<size_t>(c.hidden) * es(); }
  int64_t E() const { return c.experts_per_rank * W; }
  // Offsets into the symmetric blocks.
  char* stage_row(int rank, int64_t src, int64_t slot) const {
    return stage_x.peer_as<char>(rank) +
           (static_cast<size_t>(src * c.max_tokens + slot)) * row_bytes();
  }
  size_t meta_index(int64_t src, int64_t slot, int64_t j) const {
    return static_cast<size_t>((src * c.max_tokens + slot) * c.topk + j);
  }
  float* ret_row(int rank, int64_t dst, int64_t slot) const {
    return ret.peer_as<float>(rank) + static_cast<size_t>(dst * c.max_tokens + slot) * c.hidden;
  }
};

namespace {

const char* kCall[] = {"dispatch", "combine", "combine_backward", "dispatch_backward"};
enum Call { kDispatch, kCombine, kCombineBackward, kDispatchBackward };

// Every rank's verdict on its arguments; throws on every rank when one refused them (nothing was
// sent yet): the rank at fault its own error, the others an InvalidArgument naming that rank.
void agree(Communicator& comm, Call call, const std::optional<Error>& local) {
  const std::vector<std::string> all = comm.all_gather(local ? local->what() : "");
  if (local) throw *local;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      throw_error(ErrorKind::InvalidArgument,
                  str(kCall[call], ": rank ", r, " refused its arguments, nothing was sent (",
                      all[r], ")"));
    }
  }
}

template <class F>
std::optional<Error> validated(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// The caller's buffer when one was given, else a new tensor of `shape` on ctx.
Tensor given_or_new(const Tensor& given, const Shape& shape, DType dtype, const Context& ctx) {
  return given.defined() ? given : Tensor::empty(shape, dtype, ctx);
}

int64_t round_up(int64_t n, int64_t a) {
  return (n + a - 1) / a * a;
}

// Sums fp32 rows keyed by ascending distinct leaf ids up a perfect binary tree, absent leaves
// skipped (no addition of zeros): siblings 2m, 2m + 1 are added (left += right) and become m,
// level by level. The result is in rows[0]; keys and rows are consumed.
void tree_reduce(std::vector<int64_t>& keys, std::vector<float*>& rows, int64_t H) {
  while (keys.size() > 1) {
    size_t out = 0;
    for (size_t i = 0; i < keys.size(); ++out) {
      float* left = rows[i];
      if (i + 1 < keys.size() && (keys[i] >> 1) == (keys[i + 1] >> 1)) {
        const float* right = rows[i + 1];
        for (int64_t h = 0; h < H; ++h) left[h] = left[h] + right[h];
        keys[out] = keys[i] >> 1;
        i += 2;
      } else {
        keys[out] = keys[i] >> 1;
        i += 1;
      }
      rows[out] = left;
    }
    keys.resize(out);
    rows.resize(out);
  }
}

void check_handle(const ExpertParallel::Handle& h, const ExpertParallel::State* s) {
  if (!h.defined()) throw_invalid("handle", "the handle of a dispatch", "an undefined handle");
  if (h.routing->owner != s) {
    throw_invalid("handle", "a handle of this ExpertParallel's dispatch",
                  "a handle of another ExpertParallel");
  }
  if (s->gpu && h.routing->generation != s->dispatches) {
    throw_invalid("handle", "the latest dispatch's handle (a GPU engine keeps one routing)",
                  str("the handle of dispatch ", h.routing->generation, " of ", s->dispatches));
  }
}

// What a destination returned for a (token, rank): nothing (every row dropped), the one row in
// the dtype, or the fp32 tree sum of several.
constexpr int32_t kNothing = 0, kRowInDtype = 1, kPartialF32 = 2;
// Index (from b) of the first entry of [b, e) that kept its row.
size_t first_kept(const std::vector<EpRouting::Entry>& ents, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) {
    if (ents[i].row >= 0) return i - b;
  }
  return e - b;
}

// Destination side of combine / dispatch_backward: for every source slot the fp32 tree sum of its
// rows of `in` [R, H] over local expert ids, stored into the source's ret (and, with dw_rows, each
// column's d(weight) into its ret_w).
void reduce_and_return(ExpertParallel::State& s, const EpRouting& rt, const Tensor& in,
                       const float* dw_rows) {
  const int64_t H = s.c.hidden;
  std::vector<float> scratch;
  std::vector<int64_t> keys;
  std::vector<float*> rows;
  const char* base = static_cast<const char*>(in.data());
  for (int src = 0; src < s.W; ++src) {
    const auto& begin = rt.slot_begin[static_cast<size_t>(src)];
    const auto& ents = rt.entries[static_cast<size_t>(src)];
    int32_t* flags = s.ret_flag.peer_as<int32_t>(src);
    float* ret_w = s.ret_w.peer_as<float>(src);
    const int64_t slots = static_cast<int64_t>(begin.size()) - 1;
    for (int64_t slot = 0; slot < slots; ++slot) {
      const auto b = static_cast<size_t>(begin[static_cast<size_t>(slot)]);
      const auto e = static_cast<size_t>(begin[static_cast<size_t>(slot) + 1]);
      keys.clear();
      rows.clear();
      scratch.resize((e - b) * static_cast<size_t>(H));
      for (size_t i = b; i < e; ++i) {
        const EpRouting::Entry& en = ents[i];
        if (dw_rows) {
          ret_w[s.meta_index(s.r, slot, en.column)] = en.row >= 0 ? dw_rows[en.row] : 0.0f;
        }
        if (en.row < 0) continue;
        float* dst = scratch.data() + rows.size() * static_cast<size_t>(H);
        to_f32(base + static_cast<size_t>(en.row) * s.row_bytes(), s.c.dtype, dst,
               static_cast<size_t>(H));
        keys.push_back(en.expert);
        rows.push_back(dst);
      }
      const size_t flag = static_cast<size_t>(s.r * s.c.max_tokens + slot);
      float* out = s.ret_row(src, s.r, slot);
      if (rows.empty()) {
        flags[flag] = kNothing;
        (src != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) += 4;
        continue;
      }
      int64_t stored = 4;  // the flag
      if (rows.size() == 1) {
        // One row: it travels as it is, in the dtype (its fp32 value is exact, so the sum on the
        // source is the same): half the bytes of an fp32 partial for 16-bit dtypes.
        std::memcpy(
            out, base + static_cast<size_t>(ents[b + first_kept(ents, b, e)].row) * s.row_bytes(),
            s.row_bytes());
        flags[flag] = kRowInDtype;
        stored += static_cast<int64_t>(s.row_bytes());
      } else {
        tree_reduce(keys, rows, H);
        std::memcpy(out, rows[0], static_cast<size_t>(H) * sizeof(float));
        flags[flag] = kPartialF32;
        stored += H * 4;
      }
      (src != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) += stored;
    }
    if (dw_rows) {
      (src != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) +=
          static_cast<int64_t>(ents.size()) * 4;
    }
  }
}

// Source side: out[t] ([T, H]) = the tree over ranks of the partials returned for t, rounded once.
void sum_returned(const ExpertParallel::State& s, const EpRouting& rt, const Tensor& out) {
  const int64_t H = s.c.hidden, T = rt.T;
  const int32_t* flags = s.ret_flag.peer_as<int32_t>(s.r);
  std::vector<float> scratch(static_cast<size_t>(s.W * H));
  std::vector<int64_t> keys;
  std::vector<float*> rows;
  char* o = static_cast<char*>(out.data());
  for (int64_t t = 0; t < T; ++t) {
    keys.clear();
    rows.clear();
    for (int d = 0; d < s.W; ++d) {
      const int64_t slot = rt.pos[static_cast<size_t>(t * s.W + d)];
      if (slot < 0) continue;
      const int32_t flag = flags[static_cast<size_t>(d * s.c.max_tokens + slot)];
      if (flag == kNothing) continue;
      float* row = scratch.data() + rows.size() * static_cast<size_t>(H);
      if (flag == kRowInDtype) {
        to_f32(s.ret_row(s.r, d, slot), s.c.dtype, row, static_cast<size_t>(H));
      } else {
        std::memcpy(row, s.ret_row(s.r, d, slot), static_cast<size_t>(H) * sizeof(float));
      }
      keys.push_back(d);
      rows.push_back(row);
    }
    char* dst = o + static_cast<size_t>(t) * s.row_bytes();
    if (rows.empty()) {
      std::memset(dst, 0, s.row_bytes());  // every row dropped: a zero row (+0 in every dtype)
      continue;
    }
    tree_reduce(keys, rows, H);
    from_f32(rows[0], dst, s.c.dtype, static_cast<size_t>(H));
  }
}

// Source side of dispatch_backward: gw[t, j] (the [T, k] f32 d(topk_weights)) = what the rank
// owning column j's expert returned for it.
void gather_returned_weights(const ExpertParallel::State& s, const EpRouting& rt,
                             const Tensor& gw) {
  const int64_t T = rt.T, k = s.c.topk, L = s.c.experts_per_rank;
  float* out = gw.data_as<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t d = rt.topk_idx[static_cast<size_t>(t * k + j)] / L;
      const int64_t slot = rt.pos[static_cast<size_t>(t * s.W + d)];
      out[t * k + j] = s.ret_w.peer_as<float>(s.r)[s.meta_index(d, slot, j)];
    }
  }
}

// Source side of dispatch / combine_backward: each row of `src_rows` [T, H] stored once into the
// staging of every rank its token goes to.
void send_rows(ExpertParallel::State& s, const EpRouting& rt, const Tensor& src_rows) {
  const char* x = static_cast<const char*>(src_rows.data());
  for (int64_t t = 0; t < rt.T; ++t) {
    for (int d = 0; d < s.W; ++d) {
      const int64_t slot = rt.pos[static_cast<size_t>(t * s.W + d)];
      if (slot < 0) continue;
      std::memcpy(s.stage_row(d, s.r, slot), x + static_cast<size_t>(t) * s.row_bytes(),
                  s.row_bytes());
      (d != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) +=
          static_cast<int64_t>(s.row_bytes());
    }
  }
}

// Destination side: each staged row copied into the recv rows of its experts; padding rows zero.
void expand_rows(const ExpertParallel::State& s, const EpRouting& rt, const Tensor& out) {
  char* o = static_cast<char*>(out.data());
  for (int src = 0; src < s.W; ++src) {
    const auto& begin = rt.slot_begin[static_cast<size_t>(src)];
    const auto& ents = rt.entries[static_cast<size_t>(src)];
    for (size_t slot = 0; slot + 1 < begin.size(); ++slot) {
      const char* row = s.stage_row(s.r, src, static_cast<int64_t>(slot));
      for (auto i = begin[slot]; i < begin[slot + 1]; ++i) {
        const EpRouting::Entry& en = ents[static_cast<size_t>(i)];
        if (en.row >= 0)
          std::memcpy(o + static_cast<size_t>(en.row) * s.row_bytes(), row, s.row_bytes());
      }
    }
  }
  for (int64_t p : rt.pad_rows)
    std::memset(o + static_cast<size_t>(p) * s.row_bytes(), 0, s.row_bytes());
}

// Per-slot all-to-all comparison: one row per (token, expert on another rank), in the dtype.
int64_t per_slot_bytes(const ExpertParallel::State& s, const EpRouting& rt) {
  int64_t n = 0;
  for (int64_t v : rt.topk_idx) n += (v / s.c.experts_per_rank != s.r);
  return n * static_cast<int64_t>(s.row_bytes());
}

// The checks of combine and combine_backward: the handle, then `in` and the caller's `output` (if
// given), one of them [T, H] (tokens) and the other [R, H] (`in_is_tokens`: `in` is the [T, H]).
std::optional<Error> check_rows_call(const ExpertParallel::State& s,
                                     const ExpertParallel::Handle& handle, const char* in_name,
                                     const Tensor& in, bool in_is_tokens, const Tensor& output) {
  return validated([&] {
    check_handle(handle, &s);
    const Shape tokens{handle.routing->T, s.c.hidden}, recv{s.c.receive_capacity, s.c.hidden};
    const Device dev = s.comm->context().device();
    check_input(in_name, in, in_is_tokens ? tokens : recv, s.c.dtype, dev);
    if (output.defined()) {
      check_caller_buffer("output", output, in_is_tokens ? recv : tokens, s.c.dtype, dev,
                          {{in_name, in}});
    }
  });
}

// Step (1)'s end of every call: the ranks agree on its arguments (`bad`: this rank's verdict) and
// the traffic counters start over. Host agreement: the all_gather above, every rank throws when
// one refused. In band (SPEC §7): this rank's verdict into its own status block, which the call's
// kernels read on every rank after the first barrier; returns false when this rank refused (it
// then meets the call's other barriers and throws: refuse_in_band). A GPU engine's kernels run on
// streams, so with W > 1 it meets the other ranks once more before its stores (every rank is done
// with the previous call's buffers, and in band every verdict is visible after it); on the CPU the
// agreement's all_gather did that.
bool begin_call(ExpertParallel::State& s, Call call, const std::optional<Error>& bad) {
  if (s.in_band) {
    s.verdict = detail::kEpVerdictWords[s.calls++ & 1];
    detail::ep_store_verdict(s.comm->context(), s.status.local.data(), s.verdict, bad.has_value());
  } else {
    agree(*s.comm, call, bad);
  }
  s.traffic = {};
  if (s.gpu && s.W > 1) s.comm->barrier();
  return !bad;
}

// The barriers of a call after begin_call's: dispatch's two (after ep_count, after ep_send), one
// for the others (stores_done).
constexpr int kBarriersAfterBegin[] = {2, 1, 1, 1};

// In band, a rank that refused its arguments: the other ranks' kernels store nothing (they read
// its verdict); it meets the rest of the call's barriers so that no rank waits for it, then throws.
[[noreturn]] void refuse_in_band(ExpertParallel::State& s, Call call, const Error& e) {
  for (int i = 0; i < kBarriersAfterBegin[call]; ++i) s.comm->barrier();
  throw e;
}

// Between step (2) and (3): this rank's stores are done (the CPU engine counts their per-slot
// comparison); the barrier after which every rank reads its own staging.
void stores_done(ExpertParallel::State& s, const EpRouting& rt) {
  if (!s.gpu) s.traffic.per_slot_bytes = per_slot_bytes(s, rt);
  s.comm->barrier();
}

// ---- GPU engines: the same protocol, each phase a kernel of src/backends/cuda/ep/ queued on the
// rank's stream (no host synchronisation: capturable). Barriers between the store and read
// phases are the Communicator's (stream-ordered; CudaRanks: events, nothing with one rank).
detail::EpDeviceArgs device_args(const ExpertParallel::State& s) {
  detail::EpDeviceArgs a = detail::ep_device_args(s.comm->context());
  a.W = s.W;
  a.r = s.r;
  a.L = s.c.experts_per_rank;
  a.H = s.c.hidden;
  a.k = s.c.topk;
  a.Tm = s.c.max_tokens;
  a.R = s.c.receive_capacity;
  a.A = s.c.alignment;
  a.dtype = static_cast<int>(s.c.dtype);
  a.drop = s.c.overflow == OverflowPolicy::Drop;
  a.verdict = s.in_band ? s.verdict : -1;
  auto peers = [&](const SymmetricMemory& m) {
    detail::EpPeers p;
    for (int r = 0; r < s.W; ++r) p.p[r] = m.peers[static_cast<size_t>(r)];
    return p;
  };
  a.stage_x = peers(s.stage_x);
  a.meta_e = peers(s.meta_e);
  a.meta_j = peers(s.meta_j);
  a.meta_w = peers(s.meta_w);
  a.meta_q = peers(s.meta_q);
  a.counts = peers(s.counts);
  a.status = peers(s.status);
  a.ret = peers(s.ret);
  a.ret_flag = peers(s.ret_flag);
  a.ret_w = peers(s.ret_w);
  return a;
}

ExpertParallel::Dispatched dispatch_on_device(ExpertParallel::State& s,
                                              std::shared_ptr<EpRouting> rt, const Tensor& tokens,
                                              const Tensor& topk_idx, const Tensor& topk_weights,
                                              const ExpertParallel::DispatchBuffers& buffers) {
  const Context& ctx = s.comm->context();
  const ExpertParallelConfig& c = s.c;
  rt->dev = s.dev_rt;
  rt->generation = ++s.dispatches;
  const detail::EpDeviceRouting& d = rt->dev;
  ExpertParallel::Dispatched out;
  const Tensor& splits = s.dev_splits;
  out.tokens_per_expert = s.dev_tokens_per_expert;
  out.recv = given_or_new(buffers.recv, {c.receive_capacity, c.hidden}, c.dtype, ctx);
  out.weights = given_or_new(buffers.weights, {c.receive_capacity}, DType::F32, ctx);  // [R]
  const detail::EpDeviceArgs a = device_args(s);
  detail::ep_count(ctx, a, topk_idx, rt->T, d);  // own status + counts block
  s.comm->barrier();
  detail::ep_plan(ctx, a, d, splits, out.tokens_per_expert);  // the verdict, on every rank
  detail::ep_send(ctx, a, d, tokens, rt->T, topk_weights);
  s.comm->barrier();
  detail::ep_expand(ctx, a, d, out.recv, out.weights, true);
  out.splits = Splits::device(splits);
  out.rows = -1;  // on the device: the sum of splits
  out.dropped = -1;
  out.handle.routing = std::move(rt);
  return out;
}

}  // namespace

namespace {

// The collective allocations of an ExpertParallel, in the order its constructor makes them (every
// rank the same): staging rows, routing metadata, counts, returned rows (fp32), their flags and
// weights, the two zero-copy buffers; the GPU engines add a slot table and a status word.
std::vector<size_t> symmetric_block_sizes(const ExpertParallelConfig& c, int world, bool gpu) {
  const auto W = static_cast<size_t>(world), Tm = static_cast<size_t>(c.max_tokens),
             H = static_cast<size_t>(c.hidden), k = static_cast<size_t>(c.topk),
             L = static_cast<size_t>(c.experts_per_rank),
             R = static_cast<size_t>(c.receive_capacity), row = H * size_of(c.dtype);
  std::vector<size_t> sizes{W * Tm * row,   W * Tm * k * 4, W * Tm * k * 4, W * Tm * k * 4,
                            W * (L + 1) * 8, W * Tm * H * 4, W * Tm * 4,     W * Tm * k * 4,
                            R * row,         R * row};
  if (gpu) {
    sizes.push_back(W * Tm * k * 4);
    sizes.push_back(64);
  }
  return sizes;
}

}  // namespace

size_t ExpertParallel::symmetric_bytes(const ExpertParallelConfig& config, int world_size,
                                       const Device& device) {
  if (world_size < 1) throw_invalid("world_size", "at least 1 rank", std::to_string(world_size));
  size_t total = 0;
  for (size_t b : symmetric_block_sizes(config, world_size, device.is_cuda())) {
    total += (b + kSymmetricAlignment - 1) / kSymmetricAlignment * kSymmetricAlignment;
  }
  return total;
}

ExpertParallel::ExpertParallel(Communicator& comm, const ExpertParallelConfig& config)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.comm = &comm;
  s.c = config;
  s.W = comm.world_size();
  s.r = comm.rank();
  const ExpertParallelConfig& c = config;
  auto positive = [](const char* field, int64_t v) {
    if (v < 1) throw_invalid(field, "a value >= 1", std::to_string(v));
  };
  std::optional<Error> bad = validated([&] {
    positive("experts_per_rank", c.experts_per_rank);
    positive("hidden", c.hidden);
    positive("topk", c.topk);
    positive("max_tokens", c.max_tokens);
    positive("receive_capacity", c.receive_capacity);
    positive("alignment", c.alignment);
    if (c.topk > c.experts_per_rank * s.W) {
      throw_invalid("topk", str("at most E = ", c.experts_per_rank * s.W, " experts"),
                    std::to_string(c.topk));
    }
    if (!is_compute_dtype(c.dtype)) {
      throw_invalid("dtype", "f32, f16 or bf16", std::string(name(c.dtype)));
    }
    if (comm.context().device().is_cuda()) {
      if (s.W > detail::kEpMaxRanks) {
        throw_error(ErrorKind::Unsupported,
                    str("ExpertParallel on CUDA: at most ", detail::kEpMaxRanks,
                        " ranks (one NVLink domain), the group has ", s.W));
      }
      if (c.topk > detail::kEpMaxTopk) {
        throw_error(ErrorKind::Unsupported, str("ExpertParallel on CUDA: topk at most ",
                                                detail::kEpMaxTopk, ", got ", c.topk));
      }
    } else if (!comm.context().device().is_cpu()) {
      throw_error(ErrorKind::Unsupported,
                  str("ExpertParallel on ", comm.context().device().to_string()));
    }
  });
  // Every rank's config must be the same one: the symmetric allocations below check the sizes.
  const std::vector<std::string> all = comm.all_gather(bad ? bad->what() : "");
  if (bad) throw *bad;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      throw_error(ErrorKind::InvalidArgument,
                  str("ExpertParallel: rank ", r, " refused its config (", all[r], ")"));
    }
  }
  s.gpu = comm.context().device().is_cuda();
  s.in_band = s.gpu && comm.agreement() == Communicator::Agreement::InBand;
  SymmetricMemory* const blocks[] = {&s.stage_x, &s.meta_e,  &s.meta_j,      &s.meta_w,
                                     &s.counts,  &s.ret,     &s.ret_flag,    &s.ret_w,
                                     &s.combine_mem, &s.dbw_mem, &s.meta_q,  &s.status};
  const std::vector<size_t> sizes = symmetric_block_sizes(c, s.W, s.gpu);
  for (size_t i = 0; i < sizes.size(); ++i) *blocks[i] = comm.allocate(sizes[i]);
  if (s.gpu) {
    const Context& ctx = comm.context();
    const auto w = static_cast<int64_t>(s.W), tm = c.max_tokens, kk = c.topk;
    const int64_t l = c.experts_per_rank;
    detail::EpDeviceRouting& d = s.dev_rt;
    d.plan = Tensor::empty({detail::ep_plan_words(w, l)}, DType::I64, ctx);
    d.src_pos = Tensor::empty({tm, w}, DType::I32, ctx);    // [Tm, W]
    d.src_topk = Tensor::empty({tm, kk}, DType::I32, ctx);  // [Tm, k]
    d.src_q = Tensor::empty({tm, kk}, DType::I32, ctx);     // [Tm, k]
    d.dst_e = Tensor::empty({w, tm, kk}, DType::I32, ctx);  // [W src, Tm, k]
    d.dst_j = Tensor::empty({w, tm, kk}, DType::I32, ctx);
    d.dst_row = Tensor::empty({w, tm, kk}, DType::I32, ctx);
    s.dev_splits = Tensor::empty({l}, DType::I64, ctx);
    s.dev_tokens_per_expert = Tensor::empty({l}, DType::I64, ctx);
    // A handle used before any dispatch on this rank finds plan[0] = 0 (refused: no stores).
    fill(ctx, d.plan, 0.0);
  }
  const Device dev = comm.context().device();
  s.combine_input =
      Tensor::wrap(s.combine_mem.local.data(), {c.receive_capacity, c.hidden}, c.dtype, dev);
  s.dbw_input = Tensor::wrap(s.dbw_mem.local.data(), {c.receive_capacity, c.hidden}, c.dtype, dev);
}

ExpertParallel::~ExpertParallel() = default;

const ExpertParallelConfig& ExpertParallel::config() const {
  return s_->c;
}
int ExpertParallel::rank() const {
  return s_->r;
}
int ExpertParallel::world_size() const {
  return s_->W;
}
int64_t ExpertParallel::experts() const {
  return s_->E();
}
const Context& ExpertParallel::context() const {
  return s_->comm->context();
}
const Tensor& ExpertParallel::combine_input() const {
  return s_->combine_input;
}
const Tensor& ExpertParallel::dispatch_backward_input() const {
  return s_->dbw_input;
}
EpTraffic ExpertParallel::last_traffic() const {
  return s_->traffic;
}

ExpertParallel::Dispatched ExpertParallel::dispatch(const Tensor& tokens, const Tensor& topk_idx,
                                                    const Tensor& topk_weights,
                                                    const DispatchBuffers& buffers) {
  State& s = *s_;
  const ExpertParallelConfig& c = s.c;
  const int64_t H = c.hidden, k = c.topk, L = c.experts_per_rank, E = s.E();
  const Device dev = context().device();
  Communicator& comm = *s.comm;
  auto rt = std::make_shared<EpRouting>();
  rt->owner = &s;
  // ---- (1) validation before anything is sent: shapes, dtypes, then every index value
  std::optional<Error> bad = validated([&] {
    check_input("tokens", tokens, {-1, H}, c.dtype, dev);
    const int64_t T = tokens.size(0);
    if (T > c.max_tokens) {
      throw_invalid("tokens", str("at most max_tokens = ", c.max_tokens, " rows"),
                    to_string(tokens.shape()));
    }
    if (topk_idx.defined() && topk_idx.dtype() == DType::I32) {
      check_input("topk_idx", topk_idx, {T, k}, DType::I32, dev);
    } else {
      check_input("topk_idx", topk_idx, {T, k}, DType::I64, dev);
    }
    check_input("topk_weights", topk_weights, {T, k}, DType::F32, dev);
    if (buffers.recv.defined()) {
      check_caller_buffer("recv", buffers.recv, {c.receive_capacity, H}, c.dtype, dev,
                          {{"tokens", tokens},
                           {"topk_idx", topk_idx},
                           {"topk_weights", topk_weights},
                           {"weights", buffers.weights}});
    }
    if (buffers.weights.defined()) {
      check_caller_buffer(
          "weights", buffers.weights, {c.receive_capacity}, DType::F32, dev,
          {{"tokens", tokens}, {"topk_idx", topk_idx}, {"topk_weights", topk_weights}});
    }
    rt->T = T;
    if (s.gpu) return;  // the values are checked on the device (ep_count / ep_plan)
    rt->topk_idx.resize(static_cast<size_t>(T * k));
    for (int64_t i = 0; i < T * k; ++i) {
      rt->topk_idx[static_cast<size_t>(i)] = topk_idx.dtype() == DType::I32
                                                 ? topk_idx.data_as<int32_t>()[i]
                                                 : topk_idx.data_as<int64_t>()[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t* row = rt->topk_idx.data() + t * k;
      for (int64_t j = 0; j < k; ++j) {
        if (row[j] < 0 || row[j] >= E) {
          throw_invalid(str("topk_idx[", t, ", ", j, "]"), str("an expert in [0, ", E, ")"),
                        std::to_string(row[j]));
        }
        for (int64_t i = 0; i < j; ++i) {
          if (row[i] == row[j]) {
            throw_invalid(str("topk_idx[", t, "]"), "k distinct experts per token",
                          str("expert ", row[j], " in columns ", i, " and ", j));
          }
        }
      }
    }
  });
  if (!begin_call(s, kDispatch, bad)) {
    ++s.dispatches;  // its earlier handles die too, as on the ranks whose dispatch was refused
    refuse_in_band(s, kDispatch, *bad);
  }
  if (s.gpu) return dispatch_on_device(s, std::move(rt), tokens, topk_idx, topk_weights, buffers);
  const int64_t T = rt->T;
  const float* w = topk_weights.data_as<float>();

  // ---- (2a) per destination rank: the slot of each token sent there, and counts per local expert
  rt->pos.assign(static_cast<size_t>(T * s.W), -1);
  rt->sent.assign(static_cast<size_t>(s.W), 0);
  std::vector<int64_t> cnt(static_cast<size_t>(s.W * (L + 1)), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t g = rt->topk_idx[static_cast<size_t>(t * k + j)];
      const int64_t d = g / L;
      int64_t& p = rt->pos[static_cast<size_t>(t * s.W + d)];
      if (p < 0) p = rt->sent[static_cast<size_t>(d)]++;
      ++cnt[static_cast<size_t>(d * (L + 1) + g % L)];
    }
  }
  for (int d = 0; d < s.W; ++d) {
    int64_t* dst = s.counts.peer_as<int64_t>(d) + s.r * (L + 1);
    std::copy_n(cnt.data() + d * (L + 1), L, dst);
    dst[L] = rt->sent[static_cast<size_t>(d)];
    (d != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) += (L + 1) * 8;
  }
  comm.barrier();
  // ---- (2b) destination: rows per expert, padded; every rank's need checked against R
  const int64_t* counts_in = s.counts.peer_as<int64_t>(s.r);  // [W src][L + 1]
  std::vector<int64_t> c_e(static_cast<size_t>(L), 0);
  for (int src = 0; src < s.W; ++src) {
    for (int64_t e = 0; e < L; ++e) c_e[static_cast<size_t>(e)] += counts_in[src * (L + 1) + e];
  }
  int64_t needed = 0;
  for (int64_t e = 0; e < L; ++e) needed += round_up(c_e[static_cast<size_t>(e)], c.alignment);
  const std::vector<std::string> needs = comm.all_gather(std::to_string(needed));
  if (c.overflow == OverflowPolicy::Error) {
    for (size_t r = 0; r < needs.size(); ++r) {
      const int64_t n = std::stoll(needs[r]);
      if (n > c.receive_capacity) {
        throw_error(ErrorKind::InvalidArgument,
                    str("dispatch: receive capacity exceeded on rank ", r, ": needs ", n,
                        " rows (each expert's rows padded to a multiple of ", c.alignment,
                        "), receive_capacity is ", c.receive_capacity,
                        "; nothing was sent (OverflowPolicy::Drop drops and counts instead)"));
      }
    }
  }
  std::vector<int64_t> kept(static_cast<size_t>(L)), off(static_cast<size_t>(L) + 1, 0);
  rt->padded.resize(static_cast<size_t>(L));
  for (int64_t e = 0; e < L; ++e) {
    const int64_t room = std::max<int64_t>(
        0, (c.receive_capacity - off[static_cast<size_t>(e)]) / c.alignment * c.alignment);
    kept[static_cast<size_t>(e)] = std::min(c_e[static_cast<size_t>(e)], room);
    rt->padded[static_cast<size_t>(e)] = round_up(kept[static_cast<size_t>(e)], c.alignment);
    off[static_cast<size_t>(e) + 1] =
        off[static_cast<size_t>(e)] + rt->padded[static_cast<size_t>(e)];
  }
  rt->rows = off[static_cast<size_t>(L)];

  // ---- (3) source: each token once into every destination's staging, with its entries there
  send_rows(s, *rt, tokens);
  for (int64_t t = 0; t < T; ++t) {
    for (int d = 0; d < s.W; ++d) {
      const int64_t slot = rt->pos[static_cast<size_t>(t * s.W + d)];
      if (slot < 0) continue;
      // This token's columns owned by d, in ascending local expert.
      std::vector<std::pair<int64_t, int64_t>> mine;  // (local expert, column)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t g = rt->topk_idx[static_cast<size_t>(t * k + j)];
        if (g / L == d) mine.push_back({g % L, j});
      }
      std::sort(mine.begin(), mine.end());
      int32_t* me = s.meta_e.peer_as<int32_t>(d);
      int32_t* mj = s.meta_j.peer_as<int32_t>(d);
      float* mw = s.meta_w.peer_as<float>(d);
      for (int64_t i = 0; i < k; ++i) {
        const size_t at = s.meta_index(s.r, slot, i);
        const bool used = i < static_cast<int64_t>(mine.size());
        me[at] = used ? static_cast<int32_t>(mine[static_cast<size_t>(i)].first) : -1;
        mj[at] = used ? static_cast<int32_t>(mine[static_cast<size_t>(i)].second) : -1;
        mw[at] = used ? w[t * k + mine[static_cast<size_t>(i)].second] : 0.0f;
      }
      (d != s.r ? s.traffic.remote_bytes : s.traffic.local_bytes) += k * 12;
    }
  }
  s.traffic.per_slot_bytes = per_slot_bytes(s, *rt);
  comm.barrier();

  // ---- (4) destination: entries in (expert, source, slot) order get rows while they fit
  rt->slot_begin.resize(static_cast<size_t>(s.W));
  rt->entries.resize(static_cast<size_t>(s.W));
  std::vector<int64_t> taken(static_cast<size_t>(L), 0);
  // Rows are assigned expert by expert, then by source and slot: first gather each entry's place.
  const int32_t* me = s.meta_e.peer_as<int32_t>(s.r);
  const int32_t* mj = s.meta_j.peer_as<int32_t>(s.r);
  for (int src = 0; src < s.W; ++src) {
    const int64_t slots = counts_in[src * (L + 1) + L];
    auto& begin = rt->slot_begin[static_cast<size_t>(src)];
    auto& ents = rt->entries[static_cast<size_t>(src)];
    begin.assign(1, 0);
    for (int64_t slot = 0; slot < slots; ++slot) {
      for (int64_t i = 0; i < k; ++i) {
        const size_t at = s.meta_index(src, slot, i);
        if (me[at] < 0) break;
        ents.push_back({me[at], mj[at], -1});
      }
      begin.push_back(static_cast<int64_t>(ents.size()));
    }
  }
  for (int64_t e = 0; e < L; ++e) {
    for (int src = 0; src < s.W; ++src) {
      for (auto& en : rt->entries[static_cast<size_t>(src)]) {
        if (en.expert != e) continue;
        int64_t& n = taken[static_cast<size_t>(e)];
        if (n < kept[static_cast<size_t>(e)]) en.row = off[static_cast<size_t>(e)] + n;
        ++n;
      }
    }
  }
  Dispatched out;
  for (int64_t e = 0; e < L; ++e) {
    out.dropped += c_e[static_cast<size_t>(e)] - kept[static_cast<size_t>(e)];
    for (int64_t p = off[static_cast<size_t>(e)] + kept[static_cast<size_t>(e)];
         p < off[static_cast<size_t>(e) + 1]; ++p) {
      rt->pad_rows.push_back(p);
    }
  }
  const Context& ctx = context();
  out.recv = given_or_new(buffers.recv, {c.receive_capacity, H}, c.dtype, ctx);  // [R, H]
  expand_rows(s, *rt, out.recv);
  out.weights = given_or_new(buffers.weights, {c.receive_capacity}, DType::F32, ctx);  // [R]
  float* rw = out.weights.data_as<float>();
  const float* mw = s.meta_w.peer_as<float>(s.r);
  for (int src = 0; src < s.W; ++src) {
    const auto& begin = rt->slot_begin[static_cast<size_t>(src)];
    const auto& ents = rt->entries[static_cast<size_t>(src)];
    for (size_t slot = 0; slot + 1 < begin.size(); ++slot) {
      for (auto i = begin[slot]; i < begin[slot + 1]; ++i) {
        const auto& en = ents[static_cast<size_t>(i)];
        if (en.row >= 0)
          rw[en.row] = mw[s.meta_index(src, static_cast<int64_t>(slot), i - begin[slot])];
      }
    }
  }
  for (int64_t p : rt->pad_rows) rw[p] = 0.0f;
  out.tokens_per_expert = Tensor::empty({L}, DType::I64, ctx);
  Tensor padded = Tensor::empty({L}, DType::I64, ctx);
  for (int64_t e = 0; e < L; ++e) {
    out.tokens_per_expert.data_as<int64_t>()[e] = kept[static_cast<size_t>(e)];
    padded.data_as<int64_t>()[e] = rt->padded[static_cast<size_t>(e)];
  }
  out.splits = Splits::device(padded);
  out.rows = rt->rows;
  out.handle.routing = std::move(rt);
  return out;
}

Tensor ExpertParallel::combine(const Handle& handle, const Tensor& expert_out,
                               const Tensor& output) {
  State& s = *s_;
  const std::optional<Error> bad =
      check_rows_call(s, handle, "expert_out", expert_out, false, output);
  if (!begin_call(s, kCombine, bad)) refuse_in_band(s, kCombine, *bad);
  const EpRouting& rt = *handle.routing;
  if (s.gpu) {
    detail::ep_reduce(context(), device_args(s), rt.dev, expert_out, {});
  } else {
    reduce_and_return(s, rt, expert_out, nullptr);
  }
  stores_done(s, rt);
  Tensor out = given_or_new(output, {rt.T, s.c.hidden}, s.c.dtype, context());  // [T, H]
  if (s.gpu) {
    detail::ep_sum(context(), device_args(s), rt.dev, rt.T, out, {});
  } else {
    sum_returned(s, rt, out);
  }
  return out;
}

Tensor ExpertParallel::combine_backward(const Handle& handle, const Tensor& grad_output,
                                        const Tensor& output) {
  State& s = *s_;
  const std::optional<Error> bad =
      check_rows_call(s, handle, "grad_output", grad_output, true, output);
  if (!begin_call(s, kCombineBackward, bad)) refuse_in_band(s, kCombineBackward, *bad);
  const EpRouting& rt = *handle.routing;
  if (s.gpu) {
    detail::ep_send(context(), device_args(s), rt.dev, grad_output, rt.T, {});
  } else {
    send_rows(s, rt, grad_output);
  }
  stores_done(s, rt);
  Tensor out = given_or_new(output, {s.c.receive_capacity, s.c.hidden}, s.c.dtype,
                            context());  // [R, H]
  if (s.gpu) {
    detail::ep_expand(context(), device_args(s), rt.dev, out, {}, false);
  } else {
    expand_rows(s, rt, out);
  }
  return out;
}

ExpertParallel::DispatchGrads ExpertParallel::dispatch_backward(
    const Handle& handle, const Tensor& grad_recv, const Tensor& grad_weights,
    const DispatchGradBuffers& buffers) {
  State& s = *s_;
  std::optional<Error> bad = validated([&] {
    check_handle(handle, &s);
    check_input("grad_recv", grad_recv, {s.c.receive_capacity, s.c.hidden}, s.c.dtype,
                context().device());
    if (grad_weights.defined()) {
      check_input("grad_weights", grad_weights, {s.c.receive_capacity}, DType::F32,
                  context().device());
    }
    const int64_t T = handle.routing->T;
    if (buffers.tokens.defined()) {
      check_caller_buffer("tokens", buffers.tokens, {T, s.c.hidden}, s.c.dtype, context().device(),
                          {{"grad_recv", grad_recv},
                           {"grad_weights", grad_weights},
                           {"topk_weights", buffers.topk_weights}});
    }
    if (buffers.topk_weights.defined()) {
      check_buffer_written("topk_weights", buffers.topk_weights, grad_weights.defined(),
                           "no grad_weights were given");
      check_caller_buffer("topk_weights", buffers.topk_weights, {T, s.c.topk}, DType::F32,
                          context().device(),
                          {{"grad_recv", grad_recv}, {"grad_weights", grad_weights}});
    }
  });
  if (!begin_call(s, kDispatchBackward, bad)) refuse_in_band(s, kDispatchBackward, *bad);
  const EpRouting& rt = *handle.routing;
  if (s.gpu) {
    detail::ep_reduce(context(), device_args(s), rt.dev, grad_recv, grad_weights);
  } else {
    reduce_and_return(s, rt, grad_recv,
                      grad_weights.defined() ? grad_weights.data_as<float>() : nullptr);
  }
  stores_done(s, rt);
  DispatchGrads g;
  g.tokens = given_or_new(buffers.tokens, {rt.T, s.c.hidden}, s.c.dtype, context());  // [T, H]
  if (grad_weights.defined()) {
    g.topk_weights =
        given_or_new(buffers.topk_weights, {rt.T, s.c.topk}, DType::F32, context());  // [T, k]
  }
  if (s.gpu) {
    detail::ep_sum(context(), device_args(s), rt.dev, rt.T, g.tokens, g.topk_weights);
  } else {
    sum_returned(s, rt, g.tokens);
    if (grad_weights.defined()) gather_returned_weights(s, rt, g.topk_weights);
  }
  return g;
}

}  // namespace moekit
