// probe_sm_rates: how fast each SM streams from HBM when every SM streams
// at once, for three ways of moving bytes (a diagnostic for the decode
// attention kernel's per-SM spread; docs/benchmarks.md, session 28).
//
// Each CTA (one per SM: its shared memory allows no second) reads its own
// 1,024 pieces of 4 KB at random 4 KB-aligned places of a 2 GB buffer (no
// piece read twice in a pass), as a paged KV cache is read. 12 warps, each
// with a ring of two 8 KB slots, stream the CTA's pieces (warp w: pieces w,
// w + 12, ...):
//   mode 0 (ldg): 16-byte loads into registers, eight in flight a lane;
//   mode 1 (ldgsts): 16-byte cp.async into the ring, completion tracked by
//     the slot's mbarrier (cp.async.mbarrier.arrive.noinc, 32 arrivals);
//   mode 2 (bulk): cp.async.bulk of whole 4 KB pieces on the copy engine,
//     completion by the mbarrier's transaction count (what the tensor-core
//     decode kernel does).
// Three placements of a CTA's pieces (session 29: is the spread a matter
// of address translation?):
//   random: anywhere in the buffer, as above (a CTA's 1,024 pieces land
//     in ~650 of the buffer's 1,024 pages of 2 MB);
//   page: the pieces of two random 2 MB pages (2 MB-aligned), in random
//     order: the same 4 KB pieces at random places, but two pages a CTA;
//   contig: the same two pages' pieces in address order.
// Prints per placement, mode and grid (132 CTAs, and 128 as the decode
// kernel's batch-8 Llama-3 calls launch): the aggregate rate (bytes over
// the kernel's event time), the spread of the CTAs' times (min / median /
// max), and the SMs of the fastest eighth. Then the same 4 MB a CTA as
// bulk copies of 1, 2, 4 and 8 KB at random places (mode 2 with other
// piece sizes: does HBM serve larger pieces faster?). Exits 77 without a GPU.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "../nb_cuda_check.h"

constexpr int NW = 12, NT = NW * 32, PIECE = 4096, PER_CTA = 1024, SLOT = 2 * PIECE, NSLOT = 2;

__device__ __forceinline__ uint32_t su(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(uint64_t *b, uint32_t c) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(su(b)), "r"(c) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t *b, uint32_t par) {
    asm volatile("{\n .reg .pred P1;\n W1:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 " @P1 bra D1;\n bra W1;\n D1:\n}\n" ::"r"(su(b)),
                 "r"(par)
                 : "memory");
}

