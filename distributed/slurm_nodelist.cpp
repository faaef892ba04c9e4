#include "distributed/slurm_nodelist.h"

#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace ember::distributed {

namespace {

// A job is never this large; the bound keeps a typo such as "[0-999999999]" from eating memory.
constexpr uint64_t kMaxHosts = 1000000;

[[noreturn]] void bad_list(const std::string& variable, const std::string& value, const std::string& why) {
  EMBER_FAIL(variable, "='", value, "' is not a Slurm host list: ", why);
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

uint64_t parse_bound(const std::string& digits, const std::string& variable, const std::string& value) {
  uint64_t out = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
  if (ec != std::errc() || ptr != digits.data() + digits.size())
    bad_list(variable, value, "the number '" + digits + "' is too large");
  return out;
}

std::string padded(uint64_t n, size_t width) {
  std::string s = std::to_string(n);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "01-04,07" -> {"01", "02", "03", "04", "07"}.
std::vector<std::string> expand_group(const std::string& group, const std::string& variable,
                                      const std::string& value) {
  std::vector<std::string> out;
  if (group.empty()) bad_list(variable, value, "'[]' holds no numbers");
  size_t start = 0;
  while (true) {
    const size_t comma = group.find(',', start);
    const std::string range = group.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      bad_list(variable, value, "'" + range + "' inside '[" + group + "]' is not a number or a range N-M");
    const uint64_t a = parse_bound(lo, variable, value);
    const uint64_t b = parse_bound(hi, variable, value);
    if (b < a) bad_list(variable, value, "the range '" + range + "' runs backwards");
    if (b - a >= kMaxHosts || out.size() + (b - a + 1) > kMaxHosts)
      bad_list(variable, value, "'[" + group + "]' names more than " + std::to_string(kMaxHosts) + " hosts");
    for (uint64_t n = a; n <= b; ++n) out.push_back(padded(n, lo.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// One host name with any number of bracket groups: every combination, first group slowest.
void expand_item(const std::string& item, const std::string& variable, const std::string& value,
                 std::vector<std::string>& hosts) {
  if (item.empty()) bad_list(variable, value, "it has an empty entry");
  // Alternating literal text and groups: parts[0] group[0] parts[1] group[1] ... parts[n].
  std::vector<std::string> literals(1);
  std::vector<std::vector<std::string>> groups;
  for (size_t i = 0; i < item.size(); ++i) {
    const char c = item[i];
    if (c == '[') {
      const size_t close = item.find(']', i + 1);
      if (close == std::string::npos) bad_list(variable, value, "a '[' in '" + item + "' is never closed");
      const std::string group = item.substr(i + 1, close - i - 1);
      if (group.find('[') != std::string::npos) bad_list(variable, value, "brackets in '" + item + "' are nested");
      groups.push_back(expand_group(group, variable, value));
      literals.emplace_back();
      i = close;
    } else if (c == ']') {
      bad_list(variable, value, "a ']' in '" + item + "' has no '['");
    } else if (!is_name_char(c)) {
      bad_list(variable, value, std::string("'") + c + "' cannot be part of a host name");
    } else {
      literals.back() += c;
    }
  }
  uint64_t count = 1;
  for (const auto& g : groups) {
    count *= g.size();
    if (count + hosts.size() > kMaxHosts)
      bad_list(variable, value, "it names more than " + std::to_string(kMaxHosts) + " hosts");
  }
  // Odometer over the groups' choices, the last group turning fastest.
  std::vector<size_t> pick(groups.size(), 0);
  for (uint64_t n = 0; n < count; ++n) {
    std::string host = literals[0];
    for (size_t g = 0; g < groups.size(); ++g) host += groups[g][pick[g]] + literals[g + 1];
    hosts.push_back(std::move(host));
    for (size_t g = groups.size(); g-- > 0;) {
      if (++pick[g] < groups[g].size()) break;
      pick[g] = 0;
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist, const std::string& variable) {
  if (nodelist.empty()) bad_list(variable, nodelist, "it is empty");
  std::vector<std::string> hosts;
  // Commas inside brackets separate ranges, outside them hosts.
  std::string item;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      expand_item(item, variable, nodelist, hosts);
      item.clear();
    } else {
      item += c;
    }
  }
  expand_item(item, variable, nodelist, hosts);
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks_per_node, const std::string& variable) {
  auto bad = [&](const std::string& why) {
    EMBER_FAIL(variable, "='", tasks_per_node, "' is not a Slurm tasks-per-node list (like '2(x3),1'): ", why);
  };
  auto count = [&](const std::string& digits, const char* what) {
    int n = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (!all_digits(digits) || ec != std::errc() || ptr != digits.data() + digits.size() || n < 1)
      bad("'" + digits + "' is not a positive " + what);
    return n;
  };
  if (tasks_per_node.empty()) bad("it is empty");
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    const size_t comma = tasks_per_node.find(',', start);
    const std::string entry =
        tasks_per_node.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.empty()) bad("it has an empty entry");
    const size_t paren = entry.find('(');
    const int tasks = count(entry.substr(0, paren), "task count");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (entry.size() < paren + 4 || entry.compare(paren, 2, "(x") != 0 || entry.back() != ')')
        bad("'" + entry + "' is not N or N(xM)");
      repeat = count(entry.substr(paren + 2, entry.size() - paren - 3), "repeat count");
    }
    if (out.size() + static_cast<uint64_t>(repeat) > kMaxHosts)
      bad("it describes more than " + std::to_string(kMaxHosts) + " nodes");
    out.insert(out.end(), static_cast<size_t>(repeat), tasks);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace ember::distributed
