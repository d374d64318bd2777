// strata's CUDA kernels, compiled at start by NVRTC (see kernels.go).
//
// Batch invariance: every output element is reduced in an order fixed by the
// model's dimensions alone. A kernel's grid covers outputs (and rows), never
// a split of one reduction; a warp's partial sums are combined by the same
// shuffle tree whatever the batch, and lane 0's result is the one used.
// Products accumulate with explicit fmaf, so that no contraction choice of
// the compiler can differ between the kernels for one row and for many.

// No headers: NVRTC before 12.8 has no built-in cuda_fp16.h, so halves are
// raw 16-bit values converted with PTX's cvt (round to nearest even).
typedef unsigned short half_t;

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

#define WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0); // every lane takes lane 0's order
}

// Embedding gather: x[t] = table[tok[t]] * (scale > 0 ? scale : 1).
// One block per token. Q8_0 rows are blocks of {half d; int8 q[32]}.
extern "C" __global__ void embed_f32(const int* tok, const float* table, float* x, int E, float scale) {
    const int t = blockIdx.x;
    const float* row = table + (long long)tok[t] * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = row[i];
        x[(long long)t * E + i] = scale > 0.f ? v * scale : v;
    }
}

extern "C" __global__ void embed_f16(const int* tok, const half_t* table, float* x, int E, float scale) {
    const int t = blockIdx.x;
    const half_t* row = table + (long long)tok[t] * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = h2f(row[i]);
        x[(long long)t * E + i] = scale > 0.f ? v * scale : v;
    }
}

extern "C" __global__ void embed_q8_0(const int* tok, const unsigned char* table, float* x, int E, float scale) {
    const int t = blockIdx.x;
    const int nb = E / 32;
    const unsigned char* row = table + (long long)tok[t] * nb * 34;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        const unsigned char* b = row + (i / 32) * 34;
        float d = h2f(*(const half_t*)b);
        float v = d * (float)(signed char)b[2 + i % 32];
        x[(long long)t * E + i] = scale > 0.f ? v * scale : v;
    }
}

// RMSNorm of row src[r] (or src[rows[r]] when rows is not null) into
// dst[r]: squares summed in double, each thread a fixed stride, then a
// fixed tree over the block's threads (blockDim.x a power of two <= 1024).
extern "C" __global__ void rms_norm(const float* src, const int* rows, const float* w, float* dst, int E, float eps) {
    __shared__ double part[1024];
    const int r = blockIdx.x;
    const float* x = src + (long long)(rows ? rows[r] : r) * E;
    double s = 0;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = x[i];
        s += (double)(v * v);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    const double mean = part[0] / E;
    const float scale = 1.0f / (float)sqrt((double)(float)(mean + (double)eps));
    float* y = dst + (long long)r * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) y[i] = (x[i] * scale) * w[i];
}

