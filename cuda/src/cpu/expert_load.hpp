// Where a job finds one expert's weights (ExpertRef), and one matrix of an expert on its way from the model
// file (MatrixLoad): the I/O threads read its blocks into the staging's bounce buffer, in pieces, then the pool
// participants that wait on the matrix repack them into canonical planes, in runs, while the others compute what
// is in RAM.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

#include "block_repack.hpp"
#include "dot.hpp"
#include "io_queue.hpp"
#include "strata/file_reader.hpp"

namespace strata::cpu {

class MatrixLoad {
 public:
  enum State : int { kIdle = 0, kReading, kRaw, kRepacking, kReady, kFailed };

  // A matrix's span is read in pieces of at least kPieceBytes, at most kMaxPieces of them, each an I/O thread's
  // read: a layer's few misses then keep every thread reading to the end of the layer, where whole matrices left
  // the last reads of a layer in flight alone (docs/tiers.md, "The I/O threads").
  static constexpr std::int64_t kPieceBytes = 256 * 1024;
  static constexpr int kMaxPieces = 16;

  // The read of one expert's matrix: `length` bytes at `offset`, `n_blocks` blocks of `type`, repacked into
  // `dst`. `bounce` holds FileReader::bounce_bytes(length). The previous load must be settled. Returns the pieces
  // to hand to the I/O threads (piece(0..n-1)). Allocates nothing.
  int start(const FileReader* file, std::int64_t offset, std::int64_t length, std::uint8_t* bounce, BlockType type,
            std::int64_t n_blocks, const PlaneTargets& dst, int layer, int expert, const char* matrix);

  IoTask* piece(int i) noexcept { return &pieces_[i]; }

  // Returns once the matrix's planes are written, false when the read failed. Every participant that waits on a
  // matrix whose bytes are in takes runs of its blocks to repack (kRepackBytes of them at a time), so the repack of a
  // layer's last miss is shared by the participants that wait for it rather than done by one while they spin.
  bool await() noexcept;

  // Waits until no thread works on this load any more (all its pieces returned, no repack in flight): its bounce
  // and planes may be reused then. Returns false when the read failed.
  bool settle() noexcept;

  std::exception_ptr error() const noexcept { return error_; }  // the read's exception, after a failed settle

 private:
  class Piece final : public IoTask {
   public:
    Piece() = default;
    Piece(MatrixLoad* load, int index) : load(load), index(index) {}
    void run() noexcept override { load->read_piece(index); }
    MatrixLoad* load = nullptr;
    int index = 0;
  };

  void read_piece(int i) noexcept;  // on an I/O thread; the last piece to return makes the load kRaw or kFailed
  void repack_share() noexcept;     // runs of blocks until none is left; the last run done makes the load kReady

  static constexpr std::int64_t kRepackBytes = 64 * 1024;  // a run's file blocks: a few microseconds of repack

  std::atomic<int> state_{kIdle};
  std::atomic<int> pieces_left_{0};
  std::atomic<std::int64_t> next_block_{0}, blocks_done_{0};  // the repack's runs claimed and finished
  std::int64_t run_blocks_ = 1;                               // blocks a run
  std::atomic<bool> failed_{false};
  const FileReader* file_ = nullptr;
  std::int64_t offset_ = 0, length_ = 0, n_blocks_ = 0;
  std::int64_t span_start_ = 0, piece_bytes_ = 0;  // the aligned span's first byte; each piece's share of it
  std::uint8_t* bounce_ = nullptr;
  const std::uint8_t* raw_ = nullptr;  // the blocks, inside bounce_
  BlockType type_ = BlockType::F32;
  PlaneTargets dst_;
  char what_[64] = {};
  std::exception_ptr error_;  // the first failed piece's, written before state_ becomes kFailed
  Piece pieces_[kMaxPieces];
};

// One expert as a job reads it: its rows in every plane of gate, up and down and, for one still arriving from
// the file, the loads its items wait on (null: the expert is in RAM).
struct ExpertRef {
  MatrixRows gate, up, down;
  MatrixLoad* gate_load = nullptr;
  MatrixLoad* up_load = nullptr;
  MatrixLoad* down_load = nullptr;

  bool gate_up_ready() const noexcept {
    return (gate_load == nullptr || gate_load->await()) && (up_load == nullptr || up_load->await());
  }
  bool down_ready() const noexcept { return down_load == nullptr || down_load->await(); }
};

}  // namespace strata::cpu
