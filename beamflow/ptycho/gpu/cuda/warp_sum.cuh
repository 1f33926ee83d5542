
#ifndef BEAMFLOW_WARP_SUM
#define BEAMFLOW_WARP_SUM
#ifndef BEAMFLOW_ONE_THREAD
__device__ __forceinline__ double beamflow_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float beamflow_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
#define BEAMFLOW_WARP_LEADER ((threadIdx.x & 31) == 0)
// The block's largest v into *out, by its first thread (every thread of the block calls it).
__device__ __forceinline__ void beamflow_block_max(float v, float* out)
{
    __shared__ float warps[32];
    v = beamflow_warp_max(v);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x + 31) / 32; ++w) v = fmaxf(v, warps[w]);
        *out = v;
    }
}
#else
static inline double beamflow_warp_sum(double v) { return v; }
static inline float beamflow_warp_max(float v) { return v; }
#define BEAMFLOW_WARP_LEADER 1
// Threads run one after another, the block's first one first.
static inline void beamflow_block_max(float v, float* out)
{
    *out = threadIdx.x == 0 ? v : fmaxf(*out, v);
}
#endif
#endif
