/* cuda_warp.cuh — warp-level reductions for CUDA kernels (device code; all 32 lanes take part).
 * Shared by the encoder's and the trainer's kernels. */
#ifndef DFM_COMMON_CUDA_WARP_CUH
#define DFM_COMMON_CUDA_WARP_CUH

/* the sum / maximum of v over the warp, returned to every lane (butterfly: same order on every lane) */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
