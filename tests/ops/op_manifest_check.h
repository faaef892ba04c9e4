// The completeness check of the op manifest (core/native/op_manifest.def), as a function of
// the manifest and of what it is checked against, so that a test can feed it an incomplete
// entry and see it named. Each problem is one line that starts with the op, stub or group.
//
// The file-name rule it checks (README.md, "Where an op lives"): an op group G has
// core/native/G.h and G.cpp, kernels/reference/G.h and G.cpp, autograd/functions/G.cpp and
// tests/ops/test_G.cpp or test_G_<part>.cpp; the files that register its kernels are
// kernels/cpu/G.cpp or G_<part>.cpp and kernels/cuda/G.cu or G_<part>.cu.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/native/op_manifest.h"

namespace ember::testing {

// The source tree as the check reads it: file text by repository-relative path (nullopt when
// there is no such file), and the file names in a directory.
struct SourceTree {
  std::function<std::optional<std::string>(const std::string& path)> read;
  std::function<std::vector<std::string>(const std::string& dir)> list;
};

inline SourceTree repository_tree(const std::string& root) {
  namespace fs = std::filesystem;
  SourceTree tree;
  tree.read = [root](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(fs::path(root) / path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  tree.list = [root](const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::path(root) / dir, ec))
      if (e.is_regular_file()) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  return tree;
}

struct ManifestEvidence {
  std::map<std::string, native::StubRegistration> registered;  // native::registered_kernels()
  bool cuda_build = false;                                     // CUDA registrations are checked
  std::set<std::string> gradcheck_cases;                       // ops with a gradcheck case
  std::map<std::string, std::string> recorded_backward;        // op -> node its case's result records
  SourceTree tree;
};

namespace manifest_detail {

inline bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
inline bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
// G<ext> or G_<part><ext>
inline bool follows_group_rule(const std::string& file, const std::string& group, const std::string& ext) {
  return file == group + ext ||
         (starts_with(file, group + "_") && ends_with(file, ext) && file.size() > group.size() + 1 + ext.size());
}

// stub -> the core/native header that declares it
inline std::map<std::string, std::string> declared_stubs(const SourceTree& tree) {
  static const std::regex decl(R"(EMBER_DECLARE_STUB\(\s*(\w+))");
  std::map<std::string, std::string> out;
  for (const std::string& name : tree.list("core/native")) {
    if (!ends_with(name, ".h")) continue;
    const std::string path = "core/native/" + name;
    const std::string text = tree.read(path).value_or("");
    for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it) out[(*it)[1]] = path;
  }
  return out;
}

// The functions core/ops.h declares (operators excluded: they are spelled with the named ops).
inline std::set<std::string> public_ops(const SourceTree& tree) {
  static const std::regex decl(R"(^(?:Tensor|std::vector<Tensor>|std::pair<Tensor, Tensor>)\s+(\w+)\()");
  std::set<std::string> out;
  std::istringstream in(tree.read("core/ops.h").value_or(""));
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, decl)) out.insert(m[1]);
  return out;
}

inline bool mentions(const std::optional<std::string>& text, const std::string& what) {
  return text && text->find(what) != std::string::npos;
}

// The checks on one kernel file: named by the rule, and registering the stub for the device.
inline void check_kernel_file(std::vector<std::string>& problems, const SourceTree& tree, const native::KernelEntry& k,
                              const std::string& dir, const std::string& file, const std::string& ext,
                              const std::string& device) {
  const std::string where = "kernel " + k.stub + ": ";
  const std::string path = dir + "/" + file;
  if (!follows_group_rule(file, k.group, ext))
    problems.push_back(where + path + " does not follow the file-name rule (" + k.group + ext + " or " + k.group +
                       "_<part>" + ext + ")");
  const auto text = tree.read(path);
  if (!text)
    problems.push_back(where + "no file " + path);
  else if (!mentions(text, "EMBER_REGISTER_KERNEL(native::" + k.stub + ", " + device))
    problems.push_back(where + path + " does not register its " + device + " kernel");
}

}  // namespace manifest_detail

