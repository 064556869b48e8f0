// Reads of byte ranges of the model file past the page cache (docs/tiers.md): with O_DIRECT where the file
// system takes it, else plain reads whose pages are dropped from the page cache after each read
// (POSIX_FADV_DONTNEED), so that reading the experts a token needs never fills memory with the file (or, for
// small random reads, keep_pages: buffered, readahead off, the pages left to the kernel). The file's size and
// times are kept from the open: a file truncated or rewritten under the reader is refused, never read as if
// nothing happened. Host-only, no CUDA.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace strata {

struct FileReaderOptions {
  bool direct = true;       // O_DIRECT where the file system takes it; false: buffered reads
  bool keep_pages = false;  // buffered reads leave their pages to the page cache, readahead off (small random
                            // reads, strata/file_rows.hpp); else they drop them after each read
};

class FileReader {
 public:
  // O_DIRECT needs the offset, length and buffer of every read aligned to the device's logical block; 4096
  // covers every device in use.
  static constexpr std::int64_t kAlign = 4096;

  // Throws FormatError naming the file when it cannot be opened or examined.
  FileReader(const std::string& path, const FileReaderOptions& options);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::int64_t size() const noexcept { return size_; }  // at open
  // Whether reads bypass the page cache through O_DIRECT; when not, buffered_reason() says why.
  bool direct() const noexcept { return direct_.load(std::memory_order_acquire); }
  std::string buffered_reason() const;

  // Bytes of the bounce buffer a read of `length` bytes at any offset takes: the aligned span around it.
  static std::int64_t bounce_bytes(std::int64_t length) noexcept;

  // Reads [offset, offset + length) into `bounce` (kAlign-aligned, bounce_bytes(length) bytes) and returns where
  // those bytes begin in it. Thread-safe; allocates nothing unless it throws. Throws FormatError naming the file,
  // `what` and the offsets when the file ends before the range (truncated), strata::Error with the system's
  // reason when the read fails.
  const std::uint8_t* read(std::int64_t offset, std::int64_t length, std::uint8_t* bounce, const char* what) const;

  // FormatError naming the file unless its size and its modification and change times are still those found at
  // the open (a write or truncation changes them).
  void check_unchanged() const;

  // File bytes read so far (the aligned spans).
  std::int64_t bytes_read() const noexcept { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  std::int64_t read_span(int fd, std::int64_t offset, std::int64_t length, std::uint8_t* dst) const;
  void fall_back(const std::string& reason) const;

  std::string path_;
  int buffered_fd_ = -1;  // always open: the fallback, and fstat's
  int direct_fd_ = -1;    // -1 where O_DIRECT is refused or not asked for
  bool keep_pages_ = false;
  std::int64_t size_ = 0;
  std::int64_t mtime_ns_ = 0, ctime_ns_ = 0;
  mutable std::atomic<bool> direct_{false};
  mutable std::mutex reason_mutex_;
  mutable std::string reason_;
  mutable std::atomic<std::int64_t> bytes_read_{0};
};

}  // namespace strata
