// One worker's pass over its slice for the read test, written once over a GCC vector type `Vec` that each ISA's
// file (read_stream_avx2.cpp, read_stream_avx512.cpp) defines as its widest register before including this,
// inside its anonymous namespace (one definition per ISA, no ODR clash).
//
// Eight streams side by side (eighths of the slice): one sequential stream leaves a core's fill buffers and
// prefetchers underused, and on the GPU box eight full-width streams read ~10 % above four 16-byte ones.
// With `prefetch`, each stream also asks for the line 2 KiB ahead of it.
uint64_t read_streams(const uint8_t* slice, int64_t bytes, bool prefetch) {
  constexpr int kStreams = 8, kUnroll = 4;
  constexpr int64_t kStep = static_cast<int64_t>(sizeof(Vec)) * kUnroll;
  const int64_t part = bytes / kStreams / kStep * kStep;
  Vec acc[kStreams] = {};
  for (int64_t i = 0; i < part; i += kStep) {
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* at = slice + s * part + i;
      if (prefetch) __builtin_prefetch(at + 2048);
      const Vec* v = reinterpret_cast<const Vec*>(at);
      acc[s] += (v[0] + v[1]) + (v[2] + v[3]);
    }
  }
  Vec total = {};
  for (int s = 0; s < kStreams; ++s) total += acc[s];
  uint64_t sum = 0;
  for (int j = 0; j < static_cast<int>(sizeof(Vec) / 8); ++j) sum += static_cast<uint64_t>(total[j]);
  return sum;
}
