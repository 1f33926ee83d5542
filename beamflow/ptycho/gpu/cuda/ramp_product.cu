
extern "C" __global__ void beamflow_ramp_product(
    const float2* __restrict__ e, const float2* a, const long long a_stride, float2* out,
    const int b, const int K, const int M, const int conj)
{
    const int mm = M * M;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= K * mm) return;
    const int p = q % mm;
    const int y = p / M;
    const int x = p - y * M;
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        float2 r = beamflow_ramp(e, jl, M, y, x);
        if (conj) r.y = -r.y;
        const float2 v = a[jl * a_stride + q];
        out[jl * K * mm + q] = make_float2(r.x * v.x - r.y * v.y, r.x * v.y + r.y * v.x);
    }
}
