// LayerNorm over rows of D values (tinyvit.nn.layers.LayerNorm derives the backward), one
// warp per row. Per row, two passes as tinyvit.nn.functional.standardize takes them:
//     mean = sum(x) / D,   var = sum((x - mean)^2) / D,   rstd = 1 / sqrt(var + eps)
//     xhat = (x - mean) rstd,   y = gamma xhat + beta
// The forward writes y, and for the backward xhat (rows x D) and rstd (rows).
// The add_ kernels fuse the residual connection before or after it (tinyvit.fast.gpu.Block):
// add_layernorm_forward first writes s = x + r and normalizes s (add_bias_layernorm_forward
// s = x + r + bias); layernorm_backward_add adds the skip's gradient to dx in the same pass.

__device__ void layernorm_row(const T* x, const T* gamma, const T* beta, T* y, T* xhat, T* rstd,
                              int D, T eps) {
    T sum = 0;
    for (int j = lane(); j < D; j += 32) sum += x[j];
    T mean = warp_sum(sum) / D;
    T squares = 0;
    for (int j = lane(); j < D; j += 32) {
        T c = x[j] - mean;
        squares += c * c;
    }
    T r = (T)1 / sqrt(warp_sum(squares) / D + eps);
    for (int j = lane(); j < D; j += 32) {
        T h = (x[j] - mean) * r;
        xhat[j] = h;
        y[j] = gamma[j] * h + beta[j];
    }
    if (lane() == 0) *rstd = r;
}

extern "C" __global__ void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y,
                                             T* xhat, T* rstd, long long rows, int D, T eps) {
    long long row = warp_row();
    if (row >= rows) return;  // the whole warp: a warp holds one row
    layernorm_row(x + row * D, gamma, beta, y + row * D, xhat + row * D, rstd + row, D, eps);
}

// s = x + r (+ bias, when given), then y = LayerNorm(s): each lane reads back only the
// values it wrote
__device__ void add_layernorm(const T* x, const T* r, const T* bias, T* s, const T* gamma,
                              const T* beta, T* y, T* xhat, T* rstd, long long rows, int D, T eps) {
    long long row = warp_row();
    if (row >= rows) return;
    for (int j = lane(); j < D; j += 32)
        s[row * D + j] = x[row * D + j] + r[row * D + j] + (bias ? bias[j] : (T)0);
    layernorm_row(s + row * D, gamma, beta, y + row * D, xhat + row * D, rstd + row, D, eps);
}

extern "C" __global__ void add_layernorm_forward(const T* x, const T* r, T* s, const T* gamma,
                                                 const T* beta, T* y, T* xhat, T* rstd,
                                                 long long rows, int D, T eps) {
    add_layernorm(x, r, nullptr, s, gamma, beta, y, xhat, rstd, rows, D, eps);
}

// the bias of the Linear that gave r added too (tinyvit.fast.gpu.Block: attention's output
// projection)
extern "C" __global__ void add_bias_layernorm_forward(const T* x, const T* r, const T* bias,
                                                      T* s, const T* gamma, const T* beta, T* y,
                                                      T* xhat, T* rstd, long long rows, int D,
                                                      T eps) {
    add_layernorm(x, r, bias, s, gamma, beta, y, xhat, rstd, rows, D, eps);
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row, g = dy gamma; plus skip[j] if given
__device__ void layernorm_backward_row(const T* dy, const T* xhat, T rstd, const T* gamma,
                                       const T* skip, T* dx, int D) {
    T sum_g = 0, sum_gh = 0;
    for (int j = lane(); j < D; j += 32) {
        T g = dy[j] * gamma[j];
        sum_g += g;
        sum_gh += g * xhat[j];
    }
    T mean_g = warp_sum(sum_g) / D, mean_gh = warp_sum(sum_gh) / D;
    for (int j = lane(); j < D; j += 32) {
        T d = rstd * (dy[j] * gamma[j] - mean_g - xhat[j] * mean_gh);
        dx[j] = skip ? skip[j] + d : d;
    }
}

extern "C" __global__ void layernorm_backward(const T* dy, const T* xhat, const T* rstd,
                                              const T* gamma, T* dx, long long rows, int D) {
    long long row = warp_row();
    if (row >= rows) return;
    layernorm_backward_row(dy + row * D, xhat + row * D, rstd[row], gamma, nullptr,
                           dx + row * D, D);
}

// dx = skip + the LayerNorm's backward of dy: a residual's gradient, its skip added here
extern "C" __global__ void layernorm_backward_add(const T* dy, const T* xhat, const T* rstd,
                                                  const T* gamma, const T* skip, T* dx,
                                                  long long rows, int D) {
    long long row = warp_row();
    if (row >= rows) return;
    layernorm_backward_row(dy + row * D, xhat + row * D, rstd[row], gamma, skip + row * D,
                           dx + row * D, D);
}

// dgamma += sum over rows of dy xhat,  dbeta += sum over rows of dy: the second reduction,
// down the columns. A block is 32 columns by 8 rows of threads; its threads walk down the
// rows 8 * gridDim.y apart (reads along a row stay contiguous across the 32 columns), the 8
// partial sums of a column meet in shared memory, and each block adds its sum to the
// gradient atomically (so the order of the additions, and the last bits, vary run to run).
#define COLUMN_ROWS 8

extern "C" __global__ void layernorm_param_grads(const T* dy, const T* xhat, T* dgamma,
                                                 T* dbeta, long long rows, int D) {
    __shared__ T part_gamma[COLUMN_ROWS][32], part_beta[COLUMN_ROWS][32];
    int j = blockIdx.x * 32 + threadIdx.x;
    T sum_gamma = 0, sum_beta = 0;
    if (j < D) {
        for (long long r = blockIdx.y * (long long)COLUMN_ROWS + threadIdx.y; r < rows;
             r += (long long)COLUMN_ROWS * gridDim.y) {
            T d = dy[r * D + j];
            sum_gamma += d * xhat[r * D + j];
            sum_beta += d;
        }
    }
    part_gamma[threadIdx.y][threadIdx.x] = sum_gamma;
    part_beta[threadIdx.y][threadIdx.x] = sum_beta;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        for (int k = 1; k < COLUMN_ROWS; k++) {
            sum_gamma += part_gamma[k][threadIdx.x];
            sum_beta += part_beta[k][threadIdx.x];
        }
        atomicAdd(dgamma + j, sum_gamma);
        atomicAdd(dbeta + j, sum_beta);
    }
}
