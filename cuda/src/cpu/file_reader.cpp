#include "strata/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "strata/error.hpp"

namespace strata {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::int64_t nanoseconds(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

std::int64_t align_down(std::int64_t v) { return v / FileReader::kAlign * FileReader::kAlign; }
std::int64_t align_up(std::int64_t v) { return align_down(v + FileReader::kAlign - 1); }

}  // namespace

FileReader::FileReader(const std::string& path, const FileReaderOptions& options) : path_(path) {
  buffered_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_EXPECTS(buffered_fd_ >= 0, FormatError, path + ": cannot open the file (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(buffered_fd_, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(buffered_fd_);
    throw FormatError(path + ": cannot examine the file (" + reason + ")");
  }
  size_ = st.st_size;
  mtime_ns_ = nanoseconds(st.st_mtim);
  ctime_ns_ = nanoseconds(st.st_ctim);
  if (!options.direct) {
    reason_ = "buffered reads were asked for";
    keep_pages_ = options.keep_pages;
    if (keep_pages_) ::posix_fadvise(buffered_fd_, 0, 0, POSIX_FADV_RANDOM);  // a miss reads its pages, no more
    return;
  }
  direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (direct_fd_ < 0) {
    reason_ = std::string("the file system refuses O_DIRECT (") + std::strerror(errno) + ")";
    return;
  }
  direct_.store(true, std::memory_order_release);
}

FileReader::~FileReader() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  ::close(buffered_fd_);
}

std::string FileReader::buffered_reason() const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  return direct() ? std::string() : reason_;
}

void FileReader::fall_back(const std::string& reason) const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  if (!direct_.load(std::memory_order_acquire)) return;
  reason_ = reason;
  direct_.store(false, std::memory_order_release);
}

std::int64_t FileReader::bounce_bytes(std::int64_t length) noexcept { return align_up(length) + kAlign; }

// Reads up to `length` bytes at `offset` of `fd` into `dst`: fewer only at the end of the file. -1 with errno set
// when a read fails.
std::int64_t FileReader::read_span(int fd, std::int64_t offset, std::int64_t length, std::uint8_t* dst) const {
  std::int64_t got = 0;
  while (got < length) {
    const ssize_t n = ::pread(fd, dst + got, static_cast<size_t>(length - got), offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    got += n;
    // O_DIRECT reads stay aligned: a short read is the end of the file, read again only to see it end.
  }
  return got;
}

const std::uint8_t* FileReader::read(std::int64_t offset, std::int64_t length, std::uint8_t* bounce,
                                     const char* what) const {
  auto where = [&] { return path_ + ": " + what + " at bytes " + str(offset) + ".." + str(offset + length); };
  STRATA_EXPECTS(offset >= 0 && length >= 0, InvalidArgument, where() + ": a negative offset or length");
  const std::int64_t start = align_down(offset), span = align_up(offset + length) - start;
  std::int64_t got = -1;
  if (direct()) {
    got = read_span(direct_fd_, start, span, bounce);
    // Some file systems open with O_DIRECT and refuse its reads: read buffered from here on.
    if (got < 0 && errno == EINVAL) fall_back("the file system refuses O_DIRECT reads (EINVAL)");
  }
  if (got < 0 && !direct()) {
    got = read_span(buffered_fd_, start, span, bounce);
    if (got >= 0 && !keep_pages_) ::posix_fadvise(buffered_fd_, start, got, POSIX_FADV_DONTNEED);
  }
  if (got < 0) {
    const int error = errno;
    throw Error(where() + ": the read failed (" + std::strerror(error) + ")");
  }
  bytes_read_.fetch_add(got, std::memory_order_relaxed);
  STRATA_EXPECTS(start + got >= offset + length, FormatError,
                 where() + ": the file ends at byte " + str(start + got) + " (truncated since it was opened at " +
                     str(size_) + " bytes?)");
  return bounce + (offset - start);
}

void FileReader::check_unchanged() const {
  struct stat st {};
  STRATA_EXPECTS(::fstat(buffered_fd_, &st) == 0, Error,
                 path_ + ": cannot examine the file (" + std::strerror(errno) + ")");
  STRATA_EXPECTS(st.st_size == size_, FormatError,
                 path_ + ": the file changed while it was being read: " + str(st.st_size) + " bytes, " + str(size_) +
                     " when opened (truncated or rewritten); its experts are no longer what was loaded");
  STRATA_EXPECTS(nanoseconds(st.st_mtim) == mtime_ns_ && nanoseconds(st.st_ctim) == ctime_ns_, FormatError,
                 path_ + ": the file changed while it was being read (its modification time moved); its experts "
                         "are no longer what was loaded");
}

}  // namespace strata
