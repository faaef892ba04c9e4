// Experiment tracking (AcceleratorOptions::log_with, init_trackers, log, end_training): the
// CRC32C and protobuf encoders against published and hand-computed bytes; metrics.jsonl and
// config.json parsed back exactly; TensorBoard event files checked record by record (both CRCs)
// and read back by TensorBoard's own readers (tests/tracking/read_tensorboard.py, run with
// the Python environment scripts/install_deps.sh sets up; skipped when it is missing); and
// only the main process writing, with two real processes.
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "ember/accelerate.h"
#include "process_test_util.h"
#include "test_util.h"
#include "tracking/crc32c.h"
#include "tracking/jsonl_tracker.h"
#include "tracking/plot/html_report.h"
#include "tracking/protobuf_writer.h"
#include "tracking/tensorboard_tracker.h"
#include "tracking/tfrecord_writer.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::tracking;
namespace fs = std::filesystem;
using ember::testing::read_text_file;
using ember::testing::TempDir;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

uint32_t float_bits(double value) { return std::bit_cast<uint32_t>(static_cast<float>(value)); }

uint64_t read_le(const std::string& bytes, size_t at, int size) {
  uint64_t v = 0;
  for (int i = 0; i < size; ++i) v |= uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

// An independent TFRecord reader: every record's payload, both CRCs verified. `truncated` is set
// when the file ends inside a record (the reader stops there, as TensorBoard's does).
struct TFRecords {
  std::vector<std::string> payloads;
  bool truncated = false;
  std::string error;  // a checksum that does not match
};

TFRecords read_tfrecords(const std::string& path) {
  const std::string bytes = read_text_file(path);
  TFRecords out;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) {
      out.truncated = true;
      break;
    }
    const uint64_t length = read_le(bytes, at, 8);
    if (read_le(bytes, at + 8, 4) != masked_crc32c(bytes.substr(at, 8))) {
      out.error = "length crc of record " + std::to_string(out.payloads.size());
      break;
    }
    if (bytes.size() - at - 12 < length + 4) {
      out.truncated = true;
      break;
    }
    const std::string payload = bytes.substr(at + 12, length);
    if (read_le(bytes, at + 12 + length, 4) != masked_crc32c(payload)) {
      out.error = "data crc of record " + std::to_string(out.payloads.size());
      break;
    }
    out.payloads.push_back(payload);
    at += 12 + length + 4;
  }
  return out;
}

// The Python of the environment scripts/install_deps.sh creates, when it has tensorboard.
std::optional<std::string> tensorboard_python(std::string* why_not) {
  const std::string home = ember::testing::env_or("HOME", "");
  const std::string venv = ember::testing::env_or("EMBER_PYTOOLS", (home + "/.cache/ember-pytools").c_str());
  const std::string python = venv + "/bin/python";
  if (!fs::exists(python)) {
    *why_not = "no Python environment at " + venv + " (set EMBER_PYTOOLS or run: bash scripts/install_deps.sh)";
    return std::nullopt;
  }
  if (std::system(("'" + python + "' -c 'import tensorboard' >/dev/null 2>&1").c_str()) != 0) {
    *why_not = "tensorboard is not installed in " + venv + " (run: bash scripts/install_deps.sh)";
    return std::nullopt;
  }
  return python;
}

// What read_tensorboard.py reports for `event_file` (see that script for the layout).
nlohmann::json read_with_tensorboard(const std::string& python, const std::string& event_file, const TempDir& dir) {
  const std::string script = std::string(EMBER_SOURCE_DIR) + "/tests/tracking/read_tensorboard.py";
  const std::string out = dir.file("tb_stdout.json"), err = dir.file("tb_stderr.txt");
  const std::string cmd = "'" + python + "' '" + script + "' '" + event_file + "' > '" + out + "' 2> '" + err + "'";
  const int rc = std::system(cmd.c_str());
  EMBER_CHECK(rc == 0, "read_tensorboard.py failed (", rc, "):\n", read_text_file(err));
  return nlohmann::json::parse(read_text_file(out));
}