// RoPE: rotates the first dims dimensions of each of nq query heads (rows
// qstride floats apart) and nk key heads (kstride) of token t, head width
// hd, by the angles cs[t*dims + 2i], [2i+1] (cosine, sine of pair i),
// computed on the host. neox pairs i with i+dims/2, else 2i with 2i+1.
extern "C" __global__ void rope(float* q, float* k, const float* cs, int nq, int nk, int hd, int dims, int qstride, int kstride, int neox) {
    const int t = blockIdx.x;
    const int pairs = dims / 2;
    for (int j = threadIdx.x; j < (nq + nk) * pairs; j += blockDim.x) {
        const int h = j / pairs, i = j % pairs;
        float* v = h < nq ? q + (long long)t * qstride + h * hd : k + (long long)t * kstride + (h - nq) * hd;
        const float c = cs[t * dims + 2 * i], s = cs[t * dims + 2 * i + 1];
        const int a = neox ? i : 2 * i, b = neox ? i + pairs : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

// KV store: token t's keys and values (kvh heads of hd) go to the f16 pool
// of one layer at its position's place through its block table, in 64-bit
// offsets (a layer's pool may pass 2^31 values): head h of position p is
// at ((table[p/bs]*kvh + h)*bs + p%bs)*hd, as attend reads it and as the
// CPU pool lays it out (KVLayout.Slot).
extern "C" __global__ void kv_store(const float* k, const float* v, half_t* K, half_t* V, const int* tables, const int* tbl, const int* pos, int kvh, int hd, int bs) {
    const int t = blockIdx.x;
    const int p = pos[t];
    const long long base = ((long long)tables[tbl[t] + p / bs] * kvh * bs + p % bs) * hd;
    for (int j = threadIdx.x; j < kvh * hd; j += blockDim.x) {
        const int h = j / hd, d = j % hd;
        const long long o = base + (long long)h * bs * hd + d;
        K[o] = f2h(k[(long long)t * kvh * hd + j]);
        V[o] = f2h(v[(long long)t * kvh * hd + j]);
    }
}

// Paged attention, decode and prefill alike: one block of nw warps per
// (token, head) reads keys 0..pos[t] of the token's block table in chunks
// of 32 in key order; chunk c goes to warp c % nw, which keeps an online
// softmax over its chunks. In a chunk lane l scores key j0+l (the whole dot
// product, in dimension order) and copies that key's values to the warp's
// shared rows, so that the warp's global loads for a chunk are all issued
// at once; the chunk's maximum and sum of weights come from the fixed
// shuffle tree, and each lane adds the chunk's values in key order to its
// dimensions (l, l+32, ...; hd <= 256). Then the warps' (max, sum,
// accumulator) are merged in warp order. nw = blockDim.x/32 depends only on
// hd (the host's attendWarps), and which warp takes which chunk only on the
// position: the same arithmetic in any batch and any chunking of a prompt.
// Dynamic shared memory: ATT_FIXED bytes + nw*32*hd halves.
#define ATT_WARPS_MAX 8
#define ATT_FIXED ((256 + 2 * ATT_WARPS_MAX + ATT_WARPS_MAX * 256) * 4)
extern "C" __global__ void attend(const float* q, const half_t* K, const half_t* V, const int* tables,
                                  const int* tbl, const int* pos, float* out, int H, int kvh, int hd, int bs, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* qs = (float*)smem;             // [256] the query
    float* mw = qs + 256;                 // [ATT_WARPS_MAX] each warp's maximum
    float* lw = mw + ATT_WARPS_MAX;       // [ATT_WARPS_MAX] each warp's sum of weights
    float* aw = lw + ATT_WARPS_MAX;       // [ATT_WARPS_MAX][hd] each warp's accumulator
    const int nw = blockDim.x / WARP, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    half_t* vs = (half_t*)(smem + ATT_FIXED) + w * WARP * hd; // [32][hd] this warp's chunk of values
    const int t = blockIdx.x, h = blockIdx.y;
    const int kh = h / (H / kvh);
    const float* qt = q + ((long long)t * H + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qt[d];
    __syncthreads();
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, l = 0.f;
    const int* table = tables + tbl[t];
    const int p = pos[t];
    half_t* vrow = vs + lane * hd;
    for (int j0 = w * WARP; j0 <= p; j0 += nw * WARP) {
        const int j = j0 + lane;
        const bool valid = j <= p;
        float s = neg_inf;
        if (valid) {
            const long long off = (((long long)table[j / bs] * kvh + kh) * bs + j % bs) * hd;
            const half_t* k = K + off;
            const half_t* v = V + off;
            float dot = 0.f;
            if (hd % 8 == 0) {
#pragma unroll 4
                for (int d = 0; d < hd; d += 8) *(uint4*)(vrow + d) = *(const uint4*)(v + d);
#pragma unroll 4
                for (int d = 0; d < hd; d += 8) {
                    const uint4 kq = *(const uint4*)(k + d);
                    const unsigned ku[4] = {kq.x, kq.y, kq.z, kq.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        dot = fmaf(qs[d + 2 * i], h2f((half_t)(ku[i] & 0xffffu)), dot);
                        dot = fmaf(qs[d + 2 * i + 1], h2f((half_t)(ku[i] >> 16)), dot);
                    }
                }
            } else {
                for (int d = 0; d < hd; d++) vrow[d] = v[d];
                for (int d = 0; d < hd; d++) dot = fmaf(qs[d], h2f(k[d]), dot);
            }
            s = dot * scale;
        }
        __syncwarp();
        float cm = s;
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
        const float mn = fmaxf(m, cm);
        const float ms = __expf(m - mn);
        const float pj = valid ? __expf(s - mn) : 0.f;
        l = l * ms + warp_sum(pj);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] *= ms;
        const int n = min(WARP, p - j0 + 1);
        for (int jj = 0; jj < n; jj++) {
            const float wt = __shfl_sync(0xffffffffu, pj, jj);
            const half_t* vr = vs + jj * hd;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int d = lane + i * WARP;
                if (d < hd) acc[i] = fmaf(wt, h2f(vr[d]), acc[i]);
            }
        }
        m = mn;
        __syncwarp(); // the next chunk overwrites vs
    }
    if (lane == 0) {
        mw[w] = m;
        lw[w] = l;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int d = lane + i * WARP;
        if (d < hd) aw[w * hd + d] = acc[i];
    }
    __syncthreads();
    // Warp 0 always holds chunk 0, so M is finite; a warp without chunks
    // has m = -inf and weighs exp(-inf) = 0.
    float M = mw[0];
    for (int u = 1; u < nw; u++) M = fmaxf(M, mw[u]);
    float L = 0.f;
    for (int u = 0; u < nw; u++) L = fmaf(lw[u], __expf(mw[u] - M), L);
    float* o = out + ((long long)t * H + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int u = 0; u < nw; u++) a = fmaf(aw[u * hd + d], __expf(mw[u] - M), a);
        o[d] = a / L;
    }
}

