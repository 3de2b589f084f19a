// The NCCL side of the symmetric-memory engine (src/ep/ep_nccl.h; moekit/ep/nccl.h): NCCL
// 2.28's host API for communicators, memory and windows, and two kernels of its device API
// (nccl_device.h) — the LSA pointers of a window, resolved once per block (2.28 has no host-side
// getter; 2.29 adds ncclGetLsaDevicePointer), and the LSA barrier. The device API is header-only
// inline code reading NCCL's device structures, so the NCCL loaded at run time must be the one
// compiled against (NCCL's rule before 2.31): checked when a communicator is made.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/check.h"
#include "backends/cuda/resources.h"
#include "ep/ep_device.h"
#include "ep/ep_nccl.h"
#include "moekit/core/error.h"

namespace moekit::detail {

struct NcclRank {
  NcclRank(ncclComm_t c, Context x, int r, int w) : comm(c), ctx(std::move(x)), rank(r), world(w) {}
  ~NcclRank();
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;

  ncclComm_t comm = nullptr;  // owned
  Context ctx;
  int rank = 0, world = 1;
  ncclDevComm dev{};        // the LSA barrier's resources (valid when dev_made)
  bool dev_made = false;
  Tensor stage;             // u8 [(W + 1)·kGatherSlot] on ctx: nccl_all_gather's send + receive
};

namespace {

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, ncclComm_t comm, const char* file,
                             int line) {
  const char* src = std::strstr(file, "src/");  // a path relative to the repository
  if (src) file = src;
  std::string last;
  if (const char* l = ncclGetLastError(comm); l != nullptr && *l != '\0') last = str(": ", l);
  throw_error(ErrorKind::Communication,
              str(call, " failed: ", ncclGetErrorString(r), last, " [", file, ":", line, "]"));
}

void check_nccl(ncclResult_t r, const char* call, ncclComm_t comm, const char* file, int line) {
  if (r != ncclSuccess) throw_nccl(r, call, comm, file, line);
}

#define MOEKIT_NCCL_CHECK(call, comm) check_nccl((call), #call, (comm), __FILE__, __LINE__)

// Before the first NCCL communicator of the process: the NCCL of this process must be the one
// the device code was compiled against. NCCL's environment (NCCL_NVLS_ENABLE and the rest) is the
// program's: the library sets none (moekit's tools keep NVLink multicast off, tools/lib/nccl-env.sh).
void prepare_nccl() {
  int v = 0;
  MOEKIT_NCCL_CHECK(ncclGetVersion(&v), nullptr);
  if (v != NCCL_VERSION_CODE) {
    throw_error(ErrorKind::Unsupported,
                str("the nccl-symmetric engine was compiled against NCCL ", NCCL_VERSION_CODE,
                    " and this process loaded NCCL ", v,
                    ": NCCL's device API (ncclGetLsaPointer, the LSA barrier) needs the same "
                    "version at run time (before NCCL 2.31)"));
  }
}

cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

constexpr int kBarrierThreads = 32;  // one CTA; its threads signal the (≤ 7) peers
constexpr size_t kGatherSlot = 1024;  // bytes per rank and round of nccl_all_gather
constexpr size_t kGatherHeader = 8;   // u64: the rank's bytes left at the round's start

__global__ void lsa_peer_bases(ncclWindow_t window, int ranks, void** out) {
  const int peer = static_cast<int>(threadIdx.x);
  if (peer < ranks) out[peer] = ncclGetLsaPointer(window, 0, peer);
}

__global__ void lsa_barrier(ncclDevComm dev) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dev, ncclTeamTagLsa(), 0u);
  bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
}

// One symmetric block: ncclMemAlloc + a symmetric window, deregistered and freed with the
// block's tensor (whose storage holds this allocator, which holds the rank and so its comm).
class WindowBlock final : public Allocator {
 public:
  explicit WindowBlock(std::shared_ptr<NcclRank> r) : r_(std::move(r)) {}
  Device device() const override { return r_->ctx.device(); }
  ncclWindow_t window() const { return window_; }

