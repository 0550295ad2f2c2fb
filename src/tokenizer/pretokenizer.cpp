#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <string>

#include "common/error.h"
#include "common/utf8.h"

namespace rl {
namespace {

// White space as llama.cpp classifies it: ASCII \t \n \v \f \r and space (std::regex's \s on
// its collapsed text), plus the non-ASCII code points with the Unicode White_Space property.
// PCRE2's own \s differs at the edges (U+180E, U+001C..U+001F depending on version and UCP),
// so the class is spelled out.
#define RL_WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

// Letters and numbers: PCRE2 here knows Unicode 14, llama.cpp's tables (unicode-data.cpp) are
// Unicode 15.1. These are the letters (L) and numbers (N) assigned in 15.0 and 15.1, added so
// that both classify them alike: Kawi, Khojki, Egyptian hieroglyph blanks, Latin Extended-G,
// Cyrillic Extended-D, Nag Mundari, CJK Extensions H and I; Kawi digits, Kaktovik numerals,
// Nag Mundari digits.
#define RL_L_NEW "\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1123F}\\x{11240}\\x{13441}-\\x{13446}" \
                 "\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define RL_N_NEW "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define RL_L "\\p{L}" RL_L_NEW
#define RL_N "\\p{N}" RL_N_NEW

// Qwen2's tokenizer.json pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// with the case-insensitive group written out (as llama.cpp does), \s replaced by RL_WS and
// \p{L}, \p{N} by RL_L, RL_N. Alternatives are tried in order at each position (leftmost-first,
// like std::regex, which llama.cpp runs this pattern with).
const char kPattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n" RL_L RL_N "]?[" RL_L "]+"
    "|[" RL_N "]"
    "| ?[^" RL_WS RL_L RL_N "]+[\\r\\n]*"
    "|[" RL_WS "]*[\\r\\n]+"
    "|[" RL_WS "]+(?![^" RL_WS "])"
    "|[" RL_WS "]+";

// JIT stack bounds: the pattern needs little (single-character repeats), the maximum covers
// pathological inputs such as megabytes of one whitespace run.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 8 * 1024 * 1024;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return std::string((const char*)buf);
}

}  // namespace

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Pretokenizer::Pretokenizer() : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  impl_->code = pcre2_compile((PCRE2_SPTR)kPattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_NO_UTF_CHECK,
                              &err, &err_offset, nullptr);
  if (!impl_->code) {
    fail("tokenizer: PCRE2 rejected the qwen2 pre-tokenizer pattern at offset {}: {} "
         "(PCRE2 must be built with Unicode support)",
         (size_t)err_offset, pcre2_message(err));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

bool Pretokenizer::jit_enabled() const { return impl_->jit; }

const char* Pretokenizer::pattern() { return kPattern; }

struct Pretokenizer::Scratch::State {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
};

Pretokenizer::Scratch::Scratch(const Pretokenizer& pre) : state_(std::make_unique<State>()) {
  state_->md = pcre2_match_data_create_from_pattern(pre.impl_->code, nullptr);
  if (!state_->md) fail("tokenizer: out of memory creating PCRE2 match data");
  if (pre.impl_->jit) {
    state_->mctx = pcre2_match_context_create(nullptr);
    state_->jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    if (state_->mctx && state_->jit_stack) pcre2_jit_stack_assign(state_->mctx, nullptr, state_->jit_stack);
  }
}

Pretokenizer::Scratch::~Scratch() {
  pcre2_match_data_free(state_->md);
  if (state_->mctx) pcre2_match_context_free(state_->mctx);
  if (state_->jit_stack) pcre2_jit_stack_free(state_->jit_stack);
}

void Pretokenizer::split(std::string_view text, const WordFn& on_word) const {
  if (text.empty()) return;
  Scratch scratch(*this);
  split(text, scratch, on_word);
}

void Pretokenizer::split(std::string_view text, Scratch& scratch, const WordFn& on_word) const {
  if (text.empty()) return;
  pcre2_match_data* md = scratch.state_->md;
  pcre2_match_context* mctx = scratch.state_->mctx;
  const auto* subject = (PCRE2_SPTR)text.data();
  const size_t n = text.size();
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  size_t pos = 0;
  while (pos < n) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, n, pos, 0, md, mctx)
                        : PCRE2_ERROR_JIT_BADOPTION;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // No JIT, or the JIT stack ran out: the interpreter gives the same answer.
      rc = pcre2_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
      on_word(pos, n - pos);  // unmatched tail: llama.cpp keeps it as one word
      return;
    }
    if (rc < 0) fail("tokenizer: pre-tokenizer regex failed at byte {}: {}", pos, pcre2_message(rc));
    const size_t start = ov[0], end = ov[1];
    if (start > pos) on_word(pos, start - pos);  // unmatched gap, kept as its own word
    if (end <= start) {
      // An empty match (impossible with this pattern): take one character so the loop advances.
      size_t next = start + 1;
      while (next < n && is_utf8_continuation((uint8_t)text[next])) ++next;
      on_word(start, next - start);
      pos = next;
      continue;
    }
    on_word(start, end - start);
    pos = end;
  }
}

}  // namespace rl
