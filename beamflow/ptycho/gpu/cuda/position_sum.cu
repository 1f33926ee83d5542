
extern "C" __global__ void beamflow_position_sum(
    const float2* __restrict__ e, const float2* __restrict__ a, float* __restrict__ out,
    const int b, const int K, const int M, const int per)
{
    const int mm = M * M;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= K * mm) return;
    const int p = q % mm;
    const int y = p / M;
    const int x = p - y * M;
    const int j0 = blockIdx.y * per;
    const int j1 = j0 + per < b ? j0 + per : b;
    float re = 0.0f, im = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const long long jl = j;
        const float2 v = a[jl * K * mm + q];
        if (e) {
            const float2 r = beamflow_ramp(e, jl, M, y, x);
            re += r.x * v.x - r.y * v.y;
            im += r.x * v.y + r.y * v.x;
        } else {
            re += v.x;
            im += v.y;
        }
    }
    atomicAdd(out + 2 * q, re);
    atomicAdd(out + 2 * q + 1, im);
}
