// GEMM: our own tiled shared-memory SGEMM, and cuBLASLt in FP32, TF32, FP16 and BF16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

#ifndef GPUHOST_NO_CUBLAS
#include <cublasLt.h>
#endif

namespace gh {
namespace {

int gemm_size(const Options& options, bool shrink_when_quick) {
    // 8192^3 is what the reference figures were measured at and is large enough for cuBLAS
    // to reach its peak on an H100; smaller cards get a size whose operands fit.
    int size = options.quick && shrink_when_quick ? 4096 : 8192;
    while (size > 1024 && 4.0 * 4.0 * size * static_cast<double>(size) > 0.5 * static_cast<double>(options.total_mem)) {
        size /= 2;
    }
    return size;
}

// ---------------------------------------------------------------- our SGEMM
// C (M x N, column-major) = A * B^T with A stored M x K and B stored N x K, both
// column-major (the NT layout): a K-slice of either operand is contiguous along M or N, so
// tiles go from global to shared memory by 16-byte cp.async copies with no transpose.
//
// Block tile 128 x 128 x BK, 256 threads, each thread an 8 x 8 sub-tile taken as two 4-row
// and two 4-column groups 64 apart, so a warp's float4 reads of shared memory cover 256
// contiguous bytes (no bank conflicts) or one broadcast address. STAGES tiles are in flight
// (cp.async groups) while the current one is multiplied.
constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kGemmThreads = 256;

__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int BK, int STAGES>
__global__ void __launch_bounds__(kGemmThreads, 2)
    sgemm_nt_kernel(int M, int N, int K, const float* __restrict__ A, const float* __restrict__ B,
                    float* __restrict__ C) {
    extern __shared__ float4 shared4[];
    float* shared = reinterpret_cast<float*>(shared4);
    float* As = shared;                          // [STAGES][BK][kBM]
    float* Bs = shared + STAGES * BK * kBM;      // [STAGES][BK][kBN]
    const int tid = threadIdx.x;
    const int tx = tid % 16;
    const int ty = tid / 16;
    const int m0 = blockIdx.y * kBM;
    const int n0 = blockIdx.x * kBN;
    const float* a_tile = A + m0;
    const float* b_tile = B + n0;

    auto load_tile = [&](int stage, int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int l = 0; l < BK / 8; ++l) {
            const int index = tid + l * kGemmThreads;  // BK rows of 32 float4 each
            const int row = index / 32;
            const int col = (index % 32) * 4;
            cp_async16(As + (stage * BK + row) * kBM + col, a_tile + static_cast<size_t>(k0 + row) * M + col);
            cp_async16(Bs + (stage * BK + row) * kBN + col, b_tile + static_cast<size_t>(k0 + row) * N + col);
        }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    const int tiles = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) load_tile(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < tiles; ++kt) {
        // Tile kt has landed once all but the newest STAGES-2 groups are complete; the
        // barrier also means every thread is done with the stage refilled below.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < tiles) load_tile(next % STAGES, next);
        cp_async_commit();
        const float* as = As + (kt % STAGES) * BK * kBM;
        const float* bs = Bs + (kt % STAGES) * BK * kBN;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            const float4 a_lo = *reinterpret_cast<const float4*>(as + k * kBM + tx * 4);
            const float4 a_hi = *reinterpret_cast<const float4*>(as + k * kBM + 64 + tx * 4);
            const float4 b_lo = *reinterpret_cast<const float4*>(bs + k * kBN + ty * 4);
            const float4 b_hi = *reinterpret_cast<const float4*>(bs + k * kBN + 64 + ty * 4);
            const float a[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
            const float b[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();

    // Column-major C: four consecutive rows of one column are one 16-byte store.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int n = n0 + (j < 4 ? ty * 4 + j : 64 + ty * 4 + (j - 4));
        float* column = C + static_cast<size_t>(n) * M + m0;
        *reinterpret_cast<float4*>(column + tx * 4) = make_float4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
        *reinterpret_cast<float4*>(column + 64 + tx * 4) = make_float4(acc[4][j], acc[5][j], acc[6][j], acc[7][j]);
    }
}

struct SgemmVariant {
    std::string name;
    std::function<void(cudaStream_t)> launch;
};

template <int BK, int STAGES>
SgemmVariant sgemm_variant(int M, int N, int K, const float* A, const float* B, float* C) {
    const int shared_bytes = STAGES * BK * (kBM + kBN) * static_cast<int>(sizeof(float));
    // Above 48 KB a block gets dynamic shared memory only after opting in.
    GH_CHECK(cudaFuncSetAttribute(sgemm_nt_kernel<BK, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  shared_bytes));
    const dim3 grid(N / kBN, M / kBM);
    return {"128x128x" + std::to_string(BK) + "-stages" + std::to_string(STAGES), [=](cudaStream_t stream) {
                sgemm_nt_kernel<BK, STAGES><<<grid, kGemmThreads, shared_bytes, stream>>>(M, N, K, A, B, C);
                GH_CHECK_LAUNCH();
            }};
}

}  // namespace

void bench_sgemm(const Options& options, const Emit& emit) {
    const int size = gemm_size(options, true);
    const int M = size, N = size, K = size;
    const uint32_t seed = options.seed * 13 + 3;
    DeviceBuffer<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(N) * K), C(static_cast<size_t>(M) * N);
    fill_uniform(A.ptr, A.count, seed, -1.0f, 1.0f);
    fill_uniform(B.ptr, B.count, seed + 1, -1.0f, 1.0f);
    std::vector<SgemmVariant> variants = {
        sgemm_variant<8, 4>(M, N, K, A.ptr, B.ptr, C.ptr),
        sgemm_variant<16, 3>(M, N, K, A.ptr, B.ptr, C.ptr),
        sgemm_variant<16, 4>(M, N, K, A.ptr, B.ptr, C.ptr),
    };
    const double flops = 2.0 * M * N * static_cast<double>(K);
    std::vector<std::string> tried;
    const SgemmVariant* best = nullptr;
    double best_ms = INFINITY;
    std::string failure;
    for (const auto& variant : variants) {
        poison(C.ptr, C.bytes());
        variant.launch(0);
        const unsigned long long bad = count_nonfinite(C.ptr, C.count, Element::F32);
        const double error = gemm_sample_error(A.ptr, B.ptr, C.ptr, Element::F32, Layout::NT, M, N, K, seed);
        if (bad != 0 || !(error < 1e-4)) {
            failure += variant.name + ": " + std::to_string(bad) + " unwritten, sample error " + json_number(error) + "; ";
            continue;
        }
        const Timing timing = time_events(variant.launch, 1, 3, 0);
        tried.push_back(Json().str("variant", variant.name).num("TFLOPs", flops / (timing.median_ms() * 1e9)).text());
        if (timing.median_ms() < best_ms) {
            best_ms = timing.median_ms();
            best = &variant;
        }
    }
    Result r;
    r.name = "sgemm";
    r.unit = "TFLOP/s";
    r.params.integer("m", M).integer("n", N).integer("k", K).str("layout", "NT column-major").str("data", "uniform [-1,1)");
    if (best != nullptr) {
        poison(C.ptr, C.bytes());
        best->launch(0);
        const unsigned long long bad = count_nonfinite(C.ptr, C.count, Element::F32);
        r.error = gemm_sample_error(A.ptr, B.ptr, C.ptr, Element::F32, Layout::NT, M, N, K, seed);
        r.verified = bad == 0 && r.error < 1e-4 && failure.empty();
        r.timing = time_events(best->launch, 2, options.quick ? 5 : 10, 0);
        r.value = flops / (r.timing.median_ms() * 1e9);
        r.extra.str("best_variant", best->name);
    } else {
        r.value = NAN;
        r.error = INFINITY;
    }
    r.check_detail = failure.empty() ? "no NaN left in C; 128 sampled entries vs host double: rel. error < 1e-4"
                                     : failure;
    r.extra.raw("variants", json_array(tried));
    emit(std::move(r));
}

// ---------------------------------------------------------------- cuBLASLt
#ifdef GPUHOST_NO_CUBLAS
void bench_cublas(const Options&, const Emit&) {
    throw CudaFailure("built without cuBLAS (headers or libraries were not found at build time)");
}
#else
namespace {

void lt_check(cublasStatus_t status, const char* what, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        throw CudaFailure(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(status)) +
                          " at gemm.cu:" + std::to_string(line));
    }
}
#define LT_CHECK(call) lt_check((call), #call, __LINE__)

