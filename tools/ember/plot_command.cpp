// `ember plot`: the training curves of one or more runs as a single self-contained HTML page
// (inline SVG, no script, nothing fetched), to open in any browser or attach to a report.
#include <iostream>

#include "command_line.h"
#include "core/error.h"
#include "subcommands.h"
#include "tracking/plot/html_report.h"

namespace ember::cli {

std::string plot_usage() {
  return "usage: ember plot RUN_DIR [RUN_DIR ...] [-o FILE]\n"
         "\n"
         "Draws the metrics the runs logged (RUN_DIR/metrics.jsonl) as one HTML page: a chart per\n"
         "metric, each run in its own colour, step on the x axis, and the runs' config.json side by\n"
         "side below the charts. The page needs no network and no JavaScript.\n"
         "\n"
         "A RUN_DIR without metrics.jsonl is taken as a project directory: every subdirectory of\n"
         "it that holds a metrics.jsonl is plotted, in name order. A step logged twice keeps its\n"
         "later value (a resumed run). A cut-off last line (a killed run) is skipped with a\n"
         "warning; any other malformed line is an error naming the file and line.\n"
         "\n"
         "options:\n"
         "  -o, --output FILE   where to write the page (default: the first RUN_DIR/report.html)\n"
         "  -h, --help          show this text\n"
         "\n"
         "Prints the path of the page written.\n";
}

int plot_command(const std::vector<std::string>& args) {
  std::vector<std::string> run_dirs;
  std::string output;
  bool output_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << plot_usage();
      return 0;
    }
    std::string name, value;
    bool has_value = false;
    const bool is_output = arg == "-o" || (split_flag(arg, name, value, has_value) && name == "output");
    if (is_output) {
      if (output_given) throw UsageError("the output file is given twice");
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError(arg + " needs a file name");
        value = args[++i];
      }
      if (value.empty()) throw UsageError("the output file name is empty");
      output = value;
      output_given = true;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') throw UsageError("unknown option '" + arg + "'");
    run_dirs.push_back(arg);
  }
  if (run_dirs.empty()) throw UsageError("no run directory given");

  std::vector<std::string> warnings;
  std::string written;
  try {
    written = plot::write_html_report(run_dirs, output, &warnings);
  } catch (const Error& e) {
    // The library names itself "plot:"; here the user typed `ember plot`.
    const std::string message = e.what();
    if (message.rfind("plot: ", 0) == 0) throw Error("ember " + message);
    throw;
  }
  for (const std::string& warning : warnings) std::cerr << "ember plot: warning: " << warning << "\n";
  std::cout << written << "\n";
  return 0;
}

}  // namespace ember::cli
