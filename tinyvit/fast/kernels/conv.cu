// The convolution of the hybrid's stem (tinyvit.nn.conv.Conv2d) as a matmul over receptive
// fields, its two copies in one launch each (the product is cuBLAS's, tinyvit/fast/gpu.py):
// im2col lays the fields out as rows, one of U = C kh kw values per output pixel, and col2im
// is its adjoint, adding each row's gradient back into the input pixels it was read from.
// Images are (B, C, H, W); rows (M, U), M = B Ho Wo, output pixel m = (b Ho + ho) Wo + wo,
// field value u = (c kh + i) kw + j:
//     rows[m, u] = x[b, c, sh ho + i - ph, sw wo + j - pw]     (0 outside: the zero padding)
// One thread per value, no padded copy of the input.

extern "C" __global__ void im2col(const T* x, T* rows, long long n, int C, int H, int W, int kh,
                                  int kw, int sh, int sw, int ph, int pw, int Ho, int Wo) {
    int U = C * kh * kw;
    for (long long t = first_index(); t < n; t += grid_stride()) {
        long long m = t / U;
        int u = t % U, j = u % kw, i = u / kw % kh, c = u / (kw * kh);
        int wo = m % Wo, ho = m / Wo % Ho;
        long long b = m / ((long long)Wo * Ho);
        int h = sh * ho + i - ph, w = sw * wo + j - pw;
        bool inside = h >= 0 && h < H && w >= 0 && w < W;
        rows[t] = inside ? x[((b * C + c) * H + h) * W + w] : (T)0;
    }
}

// dx[b, c, h, w] = the sum of drows[m, u] over the (m, u) that read x[b, c, h, w]: for each
// kernel offset (i, j) in order, the output pixel with sh ho + i - ph = h and sw wo + j - pw = w,
// where there is one. A gather, a thread per input value: no two threads write one value.
extern "C" __global__ void col2im(const T* drows, T* dx, long long n, int C, int H, int W, int kh,
                                  int kw, int sh, int sw, int ph, int pw, int Ho, int Wo) {
    int U = C * kh * kw;
    for (long long t = first_index(); t < n; t += grid_stride()) {
        int w = t % W, h = t / W % H, c = t / ((long long)W * H) % C;
        long long b = t / ((long long)W * H * C);
        T sum = 0;
        for (int i = 0; i < kh; i++) {
            int hs = h + ph - i;  // sh * ho
            if (hs < 0 || hs % sh != 0 || hs / sh >= Ho) continue;
            for (int j = 0; j < kw; j++) {
                int ws = w + pw - j;  // sw * wo
                if (ws < 0 || ws % sw != 0 || ws / sw >= Wo) continue;
                long long m = (b * Ho + hs / sh) * Wo + ws / sw;
                sum += drows[m * U + (c * kh + i) * kw + j];
            }
        }
        dx[t] = sum;
    }
}
