// OpenAI request parsing and validation for the server: JSON bodies in, typed requests out.
// Every rejection is an ApiError with the HTTP status and an OpenAI-style error object.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/chat_template.h"
#include "generate/generator.h"
#include "model/session.h"

namespace rl::api {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::string param;
  std::string code;
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& e);

// Serialises for the wire: invalid UTF-8 (a token cut inside a character) becomes U+FFFD
// instead of an exception.
std::string dump(const nlohmann::json& j);
std::string dump(const nlohmann::ordered_json& j);

// Parses a request body: must be a JSON object (400 otherwise, naming the parse error offset).
// Keys keep the client's order.
nlohmann::ordered_json parse_body(const std::string& body);

// Fields shared by /v1/chat/completions and /v1/completions.
struct CommonRequest {
  GenerationConfig gen;      // sampling, max_tokens, stop strings, response_format's constraint
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  int top_logprobs = -1;     // -1: no logprobs; 0..20: logprobs with that many alternatives
  std::string model;         // as given (one model is served)
};

struct ChatRequest {
  CommonRequest common;
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::optional<bool> enable_thinking;
  bool require_tool_call = false;  // tool_choice "required" or a named function
};

struct CompletionRequest {
  CommonRequest common;
  std::optional<std::string> prompt_text;     // a string prompt
  std::vector<int32_t> prompt_tokens;         // or token ids
};

// `defaults` supplies the sampling values a request leaves out.
ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);

}  // namespace rl::api