// SwiGLU: gate[i] = silu(gate[i]) * up[i].
extern "C" __global__ void swiglu(float* gate, const float* up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = g / (1.f + expf(-g)) * up[i];
    }
}

// Activation conversions for the weight types' dot products.
extern "C" __global__ void to_f16(const float* x, half_t* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h(x[i]);
}

// quant_q8_0: one warp per 32-value block of x (K values a row, K%32 == 0),
// as the CPU backend quantizes activations (ggml's AVX quantize_row_q8_0,
// model/ggml QuantizeActivationRow): d = amax/127 kept as f16, multiplier
// 127/amax (not 1/d), q = x*multiplier rounded half to even, saturated.
extern "C" __global__ void quant_q8_0(const float* x, signed char* q, float* d, int nblocks) {
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (b >= nblocks) return;
    const float v = x[(long long)b * 32 + lane];
    float a = fabsf(v);
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float dd = __fdiv_rn(a, 127.f);
    const float id = a != 0.f ? __fdiv_rn(127.f, a) : 0.f;
    const int qi = __float2int_rn(__fmul_rn(v, id));
    q[(long long)b * 32 + lane] = (signed char)max(-128, min(127, qi));
    if (lane == 0) d[b] = h2f(f2h(dd));
}

// Matrix products out[r*N + o] = dot(W row o, x row r) for r < rows (or
// out[r*N + o] += that dot with accumulate, the residual add fused). One
// warp per output o and up to RB activation rows; lane l takes the same
// elements of the reduction whatever the rows, so each output's order
// depends only on K. Grid: (ceil(N / warps per block), ceil(rows / RB)).
template <int RB>
__device__ void mm_f32_t(const float* W, const float* x, float* out, int N, int K, int rows, int accumulate) {
    const int o = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP, r0 = blockIdx.y * RB;
    if (o >= N) return;
    float acc[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) acc[r] = 0.f;
    const float* w = W + (long long)o * K;
#pragma unroll 4
    for (int k = lane; k < K; k += WARP) {
        const float wv = w[k];
#pragma unroll
        for (int r = 0; r < RB; r++)
            if (r0 + r < rows) acc[r] = fmaf(wv, x[(long long)(r0 + r) * K + k], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < rows) {
            float* y = out + (long long)(r0 + r) * N + o;
            *y = accumulate ? *y + s : s;
        }
    }
}

