
#ifndef LOADS
#define LOADS 4
#endif
extern "C" __global__ void beamflow_modulus_NAME(
    float2* __restrict__ psi, const DATA* __restrict__ frames,
    const long long* __restrict__ rows,
    const float* __restrict__ mask, const float eps, const float scale,
    double* __restrict__ loss, const int b, const int M)
{
    const int T = gridDim.x * blockDim.x;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int mm = M * M;
    // No early return past the frame: every lane of a warp takes part in its shuffles.
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long r = rows ? rows[j] : (long long)j;
        const long long base = (long long)j * mm;
        float s = 0.0f;
        // LOADS pixels at a time, t, t + T, …: all their loads, then all their stores.
        for (int p0 = t; p0 < mm; p0 += LOADS * T) {
            float2 v[LOADS];
            float amp[LOADS], w[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; ++u) {
                const int p = p0 + u * T;
                if (p < mm) {
                    v[u] = psi[base + p];
                    amp[u] = AMPLITUDE(frames[r * mm + p]);
                    w[u] = mask[p];
                }
            }
#pragma unroll
            for (int u = 0; u < LOADS; ++u) {
                const int p = p0 + u * T;
                if (p < mm) {
                    const float a = sqrtf(v[u].x * v[u].x + v[u].y * v[u].y);
                    const float d = (amp[u] - a) * w[u];
                    const float f = d / (a + eps) * scale;
                    psi[base + p] = make_float2(v[u].x * f, v[u].y * f);
                    s += d * d;
                }
            }
        }
        const double sum = beamflow_warp_sum(s);
        if (BEAMFLOW_WARP_LEADER) atomicAdd(loss + j, sum);
    }
}
