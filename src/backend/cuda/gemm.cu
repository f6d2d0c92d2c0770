// Prefill matmul (n > 32 rows) through cuBLASLt, and the CudaMatmul object that owns its handle.
//
// Layout: W is [rows, cols] row-major = a column-major cols x rows matrix, so with op(A) = T, A = W,
// B = x^T (column-major cols x n, i.e. x row-major [n, cols]) and D = y^T (column-major rows x n = y
// row-major [n, rows]): the "TN" GEMM the tensor cores prefer. M = rows, N = n, K = cols.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <cstdlib>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"

namespace ultra::cuda {

using namespace detail;

namespace {

// Largest power of two <= 256 that divides the address (cuBLASLt assumes 256 unless told).
uint32_t alignment_of(const void* p) {
  const uintptr_t v = (uintptr_t)p;
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

// Row t of x [n, cols] as E4M3 codes q[t, :] = satfinite(rn(x / s_t)) with s_t = max |x[t, :]| / 448 (1 for
// a zero row): one block per row, the largest |x| reduced in a fixed order, then converted.
__global__ void __launch_bounds__(256)
    quantize_rows_e4m3_kernel(const float* x, int cols, uint8_t* q, float* scale) {
  __shared__ float red[8];
  const int t = blockIdx.x, tid = threadIdx.x;
  const float* xr = x + (int64_t)t * cols;
  float m = 0.0f;
  for (int c = tid; c < cols; c += 256) m = fmaxf(m, fabsf(xr[c]));
  m = warp_max(m);
  if ((tid & 31) == 0) red[tid >> 5] = m;
  __syncthreads();
  m = 0.0f;
  for (int i = 0; i < 8; ++i) m = fmaxf(m, red[i]);
  const float s = m > 0.0f && m <= 3.0e38f ? m / 448.0f : 1.0f;
  if (tid == 0) scale[t] = s;
  uint8_t* qr = q + (int64_t)t * cols;
  for (int c = tid; c < cols; c += 256)
    qr[c] = (uint8_t)__nv_cvt_float_to_fp8(xr[c] / s, __NV_SATFINITE, __NV_E4M3);
}

// out[r] = s[0], r < rows (a scale per tensor as cuBLASLt's scale vector).
__global__ void repeat_scale_kernel(const float* s, int64_t rows, float* out) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) out[r] = __ldg(s);
}

// y[t, r] += bias[r] over y [total / rows, rows].
__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < total) y[i] += __ldg(bias + i % rows);
}

}  // namespace

namespace tuning {
int g_fp8_gemm = 0;
void set_fp8_gemm(int mode) {
  g_fp8_gemm = mode;
}
}  // namespace tuning

bool fp8_gemm_on() {
  return tuning::g_fp8_gemm == 0 ? kernel_tuning().fp8_gemm : tuning::g_fp8_gemm == 1;
}

struct CudaMatmul::Impl {
  struct Plan {
    // key
    GgmlType type;
    int64_t rows, cols, ld;
    int n;
    bool bias;
    uint32_t align_a, align_b, align_c;
    int a_scale = 0;  // F8_E4M3: 1 scalar scales for W and x, 2 scale vectors (one per row of W, of x)
    // cuBLASLt objects
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // a heuristic answer was found
  };

  cublasLtHandle_t lt = nullptr;
  uint8_t* ws = nullptr;  // [kCublasWorkspaceBytes] cuBLASLt, then the converted activations
  size_t ws_bytes = 0;
  std::vector<Plan> plans;

  ~Impl() {
    for (Plan& p : plans) destroy(p);
    if (lt) cublasLtDestroy(lt);
  }
  static void destroy(Plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }

  // Returns the cached plan for the key, creating it (and querying the heuristic) on first use.
  Plan* plan(GgmlType type, int64_t rows, int64_t cols, int64_t ld, int n, bool bias, uint32_t al_a,
             uint32_t al_b, uint32_t al_c, cublasStatus_t* st, int a_scale = 0) {
    for (Plan& p : plans)
      if (p.type == type && p.rows == rows && p.cols == cols && p.ld == ld && p.n == n && p.bias == bias &&
          p.align_a == al_a && p.align_b == al_b && p.align_c == al_c && p.a_scale == a_scale)
        return &p;
    Plan p{type, rows, cols, ld, n, bias, al_a, al_b, al_c, a_scale};
    const cudaDataType_t ab = type == GgmlType::F32       ? CUDA_R_32F
                              : type == GgmlType::F16     ? CUDA_R_16F
                              : type == GgmlType::F8_E4M3 ? CUDA_R_8F_E4M3
                                                          : CUDA_R_16BF;
    *st = create(p, ab);
    if (*st != CUBLAS_STATUS_SUCCESS) {
      destroy(p);
      return nullptr;
    }
    plans.push_back(p);
    return &plans.back();
  }

  cublasStatus_t create(Plan& p, cudaDataType_t ab) {
    cublasStatus_t st;
#define LT_TRY(call) \
  if ((st = (call)) != CUBLAS_STATUS_SUCCESS) return st
    LT_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (p.a_scale) {  // the scale pointers are set per call
      const cublasLtMatmulMatrixScale_t am = p.a_scale == 2 ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                            : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      const cublasLtMatmulMatrixScale_t bm = am;
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
      // Placeholders (the workspace) for the heuristic, which may refuse null scale pointers.
      const void* ph = ws;
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ph, sizeof(ph)));
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ph, sizeof(ph)));
    }
    if (p.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = CUDA_R_32F;
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p.a, ab, p.cols, p.rows, p.ld));         // W: K x M, column-major
    LT_TRY(cublasLtMatrixLayoutCreate(&p.b, ab, p.cols, p.n, p.cols));          // x: K x N
    LT_TRY(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, p.rows, p.n, p.rows));  // y: M x N

    cublasLtMatmulPreference_t pref = nullptr;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = kCublasWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t res{};
    int n_res = 0;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                              sizeof(wsb));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p.align_a,
                                                sizeof(uint32_t));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p.align_b,
                                                sizeof(uint32_t));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p.align_c,
                                                sizeof(uint32_t));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p.align_c,
                                                sizeof(uint32_t));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &n_res);
    cublasLtMatmulPreferenceDestroy(pref);
    // No algorithm is not an error: matmul() falls back to gemv in chunks of 32 rows.
    if (st == CUBLAS_STATUS_SUCCESS && n_res > 0) {
      p.algo = res.algo;
      p.ok = true;
    }
    return st == CUBLAS_STATUS_NOT_SUPPORTED ? CUBLAS_STATUS_SUCCESS : st;
#undef LT_TRY
  }
};

// Layout: [kCublasWorkspaceBytes] cuBLASLt | [max_n * max_cols] BF16 / F16 activations | ... | the BF16 copy
// of a low-bit matrix, at the end of the workspace (matmul checks that the two areas do not overlap).
size_t CudaMatmul::workspace_bytes(int max_n, int64_t max_cols, int64_t max_lowbit_elems) {
  const size_t lowbit =
      max_n > kLowbitGemvMaxRows && max_lowbit_elems > 0 ? round_up((size_t)max_lowbit_elems * 2, 256) : 0;
  return kCublasWorkspaceBytes + round_up((size_t)(max_n > 0 ? max_n : 0) * (size_t)max_cols * 2, 256) +
         lowbit;
}

CudaMatmul::~CudaMatmul() {
  delete impl_;
}

