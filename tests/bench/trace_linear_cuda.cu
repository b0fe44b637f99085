// trace_linear_cuda.cu: where the time of a chain of quantized-linear
// launches goes. Builds linear_cuda.cu with its timeline hooks
// (NB_WQ_TRACE: lane 0 of every warp records %globaltimer at numbered
// points), replays a CUDA graph of L launches of one shape (weights rotated
// over L copies, or as many as fill 200 MB, so that no launch finds its
// weights in L2, as in bench_linear_cuda) and prints, per
// launch, when its blocks started, were released by griddepcontrol.wait,
// finished their group sums and exited, relative to the first launch's
// first block. A diagnostic for the decode kernel's launch overlap, not a
// benchmark: the hooks cost a timer read and a store per warp and point.
//
// Usage: trace_linear_cuda M K N MODE [L [VARIANT [BPS]]]
//   MODE: auto (the built-in choice), nopdl, tile (the tile kernel), 1sm
//   (decode kernel, one block per SM). 4-bit view, f16 x and out. VARIANT:
//   the decode kernel's variant (nb_cuda_matmul_wq_set_gemv_variant; -1, the
//   default: the built-in choice); BPS:
//   its grid sized for that many blocks per SM (0: all resident).
// Points: 0 entry, 1 weights requested (before the wait), 2 after the wait,
// 3 group sums done, 4 a tile's last item consumed, 5 exit.
#define NB_WQ_TRACE 1
#include "../../kernels/linear_cuda.cu"

#include <algorithm>
#include <vector>

