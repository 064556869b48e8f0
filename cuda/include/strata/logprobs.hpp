// The limit of DecodeSession::logprobs that callers check before asking: the device kernel is sized for it.
// Host and device header.
#pragma once

namespace strata {

constexpr int kMaxLogprobs = 20;  // the most alternatives a position reports (OpenAI's limit)

}  // namespace strata