AcceleratorOptions tracking_options(std::vector<std::string> log_with, const std::string& project_dir) {
  AcceleratorOptions o;
  o.cpu = true;
  o.log_with = std::move(log_with);
  o.project_dir = project_dir;
  return o;
}

// ---- CRC32C

TEST(Crc32c, StandardCheckValue) { EXPECT_EQ(crc32c("123456789"), 0xE3069283u); }

TEST(Crc32c, Rfc3720Vectors) {
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  // The iSCSI SCSI Read (10) command PDU of RFC 3720 B.4.
  const std::string pdu = from_hex("01c00000000000000000000000000000"
                                   "14000000000004000000001400000018"
                                   "28000000000000000200000000000000");
  ASSERT_EQ(pdu.size(), 48u);
  EXPECT_EQ(crc32c(pdu), 0xD9963A56u);
}

TEST(Crc32c, ExtendingEqualsOneCallAndEmptyIsZero) {
  const std::string text = "TensorBoard event files frame every record";
  for (size_t cut : {size_t(0), size_t(1), size_t(17), text.size()}) {
    const uint32_t first = crc32c_extend(0, text.data(), cut);
    EXPECT_EQ(crc32c_extend(first, text.data() + cut, text.size() - cut), crc32c(text)) << "cut " << cut;
  }
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, MaskRotatesAndOffsets) {
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 mod 2^32, by hand:
  // 0x0001C60D | 0x25060000 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc32c(0), 0xA282EAD8u);
}

// ---- protobuf encoding

TEST(ProtobufWriter, ScalarFieldsMatchHandEncodedBytes) {
  auto encode = [](auto write) {
    ProtobufWriter w;
    write(w);
    return to_hex(w.bytes());
  };
  // The protobuf documentation's examples: field 1 = 150, field 2 = "testing".
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.varint_field(1, 150); }), "089601");
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.bytes_field(2, "testing"); }), "120774657374696e67");
  // int64 -1: ten bytes of two's complement varint.
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.int64_field(2, -1); }), "10ffffffffffffffffff01");
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.int64_field(2, 0); }), "1000");
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.varint_field(1, uint64_t(1) << 63); }), "0880808080808080808001");
  // Fixed-width: double 1.0 = 0x3FF0000000000000, float 1.0 = 0x3F800000, little-endian.
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.double_field(1, 1.0); }), "09000000000000f03f");
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.float_field(2, 1.0f); }), "150000803f");
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.float_field(2, -2.5f); }), "15000020c0");
  // Field 16 needs a two-byte tag: (16 << 3) | 0 = 128.
  EXPECT_EQ(encode([](ProtobufWriter& w) { w.varint_field(16, 1); }), "800101");
}

TEST(ProtobufWriter, NestedMessagesAndLongPayloads) {
  ProtobufWriter inner;
  inner.varint_field(1, 150);
  ProtobufWriter outer;
  outer.message_field(3, inner);
  EXPECT_EQ(to_hex(outer.bytes()), "1a03089601");
  ProtobufWriter empty_nested;
  empty_nested.message_field(2, ProtobufWriter{});
  EXPECT_EQ(to_hex(empty_nested.bytes()), "1200");
  // A 200-byte string: length varint 200 = c8 01.
  ProtobufWriter long_string;
  long_string.bytes_field(1, std::string(200, 'x'));
  EXPECT_EQ(to_hex(long_string.bytes().substr(0, 3)), "0ac801");
  EXPECT_EQ(long_string.bytes().size(), 203u);
}

TEST(ProtobufWriter, RejectsInvalidFieldNumbers) {
  ProtobufWriter w;
  EXPECT_EMBER_ERROR(w.varint_field(0, 1), "field number 0");
  EXPECT_EMBER_ERROR(w.varint_field(1 << 29, 1), "out of range");
}

