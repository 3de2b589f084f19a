# shellcheck shell=bash
# Sourced by tools/gpu-check and tools/lib/ep2-check: a GPU image without libnccl on the loader's path
# has it in torch's wheel (nvidia-nccl-cu13); put that directory first so the carried programs
# linked against libnccl.so.2 (moekit_ep_bench, moekit_ep_probe) load. NVLink multicast stays off
# (the device notes: a program that uses it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
moekit_nccl_lib=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0] + "/lib")' 2>/dev/null)
if [[ -n $moekit_nccl_lib && -d $moekit_nccl_lib ]]; then
  export LD_LIBRARY_PATH=$moekit_nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