cudaError_t CudaMatmul::init(void* workspace, size_t bytes) {
  if (impl_ || !workspace || bytes < kCublasWorkspaceBytes || alignment_of(workspace) < 256)
    return cudaErrorInvalidValue;
  auto* im = new Impl;
  const cublasStatus_t st = cublasLtCreate(&im->lt);
  if (st != CUBLAS_STATUS_SUCCESS) {
    last_status_ = (int)st;
    delete im;
    return cudaErrorUnknown;
  }
  im->ws = static_cast<uint8_t*>(workspace);
  im->ws_bytes = bytes;
  impl_ = im;
  return cudaSuccess;
}

cudaError_t CudaMatmul::matmul(const WeightView& w, const float* x, int n, float* y, const float* bias,
                               bool accumulate, cudaStream_t stream) {
  if (n < 1) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const bool lowbit = is_lowbit(w.type);
  if (n <= (lowbit ? kLowbitGemvMaxRows : kGemvMaxRows) || gemv_lowbit_tc_ok(w, n)) {
    // The block types' decode with int8 x (gemv_kquant.h), x quantised into the activation scratch.
    if (impl_ && is_kquant(w.type) && kquant_int8_on() && kquant_q8_ok(w, n) &&
        impl_->ws_bytes >= kCublasWorkspaceBytes + kquant_q8_ws_bytes(n, w.cols))
      return gemv_kquant_q8(w, x, n, y, bias, accumulate, impl_->ws + kCublasWorkspaceBytes,
                            impl_->ws_bytes - kCublasWorkspaceBytes, stream);
    return gemv(w, x, n, y, bias, accumulate, stream);
  }
  if (!impl_ || w.rows <= 0 || w.cols <= 0 || !w.data) return cudaErrorInvalidValue;
  if (lowbit && fp8_gemm_on() && lowbit_scale_per_row_or_tensor(w) &&
      (w.scale_row_stride == 0 || w.scale_row_stride == 1) && w.cols % 16 == 0 && w.row_bytes % 16 == 0) {
    // W8A8: x quantised per row to E4M3 (scale max |x| / 448), the FP8 GEMM with the weights' and x's
    // scales as cuBLASLt scale vectors (outer product), f32 output. cuBLASLt (13.1, H200) takes the two
    // scales both as vectors or both as scalars, and no bias epilogue with an f32 output: a scale per tensor
    // is repeated once per row (at the end of the workspace), and the bias added by a kernel after. Where
    // cuBLASLt has no algorithm, the BF16 copy below.
    const size_t qbytes = round_up((size_t)n * (size_t)w.cols, 256);
    const size_t xsbytes = round_up((size_t)n * sizeof(float), 256);
    const size_t asbytes = w.scale_row_stride == 0 ? round_up((size_t)w.rows * sizeof(float), 256) : 0;
    if (impl_->ws_bytes >= kCublasWorkspaceBytes + qbytes + xsbytes + asbytes) {
      uint8_t* xq = impl_->ws + kCublasWorkspaceBytes;
      float* xs = reinterpret_cast<float*>(xq + qbytes);
      const float* as = w.scale;
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      Impl::Plan* p = impl_->plan(w.type, w.rows, w.cols, (int64_t)w.row_bytes, n, false,
                                  alignment_of(w.data), alignment_of(xq), alignment_of(y), &st, 2);
      if (!p) last_status_ = (int)st;  // no plan: the BF16 copy
      if (p && p->ok) {
        if (asbytes) {
          float* rep = reinterpret_cast<float*>(impl_->ws + (impl_->ws_bytes - asbytes) / 256 * 256);
          repeat_scale_kernel<<<(unsigned)((w.rows + 255) / 256), 256, 0, stream>>>(w.scale, w.rows, rep);
          as = rep;
        }
        quantize_rows_e4m3_kernel<<<n, 256, 0, stream>>>(x, (int)w.cols, xq, xs);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
        const void* sa = as;
        const void* sb = xs;
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
        const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
        if (st == CUBLAS_STATUS_SUCCESS)
          st = cublasLtMatmul(impl_->lt, p->op, &alpha, w.data, p->a, xq, p->b, &beta, y, p->c, y, p->c,
                              &p->algo, impl_->ws, kCublasWorkspaceBytes, stream);
        if (st != CUBLAS_STATUS_SUCCESS) {
          last_status_ = (int)st;
          return cudaErrorUnknown;
        }
        if (bias) {
          const int64_t total = (int64_t)n * w.rows;
          add_bias_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(y, bias, w.rows, total);
        }
        return cudaGetLastError();
      }
    }
  }
  if (lowbit) {
    // Dequantise to BF16 into the end of the workspace (above the converted activations), then the BF16
    // path: the tensor-core gemv up to kGemvMaxRows rows, cuBLASLt above (whose fallback, with no cuBLASLt
    // algorithm, runs gemv on the BF16 copy).
    const int64_t ld = lowbit_bf16_ld(w.cols);
    const size_t wbytes = round_up((size_t)w.rows * (size_t)ld * 2, 256);
    const size_t xbytes = round_up((size_t)n * (size_t)w.cols * 2, 256);
    if (impl_->ws_bytes < kCublasWorkspaceBytes + xbytes + wbytes) return cudaErrorInvalidValue;
    uint8_t* wdq = impl_->ws + (impl_->ws_bytes - wbytes) / 256 * 256;
    if (cudaError_t e = lowbit_dequant_bf16(w, wdq, stream); e != cudaSuccess) return e;
    WeightView b = w;
    b.type = GgmlType::BF16;
    b.data = wdq;
    b.row_bytes = (size_t)ld * 2;
    b.scale = nullptr;
    b.scale_group = b.scale_row_stride = 0;
    return matmul(b, x, n, y, bias, accumulate, stream);
  }
  const int64_t esize = dense_elem_bytes(w.type);
  if (esize == 0) return cudaErrorInvalidValue;
  if ((int64_t)w.row_bytes % esize != 0 || (int64_t)w.row_bytes < w.cols * esize)
    return cudaErrorInvalidValue;
  const int64_t ld = (int64_t)w.row_bytes / esize;

  // Activations in the weight type (BF16 / F16) into the workspace; f32 weights take x as is.
  const void* b = x;
  if (w.type != GgmlType::F32) {
    const size_t need = (size_t)n * (size_t)w.cols * 2;
    if (impl_->ws_bytes < kCublasWorkspaceBytes + need) return cudaErrorInvalidValue;
    void* xc = impl_->ws + kCublasWorkspaceBytes;
    if (cudaError_t e = convert_f32(x, (int64_t)n * w.cols, w.type, xc, stream); e != cudaSuccess) return e;
    b = xc;
  }

  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  Impl::Plan* p = impl_->plan(w.type, w.rows, w.cols, ld, n, bias != nullptr, alignment_of(w.data),
                              alignment_of(b), alignment_of(y), &st);
  if (!p) {
    last_status_ = (int)st;
    return cudaErrorUnknown;
  }
  if (!p->ok) {  // no cuBLASLt algorithm for this shape / alignment: gemv, 32 rows at a time
    for (int t0 = 0; t0 < n; t0 += kGemvMaxRows) {
      const int nt = n - t0 < kGemvMaxRows ? n - t0 : kGemvMaxRows;
      if (cudaError_t e =
              gemv(w, x + (int64_t)t0 * w.cols, nt, y + (int64_t)t0 * w.rows, bias, accumulate, stream);
          e != cudaSuccess)
        return e;
    }
    return cudaSuccess;
  }
  if (bias) {
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    if (st != CUBLAS_STATUS_SUCCESS) {
      last_status_ = (int)st;
      return cudaErrorUnknown;
    }
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  st = cublasLtMatmul(impl_->lt, p->op, &alpha, w.data, p->a, b, p->b, &beta, y, p->c, y, p->c, &p->algo,
                      impl_->ws, kCublasWorkspaceBytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    last_status_ = (int)st;
    return cudaErrorUnknown;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