template <class T>
__global__ void convert_kernel(const float* in, T* out, size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        out[i] = static_cast<T>(in[i]);
    }
}

struct GemmType {
    std::string name;      // result name
    Element element;       // storage of A, B and C
    cudaDataType_t data;   // the same, as cuBLAS names it
    cublasComputeType_t compute;
    Layout layout;
    double tolerance;      // on ||C - ref|| / ||ref||
    std::string peak;      // which datasheet peak this is compared against
};

void run_lt(const Options& options, const Emit& emit, cublasLtHandle_t handle, void* workspace,
            size_t workspace_bytes, const GemmType& type) {
    // A BF16 8192^3 product takes ~1.4 ms on an H100: cheap enough to keep full size in --quick.
    const int size = gemm_size(options, false);
    const int M = size, N = size, K = size;
    const uint32_t seed = options.seed * 19 + static_cast<uint32_t>(type.compute) * 7 + static_cast<uint32_t>(type.data);
    const size_t element_bytes = type.element == Element::F32 ? 4 : 2;
    const size_t a_count = static_cast<size_t>(M) * K, b_count = static_cast<size_t>(N) * K,
                 c_count = static_cast<size_t>(M) * N;
    DeviceBuffer<unsigned char> A(a_count * element_bytes), B(b_count * element_bytes), C(c_count * element_bytes);
    {
        // Random operands (all-zero matrices run ~13% faster on an H100, flattering the figure).
        DeviceBuffer<float> staging(std::max(a_count, b_count));
        for (int operand = 0; operand < 2; ++operand) {
            const size_t count = operand == 0 ? a_count : b_count;
            void* target = operand == 0 ? static_cast<void*>(A.ptr) : static_cast<void*>(B.ptr);
            fill_uniform(staging.ptr, count, seed + operand, -1.0f, 1.0f);
            if (type.element == Element::F32) {
                GH_CHECK(cudaMemcpy(target, staging.ptr, count * 4, cudaMemcpyDeviceToDevice));
            } else if (type.element == Element::F16) {
                convert_kernel<<<4096, 256>>>(staging.ptr, static_cast<__half*>(target), count);
            } else {
                convert_kernel<<<4096, 256>>>(staging.ptr, static_cast<__nv_bfloat16*>(target), count);
            }
            GH_CHECK_LAUNCH();
        }
        GH_CHECK(cudaDeviceSynchronize());
    }

    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    LT_CHECK(cublasLtMatmulDescCreate(&desc, type.compute, CUDA_R_32F));
    const cublasOperation_t op_a = type.layout == Layout::NT ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op_b = type.layout == Layout::NT ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (type.layout == Layout::NT) {
        LT_CHECK(cublasLtMatrixLayoutCreate(&a_layout, type.data, M, K, M));
        LT_CHECK(cublasLtMatrixLayoutCreate(&b_layout, type.data, N, K, N));
    } else {
        LT_CHECK(cublasLtMatrixLayoutCreate(&a_layout, type.data, K, M, K));
        LT_CHECK(cublasLtMatrixLayoutCreate(&b_layout, type.data, K, N, K));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&c_layout, type.data, M, N, M));
    LT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof(workspace_bytes)));
    constexpr int kMaxAlgos = 8;
    cublasLtMatmulHeuristicResult_t heuristics[kMaxAlgos] = {};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, a_layout, b_layout, c_layout, c_layout, preference,
                                            type.element == Element::F32 ? 4 : kMaxAlgos, heuristics, &found));
    const float alpha = 1.0f, beta = 0.0f;
    auto launcher = [&](int index) {
        return [&, index](cudaStream_t stream) {
            LT_CHECK(cublasLtMatmul(handle, desc, &alpha, A.ptr, a_layout, B.ptr, b_layout, &beta, C.ptr, c_layout,
                                    C.ptr, c_layout, &heuristics[index].algo, workspace, workspace_bytes, stream));
        };
    };
    const double flops = 2.0 * M * N * static_cast<double>(K);
    // cuBLAS's first choice is not always its fastest at a given size: time the candidates
    // it offers briefly and keep the fastest, as frameworks' autotuners do.
    int best = -1;
    double best_ms = INFINITY;
    std::vector<std::string> tried;
    const bool slow = type.element == Element::F32 && type.compute != CUBLAS_COMPUTE_32F_FAST_TF32;
    for (int i = 0; i < found; ++i) {
        if (heuristics[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const Timing t = time_events(launcher(i), 1, slow ? 3 : 5, 0);
        tried.push_back(Json().integer("heuristic_rank", i).num("TFLOPs", flops / (t.median_ms() * 1e9)).text());
        if (t.median_ms() < best_ms) {
            best_ms = t.median_ms();
            best = i;
        }
    }
    Result r;
    r.name = type.name;
    r.unit = "TFLOP/s";
    r.params.integer("m", M).integer("n", N).integer("k", K)
        .str("layout", type.layout == Layout::NT ? "NT column-major" : "TN column-major (K-major operands)")
        .str("data", "uniform [-1,1)")
        .str("peak", type.peak)
        .integer("workspace_bytes", static_cast<long long>(workspace_bytes));
    if (best < 0) {
        r.value = NAN;
        r.error = INFINITY;
        r.check_detail = "cuBLASLt offered no algorithm";
    } else {
        poison(C.ptr, C.bytes());
        launcher(best)(0);
        const unsigned long long bad = count_nonfinite(C.ptr, c_count, type.element);
        r.error = gemm_sample_error(A.ptr, B.ptr, C.ptr, type.element, type.layout, M, N, K, seed);
        r.verified = bad == 0 && r.error < type.tolerance;
        r.check_detail = "no NaN left in C (" + std::to_string(bad) + " found); 128 sampled entries vs host double: " +
                         "rel. error < " + json_number(type.tolerance);
        r.timing = time_events(launcher(best), 3, slow ? 8 : 20, 0);
        r.value = flops / (r.timing.median_ms() * 1e9);
        r.extra.integer("heuristic_rank", best);
    }
    r.extra.raw("candidates", json_array(tried));
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(c_layout);
    cublasLtMatrixLayoutDestroy(b_layout);
    cublasLtMatrixLayoutDestroy(a_layout);
    cublasLtMatmulDescDestroy(desc);
    emit(std::move(r));
}

}  // namespace