TEST(TensorBoardEvents, EncodeAsTensorFlowDoes) {
  // Bytes of tensorflow.Event messages built field by field from event.proto/summary.proto:
  // wall_time (1, double) 0.5, step (2) 3, summary (5) { value (1) { tag (1) "loss",
  // simple_value (2) 1.0f } }.
  EXPECT_EQ(to_hex(TensorBoardTracker::scalars_event({{"loss", 1.0}}, 3, 0.5)),
            "09000000000000e03f" "1003" "2a0d" "0a0b" "0a046c6f7373" "150000803f");
  EXPECT_EQ(to_hex(TensorBoardTracker::file_version_event(0.5)),
            "09000000000000e03f" "1a0d" + to_hex("brain.Event:2"));
  // A text summary: value { tag "config", metadata (9) { plugin_data (1) { plugin_name "text" } },
  // tensor (8) { dtype (1) DT_STRING = 7, tensor_shape (2) {}, string_val (8) "hi" } }.
  const std::string value = "0a06" + to_hex("config") + "4a08" + "0a06" + "0a04" + to_hex("text") + "4208" + "0807" +
                            "1200" + "4202" + to_hex("hi");
  EXPECT_EQ(to_hex(TensorBoardTracker::text_event("config", "hi", 0, 0.5)),
            "09000000000000e03f" "1000" "2a1e" "0a1c" + value);
}

