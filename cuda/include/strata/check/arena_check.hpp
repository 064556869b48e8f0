// Test hooks over a SessionArena: its bytes read back, and poisoned, so tests can prove what reset() clears.
// Allocate and synchronise. Host-only header.
#pragma once

#include "strata/session_arena.hpp"

namespace strata::arena_check {

// The arena's bytes copied to `host` (arena.layout().total bytes).
void download(const SessionArena& arena, void* host);

// Every byte of the arena set to `byte`.
void fill(SessionArena& arena, unsigned char byte);

}  // namespace strata::arena_check
