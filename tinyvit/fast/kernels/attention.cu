// Multi-head attention over a short sequence (tinyvit.nn.layers.Attention's attend and
// attend_backward, derived there), with the qkv bias, the split into heads, the merge of
// the heads and the 1/sqrt(Dh) scale folded in: one block per (image b, head h), for N
// tokens (at most MAX_TOKENS) and a head of Dh values (at most MAX_HEAD_DIM). The queries
// are those of the first Q tokens: Q = N for Attention, Q = 1 for ClassAttention (the class
// token's row alone).
//
// The input is the qkv projection before its bias, (B, N, 3D) with D = NH Dh (q, k and v
// stacked in that order, as Linear(D, 3D) gives them), and that bias (3D): head h's
//     q_i = qkv[b, i, h Dh : (h+1) Dh] + bias[h Dh : (h+1) Dh]
// and k_j, v_j the same D and 2D further along.
//
// The block first copies the head's k and v, bias added, into shared memory (rows padded
// to Dh + 1 values, so that 32 lanes reading a column meet 32 different banks); then each
// of its WARPS warps takes every WARPS-th row. Within a warp the lanes take either the
// keys (lane l holds keys l, l + 32, ...: SLOTS of them) or the head's values (lane l
// holds values l, l + 32, ...: VALUE_SLOTS of them), whichever the step does not sum over.

#define MAX_HEAD_DIM 64
#define MAX_TOKENS 128
#define WARPS 4
#define SLOTS (MAX_TOKENS / 32)  // the keys a lane holds
#define VALUE_SLOTS (MAX_HEAD_DIM / 32)  // the values of a head a lane holds
#define FULL_WARP 0xffffffff

extern __shared__ unsigned char shared_memory[];  // its size: tinyvit/fast/gpu.py's

// The block's image b and head h, and where their values start: the q of token 0 of image
// b (tokens follow 3D apart; k is D further, v 2D), and the bias of the head's q (likewise).
struct Head {
    int b, h, D;
    long long stride;  // 3D: from one token's qkv to the next's
    const T* tokens;
    const T* bias;
};

__device__ Head head(const T* qkv, const T* bias, int N, int NH, int Dh) {
    int b = blockIdx.x / NH, h = blockIdx.x % NH, D = NH * Dh;
    return Head{b, h, D, 3L * D, qkv + (long long)b * N * 3 * D + h * Dh, bias + h * Dh};
}

// The block's shared memory: two matrices of N rows of Dh values (each row P = Dh + 1
// apart), then for each warp a row of N values and one of Dh values.
struct Shared {
    T *first, *second, *row, *vec;
    int P;
};

__device__ Shared shared(int N, int Dh) {
    T* base = reinterpret_cast<T*>(shared_memory);
    int P = Dh + 1, warp = threadIdx.x / 32;
    T* rows = base + 2 * N * P;
    return Shared{base, base + N * P, rows + warp * N, rows + WARPS * N + warp * Dh, P};
}

// dst[n][d] = src[n * stride + d] (+ bias[d]) for every n < N, d < Dh, by the whole block
__device__ void stage(T* dst, int P, const T* src, long long stride, const T* bias, int N, int Dh) {
    for (int k = threadIdx.x; k < N * Dh; k += blockDim.x) {
        int n = k / Dh, d = k % Dh;
        dst[n * P + d] = src[n * stride + d] + (bias ? bias[d] : (T)0);
    }
}

// Where row i of (b, h)'s (Q, N) matrices (A, dS) starts
__device__ long long matrix_row(int i, int Q, int N) {
    return ((long long)blockIdx.x * Q + i) * N;
}

// Where token i's values of head h start in an array of merged heads, (B, tokens, width)
__device__ long long merged(Head x, int i, int tokens, long long width, int Dh) {
    return ((long long)x.b * tokens + i) * width + x.h * Dh;
}

