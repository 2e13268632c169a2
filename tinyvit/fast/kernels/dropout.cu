// Dropout (tinyvit.nn.layers.Dropout) with a counter-based generator, one thread per value:
// value i is kept when u_i >= p, u_i in [0, 1) the i-th output of SplitMix64 seeded with
// `key` (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014).
// Each u_i comes from (key, i) alone: no generator state lives on the device (cuRAND's
// cannot be captured in a CUDA graph), and the backward draws the same mask again from the
// same key instead of keeping it. Forward and backward are one operation:
//     y  = x  * keep / (1 - p)        dx = dy * keep / (1 - p)

__device__ __forceinline__ bool kept(unsigned long long key, long i, double p) {
    unsigned long long z = key + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // SplitMix64's finalizer: every bit of
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;  // the counter reaches every bit of z
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0) >= p;  // the top 53 bits / 2^53
}

extern "C" __global__ void dropout_apply(const T* x, T* y, long n, unsigned long long key,
                                         double p, T scale) {
    for (long i = first_index(); i < n; i += grid_stride())
        y[i] = kept(key, i, p) ? x[i] * scale : (T)0;
}
