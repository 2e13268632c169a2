// GELU, the exact form (tinyvit.nn.layers.GELU), one thread per value:
//     y  = x Phi(x),             Phi(x) = (1 + erf(x / sqrt 2)) / 2, the normal CDF
//     y' = Phi(x) + x phi(x),    phi(x) = exp(-x^2 / 2) / sqrt(2 pi), its density
// The reference takes a pass over memory per operation; here each value is read once.

#define SQRT_HALF ((T)0.70710678118654752440)
#define INV_SQRT_2PI ((T)0.39894228040143267794)

extern "C" __global__ void gelu_forward(const T* x, T* y, long n) {
    for (long i = first_index(); i < n; i += grid_stride()) {
        T v = x[i];
        y[i] = v * (T)0.5 * ((T)1 + erf(v * SQRT_HALF));
    }
}

// dx = dy * y'(x), x the forward's input
extern "C" __global__ void gelu_backward(const T* x, const T* dy, T* dx, long n) {
    for (long i = first_index(); i < n; i += grid_stride()) {
        T v = x[i];
        T cdf = (T)0.5 * ((T)1 + erf(v * SQRT_HALF));
        T pdf = INV_SQRT_2PI * exp((T)-0.5 * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}
