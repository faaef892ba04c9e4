// The TcpStore wire format, shared by the client (tcp_store.cpp) and the server
// (tcp_store_server.cpp).
//
// Every message is a frame: [u8 type][u32 body length][body], integers little-endian.
// A connection starts with Hello; after that the client sends one request and reads its
// reply before sending the next (no pipelining). Request bodies:
//   Hello   u32 magic, u32 version
//   Set     key, blob                       Get   key, i64 timeout_ms
//   Add     key, i64 delta                  Check keys
//   Wait    keys, i64 timeout_ms            NumKeys (empty)
// where key/blob = u32 length + bytes and keys = u32 count + that many keys.
// Reply types: Ok (payload depends on the request: Get -> the raw value, Add -> i64,
// Check -> u8, NumKeys -> i64, Hello -> u32 magic + u32 version), Timeout (payload = the keys
// still missing) and Error (payload = message text).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "distributed/socket_util.h"

namespace ember::distributed::wire {

constexpr uint32_t kMagic = 0x53424d45;  // "EMBS"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 5;
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t(64) << 20;
// Bounds the key list of one Check/Wait (count and encoded size).
constexpr size_t kMaxKeysPerRequest = 65536;
constexpr size_t kMaxKeyListBytes = size_t(1) << 20;
constexpr size_t kMaxErrorBytes = 4096;
// The largest reply payload a client accepts.
constexpr size_t kMaxReplyBytes = kMaxValueBytes > kMaxKeyListBytes ? kMaxValueBytes : kMaxKeyListBytes;

enum class Request : uint8_t { Hello = 1, Set = 2, Get = 3, Add = 4, Check = 5, Wait = 6, NumKeys = 7 };
enum class Reply : uint8_t { Ok = 0, Timeout = 1, Error = 2 };

// The largest body the server accepts for a request type; nullopt for an unknown type.
inline std::optional<size_t> max_request_body(uint8_t type) {
  switch (static_cast<Request>(type)) {
    case Request::Hello: return 8;
    case Request::Set: return 4 + kMaxKeyBytes + 4 + kMaxValueBytes;
    case Request::Get: return 4 + kMaxKeyBytes + 8;
    case Request::Add: return 4 + kMaxKeyBytes + 8;
    case Request::Check: return kMaxKeyListBytes;
    case Request::Wait: return kMaxKeyListBytes + 8;
    case Request::NumKeys: return 0;
  }
  return std::nullopt;
}

// Builds one frame; finish() fills in the body length.
class FrameWriter {
 public:
  explicit FrameWriter(uint8_t type, size_t reserve = 0) {
    buf_.reserve(kHeaderBytes + reserve);
    buf_.resize(kHeaderBytes);
    buf_[0] = type;
  }
  void u32(uint32_t v) {
    size_t at = grow(4);
    net::put_u32(&buf_[at], v);
  }
  void i64(int64_t v) {
    size_t at = grow(8);
    net::put_u64(&buf_[at], static_cast<uint64_t>(v));
  }
  void u8(uint8_t v) { buf_.push_back(v); }
  void raw(const void* data, size_t size) {
    size_t at = grow(size);
    if (size) std::memcpy(&buf_[at], data, size);
  }
  void blob(const void* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    raw(data, size);
  }
  void key(const std::string& k) { blob(k.data(), k.size()); }
  void keys(const std::vector<std::string>& ks) {
    u32(static_cast<uint32_t>(ks.size()));
    for (const auto& k : ks) key(k);
  }
  std::vector<uint8_t> finish() {
    net::put_u32(&buf_[1], static_cast<uint32_t>(buf_.size() - kHeaderBytes));
    return std::move(buf_);
  }

 private:
  size_t grow(size_t n) {
    size_t at = buf_.size();
    buf_.resize(at + n);
    return at;
  }
  std::vector<uint8_t> buf_;
};

// Reads fields from a body with bounds checks; any violation turns ok() false for good.
class BodyReader {
 public:
  BodyReader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool ok() const { return ok_; }
  // True when every byte was consumed and nothing failed.
  bool done() const { return ok_ && left_ == 0; }

  uint32_t u32() {
    if (!take(4)) return 0;
    return net::get_u32(p_ - 4);
  }
  int64_t i64() {
    if (!take(8)) return 0;
    return static_cast<int64_t>(net::get_u64(p_ - 8));
  }
  uint8_t u8() {
    if (!take(1)) return 0;
    return p_[-1];
  }
  // A length-prefixed byte string of at most `limit` bytes.
  std::vector<uint8_t> blob(size_t limit) {
    uint32_t n = u32();
    if (!ok_ || n > limit || !take(n)) return fail_blob();
    return std::vector<uint8_t>(p_ - n, p_);
  }
  std::string key() {
    uint32_t n = u32();
    if (!ok_ || n > kMaxKeyBytes || !take(n)) {
      ok_ = false;
      return {};
    }
    return std::string(reinterpret_cast<const char*>(p_ - n), n);
  }
  std::vector<std::string> keys() {
    uint32_t count = u32();
    std::vector<std::string> out;
    // Each key takes at least 4 bytes, so a count larger than left_/4 is a lie.
    if (!ok_ || count > kMaxKeysPerRequest || count > left_ / 4) {
      ok_ = false;
      return out;
    }
    out.reserve(count);
    for (uint32_t i = 0; i < count && ok_; ++i) out.push_back(key());
    return out;
  }
  // The rest of the body, unparsed.
  std::vector<uint8_t> rest() {
    std::vector<uint8_t> out(p_, p_ + left_);
    p_ += left_;
    left_ = 0;
    return out;
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > left_) {
      ok_ = false;
      return false;
    }
    p_ += n;
    left_ -= n;
    return true;
  }
  std::vector<uint8_t> fail_blob() {
    ok_ = false;
    return {};
  }
  const uint8_t* p_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace ember::distributed::wire