#include "wq_bench_util.cuh"

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: trace_linear_cuda M K N auto|nopdl|tile|1sm [L [VARIANT [BPS]]]\n");
        return 2;
    }
    const int m = atoi(argv[1]), k = atoi(argv[2]), n = atoi(argv[3]);
    const char *mode = argv[4];
    const int L = argc > 5 ? atoi(argv[5]) : 16;
    if (m <= 0 || k <= 0 || k % 128 || n < 1 || n > 16 || L < 2 || L > kTrL) {
        fprintf(stderr, "trace_linear_cuda: need M > 0, K %% 128 == 0, 1 <= N <= 16, 2 <= L <= %d\n",
                kTrL);
        return 2;
    }
    if (strcmp(mode, "auto") && strcmp(mode, "nopdl") && strcmp(mode, "tile") && strcmp(mode, "1sm")) {
        fprintf(stderr, "trace_linear_cuda: MODE is auto, nopdl, tile or 1sm, not %s\n", mode);
        return 2;
    }
    const int nvar = nb_cuda_matmul_wq_set_gemv_variant(-1);
    const int var = argc > 6 ? atoi(argv[6]) : -1, bps = argc > 7 ? atoi(argv[7]) : 0;
    if (argc > 8 || var < -1 || var >= nvar || bps < 0 || bps > 8) {
        fprintf(stderr, "trace_linear_cuda: VARIANT is -1 (built in) or 0..%d, BPS 0..8 (0: all resident)\n",
                nvar - 1);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("trace_linear_cuda: SKIP: no CUDA device\n");
        return 77;
    }
    nb_cuda_matmul_wq_set_pdl(strcmp(mode, "nopdl") ? 1 : 0);
    nb_cuda_matmul_wq_set_decode_kernel(strcmp(mode, "tile") ? 1 : 0);
    nb_cuda_matmul_wq_set_blocks_per_sm(strcmp(mode, "1sm") ? 0 : 1);
    nb_cuda_matmul_wq_set_gemv_variant(var);
    if (argc > 7) nb_cuda_matmul_wq_set_blocks_per_sm(bps);

    const size_t plane = nb_cuda_wq_plane_bytes(m, k), ngr = (size_t)m * k / 128;
    const size_t per_copy = plane + 4 * ngr;
    int copies = (int)((200u << 20) / per_copy) + 1;
    if (copies > L) copies = L;
    std::vector<nb_cuda_wq> w(copies);
    const size_t nsz = nb_cuda_wq_sz_elems(m, k);
    for (int c = 0; c < copies; c++) {
        uint8_t *u, *sz;
        CUDA_OK(cudaMalloc(&u, plane));
        CUDA_OK(cudaMalloc(&sz, 2 * nsz));
        fill(u, plane, 0, 11 + c);
        fill(sz, nsz, 2, 23 + c);
        w[c] = {u, nullptr, (const uint16_t *)sz};
    }
    uint8_t *x;
    CUDA_OK(cudaMalloc(&x, (size_t)n * k * 2));
    fill(x, (size_t)n * k, 1, 5);
    std::vector<void *> out(L);
    for (int i = 0; i < L; i++) CUDA_OK(cudaMalloc(&out[i], (size_t)n * m * 2 + 256));
    CUDA_OK(cudaDeviceSynchronize());

    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto launch = [&](int i) {
        if (nb_cuda_matmul_wq(out[i], NB_DTYPE_F16, x, NB_DTYPE_F16, &w[i % copies], 0, NULL,
                              NB_DTYPE_F32, n, m, k, NULL, 0, s) != NB_OK) {
            fprintf(stderr, "trace_linear_cuda: launch failed\n");
            exit(1);
        }
    };
    launch(0);
    CUDA_OK(cudaStreamSynchronize(s));
    // Set before capture: the launches look their slot up on the host.
    for (int i = 0; i < L; i++) nb_wq_trace_outs[i] = out[i];
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < L; i++) launch(i);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    static unsigned long long host[kTrL][kTrB][kWarps][kTrP];
    memset(host, 0, sizeof host);
    CUDA_OK(cudaMemcpyToSymbol(nb_wq_trace_buf, host, sizeof host));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaEventRecord(e1, s));
    CUDA_OK(cudaStreamSynchronize(s));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_OK(cudaMemcpyFromSymbol(host, nb_wq_trace_buf, sizeof host));

    // Per launch and point: min and max time; blocks and SMs seen.
    const int P = kTrP;
    std::vector<unsigned long long> lo((size_t)L * P, ~0ull), hi((size_t)L * P, 0);
    std::vector<int> nrec((size_t)L * P, 0);
    unsigned long long t0 = ~0ull;
    unsigned cnt = 0;
    for (int li = 0; li < L; li++)
        for (int bk = 0; bk < kTrB; bk++)
            for (int wp = 0; wp < kWarps; wp++)
                for (int pt = 0; pt < P; pt++) {
                    const unsigned long long t = host[li][bk][wp][pt];
                    if (!t) continue;
                    cnt++;
                    lo[li * P + pt] = std::min(lo[li * P + pt], t);
                    hi[li * P + pt] = std::max(hi[li * P + pt], t);
                    nrec[li * P + pt]++;
                    t0 = std::min(t0, t);
                }
    printf("trace %s: %d x %d, n = %d, %d launches: %.2f us per launch by events; %u records\n",
           mode, m, k, n, L, 1000.0 * ms / L, cnt);
    printf("times in us from the first record; per point: first..last warp%s\n",
           (m + 15) / 16 > kTrB ? " (blocks past 1024 are not recorded)" : "");
    printf("| launch | entry            | requested        | released         | sums done        "
           "| tile done        | exit             |\n");
    printf("|--------|------------------|------------------|------------------|------------------"
           "|------------------|------------------|\n");
    for (int li = 0; li < L; li++) {
        printf("| %6d |", li);
        for (int pt = 0; pt < P; pt++) {
            if (!nrec[li * P + pt]) {
                printf(" %16s |", "-");
                continue;
            }
            printf(" %7.2f..%7.2f |", (lo[li * P + pt] - t0) / 1000.0,
                   (hi[li * P + pt] - t0) / 1000.0);
        }
        printf("\n");
    }
    const int a = L / 2, b = L - 1;
    if (nrec[b * P + 5] && nrec[a * P + 5])
        printf("steady period (last exits, launches %d..%d): %.2f us\n", a, b,
               (hi[b * P + 5] - hi[a * P + 5]) / 1000.0 / (b - a));
    return 0;
}
