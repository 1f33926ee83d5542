
extern "C" __global__ void beamflow_step_systems(
    const float2* __restrict__ pd, const long long pd_stride,
    const float* __restrict__ acc, const float* __restrict__ top, const float alpha,
    const long long* __restrict__ flat,
    const float2* __restrict__ oj, const float2* __restrict__ sp, const long long sp_stride,
    const float2* __restrict__ chi, double* __restrict__ out,
    const int b, const int K, const int M, const long long W, const long long HW,
    const int upd_obj, const int upd_probe)
{
    const float lift = upd_obj ? alpha * *top : 0.0f;
    const int T = gridDim.x * blockDim.x;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int mm = M * M;
    // No early return for t >= mm: every lane of a warp takes part in its shuffles (a
    // thread past the frame sums nothing).
    for (int j = blockIdx.y; j < b; j += gridDim.y) {
        const long long jl = j;
        float a11 = 0.0f, a12 = 0.0f, a22 = 0.0f, b1 = 0.0f, b2 = 0.0f;
        for (int k = 0; k < K; ++k) {
            const long long q0 = (long long)k * mm;
            for (int p = t; p < mm; p += T) {
                const long long q = q0 + p;
                const float2 X = chi[jl * K * mm + q];
                float2 d0 = make_float2(0.0f, 0.0f), d1 = make_float2(0.0f, 0.0f);
                if (upd_obj) {
                    const int r = p / M;
                    const float2 P = pd[jl * pd_stride + q];
                    const long long o = flat[j] + r * W + (p - r * M);
                    const float2 n = ((const float2*)acc)[o];
                    const float f = 1.0f / (acc[2 * HW + o] + lift);
                    const float2 D = make_float2(n.x * f, n.y * f);
                    d0 = make_float2(P.x * D.x - P.y * D.y, P.x * D.y + P.y * D.x);
                }
                if (upd_probe) {
                    const float2 O = oj[jl * mm + p];
                    const float2 S = sp[jl * sp_stride + q];
                    d1 = make_float2(O.x * S.x - O.y * S.y, O.x * S.y + O.y * S.x);
                }
                a11 += d0.x * d0.x + d0.y * d0.y;
                a12 += d0.x * d1.x + d0.y * d1.y;
                a22 += d1.x * d1.x + d1.y * d1.y;
                b1 += d0.x * X.x + d0.y * X.y;
                b2 += d1.x * X.x + d1.y * X.y;
            }
        }
        const double s11 = beamflow_warp_sum(a11), s12 = beamflow_warp_sum(a12);
        const double s22 = beamflow_warp_sum(a22), s1 = beamflow_warp_sum(b1);
        const double s2 = beamflow_warp_sum(b2);
        if (BEAMFLOW_WARP_LEADER) {
            double* row = out + jl * 5;
            atomicAdd(row, s11);
            atomicAdd(row + 1, s12);
            atomicAdd(row + 2, s22);
            atomicAdd(row + 3, s1);
            atomicAdd(row + 4, s2);
        }
    }
}
