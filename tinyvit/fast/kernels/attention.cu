// Multi-head attention over a short sequence (tinyvit.nn.layers.Attention's attend and
// attend_backward, derived there), with the qkv bias, the split into heads, the merge of
// the heads and the 1/sqrt(Dh) scale folded in: one block per (image b, head h), for N
// tokens and a head dimension Dh of at most MAX_HEAD_DIM.
//
// The input is the qkv projection before its bias, (B, N, 3D) with D = NH Dh (q, k and v
// stacked in that order, as Linear(D, 3D) gives them), and that bias (3D): head h's
//     q_i = qkv[b, i, h Dh : (h+1) Dh] + bias[h Dh : (h+1) Dh]
// and k_j, v_j the same D and 2D further along. A thread keeps its row of Dh values in
// registers; the rows it meets (k_j, v_j) are read by its whole warp at once, from one
// address: one load serves 32 threads.

#define MAX_HEAD_DIM 64

// q . (key + key_bias) over the head's Dh values; DH, the registers' length, is at least Dh
template <int DH>
__device__ __forceinline__ T dot(const T* q, const T* key, const T* key_bias, int Dh) {
    T s = 0;
#pragma unroll
    for (int d = 0; d < DH; d++)
        if (d < Dh) s += q[d] * (key[d] + key_bias[d]);
    return s;
}

// The block's image b and head h, and where their values start: the q of token 0 of image
// b (tokens follow 3D apart; k is D further, v 2D), and the bias of the head's q (likewise).
struct Head {
    int b, h, D;
    long stride;  // 3D: from one token's qkv to the next's
    const T* tokens;
    const T* bias;
};

__device__ __forceinline__ Head head(const T* qkv, const T* bias, int N, int NH, int Dh) {
    int b = blockIdx.x / NH, h = blockIdx.x % NH, D = NH * Dh;
    return Head{b, h, D, 3L * D, qkv + (long)b * N * 3 * D + h * Dh, bias + h * Dh};
}

// Where row i of (b, h)'s (N, N) matrices (A, dS) starts
__device__ __forceinline__ long matrix_row(int i, int N) {
    return ((long)blockIdx.x * N + i) * N;
}

// Where token i's values of head h start in an array of merged heads, (B, N, width)
__device__ __forceinline__ long merged(Head x, int i, int N, long width, int Dh) {
    return ((long)x.b * N + i) * width + x.h * Dh;
}

// Forward, a thread per query row i:
//     s_ij = scale q_i . k_j,   A_ij = exp(s_ij - max_j s_ij) / sum_j exp(s_ij - max_j s_ij)
//     ctx_i = sum_j A_ij v_j    written where the heads merge: ctx[b, i, h Dh : (h+1) Dh]
// A (B, NH, N, N) is written when write_A is not 0 (training keeps it for the backward).
template <int DH>
__device__ void forward_rows(Head x, T* ctx, T* A, int write_A, int N, int Dh, T scale) {
    const T *bias_k = x.bias + x.D, *bias_v = x.bias + 2 * x.D;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        T q[DH], acc[DH];
#pragma unroll
        for (int d = 0; d < DH; d++) {
            q[d] = d < Dh ? (x.tokens[i * x.stride + d] + x.bias[d]) * scale : (T)0;
            acc[d] = 0;
        }
        T largest = dot<DH>(q, x.tokens + x.D, bias_k, Dh);
        for (int j = 1; j < N; j++)
            largest = max(largest, dot<DH>(q, x.tokens + j * x.stride + x.D, bias_k, Dh));
        T* a = A + matrix_row(i, N);
        T sum = 0;
        for (int j = 0; j < N; j++) {
            const T* k = x.tokens + j * x.stride + x.D;
            T e = exp(dot<DH>(q, k, bias_k, Dh) - largest);
            sum += e;
            if (write_A) a[j] = e;
#pragma unroll
            for (int d = 0; d < DH; d++)
                if (d < Dh) acc[d] += e * (k[x.D + d] + bias_v[d]);  // v_j follows k_j by D
        }
        T inverse = (T)1 / sum;
        T* c = ctx + merged(x, i, N, x.D, Dh);
#pragma unroll
        for (int d = 0; d < DH; d++)
            if (d < Dh) c[d] = acc[d] * inverse;
        if (write_A)
            for (int j = 0; j < N; j++) a[j] *= inverse;
    }
}

