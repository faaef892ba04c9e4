#include "tracking/protobuf_writer.h"

#include <bit>

#include "core/error.h"

namespace ember::tracking {

namespace {
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
}  // namespace

void ProtobufWriter::tag(int field, int wire_type) {
  // Field numbers are 1 .. 2^29 - 1.
  EMBER_CHECK(field >= 1 && field < (1 << 29), "ProtobufWriter: field number ", field, " is out of range");
  varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void ProtobufWriter::varint(uint64_t value) {
  while (value >= 0x80) {
    bytes_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  bytes_.push_back(static_cast<char>(value));
}

void ProtobufWriter::little_endian(uint64_t value, int size) {
  for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void ProtobufWriter::varint_field(int field, uint64_t value) {
  tag(field, kVarint);
  varint(value);
}

void ProtobufWriter::double_field(int field, double value) {
  tag(field, kFixed64);
  little_endian(std::bit_cast<uint64_t>(value), 8);
}

void ProtobufWriter::float_field(int field, float value) {
  tag(field, kFixed32);
  little_endian(std::bit_cast<uint32_t>(value), 4);
}

void ProtobufWriter::bytes_field(int field, std::string_view bytes) {
  tag(field, kLengthDelimited);
  varint(bytes.size());
  bytes_.append(bytes);
}

}  // namespace ember::tracking