TEST(TFRecordWriter, FramesLengthPayloadAndBothChecksums) {
  const std::string framed = TFRecordWriter::frame("abc");
  ASSERT_EQ(framed.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(to_hex(framed.substr(0, 8)), "0300000000000000");
  EXPECT_EQ(read_le(framed, 8, 4), masked_crc32c(framed.substr(0, 8)));
  EXPECT_EQ(framed.substr(12, 3), "abc");
  EXPECT_EQ(read_le(framed, 15, 4), masked_crc32c("abc"));

  TempDir dir("tfrecord");
  {
    TFRecordWriter writer(dir.file("records"));
    writer.write("first");
    writer.write(std::string(300, 'z'));
    writer.close();
    writer.close();  // closing twice does nothing
    EXPECT_EMBER_ERROR(writer.write("late"), "is closed");
  }
  const auto records = read_tfrecords(dir.file("records"));
  EXPECT_EQ(records.error, "");
  EXPECT_FALSE(records.truncated);
  ASSERT_EQ(records.payloads.size(), 2u);
  EXPECT_EQ(records.payloads[0], "first");
  EXPECT_EQ(records.payloads[1], std::string(300, 'z'));
  // Never overwrites an existing file.
  EXPECT_EMBER_ERROR(TFRecordWriter(dir.file("records")), "cannot create", "records");
}

// ---- configuration values

TEST(TrackerValue, EachLiteralKeepsItsKind) {
  const TrackerConfig config = {{"lr", 2e-5}, {"batch_size", 32}, {"model", "bert-tiny"}, {"bf16", true},
                                {"steps", int64_t(1) << 40}, {"warmup", 0.5f}, {"name", std::string("x")},
                                {"count", size_t(7)}};
  EXPECT_EQ(std::get<double>(config.at("lr").value()), 2e-5);
  EXPECT_EQ(std::get<int64_t>(config.at("batch_size").value()), 32);
  EXPECT_EQ(std::get<std::string>(config.at("model").value()), "bert-tiny");
  EXPECT_EQ(std::get<bool>(config.at("bf16").value()), true);
  EXPECT_EQ(std::get<int64_t>(config.at("steps").value()), int64_t(1) << 40);
  EXPECT_EQ(std::get<double>(config.at("warmup").value()), 0.5);
  EXPECT_EQ(std::get<std::string>(config.at("name").value()), "x");
  EXPECT_EQ(std::get<int64_t>(config.at("count").value()), 7);
  EXPECT_EMBER_ERROR((void)TrackerValue(std::numeric_limits<uint64_t>::max()), "does not fit in int64");
  EXPECT_EQ(TrackerValue(0.1).to_string(), "0.1");
  EXPECT_EQ(TrackerValue(false).to_string(), "false");
}

// ---- metrics.jsonl and config.json

TEST(JsonlTracker, LineFormatIsExact) {
  EXPECT_EQ(JsonlTracker::format_line({{"loss", 2.31}, {"lr", 0.0001}}, 12, 1764561234.123),
            R"({"step":12,"wall_time":1764561234.123,"loss":2.31,"lr":0.0001})");
  EXPECT_EQ(JsonlTracker::format_line({{"a", kNaN}, {"b", -kInf}}, 0, 1.5),
            R"({"step":0,"wall_time":1.5,"a":null,"b":null})");
}

TEST(Tracking, JsonlRoundTripsEveryValueExactly) {
  TempDir dir("tracking_jsonl");
  const std::vector<std::pair<int64_t, LogValues>> rows = {
      {0, {{"loss", 0.1}, {"lr", 1e-300}, {"third", 1.0 / 3.0}}},
      {(int64_t(1) << 53) + 1, {{"loss", kNaN}, {"lr", -0.0}, {"big", 1.7976931348623157e308}}},
      {std::numeric_limits<int64_t>::max(), {{"loss", kInf}, {"tiny", 4.9406564584124654e-324}, {"neg", -2.5e-7}}},
  };
  const double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  Accelerator acc(tracking_options({"jsonl"}, dir.path()));
  acc.init_trackers("sst2", {{"lr", 2e-5}, {"batch_size", 32}, {"model", "bert-tiny"}, {"bf16", true}});
  for (const auto& [step, values] : rows) acc.log(values, step);
  acc.end_training();
  const double after = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();

  const auto lines = lines_of(dir.file("sst2/metrics.jsonl"));
  ASSERT_EQ(lines.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    const auto row = nlohmann::ordered_json::parse(lines[i]);
    std::vector<std::string> keys;
    for (const auto& item : row.items()) keys.push_back(item.key());
    std::vector<std::string> expected_keys = {"step", "wall_time"};
    for (const auto& [name, value] : rows[i].second) expected_keys.push_back(name);
    EXPECT_EQ(keys, expected_keys);
    EXPECT_TRUE(row["step"].is_number_integer());
    EXPECT_EQ(row["step"].get<int64_t>(), rows[i].first);
    EXPECT_GE(row["wall_time"].get<double>(), std::floor(before));
    EXPECT_LE(row["wall_time"].get<double>(), after + 1);
    for (const auto& [name, value] : rows[i].second) {
      if (std::isfinite(value)) {
        EXPECT_EQ(std::bit_cast<uint64_t>(row[name].get<double>()), std::bit_cast<uint64_t>(value)) << name;
      } else {
        EXPECT_TRUE(row[name].is_null()) << name;
      }
    }
  }

  const auto config = nlohmann::json::parse(read_text_file(dir.file("sst2/config.json")));
  EXPECT_EQ(config, nlohmann::json::parse(R"({"lr":2e-05,"batch_size":32,"model":"bert-tiny","bf16":true})"));
  EXPECT_TRUE(config["lr"].is_number_float());
  EXPECT_TRUE(config["batch_size"].is_number_integer());
  EXPECT_TRUE(config["bf16"].is_boolean());
  // Only the selected tracker's files.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.file("sst2"))) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "metrics.jsonl", "report.html"}));
}

TEST(Tracking, StepsDefaultToTheNumberOfEarlierLogCalls) {
  TempDir dir("tracking_steps");
  // Written as users write it: designated options, mixed literal kinds, float and integer values.
  Accelerator acc({.cpu = true, .log_with = {"jsonl"}, .project_dir = dir.path()});
  acc.init_trackers("run", {{"lr", 2e-5}, {"batch_size", 32}, {"model", "bert-tiny"}, {"bf16", true}});
  const float loss = 0.75f;
  const int64_t tokens_per_s = 12345;
  acc.log({{"loss", loss}, {"tokens_per_s", tokens_per_s}, {"a", 1}});
  acc.log({{"a", 2}}, 100);
  acc.log({{"a", 3}});
  acc.log(std::map<std::string, double>{{"b", 4}, {"a", 5}});
  const auto lines = lines_of(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  std::vector<int64_t> steps;
  for (const auto& l : lines) steps.push_back(nlohmann::json::parse(l)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 100, 2, 3}));
  EXPECT_NE(lines[0].find(R"("loss":0.75,"tokens_per_s":12345.0,"a":1.0})"), std::string::npos) << lines[0];
  // A std::map logs in its key order.
  EXPECT_NE(lines[3].find(R"("a":5.0,"b":4.0)"), std::string::npos) << lines[3];
}

