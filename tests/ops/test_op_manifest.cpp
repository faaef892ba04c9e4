// The op manifest (core/native/op_manifest.def) against the library and the source tree: every
// public op and every dispatch stub is listed, each listed stub has the kernels and files the
// manifest names, each op a reference and, when differentiable, a gradcheck that passes; and
// the check itself names an op that lacks one of these.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/native/op_manifest.h"
#include "op_gradcheck_cases.h"
#include "op_manifest_check.h"
#include "test_util.h"

namespace {

using namespace ember;
using ember::native::kernel_manifest;
using ember::native::KernelEntry;
using ember::native::op_manifest;
using ember::native::OpEntry;
using ember::testing::manifest_problems;
using ember::testing::ManifestEvidence;

#ifdef EMBER_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// The node each case's first result records, as the library runs it now.
std::map<std::string, std::string> recorded_backward() {
  std::map<std::string, std::string> out;
  for (auto& [name, c] : ember::testing::op_gradcheck_cases()) {
    const std::vector<Tensor> results = c.fn(c.inputs);
    const auto& node = results.at(0).grad_fn();
    out[name] = node ? node->name() : "";
  }
  return out;
}

ManifestEvidence real_evidence() {
  ManifestEvidence ev;
  ev.registered = native::registered_kernels();
  ev.cuda_build = kCudaBuild;
  for (const auto& [name, c] : ember::testing::op_gradcheck_cases()) ev.gradcheck_cases.insert(name);
  ev.recorded_backward = recorded_backward();
  ev.tree = ember::testing::repository_tree(EMBER_SOURCE_DIR);
  return ev;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "  " + l + "\n";
  return s;
}

bool has_problem(const std::vector<std::string>& problems, const std::string& text) {
  return std::find(problems.begin(), problems.end(), text) != problems.end();
}

TEST(OpManifest, EveryOpAndStubIsCompleteAndFollowsTheFileRule) {
  const auto problems = manifest_problems(kernel_manifest(), op_manifest(), real_evidence());
  EXPECT_TRUE(problems.empty()) << problems.size() << " problem(s):\n" << joined(problems);
}

TEST(OpManifest, GradcheckPassesForEveryDifferentiableOp) {
  auto cases = ember::testing::op_gradcheck_cases();
  int checked = 0;
  for (const OpEntry& op : op_manifest()) {
    if (!op.differentiable()) continue;
    const auto it = cases.find(op.name);
    ASSERT_NE(it, cases.end()) << op.name << " has no gradcheck case";
    SCOPED_TRACE(op.name);
    const GradcheckResult r = gradcheck(it->second.fn, it->second.inputs);
    EXPECT_TRUE(r.ok) << op.name << ": " << r.message;
    ++checked;
  }
  EXPECT_GE(checked, 40);  // the manifest's differentiable ops, not a vacuous loop
}

TEST(OpManifest, NamesAnOpWithoutCpuKernelReferenceOrGradcheck) {
  std::vector<KernelEntry> kernels = kernel_manifest();
  std::vector<OpEntry> ops = op_manifest();
  kernels.push_back({"fake_stub", "elementwise", "elementwise_fake.cpp", "elementwise_fake.cu", ""});
  ops.push_back({"fake_op", "elementwise", {"fake_stub"}, "", "FakeBackward"});
  const auto problems = manifest_problems(kernels, ops, real_evidence());
  SCOPED_TRACE(joined(problems));
  EXPECT_TRUE(has_problem(problems, "kernel fake_stub: no CPU kernel registered"));
  EXPECT_TRUE(has_problem(problems, "kernel fake_stub: not declared (EMBER_DECLARE_STUB) in core/native"));
  EXPECT_TRUE(has_problem(problems, "kernel fake_stub: no file kernels/cpu/elementwise_fake.cpp"));
  EXPECT_TRUE(has_problem(problems, "op fake_op: stub fake_stub has no CPU kernel registered"));
  EXPECT_TRUE(has_problem(problems, "op fake_op: no reference"));
  EXPECT_TRUE(has_problem(problems, "op fake_op: differentiable, but has no gradcheck case"));
  EXPECT_TRUE(has_problem(problems, "op fake_op: not declared in core/ops.h"));
  EXPECT_TRUE(has_problem(problems, "op fake_op: autograd/functions/elementwise.cpp does not define it"));
  // Only the fake entries are at fault.
  for (const std::string& p : problems) EXPECT_NE(p.find("fake_"), std::string::npos) << p;
}

TEST(OpManifest, NamesAPublicOpOrStubMissingFromIt) {
  std::vector<KernelEntry> kernels = kernel_manifest();
  std::vector<OpEntry> ops = op_manifest();
  std::erase_if(ops, [](const OpEntry& op) { return op.name == "log_softmax"; });
  std::erase_if(kernels, [](const KernelEntry& k) { return k.stub == "one_hot_stub"; });
  const auto problems = manifest_problems(kernels, ops, real_evidence());
  SCOPED_TRACE(joined(problems));
  EXPECT_TRUE(has_problem(problems, "op log_softmax: declared in core/ops.h, but not in the manifest"));
  EXPECT_TRUE(has_problem(problems, "stub one_hot_stub (core/native/indexing.h) is not in the manifest"));
  EXPECT_TRUE(has_problem(problems, "op one_hot: stub one_hot_stub is not among the manifest's kernels"));
}

TEST(OpManifest, NamesAWrongClaim) {
  std::vector<KernelEntry> kernels = kernel_manifest();
  std::vector<OpEntry> ops = op_manifest();
  for (KernelEntry& k : kernels) {
    if (k.stub == "softmax_stub") k.cpu_file = "softmax.cpp";                   // against the file-name rule
    if (k.stub == "layer_norm_stub") k.cpu_file = "normalization_softmax.cpp";  // registers no layer_norm
    if (k.stub == "matmul_stub") k.cuda_file = "";                              // CPU only without a reason
  }
  for (OpEntry& op : ops) {
    if (op.name == "exp") op.backward = "LogBackward";
    if (op.name == "tanh") op.reference = "tan";
  }
  const auto problems = manifest_problems(kernels, ops, real_evidence());
  SCOPED_TRACE(joined(problems));
  EXPECT_TRUE(has_problem(problems,
                          "kernel softmax_stub: kernels/cpu/softmax.cpp does not follow the file-name rule "
                          "(normalization.cpp or normalization_<part>.cpp)"));
  EXPECT_TRUE(has_problem(problems, "kernel softmax_stub: no file kernels/cpu/softmax.cpp"));
  EXPECT_TRUE(has_problem(
      problems, "kernel layer_norm_stub: kernels/cpu/normalization_softmax.cpp does not register its CPU kernel"));
  EXPECT_TRUE(has_problem(problems, "kernel matmul_stub: has a kernel for one device only and no reason why"));
  EXPECT_TRUE(has_problem(problems, "op exp: its result records ExpBackward, the manifest says LogBackward"));
  EXPECT_TRUE(has_problem(problems, "op tanh: no reference tan in kernels/reference/elementwise.h"));
  if (kCudaBuild) {
    EXPECT_TRUE(
        has_problem(problems, "kernel matmul_stub: a CUDA kernel is registered, but the manifest says CPU only: "));
  }
}

TEST(OpManifest, NamesAStubWhoseClaimedCudaKernelIsNotRegistered) {
  ManifestEvidence ev = real_evidence();
  ev.cuda_build = true;  // as a CUDA build checks it, whatever this build is
  ev.registered["matmul_stub"].cuda = false;
  const auto problems = manifest_problems(kernel_manifest(), op_manifest(), ev);
  SCOPED_TRACE(joined(problems));
  EXPECT_TRUE(has_problem(problems, "kernel matmul_stub: no CUDA kernel registered in this CUDA build"));
  EXPECT_TRUE(has_problem(problems, "op matmul: stub matmul_stub has no CUDA kernel registered"));
}

TEST(OpManifest, AcceptsAnOpWhoseStubIsCpuOnlyForAStatedReason) {
  ManifestEvidence ev = real_evidence();
  ev.cuda_build = true;
  auto kernels = kernel_manifest();
  for (auto& k : kernels)
    if (k.stub == "matmul_stub") {
      k.cuda_file = "";
      k.one_device_reason = "the CUDA kernel comes with another backend";
    }
  ev.registered["matmul_stub"].cuda = false;
  const auto problems = manifest_problems(kernels, op_manifest(), ev);
  SCOPED_TRACE(joined(problems));
  for (const std::string& p : problems) EXPECT_EQ(p.find("matmul"), std::string::npos) << p;
}

}  // namespace
