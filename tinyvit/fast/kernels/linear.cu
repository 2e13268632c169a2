// A Linear's bias (tinyvit.nn.layers.Linear) where a kernel of its own saves launches.
//
// Added with the residual connection after the Linear (tinyvit.fast.gpu.Block: the MLP's
// fc2), one thread per value: y = x + m + b, with m the Linear's matmul (rows of D values).
extern "C" __global__ void add_bias_residual(const T* x, const T* m, const T* b, T* y, long long n,
                                             int D) {
    for (long long i = first_index(); i < n; i += grid_stride()) y[i] = x[i] + m[i] + b[i % D];
}

// The bias gradient: db += the sum of dy (rows x D)
// down its rows, one launch where a matrix-vector product would take three (a vector of
// ones, the product, the add). A block is 32 columns by COLUMN_ROWS rows of threads, as
// layernorm_param_grads: its threads walk down the rows COLUMN_ROWS * gridDim.y apart, the
// partial sums of a column meet in shared memory, and each block adds its sum atomically
// (so the order of the additions, and the last bits, vary run to run).
#define COLUMN_ROWS 8

extern "C" __global__ void bias_grad(const T* dy, T* db, long long rows, int D) {
    __shared__ T part[COLUMN_ROWS][32];
    int j = blockIdx.x * 32 + threadIdx.x;
    T sum = 0;
    if (j < D)
        for (long long r = blockIdx.y * (long long)COLUMN_ROWS + threadIdx.y; r < rows;
             r += (long long)COLUMN_ROWS * gridDim.y)
            sum += dy[r * D + j];
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        for (int k = 1; k < COLUMN_ROWS; k++) sum += part[k][threadIdx.x];
        atomicAdd(db + j, sum);
    }
}