// F16 weights against f16 activations (converted by to_f16, as ggml does
// for f16 weights): products in f32, 8 halves a lane a step.
template <int RB>
__device__ void mm_f16_t(const half_t* W, const half_t* x, float* out, int N, int K, int rows, int accumulate) {
    const int o = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP, r0 = blockIdx.y * RB;
    if (o >= N) return;
    float acc[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) acc[r] = 0.f;
    const half_t* w = W + (long long)o * K;
    const int K8 = K / 8 * 8;
#pragma unroll 4
    for (int k = lane * 8; k < K8; k += WARP * 8) {
        const uint4 wq = *(const uint4*)(w + k);
        const unsigned wu[4] = {wq.x, wq.y, wq.z, wq.w};
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wf[2 * i] = h2f((half_t)(wu[i] & 0xffffu));
            wf[2 * i + 1] = h2f((half_t)(wu[i] >> 16));
        }
#pragma unroll
        for (int r = 0; r < RB; r++) {
            if (r0 + r < rows) {
                const uint4 xq = *(const uint4*)(x + (long long)(r0 + r) * K + k);
                const unsigned xu[4] = {xq.x, xq.y, xq.z, xq.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc[r] = fmaf(wf[2 * i], h2f((half_t)(xu[i] & 0xffffu)), acc[r]);
                    acc[r] = fmaf(wf[2 * i + 1], h2f((half_t)(xu[i] >> 16)), acc[r]);
                }
            }
        }
    }
    for (int k = K8 + lane; k < K; k += WARP) {
        const float wv = h2f(w[k]);
#pragma unroll
        for (int r = 0; r < RB; r++)
            if (r0 + r < rows) acc[r] = fmaf(wv, h2f(x[(long long)(r0 + r) * K + k]), acc[r]);
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < rows) {
            float* y = out + (long long)(r0 + r) * N + o;
            *y = accumulate ? *y + s : s;
        }
    }
}

// Q8_0 weights ({half d; int8 q[32]} blocks, 34 bytes) against Q8_0
// activations (quant_q8_0: int8 values, one float scale a block): each
// block's products summed exactly in integers, then one FMA a block into
// the lane's accumulator; lane l takes blocks l, l+32, ….
__device__ __forceinline__ int load_q4(const unsigned char* p) { // 2-byte aligned
    const unsigned short* s = (const unsigned short*)p;
    return (int)((unsigned)s[0] | ((unsigned)s[1] << 16));
}

template <int RB>
__device__ void mm_q8_0_t(const unsigned char* W, const signed char* xq, const float* xd, float* out, int N, int K, int rows, int accumulate) {
    const int o = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP, r0 = blockIdx.y * RB;
    if (o >= N) return;
    const int nb = K / 32;
    float acc[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) acc[r] = 0.f;
    const unsigned char* w = W + (long long)o * nb * 34;
#pragma unroll 4
    for (int b = lane; b < nb; b += WARP) {
        const unsigned char* blk = w + b * 34;
        const float dw = h2f(*(const half_t*)blk);
        int wq[8];
#pragma unroll
        for (int i = 0; i < 8; i++) wq[i] = load_q4(blk + 2 + 4 * i);
#pragma unroll
        for (int r = 0; r < RB; r++) {
            if (r0 + r < rows) {
                const int* xi = (const int*)(xq + (long long)(r0 + r) * K + b * 32);
                int s = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) s = __dp4a(wq[i], xi[i], s);
                acc[r] = fmaf(dw * xd[(long long)(r0 + r) * nb + b], (float)s, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < rows) {
            float* y = out + (long long)(r0 + r) * N + o;
            *y = accumulate ? *y + s : s;
        }
    }
}

extern "C" __global__ void mm_f32_1(const float* W, const float* x, float* out, int N, int K, int rows, int accumulate) { mm_f32_t<1>(W, x, out, N, K, rows, accumulate); }
extern "C" __global__ void mm_f32_8(const float* W, const float* x, float* out, int N, int K, int rows, int accumulate) { mm_f32_t<8>(W, x, out, N, K, rows, accumulate); }
extern "C" __global__ void mm_f16_1(const half_t* W, const half_t* x, float* out, int N, int K, int rows, int accumulate) { mm_f16_t<1>(W, x, out, N, K, rows, accumulate); }
extern "C" __global__ void mm_f16_8(const half_t* W, const half_t* x, float* out, int N, int K, int rows, int accumulate) { mm_f16_t<8>(W, x, out, N, K, rows, accumulate); }
extern "C" __global__ void mm_q8_0_1(const unsigned char* W, const signed char* xq, const float* xd, float* out, int N, int K, int rows, int accumulate) { mm_q8_0_t<1>(W, xq, xd, out, N, K, rows, accumulate); }
extern "C" __global__ void mm_q8_0_8(const unsigned char* W, const signed char* xq, const float* xd, float* out, int N, int K, int rows, int accumulate) { mm_q8_0_t<8>(W, xq, xd, out, N, K, rows, accumulate); }
