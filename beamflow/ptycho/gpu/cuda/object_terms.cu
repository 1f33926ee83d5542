
extern "C" __global__ void beamflow_object_terms(
    const float2* __restrict__ pd, const long long pd_stride,
    const float2* __restrict__ chi, const float* __restrict__ inten,
    const long long* __restrict__ flat, float* __restrict__ acc, float* __restrict__ most,
    const int b, const int K, const int M, const long long W, const long long HW,
    const int exact)
{
    const int mm = M * M;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    // No early return past the window when the maximum is taken: every thread of a block
    // takes part in its reduction (one past the window adds nothing).
    if (p >= mm && !most) return;
    const int r = p / M;
    const long long off = r * W + (p - r * M);
    float largest = 0.0f;
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        if (p >= mm) continue;
        const long long jl = j;
        float re = 0.0f, im = 0.0f, den = 0.0f;
        for (int k = 0; k < K; ++k) {
            const float2 P = pd[jl * pd_stride + k * mm + p];
            const float2 X = chi[(jl * K + k) * mm + p];
            re += P.x * X.x + P.y * X.y;   /* conj(P)·X */
            im += P.x * X.y - P.y * X.x;
            if (exact) den += P.x * P.x + P.y * P.y;
        }
        if (!exact) den = inten[p];
        const long long o = flat[j] + off;
        atomicAdd(acc + 2 * o, re);
        atomicAdd(acc + 2 * o + 1, im);
        largest = fmaxf(largest, atomicAdd(acc + 2 * HW + o, den) + den);
    }
    if (most) beamflow_block_max(largest, most + (long long)blockIdx.y * gridDim.x + blockIdx.x);
}