 protected:
  void* do_allocate(size_t bytes) override {
    cuda::DeviceGuard guard(r_->ctx.device().index);
    // Windows start on NCCL_WIN_REQUIRED_ALIGNMENT; the size is the same on every rank.
    const size_t size = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT *
                        NCCL_WIN_REQUIRED_ALIGNMENT;
    void* p = nullptr;
    MOEKIT_NCCL_CHECK(ncclMemAlloc(&p, size), r_->comm);
    ncclWindow_t w = nullptr;
    const ncclResult_t e = ncclCommWindowRegister(r_->comm, p, size, &w, NCCL_WIN_COLL_SYMMETRIC);
    if (e != ncclSuccess || w == nullptr) {
      (void)ncclMemFree(p);
      if (e != ncclSuccess) {
        throw_nccl(e, "ncclCommWindowRegister(comm, p, size, &w, NCCL_WIN_COLL_SYMMETRIC)",
                   r_->comm, __FILE__, __LINE__);
      }
      // NCCL returns success and no window when the communicator has no symmetric support.
      throw_error(ErrorKind::Unsupported,
                  "ncclCommWindowRegister gave no symmetric window: this NCCL communicator has no "
                  "symmetric-memory support (it needs cuMem memory and P2P access between every "
                  "pair of GPUs: NCCL_CUMEM_ENABLE, peer access)");
    }
    window_ = w;
    return p;
  }

  void do_deallocate(void* p, size_t) noexcept override {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    (void)cudaSetDevice(r_->ctx.device().index);
    // The stream's queued work may still use the block (nothing to wait for during a capture:
    // freeing a block a capture uses is the caller's error).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_of(r_->ctx), &capture) == cudaSuccess &&
        capture == cudaStreamCaptureStatusNone) {
      (void)cudaStreamSynchronize(stream_of(r_->ctx));
    }
    (void)ncclCommWindowDeregister(r_->comm, window_);  // local in NCCL 2.28
    (void)ncclMemFree(p);
    if (previous >= 0) (void)cudaSetDevice(previous);
  }

 private:
  std::shared_ptr<NcclRank> r_;
  ncclWindow_t window_ = nullptr;
};

}  // namespace

NcclRank::~NcclRank() {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  (void)cudaSetDevice(ctx.device().index);
  stage = Tensor();
  if (dev_made) (void)ncclDevCommDestroy(comm, &dev);
  (void)ncclCommDestroy(comm);  // local; the process's last comm of a clique frees the shared state
  if (previous >= 0) (void)cudaSetDevice(previous);
}

bool nccl_built() { return true; }

std::vector<std::shared_ptr<NcclRank>> nccl_init_all(const std::vector<Context>& contexts) {
  prepare_nccl();
  const int n = static_cast<int>(contexts.size());
  std::vector<int> devices;
  for (const Context& c : contexts) devices.push_back(c.device().index);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  {
    cuda::DeviceGuard guard(devices[0]);
    MOEKIT_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()), nullptr);
  }
  std::vector<std::shared_ptr<NcclRank>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::make_shared<NcclRank>(comms[static_cast<size_t>(r)],
                                             contexts[static_cast<size_t>(r)], r, n));
  }
  return out;
}

std::shared_ptr<NcclRank> nccl_split(void* comm, const Context& ctx) {
  prepare_nccl();
  const auto parent = static_cast<ncclComm_t>(comm);
  int rank = 0, world = 0, device = -1;
  MOEKIT_NCCL_CHECK(ncclCommUserRank(parent, &rank), parent);
  MOEKIT_NCCL_CHECK(ncclCommCount(parent, &world), parent);
  MOEKIT_NCCL_CHECK(ncclCommCuDevice(parent, &device), parent);
  if (device != ctx.device().index) {
    throw_invalid("ctx", str("a context on the communicator's GPU ", device),
                  ctx.device().to_string());
  }
  if (world > kEpMaxRanks) {  // every rank sees the same count: all refuse alike
    throw_invalid("nccl_comm", str("1 to ", kEpMaxRanks, " ranks (one NVLink domain)"),
                  std::to_string(world));
  }
  cuda::DeviceGuard guard(device);
  ncclComm_t own = nullptr;
  MOEKIT_NCCL_CHECK(ncclCommSplit(parent, 0, rank, &own, nullptr), parent);
  return std::make_shared<NcclRank>(own, ctx, rank, world);
}

void nccl_init_rank(NcclRank& r) {
  cuda::DeviceGuard guard(r.ctx.device().index);
  ncclDevCommRequirements req;
  std::memset(&req, 0, sizeof req);  // NCCL 2.28 has no initializer for it
  req.lsaBarrierCount = 1;
  MOEKIT_NCCL_CHECK(ncclDevCommCreate(r.comm, &req, &r.dev), r.comm);
  r.dev_made = true;
  if (r.dev.lsaSize != r.world) {
    throw_error(ErrorKind::Unsupported,
                str("nccl-symmetric: ", r.world, " ranks but an LSA team of ", r.dev.lsaSize,
                    " (every rank must load and store every other rank's memory: one node, "
                    "P2P between every pair of GPUs)"));
  }
}

