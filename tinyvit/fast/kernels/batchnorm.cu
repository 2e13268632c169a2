// BatchNorm2d over images (B, C, H, W) (tinyvit.nn.conv.BatchNorm2d derives the backward), one
// block per channel c, whose threads walk the channel's V = B*H*W values: image b's HW values
// of channel c are contiguous, from (b*C + c)*HW. Per channel, as tinyvit.nn.functional's
// standardize takes them:
//     mean = sum(x) / V,   var = sum((x - mean)^2) / V,   rstd = 1 / sqrt(var + eps)
//     xhat = (x - mean) rstd,   y = gamma xhat + beta
// and the running averages updated in the same launch (momentum m, the unbiased variance):
//     running_mean = (1 - m) running_mean + m mean
//     running_var  = (1 - m) running_var  + m var V / (V - 1)
// Each channel's sums are one block's: no atomics, the same order every run.

__device__ __forceinline__ long long channel_index(long long i, int c, int C, long long HW) {
    return (i / HW * C + c) * HW + i % HW;  // value i of channel c: image i / HW, pixel i % HW
}

// The sum of v over the block's threads, in every one of them; `shared` holds a value per warp.
__device__ T block_sum(T v, T* shared) {
    v = warp_sum(v);
    if (lane() == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    T total = 0;
    for (int w = 0; w < blockDim.x / 32; w++) total += shared[w];
    __syncthreads();  // every thread has read shared before it is written again
    return total;
}

extern "C" __global__ void batchnorm_forward(const T* x, const T* gamma, const T* beta, T* y,
                                             T* xhat, T* rstd, T* running_mean, T* running_var,
                                             long long B, int C, long long HW, T eps, T momentum) {
    __shared__ T shared[32];
    int c = blockIdx.x;
    long long V = B * HW;
    T sum = 0;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) sum += x[channel_index(i, c, C, HW)];
    T mean = block_sum(sum, shared) / V;
    T squares = 0;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        T d = x[channel_index(i, c, C, HW)] - mean;
        squares += d * d;
    }
    T var = block_sum(squares, shared) / V;
    T r = (T)1 / sqrt(var + eps);
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        long long k = channel_index(i, c, C, HW);
        T h = (x[k] - mean) * r;
        xhat[k] = h;
        y[k] = gamma[c] * h + beta[c];
    }
    if (threadIdx.x == 0) {
        rstd[c] = r;
        running_mean[c] = ((T)1 - momentum) * running_mean[c] + momentum * mean;
        running_var[c] = ((T)1 - momentum) * running_var[c] + momentum * var * V / (V - 1);
    }
}

// eval mode, one thread per value: y = (x - running_mean) gamma / sqrt(running_var + eps) + beta
extern "C" __global__ void batchnorm_eval(const T* x, const T* gamma, const T* beta,
                                          const T* running_mean, const T* running_var, T* y,
                                          long long total, int C, long long HW, T eps) {
    for (long long k = first_index(); k < total; k += grid_stride()) {
        int c = k / HW % C;
        y[k] = (x[k] - running_mean[c]) * (gamma[c] / sqrt(running_var[c] + eps)) + beta[c];
    }
}

// dgamma += sum(dy xhat),  dbeta += sum(dy),  and with g = dy gamma
//     dx = rstd (g - mean(g) - xhat mean(g xhat)),  means over the channel's V values:
// the parameters' gradients are the very sums dx needs, so one launch does all three.
extern "C" __global__ void batchnorm_backward(const T* dy, const T* xhat, const T* rstd,
                                              const T* gamma, T* dx, T* dgamma, T* dbeta,
                                              long long B, int C, long long HW) {
    __shared__ T shared[32];
    int c = blockIdx.x;
    long long V = B * HW;
    T sum_dy = 0, sum_dyh = 0;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        long long k = channel_index(i, c, C, HW);
        sum_dy += dy[k];
        sum_dyh += dy[k] * xhat[k];
    }
    sum_dy = block_sum(sum_dy, shared);
    sum_dyh = block_sum(sum_dyh, shared);
    T mean_g = gamma[c] * sum_dy / V, mean_gh = gamma[c] * sum_dyh / V;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) {
        long long k = channel_index(i, c, C, HW);
        dx[k] = rstd[c] * (dy[k] * gamma[c] - mean_g - xhat[k] * mean_gh);
    }
    if (threadIdx.x == 0) {
        dgamma[c] += sum_dyh;
        dbeta[c] += sum_dy;
    }
}
