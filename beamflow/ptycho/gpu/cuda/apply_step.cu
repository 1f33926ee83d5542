
extern "C" __global__ void beamflow_apply_step(
    float2* __restrict__ obj, float* __restrict__ acc, const float* __restrict__ top,
    const float* __restrict__ step, const float c_den, const float c_max,
    const long long W, const long long HW, const int y0, const int rows, const int x0,
    const int cols)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long o = (long long)(y0 + r) * W + x0 + c;
        float2* num = (float2*)acc + o;
        float* den = acc + 2 * HW + o;
        const float2 n = *num;
        const float d = *den;
        if (n.x == 0.0f && n.y == 0.0f && d == 0.0f) continue;
        const float f = 1.0f / (d * c_den + c_max * *top);
        float2 g = make_float2(n.x * f, n.y * f);
        if (step) g = make_float2(*step * g.x, *step * g.y);
        const float2 v = obj[o];
        obj[o] = make_float2(v.x + g.x, v.y + g.y);
        *num = make_float2(0.0f, 0.0f);
        *den = 0.0f;
    }
}
