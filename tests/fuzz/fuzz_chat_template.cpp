// libFuzzer target over the chat path of the server from request body to prompt: the input (after
// a first byte that picks the chat format) is a /v1/chat/completions body; it goes through the
// API's parsing and validation (src/server/api.h) and, when accepted, the chat template renders
// it and parses the rendered text back as a reply (tool calls, thinking). A refusal (ApiError,
// rl::Error) is fine; any other exception, a crash (deep recursion included) or a sanitizer
// report is a finding.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "common/error.h"
#include "generate/chat_template.h"
#include "server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  constexpr rl::ChatFormat kFormats[] = {rl::ChatFormat::ChatML,        rl::ChatFormat::Qwen2,
                                         rl::ChatFormat::Qwen3Instruct, rl::ChatFormat::Qwen3Thinking,
                                         rl::ChatFormat::Qwen3Hybrid,   rl::ChatFormat::Qwen3Coder};
  const rl::ChatTemplate tmpl = rl::ChatTemplate::of(kFormats[data[0] % 6]);
  const std::string body((const char*)data + 1, size - 1);
  try {
    const nlohmann::json parsed = rl::api::parse_body(body);
    const rl::api::ChatRequest req = rl::api::parse_chat_request(parsed, rl::SamplingParams{});
    rl::ChatRenderOptions opt;
    opt.tools = req.tools;
    opt.enable_thinking = req.enable_thinking;
    const std::string prompt = tmpl.render(req.messages, opt);
    // What a model that echoed its prompt would hand the reply parser.
    const rl::ParsedReply reply = tmpl.parse_reply(prompt, req.tools);
    if (reply.content.size() > prompt.size()) {
      std::fprintf(stderr, "a parsed reply is longer than its text\n");
      std::abort();
    }
  } catch (const rl::api::ApiError&) {
  } catch (const rl::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
