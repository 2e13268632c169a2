// AdamW over the flat parameter buffer, one thread per parameter, one launch for the whole
// update (tinyvit.nn.optim.AdamW, as torch.optim.AdamW):
//     p -= lr weight_decay decay p                 (decay: 1 where a parameter decays, else 0)
//     m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//     p -= lr / bias1 * m / (sqrt(v) / bias2_sqrt + eps)
// with bias1 = 1 - beta1^t and bias2_sqrt = sqrt(1 - beta2^t), t the step count. What
// changes from step to step, (lr, bias1, bias2_sqrt), is read from device memory
// (`schedule`), not passed by value, so that a CUDA graph that captured the launch follows
// the schedule. Every constant comes computed in double: 1 - beta2 in float, 1 - 0.999f, has
// lost 4 digits.
extern "C" __global__ void adamw_update(T* p, const T* g, T* m, T* v, const T* decay, long long n,
                                        const double* schedule, T beta1, T one_minus_beta1,
                                        T beta2, T one_minus_beta2, T eps, T weight_decay) {
    T lr = (T)schedule[0], bias1 = (T)schedule[1], bias2_sqrt = (T)schedule[2];
    for (long long i = first_index(); i < n; i += grid_stride()) {
        T w = p[i] - lr * weight_decay * decay[i] * p[i];
        T mi = beta1 * m[i] + one_minus_beta1 * g[i];
        T vi = beta2 * v[i] + one_minus_beta2 * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        p[i] = w - lr / bias1 * mi / (sqrt(vi) / bias2_sqrt + eps);
    }
}
