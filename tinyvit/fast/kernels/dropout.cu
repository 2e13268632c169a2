// Dropout (tinyvit.nn.layers.Dropout) with a counter-based generator, one thread per value.
// Mask number `draw` of a step keeps value i when u_i >= p, u_i in [0, 1) made from two
// outputs of SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): the mask's key is output `draw` of the generator seeded with the
// step's seed, and u_i output i of the one seeded with that key. The seed is read from
// device memory (`seed[0]`), not passed by value: a CUDA graph that captured the launch
// draws a new mask whenever the seed there is rewritten. No generator state lives on the
// device (cuRAND's cannot be captured), and the backward draws the same mask again from the
// same seed and number instead of keeping it. Forward and backward are one operation:
//     y  = x  * keep / (1 - p)        dx = dy * keep / (1 - p)

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long seed,
                                                         unsigned long long i) {
    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;  // output i
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // the finalizer: every bit of the
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;  // counter reaches every bit of z
    return z ^ (z >> 31);
}

extern "C" __global__ void dropout_apply(const T* x, T* y, long long n,
                                         const unsigned long long* seed,
                                         unsigned long long draw, double p, T scale) {
    unsigned long long key = splitmix64(seed[0], draw);
    for (long long i = first_index(); i < n; i += grid_stride()) {
        double u = (double)(splitmix64(key, i) >> 11) * (1.0 / 9007199254740992.0);  // /2^53
        y[i] = u >= p ? x[i] * scale : (T)0;
    }
}