int nccl_rank(const NcclRank& r) { return r.rank; }
int nccl_world_size(const NcclRank& r) { return r.world; }
const Context& nccl_context(const NcclRank& r) { return r.ctx; }

SymmetricMemory nccl_allocate(const std::shared_ptr<NcclRank>& r, size_t bytes) {
  SymmetricMemory m;
  auto block = std::make_shared<WindowBlock>(r);
  m.local = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, r->ctx.with_allocator(block));
  if (bytes == 0) {  // nothing allocated (on every rank alike): no window, no bases
    m.peers.assign(static_cast<size_t>(r->world), nullptr);
    return m;
  }
  cuda::DeviceGuard guard(r->ctx.device().index);
  const cudaStream_t s = stream_of(r->ctx);
  const Tensor bases = Tensor::empty({r->world}, DType::I64, r->ctx);
  lsa_peer_bases<<<1, kEpMaxRanks, 0, s>>>(block->window(), r->world, bases.data_as<void*>());
  MOEKIT_CUDA_CHECK_LAUNCH();
  m.peers.resize(static_cast<size_t>(r->world));
  MOEKIT_CUDA_CHECK(cudaMemcpyAsync(m.peers.data(), bases.data(), m.peers.size() * sizeof(void*),
                                    cudaMemcpyDeviceToHost, s));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  // This rank's block through its own address (the window's LSA mapping is a second view of it).
  m.peers[static_cast<size_t>(r->rank)] = m.local.data();
  return m;
}

void nccl_barrier(NcclRank& r) {
  cuda::DeviceGuard guard(r.ctx.device().index);
  lsa_barrier<<<1, kBarrierThreads, 0, stream_of(r.ctx)>>>(r.dev);
  MOEKIT_CUDA_CHECK_LAUNCH();
}

std::vector<std::string> nccl_all_gather(NcclRank& r, std::string_view bytes) {
  cuda::DeviceGuard guard(r.ctx.device().index);
  const cudaStream_t s = stream_of(r.ctx);
  if (cuda::stream_capturing(s)) {
    throw_error(ErrorKind::Unsupported,
                "nccl_communicator: all_gather (host metadata, which every ExpertParallel call "
                "agrees on) synchronises the stream, so it cannot run while a CUDA graph is "
                "captured (NcclRanks' host all_gather can)");
  }
  const auto W = static_cast<size_t>(r.world);
  if (!r.stage.defined()) {  // once, at the first collective (bind time)
    r.stage = Tensor::empty({static_cast<int64_t>((W + 1) * kGatherSlot)}, DType::U8, r.ctx);
  }
  auto* send_dev = r.stage.data_as<unsigned char>();
  unsigned char* recv_dev = send_dev + kGatherSlot;
  std::vector<unsigned char> send(kGatherSlot), recv(W * kGatherSlot);
  std::vector<std::string> out(W);
  constexpr size_t kCap = kGatherSlot - kGatherHeader;
  // Rounds of one slot per rank: each slot says how many bytes its rank had left, so every rank
  // sees alike whether another round is needed.
  size_t offset = 0;
  while (true) {
    const uint64_t left = bytes.size() - offset;
    const size_t now = static_cast<size_t>(std::min<uint64_t>(left, kCap));
    std::memcpy(send.data(), &left, kGatherHeader);
    if (now > 0) std::memcpy(send.data() + kGatherHeader, bytes.data() + offset, now);
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(send_dev, send.data(), kGatherSlot, cudaMemcpyHostToDevice, s));
    MOEKIT_NCCL_CHECK(ncclAllGather(send_dev, recv_dev, kGatherSlot, ncclUint8, r.comm, s), r.comm);
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(recv.data(), recv_dev, W * kGatherSlot, cudaMemcpyDeviceToHost, s));
    MOEKIT_CUDA_CHECK(cudaStreamSynchronize(s));
    bool more = false;
    for (size_t q = 0; q < W; ++q) {
      uint64_t q_left = 0;
      std::memcpy(&q_left, recv.data() + q * kGatherSlot, kGatherHeader);
      const auto* data = reinterpret_cast<const char*>(recv.data() + q * kGatherSlot + kGatherHeader);
      out[q].append(data, static_cast<size_t>(std::min<uint64_t>(q_left, kCap)));
      more = more || q_left > kCap;
    }
    offset += now;
    if (!more) break;
  }
  return out;
}

}  // namespace moekit::detail
