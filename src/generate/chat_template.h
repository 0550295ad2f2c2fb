// Chat templates of the Qwen ChatML family. The format is chosen by recognising the GGUF's
// `tokenizer.chat_template`; prompts are rendered from the file's own template text by Red
// Lite's Jinja interpreter (jinja_template.h), so a fine-tuned file's template is honoured. The
// native renderers below reproduce each recognised format byte for byte and take over when the
// interpreter cannot run the template (a construct it lacks: the warning names it) or when
// `--chat-template NAME` asks for one. parse_reply() follows the recognised format either way.
//
//   ChatML         <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, no tools, no default system.
//   Qwen2          ChatML plus the template's default system prompt when the conversation has
//                  none (the Qwen2 / Qwen2.5 family; the test fixtures carry this one).
//   Qwen3Instruct  Qwen3-Next-80B-A3B-Instruct: tools listed as JSON in the system turn, calls as
//                  <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, tool results
//                  grouped into one user turn of <tool_response> blocks.
//   Qwen3Thinking  Qwen3-Next-80B-A3B-Thinking: as Instruct, and the generation prompt opens a
//                  <think>\n block; an assistant turn after the last user query carries its
//                  reasoning as <think>\nREASONING\n</think>\n\n, earlier turns drop it.
//   Qwen3Hybrid    Qwen3 (2504) with enable_thinking: as Thinking for the history, the generation
//                  prompt is plain and enable_thinking=false appends an empty think block.
//   Qwen3Coder     Qwen3-Coder / Qwen3-Coder-Next: tools as <function><name>.. XML, calls as
//                  <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>
//                  \n</tool_call>, tool results as <tool_response> blocks in a user turn.
//
// Used by `redlite run --chat`, `redlite chat` and the HTTP server (OpenAI messages with roles
// system/user/assistant/tool, a tools list, tool_calls in assistant messages); parse_reply()
// turns the model's text back into content, reasoning and tool calls.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace rl {

namespace jinja {
class JinjaTemplate;
}

enum class ChatFormat { ChatML, Qwen2, Qwen3Instruct, Qwen3Thinking, Qwen3Hybrid, Qwen3Coder };

const char* chat_format_name(ChatFormat f);  // "chatml", "qwen2", "qwen3-instruct", ...
// The format of a name chat_format_name gives; nullopt for any other.
std::optional<ChatFormat> chat_format_from_name(std::string_view name);
// All names, comma-separated, for messages.
std::string chat_format_names();

// One call in an assistant message. `arguments` is JSON text of an object, as OpenAI clients send
// it ("{\"city\": \"Paris\"}"); keys keep their order.
struct ToolCall {
  std::string id;         // the client's / server's call id; not rendered into the prompt
  std::string name;
  std::string arguments;  // JSON object text
};

// One OpenAI chat message. role: "system", "user", "assistant" or "tool".
struct ChatMessage {
  std::string role;
  std::string content;
  std::string reasoning_content;     // assistant: thinking text (Thinking formats render it)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: the call it answers (not rendered by Qwen formats)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // OpenAI tools list: [{"type": "function", "function": {"name", "description", "parameters"}}].
  // ordered_json keeps the client's key order, which `tojson` reproduces.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  // Qwen3Hybrid only: false appends an empty think block to the generation prompt.
  std::optional<bool> enable_thinking;
};

// What the model wrote in one assistant turn, split apart.
struct ParsedReply {
  std::string content;             // visible text, tool-call blocks removed
  std::string reasoning_content;   // text of the <think> block (empty when none)
  std::vector<ToolCall> tool_calls;  // id left empty: the caller numbers them
};

class ChatTemplate {
 public:
  // Recognises `jinja` (tokenizer.chat_template). An empty or unrecognised template throws
  // rl::Error that says so and names the fallback flag, unless allow_chatml_fallback: then the
  // result is plain ChatML with fell_back() true and warning() saying why. A recognised template
  // is also parsed and tried on a sample conversation by the Jinja interpreter; prompts then come
  // from it (uses_jinja()), or, when it cannot run the template, from the native renderer with
  // jinja_warning() naming the construct.
  static ChatTemplate detect(std::string_view jinja, bool allow_chatml_fallback);
  // A native renderer only (--chat-template NAME).
  static ChatTemplate of(ChatFormat format, std::string default_system = {});