void bench_cublas(const Options& options, const Emit& emit) {
    cublasLtHandle_t handle = nullptr;
    LT_CHECK(cublasLtCreate(&handle));
    const size_t workspace_bytes = size_t{32} << 20;
    DeviceBuffer<unsigned char> workspace(workspace_bytes);
    // FP32 without tensor cores uses the same NT layout as our SGEMM, so the two compare
    // like for like; the tensor-core types use K-major operands, their native layout.
    std::vector<GemmType> types = {
        {"cublas_bf16", Element::BF16, CUDA_R_16BF, CUBLAS_COMPUTE_32F, Layout::TN, 1e-2, "bf16_dense"},
        {"cublas_fp16", Element::F16, CUDA_R_16F, CUBLAS_COMPUTE_32F, Layout::TN, 5e-3, "fp16_dense"},
        {"cublas_tf32", Element::F32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, Layout::TN, 2e-3, "tf32_dense"},
        {"cublas_fp32", Element::F32, CUDA_R_32F, CUBLAS_COMPUTE_32F, Layout::NT, 1e-4, "fp32"},
    };
    if (options.quick) types.resize(1);  // BF16 is the figure that matters most for training
    std::string failures;
    for (const auto& type : types) {
        try {
            run_lt(options, emit, handle, workspace.ptr, workspace_bytes, type);
        } catch (const CudaFailure& error) {
            failures += type.name + ": " + error.what() + "; ";
        }
    }
    cublasLtDestroy(handle);
    if (!failures.empty()) throw CudaFailure(failures);
}
#endif

}  // namespace gh
