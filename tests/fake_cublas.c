// A stand-in for libcublas on the CPU: the functions tinyvit/fast/cublas.py calls, with the C
// signatures cuBLAS's documentation gives them, computing on host memory. Compiled and called
// through tinyvit's own ctypes binding by tests/test_cuda_sources.py, it checks the binding's
// argument types and order, the scalars passed by address, and the order of the calls (a
// workspace set after each stream, as cuBLAS needs for a captured graph). Column-major, as
// cuBLAS: element (i, j) of a matrix with leading dimension ld is at [i + j * ld].
#include <stddef.h>

typedef struct {
    void* stream;
    void* workspace;
    size_t workspace_bytes;
    int math_mode;
} Context;

static Context context;

enum { SUCCESS = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7 };

int cublasCreate_v2(Context** handle) {
    *handle = &context;
    return SUCCESS;
}

int cublasSetMathMode(Context* handle, int mode) {
    handle->math_mode = mode;
    return SUCCESS;
}

int cublasSetStream_v2(Context* handle, void* stream) {
    handle->stream = stream;
    handle->workspace = NULL;  // as cuBLAS: a stream takes the default workspace back
    handle->workspace_bytes = 0;
    return SUCCESS;
}

int cublasSetWorkspace_v2(Context* handle, void* workspace, size_t bytes) {
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return SUCCESS;
}

static int larger(int a, int b) { return a > b ? a : b; }

#define GEMM(NAME, T)                                                                          \
    int NAME(Context* handle, int transa, int transb, int m, int n, int k, const T* alpha,      \
             const T* A, int lda, long long stride_a, const T* B, int ldb, long long stride_b, \
             const T* beta, T* C, int ldc, long long stride_c, int batch) {                    \
        if (handle != &context || handle->workspace == NULL) return NOT_INITIALIZED;           \
        if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < larger(1, transa ? k : m) ||         \
            ldb < larger(1, transb ? n : k) || ldc < larger(1, m))                             \
            return INVALID_VALUE;                                                              \
        for (int b = 0; b < batch; b++) {                                                      \
            const T *a = A + b * stride_a, *bb = B + b * stride_b;                             \
            T* c = C + b * stride_c;                                                           \
            for (int i = 0; i < m; i++)                                                        \
                for (int j = 0; j < n; j++) {                                                  \
                    T sum = 0;                                                                 \
                    for (int p = 0; p < k; p++)                                                \
                        sum += (transa ? a[p + i * lda] : a[i + p * lda]) *                    \
                               (transb ? bb[j + p * ldb] : bb[p + j * ldb]);                   \
                    c[i + j * ldc] = *alpha * sum + (*beta == 0 ? 0 : *beta * c[i + j * ldc]); \
                }                                                                              \
        }                                                                                      \
        return SUCCESS;                                                                        \
    }

GEMM(cublasSgemmStridedBatched, float)
GEMM(cublasDgemmStridedBatched, double)

int fake_math_mode(void) { return context.math_mode; }
