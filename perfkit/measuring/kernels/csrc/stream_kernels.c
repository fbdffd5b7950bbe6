// STREAM kernels (copy, scale, add, triad) over contiguous float64/float32 arrays, OpenMP-parallel,
// for perfkit's memory ceilings. Plain C with no torch or Python headers: it compiles in about a
// second (the torch extension it replaced took 25-55 s of g++ on 2 cores, on every new machine),
// and perfkit calls it through ctypes, which releases the GIL for the call
// (perfkit/measuring/kernels/stream.py checks devices, dtypes, sizes and layout before calling).
//
// Semantics follow McCalpin's stream.c (https://www.cs.virginia.edu/stream/FTP/Code/stream.c):
//   copy:  c[j] = a[j]             scale: b[j] = s * c[j]
//   add:   c[j] = a[j] + b[j]      triad: a[j] = b[j] + s * c[j]
// Bytes are counted by the caller with stream.c's convention (reads + writes, no write-allocate).
//
// Unlike stream.c, the repetition loop is *inside* the parallel region, as in the Empirical
// Roofline Toolkit's driver (Lo et al., "Roofline Model Toolkit", PMBS 2014): each thread sweeps
// its own contiguous chunk `reps` times, so a working set that fits one core's L1 or L2 stays
// there, and the cost of forking threads is paid once per call rather than once per sweep (at
// 16 KiB a sweep takes well under a microsecond, less than an OpenMP fork).
#include <omp.h>
#include <stdint.h>

// Chunk boundaries for thread t of nt, rounded to whole 64-byte cache lines so that two threads
// never write the same line (false sharing would show up as a bogus slowdown).
static inline void chunk(int64_t n, int64_t item, int t, int nt, int64_t* lo, int64_t* hi) {
  const int64_t line = 64 / item;
  int64_t per = (n + nt - 1) / nt;
  per = (per + line - 1) / line * line;
  *lo = per * t < n ? per * t : n;
  *hi = *lo + per < n ? *lo + per : n;
}

// Stops the compiler from merging or dropping repeated sweeps: every sweep of an idempotent
// kernel must really reach memory, as it would in a real program.
#define COMPILER_BARRIER() __asm__ __volatile__("" ::: "memory")

static int resolve_threads(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

// One kernel per (type, op): the op is fixed inside each function, so every inner loop is a
// plain vectorizable loop. Each thread copies the arguments into its own locals first: the
// parallel region's shared variables live in memory, which the barrier clobbers, so reading them
// there would reload them on every sweep (measured: 15-20 % slower at L1-sized working sets).
#define STREAM_KERNEL(NAME, T, BODY)                                                          \
  static void NAME(T* a_, T* b_, T* c_, T s_, int64_t n, int64_t reps, int nt) {              \
    _Pragma("omp parallel num_threads(nt)") {                                                 \
      T* restrict a = a_; T* restrict b = b_; T* restrict c = c_; const T s = s_;             \
      const int64_t sweeps = reps;                                                            \
      int64_t lo, hi;                                                                         \
      chunk(n, (int64_t)sizeof(T), omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);    \
      (void)a; (void)b; (void)c; (void)s;                                                     \
      for (int64_t r = 0; r < sweeps; ++r) {                                                  \
        _Pragma("omp simd") for (int64_t j = lo; j < hi; ++j) { BODY; }                       \
        COMPILER_BARRIER();                                                                   \
      }                                                                                       \
    }                                                                                         \
  }

STREAM_KERNEL(copy_f64, double, c[j] = a[j])
STREAM_KERNEL(scale_f64, double, b[j] = s * c[j])
STREAM_KERNEL(add_f64, double, c[j] = a[j] + b[j])
STREAM_KERNEL(triad_f64, double, a[j] = b[j] + s * c[j])
STREAM_KERNEL(copy_f32, float, c[j] = a[j])
STREAM_KERNEL(scale_f32, float, b[j] = s * c[j])
STREAM_KERNEL(add_f32, float, c[j] = a[j] + b[j])
STREAM_KERNEL(triad_f32, float, a[j] = b[j] + s * c[j])

// op: 0 copy, 1 scale, 2 add, 3 triad; dtype: 0 float64, 1 float32. Returns 0, or -1 for an op,
// dtype or count it does not take (the caller has checked them).
int perfkit_stream(int op, int dtype, void* a, void* b, void* c, double s, int64_t n, int64_t reps,
                   int threads) {
  const int nt = resolve_threads(threads);
  if (reps < 1 || n < 0) return -1;
  if (dtype == 0) {
    double *x = a, *y = b, *z = c;
    switch (op) {
      case 0: copy_f64(x, y, z, s, n, reps, nt); return 0;
      case 1: scale_f64(x, y, z, s, n, reps, nt); return 0;
      case 2: add_f64(x, y, z, s, n, reps, nt); return 0;
      case 3: triad_f64(x, y, z, s, n, reps, nt); return 0;
    }
  } else if (dtype == 1) {
    float *x = a, *y = b, *z = c;
    const float sf = (float)s;
    switch (op) {
      case 0: copy_f32(x, y, z, sf, n, reps, nt); return 0;
      case 1: scale_f32(x, y, z, sf, n, reps, nt); return 0;
      case 2: add_f32(x, y, z, sf, n, reps, nt); return 0;
      case 3: triad_f32(x, y, z, sf, n, reps, nt); return 0;
    }
  }
  return -1;
}

// Fill x with v using the same thread/chunk mapping as the kernels, so that on a NUMA machine
// each page is first touched (and placed) by the thread that will stream it.
int perfkit_first_touch(int dtype, void* x, double v, int64_t n, int threads) {
  const int nt = resolve_threads(threads);
  if (dtype != 0 && dtype != 1) return -1;
#pragma omp parallel num_threads(nt)
  {
    int64_t lo, hi;
    if (dtype == 0) {
      chunk(n, 8, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
      for (int64_t j = lo; j < hi; ++j) ((double*)x)[j] = v;
    } else {
      chunk(n, 4, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
      for (int64_t j = lo; j < hi; ++j) ((float*)x)[j] = (float)v;
    }
  }
  return 0;
}

// OpenMP's default team size.
int perfkit_max_threads(void) { return omp_get_max_threads(); }