// For the lane's keys j_t = lane + 32 t < N (SLOTS of them, t < SLOTS):
//     out[t] = sum over d < Dh of row[d] m[j_t][d]      (row the same for every lane)
// each row[d] read once for all of them
__device__ __forceinline__ void key_dots(const T* row, const T* m, int P, int N, int Dh,
                                         T* out) {
#pragma unroll
    for (int t = 0; t < SLOTS; t++) out[t] = 0;
    for (int d = 0; d < Dh; d++) {
        T r = row[d];
#pragma unroll
        for (int t = 0; t < SLOTS; t++)
            if (lane() + 32 * t < N) out[t] += r * m[(lane() + 32 * t) * P + d];
    }
}

// For the lane's head values d_u = lane + 32 u < Dh (VALUE_SLOTS of them):
//     out[u] = sum over j < N of row[j] m[j][d_u]       (row the same for every lane)
__device__ __forceinline__ void value_dots(const T* row, const T* m, int P, int N, int Dh,
                                           T* out) {
#pragma unroll
    for (int u = 0; u < VALUE_SLOTS; u++) out[u] = 0;
    for (int j = 0; j < N; j++) {
        T r = row[j];
#pragma unroll
        for (int u = 0; u < VALUE_SLOTS; u++)
            if (lane() + 32 * u < Dh) out[u] += r * m[j * P + lane() + 32 * u];
    }
}

// dst[d_u] = out[u] for the lane's head values d_u = lane + 32 u < Dh
__device__ __forceinline__ void store_values(T* dst, const T* out, int Dh) {
#pragma unroll
    for (int u = 0; u < VALUE_SLOTS; u++)
        if (lane() + 32 * u < Dh) dst[lane() + 32 * u] = out[u];
}

// Forward, a warp per query row i < Q:
//     s_ij = scale q_i . k_j,   A_ij = exp(s_ij - max_j s_ij) / sum_j exp(s_ij - max_j s_ij)
//     ctx_i = sum_j A_ij v_j    written where the heads merge: ctx[b, i, h Dh : (h+1) Dh]
// ctx is (B, Q, D); A (B, NH, Q, N) is written when write_A is not 0 (training keeps it).
extern "C" __global__ void attention_forward(const T* qkv, const T* bias, T* ctx, T* A,
                                             int write_A, int N, int Q, int NH, int Dh,
                                             T scale) {
    Head x = head(qkv, bias, N, NH, Dh);
    Shared s = shared(N, Dh);  // first: k, second: v
    stage(s.first, s.P, x.tokens + x.D, x.stride, x.bias + x.D, N, Dh);
    stage(s.second, s.P, x.tokens + 2 * x.D, x.stride, x.bias + 2 * x.D, N, Dh);
    __syncthreads();
    for (int i = threadIdx.x / 32; i < Q; i += WARPS) {
        for (int d = lane(); d < Dh; d += 32)
            s.vec[d] = (x.tokens[i * x.stride + d] + x.bias[d]) * scale;
        __syncwarp();
        T score[SLOTS], out[VALUE_SLOTS];
        key_dots(s.vec, s.first, s.P, N, Dh, score);
        T largest = __shfl_sync(FULL_WARP, score[0], 0);  // key 0's: lane 0 always has a key
#pragma unroll
        for (int t = 0; t < SLOTS; t++)
            if (lane() + 32 * t < N) largest = max(largest, score[t]);
        largest = warp_max(largest);
        T sum = 0;
#pragma unroll
        for (int t = 0; t < SLOTS; t++) {
            if (lane() + 32 * t < N) {
                score[t] = exp(score[t] - largest);
                sum += score[t];
            }
        }
        T inverse = (T)1 / warp_sum(sum);
#pragma unroll
        for (int t = 0; t < SLOTS; t++) {
            int j = lane() + 32 * t;
            if (j < N) {
                s.row[j] = score[t] * inverse;
                if (write_A) A[matrix_row(i, Q, N) + j] = s.row[j];
            }
        }
        __syncwarp();
        value_dots(s.row, s.second, s.P, N, Dh, out);
        store_values(ctx + merged(x, i, Q, x.D, Dh), out, Dh);
        __syncwarp();  // the row and vec read before the warp's next row writes them
    }
}