extern "C" __global__ void attention_forward(const T* qkv, const T* bias, T* ctx, T* A,
                                             int write_A, int N, int NH, int Dh, T scale) {
    Head x = head(qkv, bias, N, NH, Dh);
    if (Dh <= 16)
        forward_rows<16>(x, ctx, A, write_A, N, Dh, scale);
    else if (Dh <= 32)
        forward_rows<32>(x, ctx, A, write_A, N, Dh, scale);
    else
        forward_rows<MAX_HEAD_DIM>(x, ctx, A, write_A, N, Dh, scale);
}

// Backward, from dctx (B, N, D), the merged heads' gradient, and the forward's A, into
// dqkv (B, N, 3D), the gradient of the qkv projection's output, in two phases:
// 1. a thread per query row i (dS_ij: the gradient of the unscaled score q_i . k_j):
//        dA_ij = dctx_i . v_j,   dS_ij = scale A_ij (dA_ij - sum_j dA_ij A_ij)
//        dq_i = sum_j dS_ij k_j
//    keeping row i of dS (B, NH, N, N) for the second phase;
// 2. once every thread of the block has written its rows, a thread per key j:
//        dk_j = sum_i dS_ij q_i,   dv_j = sum_i A_ij dctx_i
template <int DH>
__device__ void backward_rows(Head x, const T* A, const T* dctx, T* dS, T* dqkv, int N, int Dh,
                              T scale) {
    const T *bias_k = x.bias + x.D, *bias_v = x.bias + 2 * x.D;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        T dc[DH], dq[DH];
        const T* dctx_i = dctx + merged(x, i, N, x.D, Dh);
#pragma unroll
        for (int d = 0; d < DH; d++) {
            dc[d] = d < Dh ? dctx_i[d] : (T)0;
            dq[d] = 0;
        }
        const T* a = A + matrix_row(i, N);
        T* ds = dS + matrix_row(i, N);
        T weighted = 0;  // sum_j dA_ij A_ij
        for (int j = 0; j < N; j++) {
            T da = dot<DH>(dc, x.tokens + j * x.stride + 2 * x.D, bias_v, Dh);
            ds[j] = da;
            weighted += da * a[j];
        }
        for (int j = 0; j < N; j++) {
            const T* k = x.tokens + j * x.stride + x.D;
            T g = scale * a[j] * (ds[j] - weighted);
            ds[j] = g;
#pragma unroll
            for (int d = 0; d < DH; d++)
                if (d < Dh) dq[d] += g * (k[d] + bias_k[d]);
        }
        T* out = dqkv + merged(x, i, N, x.stride, Dh);
#pragma unroll
        for (int d = 0; d < DH; d++)
            if (d < Dh) out[d] = dq[d];
    }
}

template <int DH>
__device__ void backward_columns(Head x, const T* A, const T* dctx, const T* dS, T* dqkv, int N,
                                 int Dh) {
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        T dk[DH], dv[DH];
#pragma unroll
        for (int d = 0; d < DH; d++) dk[d] = dv[d] = 0;
        for (int i = 0; i < N; i++) {
            T g = dS[matrix_row(i, N) + j], a = A[matrix_row(i, N) + j];
            const T *q = x.tokens + i * x.stride, *dc = dctx + merged(x, i, N, x.D, Dh);
#pragma unroll
            for (int d = 0; d < DH; d++) {
                if (d < Dh) {
                    dk[d] += g * (q[d] + x.bias[d]);
                    dv[d] += a * dc[d];
                }
            }
        }
        T* out = dqkv + merged(x, j, N, x.stride, Dh);
#pragma unroll
        for (int d = 0; d < DH; d++) {
            if (d < Dh) {
                out[x.D + d] = dk[d];
                out[2 * x.D + d] = dv[d];
            }
        }
    }
}

template <int DH>
__device__ void backward(Head x, const T* A, const T* dctx, T* dS, T* dqkv, int N, int Dh,
                         T scale) {
    backward_rows<DH>(x, A, dctx, dS, dqkv, N, Dh, scale);
    __syncthreads();  // every row of dS written before a column of it is read
    backward_columns<DH>(x, A, dctx, dS, dqkv, N, Dh);
}

extern "C" __global__ void attention_backward(const T* qkv, const T* bias, const T* A,
                                              const T* dctx, T* dS, T* dqkv, int N, int NH,
                                              int Dh, T scale) {
    Head x = head(qkv, bias, N, NH, Dh);
    if (Dh <= 16)
        backward<16>(x, A, dctx, dS, dqkv, N, Dh, scale);
    else if (Dh <= 32)
        backward<32>(x, A, dctx, dS, dqkv, N, Dh, scale);
    else
        backward<MAX_HEAD_DIM>(x, A, dctx, dS, dqkv, N, Dh, scale);
}
