#include "strata/file_rows.hpp"

#include <cstdio>
#include <cstring>

#include "strata/error.hpp"

namespace strata {
namespace {

FileReaderOptions row_reads() {
  FileReaderOptions o;
  o.direct = false;
  o.keep_pages = true;
  return o;
}

}  // namespace

FileRows::FileRows(const std::string& path, std::int64_t offset, std::int64_t rows, std::size_t row_bytes,
                   int cache_rows, const std::string& what)
    : file_(path, row_reads()), what_(what), offset_(offset), rows_(rows), row_bytes_(row_bytes),
      tags_(static_cast<std::size_t>(cache_rows > 0 ? cache_rows : 0), -1) {
  STRATA_EXPECTS(cache_rows >= 1, InvalidArgument, what + ": the row cache needs room for a row, found " +
                                                       std::to_string(cache_rows));
  STRATA_EXPECTS(rows >= 1 && row_bytes >= 1 && offset >= 0, InvalidArgument,
                 what + ": " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes at byte " +
                     std::to_string(offset));
  const std::int64_t end = offset + rows * static_cast<std::int64_t>(row_bytes);
  STRATA_EXPECTS(end <= file_.size(), FormatError,
                 path + ": " + what + " ends at byte " + std::to_string(end) + ", past the file's " +
                     std::to_string(file_.size()) + " bytes (truncated?)");
  cache_.resize(tags_.size() * row_bytes);
  const auto bounce = static_cast<std::size_t>(FileReader::bounce_bytes(static_cast<std::int64_t>(row_bytes)));
  bounce_storage_ = std::make_unique<std::uint8_t[]>(bounce + FileReader::kAlign);
  const auto at = reinterpret_cast<std::uintptr_t>(bounce_storage_.get());
  bounce_ = bounce_storage_.get() + (FileReader::kAlign - at % FileReader::kAlign) % FileReader::kAlign;
}

const std::uint8_t* FileRows::row(std::int64_t row) {
  STRATA_EXPECTS(row >= 0 && row < rows_, InvalidArgument,
                 what_ + ": row " + std::to_string(row) + " is outside 0.." + std::to_string(rows_ - 1));
  const std::size_t slot = static_cast<std::size_t>(row) % tags_.size();
  std::uint8_t* cached = cache_.data() + slot * row_bytes_;
  if (tags_[slot] == row) {
    ++hits_;
    return cached;
  }
  char what[96];
  std::snprintf(what, sizeof(what), "%s row %lld", what_.c_str(), static_cast<long long>(row));
  const std::int64_t length = static_cast<std::int64_t>(row_bytes_);
  const std::uint8_t* bytes = file_.read(offset_ + row * length, length, bounce_, what);
  std::memcpy(cached, bytes, row_bytes_);
  tags_[slot] = row;
  ++misses_;
  unchecked_ = true;
  return cached;
}

void FileRows::check_read() {
  if (!unchecked_) return;
  file_.check_unchanged();
  unchecked_ = false;
}

}  // namespace strata