// Backward, from dctx (B, Q, D), the merged heads' gradient, and the forward's A, into
// dqkv (B, N, 3D), the gradient of the qkv projection's output, in two phases:
// 1. a warp per query row i < Q (dS_ij: the gradient of the unscaled score q_i . k_j):
//        dA_ij = dctx_i . v_j,   dS_ij = scale A_ij (dA_ij - sum_j dA_ij A_ij)
//        dq_i = sum_j dS_ij k_j
//    keeping row i of dS (B, NH, Q, N) for the second phase; dq_i = 0 for the rows i >= Q,
//    whose queries were not used;
// 2. once every row is done, with q and dctx in shared memory, a warp per key j:
//        dk_j = sum_{i<Q} dS_ij q_i,   dv_j = sum_{i<Q} A_ij dctx_i
extern "C" __global__ void attention_backward(const T* qkv, const T* bias, const T* A,
                                              const T* dctx, T* dS, T* dqkv, int N, int Q,
                                              int NH, int Dh, T scale) {
    Head x = head(qkv, bias, N, NH, Dh);
    Shared s = shared(N, Dh);  // first: k, second: v; then first: q, second: dctx
    stage(s.first, s.P, x.tokens + x.D, x.stride, x.bias + x.D, N, Dh);
    stage(s.second, s.P, x.tokens + 2 * x.D, x.stride, x.bias + 2 * x.D, N, Dh);
    __syncthreads();
    for (int i = threadIdx.x / 32; i < Q; i += WARPS) {
        for (int d = lane(); d < Dh; d += 32) s.vec[d] = dctx[merged(x, i, Q, x.D, Dh) + d];
        __syncwarp();
        T dA[SLOTS], a[SLOTS], out[VALUE_SLOTS], weighted = 0;  // sum_j dA_ij A_ij
        key_dots(s.vec, s.second, s.P, N, Dh, dA);
#pragma unroll
        for (int t = 0; t < SLOTS; t++) {
            int j = lane() + 32 * t;
            if (j < N) {
                a[t] = A[matrix_row(i, Q, N) + j];
                weighted += dA[t] * a[t];
            }
        }
        weighted = warp_sum(weighted);
#pragma unroll
        for (int t = 0; t < SLOTS; t++) {
            int j = lane() + 32 * t;
            if (j < N) {
                s.row[j] = scale * a[t] * (dA[t] - weighted);
                dS[matrix_row(i, Q, N) + j] = s.row[j];
            }
        }
        __syncwarp();
        value_dots(s.row, s.first, s.P, N, Dh, out);
        store_values(dqkv + merged(x, i, N, x.stride, Dh), out, Dh);
        __syncwarp();
    }
    for (int i = Q + threadIdx.x / 32; i < N; i += WARPS)
        for (int d = lane(); d < Dh; d += 32) dqkv[merged(x, i, N, x.stride, Dh) + d] = 0;
    __syncthreads();  // every row of dS written, k and v read
    stage(s.first, s.P, x.tokens, x.stride, x.bias, Q, Dh);
    stage(s.second, s.P, dctx + merged(x, 0, Q, x.D, Dh), x.D, nullptr, Q, Dh);
    __syncthreads();
    for (int j = threadIdx.x / 32; j < N; j += WARPS) {
        T dk[VALUE_SLOTS] = {}, dv[VALUE_SLOTS] = {};
        for (int i = 0; i < Q; i++) {
            T g = dS[matrix_row(i, Q, N) + j], a = A[matrix_row(i, Q, N) + j];
#pragma unroll
            for (int u = 0; u < VALUE_SLOTS; u++) {
                int d = lane() + 32 * u;
                if (d < Dh) {
                    dk[u] += g * s.first[i * s.P + d];
                    dv[u] += a * s.second[i * s.P + d];
                }
            }
        }
        T* out = dqkv + merged(x, j, N, x.stride, Dh);
        store_values(out + x.D, dk, Dh);
        store_values(out + 2 * x.D, dv, Dh);
    }
}
