// A minimal protocol-buffer encoder: just the wire types TensorBoard's Event and Summary
// messages need (varint, 64-bit, 32-bit, length-delimited), so event files can be written
// without generated code or a protobuf dependency. Fields are appended in the order the caller
// writes them; nested messages are encoded into their own writer first and then embedded.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ember::tracking {

class ProtobufWriter {
 public:
  // int64/uint64/enum/bool fields (wire type 0); negative values take ten bytes, as protobuf
  // encodes int64 (not zigzag).
  void varint_field(int field, uint64_t value);
  void int64_field(int field, int64_t value) { varint_field(field, static_cast<uint64_t>(value)); }
  // double (wire type 1) and float (wire type 5), little-endian IEEE 754.
  void double_field(int field, double value);
  void float_field(int field, float value);
  // string/bytes (wire type 2).
  void bytes_field(int field, std::string_view bytes);
  // A nested message (wire type 2).
  void message_field(int field, const ProtobufWriter& message) { bytes_field(field, message.bytes()); }

  const std::string& bytes() const { return bytes_; }

 private:
  void tag(int field, int wire_type);
  void varint(uint64_t value);
  void little_endian(uint64_t value, int size);

  std::string bytes_;
};

}  // namespace ember::tracking
