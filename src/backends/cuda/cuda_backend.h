// Internal: the CUDA backend's entries in the primitive tables (src/primitives/*.cpp).
//
//   "cublas"  grouped_gemm_group_m / grouped_gemm_group_k — the cuBLAS baseline: one cuBLAS call
//             per non-empty group, fp32 compute, reading and writing the caller's tensors in
//             place (no temporary output, no copy). Empty groups launch nothing (group-K writes
//             their exact zeros with cudaMemsetAsync unless accumulating). Many small groups
//             (each GEMM shorter on the GPU than its launch on the host) go as one
//             cublasGemmGroupedBatchedEx call. A bias is added in fp32 before the one rounding:
//             by cublasLtMatmul's BIAS epilogue when all operands are 16-byte aligned, else by
//             broadcasting it into the valid rows of `out` and accumulating onto it
//             (cublasGemmEx, beta = 1) — which of the two rounds once depends on the alignment
//             (measured; see grouped_gemm_cublas.cpp).
//   "cuda"    grouped_bias_grad — moekit's own kernel (bias.cu), deterministic. It reads the
//             counts on the device (host splits are copied there in stream order): no host
//             synchronisation, capturable in a CUDA graph. Invalid device counts make it write
//             nothing and set the context's error word (SPEC §1; Context::check_device_errors).
//
// Splits: the cuBLAS baseline needs the counts on the host. Device splits (counts in a CUDA
// tensor) are copied to the host, which SYNCHRONISES the context's stream, and are then validated
// (negative count or S > T → InvalidArgument naming the values) before any GEMM is queued. So
// with device splits the "cublas" entries are correct but neither free of host synchronisation
// nor capturable in a CUDA graph; the sm90 grouped kernels read counts on the device.
//
// All entries reject (with a reason) contexts whose device is not CUDA; the cuBLAS ones also
// sizes beyond cuBLAS's 32-bit int arguments, the bias gradient more than 8191 groups (its
// per-block table of row offsets lives in shared memory).
#pragma once

#include <string>

#include "backends/contract/args.h"
#include "backends/contract/backend_table.h"

namespace moekit::cuda {

// The entries this backend exports to the primitives' tables, one per primitive (defined
// beside the functions they name; cuBLAS's syncs_host: it reads device counts on the host).
extern const detail::Backend<detail::GroupMArgs> kCublasGroupM;
extern const detail::Backend<detail::GroupKArgs> kCublasGroupK;
extern const detail::Backend<detail::BiasGradArgs> kBiasGrad;

}  // namespace moekit::cuda
