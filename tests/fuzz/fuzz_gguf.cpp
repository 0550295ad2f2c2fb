// libFuzzer target over the GGUF reader: any input must either be rejected with rl::Error or parse
// into a file whose every value, array item and tensor byte can be read, with tensors placed where
// the reader promises (tests/gguf/gguf_touch.h), and whose `inspect` summary can be computed. Any
// other exception, a sanitizer report or a broken promise is a finding. Notes: docs/perf/gguf.md.
#include <cstdio>
#include <cstdlib>

#include "../gguf/gguf_touch.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_summary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<rl::GgufFile> file;
  try {
    file = rl::GgufFile::from_bytes(std::span<const uint8_t>(data, size), "fuzz");
  } catch (const rl::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  const std::string broken = rl::test::touch_everything(*file);
  if (!broken.empty()) {
    std::fprintf(stderr, "GGUF reader accepted an input that breaks its promises: %s\n", broken.c_str());
    std::abort();
  }
  // `redlite inspect` on the same file: the summary reads names, shapes and metadata freely.
  const rl::ModelSummary summary = rl::summarize(*file);
  const std::string text = rl::format_summary(summary, *file);
  if (text.empty()) std::abort();
  return 0;
}
