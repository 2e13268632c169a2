// Softmax cross-entropy (tinyvit.nn.loss.SoftmaxCrossEntropy derives it), the loss and its
// gradient in one pass, one warp per row of K logits z against a target distribution t:
//     lse = log sum_k exp(z_k)                 (shifted by the row's largest logit)
//     loss_b = sum_k t_k (lse - z_k) / B       (= -sum_k t_k log p_k / B, as sum_k t_k = 1)
//     grad_bk = (p_k - t_k) / B,   p_k = exp(z_k - lse)
// t is either a row of soft targets (mixup, cutmix) or made from an integer label:
//     t_k = smoothing / K + (1 - smoothing) [k == label]
// Each row writes its loss_b; the caller sums them. A label outside [0, K) makes its row's
// loss and gradient NaN: the caller does not read the labels to check them.

__device__ __forceinline__ T target(const T* soft, long long label, T smoothing, int K, int k) {
    if (soft) return soft[k];
    return smoothing / K + (k == label ? (T)1 - smoothing : (T)0);
}

__device__ void cross_entropy_row(const T* z, const T* soft, long long label, T smoothing,
                                  T* loss, T* grad, long long B, int K) {
    T largest = z[0];
    for (int k = lane(); k < K; k += 32) largest = max(largest, z[k]);
    largest = warp_max(largest);
    T sum = 0;
    for (int k = lane(); k < K; k += 32) sum += exp(z[k] - largest);
    T lse = largest + log(warp_sum(sum));
    T row_loss = 0;
    T invalid = (!soft && (label < 0 || label >= K)) ? (T)nan("") : (T)0;
    for (int k = lane(); k < K; k += 32) {
        T t = target(soft, label, smoothing, K, k) + invalid;
        row_loss += t * (lse - z[k]);
        grad[k] = (exp(z[k] - lse) - t) / B;
    }
    row_loss = warp_sum(row_loss);
    if (lane() == 0) *loss = row_loss / B;
}

// soft targets t (B, K)
extern "C" __global__ void cross_entropy_soft(const T* z, const T* t, T* loss, T* grad, long long B,
                                              int K) {
    long long b = warp_row();
    if (b >= B) return;
    cross_entropy_row(z + b * K, t + b * K, 0, (T)0, loss + b, grad + b * K, B, K);
}

// integer labels (B,), smoothed
extern "C" __global__ void cross_entropy_labels(const T* z, const long long* labels,
                                                T smoothing, T* loss, T* grad, long long B, int K) {
    long long b = warp_row();
    if (b >= B) return;
    cross_entropy_row(z + b * K, nullptr, labels[b], smoothing, loss + b, grad + b * K, B, K);
}