// `piece` bytes a piece (4 KB; mode 2 also 1-8 KB: a slot of 8 KB holds
// 8 KB / piece of them), 4 MB a CTA whatever the piece size.
template <int MODE>
__global__ void __launch_bounds__(NT, 1) probe(const uint8_t *buf, const uint32_t *pieces, int piece,
                                               unsigned long long *rec, uint32_t *sink) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint64_t *bars = (uint64_t *)sm;
    uint8_t *ring = sm + 1024;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t *wb = bars + warp * NSLOT;
    uint8_t *wr = ring + (size_t)warp * NSLOT * SLOT;
    const int per_slot = SLOT / piece, per_cta = PER_CTA * PIECE / piece;
    const uint32_t *pc = pieces + (size_t)blockIdx.x * per_cta;
    if (lane == 0)
        for (int s = 0; s < NSLOT; s++) bar_init(wb + s, MODE == 1 ? 32 : 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    uint32_t acc = 0;
    const int nmine = (per_cta - warp + NW - 1) / NW;     // pieces of this warp
    const int nsteps = (nmine + per_slot - 1) / per_slot; // per_slot pieces a slot
    auto issue = [&](int step, int slot) {
        uint8_t *dst = wr + slot * SLOT;
        const int k0 = step * per_slot, n = min(per_slot, nmine - k0);
        if (MODE == 2 && lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(su(wb + slot)),
                         "r"(n * piece)
                         : "memory");
        for (int h = 0; h < n; h++) {
            const uint8_t *src = buf + (size_t)pc[warp + (k0 + h) * NW] * piece;
            if (MODE == 1) {
                for (int i = lane; i < piece / 16; i += 32)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(su(dst + h * piece + 16 * i)),
                                 "l"(src + 16 * i)
                                 : "memory");
            } else if (lane == 0) {
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                                 su(dst + h * piece)),
                             "l"(src), "r"(piece), "r"(su(wb + slot))
                             : "memory");
            }
        }
        if (MODE == 1)
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(su(wb + slot)) : "memory");
    };
    if (MODE == 0) {
        for (int k = 0; k < nmine; k++) {
            const uint4 *src = (const uint4 *)(buf + (size_t)pc[warp + k * NW] * piece);
            uint4 v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __ldcs(src + lane + 32 * i); // piece = PIECE: 8 x 512 B
#pragma unroll
            for (int i = 0; i < 8; i++) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
        }
    } else {
        for (int s = 0; s < NSLOT && s < nsteps; s++) issue(s, s);
        for (int step = 0, slot = 0, par = 0; step < nsteps; step++) {
            bar_wait(wb + slot, par);
            acc ^= *(const uint32_t *)(wr + slot * SLOT + 4 * lane);
            __syncwarp();
            if (lane == 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (step + NSLOT < nsteps) issue(step + NSLOT, slot);
            if (++slot == NSLOT) {
                slot = 0;
                par ^= 1;
            }
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        rec[2 * blockIdx.x] = s;
        rec[2 * blockIdx.x + 1] = t1 - t0;
    }
}

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t buf_bytes = (size_t)2 << 30, n_pieces = buf_bytes / PIECE;
    uint8_t *buf;
    uint32_t *dpieces, *sink;
    unsigned long long *drec;
    CUDA_OK(cudaMalloc(&buf, buf_bytes));
    CUDA_OK(cudaMemset(buf, 0x3c, buf_bytes));
    CUDA_OK(cudaMalloc(&dpieces, sizeof(uint32_t) * sms * PER_CTA));
    CUDA_OK(cudaMalloc(&drec, sizeof(unsigned long long) * 2 * sms));
    CUDA_OK(cudaMalloc(&sink, 4));
    std::vector<uint32_t> perm(n_pieces);
    for (size_t i = 0; i < n_pieces; i++) perm[i] = (uint32_t)i;
    srand(7);
    const int smem = 1024 + NW * NSLOT * SLOT;
    void (*kern[3])(const uint8_t *, const uint32_t *, int, unsigned long long *, uint32_t *) = {probe<0>, probe<1>,
                                                                                               probe<2>};
    for (int m = 0; m < 3; m++) CUDA_OK(cudaFuncSetAttribute(kern[m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const char *names[3] = {"ldg (16 B loads to registers)", "ldgsts (16 B cp.async, mbarrier)",
                            "bulk (4 KB cp.async.bulk, mbarrier tx)"};
    printf("# %s, %d SMs; %d CTAs x %d pieces of %d B (random, page, contig), 12 warps x 2 slots of 8 KB\n", prop.name,
           sms, sms, PER_CTA, PIECE);
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    const int grids[2] = {sms, sms - 4};
    // One event-timed launch of probe kernel k over `grid` CTAs reading the
    // pieces at dp (piece bytes each); returns its ms and leaves each CTA's
    // (SM, us) record in h.
    auto timed = [&](void (*k)(const uint8_t *, const uint32_t *, int, unsigned long long *, uint32_t *), int grid,
                     const uint32_t *dp, int piece, std::vector<unsigned long long> &h) -> float {
        CUDA_OK(cudaEventRecord(e0));
        k<<<grid, NT, smem>>>(buf, dp, piece, drec, sink);
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaGetLastError());
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        h.resize(2 * (size_t)grid);
        CUDA_OK(cudaMemcpy(h.data(), drec, sizeof(unsigned long long) * 2 * grid, cudaMemcpyDeviceToHost));
        return ms;
    };
    const char *places[3] = {"random", "page", "contig"};
    constexpr size_t PAGE_PIECES = ((size_t)2 << 20) / PIECE, n_pages = ((size_t)2 << 30) / ((size_t)2 << 20);
    std::vector<uint32_t> pages(n_pages), placed((size_t)sms * PER_CTA);
    for (size_t i = 0; i < n_pages; i++) pages[i] = (uint32_t)i;
    for (int pl = 0; pl < 3; pl++)
    for (int gi = 0; gi < 2; gi++)
        for (int m = 0; m < 3; m++) {
            const int grid = grids[gi];
            std::vector<double> ms_all;
            std::vector<std::vector<double>> per_sm(sms);
            for (int pass = 0; pass < 6; pass++) {
                // fresh random pieces each pass (no L2 reuse across passes)
                if (pl == 0) {
                    for (size_t i = 0; i < (size_t)grid * PER_CTA; i++)
                        std::swap(perm[i], perm[i + rand() % (n_pieces - i)]);
                } else { // two distinct random pages a CTA
                    const size_t per = PER_CTA / PAGE_PIECES;
                    for (size_t i = 0; i < (size_t)grid * per; i++) std::swap(pages[i], pages[i + rand() % (n_pages - i)]);
                    for (int c = 0; c < grid; c++) {
                        uint32_t *pc = placed.data() + (size_t)c * PER_CTA;
                        for (size_t j = 0; j < (size_t)PER_CTA; j++)
                            pc[j] = (uint32_t)(pages[c * per + j / PAGE_PIECES] * PAGE_PIECES + j % PAGE_PIECES);
                        if (pl == 1)
                            for (size_t j = 0; j < (size_t)PER_CTA; j++)
                                std::swap(pc[j], pc[j + rand() % (PER_CTA - j)]);
                    }
                }
                CUDA_OK(cudaMemcpy(dpieces, pl == 0 ? perm.data() : placed.data(), sizeof(uint32_t) * grid * PER_CTA,
                                   cudaMemcpyHostToDevice));
                std::vector<unsigned long long> h;
                const float ms = timed(kern[m], grid, dpieces, PIECE, h);
                if (pass == 0) continue; // warm-up
                ms_all.push_back(ms);
                for (int c = 0; c < grid; c++)
                    if (h[2 * c] < (unsigned long long)sms) per_sm[h[2 * c]].push_back(h[2 * c + 1] / 1000.0);
            }
            std::sort(ms_all.begin(), ms_all.end());
            const double gbs = (double)grid * PER_CTA * PIECE / (ms_all[ms_all.size() / 2] * 1e-3) / 1e9;
            std::vector<std::pair<double, int>> med;
            for (int s = 0; s < sms; s++)
                if (!per_sm[s].empty()) {
                    std::sort(per_sm[s].begin(), per_sm[s].end());
                    med.push_back({per_sm[s][per_sm[s].size() / 2], s});
                }
            std::sort(med.begin(), med.end());
            printf("\n[%s] %s, %d CTAs: %.0f GB/s (kernel %.1f us median); CTA time us min %.1f / median %.1f / max %.1f "
                   "(max/min %.2f)\n  fastest eighth (sm:us):",
                   places[pl], names[m], grid, gbs, ms_all[ms_all.size() / 2] * 1e3, med.front().first,
                   med[med.size() / 2].first, med.back().first, med.back().first / med.front().first);
            for (size_t i = 0; i < med.size() / 8; i++) printf(" %d:%.0f", med[i].second, med[i].first);
            printf("\n  slowest eighth (sm:us):");
            for (size_t i = med.size() - med.size() / 8; i < med.size(); i++)
                printf(" %d:%.0f", med[i].second, med[i].first);
            printf("\n");
        }
    // Piece size (bulk copies, random places, 128 CTAs and all SMs).
    printf("\n# bulk copies by piece size, random places, 4 MB a CTA, 12 warps x 2 slots of 8 KB\n");
    const int sizes[4] = {1024, 2048, 4096, 8192};
    for (int si = 0; si < 4; si++)
        for (int gi = 0; gi < 2; gi++) {
            const int piece = sizes[si], grid = grids[gi];
            const size_t per_cta = (size_t)PER_CTA * PIECE / piece, n_p = buf_bytes / piece;
            std::vector<uint32_t> pp(n_p);
            for (size_t i = 0; i < n_p; i++) pp[i] = (uint32_t)i;
            uint32_t *dpp;
            CUDA_OK(cudaMalloc(&dpp, sizeof(uint32_t) * grid * per_cta));
            std::vector<double> ms_all, cta;
            for (int pass = 0; pass < 6; pass++) {
                for (size_t i = 0; i < (size_t)grid * per_cta; i++) std::swap(pp[i], pp[i + rand() % (n_p - i)]);
                CUDA_OK(cudaMemcpy(dpp, pp.data(), sizeof(uint32_t) * grid * per_cta, cudaMemcpyHostToDevice));
                std::vector<unsigned long long> h;
                const float ms = timed(kern[2], grid, dpp, piece, h);
                if (pass == 0) continue;
                ms_all.push_back(ms);
                for (int c = 0; c < grid; c++) cta.push_back(h[2 * c + 1] / 1000.0);
            }
            CUDA_OK(cudaFree(dpp));
            std::sort(ms_all.begin(), ms_all.end());
            std::sort(cta.begin(), cta.end());
            const double gbs = (double)grid * PER_CTA * PIECE / (ms_all[ms_all.size() / 2] * 1e-3) / 1e9;
            printf("%5d B pieces, %d CTAs: %.0f GB/s (kernel %.1f us median); CTA time us min %.1f / median %.1f / "
                   "max %.1f (max/min %.2f)\n",
                   piece, grid, gbs, ms_all[ms_all.size() / 2] * 1e3, cta.front(), cta[cta.size() / 2], cta.back(),
                   cta.back() / cta.front());
        }
    return 0;
}