  ChatFormat format() const { return format_; }
  const char* name() const { return chat_format_name(format_); }
  bool fell_back() const { return !warning_.empty(); }
  const std::string& warning() const { return warning_; }
  const std::string& default_system() const { return default_system_; }
  bool uses_jinja() const { return jinja_ != nullptr; }
  const std::string& jinja_warning() const { return jinja_warning_; }
  bool supports_tools() const;

  // The whole prompt for `messages` (throws rl::Error naming the message at fault: unknown role,
  // tools given to a format without tools, malformed tool-call arguments, or the template's own
  // error such as a raise_exception). Tool-call arguments reach the template parsed, as an
  // object with the client's key order, so `tojson` re-serialises them ({"city": "Paris"}).
  std::string render(std::span<const ChatMessage> messages, const ChatRenderOptions& opt = {}) const;

  // The text that continues a conversation whose last turn is an assistant reply the session
  // has just generated (its text is already in the session, the closing <|im_end|> is not):
  // closes that turn, renders `next` (user or tool messages) and the generation prompt. A chat
  // that keeps its session prefills only this. Unlike render(), earlier assistant turns keep
  // their reasoning (it is already in the session), and the text comes from the native renderer
  // of the recognised format, not from the file's template.
  std::string continuation(std::span<const ChatMessage> next, const ChatRenderOptions& opt = {}) const;

  // What the generation prompt ends with for this format ("<|im_start|>assistant\n", plus
  // "<think>\n" for Thinking): the model's reply starts right after it.
  std::string generation_prompt(const ChatRenderOptions& opt = {}) const;

  // Splits a finished reply. Thinking formats: the generation prompt opened <think>, so text up to
  // </think> is reasoning (all of it when </think> never came). Tool calls are read in this
  // format's syntax (JSON or XML); `tools` (the request's list) gives parameter types, so an XML
  // value declared "string" stays a string and others are parsed as JSON when they parse.
  // A malformed call is left in the content, never dropped.
  ParsedReply parse_reply(std::string_view text,
                          const nlohmann::ordered_json& tools = nlohmann::ordered_json::array()) const;
  // The tool-call part of parse_reply alone, for content whose reasoning was already split off
  // (the server's ReasoningSplitter): <tool_call> blocks that parse become tool_calls, the rest
  // stays content, trailing whitespace trimmed when a call was found; no <think> handling.
  ParsedReply parse_tool_calls(std::string_view content,
                               const nlohmann::ordered_json& tools = nlohmann::ordered_json::array()) const;

 private:
  ChatTemplate(ChatFormat f, std::string default_system, std::string warning)
      : format_(f), default_system_(std::move(default_system)), warning_(std::move(warning)) {}

  static ChatTemplate recognise(std::string_view jinja, bool allow_chatml_fallback);
  void attach_jinja(std::string_view jinja);
  // Nullopt when the interpreter met a construct it lacks (warned on stderr): render natively.
  std::optional<std::string> render_jinja(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const;
  std::string render_qwen3(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const;
  std::string render_coder(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const;
  std::string render_chatml(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const;

  ChatFormat format_;
  std::string default_system_;
  std::string warning_;
  std::shared_ptr<const jinja::JinjaTemplate> jinja_;  // the file's template, when it runs
  std::string jinja_warning_;
};

// The messages as the template sees them (OpenAI form): role, content, reasoning_content when
// set, tool_calls as [{"id", "type": "function", "function": {"name", "arguments": {...}}}] with
// the arguments parsed (throws rl::Error naming the message whose arguments are not a JSON
// object), tool_call_id when set.
nlohmann::ordered_json chat_messages_json(std::span<const ChatMessage> messages);

}  // namespace rl
