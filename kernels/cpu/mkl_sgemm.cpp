#include "kernels/cpu/mkl_sgemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace ember::cpu {
namespace {

// The C interface of MKL's runtime library (mkl_cblas.h, mkl_service.h), declared here so that
// nothing of MKL is needed to build Ember.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS_LAYOUT, CBLAS_TRANSPOSE
constexpr int kThreadingSequential = 1;                       // MKL_THREADING_SEQUENTIAL
constexpr int kInterfaceLp64 = 0;                             // MKL_INTERFACE_LP64
using SgemmFn = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);
using SetLayerFn = int (*)(int code);
using VersionStringFn = void (*)(char* buffer, int length);

struct MklLibrary {
  SgemmFn sgemm = nullptr;
  MklStatus status;
};

MklLibrary open_library(const std::string& path) {
  MklLibrary lib;
  lib.status.library = path;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    lib.status.problem = "cannot load " + path + ": " + (why ? why : "unknown error");
    return lib;
  }
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
  auto set_threading = reinterpret_cast<SetLayerFn>(dlsym(handle, "MKL_Set_Threading_Layer"));
  auto set_interface = reinterpret_cast<SetLayerFn>(dlsym(handle, "MKL_Set_Interface_Layer"));
  auto version = reinterpret_cast<VersionStringFn>(dlsym(handle, "MKL_Get_Version_String"));
  if (!sgemm || !set_threading || !set_interface || !version) {
    lib.status.problem = path + " is not MKL's runtime library (no cblas_sgemm, MKL_Set_Threading_Layer, "
                                "MKL_Set_Interface_Layer or MKL_Get_Version_String)";
    dlclose(handle);
    return lib;
  }
  // Before any computation: MKL fixes its layers at the first call.
  if (set_interface(kInterfaceLp64) != kInterfaceLp64 || set_threading(kThreadingSequential) != kThreadingSequential) {
    lib.status.problem = path + " refused MKL's sequential threading layer or LP64 interface (set already?)";
    return lib;  // left open: a library that has run cannot be unloaded safely
  }
  char text[256] = {};
  version(text, int(sizeof text) - 1);
  lib.status.version = text;
  lib.status.loaded = true;
  lib.sgemm = sgemm;
  return lib;
}

std::vector<std::string> places_to_look() {
  const char* chosen = std::getenv("EMBER_MKL_LIBRARY");
  if (chosen && *chosen) return {chosen};
  std::vector<std::string> places;
  if (const char* libs = std::getenv("EMBER_BENCH_LIBS"); libs && *libs)
    places.push_back(std::string(libs) + "/lib/libmkl_rt.so.3");
  else if (const char* home = std::getenv("HOME"); home && *home)
    places.push_back(std::string(home) + "/.cache/ember-bench-libs/lib/libmkl_rt.so.3");
  for (const char* name : {"libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"}) places.push_back(name);
  return places;
}

const MklLibrary& library() {
  static const MklLibrary lib = [] {
    const std::vector<std::string> places = places_to_look();
    if (places.size() == 1 && places[0] == "none") {
      MklLibrary off;
      off.status.library = "none";
      off.status.problem = "EMBER_MKL_LIBRARY=none";
      return off;
    }
    std::string tried, problems;
    for (const std::string& place : places) {
      MklLibrary lib = open_library(place);
      if (lib.status.loaded) return lib;
      tried += (tried.empty() ? "" : ", ") + place;
      problems += (problems.empty() ? "" : "; ") + lib.status.problem;
    }
    MklLibrary none;
    none.status.library = tried;
    none.status.problem = problems;
    return none;
  }();
  return lib;
}

}  // namespace

const MklStatus& mkl_status() { return library().status; }

MklStatus probe_mkl_library(const std::string& path) { return open_library(path).status; }

void mkl_sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const MklLibrary& lib = library();
  EMBER_CHECK(lib.status.loaded, "gemm: MKL's sgemm was asked for (EMBER_F32_GEMM=mkl) but MKL is not loaded: ",
              lib.status.problem, " (install it with scripts/install_bench_libs.sh or set EMBER_MKL_LIBRARY)");
  for (int64_t v : {m, n, k, lda, ldb, ldc})
    EMBER_CHECK(v <= INT_MAX, "gemm: MKL's sgemm takes 32-bit sizes and strides; got m=", m, " n=", n, " k=", k,
                " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  // MKL reports bad strides by printing a message and returning: check them here instead.
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  EMBER_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
                  ldc >= std::max<int64_t>(1, n),
              "gemm: row strides too small for MKL's sgemm: lda=", lda, " ldb=", ldb, " ldc=", ldc, " for m=", m,
              " n=", n, " k=", k, " trans_a=", trans_a, " trans_b=", trans_b);
  lib.sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, int(m), int(n), int(k), alpha, a,
            int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace ember::cpu