TEST(Tracking, EachLineIsOnDiskBeforeLogReturnsAndResumingAppends) {
  TempDir dir("tracking_resume");
  {
    Accelerator acc(tracking_options({"jsonl"}, dir.path()));
    acc.init_trackers("run", {{"phase", 1}});
    acc.log({{"loss", 4.0}}, 1);
    // Read while the run is active: the line was flushed.
    EXPECT_EQ(lines_of(dir.file("run/metrics.jsonl")).size(), 1u);
    acc.log({{"loss", 3.0}}, 2);
    EXPECT_EQ(lines_of(dir.file("run/metrics.jsonl")).size(), 2u);
    // No end_training: the destructor closes the run.
  }
  const auto first = lines_of(dir.file("run/metrics.jsonl"));
  {
    Accelerator acc(tracking_options({"jsonl"}, dir.path()));
    acc.init_trackers("run", {{"phase", 2}});
    acc.log({{"loss", 2.0}}, 3);
    acc.end_training();
  }
  const auto lines = lines_of(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], first[0]);
  EXPECT_EQ(lines[1], first[1]);
  EXPECT_EQ(nlohmann::json::parse(lines[2])["loss"].get<double>(), 2.0);
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dir.file("run/config.json"))), nlohmann::json({{"phase", 2}}));
}

TEST(Tracking, LifecycleAndGetTracker) {
  TempDir dir("tracking_lifecycle");
  Accelerator acc(tracking_options({"all", "jsonl"}, dir.path()));
  EXPECT_EQ(acc.get_tracker("jsonl"), nullptr);  // no run yet
  acc.init_trackers("a");
  ASSERT_NE(acc.get_tracker("jsonl"), nullptr);
  ASSERT_NE(acc.get_tracker("tensorboard"), nullptr);
  EXPECT_EQ(acc.get_tracker("wandb"), nullptr);
  EXPECT_EQ(acc.get_tracker("jsonl")->path(), (fs::path(dir.path()) / "a" / "metrics.jsonl").string());
  EXPECT_EMBER_ERROR(acc.init_trackers("b"), "init_trackers", "still active", "end_training");
  acc.end_training();
  acc.end_training();  // idempotent
  EXPECT_EQ(acc.get_tracker("jsonl"), nullptr);
  EXPECT_EMBER_ERROR(acc.log({{"loss", 1.0}}), "log: no active run", "init_trackers");
  // A second run after the first ended.
  acc.init_trackers("b");
  acc.log({{"loss", 1.0}});
  EXPECT_TRUE(fs::exists(dir.file("b/metrics.jsonl")));

  Accelerator only_tb(tracking_options({"tensorboard"}, dir.path()));
  only_tb.init_trackers("c");
  EXPECT_EQ(only_tb.get_tracker("jsonl"), nullptr);
  EXPECT_NE(only_tb.get_tracker("tensorboard"), nullptr);
  EXPECT_FALSE(fs::exists(dir.file("c/metrics.jsonl")));
}

// end_training leaves the run's report beside its logs: the page `ember plot` draws from them.
TEST(Tracking, EndTrainingWritesTheRunsReport) {
  TempDir dir("tracking_report");
  Accelerator acc(tracking_options({"jsonl"}, dir.path()));
  acc.init_trackers("curves", {{"lr", 1e-3}});
  for (int64_t step = 0; step < 20; ++step) acc.log({{"loss", 2.0 - 0.05 * double(step)}, {"lr", 1e-3}}, 10 * step);
  acc.end_training();
  const std::string report = read_text_file(dir.file("curves/report.html"));
  EXPECT_EQ(report, plot::render_html_report({plot::read_run(dir.file("curves"))}));
  EXPECT_NE(report.find("loss"), std::string::npos);

  // No rows, or no jsonl tracker: nothing to draw from, no report.
  acc.init_trackers("empty");
  acc.end_training();
  EXPECT_FALSE(fs::exists(dir.file("empty/report.html")));
  Accelerator tb_only(tracking_options({"tensorboard"}, dir.path()));
  tb_only.init_trackers("tb");
  tb_only.log({{"loss", 1.0}}, 0);
  tb_only.end_training();
  EXPECT_FALSE(fs::exists(dir.file("tb/report.html")));
}

