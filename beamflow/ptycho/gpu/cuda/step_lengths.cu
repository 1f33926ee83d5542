
extern "C" __global__ void beamflow_step_lengths(
    const double* __restrict__ t, float* __restrict__ out, const int both, const float damping)
{
    if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    const double lam = 1e-6 * (t[0] + t[2]) + 1e-30;
    const double d11 = t[0] + lam, d22 = t[2] + lam;
    double bo, bp;
    if (both) {
        const double det = d11 * d22 - t[1] * t[1];
        bo = (d22 * t[3] - t[1] * t[4]) / det;
        bp = (d11 * t[4] - t[1] * t[3]) / det;
    } else {
        bo = t[3] / d11;
        bp = t[4] / d22;
    }
    out[0] = damping * (float)(bo > 0.0 ? bo : 0.0);
    out[1] = damping * (float)(bp > 0.0 ? bp : 0.0);
}
