#include "tracking/tensorboard_tracker.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "tracking/protobuf_writer.h"

namespace ember::tracking {

namespace {

// tensorflow.Event
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
// tensorflow.Summary and Summary.Value
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
// tensorflow.SummaryMetadata and its PluginData
constexpr int kMetadataPluginData = 1, kPluginDataName = 1;
// tensorflow.TensorProto; DT_STRING is 7 in tensorflow.DataType
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint64_t kDtString = 7;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

// A markdown table cell: '|' would end the cell, a newline the row.
std::string table_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

void event_header(ProtobufWriter& event, int64_t step, double wall_time) {
  event.double_field(kEventWallTime, wall_time);
  event.int64_field(kEventStep, step);
}

}  // namespace

TensorBoardTracker::TensorBoardTracker(const std::string& run_dir) {
  const auto seconds = static_cast<int64_t>(now_seconds());
  const std::string stem = run_dir + "/events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                           std::to_string(::getpid()) + ".";
  int n = 0;
  while (std::filesystem::exists(stem + std::to_string(n))) ++n;
  writer_ = std::make_unique<TFRecordWriter>(stem + std::to_string(n));
  write_event(file_version_event(now_seconds()));
}

std::string TensorBoardTracker::file_version_event(double wall_time) {
  ProtobufWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.bytes_field(kEventFileVersion, "brain.Event:2");
  return event.bytes();
}

std::string TensorBoardTracker::scalars_event(const LogValues& values, int64_t step, double wall_time) {
  ProtobufWriter summary;
  for (const auto& [tag, value] : values) {
    ProtobufWriter v;
    v.bytes_field(kValueTag, tag);
    v.float_field(kValueSimpleValue, static_cast<float>(value));
    summary.message_field(kSummaryValue, v);
  }
  ProtobufWriter event;
  event_header(event, step, wall_time);
  event.message_field(kEventSummary, summary);
  return event.bytes();
}

std::string TensorBoardTracker::text_event(const std::string& tag, const std::string& text, int64_t step,
                                           double wall_time) {
  ProtobufWriter plugin_data;
  plugin_data.bytes_field(kPluginDataName, "text");
  ProtobufWriter metadata;
  metadata.message_field(kMetadataPluginData, plugin_data);
  // A scalar string tensor: dtype DT_STRING, an empty (rank 0) shape, one string_val.
  ProtobufWriter tensor;
  tensor.varint_field(kTensorDtype, kDtString);
  tensor.message_field(kTensorShape, ProtobufWriter{});
  tensor.bytes_field(kTensorStringVal, text);
  ProtobufWriter value;
  value.bytes_field(kValueTag, tag);
  value.message_field(kValueMetadata, metadata);
  value.message_field(kValueTensor, tensor);
  ProtobufWriter summary;
  summary.message_field(kSummaryValue, value);
  ProtobufWriter event;
  event_header(event, step, wall_time);
  event.message_field(kEventSummary, summary);
  return event.bytes();
}

std::string TensorBoardTracker::config_table(const TrackerConfig& config) {
  std::string table = "| name | value |\n| --- | --- |\n";
  for (const auto& [name, value] : config)
    table += "| " + table_cell(name) + " | " + table_cell(value.to_string()) + " |\n";
  return table;
}

void TensorBoardTracker::store_init_configuration(const TrackerConfig& config) {
  if (config.empty()) return;
  write_event(text_event("config", config_table(config), 0, now_seconds()));
}

void TensorBoardTracker::log(const LogValues& values, int64_t step, double wall_time) {
  write_event(scalars_event(values, step, wall_time));
}

void TensorBoardTracker::write_event(const std::string& event) {
  writer_->write(event);
  writer_->flush();
}

void TensorBoardTracker::finish() { writer_->close(); }

}  // namespace ember::tracking