TEST(Tracking, WithoutTrackersNothingIsWrittenButArgumentsAreChecked) {
  TempDir dir("tracking_none");
  AcceleratorOptions o;
  o.cpu = true;
  o.project_dir = dir.path();
  Accelerator acc(o);
  EXPECT_EMBER_ERROR(acc.log({{"loss", 1.0}}), "call init_trackers(project_name) first");
  acc.init_trackers("run", {{"lr", 0.1}});
  acc.log({{"loss", 1.0}});
  EXPECT_EMBER_ERROR(acc.log({{"step", 1.0}}), "'step' is reserved");
  acc.end_training();
  EXPECT_TRUE(dir.names().empty());
}

TEST(Tracking, ErrorsNameTheProblem) {
  TempDir dir("tracking_errors");
  EXPECT_EMBER_ERROR(Accelerator(tracking_options({"jsonl", "wandb"}, dir.path())), "unknown tracker 'wandb'",
                     "'jsonl', 'tensorboard'", "'all'");
  EXPECT_EMBER_ERROR(Accelerator(tracking_options({"jsonl"}, "")), "log_with needs project_dir");
  Accelerator acc(tracking_options({"jsonl"}, dir.path()));
  EXPECT_EMBER_ERROR(acc.log({{"loss", 1.0}}), "log: no active run; call init_trackers(project_name) first");
  EXPECT_EMBER_ERROR(acc.init_trackers(""), "project name is empty");
  acc.init_trackers("run");
  EXPECT_EMBER_ERROR(acc.log({{"loss", 1.0}, {"step", 2.0}}), "'step' is reserved");
  EXPECT_EMBER_ERROR(acc.log({{"wall_time", 2.0}}), "'wall_time' is reserved");
  EXPECT_EMBER_ERROR(acc.log({{"loss", 1.0}, {"loss", 2.0}}), "'loss' appears twice");
  EXPECT_EMBER_ERROR(acc.log({{"", 1.0}}), "empty name");
  // Rejected calls write nothing and do not advance the step counter.
  acc.log({{"loss", 1.0}});
  const auto lines = lines_of(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["step"].get<int64_t>(), 0);
  // The project directory cannot be created: a file is in the way.
  const std::string blocker = dir.write("blocker", "x");
  Accelerator blocked(tracking_options({"jsonl"}, blocker));
  EXPECT_EMBER_ERROR(blocked.init_trackers("run"), "cannot create the run directory", "blocker");
}

// ---- TensorBoard

struct LoggedRow {
  int64_t step;
  LogValues values;
};

const std::vector<LoggedRow>& tensorboard_rows() {
  static const std::vector<LoggedRow> rows = {
      {0, {{"loss", 2.31}, {"lr", 0.0001}}},
      {1, {{"loss", 0.1}, {"lr", 1e-300}, {"grad_norm", kNaN}}},
      {int64_t(1) << 40, {{"loss", kInf}, {"lr", -kInf}, {"huge", 1e39}}},
      {(int64_t(1) << 40) + 1, {{"loss", 3.4028234663852886e38}, {"lr", -1.5}}},
  };
  return rows;
}

// Writes a run with both trackers and returns (event file, wall_time of each row from the
// jsonl file, which gets the same stamp).
std::pair<std::string, std::vector<double>> write_tensorboard_run(const TempDir& dir) {
  Accelerator acc(tracking_options({"all"}, dir.path()));
  acc.init_trackers("tb", {{"lr", 2e-5}, {"model", "bert|tiny"}, {"bf16", true}});
  for (const auto& row : tensorboard_rows()) acc.log(row.values, row.step);
  const std::string path = acc.get_tracker("tensorboard")->path();
  acc.end_training();
  std::vector<double> wall_times;
  for (const auto& line : lines_of(dir.file("tb/metrics.jsonl")))
    wall_times.push_back(nlohmann::json::parse(line)["wall_time"].get<double>());
  return {path, wall_times};
}

