// Rows of a table in the model file read as they are needed (docs/tiers.md): the PLE layer's n-gram table, whose
// released size (51B parameters) no host holds, and of which a token reads a few rows. Each row is read on its
// own with a buffered pread, the file's readahead off (POSIX_FADV_RANDOM), so that a miss reads the page or two
// it lies in and no more, and those pages stay in the kernel's page cache, which gives them back under memory
// pressure; the rows read last stay in a small cache of the process's own (direct-mapped by row). Not O_DIRECT:
// a row is a few hundred bytes and a token's rows are read in turn on the host loop, where a device read of a
// page each would cost a disk's latency per row. Host-only, no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/file_reader.hpp"

namespace strata {

class FileRows {
 public:
  // `rows` rows of `row_bytes` bytes from byte `offset` of `path`, `what` naming the table in errors, with room
  // for `cache_rows` rows (at least 1). Throws FormatError naming the file and table when it cannot be opened or
  // is shorter than the table.
  FileRows(const std::string& path, std::int64_t offset, std::int64_t rows, std::size_t row_bytes, int cache_rows,
           const std::string& what);

  std::int64_t rows() const noexcept { return rows_; }
  std::size_t row_bytes() const noexcept { return row_bytes_; }

  // Row `row`'s bytes, valid until the next call. Allocates nothing. FormatError naming the file, table and row
  // when the file ends before it (truncated), InvalidArgument for a row outside the table.
  const std::uint8_t* row(std::int64_t row);

  // FormatError unless the file is what was opened, when rows were read since the last check: a gather checks
  // once per token it read rows for, after them.
  void check_read();

  std::int64_t hits() const noexcept { return hits_; }
  std::int64_t misses() const noexcept { return misses_; }

 private:
  FileReader file_;
  std::string what_;
  std::int64_t offset_, rows_;
  std::size_t row_bytes_;
  std::vector<std::int64_t> tags_;    // [cache_rows]: the row each cache slot holds, -1: none
  std::vector<std::uint8_t> cache_;   // [cache_rows][row_bytes]
  std::unique_ptr<std::uint8_t[]> bounce_storage_;
  std::uint8_t* bounce_ = nullptr;    // kAlign-aligned, FileReader::bounce_bytes(row_bytes)
  std::int64_t hits_ = 0, misses_ = 0;
  bool unchecked_ = false;
};

}  // namespace strata