// Every way in which the manifest and the library or the source tree disagree; empty when the
// manifest is complete.
inline std::vector<std::string> manifest_problems(const std::vector<native::KernelEntry>& kernels,
                                                  const std::vector<native::OpEntry>& ops, const ManifestEvidence& ev) {
  using namespace manifest_detail;
  std::vector<std::string> problems;
  const auto declared = declared_stubs(ev.tree);
  std::map<std::string, native::StubRegistration> listed;  // the stubs the manifest names
  std::set<std::string> cpu_only;  // stubs whose manifest line gives no CUDA file, with a reason

  for (const native::KernelEntry& k : kernels) {
    const std::string where = "kernel " + k.stub + ": ";
    const auto reg_it = ev.registered.find(k.stub);
    const native::StubRegistration reg = reg_it == ev.registered.end() ? native::StubRegistration{} : reg_it->second;
    listed[k.stub] = reg;
    if (k.cuda_file.empty() && !k.one_device_reason.empty()) cpu_only.insert(k.stub);

    const auto decl = declared.find(k.stub);
    if (decl == declared.end())
      problems.push_back(where + "not declared (EMBER_DECLARE_STUB) in core/native");
    else if (decl->second != "core/native/" + k.group + ".h")
      problems.push_back(where + "declared in " + decl->second + ", not in core/native/" + k.group + ".h");

    if (k.cpu_file.empty() && k.cuda_file.empty()) problems.push_back(where + "names no kernel file for any device");
    if ((k.cpu_file.empty() || k.cuda_file.empty()) && k.one_device_reason.empty())
      problems.push_back(where + "has a kernel for one device only and no reason why");

    if (!k.cpu_file.empty()) {
      check_kernel_file(problems, ev.tree, k, "kernels/cpu", k.cpu_file, ".cpp", "CPU");
      if (!reg.cpu) problems.push_back(where + "no CPU kernel registered");
    } else if (reg.cpu) {
      problems.push_back(where + "a CPU kernel is registered, but the manifest names no CPU file");
    }
    if (!k.cuda_file.empty()) {
      check_kernel_file(problems, ev.tree, k, "kernels/cuda", k.cuda_file, ".cu", "CUDA");
      if (ev.cuda_build && !reg.cuda) problems.push_back(where + "no CUDA kernel registered in this CUDA build");
    } else if (reg.cuda) {
      problems.push_back(where + "a CUDA kernel is registered, but the manifest says CPU only: " + k.one_device_reason);
    }
  }
  for (const auto& [stub, header] : declared)
    if (!listed.count(stub)) problems.push_back("stub " + stub + " (" + header + ") is not in the manifest");

  const auto declared_ops = public_ops(ev.tree);
  std::set<std::string> listed_ops, groups;
  for (const native::OpEntry& op : ops) {
    const std::string where = "op " + op.name + ": ";
    listed_ops.insert(op.name);
    groups.insert(op.group);
    if (!declared_ops.count(op.name)) problems.push_back(where + "not declared in core/ops.h");

    for (const std::string& stub : op.stubs) {
      const auto it = listed.find(stub);
      if (it == listed.end()) {
        problems.push_back(where + "stub " + stub + " is not among the manifest's kernels");
        continue;
      }
      if (!it->second.cpu) problems.push_back(where + "stub " + stub + " has no CPU kernel registered");
      if (ev.cuda_build && !it->second.cuda && !cpu_only.count(stub))
        problems.push_back(where + "stub " + stub + " has no CUDA kernel registered");
    }

    const std::string ref_header = "kernels/reference/" + op.group + ".h";
    if (op.reference.empty())
      problems.push_back(where + "no reference");
    else if (!mentions(ev.tree.read(ref_header), " " + op.reference + "("))
      problems.push_back(where + "no reference " + op.reference + " in " + ref_header);

    const auto functions = ev.tree.read("autograd/functions/" + op.group + ".cpp");
    if (!mentions(functions, "Tensor " + op.name + "(") && !mentions(functions, "Tensor> " + op.name + "("))
      problems.push_back(where + "autograd/functions/" + op.group + ".cpp does not define it");

    if (op.backward.empty()) {
      problems.push_back(where + "no backward named (kNotDifferentiable when it has none)");
    } else if (op.differentiable()) {
      if (!ev.gradcheck_cases.count(op.name)) problems.push_back(where + "differentiable, but has no gradcheck case");
      const auto rec = ev.recorded_backward.find(op.name);
      if (rec != ev.recorded_backward.end() && rec->second != op.backward)
        problems.push_back(where + "its result records " + (rec->second.empty() ? "no backward node" : rec->second) +
                           ", the manifest says " + op.backward);
    }
  }
  for (const std::string& name : declared_ops)
    if (!listed_ops.count(name)) problems.push_back("op " + name + ": declared in core/ops.h, but not in the manifest");

  for (const std::string& g : groups) {
    const std::string where = "group " + g + ": ";
    for (const std::string& path :
         {"core/native/" + g + ".h", "core/native/" + g + ".cpp", "kernels/reference/" + g + ".h",
          "kernels/reference/" + g + ".cpp", "autograd/functions/" + g + ".cpp"})
      if (!ev.tree.read(path)) problems.push_back(where + "no file " + path + " (the file-name rule)");
    const auto tests = ev.tree.list("tests/ops");
    const bool tested = std::any_of(tests.begin(), tests.end(),
                                    [&](const std::string& f) { return follows_group_rule(f, "test_" + g, ".cpp"); });
    if (!tested) problems.push_back(where + "no tests/ops/test_" + g + ".cpp or test_" + g + "_<part>.cpp");
  }
  return problems;
}

}  // namespace ember::testing
