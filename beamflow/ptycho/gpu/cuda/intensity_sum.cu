
extern "C" __global__ void beamflow_intensity_sum(
    const float2* __restrict__ a, float* __restrict__ out, const int b, const long long mm,
    const int per)
{
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= mm) return;
    const int j0 = blockIdx.y * per;
    const int j1 = j0 + per < b ? j0 + per : b;
    float s = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const float2 v = a[j * mm + p];
        s += v.x * v.x + v.y * v.y;
    }
    atomicAdd(out + p, s);
}