// The config's text summary: sorted by name, '|' escaped inside a cell.
const char* kConfigTable =
    "| name | value |\n| --- | --- |\n| bf16 | true |\n| lr | 2e-05 |\n| model | bert\\|tiny |\n";

TEST(TensorBoard, EventFileIsNamedAndFramedLikeTensorFlows) {
  TempDir dir("tracking_tb");
  const auto [path, wall_times] = write_tensorboard_run(dir);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir.file("tb")));
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.)" + std::string(host) + "\\." +
                                                std::to_string(::getpid()) + R"(\.0)")))
      << name;

  const auto records = read_tfrecords(path);
  EXPECT_EQ(records.error, "");
  EXPECT_FALSE(records.truncated);
  const auto& rows = tensorboard_rows();
  ASSERT_EQ(records.payloads.size(), 2 + rows.size());
  // The first event: wall_time (tag 09 + 8 bytes), then file_version.
  EXPECT_EQ(records.payloads[0].substr(0, 1), "\x09");
  EXPECT_EQ(records.payloads[0].substr(9), std::string("\x1a\x0d") + "brain.Event:2");
  ASSERT_EQ(wall_times.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(to_hex(records.payloads[2 + i]),
              to_hex(TensorBoardTracker::scalars_event(rows[i].values, rows[i].step, wall_times[i])))
        << "row " << i;

  // A second run in the same directory by the same process within the same second gets the next number.
  Accelerator again(tracking_options({"tensorboard"}, dir.path()));
  again.init_trackers("tb");
  const std::string second = again.get_tracker("tensorboard")->path();
  EXPECT_NE(second, path);
  EXPECT_TRUE(fs::exists(second));
}

TEST(TensorBoard, TensorBoardsOwnReaderSeesEveryScalar) {
  std::string why_not;
  const auto python = tensorboard_python(&why_not);
  if (!python) GTEST_SKIP() << why_not;
  TempDir dir("tracking_tb_read");
  const auto [path, wall_times] = write_tensorboard_run(dir);
  const auto seen = read_with_tensorboard(*python, path, dir);
  const auto& rows = tensorboard_rows();

  // Raw events, as parsed by tensorflow.Event from records whose CRCs TensorBoard checked.
  const auto& events = seen["events"];
  ASSERT_EQ(events.size(), 2 + rows.size()) << seen.dump();
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(events[1]["step"], 0);
  EXPECT_EQ(events[1]["texts"], nlohmann::json::array({nlohmann::json::array({"config", "text", kConfigTable})}));
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    const auto& e = events[2 + i];
    EXPECT_EQ(e["step"].get<int64_t>(), rows[i].step);
    EXPECT_EQ(e["wall_time"].get<double>(), wall_times[i]);
    ASSERT_EQ(e["scalars"].size(), rows[i].values.size());
    size_t k = 0;
    for (const auto& [tag, value] : rows[i].values) {
      EXPECT_EQ(e["scalars"][k][0], tag);
      const uint32_t bits = e["scalars"][k][1].get<uint32_t>();
      if (std::isnan(value)) EXPECT_TRUE(std::isnan(std::bit_cast<float>(bits))) << tag;
      else EXPECT_EQ(bits, float_bits(value)) << tag << " = " << value;
      ++k;
    }
  }

  // EventAccumulator, the reader behind the scalar dashboard: per tag, (step, wall_time, value).
  std::map<std::string, nlohmann::json> expected;
  for (size_t i = 0; i < rows.size(); ++i)
    for (const auto& [tag, value] : rows[i].values) {
      auto& list = expected[tag];
      if (list.is_null()) list = nlohmann::json::array();
      list.push_back({rows[i].step, wall_times[i], float_bits(value)});
    }
  const auto& scalars = seen["scalars"];
  ASSERT_EQ(scalars.size(), expected.size()) << scalars.dump();
  for (const auto& [tag, list] : expected) {
    ASSERT_TRUE(scalars.contains(tag)) << tag;
    ASSERT_EQ(scalars[tag].size(), list.size()) << tag;
    for (size_t j = 0; j < list.size(); ++j) {
      EXPECT_EQ(scalars[tag][j][0], list[j][0]) << tag;
      EXPECT_EQ(scalars[tag][j][1].get<double>(), list[j][1].get<double>()) << tag;
      const uint32_t bits = scalars[tag][j][2].get<uint32_t>();
      if (std::isnan(std::bit_cast<float>(list[j][2].get<uint32_t>())))
        EXPECT_TRUE(std::isnan(std::bit_cast<float>(bits))) << tag;
      else EXPECT_EQ(bits, list[j][2].get<uint32_t>()) << tag;
    }
  }
  const auto config_entry = nlohmann::json::array({nlohmann::json::array({0, kConfigTable})});
  EXPECT_EQ(seen["texts"], nlohmann::json({{"config", config_entry}}));
}

