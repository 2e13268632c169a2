// What every kernel file shares. tinyvit/fast/compile.py compiles each file twice, with
// "#define T float" and with "#define T double" before this header: T is the arrays' type.
// The row kernels give each row of values to one warp of 32 threads, which take every 32nd
// value of it and combine their partial results with the two reductions below.

// The sum of v over the warp's 32 threads, in every one of them (a butterfly: after the
// steps of 16, 8, 4, 2 and 1 lanes, each lane has added all 32 values).
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// The largest v over the warp's 32 threads, in every one of them.
__device__ __forceinline__ T warp_max(T v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v = max(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

// The row of a row kernel's warp (rows are counted across the whole grid), and its lane.
__device__ __forceinline__ long warp_row() {
    return (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
}

__device__ __forceinline__ int lane() {
    return threadIdx.x % 32;
}

// The first value of an elementwise kernel's thread, and the stride of its grid-stride loop
// (the grid may be smaller than the array: each thread then takes every stride-th value).
__device__ __forceinline__ long first_index() {
    return blockIdx.x * (long)blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long grid_stride() {
    return (long)gridDim.x * blockDim.x;
}
