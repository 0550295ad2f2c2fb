#include "model/session.h"

#include <algorithm>

#include "common/error.h"

namespace rl {

void check_decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  if (sessions.size() != tokens.size())
    fail("decode_batch: {} sessions but {} tokens", sessions.size(), tokens.size());
  for (size_t i = 0; i < sessions.size(); i++) {
    Session* s = sessions[i];
    if (!s) fail("decode_batch: session {} is null", i);
    if (std::find(sessions.begin(), sessions.begin() + i, s) != sessions.begin() + i)
      fail("decode_batch: session {} is given twice (each sequence advances once per pass)", i);
    if (s->position() + 1 > s->n_ctx())
      fail("context full: session {} of the batch is at position {} of its context of {} tokens (--ctx)", i,
           s->position(), s->n_ctx());
    if (tokens[i] < 0 || tokens[i] >= s->n_vocab())
      fail("token id {} (batch index {}) is out of range: the vocabulary has {} tokens", tokens[i], i, s->n_vocab());
  }
}

void check_decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                        std::span<std::vector<float>> out) {
  if (out.size() != sessions.size())
    fail("decode_batch: {} sessions but {} output buffers", sessions.size(), out.size());
  check_decode_batch(sessions, tokens);
}

void decode_one_after_another(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                              std::span<std::vector<float>> out) {
  check_decode_batch(sessions, tokens, out);
  for (size_t i = 0; i < sessions.size(); i++) out[i] = sessions[i]->decode(tokens[i]);
}

void check_prefill_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                         std::span<std::vector<float>> out) {
  if (sessions.size() != chunks.size() || out.size() != sessions.size())
    fail("prefill_batch: {} sessions, {} chunks and {} output buffers", sessions.size(), chunks.size(), out.size());
  for (size_t i = 0; i < sessions.size(); i++) {
    Session* s = sessions[i];
    if (!s) fail("prefill_batch: session {} is null", i);
    if (std::find(sessions.begin(), sessions.begin() + i, s) != sessions.begin() + i)
      fail("prefill_batch: session {} is given twice", i);
    if (chunks[i].empty()) fail("prefill_batch: no tokens given for session {}", i);
    if ((int64_t)s->position() + (int64_t)chunks[i].size() > s->n_ctx())
      fail("context full: {} tokens at position {} would run past session {}'s context of {} tokens (--ctx)",
           chunks[i].size(), s->position(), i, s->n_ctx());
    for (size_t k = 0; k < chunks[i].size(); k++)
      if (chunks[i][k] < 0 || chunks[i][k] >= s->n_vocab())
        fail("token id {} (session {}, input index {}) is out of range: the vocabulary has {} tokens", chunks[i][k], i,
             k, s->n_vocab());
  }
}

void Backend::prefill_batch_into(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                                 std::span<std::vector<float>> out) {
  check_prefill_batch(sessions, chunks, out);
  for (size_t i = 0; i < sessions.size(); i++) out[i] = sessions[i]->prefill(chunks[i]);
}

std::vector<std::vector<float>> Backend::decode_batch(std::span<Session* const> sessions,
                                                      std::span<const int32_t> tokens) {
  std::vector<std::vector<float>> out(sessions.size());
  decode_batch_into(sessions, tokens, out);
  return out;
}

}  // namespace rl
