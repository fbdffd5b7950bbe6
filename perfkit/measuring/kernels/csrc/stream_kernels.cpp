// STREAM kernels (copy, scale, add, triad) on CPU tensors, OpenMP-parallel, for perfkit.ceilings.
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
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace {

// Chunk boundaries for thread t of nt, rounded to whole 64-byte cache lines so that two threads
// never write the same line (false sharing would show up as a bogus slowdown).
template <typename T>
inline void chunk(int64_t n, int t, int nt, int64_t* lo, int64_t* hi) {
  const int64_t line = 64 / static_cast<int64_t>(sizeof(T));
  int64_t per = (n + nt - 1) / nt;
  per = (per + line - 1) / line * line;
  *lo = std::min<int64_t>(n, per * t);
  *hi = std::min<int64_t>(n, *lo + per);
}

// Stops the compiler from merging or dropping repeated sweeps: every sweep of an idempotent
// kernel must really reach memory, as it would in a real program.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

int resolve_threads(int64_t threads) {
  return threads > 0 ? static_cast<int>(threads) : omp_get_max_threads();
}

void check(const at::Tensor& x, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.scalar_type() == ref.scalar_type(), name, " has dtype ", x.scalar_type(),
              ", expected ", ref.scalar_type());
  TORCH_CHECK(x.numel() == ref.numel(), name, " has ", x.numel(), " elements, expected ",
              ref.numel());
}

// Op: 0 copy, 1 scale, 2 add, 3 triad. Pointers follow stream.c's names a, b, c.
template <typename T, int Op>
void run(T* __restrict__ a, T* __restrict__ b, T* __restrict__ c, T s, int64_t n, int64_t reps,
         int nt) {
#pragma omp parallel num_threads(nt)
  {
    int64_t lo, hi;
    chunk<T>(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
    for (int64_t r = 0; r < reps; ++r) {
      if (Op == 0) {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) c[j] = a[j];
      } else if (Op == 1) {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) b[j] = s * c[j];
      } else if (Op == 2) {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) c[j] = a[j] + b[j];
      } else {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) a[j] = b[j] + s * c[j];
      }
      compiler_barrier();
    }
  }
}

template <int Op>
void dispatch(at::Tensor a, at::Tensor b, at::Tensor c, double s, int64_t reps, int64_t threads) {
  check(a, a, "a");
  check(b, a, "b");
  check(c, a, "c");
  TORCH_CHECK(reps >= 1, "reps must be >= 1");
  const int nt = resolve_threads(threads);
  const int64_t n = a.numel();
  if (a.scalar_type() == at::kDouble) {
    run<double, Op>(a.data_ptr<double>(), b.data_ptr<double>(), c.data_ptr<double>(), s, n, reps,
                    nt);
  } else if (a.scalar_type() == at::kFloat) {
    run<float, Op>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                   static_cast<float>(s), n, reps, nt);
  } else {
    TORCH_CHECK(false, "STREAM kernels support float64 and float32, got ", a.scalar_type());
  }
}

// Fill x with v using the same thread/chunk mapping as the kernels, so that on a NUMA machine
// each page is first touched (and placed) by the thread that will stream it.
void first_touch(at::Tensor x, double v, int64_t threads) {
  check(x, x, "x");
  const int nt = resolve_threads(threads);
  const int64_t n = x.numel();
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
#pragma omp parallel num_threads(nt)
    {
      int64_t lo, hi;
      chunk<T>(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
      for (int64_t j = lo; j < hi; ++j) p[j] = static_cast<T>(v);
    }
  };
  if (x.scalar_type() == at::kDouble) {
    fill(x.data_ptr<double>());
  } else if (x.scalar_type() == at::kFloat) {
    fill(x.data_ptr<float>());
  } else {
    TORCH_CHECK(false, "first_touch supports float64 and float32, got ", x.scalar_type());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "STREAM copy/scale/add/triad with OpenMP, repetitions inside the parallel region";
  namespace py = pybind11;
  // The kernels touch only tensor memory the caller keeps alive: let other Python threads run.
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("copy", &dispatch<0>, "c = a, reps times", py::arg("a"), py::arg("b"), py::arg("c"),
        py::arg("scalar"), py::arg("reps"), py::arg("threads"), nogil);
  m.def("scale", &dispatch<1>, "b = scalar * c, reps times", py::arg("a"), py::arg("b"),
        py::arg("c"), py::arg("scalar"), py::arg("reps"), py::arg("threads"), nogil);
  m.def("add", &dispatch<2>, "c = a + b, reps times", py::arg("a"), py::arg("b"), py::arg("c"),
        py::arg("scalar"), py::arg("reps"), py::arg("threads"), nogil);
  m.def("triad", &dispatch<3>, "a = b + scalar * c, reps times", py::arg("a"), py::arg("b"),
        py::arg("c"), py::arg("scalar"), py::arg("reps"), py::arg("threads"), nogil);
  m.def("first_touch", &first_touch, "fill x with v, chunked as the kernels", py::arg("x"),
        py::arg("v"), py::arg("threads"));
  m.def("max_threads", []() { return omp_get_max_threads(); }, "OpenMP's default team size");
}
