
#ifndef BEAMFLOW_RAMP
#define BEAMFLOW_RAMP
__device__ __forceinline__ float2 beamflow_ramp(const float2* __restrict__ e, const long long j,
                                                const int M, const int y, const int x)
{
    const float2 ey = e[j * 2 * M + y];
    const float2 ex = e[j * 2 * M + M + x];
    return make_float2(ey.x * ex.x - ey.y * ex.y, ey.x * ex.y + ey.y * ex.x);
}
#endif
