// Attention's softmax with its 1/sqrt(Dh) scale folded in (tinyvit.nn.layers.Attention),
// over rows of N scores, one warp per row:
//     A = softmax(scale S),  shifted by the row's largest score (scale > 0) so that no
//                            exp overflows
//     dS = scale A (dA - sum(dA A))   the softmax's backward times the scale: the gradient
//                                     of the unscaled scores S = q k^T
extern "C" __global__ void softmax_forward(const T* S, T* A, long long rows, int N, T scale) {
    long long row = warp_row();
    if (row >= rows) return;
    const T* s = S + row * N;
    T* a = A + row * N;
    T largest = s[0];  // every lane starts from a score of the row, even one with none to take
    for (int j = lane(); j < N; j += 32) largest = max(largest, s[j]);
    largest = warp_max(largest);
    T sum = 0;
    for (int j = lane(); j < N; j += 32) {
        T e = exp(scale * (s[j] - largest));
        a[j] = e;
        sum += e;
    }
    T inverse = (T)1 / warp_sum(sum);
    for (int j = lane(); j < N; j += 32) a[j] *= inverse;
}

extern "C" __global__ void softmax_backward(const T* A, const T* dA, T* dS, long long rows, int N,
                                            T scale) {
    long long row = warp_row();
    if (row >= rows) return;
    const T* a = A + row * N;
    const T* da = dA + row * N;
    T dot = 0;
    for (int j = lane(); j < N; j += 32) dot += da[j] * a[j];
    dot = warp_sum(dot);
    for (int j = lane(); j < N; j += 32) dS[row * N + j] = scale * a[j] * (da[j] - dot);
}
