
extern "C" __global__ void beamflow_exit_wave(
    const float2* __restrict__ obj, const long long* __restrict__ flat,
    const float2* __restrict__ pd, const long long pd_stride,
    float2* __restrict__ oj, float2* __restrict__ psi,
    const int b, const int K, const int M, const long long W)
{
    const int mm = M * M;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= mm) return;
    const int r = p / M;
    const long long off = r * W + (p - r * M);
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        const float2 O = obj[flat[j] + off];
        oj[jl * mm + p] = O;
        for (int k = 0; k < K; ++k) {
            const float2 P = pd[jl * pd_stride + k * mm + p];
            psi[(jl * K + k) * mm + p] = make_float2(P.x * O.x - P.y * O.y,
                                                     P.x * O.y + P.y * O.x);
        }
    }
}
