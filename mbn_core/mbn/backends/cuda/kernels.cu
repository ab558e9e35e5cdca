// The CUDA backend's own kernels (mbn_core/mbn/backends/cuda/kernels.py compiles them with
// NVRTC through CuPy). Each has an array-code reference in arrays.py that the tests run with
// numpy and that stands in when NVRTC cannot build them. The splitmix64 constants come from
// mbn_core/mbn/keep_hash.py as #defines prepended at compile time.
// No standard headers: NVRTC does not always find them.
#define LOWEST_INT (-2147483647 - 1)
#define HIGHEST_INT 2147483647

// BEGIN splitmix64 (compiled alone by the tests with the host's C compiler)
__device__ __forceinline__ unsigned long long splitmix64(
    unsigned long long seed, unsigned long long key)
{
    unsigned long long z = key * SPLITMIX_GOLDEN;
    z += seed;
    z = (z ^ (z >> SPLITMIX_SHIFT1)) * SPLITMIX_MIX1;
    z = (z ^ (z >> SPLITMIX_SHIFT2)) * SPLITMIX_MIX2;
    return z ^ (z >> SPLITMIX_SHIFT3);
}
// END splitmix64

extern "C" __global__ void count_kept_shared(
    const int* __restrict__ stored, const long long* __restrict__ centers,
    const unsigned long long* __restrict__ seeds, const unsigned long long threshold,
    const int keep_all, const long long* __restrict__ indptr, const int* __restrict__ rows,
    const int n_previous, const int n_values, const int k, const long long n_dimensions,
    const int row_start, const int row_stop, const int columns, int* __restrict__ counts)
{
    // Thread t: dimension (v, code) of center j of the group's clustering g, t = (g * k + j)
    // * n_previous + v; kept when splitmix64(seed_g, key) falls below the threshold, as
    // arrays.center_lists. Then the warp walks each of its kept lists together: every
    // point on it shares one more kept code with that center, column g * k + j.
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    bool kept = false;
    long long begin = 0;
    int length = 0, column = 0;
    if (t < n_dimensions) {
        const long long pair = t / n_previous;
        const int v = (int)(t - pair * n_previous);
        const long long key = (long long)v * n_values + stored[centers[pair] * n_previous + v];
        kept = keep_all != 0;
        if (!kept) {
            kept = splitmix64(seeds[pair / k], (unsigned long long)key) < threshold;
        }
        if (kept) {
            begin = indptr[key];
            length = (int)(indptr[key + 1] - begin);
            column = (int)pair;
            kept = length > 0;
        }
    }
    unsigned int todo = __ballot_sync(0xffffffffu, kept);
    while (todo) {
        const int source = __ffs(todo) - 1;
        todo &= todo - 1;
        const long long list_begin = __shfl_sync(0xffffffffu, begin, source);
        const int list_length = __shfl_sync(0xffffffffu, length, source);
        const int list_column = __shfl_sync(0xffffffffu, column, source);
        for (int p = lane; p < list_length; p += 32) {
            const int i = rows[list_begin + p];
            if (i >= row_start && i < row_stop) {
                atomicAdd(&counts[(long long)(i - row_start) * columns + list_column], 1);
            }
        }
    }
}

// The first maximum of a warp's (value, index) pairs: larger value, then lower index.
__device__ __forceinline__ void warp_first_max(int& top, int& where)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        const int other_top = __shfl_down_sync(0xffffffffu, top, offset);
        const int other_where = __shfl_down_sync(0xffffffffu, where, offset);
        if (other_top > top || (other_top == top && other_where < where)) {
            top = other_top;
            where = other_where;
        }
    }
}

extern "C" __global__ void centred_first_best(
    const float* __restrict__ dots, const int* __restrict__ sq_norms, const long long n_rows,
    const int k, int* __restrict__ best)
{
    // One warp per row: 2 x.w - |w|^2 of each center, exact in int32 (the dots are whole
    // numbers), read once; the first maximum, as arrays.first_best_centred.
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    const float* d = dots + row * k;
    int top = LOWEST_INT, where = HIGHEST_INT;
    for (int j = lane; j < k; j += 32) {
        const int score = 2 * __float2int_rz(d[j]) - sq_norms[j];
        if (score > top) { top = score; where = j; }
    }
    warp_first_max(top, where);
    if (lane == 0) best[row] = where;
}

extern "C" __global__ void first_max_per_segment(
    const int* __restrict__ values, const long long n_segments, const int k,
    int* __restrict__ best)
{
    // One warp per run of k values (a row's counts in one clustering): the first maximum,
    // as arrays.upper_block_codes.
    const long long segment = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (segment >= n_segments) return;
    const int* v = values + segment * k;
    int top = LOWEST_INT, where = HIGHEST_INT;
    for (int j = lane; j < k; j += 32) {
        const int value = v[j];
        if (value > top) { top = value; where = j; }
    }
    warp_first_max(top, where);
    if (lane == 0) best[segment] = where;
}
