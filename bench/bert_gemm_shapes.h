// The GEMMs of BERT training that bench_matmul's packed/ rows (Ember's packed GEMM, oneDNN 2.6)
// and bench_gemm_libs (MKL, a current oneDNN) time, so that both programs run the same list and
// name each row the same way: <prefix>/<layout>/<impl>/<shape>/<threads>.
//
//   fwd           X W^T     (trans_b)   M = tokens, K = in, N = out
//   dgrad         dY W      (none)      M = tokens, K = out, N = in
//   wgrad         dY^T X    (trans_a)   M = out, K = tokens, N = in
// for 2048 tokens through 256->1024, 1024->256 (bert-mini's FFN), 768->3072, 3072->768
// (bert-base) and the MLM decoder 256->30522; two threads for bert-base and the decoder only.
//   attn_scores   Q K^T     (trans_b)   per head: 128 x 64 x 128
//   attn_context  P V       (none)      per head: 128 x 128 x 64
//   attn_dv       P^T dO    (trans_a)   per head: 128 x 128 x 64
// batched over 64 heads (bert-mini: 16 sequences of 128 tokens, 4 heads of 64), at 1 and 2 threads.
// Shape names are MxKxN, prefixed by "<batch>x" for batched products.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bench {

struct BertGemm {
  const char* layout;
  int64_t batch, m, k, n;
  bool trans_a, trans_b;
  int threads;
};

inline std::vector<BertGemm> bert_gemms() {
  struct Layer {
    int64_t in, out;
  };
  const Layer layers[] = {{256, 1024}, {1024, 256}, {768, 3072}, {3072, 768}, {256, 30522}};
  constexpr int64_t kTokens = 2048;
  struct Layout {
    const char* name;
    bool trans_a, trans_b;
  };
  const Layout layouts[] = {{"fwd", false, true}, {"dgrad", false, false}, {"wgrad", true, false}};
  constexpr int64_t kHeads = 64, kSeq = 128, kHeadDim = 64;
  std::vector<BertGemm> gemms;
  for (int threads : {1, 2}) {
    for (const Layer& l : layers)
      for (const Layout& lay : layouts) {
        if (threads == 2 && l.in != 768 && l.out != 30522) continue;
        // fwd: [tokens, in] x [in, out]; dgrad: [tokens, out] x [out, in]; wgrad: [out, tokens] x [tokens, in]
        const int64_t m = lay.trans_a ? l.out : kTokens;
        const int64_t k = lay.trans_a ? kTokens : lay.trans_b ? l.in : l.out;
        const int64_t n = lay.trans_b ? l.out : l.in;
        gemms.push_back({lay.name, 1, m, k, n, lay.trans_a, lay.trans_b, threads});
      }
    gemms.push_back({"attn_scores", kHeads, kSeq, kHeadDim, kSeq, false, true, threads});
    gemms.push_back({"attn_context", kHeads, kSeq, kSeq, kHeadDim, false, false, threads});
    gemms.push_back({"attn_dv", kHeads, kSeq, kSeq, kHeadDim, true, false, threads});
  }
  return gemms;
}

inline std::string bert_gemm_shape(const BertGemm& g) {
  std::string s = g.batch > 1 ? std::to_string(g.batch) + "x" : "";
  return s + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n);
}

inline std::string bert_gemm_row_name(const char* prefix, const BertGemm& g, const char* impl) {
  return std::string(prefix) + "/" + g.layout + "/" + impl + "/" + bert_gemm_shape(g) +
         (g.threads == 1 ? "/1thread" : "/2threads");
}

inline double bert_gemm_flops(const BertGemm& g) {
  return 2.0 * double(g.batch) * double(g.m) * double(g.k) * double(g.n);
}

}  // namespace bench