TEST(TensorBoard, ATruncatedLastRecordIsDetectedAndTheRestStillReads) {
  TempDir dir("tracking_tb_cut");
  const auto [path, wall_times] = write_tensorboard_run(dir);
  const std::string bytes = read_text_file(path);
  // A writer killed in the middle of its last record.
  const std::string cut = dir.write("events.out.tfevents.cut", bytes.substr(0, bytes.size() - 5));
  const auto records = read_tfrecords(cut);
  EXPECT_TRUE(records.truncated);
  EXPECT_EQ(records.error, "");
  EXPECT_EQ(records.payloads.size(), 2 + tensorboard_rows().size() - 1);
  // A flipped byte in the last record's payload fails its data checksum.
  std::string flipped = bytes;
  flipped[bytes.size() - 6] ^= 0x01;
  const size_t last = 2 + tensorboard_rows().size() - 1;
  EXPECT_EQ(read_tfrecords(dir.write("flipped", flipped)).error, "data crc of record " + std::to_string(last));

  std::string why_not;
  const auto python = tensorboard_python(&why_not);
  if (!python) GTEST_SKIP() << why_not;
  // TensorBoard reads up to the cut record and stops there (it waits for the rest of a file
  // that is still being written).
  const auto seen = read_with_tensorboard(*python, cut, dir);
  EXPECT_EQ(seen["events"].size(), 2 + tensorboard_rows().size() - 1);
}

// ---- several processes

TEST(TrackingProcesses, OnlyTheMainProcessWritesFiles) {
  TempDir dir("tracking_processes");
  const std::string worker = ember::testing::env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/tracking_worker";
  const std::string port = std::to_string(ember::testing::free_port());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < 2; ++r) {
    logs.push_back(dir.file("rank" + std::to_string(r) + ".log"));
    pids.push_back(ember::testing::spawn_logged(
        {worker, dir.path()}, logs.back(),
        ember::testing::environment_with({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                                          {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                                          {"EMBER_USE_CPU", "1"}, {"EMBER_MIXED_PRECISION", std::nullopt},
                                          {"EMBER_GRADIENT_ACCUMULATION_STEPS", std::nullopt}})));
  }
  const auto reaped = ember::testing::reap_all(pids, std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    const std::string output = read_text_file(logs[r]);
    EXPECT_FALSE(reaped[r].killed) << output;
    EXPECT_TRUE(WIFEXITED(reaped[r].status) && WEXITSTATUS(reaped[r].status) == 0) << "rank " << r << ":\n" << output;
    EXPECT_NE(output.find("tracking ok"), std::string::npos) << "rank " << r << ":\n" << output;
  }
  // Each rank used <dir>/rank<r> as project_dir; only rank 0's exists.
  EXPECT_FALSE(fs::exists(dir.file("rank1")));
  const auto lines = lines_of(dir.file("rank0/run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(lines[2])["loss"].get<double>(), 0.25);
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dir.file("rank0/run/config.json"))),
            nlohmann::json({{"num_processes", 2}}));
  int event_files = 0;
  for (const auto& e : fs::directory_iterator(dir.file("rank0/run")))
    event_files += e.path().filename().string().starts_with("events.out.tfevents.");
  EXPECT_EQ(event_files, 1);
}

}  // namespace
